"""The Django test project under tests/django is run by Django's test runner
(test_django.py), never collected by pytest itself."""

collect_ignore_glob = ["djproject/*", "shop/*", "manage.py"]

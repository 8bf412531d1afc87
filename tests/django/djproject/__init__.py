"""A small Django project for the tests of ratchet.contrib.django (tests/django/test_django.py
runs Django's test runner on it)."""

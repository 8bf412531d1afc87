"""``manage.py ratchet_worker`` and ``manage.py ratchet_migrate``."""

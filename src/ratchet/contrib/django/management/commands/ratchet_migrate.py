"""``manage.py ratchet_migrate``: create or upgrade the ledger of ``RATCHET`` settings."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from ratchet.contrib.django.apps import migrate_ledger


class Command(BaseCommand):
    """Create or upgrade the ledger (``manage.py migrate`` does it too unless
    ``RATCHET["MIGRATE"]`` is False)."""

    help = ("Create the Ratchet ledger, or upgrade its schema (manage.py migrate does it "
            "first unless RATCHET['MIGRATE'] is False).")

    def handle(self, *args: Any, **options: Any) -> None:
        """Run :func:`ratchet.contrib.django.apps.migrate_ledger`."""
        version = migrate_ledger()
        self.stdout.write(f"ratchet ledger at schema version {version}")

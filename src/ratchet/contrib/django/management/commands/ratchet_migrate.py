"""``manage.py ratchet_migrate``: create or upgrade the ledger of ``RATCHET`` settings."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from ratchet import RatchetError
from ratchet.contrib.django.apps import migrate_ledger

from .ratchet_worker import one_line


class Command(BaseCommand):
    """Create or upgrade the ledger (``manage.py migrate`` does it too unless
    ``RATCHET["MIGRATE"]`` is False)."""

    help = ("Create the Ratchet ledger, or upgrade its schema (manage.py migrate does it "
            "first unless RATCHET['MIGRATE'] is False).")

    def handle(self, *args: Any, **options: Any) -> None:
        """Run :func:`ratchet.contrib.django.apps.migrate_ledger`.

        Raises:
            CommandError: a bad ``RATCHET`` setting or a Ratchet error (exit status 1, the
                message on one line).
        """
        try:
            version = migrate_ledger()
        except (ImproperlyConfigured, RatchetError) as exc:
            raise CommandError(one_line(exc)) from exc
        self.stdout.write(f"ratchet ledger at schema version {version}")

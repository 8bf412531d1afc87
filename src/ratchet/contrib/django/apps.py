"""The Django app ``ratchet.contrib.django`` (label ``ratchet``): creates or upgrades the
ledger when ``manage.py migrate`` runs on its database (``RATCHET["MIGRATE"]``)."""

from __future__ import annotations

import os
from typing import Any

from django.apps import AppConfig
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from django.db.models.signals import pre_migrate

from ratchet import LedgerUnavailable
from ratchet.config import parse_ledger_url
from ratchet.control import Control

from . import get_app, ledger_url
from .conf import ratchet_settings

__all__ = ["RatchetConfig", "migrate_ledger"]


class RatchetConfig(AppConfig):
    """Ratchet's Django app. ``ready`` connects :func:`migrate_ledger` to ``pre_migrate``."""

    name = "ratchet.contrib.django"
    label = "ratchet"
    verbose_name = "Ratchet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Hook ``manage.py migrate``."""
        pre_migrate.connect(_on_pre_migrate, sender=self,
                            dispatch_uid="ratchet.contrib.django.migrate_ledger")


def _on_pre_migrate(sender: AppConfig, using: str = "default", **kwargs: Any) -> None:
    conf = ratchet_settings()
    if conf.migrate and using == conf.database:
        migrate_ledger()


def _effective_url() -> str:
    """The URL of the App's ledger when ``RATCHET["APP"]`` is set, else :func:`ledger_url`."""
    if ratchet_settings().app is None:
        return ledger_url()
    app = get_app()
    return app.ledger_url or ledger_url()


def migrate_ledger() -> int:
    """Create the ledger, or upgrade its schema; return its schema version.

    A SQLite ledger in the Django database's file must be made before Django's tables (a
    ledger is never put into a file that holds other tables): when that file is still
    empty (0 bytes, as Django leaves a new database before its first migration), Django's
    connection is closed and the empty file replaced by the new ledger, which Django then
    opens and adds its tables to.

    Raises:
        ImproperlyConfigured: the SQLite file holds other tables and no ledger (keep the
            ledger in a file of its own with ``RATCHET["LEDGER_URL"]``, or start the
            database anew); as :func:`ratchet.contrib.django.ledger_url`.
        LedgerUnavailable: the database is unreachable.
        SchemaTooNew: the ledger is newer than this Ratchet.
    """
    url = _effective_url()
    parsed = parse_ledger_url(url)
    if parsed.scheme != "sqlite":
        with Control(url) as control:
            return control.migrate()
    path = os.path.abspath(parsed.path)
    _clear_empty_django_file(path)
    try:
        with Control(url) as control:
            return control.migrate()
    except LedgerUnavailable as exc:
        if not os.path.isfile(path):
            raise
        raise ImproperlyConfigured(
            f"{exc} In a Django project: the SQLite file {path!r} already holds tables and "
            "no ledger; a ledger is created before Django's tables (manage.py migrate on a "
            "new database does that), so keep the ledger in a file of its own "
            "(RATCHET['LEDGER_URL'] = 'sqlite:///ledger.db') or start the database anew"
        ) from exc


def _clear_empty_django_file(ledger_path: str) -> None:
    """Remove the Django database's SQLite file when it is the ledger's and empty."""
    path = ledger_path
    if not os.path.isfile(path) or os.path.getsize(path) != 0:
        return
    for conn in connections.all(initialized_only=True):
        name = conn.settings_dict.get("NAME")
        if conn.vendor == "sqlite" and name and os.path.isfile(str(name)) \
                and os.path.samefile(str(name), path):
            conn.close()
    os.remove(path)

"""The ``RATCHET`` setting of a Django project, read and checked, and the ledger URL it
gives.

Settings (all optional)::

    RATCHET = {
        "APP": "myproject.tasks:app",   # the ratchet.App (MODULE:ATTRIBUTE)
        "LEDGER_URL": None,             # None: the ledger in DATABASES[DATABASE]
        "DATABASE": "default",          # the Django database alias of the ledger
        "SCHEMA": "ratchet",            # PostgreSQL schema of the derived ledger URL
        "DASHBOARD_URL": None,          # e.g. "http://127.0.0.1:8080" (`ratchet serve`)
        "MIGRATE": True,                # `manage.py migrate` creates/upgrades the ledger
    }

``LEDGER_URL`` None derives the URL from the Django database (its settings as the
connection holds them, so under the test runner the test database):

* ``django.db.backends.sqlite3``, ``NAME`` a file: ``sqlite:///<absolute path>``;
* ``django.db.backends.postgresql``:
  ``postgresql://USER:PASSWORD@HOST:PORT/NAME?schema=SCHEMA`` plus the libpq parameters
  of ``OPTIONS`` listed in :data:`LIBPQ_OPTIONS`.

Any other engine (or an in-memory SQLite database) needs an explicit ``LEDGER_URL``, and
:func:`ratchet.contrib.django.submit` then refuses (the ledger is not in the database of
the transaction).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

__all__ = ["LIBPQ_OPTIONS", "RatchetSettings", "database_ledger_url", "derived_ledger_url",
           "ratchet_settings"]

_KEYS = {"APP", "LEDGER_URL", "DATABASE", "SCHEMA", "DASHBOARD_URL", "MIGRATE"}

LIBPQ_OPTIONS = ("sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout",
                 "application_name", "target_session_attrs", "passfile")
"""Keys of a PostgreSQL database's ``OPTIONS`` carried into the derived ledger URL."""

_SQLITE = "django.db.backends.sqlite3"
_POSTGRES = ("django.db.backends.postgresql", "django.db.backends.postgresql_psycopg2")


@dataclass(frozen=True, slots=True)
class RatchetSettings:
    """The ``RATCHET`` setting, checked.

    Attributes:
        app: ``MODULE:ATTRIBUTE`` of the project's :class:`ratchet.App`, or None.
        ledger_url: the explicit ledger URL, or None (derived from ``database``).
        database: the Django database alias the ledger lives in (and whose transactions
            :func:`ratchet.contrib.django.submit` joins).
        schema: the PostgreSQL schema of a derived URL.
        dashboard_url: the base URL of ``ratchet serve`` (no trailing ``/``), or None: the
            admin page then shows task ids without links.
        migrate: whether ``manage.py migrate`` on ``database`` creates or upgrades the
            ledger first.
    """

    app: str | None
    ledger_url: str | None
    database: str
    schema: str
    dashboard_url: str | None
    migrate: bool


def _optional_str(raw: dict[str, Any], key: str) -> str | None:
    value = raw.get(key)
    if value is not None and (not isinstance(value, str) or not value):
        raise ImproperlyConfigured(f"RATCHET[{key!r}] must be a non-empty string or None, "
                                   f"got {value!r}")
    return value


def ratchet_settings() -> RatchetSettings:
    """Read ``settings.RATCHET`` (missing: every default).

    Raises:
        ImproperlyConfigured: not a dict, an unknown key, or a value of the wrong type.
    """
    raw = getattr(settings, "RATCHET", {})
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"settings.RATCHET must be a dict, got {type(raw).__name__}")
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ImproperlyConfigured(f"settings.RATCHET has unknown keys {unknown}; known: "
                                   f"{sorted(_KEYS)}")
    database = _optional_str(raw, "DATABASE") or "default"
    schema = _optional_str(raw, "SCHEMA") or "ratchet"
    dashboard = _optional_str(raw, "DASHBOARD_URL")
    migrate = raw.get("MIGRATE", True)
    if not isinstance(migrate, bool):
        raise ImproperlyConfigured(f"RATCHET['MIGRATE'] must be True or False, got {migrate!r}")
    return RatchetSettings(
        app=_optional_str(raw, "APP"),
        ledger_url=_optional_str(raw, "LEDGER_URL"),
        database=database,
        schema=schema,
        dashboard_url=dashboard.rstrip("/") if dashboard else None,
        migrate=migrate,
    )


def derived_ledger_url(alias: str, schema: str) -> str:
    """The ledger URL of the Django database ``alias`` (see the module docstring).

    Reads the connection's ``settings_dict``, which the test runner points at the test
    database, so the URL follows it.

    Raises:
        ImproperlyConfigured: no such alias, or as :func:`database_ledger_url`.
    """
    if alias not in connections:
        raise ImproperlyConfigured(f"RATCHET['DATABASE'] names {alias!r}, which is not in "
                                   "settings.DATABASES")
    return database_ledger_url(connections[alias].settings_dict, schema, alias)


def database_ledger_url(db: Mapping[str, Any], schema: str, alias: str = "default") -> str:
    """The ledger URL of one database's settings (a ``DATABASES`` entry): see the module
    docstring. ``alias`` is for messages.

    Raises:
        ImproperlyConfigured: an engine other than SQLite or PostgreSQL, or an in-memory
            SQLite database.
    """
    engine = db.get("ENGINE", "")
    if engine == _SQLITE:
        name = str(db.get("NAME") or "")
        if not name or name == ":memory:" or name.startswith("file:") or "mode=memory" in name:
            raise ImproperlyConfigured(
                f"DATABASES[{alias!r}] is an in-memory SQLite database: the ledger needs a "
                "file (set NAME, and TEST['NAME'] for the test runner, to a file path) or "
                "set RATCHET['LEDGER_URL']")
        return "sqlite:///" + os.path.abspath(name)
    if engine in _POSTGRES:
        user = quote(str(db.get("USER") or ""), safe="")
        password = str(db.get("PASSWORD") or "")
        auth = user + (":" + quote(password, safe="") if password else "")
        host = str(db.get("HOST") or "")
        port = str(db.get("PORT") or "")
        netloc = (auth + "@" if auth else "") + (
            f"[{host}]" if ":" in host else quote(host, safe=""))
        if port:
            netloc += ":" + port
        options = db.get("OPTIONS") or {}
        query = {"schema": schema}
        query.update({k: str(options[k]) for k in LIBPQ_OPTIONS if k in options})
        name = quote(str(db.get("NAME") or ""), safe="")
        return f"postgresql://{netloc}/{name}?{urlencode(query)}"
    raise ImproperlyConfigured(
        f"DATABASES[{alias!r}] uses {engine!r}: Ratchet's ledger lives in SQLite or "
        "PostgreSQL; set RATCHET['LEDGER_URL'] to a ledger elsewhere")

"""Ratchet in a Django project: the ledger in the project's database, submits that commit
with ``transaction.atomic()``, ``manage.py ratchet_worker`` and an admin page.

Add ``"ratchet.contrib.django"`` to ``INSTALLED_APPS`` and name the app::

    RATCHET = {"APP": "myproject.tasks:app", "DASHBOARD_URL": "http://127.0.0.1:8080"}

The project's tasks module builds its :class:`ratchet.App` **without a URL**
(``app = App()``): :func:`get_app` points it at the ledger of
:mod:`ratchet.contrib.django.conf` (by default in ``DATABASES["default"]``) the first time
it is asked for, before anything opens it. An App built with its own URL keeps it.

Then, in a view::

    from django.db import transaction
    from ratchet.contrib.django import submit

    with transaction.atomic():
        order = Order.objects.create(total_cents=1299)
        submit("bill_order", {"order_id": order.pk}, idempotency_key=f"bill:{order.pk}")
    # the order and the task commit together, or neither does

Names: :func:`get_app`, :func:`ledger_url`, :func:`submit`, :func:`atomic_connection`,
:func:`get_control`, :func:`close`, :class:`CloseOldConnections`; the settings in
:mod:`ratchet.contrib.django.conf`; the admin page in :mod:`ratchet.contrib.django.admin`;
the test runner in :mod:`ratchet.contrib.django.testing`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import close_old_connections, connections

from ratchet import App, InvalidArguments, Middleware, TaskHandle
from ratchet.control import Control
from ratchet.loading import load_app

from .conf import derived_ledger_url, ratchet_settings

__all__ = ["CloseOldConnections", "atomic_connection", "close", "get_app", "get_control",
           "ledger_url", "submit"]

_lock = threading.Lock()
_app: App | None = None
_control: Control | None = None


def ledger_url() -> str:
    """The ledger URL of the settings: ``RATCHET["LEDGER_URL"]``, else the one derived
    from ``DATABASES[RATCHET["DATABASE"]]``
    (:func:`ratchet.contrib.django.conf.derived_ledger_url`).

    Holds the database password when there is one: never print it (use
    :func:`ratchet.config.redact_url`).

    Raises:
        ImproperlyConfigured: a bad ``RATCHET`` setting, or a database that cannot hold
            the ledger (another engine, in-memory SQLite) without ``LEDGER_URL``.
    """
    conf = ratchet_settings()
    return conf.ledger_url or derived_ledger_url(conf.database, conf.schema)


def get_app() -> App:
    """The project's :class:`ratchet.App` (``RATCHET["APP"]``), loaded once per process.

    An App built without a URL is pointed at :func:`ledger_url` here
    (:meth:`ratchet.App.configure`), so ``RATCHET_LEDGER_URL`` and the ``sqlite:///ratchet.db``
    default do not apply to it; an App built with a URL or a ledger object keeps it.

    Raises:
        ImproperlyConfigured: ``RATCHET["APP"]`` is not set, or as :func:`ledger_url`.
        ConfigError: the app cannot be imported or is not a ``ratchet.App`` (as
            :func:`ratchet.loading.load_app`), or its ledger was opened before this call
            could point it at the project's database.
    """
    global _app
    with _lock:
        if _app is None:
            spec = ratchet_settings().app
            if spec is None:
                raise ImproperlyConfigured(
                    "settings.RATCHET['APP'] is not set: name your ratchet.App as "
                    "'MODULE:ATTRIBUTE', e.g. 'myproject.tasks:app'")
            app = load_app(spec)
            if app.ledger_url is None and not app.holds_ledger_object:
                app.configure(ledger=ledger_url())
            _app = app
        return _app


def atomic_connection(using: str | None = None) -> Any:
    """The DB-API connection of Django's open ``transaction.atomic()`` block on database
    ``using`` (default ``RATCHET["DATABASE"]``), for ``connection=`` of
    :meth:`ratchet.App.submit`, ``submit_many`` and ``emit``: a psycopg 3 ``Connection``
    (PostgreSQL) or a ``sqlite3.Connection``.

    Raises:
        InvalidArguments: no ``atomic()`` block is open on that database (Django runs in
            autocommit mode outside one, so the task would not commit with your work),
            or the block is already marked for rollback (a query in it failed).
        ImproperlyConfigured: ``using`` is not a configured database.
    """
    alias = using or ratchet_settings().database
    if alias not in connections:
        raise ImproperlyConfigured(f"no database {alias!r} in settings.DATABASES")
    conn = connections[alias]
    if not conn.in_atomic_block:
        raise InvalidArguments(
            f"submit needs an open transaction.atomic() block on database {alias!r}: "
            "outside one Django autocommits, and the task would not commit with your "
            "work (wrap the writes and the submit in `with transaction.atomic():`)")
    if conn.needs_rollback:
        raise InvalidArguments(
            f"the transaction.atomic() block on database {alias!r} is marked for rollback "
            "(a query in it failed): nothing more can be written in it")
    conn.ensure_connection()
    return conn.connection


def submit(name: str, params: Mapping[str, Any] | None = None, *, using: str | None = None,
           **options: Any) -> TaskHandle:
    """Submit a task in Django's open ``transaction.atomic()`` block: the task exists if
    and only if that transaction commits.

    Args:
        name: a task name registered on :func:`get_app`.
        params: the task's keyword arguments (plain JSON values).
        using: the Django database alias (default ``RATCHET["DATABASE"]``); the ledger
            must live in that database (the same PostgreSQL database, or the same SQLite
            file).
        **options: the other keyword arguments of :meth:`ratchet.App.submit`
            (``idempotency_key``, ``run_at``, ``delay_s``, ``tenant``, ``queue``,
            ``priority``, ...), never ``connection``.

    Returns:
        The :class:`ratchet.TaskHandle` (``task_id``, ``created``); the task is visible
        to workers once the block commits.

    Raises:
        InvalidArguments: outside ``atomic()`` or in a block marked for rollback
            (:func:`atomic_connection`); the ledger is not in that database (another
            PostgreSQL database or schema without this ledger, another SQLite file); a
            PostgreSQL database driven by psycopg2 (Ratchet joins psycopg 3 connections:
            install ``psycopg``, which Django 4.2+ prefers); ``connection`` given; or
            anything :meth:`ratchet.App.submit` refuses.
        UnknownTask, IdempotencyConflict, LedgerUnavailable: as :meth:`ratchet.App.submit`.
    """
    if "connection" in options:
        raise InvalidArguments("ratchet.contrib.django.submit takes Django's connection "
                               "itself: pass using=ALIAS, not connection=")
    raw = atomic_connection(using)
    return get_app().submit(name, params, connection=raw, **options)


class CloseOldConnections(Middleware):
    """Worker middleware that closes the task thread's Django database connections that
    are broken or past ``CONN_MAX_AGE`` before each attempt, as Django does around each
    request (:func:`django.db.close_old_connections`). ``manage.py ratchet_worker``
    installs it."""

    def before_attempt(self, worker: Any, claim: Any) -> None:
        """Before the body runs, on the task thread."""
        close_old_connections()


def get_control() -> Control:
    """One :class:`ratchet.control.Control` on :func:`get_app`'s ledger per process, for
    read-only views (the admin page); its connections are kept for the next call.

    Raises:
        ImproperlyConfigured, ConfigError: as :func:`get_app`.
    """
    global _control
    app = get_app()
    with _lock:
        if _control is None:
            _control = Control(app=app)
        return _control


def close() -> None:
    """Close the ledger connections of :func:`get_app` and :func:`get_control` (they
    reopen on next use). Call it before the project's database is dropped (the test
    runner :class:`ratchet.contrib.django.testing.RatchetTestRunner` does): PostgreSQL
    refuses to drop a database that Ratchet's connection pool still holds."""
    global _control
    with _lock:
        if _control is not None:
            _control.close()
            _control = None
        if _app is not None:
            _app.close()

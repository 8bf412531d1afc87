"""The ledger URL derived from a Django ``DATABASES`` entry (no Django project needed)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("django", reason="Django is not installed (pip install 'ratchet[django]')")

from django.core.exceptions import ImproperlyConfigured

from ratchet.config import parse_ledger_url
from ratchet.contrib.django.conf import database_ledger_url

PG = "django.db.backends.postgresql"


def test_sqlite_file_becomes_an_absolute_sqlite_url(tmp_path: object) -> None:
    url = database_ledger_url({"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"},
                              "ratchet")
    assert url == "sqlite:///" + os.path.abspath("db.sqlite3")
    assert parse_ledger_url(url).path == os.path.abspath("db.sqlite3")


def test_postgresql_settings_become_a_url_with_the_schema_and_libpq_options() -> None:
    url = database_ledger_url({
        "ENGINE": PG, "NAME": "shop", "USER": "app", "PASSWORD": "p@ss:/word",
        "HOST": "db.internal", "PORT": 5433,
        "OPTIONS": {"sslmode": "require", "isolation_level": 1, "pool": True},
    }, "jobs")
    assert url == ("postgresql://app:p%40ss%3A%2Fword@db.internal:5433/shop?"
                   "schema=jobs&sslmode=require")
    config = parse_ledger_url(url)
    assert config.scheme == "postgresql"
    assert config.options == {"schema": "jobs", "sslmode": "require"}


def test_postgresql_without_host_or_user_leaves_them_to_libpq() -> None:
    url = database_ledger_url({"ENGINE": PG, "NAME": "shop"}, "ratchet")
    assert url == "postgresql:///shop?schema=ratchet"


@pytest.mark.parametrize("db", [
    {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    {"ENGINE": "django.db.backends.sqlite3", "NAME": "file:memdb1?mode=memory&cache=shared"},
    {"ENGINE": "django.db.backends.mysql", "NAME": "shop"},
])
def test_databases_that_cannot_hold_the_ledger_are_refused(db: dict[str, str]) -> None:
    with pytest.raises(ImproperlyConfigured, match="LEDGER_URL"):
        database_ledger_url(db, "ratchet")

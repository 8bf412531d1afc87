"""Settings of the test project. Environment:

* ``DJ_DB``: ``sqlite`` (default) or ``postgresql``;
* ``DJ_DB_NAME``: the SQLite file, or the PostgreSQL database name (Django's test runner
  makes ``TEST NAME``: ``DJ_TEST_DB_NAME``, default ``<file>.test`` / ``test_<name>``);
* ``DJ_PG_URL``: the PostgreSQL server (``postgresql://user@host:port/any``).
"""

import os
from pathlib import Path
from urllib.parse import urlsplit

import django

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "test-only-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
USE_TZ = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "ratchet.contrib.django",
    "shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "djproject.urls"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "DIRS": [],
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

_kind = os.environ.get("DJ_DB", "sqlite")
_name = os.environ.get("DJ_DB_NAME", str(BASE_DIR / "db.sqlite3"))
if _kind == "sqlite":
    _options: dict[str, object] = {"timeout": 30}
    if django.VERSION >= (5, 1):
        # Take the write lock at BEGIN: a deferred transaction that reads first cannot
        # wait for a worker's write and fails at once with "database is locked".
        _options["transaction_mode"] = "IMMEDIATE"
    DATABASES = {"default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _name,
        "OPTIONS": _options,
        "TEST": {"NAME": os.environ.get("DJ_TEST_DB_NAME", _name + ".test")},
    }, "other": {  # a database without the ledger
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": _name + ".other",
        "OPTIONS": _options,
        "TEST": {"NAME": os.environ.get("DJ_TEST_DB_NAME", _name + ".test") + ".other"},
    }}
else:
    _server = urlsplit(os.environ.get("DJ_PG_URL", "postgresql://postgres@127.0.0.1:5432/test"))
    _pg = {
        "ENGINE": "django.db.backends.postgresql",
        "USER": _server.username or "postgres",
        "PASSWORD": _server.password or "",
        "HOST": _server.hostname or "127.0.0.1",
        "PORT": str(_server.port or 5432),
    }
    DATABASES = {
        "default": {**_pg, "NAME": _name,
                    "TEST": {"NAME": os.environ.get("DJ_TEST_DB_NAME", "test_" + _name)}},
        # a database without the ledger
        "other": {**_pg, "NAME": _name + "_other", "TEST": {"NAME": f"test_{_name}_other"}},
    }

RATCHET = {
    "APP": "djproject.tasks:app",
    "DASHBOARD_URL": "http://dash.example:8080/",
    "SCHEMA": os.environ.get("DJ_SCHEMA", "ratchet"),
}
TEST_RUNNER = "ratchet.contrib.django.testing.RatchetTestRunner"

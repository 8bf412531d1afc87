"""Secrets never reach output, logs or reprs: ledger URL passwords (encoded or not, with
``#``, ``/``, ``?``, ``@``), ``password=`` parameters; in error messages, ``repr`` of
``LedgerConfig`` / ``App`` / ``Control``, the CLI (PostgreSQL has trust auth here, so a
wrong password still connects: the output of a working ``ratchet status`` is checked)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from pgsupport import private_schema
from typer.testing import CliRunner

from ratchet import App, ConfigError, Control, RatchetError
from ratchet.cli.main import cli
from ratchet.config import parse_ledger_url, redact_url

SECRET = "Sw0rd"
"""Part of every password below; must never be printed."""

RAW_PASSWORDS = [f"{SECRET}#frag", f"{SECRET}/path", f"{SECRET}?q=1", f"{SECRET}@at",
                 f"p#{SECRET}/x?y@z", f"{SECRET}:colon", f"1234/{SECRET}", f"99?{SECRET}",
                 f"5#{SECRET}", f"x@{SECRET}"]
"""Passwords as a user might paste them; the last three make the URL parse as a numeric
port followed by a path, a query or a fragment holding the rest of the password; an '@' in
the password makes libpq take the rest of it as the host name."""


def with_password(url: str, password: str, *, encode: bool) -> str:
    """``url`` (``postgresql://user@host...``) with ``password`` inserted after the user."""
    scheme, rest = url.split("://", 1)
    user, host = rest.split("@", 1)
    shown = quote(password, safe="") if encode else password
    return f"{scheme}://{user}:{shown}@{host}"


def assert_no_secret(text: str) -> None:
    assert SECRET not in text, text
    assert quote(SECRET) not in text, text


@pytest.mark.parametrize("password", RAW_PASSWORDS)
@pytest.mark.parametrize("encode", [True, False], ids=["encoded", "raw"])
def test_redact_url_hides_the_whole_password(password: str, encode: bool) -> None:
    url = with_password("postgresql://app@db.internal:5432/jobs?schema=r", password,
                        encode=encode)
    shown = redact_url(url)
    assert_no_secret(shown)
    assert shown.startswith("postgresql://app:***@")


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://app@db/jobs?password={SECRET}",
        f"postgresql://app@db/jobs?sslmode=require&sslpassword={SECRET}&x=1",
        f"postgresql://app:{SECRET}@db/jobs?password={SECRET}",
        f"sqlite://user:{SECRET}@host/x.db",
        f"postgresql://app@db/jobs?password=x#{SECRET}&schema=r",
    ],
)
def test_redact_url_hides_password_parameters(url: str) -> None:
    assert_no_secret(redact_url(url))


def test_redact_url_keeps_urls_without_secrets() -> None:
    for url in ("sqlite:///ratchet.db", "postgresql://app@db:5432/jobs?schema=r",
                "sqlite:////var/lib/x.db?durability=buffered"):
        assert redact_url(url) == url


@pytest.mark.parametrize("password", RAW_PASSWORDS)
@pytest.mark.parametrize("encode", [True, False], ids=["encoded", "raw"])
def test_config_errors_and_reprs_never_show_the_password(password: str, encode: bool) -> None:
    base = "postgresql://app@db.internal:5432/jobs?schema=r"
    url = with_password(base, password, encode=encode)
    try:
        config = parse_ledger_url(url)
    except ConfigError as exc:  # an unencoded '#', '/', '?' breaks the URL: refused
        assert_no_secret(str(exc))
        assert "percent-encode" in str(exc)
    else:
        assert_no_secret(repr(config))
        assert_no_secret(str(config))
    app = App(url)
    assert_no_secret(repr(app))
    if encode:
        assert_no_secret(repr(Control(url)))
    bad_options = url + "&pool_size=0"
    with pytest.raises(ConfigError) as err:
        parse_ledger_url(bad_options.replace("?schema", "?password=" + SECRET + "&schema"))
    assert_no_secret(str(err.value))


def test_ledger_config_repr_hides_password_options() -> None:
    config = parse_ledger_url(f"postgresql://app@db/jobs?password={SECRET}&sslmode=require")
    assert config.options["password"] == SECRET  # still passed to the driver
    assert_no_secret(repr(config))
    assert "sslmode" in repr(config)


@pytest.mark.parametrize(
    "url",
    [
        f"sqlite://user:{SECRET}@host/x.db",
        f"sqlite:///x.db?password={SECRET}",
        f"sqlite:///x.db?secret={SECRET}#frag",
        f"mysql://user:{SECRET}@host/db",
    ],
)
def test_sqlite_and_unknown_scheme_errors_are_redacted(url: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_ledger_url(url)
    assert_no_secret(str(err.value))
    result = CliRunner().invoke(cli, ["status", "--ledger", url])
    assert result.exit_code == 2
    assert_no_secret(result.output)


def test_env_url_in_app_repr_is_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RATCHET_LEDGER_URL", f"postgresql://app:{SECRET}@db/jobs")
    assert_no_secret(repr(App()))
    assert_no_secret(repr(Control()))


# ---------------------------------------------------------------------- real PostgreSQL


@pytest.mark.parametrize("password", [f"{SECRET}#/?@x", f"{SECRET}plain"])
def test_postgresql_status_with_a_password_prints_no_secret(password: str) -> None:
    with private_schema("rt_secret") as (url, _schema):
        secret_url = with_password(url, password, encode=True)
        assert Control(secret_url).migrate() >= 1
        for args in (["status"], ["status", "--json"], ["workers"], ["migrate"]):
            result = CliRunner().invoke(cli, [*args, "--ledger", secret_url])
            assert result.exit_code == 0, result.output
            assert_no_secret(result.output)
        # the same URL with the special characters left unencoded: refused, one line
        raw_url = with_password(url, password, encode=False)
        result = CliRunner().invoke(cli, ["status", "--ledger", raw_url])
        assert_no_secret(result.output)
        if password.endswith("plain"):
            assert result.exit_code == 0, result.output
        else:
            assert result.exit_code == 2
            assert len(result.output.strip().splitlines()) == 1, result.output


def test_unreachable_postgresql_error_and_worker_log_print_no_secret(tmp_path: Path) -> None:
    url = f"postgresql://app:{quote(SECRET + '#/?', safe='')}@127.0.0.1:1/jobs?connect_timeout=2"
    with pytest.raises(RatchetError) as err:
        Control(url).status()
    assert_no_secret(str(err.value))
    (tmp_path / "emptyapp.py").write_text("from ratchet import App\napp = App()\n")
    proc = subprocess.run(
        [sys.executable, "-m", "ratchet.cli.main", "worker", "emptyapp:app",
         "--ledger", url, "--ledger-wait-s", "12", "--log-level", "DEBUG"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "LedgerUnavailable" in proc.stderr
    # The start-up wait logged at least one retry (12 s: a connect attempt can take its
    # whole 2 s connect_timeout on a loaded machine; CI once saw none within 3 s).
    assert "retrying in" in proc.stderr
    assert_no_secret(proc.stdout + proc.stderr)


def test_logging_of_a_ledger_config_is_redacted(caplog: pytest.LogCaptureFixture) -> None:
    config = parse_ledger_url(f"postgresql://app:{SECRET}@db/jobs")
    with caplog.at_level(logging.INFO):
        logging.getLogger("ratchet.test").info("ledger %s / %r", config, config)
    assert_no_secret(caplog.text)

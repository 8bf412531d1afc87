"""Numbers out of range in operator commands are refused with a clear error naming the
option (exit status 2), never a traceback: a limit too large for the ledger's integer
column (both ledgers: Control, the ledger itself and ``ratchet limits set``), and the
worker's and submit's numeric options past their bounds (the API models bound the same
fields: tests/web)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ratchet import Control, InvalidArguments, LimitScope, open_ledger
from ratchet.cli.main import cli

HUGE = "99999999999999999999"
TOO_LARGE = r"^(reserved|maximum) must be an integer from [01] to 2147483647, got \d+$"

APP = """
from ratchet import App, TaskContext

app = App()


@app.task(name="bound.echo")
def echo(ctx: TaskContext) -> None:
    return None
"""


@pytest.mark.parametrize(("args", "message"), [
    (["--total", HUGE], f"maximum must be an integer from 1 to 2147483647, got {HUGE}"),
    (["--type", "bound.echo", "--max", HUGE],
     f"maximum must be an integer from 1 to 2147483647, got {HUGE}"),
    (["--type", "bound.echo", "--reserved", HUGE],
     f"reserved must be an integer from 0 to 2147483647, got {HUGE}"),
    (["--tenant", "acme", "--max", str(2**31)],
     "maximum must be an integer from 1 to 2147483647, got 2147483648"),
])
def test_a_limit_too_large_for_the_ledger_is_refused(ledger_url: str, args: list[str],
                                                     message: str) -> None:
    Control(ledger_url).migrate()
    result = CliRunner().invoke(cli, ["limits", "set", *args, "--reason", "r",
                                      "--ledger", ledger_url])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output and "OverflowError" not in result.output
    assert "error: InvalidArguments: " in result.stderr, result.stderr
    assert message in result.stderr, result.stderr  # 2**31 - 1: a 32-bit column
    with Control(ledger_url) as control:
        assert control.limits().limits == []  # nothing was stored


def test_the_ledger_and_control_bound_limits(ledger_url: str) -> None:
    with Control(ledger_url) as control:
        control.migrate()
        for kwargs in ({"maximum": 10**20}, {"maximum": 2**31}, {"reserved": 2**31}):
            with pytest.raises(InvalidArguments, match=TOO_LARGE):
                control.set_limit("type", "t", reason="r", **kwargs)  # type: ignore[arg-type]
        ok = control.set_limit("type", "t", maximum=2**31 - 1, reason="the largest")
        assert ok.maximum == 2**31 - 1
    led = open_ledger(ledger_url)
    try:
        with pytest.raises(InvalidArguments, match=TOO_LARGE):
            led.set_limit(LimitScope.TOTAL, "", 0, 10**30, "op", "r")
    finally:
        led.close()


@pytest.mark.parametrize(("command", "option"), [
    (["worker", "boundapp:app", "--concurrency", HUGE], "--concurrency"),
    (["worker", "boundapp:app", "--prefetch", HUGE], "--prefetch"),
    (["worker", "boundapp:app", "--async-concurrency", "10001"], "--async-concurrency"),
    (["worker", "boundapp:app", "--async-concurrency", "0"], "--async-concurrency"),
    (["worker", "boundapp:app", "--writers", "1000"], "--writers"),
    (["worker", "boundapp:app", "--poll-interval-s", "1e300"], "--poll-interval-s"),
    (["worker", "boundapp:app", "--ledger-wait-s", "1e300"], "--ledger-wait-s"),
    (["worker", "boundapp:app", "--shutdown-grace-s", "1e300"], "--shutdown-grace-s"),
    (["worker", "boundapp:app", "--max-stuck-threads", HUGE], "--max-stuck-threads"),
    (["submit", "boundapp:app", "bound.echo", "--delay-s", "1e300"], "--delay-s"),
    (["submit", "boundapp:app", "bound.echo", "--task-version", HUGE], "--task-version"),
])
def test_numeric_options_are_bounded(command: list[str], option: str, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "boundapp.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(cli, [*command, "--ledger", f"sqlite:///{tmp_path}/l.db"])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert f"Invalid value for '{option}'" in result.stderr, result.stderr
    assert not (tmp_path / "l.db").exists()  # refused before anything was opened

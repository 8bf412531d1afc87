"""Duration options of the CLI are parsed by one parser (``ratchet.validation.
parse_duration_s``) that bounds them: a value out of range is reported as out of range,
naming the option and giving the limit in the option's units, never as malformed, never
under the API's parameter name, and a huge one (past 100 years) is refused before it
reaches the ledger (on both ledgers: nothing is read or deleted)."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from ratchet import App, Control, InvalidArguments, State, TaskContext
from ratchet.cli.main import cli
from ratchet.validation import MAX_DURATION_S, parse_duration_s


def _refused(args: list[str], ledger_url: str) -> str:
    """Run ``ratchet ARGS --ledger URL``; assert it was refused (status 2), return stderr."""
    result = CliRunner().invoke(cli, [*args, "--ledger", ledger_url])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "Traceback" not in result.output
    return result.stderr


@pytest.mark.parametrize(("args", "said"), [
    (["status", "--window", "2d"], "--window must be at most 1d (86400 s), got 2d"),
    (["status", "--window", "0"], "--window must be above 0, got 0"),
    (["status", "--watch", "1e-9", "--count", "1"], "--watch SECONDS must be at least 0.1s"),
    (["status", "--watch", "1e9", "--count", "1"],
     "--watch SECONDS must be at most 1h (3600 s), got 1e9"),
    (["prune", "--older-than", "99999999999999d", "--dry-run"],
     "--older-than must be at most 36500d (3153600000 s), got 99999999999999d"),
    (["workers", "--prune-after", "9999999999999999999999h"],
     "--prune-after must be at most 36500d (3153600000 s), got 9999999999999999999999h"),
    (["tasks", "--older-than", "99999999999999999999999d"],
     "--older-than must be at most 36500d"),
    (["tasks", "--newer-than", "1e999"], "--newer-than must be at most 36500d"),
])
def test_out_of_range_durations_name_the_option(ledger_url: str, args: list[str],
                                                said: str) -> None:
    app = App(ledger_url)
    app.task(name="dur.echo")(lambda ctx: None)
    task_id = app.submit("dur.echo").task_id
    app.close()
    stderr = _refused(args, ledger_url)
    assert f"error: InvalidArguments: {said}" in stderr, stderr
    assert "window_s" not in stderr and "must be a duration like" not in stderr, stderr
    with Control(ledger_url) as control:
        assert control.get(task_id).state is State.PENDING  # nothing was touched


def test_in_range_durations_still_run(ledger_url: str) -> None:
    app = App(ledger_url)

    @app.task(name="dur.ok")
    def ok(ctx: TaskContext) -> None:
        return None

    app.submit("dur.ok")
    app.close()
    for args in (["status", "--window", "1d"], ["status", "--window", "1.5e3"],
                 ["status", "--watch", "0.1", "--count", "1"],
                 ["tasks", "--older-than", "36500d"], ["workers", "--prune-after", "1e2h"]):
        result = CliRunner().invoke(cli, [*args, "--ledger", ledger_url])
        assert result.exit_code == 0, (args, result.output)
    # The largest age a prune takes: its cutoff is printed as the date it is (before 1970).
    result = CliRunner().invoke(cli, ["prune", "--older-than", "36500d", "--dry-run",
                                      "--ledger", ledger_url])
    assert result.exit_code == 0, result.output
    assert "would delete 0 finished task(s)" in result.stdout
    assert "finished before 1970-01-01" not in result.stdout, result.stdout


def test_the_parser_bounds_and_takes_exponents() -> None:
    assert parse_duration_s("1e3s", "--x") == 1000.0
    assert parse_duration_s("1.5E1m", "--x") == 900.0
    assert parse_duration_s("36500d", "--x") == MAX_DURATION_S
    for text, said in (("36501d", "at most 36500d"), ("1e999", "at most 36500d"),
                       ("2h", "at most 1h (3600 s), got 2h"), ("0.5s", "at least 1s")):
        with pytest.raises(InvalidArguments, match=re.escape(f"--x must be {said}")):
            parse_duration_s(text, "--x", minimum_s=1.0,
                             maximum_s=3600.0 if "1h" in said else MAX_DURATION_S)
    with pytest.raises(InvalidArguments, match="must be a duration like"):
        parse_duration_s("e5", "--x")

"""Every command that needs ``--reason`` refuses a missing one exactly as a blank one, in
the one style of Ratchet's errors (``error: InvalidArguments: reason (--reason) must say
why...``, exit status 2), never click's ``Error: Missing option '--reason'.``; the set of
such commands is read from the CLI itself, so a new one cannot be left out."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from ratchet import Control, InvalidArguments
from ratchet.cli.main import cli
from ratchet.control import REASON_REQUIRED

APP = """
from ratchet import App, TaskContext

app = App()


@app.task(name="why.echo")
def echo(ctx: TaskContext) -> None:
    return None
"""

NEEDS_REASON = {
    # command path: the other arguments it needs (the reason check comes first)
    ("resolve",): ["t-1", "--outcome", "done"],
    ("cancel",): ["t-1"],
    ("retry",): ["t-1"],
    ("compensate",): ["t-1"],
    ("fork",): ["t-1", "--from-step", "a"],
    ("pause",): ["--type", "why.echo"],
    ("resume",): ["--type", "why.echo"],
    ("limits", "set"): ["--type", "why.echo", "--max", "2"],
    ("limits", "clear"): ["--type", "why.echo"],
    # a reason only for the real thing (not a dry run, only with --apply)
    ("quarantine", "replay"): ["--fingerprint", "0123456789abcdef"],
    ("reconcile",): ["why.echo", "--app", "whyapp:app", "--apply"],
}

LINE = f"error: InvalidArguments: {REASON_REQUIRED}"


def _with_reason() -> set[tuple[str, ...]]:
    """Every command path of the CLI that has a ``--reason`` option."""
    found: set[tuple[str, ...]] = set()

    def walk(group: object, prefix: tuple[str, ...]) -> None:
        for name, command in getattr(group, "commands", {}).items():
            path = (*prefix, name)
            if any("--reason" in getattr(p, "opts", []) for p in command.params):
                found.add(path)
            walk(command, path)

    walk(get_command(cli), ())
    return found


def test_the_table_covers_every_command_with_a_reason() -> None:
    assert _with_reason() == set(NEEDS_REASON)


@pytest.mark.parametrize("path", sorted(NEEDS_REASON), ids=" ".join)
def test_a_missing_reason_reads_like_a_blank_one(path: tuple[str, ...], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "whyapp.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    url = f"sqlite:///{tmp_path}/l.db"
    Control(url).migrate()
    args = [*path, *NEEDS_REASON[path], "--ledger", url]
    outputs = []
    for extra in ([], ["--reason", "  "]):
        result = CliRunner().invoke(cli, [*args, *extra])
        assert result.exit_code == 2, (extra, result.output)
        assert "Missing option" not in result.stderr and "Usage:" not in result.stderr
        outputs.append(result.stderr.strip().splitlines()[-1])
    missing, blank = outputs
    assert missing == blank, outputs
    assert missing.startswith("error: InvalidArguments: reason (--reason) must say why"), \
        missing
    if path != ("reconcile",):  # reconcile says why --apply needs it
        assert missing == LINE


def test_the_real_command_and_control_say_the_same(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    with Control(url) as control:
        control.migrate()
        with pytest.raises(InvalidArguments) as caught:
            control.cancel("t-1", reason=" ")
    assert str(caught.value) == REASON_REQUIRED
    done = subprocess.run([sys.executable, "-m", "ratchet.cli.main", "cancel", "t-1",
                           "--ledger", url], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 2 and done.stderr.strip() == LINE, done.stderr

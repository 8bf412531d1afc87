"""The ``ratchet`` CLI prints stored data and user input as text, never as Rich markup or
terminal control sequences; undecodable values are shown with a note; bad input is one
line, never a traceback; output is not wrapped when piped. Real CLI (typer's runner and a
subprocess), real ledgers."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from typer.main import get_command
from typer.testing import CliRunner

import ratchet
from ratchet import App, TaskContext
from ratchet.cli.main import cli

MARKUP_KEYS = [
    "[/]",
    "[bold red]X[/bold red]",
    "[link=https://evil.example]click me[/link]",
    "[/bold]",
    "x[",
    ":warning: :smile:",  # emoji codes stay text
]


def make_app(url: str, name: str = "t.echo") -> App:
    app = App(url)

    @app.task(name=name)
    def echo(ctx: TaskContext, text: str = "") -> str:
        return text

    return app


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{args}: raised {result.exception!r}\n{result.output}"
    )
    return result.exit_code, result.stdout, result.stderr


def assert_one_error_line(stderr: str, kind: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"error: {kind}: "), stderr
    assert "Traceback" not in stderr


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/l.db"


@pytest.mark.parametrize("key", MARKUP_KEYS)
def test_keys_that_look_like_markup_are_printed_literally(url: str, key: str) -> None:
    app = make_app(url)
    handle = app.submit("t.echo", {"text": key}, idempotency_key=key)
    app.close()
    code, out, err = invoke("inspect", handle.task_id, "--ledger", url)
    assert code == 0, err
    # The literal characters, brackets included: markup would have been consumed or styled.
    assert f"key={key}" in out
    assert json.dumps(key) in out  # the params line
    assert "\x1b" not in out  # no style, no OSC 8 hyperlink


def test_a_task_without_key_says_so_instead_of_none(url: str) -> None:
    app = make_app(url)
    handle = app.submit("t.echo", {"text": "x"})
    app.close()
    code, out, err = invoke("inspect", handle.task_id, "--ledger", url)
    assert code == 0, err
    assert "None" not in out
    assert "key=-" in out and "no key" in out


def test_task_names_that_look_like_markup_in_status(url: str) -> None:
    name = "[red]billing[/red].charge[/]"
    app = make_app(url, name=name)
    app.submit(name, {"text": "x"})
    app.close()
    code, out, err = invoke("status", "--ledger", url)
    assert code == 0, err
    assert name in out


def test_control_characters_in_stored_values_are_escaped(url: str) -> None:
    key = "a\x1b[2Jb\x07c"
    app = make_app(url)
    handle = app.submit("t.echo", {"text": "\x1b]8;;http://x\x1b\\"}, idempotency_key=key)
    app.close()
    code, out, err = invoke("inspect", handle.task_id, "--ledger", url)
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out
    assert "key=a\\x1b[2Jb\\x07c" in out


@pytest.mark.parametrize("task_id", ["[/]", "[bold]x", "\x1b[31mred"])
def test_inspect_of_a_markup_task_id_is_one_clear_line(url: str, task_id: str) -> None:
    make_app(url).submit("t.echo", {})
    code, _out, err = invoke("inspect", task_id, "--ledger", url)
    assert code == 2
    assert_one_error_line(err, "TaskNotFound")
    assert "\x1b" not in err
    if "\x1b" not in task_id:
        assert task_id in err


def test_an_unknown_task_name_with_markup_is_printed_literally(url: str, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    (tmp_path / "markupapp.py").write_text(
        "from ratchet import App\napp = App()\n"
        "@app.task(name='[b]real[/b]')\ndef real(ctx) -> None:\n    return None\n"
    )
    monkeypatch.chdir(tmp_path)
    code, _out, err = invoke("submit", "markupapp:app", "[/]", "--ledger", url)
    assert code == 2
    assert_one_error_line(err, "UnknownTask")
    assert "'[/]'" in err and "[b]real[/b]" in err


# ---------------------------------------------------------------------- undecodable rows


def _corrupt_sqlite(path: Path, task_id: str, params_sql: str, result_sql: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute(
            f"UPDATE tasks SET params = {params_sql}, result = {result_sql} WHERE id = ?",
            (task_id,),
        )
        conn.commit()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("params_sql", "shown"),
    [
        ("CAST(X'7B226E223AFF7D' AS TEXT)", '{"n":\\xff}'),  # invalid UTF-8: the byte
        ("'{oops'", "{oops"),  # not JSON
        ("'" + "[" * 5000 + "'", "[" * 50),  # deeper than the decoder goes
    ],
    ids=["invalid-utf8", "not-json", "too-deep"],
)
def test_undecodable_stored_values_are_shown_as_text_with_a_note(
    tmp_path: Path, params_sql: str, shown: str
) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    app = make_app(url)
    bad = app.submit("t.echo", {"text": "a"}, idempotency_key="bad")
    good = app.submit("t.echo", {"text": "b"}, idempotency_key="good")
    app.close()
    _corrupt_sqlite(tmp_path / "l.db", bad.task_id, params_sql, "'[1,'")
    code, out, err = invoke("inspect", bad.task_id, "--ledger", url)
    assert code == 0, err
    params_line = next(line for line in out.splitlines() if line.startswith("params: "))
    assert shown in params_line and "not decodable" in params_line
    result_line = next(line for line in out.splitlines() if line.startswith("result: "))
    assert "[1," in result_line and "not decodable" in result_line
    code, out, err = invoke("inspect", bad.task_id, "--ledger", url, "--json")
    assert code == 0, err
    task = json.loads(out)["task"]
    assert task["params"]["undecodable"] is True and task["params"]["error"]
    assert task["result"] == {"text": "[1,", "error": task["result"]["error"], "undecodable": True}
    # the other task and the whole-ledger views are unaffected
    code, out, err = invoke("inspect", good.task_id, "--ledger", url)
    assert code == 0 and '{"text":"b"}' in out
    code, out, err = invoke("status", "--ledger", url, "--json")
    assert code == 0, err
    assert json.loads(out)["counts"] == {"t.echo": {"PENDING": 2}}


def test_undecodable_params_on_postgresql_are_shown_with_a_note(backend: str,
                                                                ledger_url: str) -> None:
    if backend != "postgresql":
        pytest.skip("the SQLite cases are covered above (invalid UTF-8 is SQLite only)")
    import psycopg

    from ratchet.config import parse_ledger_url

    app = make_app(ledger_url)
    bad = app.submit("t.echo", {"text": "a"})
    app.close()
    config = parse_ledger_url(ledger_url)
    schema = config.options["schema"]
    base = ledger_url.split("?", 1)[0]
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{schema}".tasks SET params = %s WHERE id = %s', ("{oops", bad.task_id)
        )
    code, out, err = invoke("inspect", bad.task_id, "--ledger", ledger_url)
    assert code == 0, err
    assert "params: {oops  (not decodable" in out


# ---------------------------------------------------------------------- deep JSON


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_deep_json_params_is_one_line(url: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "deepapp.py").write_text(
        "from ratchet import App\napp = App()\n"
        "@app.task(name='t')\ndef t(ctx, v=None) -> None:\n    return None\n"
    )
    monkeypatch.chdir(tmp_path)
    deep = '{"v":' + _deep(60_000) + "}"
    code, _, err = invoke("submit", "deepapp:app", "t", "--params", deep, "--ledger", url)
    assert code == 2
    assert_one_error_line(err, "InvalidArguments")
    assert "--params" in err and "RecursionError" not in err
    # decodable, but deeper than Ratchet stores: refused by the payload check, one line
    deep = '{"v":' + _deep(500) + "}"
    code, _, err = invoke("submit", "deepapp:app", "t", "--params", deep, "--ledger", url)
    assert code == 2
    assert_one_error_line(err, "PayloadNotSerializable")
    assert "200 levels" in err


def test_deep_json_result_is_one_line(url: str) -> None:
    make_app(url).submit("t.echo", {})
    code, _, err = invoke(
        "resolve", "0" * 32, "--outcome", "done", "--reason", "r", "--result", _deep(60_000),
        "--ledger", url,
    )
    assert code == 2
    assert_one_error_line(err, "InvalidArguments")
    assert "--result" in err


@pytest.mark.parametrize("params", ["{oops", "[1, 2]", '"text"', "", '{"a": NaN}'])
def test_params_that_are_not_a_json_object(url: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch, params: str) -> None:
    (tmp_path / "objapp.py").write_text(
        "from ratchet import App\napp = App()\n"
        "@app.task(name='t')\ndef t(ctx, a=None) -> None:\n    return None\n"
    )
    monkeypatch.chdir(tmp_path)
    code, _, err = invoke("submit", "objapp:app", "t", "--params", params, "--ledger", url)
    assert code == 2
    kind = "PayloadNotSerializable" if "NaN" in params else "InvalidArguments"
    assert_one_error_line(err, kind)


# ---------------------------------------------------------------------- no ledger there


def test_read_only_commands_refuse_a_database_that_holds_no_ledger(tmp_path: Path) -> None:
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users (name) VALUES ('alice')")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    listing = sorted(p.name for p in tmp_path.iterdir())
    url = f"sqlite:///{path}"
    for args in (
        ["status"],
        ["status", "--json"],
        ["inspect", "0" * 32],
        ["workers"],
        ["resolve", "0" * 32, "--outcome", "not-done", "--reason", "checked"],
    ):
        code, out, err = invoke(*args, "--ledger", url)
        assert code == 2, (args, out, err)
        assert_one_error_line(err, "LedgerUnavailable")
        assert "holds no Ratchet ledger" in err and "users" in err
        assert path.read_bytes() == before, args
        assert sorted(p.name for p in tmp_path.iterdir()) == listing, args


def test_read_only_commands_do_not_create_a_missing_ledger(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/typo.db"
    for args in (["status"], ["inspect", "0" * 32], ["workers"]):
        code, _, err = invoke(*args, "--ledger", url)
        assert code == 2
        assert_one_error_line(err, "LedgerUnavailable")
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- shape of the output


def test_output_is_not_wrapped_when_piped(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/l.db"
    key = "order-" + "k" * 300
    handle = make_app(url).submit("t.echo", {"text": "y" * 400}, idempotency_key=key)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    env.pop("COLUMNS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "ratchet.cli.main", "inspect", handle.task_id, "--ledger", url],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(f"key={key}" in line for line in lines)  # the header, whole, on one line
    assert any(line == 'params: {"text":"' + "y" * 400 + '"}' for line in lines)
    assert any(f"key={key}" in line and "submitted" in line for line in lines)  # a table row
    proc = subprocess.run(
        [sys.executable, "-m", "ratchet.cli.main", "status", "--ledger", url],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert any(line.startswith("claims: ") and "operator actions: " in line
               for line in proc.stdout.splitlines())


def test_version() -> None:
    code, out, _ = invoke("--version")
    assert code == 0
    assert out.strip() == f"ratchet {ratchet.__version__}"


def test_every_option_has_help_and_no_type_labels_leak() -> None:
    group = get_command(cli)
    assert group.commands, "no commands"  # type: ignore[attr-defined]
    code, out, _ = invoke("--help")
    assert code == 0
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        code, out, err = invoke(name, "--help")
        assert code == 0, err
        for label in ("<bool>", "<str>", "<int", "<float", "<text>"):
            assert label not in out, f"ratchet {name} --help shows {label}:\n{out}"
        for param in command.params:
            if param.param_type_name == "option":
                assert getattr(param, "help", None), f"ratchet {name} {param.opts}: no help"


def test_the_cli_uses_only_the_public_api() -> None:
    """cli/ goes through Control, App, Worker and loading: never the ledger modules or the
    worker registry internals (so the CLI and a future HTTP face cannot drift apart)."""
    import ast

    import ratchet.cli

    forbidden = ("ratchet.ledger", "ratchet.worker.registry", "ratchet.worker.runner")
    for path in Path(ratchet.cli.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                # cli/*.py sit one package below ratchet: "..x" is ratchet.x, ".x" ratchet.cli.x
                prefix = {0: "", 1: "ratchet.cli.", 2: "ratchet."}[node.level]
                module = prefix + (node.module or "")
                names = [module] + [f"{module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                assert not name.startswith(forbidden), f"{path.name} imports {name}"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("nocolon", "must look like MODULE:ATTRIBUTE"),
        ("no_such_module_xyz:app", "cannot import module 'no_such_module_xyz'"),
        ("raising_app:app", "raised RuntimeError: boom [/] (" ),
        ("os:path", "not a ratchet.App"),
        ("good_app:missing", "has no attribute 'missing'"),
        ("good_app:", "must look like MODULE:ATTRIBUTE"),
    ],
)
def test_app_specs_that_cannot_be_loaded_are_one_line(
    url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str, expected: str
) -> None:
    (tmp_path / "raising_app.py").write_text("raise RuntimeError('boom [/]')\n")
    (tmp_path / "good_app.py").write_text("from ratchet import App\napp = App()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = invoke("submit", spec, "t", "--ledger", url)
    assert code == 2
    assert_one_error_line(err, "ConfigError")
    assert expected in err
    if spec.startswith("raising_app"):
        assert "raising_app.py:1" in err


def test_a_missing_attribute_and_bad_json_params_are_said_once(
        url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "good_app.py").write_text("from ratchet import App\napp = App()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, _, err = invoke("submit", "good_app:missing", "t", "--ledger", url)
    assert (code, err.strip()) == (
        2, "error: ConfigError: module 'good_app' has no attribute 'missing'")
    code, _, err = invoke("submit", "good_app:app", "t", "--params", '{order_id:"x"}',
                          "--ledger", url)
    assert (code, err.strip()) == (
        2, "error: InvalidArguments: --params is not valid JSON (Expecting property name "
           "enclosed in double quotes at line 1 column 2)")


def test_app_spec_with_a_dotted_attribute(url: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nested_app.py").write_text(
        "from types import SimpleNamespace\nfrom ratchet import App\n"
        "registry = SimpleNamespace(app=App())\n"
        "@registry.app.task(name='t')\ndef t(ctx) -> None:\n    return None\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    code, out, err = invoke("submit", "nested_app:registry.app", "t", "--ledger", url)
    assert code == 0, err
    assert out.strip().endswith(" submitted")

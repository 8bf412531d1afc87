"""The JSON log formatter on odd input: every record becomes one line of valid JSON
(RFC 8259: no NaN), whatever the message's arguments or the extra fields hold."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

import pytest

from ratchet.observe.logs import JsonFormatter
from ratchet.testing.processes import clean_env


def _record(msg: object, args: tuple[Any, ...] = (), **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("t", logging.INFO, __file__, 1, msg, args, None)
    record.__dict__.update(extra)
    return record


def _strict(line: str) -> dict[str, Any]:
    def refuse(token: str) -> None:
        raise AssertionError(f"not JSON: {token}")

    parsed: dict[str, Any] = json.loads(line, parse_constant=refuse)
    return parsed


def test_multiline_and_non_ascii_stay_one_line() -> None:
    text = "first\nsecond\r\nthird é 日本 \x00"
    line = JsonFormatter().format(_record(text))
    assert "\n" not in line and _strict(line)["message"] == text


cycle: dict[str, Any] = {}
cycle["self"] = cycle


@pytest.mark.parametrize(("record", "expect"), [
    (_record("%d items", ("many",)), "%d items"),
    (_record("%s and %s", ("one",)), "%s and %s"),
    (_record("m", key={(1, 2): 3}), "m"),
    (_record("m", key=cycle), "m"),
    (_record("m", duration_s=float("nan")), "m"),
], ids=["bad-arg", "missing-arg", "tuple-key", "cycle", "nan"])
def test_odd_records_are_still_json(record: logging.LogRecord, expect: str) -> None:
    line = JsonFormatter().format(record)
    out = _strict(line)
    assert out["message"].startswith(expect) and "\n" not in line


@pytest.mark.parametrize("encoding", ["ascii", "latin-1", "utf-8"])
def test_json_lines_stay_json_on_a_stderr_that_is_not_utf8(encoding: str) -> None:
    code = ("import logging; from ratchet.observe.logs import setup_logging; "
            "setup_logging('INFO', 'json'); logging.getLogger('x').info('café 日本')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60,
                          env=clean_env({"PYTHONIOENCODING": encoding}), check=True)
    [line] = done.stderr.decode(encoding).splitlines()
    assert _strict(line)["message"] == "café 日本"

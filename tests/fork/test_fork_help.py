"""The end-of-history checkpoint name ``ratchet:end`` is written as it is spelled (no
trailing colon) in ``ratchet fork --help`` and in the /api fork request's schema."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from ratchet.cli.main import cli
from ratchet.control import FORK_AT_END
from ratchet.web.models import ForkBody


def _flat(text: str) -> str:
    """The text with rich's box characters and line wrapping removed."""
    return re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", text))


def test_the_end_marker_is_spelled_as_it_is_named() -> None:
    assert FORK_AT_END == "ratchet:end"
    result = CliRunner().invoke(cli, ["fork", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = _flat(result.output)
    assert "ratchet:end for after the last recorded one" in text, text
    assert "ratchet:end:" not in text
    described = ForkBody.model_json_schema()["properties"]["from_step"]["description"]
    assert "ratchet:end for after the last recorded one" in described
    assert "ratchet:end:" not in described

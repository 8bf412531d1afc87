"""serde.dumps / loads fast paths give exactly the canonical encoder's text and errors.

``dumps`` answers scalars and flat containers without the general encoder (to save Python
CPU per task); the canonical form (sorted keys, compact separators, ASCII, no NaN) must not
change, since the params digest is computed over it.
"""

from __future__ import annotations

import json
import math
from enum import Enum
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratchet.errors import PayloadNotSerializable
from ratchet.serde import dumps, dumps_rows, loads

_REFERENCE = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)

_scalars = st.none() | st.booleans() | st.integers() | st.text() | st.floats(
    allow_nan=False, allow_infinity=False)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=30,
)


@given(_json)
def test_dumps_is_the_canonical_encoding(value: Any) -> None:
    text = dumps(value)
    assert text == _REFERENCE.encode(value)
    assert loads(text) == value


class Colour(str, Enum):  # noqa: UP042 (the pre-3.11 idiom users write)
    RED = "red"


class Count(int):
    pass


@pytest.mark.parametrize("value", [
    None, True, False, 0, -1, 2**80, 1.5, -0.0, 1e300, "", "é\u2028\ud83d\ude00", "a\x00b",
    "\ud800", [], {}, [1, "a", None], {"b": 1, "a": [1, 2]}, (1, 2), {"x": {"y": []}},
    [Colour.RED], {"k": Count(3)}, Count(3), Colour.RED,
])
def test_tricky_values_encode_as_the_reference(value: Any) -> None:
    assert dumps(value) == _REFERENCE.encode(value)


@pytest.mark.parametrize("value", [
    math.nan, math.inf, [math.nan], {"a": -math.inf}, [b"bytes"], {"s": {1}},
])
def test_what_the_reference_refuses_is_refused(value: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        _REFERENCE.encode(value)
    with pytest.raises(PayloadNotSerializable):
        dumps(value)


@pytest.mark.parametrize("text", ["null", "true", "false", "{}", "[]", "0", '"x"', '{"a":1}'])
def test_loads_fast_answers_match_json(text: str) -> None:
    assert loads(text) == json.loads(text)


@pytest.mark.parametrize("value", [{1: "int key"}, [{None: 1}], {"a": {2.5: "x"}}])
def test_non_string_keys_are_refused_on_every_path(value: Any) -> None:
    """Stricter than json (which would turn the key into a string: a different digest)."""
    with pytest.raises(PayloadNotSerializable):
        dumps(value)


@given(st.lists(st.dictionaries(st.text(), _scalars, max_size=6), max_size=5))
def test_dumps_rows_is_json_of_the_rows(rows: list[dict[str, Any]]) -> None:
    assert json.loads(dumps_rows(rows)) == rows


def test_dumps_rows_refuses_nan() -> None:
    with pytest.raises(ValueError):
        dumps_rows([{"x": math.nan}])

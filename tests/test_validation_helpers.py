"""``ratchet.validation.check_int`` and ``check_finite``: the one integer check and the one
finite-number check the call sites share (a bool refused, inclusive bounds, the caller's
exception type, one message format)."""

from __future__ import annotations

import math

import pytest

from ratchet import ConfigError, InvalidArguments
from ratchet.validation import check_finite, check_int


@pytest.mark.parametrize(("value", "minimum", "maximum", "message"), [
    (True, 1, 10, "n must be an integer from 1 to 10, got True"),  # True == 1, still refused
    (False, 0, None, "n must be an integer >= 0, got False"),
    (0, 1, 10, "n must be an integer from 1 to 10, got 0"),
    (11, 1, 10, "n must be an integer from 1 to 10, got 11"),
    (-1, 0, None, "n must be an integer >= 0, got -1"),
    (6, None, 5, "n must be an integer <= 5, got 6"),
    (1.0, 1, 10, "n must be an integer from 1 to 10, got 1.0"),
    ("3", None, None, "n must be an integer, got '3'"),
    (None, 1, 10, "n must be an integer from 1 to 10, got None"),
    (10**60, 1, 10, f"n must be an integer from 1 to 10, got {str(10**60)[:40]}..."),
])
def test_check_int_refuses(value: object, minimum: int | None, maximum: int | None,
                           message: str) -> None:
    with pytest.raises(InvalidArguments) as info:
        check_int(value, "n", minimum=minimum, maximum=maximum)
    assert str(info.value) == message


@pytest.mark.parametrize(("value", "minimum", "maximum"), [
    (1, 1, 10), (10, 1, 10), (0, None, None), (-5, None, 0), (2**31 - 1, 1, 2**31 - 1),
])
def test_check_int_accepts_the_bounds_inclusive(value: int, minimum: int | None,
                                                maximum: int | None) -> None:
    assert check_int(value, "n", minimum=minimum, maximum=maximum) == value


def test_check_int_names_an_int_too_long_to_print() -> None:
    with pytest.raises(InvalidArguments, match=r"^n must be an integer from 1 to 10, got an "
                                               r"int too long to show$"):
        check_int(10**5000, "n", minimum=1, maximum=10)  # repr() refuses over 4,300 digits


def test_check_int_raises_the_callers_error() -> None:
    with pytest.raises(ConfigError, match=r"^Worker writers must be an integer from 1 to 32, "
                                          r"got True$"):
        check_int(True, "Worker writers", minimum=1, maximum=32, error=ConfigError)
    with pytest.raises(ValueError, match=r"^burst_len must be an integer >= 1, got 0$") as info:
        check_int(0, "burst_len", minimum=1, error=ValueError)
    assert not isinstance(info.value, InvalidArguments)


@pytest.mark.parametrize(("value", "kwargs", "message"), [
    (True, {}, "x must be a finite number, got True"),
    (math.nan, {"minimum": 0.0}, "x must be a finite number >= 0, got nan"),
    (10**400, {}, "x must be a finite number, got " + str(10**400)[:40] + "..."),
    (0, {"minimum": 0.0, "above_minimum": True, "maximum": 5},
     "x must be a finite number > 0 and <= 5, got 0"),
    (5.5, {"minimum": 0.0, "above_minimum": True, "maximum": 5},
     "x must be a finite number > 0 and <= 5, got 5.5"),
])
def test_check_finite_refuses(value: object, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArguments) as info:
        check_finite(value, "x", **kwargs)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_check_finite_bounds_and_error() -> None:
    assert check_finite(0, "x", minimum=0.0) == 0.0
    assert check_finite(5, "x", minimum=0.0, above_minimum=True, maximum=5) == 5.0
    with pytest.raises(ConfigError, match=r"^open_s must be a finite number > 0"):
        check_finite(0.0, "open_s", minimum=0.0, above_minimum=True, error=ConfigError)

"""Retry governance (DESIGN §7): backoff bounds, policy validation, failure classes."""

from __future__ import annotations

import math
import random

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratchet.errors import (
    ConfigError,
    IllegalTransition,
    LedgerUnavailable,
    OutcomeUnknownError,
    OverloadError,
    PayloadNotSerializable,
    PermanentError,
    TaskFailure,
    TransientError,
    UndecodableData,
)
from ratchet.retry import FailureClass, RetryPolicy, classify, retry_after_s

# ---------------------------------------------------------------------- backoff

policies = st.builds(
    RetryPolicy,
    max_attempts=st.integers(1, 20),
    base_delay_s=st.floats(0.0, 60.0),
    max_delay_s=st.floats(0.0, 3600.0),
    multiplier=st.floats(1.0, 10.0),
    jitter=st.floats(0.0, 1.0),
    overload_min_delay_s=st.floats(0.0, 120.0),
)
# The exponent is capped inside ceiling_s so huge attempt numbers cannot overflow; the band
# properties are checked over realistic attempt counts, overflow separately below.
attempts = st.integers(1, 60)


def expected_ceiling(policy: RetryPolicy, attempt: int) -> float:
    """Independent statement of the documented ceiling: base * multiplier^(attempt-1), capped."""
    try:
        raw = policy.base_delay_s * policy.multiplier ** (attempt - 1)
    except OverflowError:
        raw = math.inf
    return min(policy.max_delay_s, raw)


@given(policy=policies, attempt=attempts, seed=st.integers(0, 2**32))
def test_transient_backoff_lies_within_jitter_band_below_ceiling(
    policy: RetryPolicy, attempt: int, seed: int
) -> None:
    ceiling = expected_ceiling(policy, attempt)
    assert policy.ceiling_s(attempt) == pytest.approx(ceiling, rel=1e-9)
    delay = policy.backoff_s(attempt, FailureClass.TRANSIENT, rng=random.Random(seed))
    assert math.isfinite(delay)
    assert ceiling * (1 - policy.jitter) - 1e-9 <= delay <= ceiling + 1e-9
    assert delay <= policy.max_delay_s + 1e-9
    assert delay >= 0


@given(policy=policies, attempt=st.integers(1, 200))
def test_ceiling_is_monotone_in_attempt(policy: RetryPolicy, attempt: int) -> None:
    assert policy.ceiling_s(attempt + 1) >= policy.ceiling_s(attempt)
    assert policy.ceiling_s(attempt) <= policy.max_delay_s


@given(
    policy=policies,
    attempt=attempts,
    hint=st.one_of(st.none(), st.floats(0.0, 10_000.0)),
    seed=st.integers(0, 2**32),
)
def test_overload_backoff_respects_floor_and_cap(
    policy: RetryPolicy, attempt: int, hint: float | None, seed: int
) -> None:
    delay = policy.backoff_s(attempt, FailureClass.OVERLOAD, hint, rng=random.Random(seed))
    floor = min(max(policy.overload_min_delay_s, hint or 0.0), policy.max_delay_s)
    ceiling = expected_ceiling(policy, attempt)
    assert delay >= floor - 1e-9
    assert delay >= ceiling * (1 - policy.jitter) - 1e-9
    assert delay <= max(ceiling, floor) + 1e-9
    assert delay <= policy.max_delay_s + 1e-9


@given(attempt=attempts, seed=st.integers(0, 2**32))
def test_no_jitter_is_exactly_the_ceiling(attempt: int, seed: int) -> None:
    policy = RetryPolicy(base_delay_s=0.5, max_delay_s=90.0, multiplier=3.0, jitter=0.0)
    assert policy.backoff_s(attempt, rng=random.Random(seed)) == policy.ceiling_s(attempt)


def test_backoff_grows_exponentially_then_caps() -> None:
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=10.0, multiplier=2.0, jitter=0.0)
    assert [policy.backoff_s(a) for a in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_huge_attempt_numbers_do_not_overflow() -> None:
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=300.0, multiplier=10.0, jitter=0.5)
    for attempt in (10**3, 10**6, 10**12):
        delay = policy.backoff_s(attempt, rng=random.Random(attempt))
        assert 150.0 <= delay <= 300.0


def test_full_jitter_spreads_delays() -> None:
    policy = RetryPolicy(base_delay_s=8.0, max_delay_s=8.0, jitter=1.0)
    rng = random.Random(7)
    delays = [policy.backoff_s(1, rng=rng) for _ in range(500)]
    assert min(delays) < 1.0
    assert max(delays) > 7.0
    assert all(0.0 <= d <= 8.0 for d in delays)


def test_overload_hint_above_cap_is_capped() -> None:
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=30.0, overload_min_delay_s=5.0)
    assert policy.backoff_s(1, FailureClass.OVERLOAD, hint_s=3600.0) == 30.0
    assert policy.backoff_s(1, FailureClass.OVERLOAD, hint_s=12.0) == 12.0
    assert policy.backoff_s(1, FailureClass.OVERLOAD) >= 5.0
    # The overload floor does not apply to transient failures; a hint does (capped).
    assert policy.backoff_s(1, FailureClass.TRANSIENT) <= 0.1
    assert policy.backoff_s(1, FailureClass.TRANSIENT, hint_s=2.0) == 2.0
    assert policy.backoff_s(1, FailureClass.TRANSIENT, hint_s=3600.0) == 30.0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": -3},
        {"base_delay_s": -0.1},
        {"max_delay_s": -1.0},
        {"overload_min_delay_s": -5.0},
        {"multiplier": 0.5},
        {"jitter": -0.01},
        {"jitter": 1.01},
        {"jitter": float("nan")},
        {"max_attempts": float("nan")},
        {"max_attempts": 1.5},
        {"max_attempts": 2.0},
        {"max_attempts": True},
        {"max_attempts": "3"},
        {"max_attempts": 10**12},
        {"base_delay_s": float("inf")},
        {"max_delay_s": "1"},
        {"multiplier": float("inf")},
    ],
)
def test_policy_rejects_out_of_range_fields(kwargs: dict[str, object]) -> None:
    # Refused at definition with a ConfigError naming the field, never a bare ValueError
    # and never later at submit ("NOT NULL constraint failed" for max_attempts=NaN).
    field = next(iter(kwargs))
    with pytest.raises(ConfigError, match=f"RetryPolicy.{field}"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_policy_rejects_nan() -> None:
    # NaN passes every "< 0" check; a NaN delay would make the backoff NaN (no backoff).
    accepted = []
    for field in ("base_delay_s", "max_delay_s", "overload_min_delay_s", "multiplier"):
        try:
            RetryPolicy(**{field: float("nan")})  # type: ignore[arg-type]
        except ConfigError:
            continue
        accepted.append(field)
    assert accepted == [], f"RetryPolicy accepted NaN for {accepted}"


def test_ceiling_keeps_growing_until_the_cap_for_small_multipliers() -> None:
    # The exponent cap that prevents float overflow must not freeze the ceiling below
    # max_delay_s: with a gentle multiplier the ceiling still has to reach the cap.
    policy = RetryPolicy(base_delay_s=1.0, max_delay_s=300.0, multiplier=1.05, jitter=0.0)
    assert policy.ceiling_s(100) == pytest.approx(1.05**99)
    assert policy.ceiling_s(200) == 300.0


def test_policy_accepts_its_bounds() -> None:
    RetryPolicy(max_attempts=1, base_delay_s=0.0, max_delay_s=0.0, multiplier=1.0, jitter=0.0)
    RetryPolicy(jitter=1.0, overload_min_delay_s=0.0)
    assert RetryPolicy(base_delay_s=0.0).backoff_s(5) == 0.0


# ---------------------------------------------------------------------- classify


def _status_error(status: int, headers: dict[str, str] | None = None) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "https://payments.example/charges")
    response = httpx.Response(status, request=request, headers=headers)
    return httpx.HTTPStatusError(f"HTTP {status}", request=request, response=response)


def _request() -> httpx.Request:
    return httpx.Request("POST", "https://payments.example/charges")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (PermanentError("bad card"), FailureClass.PERMANENT),
        (TransientError("blip"), FailureClass.TRANSIENT),
        (OverloadError("slow down", retry_after_s=3.0), FailureClass.OVERLOAD),
        (OutcomeUnknownError("reply lost"), FailureClass.UNKNOWN_OUTCOME),
        (TaskFailure("unclassified task failure"), FailureClass.TRANSIENT),
        (PayloadNotSerializable("set is not JSON"), FailureClass.PERMANENT),
    ],
)
def test_classify_ratchet_failures(exc: BaseException, expected: FailureClass) -> None:
    assert classify(exc) is expected


def test_classify_subclasses_of_ratchet_failures() -> None:
    class CardDeclined(PermanentError):
        pass

    class GatewayBusy(OverloadError):
        pass

    assert classify(CardDeclined("declined")) is FailureClass.PERMANENT
    assert classify(GatewayBusy()) is FailureClass.OVERLOAD


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (429, FailureClass.OVERLOAD),
        (503, FailureClass.OVERLOAD),
        (500, FailureClass.TRANSIENT),
        (502, FailureClass.TRANSIENT),
        (504, FailureClass.TRANSIENT),
        (408, FailureClass.TRANSIENT),
        (409, FailureClass.TRANSIENT),
        (400, FailureClass.PERMANENT),
        (401, FailureClass.PERMANENT),
        (403, FailureClass.PERMANENT),
        (404, FailureClass.PERMANENT),
        (422, FailureClass.PERMANENT),
    ],
)
def test_classify_http_status_errors(status: int, expected: FailureClass) -> None:
    assert classify(_status_error(status)) is expected


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        # Not sent: safe to retry.
        (httpx.ConnectError("refused", request=_request()), FailureClass.TRANSIENT),
        (httpx.ConnectTimeout("connect timeout", request=_request()), FailureClass.TRANSIENT),
        (httpx.PoolTimeout("pool exhausted", request=_request()), FailureClass.TRANSIENT),
        # Sent, no reply: the call may have happened.
        (httpx.ReadTimeout("read timeout", request=_request()), FailureClass.UNKNOWN_OUTCOME),
        (httpx.WriteTimeout("write timeout", request=_request()), FailureClass.UNKNOWN_OUTCOME),
        (
            httpx.RemoteProtocolError("peer closed connection", request=_request()),
            FailureClass.UNKNOWN_OUTCOME,
        ),
        (httpx.ReadError("connection reset", request=_request()), FailureClass.UNKNOWN_OUTCOME),
    ],
)
def test_classify_httpx_transport_errors(exc: BaseException, expected: FailureClass) -> None:
    assert classify(exc) is expected


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (TimeoutError("timed out"), FailureClass.UNKNOWN_OUTCOME),
        (ValueError("bad value"), FailureClass.PERMANENT),
        (TypeError("bad type"), FailureClass.PERMANENT),
        (KeyError("missing"), FailureClass.PERMANENT),
        (AttributeError("no attr"), FailureClass.PERMANENT),
        (RuntimeError("something odd"), FailureClass.TRANSIENT),
        (ConnectionResetError("reset"), FailureClass.TRANSIENT),
        (Exception("plain"), FailureClass.TRANSIENT),
    ],
)
def test_classify_builtin_errors(exc: BaseException, expected: FailureClass) -> None:
    assert classify(exc) is expected


def test_classify_ratchet_class_wins_over_builtin_base() -> None:
    # A task raising PermanentError from a timeout handler is still permanent.
    class PermanentTimeout(PermanentError, TimeoutError):
        pass

    assert classify(PermanentTimeout("gave up")) is FailureClass.PERMANENT


def test_classify_illegal_transition_is_permanent() -> None:
    # DESIGN §7: "permanent (fail now: bad parameters, permission, illegal transition)".
    assert classify(IllegalTransition("RUNNING -> SUCCEEDED refused")) is FailureClass.PERMANENT


def test_classify_undecodable_data_is_permanent() -> None:
    # Decoding the same stored text again gives the same error: retrying cannot fix it.
    from ratchet.serde import loads

    with pytest.raises(UndecodableData) as caught:
        loads("{oops", "params")
    assert classify(caught.value) is FailureClass.PERMANENT
    assert "params" in str(caught.value) and "oops" not in str(caught.value)


def test_classify_ledger_hiccup_is_retried() -> None:
    # A ledger failure inside a task is not the task's fault: retry within the budget.
    assert classify(LedgerUnavailable("database is locked")) is FailureClass.TRANSIENT


# ---------------------------------------------------------------------- retry_after_s


def test_retry_after_from_overload_error() -> None:
    assert retry_after_s(OverloadError(retry_after_s=2.5)) == 2.5
    assert retry_after_s(OverloadError()) is None


@pytest.mark.parametrize(
    ("header", "expected"),
    [("7", 7.0), ("0.25", 0.25), ("-3", 0.0), ("soon", None)],
)
def test_retry_after_from_http_header(header: str, expected: float | None) -> None:
    assert retry_after_s(_status_error(503, {"Retry-After": header})) == expected


def test_retry_after_absent() -> None:
    assert retry_after_s(_status_error(503)) is None
    assert retry_after_s(TransientError("x")) is None
    assert retry_after_s(ValueError("x")) is None


def test_retry_after_hint_feeds_the_overload_floor() -> None:
    exc = _status_error(429, {"Retry-After": "40"})
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=120.0, overload_min_delay_s=1.0)
    delay = policy.backoff_s(1, classify(exc), retry_after_s(exc), rng=random.Random(1))
    assert delay == 40.0

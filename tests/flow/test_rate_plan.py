"""The token bucket's arithmetic (ratchet.ratelimit), as properties: however claims arrive,
the starts a bucket allows over any interval of t seconds are at most burst + rate * t;
a task is deferred only when its bucket is empty, to when it will hold a token; and the
rate text is read as documented."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratchet.errors import ConfigError
from ratchet.ratelimit import BucketState, RateCandidate, RateLimit, parse_rate, plan_takes

BUCKET = ("type", "t", "")


@settings(max_examples=200, deadline=None)
@given(
    per_s=st.floats(min_value=0.5, max_value=200.0),
    burst=st.integers(min_value=1, max_value=50),
    claims=st.lists(st.tuples(st.floats(min_value=0.0, max_value=2.0),
                              st.integers(min_value=1, max_value=40)),
                    min_size=1, max_size=60),
)
def test_starts_over_any_interval_stay_within_burst_plus_rate(
    per_s: float, burst: int, claims: list[tuple[float, int]]
) -> None:
    now = 1000.0
    state: BucketState | None = None
    starts: list[float] = []
    limits = {("type", "t"): (per_s, burst)}
    for gap, want in claims:
        now += gap
        candidates = [RateCandidate(f"c{i}", BUCKET) for i in range(want)]
        plan = plan_takes(candidates, want, now, limits, {} if state is None else {BUCKET: state})
        starts += [now] * len(plan.take)
        state = plan.buckets[BUCKET]
        # Deferred only when empty, each to a later instant, in order.
        assert len(plan.take) + len(plan.defer) == want or len(plan.take) == want
        assert all(at > now for _, at in plan.defer)
        assert [at for _, at in plan.defer] == sorted(at for _, at in plan.defer)
    for i, first in enumerate(starts):
        for last in starts[i:]:
            window = last - first
            count = sum(1 for s in starts if first <= s <= last)
            assert count <= burst + per_s * window + 1e-6, (first, last, count)


def test_a_deferred_task_finds_a_token_at_its_new_run_at() -> None:
    limits = {("type", "t"): (10.0, 2)}
    candidates = [RateCandidate(f"c{i}", BUCKET) for i in range(5)]
    plan = plan_takes(candidates, 5, 100.0, limits, {})
    assert plan.take == ["c0", "c1"]
    assert [round(at - 100.0, 6) for _, at in plan.defer] == [0.1, 0.2, 0.3]
    later = plan_takes([RateCandidate("c2", BUCKET)], 1, plan.defer[0][1], limits,
                       plan.buckets)
    assert later.take == ["c2"]


def test_candidates_without_a_bucket_are_taken_within_the_claim() -> None:
    plan = plan_takes([RateCandidate("a", None), RateCandidate("b", BUCKET),
                       RateCandidate("c", None)], 2, 5.0, {("type", "t"): (1.0, 1)}, {})
    assert plan.take == ["a", "b"] and plan.defer == []


@pytest.mark.parametrize(("text", "per_s"), [
    ("20/s", 20.0), ("100/m", 100 / 60), ("5/10s", 0.5), ("1000/h", 1000 / 3600),
    ("2/d", 2 / 86400), (" 3 / min ", 3 / 60)])
def test_rates_read_as_documented(text: str, per_s: float) -> None:
    assert parse_rate(text) == pytest.approx(per_s)


@pytest.mark.parametrize("text", ["", "20", "0/s", "-1/s", "20/fortnight", "1e9/s", "x/s"])
def test_bad_rates_are_refused_with_the_forms_named(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_rate(text)


def test_rate_limit_defaults_and_checks() -> None:
    assert RateLimit("20/s").size == 20
    assert RateLimit("100/m").size == 2
    assert RateLimit("5/s", key="merchant").key_param == "merchant"
    for bad in ({"burst": 0}, {"burst": 1.5}, {"key": 3}):
        with pytest.raises(ConfigError):
            RateLimit("5/s", **bad)  # type: ignore[arg-type]


def test_a_claim_whose_clock_reads_earlier_never_moves_the_bucket_back() -> None:
    """A PostgreSQL claim's clock is its transaction's start: one that began before the
    bucket's last write reads an earlier time. It refills nothing and keeps the later
    time, so the seconds between are not refilled twice."""
    limits = {("type", "t"): (1.0, 1)}
    written = {BUCKET: BucketState(0.0, 100.0)}  # emptied at t=100
    early = plan_takes([RateCandidate("a", BUCKET)], 1, 99.0, limits, written)
    assert early.take == [] and early.buckets[BUCKET].at == 100.0
    # At 100.5 the bucket holds half a token, whichever claim wrote last.
    late = plan_takes([RateCandidate("b", BUCKET)], 1, 100.5, limits, early.buckets)
    assert late.take == []

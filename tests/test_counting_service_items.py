"""The counting service's items: a request whose body carries ``"items": [...]`` applies
each item when it executes, so a test counts per item at the external side even when one
request carries a batch of items (``ctx.batches``). Over real HTTP on loopback against the
service's own process and file."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from ratchet.testing import read_records, start_counting_service
from ratchet.testing.services import ITEMS_ERROR

pytestmark = pytest.mark.timeout(60)


def test_an_execution_applies_its_items_and_a_replay_applies_none(tmp_path: Path) -> None:
    with start_counting_service(tmp_path / "svc.db") as svc, svc.client(timeout_s=5.0) as c:
        first = c.execute("batch:0", {"pos": 0, "items": [0, 1, 2, "x"]})
        assert first["replayed"] is False
        assert c.execute("batch:0", {"pos": 0, "items": [0, 1, 2, "x"]})["replayed"] is True
        c.execute("batch:3", {"pos": 3, "items": [3, 4]})
        c.execute("plain", {"n": 1})  # no items: counts as an execution only
        assert svc.items() == {0: 1, 1: 1, 2: 1, "x": 1, 3: 1, 4: 1}
        assert c.stats()["items_applied"] == 6
        assert svc.records().executions == {"batch:0": 1, "batch:3": 1, "plain": 1}


def test_an_item_applied_by_two_executions_counts_twice(tmp_path: Path) -> None:
    """Without key dedupe (a legacy target) a re-sent batch applies its items again; two
    keys carrying the same item apply it twice as well: the count is per item."""
    with start_counting_service(tmp_path / "svc.db", honour_keys=False) as svc, \
            svc.client(timeout_s=5.0) as c:  # fmt: skip
        c.execute("batch:0", {"items": [1, 2]})
        c.execute("batch:0", {"items": [1, 2]})
        c.execute("other", {"items": [2, "2"]})
        assert read_records(svc.db_path).items == {1: 2, 2: 3, "2": 1}


@pytest.mark.parametrize("items", [3, [1, None], [True], [1.5], {"a": 1}, [[1]]])
def test_malformed_items_are_refused_and_execute_nothing(tmp_path: Path, items: object) -> None:
    with start_counting_service(tmp_path / "svc.db") as svc, svc.client(timeout_s=5.0) as c:
        with pytest.raises(httpx.HTTPStatusError) as refused:
            c.execute("k", {"items": items})
        assert refused.value.response.status_code == 400
        assert refused.value.response.json()["error"] == ITEMS_ERROR
        records = svc.records()
        assert records.executions == {} and records.items == {}

"""The relay's ledger calls on both ledgers: partition leases and the fair share, takeover
after expiry bumps the generation, the fenced mark, fetch order."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ratchet import open_ledger
from ratchet.ledger.base import Ledger
from ratchet.outbox import OUTBOX_PARTITIONS, new_message, partition_of
from ratchet.testing import inject_clock


@pytest.fixture
def ledger(ledger_url: str) -> Iterator[Ledger]:
    opened = open_ledger(ledger_url)
    yield opened  # type: ignore[misc]
    opened.close()


def _emit(ledger: Ledger, key: str | None, n: int, prefix: str = "m") -> list[str]:
    ids = [f"{prefix}-{key}-{i}" for i in range(n)]
    ledger.emit([new_message("t.x", {"i": i}, key=key, message_id=mid,
                             max_payload_bytes=10_000) for i, mid in enumerate(ids)])
    return ids


def test_one_relay_takes_every_partition_and_renews_them(ledger: Ledger) -> None:
    first = ledger.outbox_lease("r1", 10.0)
    assert [p.part for p in first] == list(range(OUTBOX_PARTITIONS))
    assert {p.generation for p in first} == {1}
    again = ledger.outbox_lease("r1", 10.0)
    assert [(p.part, p.generation) for p in again] == [(p.part, 1) for p in first]
    assert all(p.lease_until - p.now == pytest.approx(10.0) for p in again)


def test_a_new_relay_gets_a_fair_share_after_the_first_rebalances(ledger: Ledger) -> None:
    assert len(ledger.outbox_lease("r1", 10.0)) == OUTBOX_PARTITIONS
    assert ledger.outbox_lease("r2", 10.0) == []  # nothing free yet; r2 is now live
    # Renewing mid-round gives nothing back; between rounds r1 gives back half.
    assert len(ledger.outbox_lease("r1", 10.0, rebalance=False)) == OUTBOX_PARTITIONS
    mine = ledger.outbox_lease("r1", 10.0)
    assert len(mine) == OUTBOX_PARTITIONS // 2
    theirs = ledger.outbox_lease("r2", 10.0)
    assert len(theirs) == OUTBOX_PARTITIONS // 2
    assert not {p.part for p in mine} & {p.part for p in theirs}
    assert len(ledger.outbox_lease("r3", 10.0, want=4)) == 0
    ledger.outbox_release("r2")
    assert len(ledger.outbox_lease("r3", 10.0, want=4)) == 4
    assert len(ledger.outbox_lease("r1", 10.0)) == OUTBOX_PARTITIONS // 2


def test_takeover_after_expiry_bumps_the_generation_and_fences_the_old_mark(
        ledger: Ledger) -> None:
    ids = _emit(ledger, "k", 3)
    part = partition_of("k", ids[0])
    clock = inject_clock(ledger)
    old = {p.part: p.generation for p in ledger.outbox_lease("r1", 10.0)}
    rows = ledger.outbox_fetch([part], 100)
    assert [r.message_id for r in rows] == ids
    assert ledger.outbox_lease("r2", 10.0) == []  # r1's leases are live
    clock.step(11.0)
    new = {p.part: p.generation for p in ledger.outbox_lease("r2", 10.0)}
    assert new[part] == old[part] + 1
    # r1's late mark, at its old generation, changes nothing.
    assert ledger.outbox_mark_sent("r1", [(part, old[part])], [r.id for r in rows]) == 0
    assert [r.message_id for r in ledger.outbox_fetch([part], 100)] == ids
    # The new holder's mark goes through, once.
    assert ledger.outbox_mark_sent("r2", [(part, new[part])], [r.id for r in rows]) == 3
    assert ledger.outbox_mark_sent("r2", [(part, new[part])], [r.id for r in rows]) == 0
    assert ledger.outbox_fetch([part], 100) == []


def test_a_mark_after_the_lease_expired_changes_nothing(ledger: Ledger) -> None:
    ids = _emit(ledger, "k", 1)
    part = partition_of("k", ids[0])
    clock = inject_clock(ledger)
    gen = {p.part: p.generation for p in ledger.outbox_lease("r1", 10.0)}[part]
    rows = ledger.outbox_fetch([part], 10)
    clock.step(11.0)
    assert ledger.outbox_mark_sent("r1", [(part, gen)], [rows[0].id]) == 0
    # A relay whose lease expired takes it again with a new generation.
    again = {p.part: p.generation for p in ledger.outbox_lease("r1", 10.0)}[part]
    assert again == gen + 1
    assert ledger.outbox_mark_sent("r1", [(part, gen)], [rows[0].id]) == 0
    assert ledger.outbox_mark_sent("r1", [(part, again)], [rows[0].id]) == 1


def test_fetch_is_in_id_order_per_partition_and_limited(ledger: Ledger) -> None:
    a = _emit(ledger, "a", 5)
    b = _emit(ledger, "b", 5)
    more = _emit(ledger, "a", 3, prefix="n")
    parts = sorted({partition_of("a", ""), partition_of("b", "")})
    rows = ledger.outbox_fetch(parts, 100)
    assert [r.id for r in rows] == sorted(r.id for r in rows)
    assert [r.message_id for r in rows if r.key == "a"] == a + more
    assert [r.message_id for r in rows if r.key == "b"] == b
    assert [r.message_id for r in ledger.outbox_fetch(parts, 3)] == [
        r.message_id for r in rows[:3]]
    assert ledger.outbox_fetch([p for p in range(OUTBOX_PARTITIONS) if p not in parts],
                               100) == []


def test_failed_publishes_are_counted(ledger: Ledger) -> None:
    ids = _emit(ledger, "k", 1)
    row = ledger.outbox_fetch([partition_of("k", ids[0])], 1)[0]
    ledger.outbox_failed("r1", [row.id], "broker down")
    ledger.outbox_failed("r1", [row.id], "broker down")
    assert ledger.outbox_fetch([row.part], 1)[0].attempts == 2

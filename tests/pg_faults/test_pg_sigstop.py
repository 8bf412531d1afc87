"""A holder SIGSTOPped past its lease on the PostgreSQL ledger (DESIGN §4-§5, matrix row 8).

Worker A stops itself (``RATCHET_PAUSE_AT``) inside the charge; its lease expires by the
ledger's clock; worker B takes the task over and settles it; then A gets SIGCONT. Each row
states one kind of target's guarantee and asserts it exactly, counted at the target
(tests/crash/frozenkit.py has the table; tests/crash/test_frozen_sender.py runs the
``effect.before_call`` rows on the SQLite ledger):

* frozen at ``effect.before_call`` (after its last lease check, before its send: the
  frozen sender): honours keys, exactly once (A's late request is a replay); checks fencing
  tokens, exactly once (A's late request refused, A abandons); lookup only, B's charge and
  A's late one (2 executions), the duplicate detected as a late effect (also when the reply
  to A's late request is lost: outcome "unknown"); neither, at least once, the task
  UNKNOWN and A's late execution recorded as a late effect;
* frozen at ``effect.after_call`` (charged inside its lease): B reuses the charge by
  lookup, exactly once, A's result write rejected;
* frozen at ``effect.after_intent`` (before its last lease check): A never sends once
  resumed (it cannot confirm its lease), exactly once, its release rejected.

A second test freezes a holder *inside* a ledger transaction (row locks held, COMMIT not
sent): on PostgreSQL the frozen session keeps its row locks, and ``SKIP LOCKED`` claims
skip the row, so nothing may take the task over until the server ends that session.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
from frozenkit import assert_guarantee, run_frozen_sender
from pgkit import (
    PgRig,
    assert_exactly_once,
    check_pg_ledger_consistent,
    unique_app_name,
)

from ratchet import State
from ratchet.testing import WorkerProcess, wait_for

pytestmark = [pytest.mark.crash, pytest.mark.timeout(120)]

LEASE_S = 2.0


def _backend_states(rig: PgRig, app_name: str) -> list[str]:
    return [r[0] for r in rig.raw.execute(
        "SELECT state FROM pg_stat_activity WHERE application_name = %s", (app_name,)
    ).fetchall()]


@pytest.mark.parametrize(
    ("pause_at", "target", "a_reply_lost"),
    [
        ("effect.before_call", "idempotent", False),
        ("effect.before_call", "fenced", False),
        ("effect.before_call", "lookup", False),
        ("effect.before_call", "lookup", True),
        ("effect.before_call", "none", False),
        ("effect.after_call", "lookup", False),
        ("effect.after_intent", "lookup", False),
        ("effect.after_intent", "idempotent", False),
    ],
    ids=[
        "before_call-honours_keys-exactly_once",
        "before_call-checks_tokens-exactly_once",
        "before_call-lookup_only-duplicate_detected",
        "before_call-lookup_only-late_reply_lost-duplicate_detected",
        "before_call-neither-at_least_once_unknown",
        "after_call-lookup_only-exactly_once",
        "after_intent-lookup_only-exactly_once",
        "after_intent-honours_keys-exactly_once",
    ],
)
def test_pg_paused_holder_is_fenced(
    pg_rig: PgRig, pause_at: str, target: str, a_reply_lost: bool
) -> None:
    """A freezes itself inside the charge past its lease; B takes over and settles the
    task; A is resumed. The row's guarantee holds exactly at the target, B's outcome
    stands, and what A did late is either refused (stale generation, stale token) or kept
    as evidence (a late effect), never silent."""
    rig = pg_rig
    a_app = unique_app_name("rt_stop_a")

    def start(name: str, pause_at: str | None = None) -> WorkerProcess:
        return rig.pg_worker(name, concurrency=1, pause_at=pause_at,
                             app_name=a_app if name == "A" else None)  # fmt: skip

    def frozen_between_transactions(a: Any) -> None:
        # A is frozen between transactions: it holds no open transaction (no row locks).
        states = _backend_states(rig, a_app)
        assert states, "A's connections are gone"
        assert "idle in transaction" not in states, states

    run = run_frozen_sender(rig, target, start, pause_at=pause_at, a_reply_lost=a_reply_lost,
                            on_frozen=frozen_between_transactions)  # fmt: skip
    assert_guarantee(rig, run)
    check_pg_ledger_consistent(rig)


def test_pg_holder_frozen_inside_a_transaction_does_not_block_takeover(pg_rig: PgRig) -> None:
    """A freezes (SIGSTOP from outside) while one of its ledger transactions holds task row
    locks and has not sent COMMIT (a VM freeze, a stopped container, a debugger). Leases
    are judged by the ledger's clock, so once they expire B must take A's tasks over and
    finish them while A stays frozen; nothing A had not committed may count, and every
    charge executes once.

    The target honours the idempotency key: A is frozen at an arbitrary moment, and
    another of its task threads may be between its lease check and its send (a frozen
    sender), which only such a target (or a fencing one) absorbs exactly once
    (test_pg_paused_holder_is_fenced asserts each kind of target's guarantee); this test
    is about row locks, not frozen senders."""
    rig = pg_rig
    rig.lease_s = LEASE_S
    rig.start_service(honour_keys=True)
    orders = [f"f-{i:03d}" for i in range(60)]
    ids = [
        rig.submit({"order_id": o, "amount_cents": 100 + i, "work_s": 0.02}, key=f"order:{o}")
        for i, o in enumerate(orders)
    ]
    a_app = unique_app_name("rt_frozen_a")
    a = rig.pg_worker("A", concurrency=4, app_name=a_app)
    a.holder()

    def a_locking_tasks() -> bool:
        """True while one of A's sessions sits idle inside a transaction that row-locked
        or updated tasks (COMMIT not yet sent)."""
        return bool(rig.raw.execute(
            "SELECT 1 FROM pg_locks l JOIN pg_stat_activity s ON s.pid = l.pid"
            " WHERE s.application_name = %s AND s.state = 'idle in transaction'"
            " AND l.locktype = 'relation' AND l.relation = %s::regclass"
            " AND l.mode IN ('RowShareLock', 'RowExclusiveLock')",
            (a_app, f"{rig.schema}.tasks"),
        ).fetchall())

    def rows_locked() -> list[str]:
        """Which rows A's open transaction holds: the ones a SKIP LOCKED probe cannot take."""
        with rig.raw.transaction(force_rollback=True):
            free = {r[0] for r in rig.raw.execute(
                f"SELECT id FROM {rig.schema}.tasks WHERE id = ANY(%s) FOR UPDATE SKIP LOCKED",
                (ids,),
            ).fetchall()}
        return sorted(set(ids) - free)

    # Frozen inside a transaction that holds task rows (not one that only read the table,
    # e.g. a claim that found nothing ready: it takes the relation lock but no row).
    locked: list[str] = []
    deadline = time.monotonic() + 30
    while not locked and time.monotonic() < deadline:
        if a_locking_tasks():
            a.signal(signal.SIGSTOP)
            a.wait_stopped()
            if a_locking_tasks():
                locked = rows_locked()
                if locked:
                    break
            a.signal(signal.SIGCONT)
    assert locked, "could not freeze A inside a transaction that locks task rows"
    print(f"A frozen holding row locks on {len(locked)} task(s)")

    b = rig.pg_worker("B", concurrency=4)
    b.holder()
    try:
        wait_for(
            "every task to succeed while A is frozen",
            lambda: all(t.state is State.SUCCEEDED for t in rig.ledger.get_many(ids)),
            timeout_s=LEASE_S + 20, interval_s=0.2,
        )
    except AssertionError:
        stuck = [t for t in rig.ledger.get_many(locked) if t.state is not State.SUCCEEDED]
        raise AssertionError(
            f"{len(stuck)} task(s) never taken over while their holder was frozen inside a "
            f"transaction (A's sessions: {_backend_states(rig, a_app)}); e.g. {stuck[:1]}. "
            "A frozen client keeps its row locks and SKIP LOCKED claims skip those rows "
            "for as long as it stays frozen: the ledger must make the server end such "
            "sessions, or peers must end the session that locks an expired lease's row"
        ) from None
    assert a.stop() == 0 and b.stop() == 0  # SIGCONT, then SIGTERM
    assert all(t.state is State.SUCCEEDED for t in rig.ledger.get_many(ids))
    assert_exactly_once(rig, {f"charge:{o}" for o in orders})
    check_pg_ledger_consistent(rig)

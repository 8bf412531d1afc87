"""A frozen sender on the SQLite ledger, one test per kind of target.

Worker A freezes (a real SIGSTOP, ``RATCHET_PAUSE_AT=effect.before_call``) after its last
lease check and before its charge leaves; its lease expires by the ledger clock; B takes
over and settles the task; A resumes and its request leaves late. Each test asserts its
kind's guarantee exactly, counted at the target (:mod:`frozenkit` has the table). The same
scenario on the PostgreSQL ledger is tests/pg_faults/test_pg_sigstop.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from crashkit import Rig
from frozenkit import assert_guarantee, run_frozen_sender

pytestmark = [
    pytest.mark.crash,
    pytest.mark.timeout(120),
    # SQLite here; the PostgreSQL rows (same scenario, same table) are in tests/pg_faults.
    pytest.mark.parametrize("backend", ["sqlite"]),
]


def _start(rig: Rig) -> Any:
    def start(name: str, pause_at: str | None = None) -> Any:
        return rig.worker(name, pause_at=pause_at)

    return start


def test_frozen_sender_target_honours_keys_exactly_once(rig: Rig) -> None:
    """``idempotent=True`` at a target that honours the key: B charges; A's late request
    is answered as a replay of B's charge: one execution."""
    assert_guarantee(rig, run_frozen_sender(rig, "idempotent", _start(rig)))


def test_frozen_sender_target_checks_tokens_exactly_once(rig: Rig) -> None:
    """``fenced=True`` at a target that checks fencing tokens (and does not dedupe keys):
    B's lookup (token 2) says not found and B charges; A's late request (token 1) is
    refused by the target; A abandons the attempt: one execution, one rejection, no late
    effect, no ledger write by A."""
    assert_guarantee(rig, run_frozen_sender(rig, "fenced", _start(rig)))


def test_frozen_sender_lookup_only_duplicate_is_detected(rig: Rig) -> None:
    """Lookup only: B's lookup says not found and B charges; A's late request executes
    again (two executions at the target), and that duplicate is recorded as a late effect
    (task, key, generation 1, holder A) with a ``late_effect`` audit row; B's result
    stands."""
    assert_guarantee(rig, run_frozen_sender(rig, "lookup", _start(rig)))


def test_frozen_sender_neither_at_least_once_and_unknown(rig: Rig) -> None:
    """Neither lookup nor dedupe: B finds A's open intent, cannot settle it and moves the
    task to UNKNOWN without calling; A's late request executes once and is recorded as a
    late effect (the evidence an operator resolves the task with)."""
    assert_guarantee(rig, run_frozen_sender(rig, "none", _start(rig)))


def test_frozen_sender_lookup_only_late_reply_lost_still_detected(rig: Rig) -> None:
    """Lookup only, and the reply to A's late request is lost: A cannot know its request
    executed, settles by lookup, and its write is rejected. The duplicate is still
    detected: a late effect with outcome "unknown" (the error A saw)."""
    assert_guarantee(rig, run_frozen_sender(rig, "lookup", _start(rig), a_reply_lost=True))


def test_frozen_sender_neither_late_reply_lost_still_detected(rig: Rig) -> None:
    """Neither lookup nor dedupe, and the reply to A's late request is lost: A's request
    executed (the only execution; B made none), and must be kept as a late effect with
    outcome "unknown", the evidence an operator resolves the UNKNOWN task with."""
    assert_guarantee(rig, run_frozen_sender(rig, "none", _start(rig), a_reply_lost=True))

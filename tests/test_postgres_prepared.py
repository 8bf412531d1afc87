"""The PostgreSQL ledger's prepared hot statements (ledger/pgprepared.py): prepared once per
pooled connection and executed in place of their text; off with ``prepared=off``; prepared
again when the server lost them. The plans they settle on are pinned in
tests/test_ledger_plans.py (the generic plans)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pgsupport import private_schema, with_params

from ratchet import open_ledger
from ratchet.app import new_task_id
from ratchet.errors import ConfigError
from ratchet.ledger.base import NewTask, TaskWrite, Transition
from ratchet.ledger.engine import LedgerEngine
from ratchet.ledger.pgprepared import HOT_STATEMENTS
from ratchet.serde import digest, dumps
from ratchet.states import State

NAME = "prep.task"


@pytest.fixture
def url() -> Iterator[str]:
    with private_schema("rt_prep") as (found, _schema):
        # One pooled connection: every transaction below runs on the same session, whose
        # prepared statements pg_prepared_statements shows.
        yield with_params(found, pool_size="1")


def _task() -> NewTask:
    params = dumps({})
    return NewTask(new_task_id(), NAME, 1, params, digest(NAME, params), None, 3, 30.0)


def _drain_one(ledger: LedgerEngine) -> str:
    """Submit, claim and finish one task (a submit, a claim and a commit); its id."""
    ledger.submit([_task()])
    (claim,) = ledger.claim("h1", [NAME], 1)
    (outcome,) = ledger.commit([TaskWrite(
        claim.task_id, claim.generation, "h1", "finish", steps=[("s", dumps(1))],
        transition=Transition(State.SUCCEEDED, result_json="1"))])
    assert outcome.ok and not outcome.stale
    return claim.task_id


def _prepared(ledger: LedgerEngine) -> dict[str, int]:
    """``{statement: executions}`` of the ratchet_ statements on the pooled connection."""
    def body(tx: Any) -> list[tuple[str, int]]:
        return list(tx.cur.execute(
            "SELECT name, generic_plans + custom_plans FROM pg_prepared_statements "
            "WHERE name LIKE 'ratchet\\_%'").fetchall())
    return {str(name): int(n) for name, n in ledger.dialect.run(body, write=False)}


def test_the_hot_statements_are_prepared_once_and_executed(url: str) -> None:
    ledger = open_ledger(url)
    assert isinstance(ledger, LedgerEngine)
    try:
        ids = [_drain_one(ledger) for _ in range(7)]
        used = _prepared(ledger)
        # Every hot statement the catalogue holds is prepared on the connection...
        assert set(used) == {f"ratchet_{n}" for n in HOT_STATEMENTS}
        # ...and the submit, claim and commit ran them (not their text): seven each.
        for name in ("submit_insert", "fence_read", "transition", "steps_upsert",
                     "audit_insert"):
            assert used[f"ratchet_{name}"] >= 7, (name, used)
        assert used["ratchet_claim_fifo"] >= 7, used
        # Statements outside the hot set still go as text on the same connection.
        assert ledger.get(ids[0]).state is State.SUCCEEDED
    finally:
        ledger.close()


def test_prepared_off_sends_every_statement_as_text(url: str) -> None:
    ledger = open_ledger(with_params(url, prepared="off"))
    assert isinstance(ledger, LedgerEngine)
    try:
        _drain_one(ledger)
        assert _prepared(ledger) == {}
    finally:
        ledger.close()


def test_a_bad_prepared_option_is_refused(url: str) -> None:
    with pytest.raises(ConfigError, match="prepared='yes'"):
        open_ledger(with_params(url, prepared="yes"))


def test_statements_the_server_lost_are_prepared_again(url: str) -> None:
    """Someone's ``DEALLOCATE ALL`` (or ``DISCARD ALL``) on a pooled connection: the next
    transaction fails on a missing statement, is rolled back and retried after preparing
    again; the caller sees nothing."""
    ledger = open_ledger(url)
    assert isinstance(ledger, LedgerEngine)
    try:
        _drain_one(ledger)
        ledger.dialect.run(lambda tx: tx.cur.execute("DEALLOCATE ALL"), write=False)
        assert _prepared(ledger) == {}
        _drain_one(ledger)
        assert _prepared(ledger)["ratchet_claim_fifo"] >= 1
    finally:
        ledger.close()


def test_the_prepared_statements_run_their_generic_plan(url: str) -> None:
    """Planned once, never per execution: left to ``plan_cache_mode = auto`` the server
    kept custom plans for the claim's reads on a table without statistics, planning them
    on every claim."""
    ledger = open_ledger(url)
    assert isinstance(ledger, LedgerEngine)
    try:
        for _ in range(8):  # past the five custom plans ``auto`` would make first
            _drain_one(ledger)

        def body(tx: Any) -> list[tuple[str, int, int]]:
            return list(tx.cur.execute(
                "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements "
                "WHERE name LIKE 'ratchet\\_%'").fetchall())
        plans = {str(n): (int(g), int(c)) for n, g, c in ledger.dialect.run(body, write=False)}
        assert plans["ratchet_claim_expired"][0] >= 8, plans
        assert {n: p for n, p in plans.items() if p[1]} == {}, plans
    finally:
        ledger.close()


def test_a_bound_statement_is_reused_only_for_the_same_values(url: str) -> None:
    """The claim's reads are bound once per distinct arguments (pgtx.BOUND_AGAIN): values
    that differ only in type (1, 1.0, True) or in a list's items bind their own text."""
    ledger = open_ledger(url)
    assert isinstance(ledger, LedgerEngine)
    try:
        _drain_one(ledger)  # prepared
        variants: list[dict[str, Any]] = [
            {"names": [NAME], "lo": [1], "hi": [1], "limit": 1, "served": None},
            {"names": [NAME], "lo": [1], "hi": [1], "limit": 1.0, "served": None},
            {"names": [NAME], "lo": [1], "hi": [1], "limit": True, "served": None},
            {"names": [NAME], "lo": [1.0], "hi": [1], "limit": 1, "served": None},
            {"names": ["other"], "lo": [1], "hi": [1], "limit": 1, "served": ["q"]},
        ]

        def body(tx: Any) -> list[tuple[str, str]]:
            prepared = tx._prepared["claim_expired"]
            return [(tx._bind("claim_expired", v)[0],
                     tx._binder.mogrify(prepared.execute_now_sql, v))
                    for v in [*variants, *reversed(variants)]]
        pairs = ledger.dialect.run(body, write=False)
        assert all(bound == fresh for bound, fresh in pairs), pairs
        assert len({bound for bound, _ in pairs}) == len(variants)
    finally:
        ledger.close()

"""A user's middleware, annotated the way the hooks how-to shows: it must type-check
under ``mypy --strict`` (tests/test_typing_user_code.py)."""

from __future__ import annotations

from ratchet import Middleware, TaskContext, Worker
from ratchet.ledger.base import Claim


class Audit(Middleware):
    def worker_start(self, worker: Worker) -> None:
        print(worker.holder, worker.concurrency)

    def before_attempt(self, worker: Worker, claim: Claim) -> None:
        print(claim.task_id, worker.stop_reason)

    def before_step(self, ctx: TaskContext, name: str) -> None:
        print(ctx.task_id, ctx.lease, name)

    def after_effect(self, ctx: TaskContext, name: str, key: str, settled: object,
                     duration_s: float, exception: BaseException | None) -> None:
        print(ctx.attempt, name, key, duration_s, exception)

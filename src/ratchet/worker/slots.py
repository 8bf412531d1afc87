"""Claim slots: how many tasks a worker claims, reserved while a claim is in flight so
that writer threads claiming at once never hold more than ``concurrency + prefetch``
tasks (plus ``async_concurrency`` when the worker runs ``async def`` bodies), and the
hand-over of claimed tasks to the task threads, or to the event loop for ``async def``
bodies (see the :mod:`ratchet.worker.runner` docstring for the execution model)."""

from __future__ import annotations

import logging
import time

from ..errors import EXIT_LEDGER_CORRUPT, LedgerCorrupt
from ..faults import point as fault_point
from ..ledger.base import Claim
from .core import WorkerCore

__all__ = ["ClaimPolicy", "ClaimSlots"]

log = logging.getLogger("ratchet.worker")


class ClaimPolicy:
    """The worker's claim policy as the writer sees it."""

    def __init__(self, worker: ClaimSlots) -> None:
        self.holder = worker.holder
        self.names = worker.kinds
        self.scope = worker.claim_scope
        self._worker = worker

    def limit(self, freed: int, forced: bool) -> int:
        return self._worker._reserve(freed, forced)

    def dispatch(self, claims: list[Claim], t_sent: float, reserved: int, freed: int) -> None:
        self._worker._dispatch(claims, t_sent, reserved, freed)

    def release(self, reserved: int, freed: int) -> None:
        self._worker._release(reserved, freed)

    def claim_failed(self, error: BaseException) -> None:
        if isinstance(error, LedgerCorrupt):
            self._worker._stop_corrupt(error)

    def unfinished(self) -> int:
        return self._worker._inflight


class ClaimSlots(WorkerCore):
    """The worker's claim accounting (see the module docstring)."""

    def _claim_limit(self, freed: int, forced: bool) -> int:
        """How many tasks to claim now; ``freed``: completions in the transaction being
        built, whose slots are free once it commits. Slots reserved by claims in flight
        count as taken, less the completions of their own transactions (free once those
        commit; should one fail, its claim fails with it). Exact under ``self._lock``
        (:meth:`_reserve`); the main loop reads it without the lock as a hint."""
        if self._stopping.is_set():
            return 0
        inflight = self._inflight + self._reserved_room
        free = self._capacity - inflight + freed
        if self._max_tasks is not None:
            free = min(free, self._max_tasks - self.stats.claimed - self._reserved)
        if free <= 0:
            return 0
        if forced and inflight - freed >= self._run_slots:
            # Every thread has a task: room left only for prefetch is filled by the claims
            # riding on completions, never by a transaction of its own (a poll).
            return 0
        if not forced and free < self._claim_batch and inflight > freed:
            return 0  # let more finish: one bigger claim instead of many small ones
        return free

    def _reserve(self, freed: int, forced: bool) -> int:
        """:meth:`_claim_limit`, with the slots reserved until :meth:`_dispatch` or
        :meth:`_release` (writer thread): writer threads claiming at once never ask for
        more than the room left.

        A reservation of ``limit`` tasks made with ``freed`` completions takes
        ``limit - min(freed, limit)`` slots of room: the completions' slots are free once
        its transaction commits (they stay counted in flight until their callbacks run),
        and if it fails, nothing is claimed either. So all writers claiming at once take
        at most the room left plus their own completions."""
        with self._lock:
            limit = self._claim_limit(freed, forced)
            if limit > 0:
                self._reserved += limit
                self._reserved_room += limit - min(freed, limit)
            return limit

    def _release(self, reserved: int, freed: int) -> None:
        """A claim that reserved ``reserved`` tasks with ``freed`` completions ended
        without claims (writer thread)."""
        with self._lock:
            self._reserved -= reserved
            self._reserved_room -= reserved - min(freed, reserved)

    def _dispatch(self, claims: list[Claim], t_sent: float, reserved: int, freed: int) -> None:
        """Claims committed (writer thread): track their leases, queue them for threads;
        the reservation (``reserved`` tasks asked with ``freed`` completions) becomes
        ``len(claims)`` tasks in flight."""
        try:
            fault_point("claim.after_commit")
            handles = self.heartbeat.add_many(
                [
                    (c.task_id, c.generation, c.lease_s, t_sent, c.lease_until - c.ledger_now)
                    for c in claims
                ]
            )
            for claim, handle in zip(claims, handles, strict=True):
                if claim.control_request is not None:
                    handle.request = claim.control_request
            with self._lock:
                self._reserved -= reserved
                self._reserved_room -= reserved - min(freed, reserved)
                reserved = 0
                self._inflight += len(claims)
                self.stats.add("claimed", len(claims))
        finally:
            if reserved:
                self._release(reserved, freed)
        takeovers = sum(1 for c in claims if c.takeover)
        if takeovers:
            self.stats.add("takeovers", takeovers)
        self._last_claimed_at = time.monotonic()
        items = list(zip(claims, handles, strict=True))
        runner = self._async
        if runner is None:
            self._executor.push(items)
            return
        # Each claimed task waits for a slot of its own kind: a task thread for a plain
        # def body, the event loop for an async def one.
        on_loop = [i for i in items if self._is_async(i[0])]
        if len(on_loop) < len(items):
            self._executor.push([i for i in items if not self._is_async(i[0])])
        if on_loop:
            runner.push(on_loop)

    def _is_async(self, claim: Claim) -> bool:
        """Whether ``claim``'s task type has an ``async def`` body (run on the loop)."""
        try:
            return self.app.definition(claim.name, claim.version).is_async
        except Exception:  # reported by the attempt itself, on a task thread
            return False

    def _stop_corrupt(self, error: LedgerCorrupt) -> None:
        """A claim found the ledger corrupt (writer thread): retrying cannot repair it, so
        stop claiming and end :meth:`run` as on SIGTERM (exit status
        :data:`EXIT_LEDGER_CORRUPT`). Logged once, however many claims fail."""
        with self._lock:
            if self.stop_reason == "ledger_corrupt":
                return
            self.stop_reason = "ledger_corrupt"
        log.critical("%s: this worker stops claiming and exits (status %d)", error,
                     EXIT_LEDGER_CORRUPT)
        self.stop()


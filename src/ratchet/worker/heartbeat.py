"""Lease renewal in its own thread, and the safe window (DESIGN §4).

The heartbeat renews every lease the worker holds in one batched ledger call from its own
thread (and therefore its own ledger connection), so slow task code cannot starve it.

Each held lease has a *confirmed-until* instant on this process's monotonic clock:
``t_sent + (lease_until - ledger_now) - margin_s``, where ``t_sent`` is taken *before* the
claim or renewal request was sent. A pause of the whole process (SIGSTOP, a long GC, a VM
freeze) keeps the monotonic clock running, so after the pause the window is closed and
:meth:`LeaseHandle.ensure` refuses new effects until a fresh renewal says the lease is
still ours.
"""

from __future__ import annotations

import logging
import threading
import time

from ..errors import LeaseLost
from ..ledger.base import Ledger, RenewResult
from .backoff import RepeatedFailure
from .events import RenewEvents

__all__ = ["Heartbeat", "LeaseHandle", "margin_for"]

log = logging.getLogger("ratchet.worker.heartbeat")


def margin_for(lease_s: float) -> float:
    """Safety margin subtracted from a confirmed lease, seconds: 20 % of it, at most 2 s."""
    return min(2.0, 0.2 * lease_s)


_WINDOW_LOCK = threading.Lock()
"""Orders the writers of every lease's safe window (:meth:`LeaseHandle.confirm`,
:meth:`LeaseHandle.mark_lost`: the heartbeat thread, rarely at once); one lock for all
handles instead of one built per claimed task."""


class LeaseHandle:
    """A lease held by this worker on one task at one generation.

    Attributes:
        task_id: the task.
        generation: fencing token of the claim.
        lease_s: lease length in seconds.
        renew_due: monotonic instant (seconds) by which the next renewal should be sent;
            a constructor argument, default a third of the lease from now.
    """

    # No instance dict: one is built per claimed task.
    __slots__ = ("_confirmed_until", "_heartbeat", "_lost", "checked_at", "generation",
                 "lease_s", "renew_due", "request", "task_id")

    def __init__(
        self, heartbeat: Heartbeat, task_id: str, generation: int, lease_s: float,
        until_mono: float, renew_due: float | None = None,
    ) -> None:
        self._heartbeat = heartbeat
        self.task_id = task_id
        self.generation = generation
        self.lease_s = lease_s
        self._confirmed_until = until_mono
        # Monotonic instant by which the next renewal should be sent (default: a third of
        # the lease from now).
        self.renew_due = time.monotonic() + lease_s / 3.0 if renew_due is None else renew_due
        self._lost = False
        self.request: str | None = None
        """An operator's request on this task (``"cancel"`` / ``"pause"``) once the
        heartbeat has read it (or the claim carried it): the task stops at its next
        step/effect boundary (:meth:`TaskContext._boundary`)."""
        self.checked_at = float("-inf")
        """Monotonic instant (seconds) at which the latest read of the operator requests
        and pauses that covers this lease began: its claim's (the claim transaction reads
        the pauses), or a :meth:`Heartbeat.check_control` begun after it was claimed."""

    @property
    def lost(self) -> bool:
        """True once the ledger refused a renewal: the lease will never come back."""
        return self._lost

    def remaining_s(self) -> float:
        """Seconds left in the safe window (negative when closed)."""
        # One attribute read is atomic; the lock orders the writers (confirm, mark_lost).
        return self._confirmed_until - time.monotonic()

    def confirm(self, until_mono: float) -> None:
        """Record a successful renewal (window ends at ``until_mono``, monotonic seconds)."""
        with _WINDOW_LOCK:
            if not self._lost:
                self._confirmed_until = max(self._confirmed_until, until_mono)

    def mark_lost(self) -> None:
        """Record that the ledger refused the lease, or that this worker gave it up (an
        attempt ended at its time limit or handed back at the end of the shutdown grace,
        DESIGN §4): either way no new effect may start under it."""
        with _WINDOW_LOCK:
            self._lost = True
            self._confirmed_until = float("-inf")

    def ensure(self) -> None:
        """Return only if the lease is confirmed now; otherwise raise ``LeaseLost``.

        When the window has run out but the lease is not known lost, ask the heartbeat for
        an immediate renewal and wait for it (at most ``min(1, lease_s / 2)`` seconds).

        Raises:
            LeaseLost: the ledger refused the lease, or no renewal confirmed it in time.
        """
        if self._lost:
            raise LeaseLost(f"lease on task {self.task_id} (generation {self.generation}) is lost")
        if self.remaining_s() > 0:
            return
        self._heartbeat.renew_now(timeout_s=min(1.0, self.lease_s / 2))
        if self._lost or self.remaining_s() <= 0:
            raise LeaseLost(
                f"cannot confirm lease on task {self.task_id} (generation {self.generation}); "
                "refusing to start new effects"
            )


CONTROL_POLL_S = 0.5
"""How often (seconds) the heartbeat reads the operator requests (cancel, pause) on the
leases it holds, when it holds any: one read of the ``tasks_control`` index. PostgreSQL
also wakes it at once with a NOTIFY (:meth:`Heartbeat.poke_control`)."""


class Heartbeat(threading.Thread):
    """Renews all held leases in one batch as soon as any of them is a third of a lease
    past its last confirmation (a new claim re-plans the wait at once), and every
    :data:`CONTROL_POLL_S` reads the operator requests on them (so that a running task
    learns of a cancel or pause within about a second).

    Args:
        ledger: the ledger (its per-thread connection makes this thread's own connection).
        holder: this worker's holder identity.
    """

    def __init__(
        self,
        ledger: Ledger,
        holder: str,
    ) -> None:
        super().__init__(name="ratchet-heartbeat", daemon=True)
        self._ledger = ledger
        self._holder = holder
        self._leases: dict[str, LeaseHandle] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._halt = threading.Event()
        self._round_done = threading.Condition()
        self._rounds = 0
        self._requested = False
        self._planned = float("-inf")  # monotonic time the loop will next wake up by itself
        self.renewals = 0
        self.failures = 0
        self.renew_failures = RepeatedFailure("lease renewal", log, level=logging.WARNING)
        """Log throttling of failing renewals (the first at once, then a count every
        10 s, then the recovery); a failing round is retried within 0.25 s regardless."""
        self._control_due = float("-inf")  # monotonic: next read of operator requests
        self.control_reads = 0
        self.hooks: RenewEvents | None = None
        """Lifecycle hooks (``after_renew``), or None when no middleware is set."""

    def add_many(
        self, leases: list[tuple[str, int, float, float, float]]
    ) -> list[LeaseHandle]:
        """Start tracking claims, each ``(task_id, generation, lease_s, t_sent, ttl_s)``:
        made at monotonic ``t_sent`` with ``ttl_s`` seconds to run (by the ledger's clock).

        Wakes the heartbeat thread only if one of them is due before its planned round.
        """
        handles = [
            LeaseHandle(self, task_id, generation, lease_s,
                        t_sent + ttl_s - margin_for(lease_s),
                        t_sent + lease_s / 3.0)
            for task_id, generation, lease_s, t_sent, ttl_s in leases
        ]
        if not handles:
            return handles
        for handle, lease in zip(handles, leases, strict=True):
            handle.checked_at = lease[3]  # the claim read the pauses after t_sent
        earliest = min([h.renew_due for h in handles])
        with self._lock:
            held = self._leases
            for handle in handles:
                held[handle.task_id] = handle
            wake = earliest < self._planned
        if wake:
            self._wake.set()  # the loop re-plans: a lease is due before the current wait ends
        return handles

    def remove(self, handle: LeaseHandle) -> None:
        """Stop renewing ``handle`` (finished, released or abandoned).

        Only that claim is dropped: if this worker has meanwhile re-claimed the same task at
        a newer generation (a takeover of its own expired lease), the newer lease stays.
        """
        with self._lock:
            if self._leases.get(handle.task_id) is handle:
                del self._leases[handle.task_id]

    def held(self) -> list[LeaseHandle]:
        """The leases currently tracked."""
        with self._lock:
            return list(self._leases.values())

    def renew_now(self, timeout_s: float) -> None:
        """Ask for a renewal round now and wait until one completes (or ``timeout_s``)."""
        with self._round_done:
            target = self._rounds + 1
            self._requested = True
            self._wake.set()
            self._round_done.wait_for(lambda: self._rounds >= target, timeout=timeout_s)

    def poke_control(self) -> None:
        """Read the operator requests at the next wake-up (PostgreSQL NOTIFY: an operator
        command may have just recorded one); at most one read per 50 ms."""
        self._control_due = min(self._control_due, time.monotonic() + 0.05)
        self._wake.set()

    def check_control(self, raise_errors: bool = False) -> None:
        """One read of the operator requests on the held leases (any thread: the heartbeat
        every :data:`CONTROL_POLL_S`, a task thread before a start,
        :mod:`ratchet.worker.startcheck`): each handle's :attr:`LeaseHandle.request` is
        set; a pause no longer asked for (resumed) is cleared, a cancel never is. The
        leases held when the read began get that instant as :attr:`LeaseHandle.checked_at`
        (their rows were committed before it, so the read saw them).

        Raises:
            Exception: what the ledger raised, with ``raise_errors`` (else it is logged and
                the next round asks again).
        """
        began = time.monotonic()
        self._control_due = began + CONTROL_POLL_S
        covered = self.held()
        if not covered:
            return
        try:
            found = self._ledger.control_requests(self._holder)
        except Exception as exc:  # the next round asks again; leases are unaffected
            if raise_errors:
                raise
            log.warning("reading operator requests failed: %s", exc)
            return
        self.control_reads += 1
        asked = {(task_id, generation): request for task_id, generation, request in found}
        with self._lock:
            # Only the leases held when the read began: a later claim's row may not be in
            # what it read (a pause its claim carried must not be cleared).
            for handle in covered:
                request = asked.get((handle.task_id, handle.generation))
                if request is not None:
                    handle.request = request
                elif handle.request == "pause":
                    handle.request = None  # resumed before the task reached a boundary
                handle.checked_at = max(handle.checked_at, began)

    def stop(self) -> None:
        """Stop the thread (leases are not renewed after this)."""
        self._halt.set()
        self._wake.set()

    def _next_due(self) -> float | None:
        with self._lock:
            if not self._leases:
                return None
            return min(h.renew_due for h in self._leases.values())

    def run(self) -> None:
        while not self._halt.is_set():
            with self._lock:  # plan and publish the plan at once: add_many compares with it
                due = min((h.renew_due for h in self._leases.values()), default=None)
                now = time.monotonic()
                wait_s = 1.0 if due is None else min(1.0, max(0.0, due - now))
                if self._leases:
                    wait_s = min(wait_s, max(0.0, self._control_due - now))
                self._planned = now + wait_s
            self._wake.wait(wait_s)
            with self._lock:
                self._planned = float("-inf")  # awake: any new lease is seen by _next_due
            self._wake.clear()
            if self._halt.is_set():
                break
            due = self._next_due()
            if self._requested or (due is not None and time.monotonic() >= due):
                self._requested = False
                self.renew_once()
            if time.monotonic() >= self._control_due:
                self.check_control()

    def renew_once(self) -> list[RenewResult]:
        """One batched renewal of every held lease; returns the ledger's answers."""
        handles = self.held()
        results: list[RenewResult] = []
        if handles:
            t_sent = time.monotonic()
            hooks = self.hooks
            try:
                results = self._ledger.renew(
                    self._holder, [(h.task_id, h.generation) for h in handles]
                )
            except Exception as exc:  # the window simply runs out; effects stop on their own
                if hooks is not None:
                    hooks.after_renew(len(handles), 0, time.monotonic() - t_sent, exc)
                self.failures += 1
                retry_at = time.monotonic()
                for h in handles:  # try again soon, without spinning on a dead ledger
                    h.renew_due = retry_at + min(0.25, h.lease_s / 10.0)
                self.renew_failures.failed(RuntimeError(f"{len(handles)} leases: {exc}"))
            else:
                self.renewals += 1
                self.renew_failures.succeeded()
                t_answered = time.monotonic()
                refused = 0
                by_id = {h.task_id: h for h in handles}
                for r in results:
                    handle = by_id.get(r.task_id)
                    if handle is None or handle.generation != r.generation:
                        continue
                    if r.ok and r.lease_until is not None:
                        handle.confirm(
                            t_sent + (r.lease_until - r.ledger_now) - margin_for(handle.lease_s)
                        )
                        # Not extended (its row was locked by another transaction,
                        # e.g. a transaction step): still ours until lease_until; ask
                        # again soon rather than a third of a lease later.
                        handle.renew_due = t_sent + (
                            handle.lease_s / 3.0 if r.extended
                            else min(0.25, handle.lease_s / 10.0))
                    else:
                        handle.mark_lost()
                        handle.renew_due = float("inf")
                        refused += 1
                if hooks is not None:
                    hooks.after_renew(len(handles), refused, t_answered - t_sent, None)
        with self._round_done:
            self._rounds += 1
            self._round_done.notify_all()
        return results

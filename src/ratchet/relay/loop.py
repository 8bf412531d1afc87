"""The relay's loop (DESIGN §6.2): lease outbox partitions, publish their unsent rows in id
order, wait for the broker's confirmations, mark them sent (fenced by the partitions'
generations), repeat.

One asyncio task runs the rounds; ledger calls are blocking and run in threads
(:func:`asyncio.to_thread`). A second task renews the leases while a round is in flight
(every ``lease_s / 3``); between rounds, at least every ``lease_s / 3`` even when it never
runs out of work, the loop renews and rebalances (gives back partitions above its fair
share). A partition whose lease was lost, or whose renewal
failed, is not published from again: before a batch is sent, every partition in it must
have more than ``lease_s / 3`` of its lease left on this process's monotonic clock (the
lease was measured from before the call that granted it), and a batch that has not been
confirmed by then is abandoned.

A message the broker refuses (too large, a nack of that message) holds back only its key
(:mod:`~ratchet.relay.holds`: a per-key backoff, the key left out of the fetch meanwhile);
the other keys go on, and the connection is kept. Only a connection failure (lost, no
confirmation in time) reconnects, after a backoff.

Wake-ups: the ledger's ``outbox`` subscription (PostgreSQL NOTIFY at the commit of an
emit) wakes an idle relay at once; a poll covers what it misses (``poll_s``: 1 s where the
ledger notifies, 50 ms on SQLite, which has no notifications).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..faults import point as fault_point
from ..ledger.base import Ledger, OutboxRow
from ..outbox import OUTBOX_PARTITIONS
from .holds import KeyHolds
from .targets import HeldBack, Publisher, Refused, misconfigured

__all__ = ["Relay", "RelayOptions", "RelayStats", "default_holder"]

log = logging.getLogger("ratchet.relay")

BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
"""Waits between attempts to reach a broker (the last one repeats)."""


def default_holder(name: str | None = None) -> str:
    """A relay's holder name: ``relay:<name or host>:<pid>:<random>`` (unique per process,
    so a restarted relay never renews its predecessor's leases)."""
    return (f"relay:{name or socket.gethostname()}:{os.getpid()}:"
            f"{uuid.uuid4().hex[:8]}")


@dataclass(frozen=True, slots=True)
class RelayOptions:
    """How a relay runs.

    Attributes:
        lease_s: partition lease, seconds (renewed every ``lease_s / 3``).
        batch: rows fetched and published per round.
        want: the most partitions this relay holds.
        poll_s: how long an idle relay waits for a wake-up before it looks again, seconds
            (None: 1 s on PostgreSQL, which notifies; 0.05 s on SQLite).
    """

    lease_s: float = 10.0
    batch: int = 500
    want: int = OUTBOX_PARTITIONS
    poll_s: float | None = None


@dataclass(slots=True)
class RelayStats:
    """Counters of one relay process: ``published`` (confirmed by every broker),
    ``marked`` (marked sent), ``rejected`` (confirmed but the mark was fenced off: the
    partition was lost), ``failed`` (not confirmed: the connection failed), ``refused``
    (a broker refused that message: its key is held back), ``held`` (not sent or not
    counted: behind a failed message of its key in the batch), ``rounds``,
    ``reconnects``."""

    published: int = 0
    marked: int = 0
    rejected: int = 0
    failed: int = 0
    refused: int = 0
    held: int = 0
    rounds: int = 0
    reconnects: int = 0
    lost: list[int] = field(default_factory=list)


class BrokerTrouble(Exception):
    """The connection failed or timed out: reconnect (after a backoff) before the next
    round."""


class Relay:
    """One relay over ``ledger``, publishing to every one of ``publishers`` (a row is sent
    once all of them confirmed it).

    Args:
        ledger: the ledger (its outbox calls, :class:`~ratchet.ledger.base.RelayLedger`).
        publishers: the brokers (:func:`~ratchet.relay.targets.publisher_for`).
        holder: this relay's lease holder name (:func:`default_holder`).
        options: :class:`RelayOptions`.
    """

    def __init__(self, ledger: Ledger, publishers: Sequence[Publisher], *, holder: str,
                 options: RelayOptions | None = None) -> None:
        self.ledger = ledger
        self.publishers = list(publishers)
        self.holder = holder
        self.options = options or RelayOptions()
        poll = self.options.poll_s
        self.poll_s = poll if poll is not None else (
            0.05 if ledger.config.scheme == "sqlite" else 1.0)
        self.stats = RelayStats()
        self._renew_every = self.options.lease_s / 3
        self._leases: dict[int, tuple[int, float]] = {}  # part -> (generation, deadline)
        self._lease_at = -1e18
        self._rebalanced_at = -1e18
        self._lease_lock = asyncio.Lock()
        self._in_round = False
        self._connected = False
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._holds = KeyHolds()
        self._troubles = 0

    # -- control

    def stop(self) -> None:
        """Ask the relay to stop after its in-flight round (thread-safe; a signal handler
        may call it)."""
        loop = self._loop
        if loop is None:
            self._stop.set()
            return
        loop.call_soon_threadsafe(self._stop.set)
        loop.call_soon_threadsafe(self._wake.set)

    def held(self) -> dict[int, int]:
        """The partitions held now: part -> generation."""
        return {p: g for p, (g, _) in self._leases.items()}

    async def run(self) -> RelayStats:
        """Run rounds until :meth:`stop`; then release the partitions and close the
        brokers. A broker that cannot be reached is retried with backoff (logged as a
        warning each time); ledger errors of a round are logged and the round retried."""
        self._loop = loop = asyncio.get_running_loop()
        if self._stop.is_set():
            return self.stats

        def woken() -> None:
            loop.call_soon_threadsafe(self._wake.set)

        sub = self.ledger.subscribe(woken, channel="outbox")
        renewer = asyncio.create_task(self._renew_loop())
        try:
            while not self._stop.is_set():
                if not self._connected and not await self._connect():
                    break
                # Rebalance on its own clock: a busy relay's leases are always fresh
                # (renewed during its rounds), yet it must still give back partitions
                # above its share when another relay starts.
                if time.monotonic() - self._rebalanced_at >= self._renew_every:
                    await self._lease(rebalance=True)
                self._wake.clear()
                try:
                    n = await self._round()
                except BrokerTrouble as exc:
                    wait = BACKOFF_S[min(self._troubles, len(BACKOFF_S) - 1)]
                    self._troubles += 1
                    log.warning("relay %s: publishing failed (%s); reconnecting in %.1f s",
                                self.holder, exc, wait)
                    self._connected = False
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), wait)
                    continue
                except Exception as exc:  # ledger trouble: log, back off, go on
                    log.warning("relay %s: round failed: %s: %s", self.holder,
                                type(exc).__name__, exc)
                    n = 0
                if n < self.options.batch:
                    now = time.monotonic()
                    due = min(self.poll_s, self._rebalanced_at + self._renew_every - now)
                    hold_end = self._holds.next_end(now)
                    if hold_end is not None:
                        due = min(due, hold_end)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), max(0.0, due))
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            sub.close()
            self._leases.clear()
            try:
                await asyncio.to_thread(self.ledger.outbox_release, self.holder)
            except Exception as exc:  # the leases lapse on their own
                log.warning("relay %s: could not release its partitions: %s", self.holder,
                            exc)
            for publisher in self.publishers:
                await publisher.close()
            log.info("relay %s stopped: %d published, %d marked sent", self.holder,
                     self.stats.published, self.stats.marked)
        return self.stats

    # -- brokers

    async def _connect(self) -> bool:
        """Connect every publisher, retrying with backoff until connected or stopped."""
        attempt = 0
        while not self._stop.is_set():
            try:
                if not await self._until_stopped(self._connect_all()):
                    return False  # stopped while connecting
                self._connected = True
                if attempt or self.stats.reconnects:
                    log.info("relay %s: connected to %s", self.holder,
                             ", ".join(p.target.where for p in self.publishers))
                self.stats.reconnects += 1
                return True
            except Exception as exc:
                if misconfigured(exc):
                    # Retrying cannot help (a bad stream name, an exchange of another type,
                    # TLS on a plain port, refused credentials): stop, exit status 2.
                    raise ConfigError(
                        f"relay {self.holder}: the broker refused the relay's set-up "
                        f"({type(exc).__name__}: {exc}); check --to") from exc
                wait = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                log.warning("relay %s: broker unreachable (%s: %s); retrying in %.1f s",
                            self.holder, type(exc).__name__, exc, wait)
                attempt += 1
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), wait)
        return False

    async def _connect_all(self) -> None:
        for publisher in self.publishers:
            await publisher.connect()

    async def _until_stopped(self, work: Coroutine[Any, Any, None]) -> bool:
        """Run ``work`` until it ends (True; its exception raised) or the relay is asked to
        stop (False; ``work`` cancelled): a connect that hangs never keeps SIGTERM from
        stopping the relay."""
        task = asyncio.ensure_future(work)
        stopping = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            return False
        task.result()
        return True

    # -- leases

    async def _lease(self, *, rebalance: bool) -> None:
        async with self._lease_lock:
            started = time.monotonic()
            try:
                got = await asyncio.to_thread(
                    self.ledger.outbox_lease, self.holder, self.options.lease_s,
                    self.options.want, rebalance=rebalance)
            except Exception as exc:
                if self._leases:
                    log.warning("relay %s: lease renewal failed (%s); stopped publishing "
                                "its %d partitions", self.holder, exc, len(self._leases))
                self._leases = {}
                self._lease_at = started
                if rebalance:
                    self._rebalanced_at = started
                return
            new = {p.part: (p.generation, started + (p.lease_until - p.now)) for p in got}
            lost = sorted(p for p, (g, _) in self._leases.items()
                          if p not in new or new[p][0] != g)
            if lost:
                self.stats.lost.extend(lost)
            if lost or set(new) != set(self._leases):
                log.info("relay %s: holds %d partitions%s", self.holder, len(new),
                         f" (gave up or lost {lost})" if lost else "")
            self._leases = new
            self._lease_at = started
            if rebalance:
                self._rebalanced_at = started

    async def _renew_loop(self) -> None:
        """Renew the leases while a round is in flight (between rounds the loop does)."""
        while True:
            due = self._lease_at + self._renew_every - time.monotonic()
            await asyncio.sleep(max(0.01, min(due, self._renew_every)))
            if self._in_round and time.monotonic() - self._lease_at >= self._renew_every:
                await self._lease(rebalance=False)

    def _usable(self) -> dict[int, tuple[int, float]]:
        """Partitions with more than ``lease_s / 3`` of lease left: part -> (generation,
        seconds left before that margin)."""
        now = time.monotonic()
        margin = self.options.lease_s / 3
        return {p: (g, d - margin - now) for p, (g, d) in self._leases.items()
                if d - margin > now}

    # -- a round

    async def _round(self) -> int:
        """Fetch (leaving out the keys held back), publish, mark. Returns the rows fetched
        (0: nothing to do)."""
        self._in_round = True
        try:
            held = self._usable()
            if not held:
                return 0
            self._holds.keep_parts(held)
            skip_keys, skip_ids = self._holds.skips(time.monotonic())
            rows = await asyncio.to_thread(
                functools.partial(self.ledger.outbox_fetch, sorted(held), self.options.batch,
                                  skip_keys=skip_keys, skip_ids=skip_ids))
            fetched = len(rows)
            if not rows:
                return 0
            self.stats.rounds += 1
            now_held = self._usable()
            rows = self._holds.trim(
                [r for r in rows
                 if r.part in now_held and now_held[r.part][0] == held[r.part][0]])
            if not rows:
                return 0
            left = min(now_held[r.part][1] for r in rows)
            fault_point("relay.before_publish")
            try:
                results = await asyncio.wait_for(self._publish(rows), left)
            except TimeoutError as exc:
                raise BrokerTrouble(f"no confirmation within {left:.1f} s") from exc
            out = _settle(rows, results)
            sent = out.sent
            self.stats.published += len(sent)
            self.stats.failed += len(out.broken)
            self.stats.refused += len(out.refused)
            self.stats.held += out.behind
            if out.overtook:
                log.error("relay %s: %d confirmed messages of keys %s overtook a refused "
                          "earlier message of their key (nacked after they were sent); "
                          "they are published again after it", self.holder,
                          len(out.overtook), sorted(out.overtook)[:5])
            if sent:
                fault_point("relay.after_publish")
                parts = sorted({r.part for r in sent})
                marked = await asyncio.to_thread(
                    self.ledger.outbox_mark_sent, self.holder,
                    [(p, held[p][0]) for p in parts], [r.id for r in sent])
                self.stats.marked += marked
                if marked < len(sent):
                    self.stats.rejected += len(sent) - marked
                    log.info("relay %s: %d confirmed messages not marked sent (their "
                             "partitions were taken over); they will be published again",
                             self.holder, len(sent) - marked)
                fault_point("relay.after_mark")
                for row in sent:
                    self._holds.confirmed(row)
                self._troubles = 0
            if out.refused:
                await self._refused(out.refused)
            if out.broken:
                error = out.broken[0][1]
                await asyncio.to_thread(self.ledger.outbox_failed, self.holder,
                                        [r.id for r, _ in out.broken],
                                        f"{type(error).__name__}: {error}")
                raise BrokerTrouble(f"{len(out.broken)} messages not confirmed: "
                                    f"{type(error).__name__}: {error}")
            self._troubles = 0
            return fetched
        finally:
            self._in_round = False

    async def _refused(self, refused: Sequence[tuple[OutboxRow, BaseException]]) -> None:
        """Count each refused message's attempt and hold back its key (one update per
        distinct error; at most one per key per backoff step)."""
        by_error: dict[str, list[int]] = {}
        now = time.monotonic()
        for row, exc in refused:
            error = f"{type(exc).__name__}: {exc}"
            by_error.setdefault(error, []).append(row.id)
            wait = self._holds.refused(row, now)
            log.warning("relay %s: message %s (key %r, outbox id %d) refused: %s; %s "
                        "waits %.1f s", self.holder, row.message_id, row.key, row.id, error,
                        "its key" if row.key is not None else "it", wait)
        for error, ids in by_error.items():
            await asyncio.to_thread(self.ledger.outbox_failed, self.holder, ids, error)

    async def _publish(self, rows: Sequence[OutboxRow]) -> list[BaseException | None]:
        """Every publisher's result per row: None when all confirmed it."""
        per = await asyncio.gather(*(p.publish(rows) for p in self.publishers),
                                   return_exceptions=True)
        out: list[BaseException | None] = [None] * len(rows)
        for result in per:
            for i in range(len(rows)):
                if out[i] is not None:
                    continue
                out[i] = result if isinstance(result, BaseException) else result[i]
        return out


@dataclass(slots=True)
class _Settled:
    """A published batch split: ``sent`` (to mark), ``refused`` (a broker refused that
    message), ``broken`` (the connection failed: the first failed row of each key),
    ``behind`` (rows behind a failed row of their key: not counted), ``overtook`` (keys
    with a confirmed row behind a refused one)."""

    sent: list[OutboxRow] = field(default_factory=list)
    refused: list[tuple[OutboxRow, BaseException]] = field(default_factory=list)
    broken: list[tuple[OutboxRow, BaseException]] = field(default_factory=list)
    behind: int = 0
    overtook: set[str] = field(default_factory=set)


def _settle(rows: Sequence[OutboxRow], results: Sequence[BaseException | None]) -> _Settled:
    """Split a published batch. A key's run stops at its first failure: a later row of that
    key is not marked even if confirmed (it is published again after the failed one)."""
    out = _Settled()
    stopped: dict[str, bool] = {}  # key -> stopped by a refusal
    for row, result in zip(rows, results, strict=True):
        if row.key is not None and row.key in stopped:
            out.behind += 1
            if result is None and stopped[row.key]:
                out.overtook.add(row.key)
            continue
        if result is None:
            out.sent.append(row)
            continue
        if isinstance(result, Refused):
            out.refused.append((row, result))
        elif isinstance(result, HeldBack):
            out.behind += 1
        else:
            out.broken.append((row, result))
        if row.key is not None:
            stopped[row.key] = isinstance(result, Refused)
    return out

"""The demo's chaos: worker processes SIGKILLed at random and restarted, and one sender per
kind of payment target frozen mid-call (``SIGSTOP`` at
:data:`~ratchet.demo.settings.FREEZE_POINT`) past its lease, then resumed (``SIGCONT``) once
another worker settled its task, its late charge watched at the target."""

from __future__ import annotations

import contextlib
import signal
import time
from dataclasses import dataclass, field

import psutil

from .. import RatchetError
from ..testing import ConditionTimeout, ProcessGroup, WorkerProcess
from .books import RECONCILE_TASK
from .payments import KINDS, PaymentClient, read_replays
from .settings import DEMO_APP, FREEZE_POINT, ORDER_KIND, SETTLED, TASKS
from .state import RunState, Snapshot, holder_pid

__all__ = ["Chaos", "Freeze", "Slot"]


@dataclass
class Slot:
    """One worker position: a process that is restarted after every kill."""

    index: int
    proc: WorkerProcess | None = None
    started_mono: float = 0.0
    starts: int = 0
    pids: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()


@dataclass
class Freeze:
    """The frozen sender of one kind of target: a worker process for that kind's task only,
    which stops itself at ``effect.before_call``.

    ``state``: ``waiting`` (runs, not frozen yet), ``frozen``, ``resumed`` (SIGCONT sent,
    its late charge awaited), ``done``, ``failed`` (never froze in the window). ``before``:
    the key's executions, refused tokens and replays at the service just before SIGCONT.
    """

    kind: str
    proc: WorkerProcess | None = None
    attempts: int = 0
    state: str = "waiting"
    task_id: str | None = None
    key: str | None = None
    generation: int | None = None
    frozen_at: float | None = None
    resumed_at: float | None = None
    done_at: float | None = None
    settled_as: str | None = None
    settled_generation: int | None = None
    before: tuple[int, int, int] = (0, 0, 0)
    note: str = ""

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")


class Chaos:
    """The worker processes of one run and what is done to them.

    Attributes:
        st: the run.
        slots: one per worker position (``workers`` of :func:`~ratchet.demo.runner.run_demo`).
        freezes: the would-be frozen sender of each kind that has tasks (none when
            :attr:`~ratchet.demo.settings.DemoSettings.freeze` is off).
        kills_asked: SIGKILLs to deliver (at least); kills_done: delivered so far.
        kill_inflight: tasks the killed worker held, per kill.
        kill_orders: of those, order workflows (reserving, charging, refunding or
            releasing), per kill.
        kill_shards: of those, shards of the sharded job, per kill.
        shard_kill_done: the one kill aimed at a worker holding a shard under way
            (:meth:`kill_shard_holder`, besides the ``kills_asked`` random ones) happened.
        kill_times: ``(pid, ledger clock just after its death)`` per kill.
        unexpected_exits: worker processes that exited by themselves.
    """

    def __init__(self, st: RunState, workers: int, kills: int) -> None:
        self.st = st
        self.s = st.settings
        self.slots = [Slot(i) for i in range(workers)]
        # Fault points of a test running the demo must not leak into its workers.
        self.procs = ProcessGroup(
            st.workdir / "logs", cwd=st.workdir,
            drop_prefixes=("RATCHET_CRASH_AT", "RATCHET_PAUSE_AT", "RATCHET_CRASH_SKIP"),
        )  # fmt: skip
        total_of = st.total_of
        self.freezes = {
            kind: Freeze(kind) for kind in KINDS if self.s.freeze and total_of[kind]
        }
        self.kills_asked = kills
        self.kills_done = 0
        self.kill_inflight: list[int] = []
        self.kill_orders: list[int] = []
        self.kill_shards: list[int] = []
        self.shard_kill_done = False
        self.kill_times: list[tuple[int, float]] = []
        self.unexpected_exits = 0

    def worker_env(self) -> dict[str, str | None]:
        """What every worker process needs: each kind's service URL, the warehouse's and
        the order payment service's, the lease, in_flight_s, the orders' wait for
        ``shipped``."""
        env: dict[str, str | None] = {
            "RATCHET_DEMO_LEASE_S": repr(self.st.lease_s),
            "RATCHET_DEMO_IN_FLIGHT_S": repr(self.s.effective_in_flight_s),
            "RATCHET_DEMO_SHIP_TIMEOUT_S": repr(self.s.ship_timeout_s),
            "RATCHET_DEMO_PAYMENTS_URL": None,
            "RATCHET_DEMO_WAREHOUSE_URL": None,
            "RATCHET_DEMO_ORDER_PAYMENTS_URL": None,
        }
        for kind, service in self.st.services.items():
            env[f"RATCHET_DEMO_PAYMENTS_URL_{kind.upper()}"] = service.url
        if self.st.warehouse is not None:
            env["RATCHET_DEMO_WAREHOUSE_URL"] = self.st.warehouse.url
        if self.st.order_payments is not None:
            env["RATCHET_DEMO_ORDER_PAYMENTS_URL"] = self.st.order_payments.url
        return env


    def start_worker(self, slot: Slot) -> None:
        """Start (or restart) the worker of ``slot`` in a process group of its own."""
        slot.proc = self.procs.worker(
            DEMO_APP,
            self.st.ledger_url,
            name=f"worker-{slot.index}",
            concurrency=self.s.concurrency,
            poll_interval_s=None,
            new_session=True,
            env=self.worker_env(),
        )
        slot.started_mono = time.monotonic()
        slot.starts += 1
        slot.pids.append(slot.proc.pid)

    def start_freezer(self, fz: Freeze) -> None:
        """Start the would-be frozen sender of ``fz.kind``: one task thread, nothing
        prefetched, only that kind's task, ``RATCHET_PAUSE_AT=effect.before_call``."""
        fz.attempts += 1
        fz.state = "waiting"
        fz.proc = self.procs.worker(
            DEMO_APP,
            self.st.ledger_url,
            name=f"frozen-sender-{fz.kind}-{fz.attempts}",
            concurrency=1,
            poll_interval_s=0.05,
            new_session=True,
            args=["--names", TASKS[fz.kind], "--prefetch", "0"],
            env={**self.worker_env(), "RATCHET_PAUSE_AT": FREEZE_POINT},
        )

    def all_procs(self) -> list[WorkerProcess]:
        procs = [s.proc for s in self.slots if s.proc is not None]
        return procs + [f.proc for f in self.freezes.values() if f.proc is not None]

    def stop_workers(self) -> None:
        """SIGCONT + SIGTERM every live worker, wait up to 5 s, SIGKILL what is left.

        Only processes still running (not yet reaped) are signalled, so a recycled pid is
        never hit. Calling it again is a no-op.
        """
        live = [p for p in self.all_procs() if p.alive()]
        for proc in live:
            proc.resume()
            proc.signal(signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for proc in live:
            with contextlib.suppress(ConditionTimeout):
                proc.wait(max(0.1, deadline - time.monotonic()))
        self.procs.cleanup()

    def restore_faults(self, kind: str) -> None:
        """Put ``kind``'s service back on the run's fault settings."""
        s = self.s
        with contextlib.suppress(Exception), PaymentClient(self.st.services[kind].url, 5.0) as c:
            c.set_faults(reply_lost=s.reply_lost, burst_503=s.burst_503, slow=s.slow)


    def kill_one(self, snap: Snapshot) -> bool:
        """SIGKILL a random running worker and restart it. False: none eligible."""
        eligible = [s for s in self.slots if s.alive()]
        if not eligible:
            return False
        busy = [s for s in eligible if s.pid is not None and snap.inflight.get(s.pid)]
        self._kill(self.st.rng.choice(busy or eligible), snap, self._running_shards())
        self.kills_done += 1
        return True

    def kill_shard_holder(self, snap: Snapshot) -> bool:
        """Once per run, besides the random kills: SIGKILL a worker holding a shard of the
        sharded job that has committed a batch but not finished, so that the report shows
        a shard resuming from its watermark. False: no such worker now (or done already)."""
        if self.shard_kill_done:
            return False
        shards = self._running_shards()
        ids = [t for held in shards.values() for t in held]
        if not ids:
            return False
        with contextlib.suppress(RatchetError):
            under_way = {p.task_id for p in self.st.control.batch_progress_many(ids)
                         if p.watermark > 0 and not p.done}
            slots = [s for s in self.slots if s.alive() and s.pid is not None
                     and any(t in under_way for t in shards.get(s.pid, []))]
            if slots:
                self._kill(self.st.rng.choice(slots), snap, shards, aimed=True)
                self.shard_kill_done = True
        return self.shard_kill_done

    def _kill(self, slot: Slot, snap: Snapshot, shards: dict[int, list[str]],
              aimed: bool = False) -> None:
        assert slot.proc is not None
        pid = slot.proc.pid
        held_ids = snap.inflight.get(pid, [])
        mine = len(shards.get(pid, []))
        held = len(held_ids) + mine
        orders = sum(1 for tid in held_ids if self.st.kind_of.get(tid) == ORDER_KIND)
        slot.proc.kill()
        with contextlib.suppress(RatchetError):
            self.kill_times.append((pid, self.st.control.ledger_now()))
        self.kill_inflight.append(held)
        self.kill_orders.append(orders)
        self.kill_shards.append(mine)
        self.start_worker(slot)
        self.st.log(
            f"[red]SIGKILL[/] worker {slot.index} (pid {pid}, ~{held} tasks in flight"
            + (f", {orders} of them orders" if orders else "")
            + (f", {mine} shard(s) of the sharded job" if mine else "")
            + (": aimed at a shard under way" if aimed else "")
            + f") → restarted as pid {slot.pid}"
        )

    def _running_shards(self) -> dict[int, list[str]]:
        """Shards of the sharded job running now, per holder pid (empty without a job)."""
        if self.st.books_job is None:
            return {}
        found: dict[int, list[str]] = {}
        with contextlib.suppress(RatchetError):
            page = self.st.control.list_tasks(state="RUNNING", name=RECONCILE_TASK, limit=100)
            for task in page.tasks:
                if task.task_id == self.st.books_job:
                    continue  # the job's parent: it fans out, then waits without a lease
                pid = holder_pid(task.holder)
                if pid is not None:
                    found.setdefault(pid, []).append(task.task_id)
        return found

    def restart_exited(self) -> None:
        """Restart every worker that died by itself (reported as an unexpected exit)."""
        for slot in self.slots:
            if slot.proc is not None and not slot.alive():
                self.unexpected_exits += 1
                self.st.log(
                    f"[red]worker {slot.index} (pid {slot.pid}) exited by itself "
                    f"with status {slot.proc.returncode}[/] → restarting"
                )
                self.start_worker(slot)

    def tend_freezes(self, snap: Snapshot) -> None:
        """Move each frozen sender along: waiting → frozen → resumed → done."""
        for fz in self.freezes.values():
            if fz.state == "waiting":
                self._check_frozen(fz, snap)
            elif fz.state == "frozen":
                self._maybe_resume(fz)
            elif fz.state == "resumed":
                self._check_late(fz)

    def _retry_freeze(self, fz: Freeze, why: str) -> None:
        if fz.proc is not None and fz.proc.alive():
            fz.proc.resume()
            fz.proc.signal(signal.SIGTERM)  # graceful: it finishes or releases its task
        if fz.attempts >= 3:
            fz.state, fz.note = "failed", why
            self.st.log(f"[yellow]{fz.kind}: no frozen sender ({why}; gave up after 3 tries)[/]")
        else:
            self.st.log(f"[yellow]{fz.kind}: freeze retried ({why})[/]")
            self.start_freezer(fz)

    def _check_frozen(self, fz: Freeze, snap: Snapshot) -> None:
        proc = fz.proc
        if proc is None:
            return
        if not proc.alive():
            self.unexpected_exits += 1
            self._retry_freeze(fz, f"its worker exited with status {proc.returncode}")
            return
        if proc.status() != psutil.STATUS_STOPPED:
            left = self.st.total_of[fz.kind] - snap.settled_of[fz.kind]
            if self.st.submitted >= self.st.n_tasks and left == 0:
                fz.state, fz.note = "failed", "no task of its kind was left to claim"
                self.st.log(f"[yellow]{fz.kind}: no frozen sender ({fz.note})[/]")
            return
        held = self.st.snapshot().inflight.get(proc.pid, [])
        if len(held) != 1:
            self._retry_freeze(fz, f"it froze holding {len(held)} tasks")
            return
        if self.st.sqlite_write_lock_held():
            self._retry_freeze(fz, "it froze inside a SQLite write")
            return
        info = self.st.control.get(held[0])
        fz.task_id, fz.generation = info.task_id, info.generation
        fz.key = f"charge:{info.params['order_id']}"
        fz.state, fz.frozen_at = "frozen", self.st.now()
        self.st.log(
            f"[yellow]SIGSTOP[/] {fz.kind}: worker pid {proc.pid} froze itself at "
            f"{FREEZE_POINT} (lease checked, charge not sent): {fz.key}, generation "
            f"{fz.generation}"
        )

    def _maybe_resume(self, fz: Freeze) -> None:
        assert fz.proc is not None and fz.task_id is not None and fz.frozen_at is not None
        info = self.st.control.get(fz.task_id)
        frozen_for = self.st.now() - fz.frozen_at
        settled = info.state in SETTLED and info.generation > (fz.generation or 0)
        if frozen_for < self.s.pause_factor * self.st.lease_s:
            return
        if not settled and frozen_for < self.s.freeze_max_s:
            return
        fz.settled_as = info.state.value if settled else None
        fz.settled_generation = info.generation
        fz.before = self.at_target(fz)
        # The late charge must meet the target itself, not an injected fault.
        with contextlib.suppress(Exception), PaymentClient(self.st.services[fz.kind].url, 5.0) as c:
            c.set_faults(reply_lost=0.0, burst_503=0.0, slow=0.0)
        fz.proc.resume()
        fz.state, fz.resumed_at = "resumed", self.st.now()
        what = (
            f"its task was taken over and ended {info.state.value} (generation {info.generation})"
            if settled
            else f"[red]its task was not settled by another worker within "
            f"{self.s.freeze_max_s:.0f} s[/]"
        )
        self.st.log(
            f"[green]SIGCONT[/] {fz.kind}: frozen sender resumed after {frozen_for:.1f} s "
            f"(lease {self.st.lease_s:.1f} s); {what}; its charge leaves now"
        )

    def at_target(self, fz: Freeze) -> tuple[int, int, int]:
        """``(executions, refused tokens, replays)`` of the frozen sender's key, counted in
        its service's own file."""
        service = self.st.services[fz.kind]
        records = service.records()
        return (
            records.executions.get(fz.key or "", 0),
            sum(1 for r in records.rejections if r.key == fz.key),
            read_replays(service.db_path).get(fz.key or "", 0),
        )

    def _check_late(self, fz: Freeze) -> None:
        assert fz.resumed_at is not None and fz.task_id is not None
        now = self.at_target(fz)
        executed, refused, replayed = (a - b for a, b in zip(now, fz.before, strict=True))
        late = self.st.late_effects(fz.task_id)
        waited = self.st.now() - fz.resumed_at
        # An execution is followed by the late-effect record (or not, at an idempotent
        # target, which replays); give the ledger write a moment.
        if executed and not late and waited < 3.0:
            return
        if not (executed or refused or replayed or late) and waited < 15.0:
            return
        self.restore_faults(fz.kind)
        fz.state, fz.done_at = "done", self.st.now()
        if refused:
            seen = "the service refused its stale fencing token"
        elif replayed:
            seen = "the service answered it as a replay (nothing charged)"
        elif executed:
            seen = "the service executed it" + (
                f"; the ledger recorded a late effect ({late[0].outcome})"
                if late
                else "; [red]no late effect recorded[/]"
            )
        else:
            seen = "[yellow]nothing reached the service within 15 s[/]"
        self.st.log(f"{fz.kind}: the frozen sender's late charge: {seen}")

    # -- display

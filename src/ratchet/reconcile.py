"""Reconciliation: does the external side agree with the ledger? (``ratchet reconcile``)

:func:`reconcile` walks the recent effects of one task type (:meth:`Control.effects`) and
asks each effect's registered lookup (:meth:`ratchet.App.lookup`) what the target holds
for its key. Each disagreement is a :class:`Finding` with an ``outcome``:

* ``absent`` — the ledger records the effect done, the target says it never executed;
* ``unrecorded`` — the target has the key, the ledger records an open intent (the task
  waits, or is ``UNKNOWN``), ``not_done`` or ``given_up``;
* ``not_executed`` — an ``UNKNOWN`` task's open intent, and the target confirms the key
  never executed (past the lookup's ``in_flight_s``);
* ``unknown`` — the lookup raised, timed out, or said "not found" while a request may
  still be in flight: nothing is established;
* ``late`` — a stale holder's late call (``late_effects``): a possible duplicate;
* ``late_accounted_for`` — a stale holder's late call that was the only request sent, whose
  execution a lookup hit settled the effect with (the new holder did not call): reported
  and counted, but not a disagreement (not in ``open_findings``);
* ``no_lookup`` — effects of a name with no registered lookup (one finding per name).

An intent of a ``RUNNING`` task is in flight (its worker settles it) and is not looked up.
Nothing changes unless ``apply=True``: then the unambiguous findings are resolved through
:meth:`Control.resolve` (audited with the operator and reason): an ``UNKNOWN`` task whose
only open effect the target has → ``done`` with the target's answer as the result; whose
only open effect the target confirms absent → ``not-done`` (the task calls again, same
key). Both only while that open effect is still the intent of the generation that was
looked up (a task resolved and run again meanwhile is left alone). Everything else is left
for a person. Each run is audited (:meth:`Control.
record_reconcile`): a ``reconcile`` row with the counts, and a ``reconcile_<outcome>`` row
per finding on its task (``reconcile_resolved`` per resolution), so a ledger collector can
count them (:meth:`Control.reconcile_counts`).

Lookups are bounded: at most ``concurrency`` at once, at most ``rate_per_s`` started per
second (retries included), each given ``lookup_timeout_s`` seconds (a lookup still running
then counts as ``unknown``; its thread cannot be killed and is left to finish on its own,
and it is not tried again). A lookup that raises (a 503, a refused connection) is tried
again up to ``lookup_retries`` times, after a jittered exponential backoff
(:data:`RETRY_BACKOFF_S` doubling up to :data:`RETRY_BACKOFF_MAX_S`), so a target that
fails some requests does not leave its effects unchecked; the note of one that still
fails names the tries and the last error's type and first line.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import tenacity

from .app import App
from .control import (
    LATE_ACCOUNTED_FOR,
    Control,
    LateEffectView,
    TaskEffectView,
    default_operator,
)
from .errors import IllegalTransition, InvalidArguments, RatchetError, TaskNotFound
from .errortext import error_message, error_summary
from .lookups import RegisteredLookup, effect_base_name
from .serde import dumps, printable
from .validation import (
    MAX_KEY_BYTES,
    MAX_NAME_BYTES,
    check_finite,
    check_identifier,
    check_int,
)
from .worker.context import NotFound

__all__ = ["AGREEING", "MAX_LOOKUP_RETRIES", "MAX_LOOKUP_TIMEOUT_S", "OUTCOMES", "Finding",
           "ReconcileReport", "reconcile"]

MAX_LOOKUP_TIMEOUT_S = 3600.0
"""The longest ``lookup_timeout_s`` (``--lookup-timeout``), seconds."""

MAX_LOOKUP_RETRIES = 10
"""The most ``lookup_retries`` (``--lookup-retries``): tries after the first."""

RETRY_BACKOFF_S = 0.2
"""The first wait before a failed lookup is tried again, seconds (full jitter: a random
wait up to it, doubling each try)."""

RETRY_BACKOFF_MAX_S = 5.0
"""The longest wait between two tries of a lookup, seconds."""

OUTCOMES: tuple[str, ...] = ("absent", "unrecorded", "not_executed", "unknown", "late",
                             "late_accounted_for", "no_lookup")
"""Every finding outcome, in report order (audit kinds ``reconcile_<outcome>``)."""

AGREEING: frozenset[str] = frozenset({"late_accounted_for"})
"""Outcomes reported and counted but not left open: the ledger accounts for them."""

MAX_DETAIL_CHARS = 2000
"""A target's answer longer than this (as JSON) is left out of the audit row."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One disagreement between the ledger and the target (or one that cannot be checked).

    Attributes:
        outcome: one of :data:`OUTCOMES`.
        task_id: the task ("" for ``no_lookup``). task_state: its state when read.
        effect: the stored effect name (``name`` or ``name#N``). key: its idempotency key.
        recorded: what the ledger records: ``intent``, ``done``, ``not_done``,
            ``given_up`` (for ``late``: the late call's outcome, ``done`` / ``unknown``).
        recorded_result: the recorded result (for ``late``: the late call's result or
            error text).
        generation: the generation that wrote the record (for ``late``: the stale
            holder's).
        target: the target's answer: its result when it has the key, None otherwise.
        note: why this is a finding, in words.
        action: what ``apply`` does about it: ``resolve done``, ``resolve not-done`` or
            ``none`` (left for a person).
        applied: the action was carried out by this run.
        count: effects it stands for (``no_lookup``: effects of that name; else 1).
    """

    outcome: str
    task_id: str
    task_state: str
    effect: str
    key: str
    recorded: str
    recorded_result: Any
    generation: int | None
    target: Any
    note: str
    action: str = "none"
    applied: bool = False
    count: int = 1


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What one reconcile run found (``dataclasses.asdict`` is ``--json``).

    Attributes:
        task_type: the task type walked.
        newer_than_s: the window (tasks submitted less than this many seconds ago; None:
            all). limit: most effects walked.
        apply: resolutions were carried out. operator, reason: who and why (audited).
        effects: effect records walked. truncated: more were left past ``limit``.
        lookups: lookups made. agreed: effects on which the target agrees.
        in_flight: open intents of ``RUNNING`` tasks (not looked up: their worker settles
            them).
        counts: findings per outcome (every outcome of :data:`OUTCOMES`, zeros too).
        resolved: findings resolved by ``apply``.
        open_findings: findings left (not resolved, and not of an outcome in
            :data:`AGREEING`): non-zero means disagreement (the CLI's exit status 1).
        findings: every finding, ``no_lookup`` first, then in walk order, late ones last.
        recorded: the run was audited in the ledger.
        ledger_now: the ledger clock at the start, epoch seconds. elapsed_s: run time.
    """

    task_type: str
    newer_than_s: float | None
    limit: int
    apply: bool
    operator: str
    reason: str
    effects: int
    truncated: bool
    lookups: int
    agreed: int
    in_flight: int
    counts: dict[str, int]
    resolved: int
    open_findings: int
    findings: list[Finding] = field(default_factory=list)
    recorded: bool = True
    ledger_now: float = 0.0
    elapsed_s: float = 0.0


class _Pacer:
    """Start at most ``rate_per_s`` lookups per second across threads (None: no limit)."""

    def __init__(self, rate_per_s: float | None) -> None:
        self._gap = 0.0 if rate_per_s is None else 1.0 / rate_per_s
        self._next = time.monotonic()
        self._lock = threading.Lock()

    def wait(self) -> None:
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self._gap
        if start > now:
            time.sleep(start - now)


_Answer = tuple[str, Any]
"""``("found", result)``, ``("absent", None)`` or ``("error", text)``."""


class _LookupFailed(Exception):
    """One try of a lookup raised: ``text`` is its error's type and first line."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


def _try_once(lookup: RegisteredLookup, key: str, token: int, pacer: _Pacer,
              timeout_s: float) -> _Answer:
    """One try, paced, on a thread of its own bounded by ``timeout_s``.

    Raises:
        _LookupFailed: the lookup raised (worth another try).
    """
    pacer.wait()
    box: list[_Answer] = []

    def run() -> None:
        try:
            value = lookup.ask(key, token)
        except BaseException as exc:  # SystemExit too: this thread's answer, not a hang
            box.append(("raised", error_summary(error_message(exc))[:500]))
        else:
            box.append(("absent", None) if isinstance(value, NotFound) else ("found", value))

    thread = threading.Thread(target=run, name="ratchet-reconcile-lookup", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not box:  # still running: not tried again (its thread cannot be stopped)
        return "error", f"lookup timed out after {timeout_s} s"
    if box[0][0] == "raised":
        raise _LookupFailed(box[0][1])
    return box[0]


def _ask(lookup: RegisteredLookup, key: str, token: int, pacer: _Pacer,
         timeout_s: float, retries: int) -> _Answer:
    """The lookup's answer, tried up to ``1 + retries`` times while it raises (jittered
    exponential backoff between tries); ``("error", note text)`` when it never answered."""
    tries = 1 + retries
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(_LookupFailed),
        stop=tenacity.stop_after_attempt(tries),
        wait=tenacity.wait_random_exponential(multiplier=RETRY_BACKOFF_S,
                                              max=RETRY_BACKOFF_MAX_S),
        reraise=True,
    )
    try:
        return retrying(_try_once, lookup, key, token, pacer, timeout_s)
    except _LookupFailed as failed:
        return "error", (failed.text if tries == 1
                         else f"{tries} tries failed, the last: {failed.text}")


def _check_args(task_type: object, newer_than_s: object, limit: object, concurrency: object,
                rate_per_s: object, lookup_timeout_s: object, lookup_retries: object) -> None:
    check_identifier(task_type, "task type", MAX_NAME_BYTES)
    if newer_than_s is not None:
        check_finite(newer_than_s, "newer_than_s (--since, seconds)", minimum=0.0)
    check_int(limit, "limit (--limit)", minimum=1, maximum=100_000)
    check_int(concurrency, "concurrency (--concurrency)", minimum=1, maximum=64)
    if rate_per_s is not None:
        check_finite(rate_per_s, "rate_per_s (--rate, lookups per second, or None)",
                     minimum=0.0, above_minimum=True, maximum=100_000)
    check_finite(lookup_timeout_s, "lookup_timeout_s (--lookup-timeout, seconds)", minimum=0.0,
                 above_minimum=True, maximum=MAX_LOOKUP_TIMEOUT_S)
    check_int(lookup_retries, "lookup_retries (--lookup-retries)", minimum=0,
              maximum=MAX_LOOKUP_RETRIES)


def _walk(control: Control, task_type: str, newer_than_s: float | None,
          limit: int) -> tuple[list[TaskEffectView], bool]:
    """Up to ``limit`` effects of the type, newest task first; and whether more were left."""
    rows: list[TaskEffectView] = []
    cursor: str | None = None
    while len(rows) < limit:
        page = control.effects(task_type, newer_than_s=newer_than_s,
                               limit=min(500, limit - len(rows)), cursor=cursor)
        rows.extend(page.effects)
        cursor = page.next_cursor
        if cursor is None:
            return rows, False
    return rows, cursor is not None


def _judge(row: TaskEffectView, lookup: RegisteredLookup, answer: _Answer,
           ledger_now: float) -> Finding | None:
    """The finding for one looked-up effect, or None when the target agrees."""
    e = row.effect
    kind, value = answer

    def finding(outcome: str, note: str, target: Any = None, action: str = "none") -> Finding:
        return Finding(outcome, row.task_id, row.task_state, e.name, e.key, e.state,
                       e.result, e.generation, target, note, action)

    unknown_task = row.task_state == "UNKNOWN"
    if kind == "error":
        return finding("unknown", f"the lookup could not tell: {value}")
    if kind == "found":
        if e.state == "done":
            return None
        action = "resolve done" if unknown_task and e.state == "intent" else "none"
        return finding("unrecorded", f"the target has key {e.key!r}, the ledger records "
                       f"{e.state}", value, action)
    # The target says it never executed.
    if e.state == "done":
        return finding("absent", f"the ledger records {e.name!r} done, the target has no "
                       f"key {e.key!r}")
    if e.state != "intent":
        return None  # not_done / given_up, and absent: they agree
    waited_s = ledger_now - e.updated_at
    if (not lookup.fenced and lookup.in_flight_s is not None
            and waited_s < lookup.in_flight_s):
        return finding("unknown", f"not found, but the intent is {waited_s:.1f} s old and a "
                       f"request may still be in flight (in_flight_s={lookup.in_flight_s})")
    if not unknown_task:
        return None  # the task's next attempt looks up first and calls again (same key)
    return finding("not_executed", f"the target confirms key {e.key!r} never executed",
                   None, "resolve not-done")


def _late_finding(le: LateEffectView, state: str, target: Any) -> Finding:
    recorded = (f"the ledger recorded generation {le.recorded_generation}'s outcome"
                if le.recorded_generation is not None
                else "the ledger has no outcome recorded for it")
    sent = (f"generation {le.generation} ({le.holder}) sent {le.effect!r} after its claim "
            f"was taken over: outcome {le.outcome}; {recorded}")
    if le.kind == LATE_ACCOUNTED_FOR:
        return Finding("late_accounted_for", le.task_id, state, le.effect, le.key,
                       le.outcome, le.detail, le.generation, target,
                       f"{sent} by a lookup hit, and it was the only request sent for the "
                       "key (one intent recorded): the execution the ledger records is "
                       "this call's, no duplicate")
    note = (f"{sent}. A lookup proves presence, not how often it executed: check the target "
            "for a duplicate")
    return Finding("late", le.task_id, state, le.effect, le.key, le.outcome, le.detail,
                   le.generation, target, note)


def _apply(control: Control, f: Finding, reason: str, operator: str) -> Finding:
    """Carry out ``f.action`` if the task still has exactly that one open effect, written
    by the generation whose intent was looked up (else the answer may be stale)."""
    try:
        timeline = control.inspect(f.task_id)
    except TaskNotFound:
        return _with(f, note=f"{f.note}; not applied: the task is gone")
    open_effects = [e.name for e in timeline.effects if e.state == "intent"]
    if timeline.task.state.value != "UNKNOWN" or open_effects != [f.effect]:
        return _with(f, note=f"{f.note}; not applied: the task is {timeline.task.state.value}"
                     f" with open effects {open_effects} (resolve settles every open effect "
                     "at once: only a task whose one open effect is this one is resolved)")
    [intent] = [e for e in timeline.effects if e.state == "intent"]
    if intent.generation != f.generation:  # the task ran again since the lookup was asked
        return _with(f, note=f"{f.note}; not applied: the open intent is now generation "
                     f"{intent.generation}'s, not generation {f.generation}'s that was looked"
                     " up (the answer may be stale: run reconcile again)")
    why = f"ratchet reconcile ({f.outcome}, the target's answer): {reason}"
    try:
        if f.action == "resolve done":
            control.resolve(f.task_id, "done", f.target, reason=why, by=operator)
        else:
            control.resolve(f.task_id, "not-done", reason=why, by=operator)
    except (IllegalTransition, TaskNotFound) as exc:
        return _with(f, note=f"{f.note}; not applied: {exc}")
    except RatchetError as exc:  # e.g. the target's answer is not plain JSON
        return _with(f, note=f"{f.note}; not applied: {type(exc).__name__}: {exc}")
    return _with(f, applied=True)


def _with(f: Finding, **changes: Any) -> Finding:
    values = {name: getattr(f, name) for name in Finding.__dataclass_fields__}
    values.update(changes)
    return Finding(**values)


def _audit_detail(f: Finding) -> dict[str, Any]:
    target: Any = f.target
    try:
        if len(dumps(target)) > MAX_DETAIL_CHARS:
            target = f"(omitted: longer than {MAX_DETAIL_CHARS} characters)"
    except RatchetError:
        target = printable(repr(target))[:MAX_DETAIL_CHARS]
    return {"effect": f.effect, "key": f.key, "recorded": f.recorded, "target": target,
            "note": f.note, "action": f.action, "applied": f.applied, "count": f.count}


def reconcile(
    control: Control,
    app: App,
    task_type: str,
    *,
    newer_than_s: float | None = 86_400.0,
    limit: int = 1000,
    apply: bool = False,
    reason: str | None = None,
    by: str | None = None,
    concurrency: int = 4,
    rate_per_s: float | None = 20.0,
    lookup_timeout_s: float = 10.0,
    lookup_retries: int = 2,
    record: bool = True,
) -> ReconcileReport:
    """Check the recent effects of ``task_type`` against their targets (module docstring).

    Args:
        control: the ledger's :class:`~ratchet.control.Control`.
        app: the application whose registered lookups (:meth:`App.lookup`) are asked.
        task_type: the task name; the app must define it or register a lookup for it.
        newer_than_s: only tasks submitted less than this many seconds ago (default 24 h;
            None: all). limit: at most this many effects (1 to 100,000), newest first.
        apply: resolve the unambiguous findings (needs ``reason``).
        reason: why, for the audit log (required with ``apply``).
        by: the operator (default: the login name).
        concurrency: lookups at once (1-64). rate_per_s: lookups started per second
            (None: no limit; retries count). lookup_timeout_s: seconds each try of a
            lookup may take (one that times out is not tried again).
        lookup_retries: tries after the first of a lookup that raised (0 to
            :data:`MAX_LOOKUP_RETRIES`), after a jittered exponential backoff.
        record: audit the run and its findings in the ledger (False: a read-only run).

    Returns:
        A :class:`ReconcileReport`.

    Raises:
        InvalidArguments: an unknown task type, a bad bound, ``apply`` without a reason.
        LedgerUnavailable: no ledger there. Errors of a lookup never propagate: they are
            ``unknown`` findings.
    """
    started = time.monotonic()
    _check_args(task_type, newer_than_s, limit, concurrency, rate_per_s, lookup_timeout_s,
                lookup_retries)
    if task_type not in app.tasks and not any(t == task_type for t, _ in app.lookups):
        known = sorted(set(app.tasks) | {t for t, _ in app.lookups})
        raise InvalidArguments(
            f"the app defines no task type {printable(task_type)!r} and registers no lookup "
            f"for it; known: {', '.join(known) or '(none)'}")
    if apply and (not isinstance(reason, str) or not reason.strip()):
        raise InvalidArguments("reason (--reason) must say why --apply resolves tasks: it is "
                               "kept in the audit log")
    if reason is not None:
        check_identifier(reason, "reason", 4 * MAX_KEY_BYTES)
    operator = by if by is not None else default_operator()
    check_identifier(operator, "operator name", MAX_KEY_BYTES)
    ledger_now = control.ledger_now()
    rows, truncated = _walk(control, task_type, newer_than_s, limit)

    in_flight = 0
    no_lookup: dict[str, int] = {}
    to_ask: list[tuple[TaskEffectView, RegisteredLookup]] = []
    for row in rows:
        if row.effect.state == "intent" and row.task_state == "RUNNING":
            in_flight += 1
            continue
        lookup = app.registered_lookup(task_type, row.effect.name)
        if lookup is None:
            base = effect_base_name(row.effect.name)
            no_lookup[base] = no_lookup.get(base, 0) + 1
            continue
        to_ask.append((row, lookup))

    pacer = _Pacer(rate_per_s)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=concurrency,
                                                 thread_name_prefix="ratchet-reconcile")
    try:
        answers = list(pool.map(
            lambda job: _ask(job[1], job[0].effect.key, job[0].task_generation, pacer,
                             lookup_timeout_s, lookup_retries), to_ask))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)

    findings: list[Finding] = [
        Finding("no_lookup", "", "", name, "", "", None, None, None,
                f"no lookup registered for {task_type!r} effect {name!r} (App.lookup): "
                f"{n} effect(s) not checked", count=n)
        for name, n in sorted(no_lookup.items())]
    agreed = 0
    by_effect: dict[tuple[str, str], tuple[TaskEffectView, _Answer]] = {}
    for (row, lookup), answer in zip(to_ask, answers, strict=True):
        by_effect[(row.task_id, row.effect.name)] = (row, answer)
        found = _judge(row, lookup, answer, ledger_now)
        if found is None:
            agreed += 1
        else:
            findings.append(found)

    late = control.late_effects_of_type(task_type, newer_than_s=newer_than_s,
                                        limit=min(limit, 10_000))
    walked = {row.task_id: row.task_state for row in rows}
    missing = sorted({le.task_id for le in late} - set(walked))
    walked.update({t.task_id: t.state.value for t in control.get_many(missing)})
    for le in late:
        seen = by_effect.get((le.task_id, le.effect))
        target = seen[1][1] if seen is not None and seen[1][0] == "found" else None
        findings.append(_late_finding(le, walked.get(le.task_id, ""), target))

    if apply:
        assert reason is not None
        findings = [_apply(control, f, reason, operator) if f.action != "none" else f
                    for f in findings]
    counts = {o: sum(f.count for f in findings if f.outcome == o) for o in OUTCOMES}
    resolved = sum(1 for f in findings if f.applied)
    report = ReconcileReport(
        task_type=task_type, newer_than_s=newer_than_s, limit=limit, apply=apply,
        operator=operator, reason=reason or "", effects=len(rows), truncated=truncated,
        lookups=len(to_ask), agreed=agreed, in_flight=in_flight, counts=counts,
        resolved=resolved,
        open_findings=sum(f.count for f in findings
                          if not f.applied and f.outcome not in AGREEING),
        findings=findings, recorded=record, ledger_now=ledger_now,
        elapsed_s=time.monotonic() - started)
    if record:
        summary = {"operator": operator, "reason": reason or "", "apply": apply,
                   "newer_than_s": newer_than_s, "limit": limit, "effects": len(rows),
                   "truncated": truncated, "lookups": len(to_ask), "agreed": agreed,
                   "in_flight": in_flight, "counts": counts, "resolved": resolved,
                   "open_findings": report.open_findings}
        rows_out: list[tuple[str, str, int | None, dict[str, Any]]] = []
        for f in findings:
            task = f.task_id or f"reconcile:{task_type}"
            rows_out.append((task, f.outcome, f.generation, _audit_detail(f)))
            if f.applied:
                rows_out.append((task, "resolved", f.generation, _audit_detail(f)))
        control.record_reconcile(task_type, summary, rows_out, by=operator)
    return report

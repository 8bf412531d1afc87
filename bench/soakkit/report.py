"""The soak's checks, read from the ledger and from the counting services' own files, and
the report (a printed table, or JSON).

Checks (each one fails the run):

* **tasks lost 0**: every task submitted is ``SUCCEEDED``;
* **duplicated executions 0** at the targets that honour keys or check tokens, counted by
  the service itself (:func:`ratchet.testing.check_exactly_once` on those tasks: every
  succeeded task's key executed exactly once, no key twice, no stray key);
* **late effects = late executions at the lookup-only target**: the ledger's late-effect
  records of kind ``possible_duplicate`` equal the executions beyond the first the
  lookup-only service counted (and every succeeded task's key executed there);
* **stale writes accepted 0**: :func:`ratchet.testing.check_ledger_consistent` (every
  generation bump audited, no step or effect written by a generation that was not the
  holder's, finished tasks hold no lease; ``stale_rejected`` rows are fine and counted);
* **outbox**: every message delivered at least once, in order per key (when it ran);
* **fault plan completed**: every planned fault was injected.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ratchet.ledger import open_ledger
from ratchet.ledger.base import LATE_ACCOUNTED_FOR
from ratchet.testing import CountingService, check_exactly_once, check_ledger_consistent

__all__ = ["Check", "SoakReport", "gather"]


@dataclass
class Check:
    """One line of the report: what was measured, whether it holds."""

    name: str
    ok: bool
    value: str
    detail: str = ""


@dataclass
class SoakReport:
    """Everything the soak prints (and writes with ``--json``)."""

    settings: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def as_json(self) -> str:
        return json.dumps({"ok": self.ok, "settings": self.settings, "figures": self.figures,
                           "checks": [c.__dict__ for c in self.checks]}, indent=2, default=str)

    def table(self) -> str:
        width = max(len(c.name) for c in self.checks) if self.checks else 10
        lines = ["", "Chaos soak: " + ", ".join(f"{k}={v}" for k, v in self.settings.items()), ""]
        for c in self.checks:
            mark = "ok  " if c.ok else "FAIL"
            lines.append(f"  {mark}  {c.name:<{width}}  {c.value}"
                         + (f"   ({c.detail})" if c.detail else ""))
        lines.append("")
        for k, v in self.figures.items():
            lines.append(f"  {k}: {v}")
        lines.append("")
        lines.append("RESULT: " + ("every check holds" if self.ok else "a check FAILED"))
        return "\n".join(lines)


def _short(items: Sequence[str], n: int = 3) -> str:
    return "; ".join(items[:n]) + (f"; ... {len(items) - n} more" if len(items) > n else "")


def gather(ledger_url: str, tasks: Mapping[str, tuple[str, str]],
           services: Mapping[str, CountingService]) -> tuple[list[Check], dict[str, Any]]:
    """Run the ledger / service checks.

    Args:
        ledger_url: the ledger (read from the root namespace).
        tasks: task id -> ``(target kind, idempotency key)``.
        services: target kind -> its counting service.

    Returns:
        ``(checks, figures)``.
    """
    checks: list[Check] = []
    figures: dict[str, Any] = {}
    ids_of: dict[str, list[str]] = {}
    for tid, (target, _key) in tasks.items():
        ids_of.setdefault(target, []).append(tid)
    ledger = open_ledger(ledger_url, migrate=False, must_exist=True)
    try:
        infos = ledger.get_many(list(tasks))
        late = ledger.late_effects(None, limit=1_000_000)
        stats = ledger.stats()
    finally:
        ledger.close()
    states = Counter(i.state.value for i in infos)
    figures["states"] = dict(states)
    lost = len(tasks) - states.get("SUCCEEDED", 0)
    checks.append(Check("tasks lost", lost == 0, str(lost),
                        f"{states.get('SUCCEEDED', 0)}/{len(tasks)} SUCCEEDED; states "
                        f"{dict(states)}" if lost else ""))

    keys = {tid: key for tid, (_t, key) in tasks.items()}
    for target in ("idempotent", "fenced"):
        if target not in services:
            continue
        records = services[target].records()
        ids = ids_of.get(target, [])
        rep = check_exactly_once(ledger_url, records, task_ids=ids,
                                 keys={t: keys[t] for t in ids}, raise_on_violation=False)
        dup = sum(n - 1 for n in records.executions.values() if n > 1)
        checks.append(Check(f"duplicated executions at {target} target", dup == 0 and rep.ok,
                            str(dup), _short(rep.violations)))
        figures[f"{target}_executions"] = sum(records.executions.values())
        if target == "fenced":
            figures["fenced_stale_tokens_refused"] = len(records.rejections)

    late_by_target: Counter[str] = Counter()
    accounted_by_target: Counter[str] = Counter()
    for le in late:
        target = tasks.get(le.task_id, ("other", ""))[0]
        if le.kind == LATE_ACCOUNTED_FOR:
            accounted_by_target[target] += 1
        else:
            late_by_target[target] += 1
    figures["late_effects_possible_duplicate"] = dict(late_by_target)
    figures["late_effects_accounted_for"] = dict(accounted_by_target)
    if "lookup" in services:
        execs = services["lookup"].records().executions
        ids = ids_of.get("lookup", [])
        succeeded = {i.task_id for i in infos if i.state.value == "SUCCEEDED"}
        never = [keys[t] for t in ids if t in succeeded and not execs.get(keys[t])]
        stray = sorted(set(execs) - {keys[t] for t in ids})
        extra = sum(n - 1 for n in execs.values() if n > 1)
        recorded = late_by_target.get("lookup", 0)
        checks.append(Check(
            "late effects recorded = late executions at lookup-only target",
            recorded == extra and not never and not stray, f"{recorded} = {extra}",
            _short([f"{len(never)} succeeded key(s) never executed"] * bool(never)
                   + [f"stray keys {stray[:3]}"] * bool(stray))))
        figures["lookup_executions"] = sum(execs.values())
    others = sum(late_by_target[t] for t in ("idempotent", "fenced", "other"))
    checks.append(Check("late effects at keyed / fenced targets", others == 0, str(others)))

    consistency = check_ledger_consistent(ledger_url, task_ids=list(tasks),
                                          raise_on_violation=False)
    checks.append(Check("stale writes accepted", consistency.ok, str(len(consistency.violations)),
                        _short(consistency.violations)))
    figures["stale_rejected (audited, refused)"] = stats.stale_rejections
    return checks, figures

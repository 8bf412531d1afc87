"""Debounced submits (DESIGN §8, debounce): the submits of one (task name, debounce key)
made before the group's task is claimed collapse into that task, which takes the params
of the last one and starts ``debounce_s`` after it, no later than ``debounce_max_s`` after
the submit that opened the window (both measured on the ledger clock)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import WriteRejected
from ...serde import dumps, dumps_rows
from ..base import SubmitResult
from ..dialect import Tx
from ..rows import SUBMIT_DEBOUNCE, insert_audit

__all__ = ["submit_debounced"]


def submit_debounced(tx: Tx, rows: Sequence[Mapping[str, Any]]) -> dict[str, SubmitResult]:
    """Write the debounced rows of a submit batch in ``tx``: one upsert per group.

    Args:
        tx: the submit's transaction.
        rows: the batch's rows that carry a ``debounce_key``, in submit order, as the
            submit builds them for ``submit_insert`` (``id``, ``name``, ``params``,
            ``digest``, ``delay`` = the row's ``debounce_s`` in seconds,
            ``debounce_max_s`` in seconds, ...).

    Returns:
        Each row's result by its ``id``: the id of its group's open task, and
        ``created=True`` only for the submit whose row became that task (the first of
        the window); every later submit of the window gets ``created=False``.

    Rows of one group within the batch are folded first (the task gets the first row's
    id and settings, the last row's params and delay), then each group is inserted or
    collapsed into its open task in (name, key) order, so that two batches sharing groups
    lock them in the same order. A task already claimed (generation above 0) is no longer
    open: the group's next submit opens a new window with a new task. Every collapse is
    audited (kind ``debounced``: the key, how many submits it folded, the new start).

    Raises:
        WriteRejected: a value of a row JSON cannot hold (NaN, infinity).
    """
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["name"], row["debounce_key"]), []).append(row)
    if not groups:
        return {}
    folded = []
    for group in sorted(groups):
        first, last = groups[group][0], groups[group][-1]
        folded.append({**first, "params": last["params"], "digest": last["digest"],
                       "delay": last["delay"]})
    try:
        encoded = dumps_rows(folded)
    except ValueError as exc:
        raise WriteRejected(f"refused write 'submit_debounce': {exc}") from exc
    tasks = {(r.name, r.key): r for r in SUBMIT_DEBOUNCE.all(tx, {"rows": encoded})}
    results: dict[str, SubmitResult] = {}
    audit = []
    for group in sorted(groups):
        task = tasks[group]
        collapsed = 0
        for row in groups[group]:
            created = task.id == row["id"]
            collapsed += not created
            results[row["id"]] = SubmitResult(task.id, created=created)
        if collapsed:
            detail = dumps({"key": group[1], "collapsed": collapsed, "run_at": task.start})
            audit.append((task.id, tx.now, "debounced", task.state, task.state, 0, None,
                          detail))
    insert_audit(tx, audit)
    return results

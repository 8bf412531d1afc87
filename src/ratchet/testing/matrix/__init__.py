"""The crash-point matrix (DESIGN §6) as a library: run it against your own ledger (a SQLite
directory, a PostgreSQL server) with real ``ratchet worker`` processes, real SIGKILL and
SIGSTOP at the named fault points of :mod:`ratchet.faults`, and the counting service of
:mod:`ratchet.testing.services` as the external side that counts every execution.

* :func:`run_matrix` runs the selected rows and returns a :class:`MatrixReport` of
  :class:`RowResult` (pass / fail / skip, detail, external counts, time);
  ``ratchet crash-matrix`` is its command line;
* :data:`ROWS` and :func:`register_row`: the rows, one function each
  (:mod:`~ratchet.testing.matrix.rows_submit`, ``rows_worker``, ``rows_holder``,
  ``rows_outbox``), and how a build adds one;
* row 10 (the outbox relay) needs a broker (``run_matrix(broker=...)``): its consumers of
  RabbitMQ and NATS JetStream are in :mod:`~ratchet.testing.matrix.brokers`;
* :class:`MatrixRig` (one world: ledger, service, step log, processes),
  :class:`RowContext` (what a row's function gets) and :func:`expect` for writing a row;
* the app the workers run: ``ratchet.testing.matrix.app:app``.

The how-to page: [Prove it on your own infrastructure](../how-to/crash-matrix.md).
"""

from __future__ import annotations

from .context import BATCH_PARAMS, CHARGE_PARAMS, Control, RowContext, Worlds
from .registry import FIRST_ROW, LAST_ROW, ROWS, Row, RowFunction, parse_rows, register_row
from .rig import APP, MatrixRig, RowFailed, RowSkipped, StepRun, expect
from .runner import FAIL, PASS, SKIP, MatrixReport, RowResult, run_matrix

__all__ = [
    "APP",
    "BATCH_PARAMS",
    "CHARGE_PARAMS",
    "FAIL",
    "FIRST_ROW",
    "LAST_ROW",
    "PASS",
    "ROWS",
    "SKIP",
    "Control",
    "MatrixReport",
    "MatrixRig",
    "Row",
    "RowContext",
    "RowFailed",
    "RowSkipped",
    "RowFunction",
    "RowResult",
    "StepRun",
    "Worlds",
    "expect",
    "parse_rows",
    "register_row",
    "run_matrix",
]

"""The batch gauges of the ledger metrics on both ledgers, with a real worker:
``ratchet_ledger_batch_watermark``, ``..._batch_items_processed`` and ``..._batch_runs``
per type sum the unfinished runs of running tasks (read through
``Control.batch_activity``), and a type whose runs have all finished has no series."""

from __future__ import annotations

import pytest
from batchsupport import Gates, held, register
from prometheus_client.parser import text_string_to_metric_families

from ratchet import App, Control, State
from ratchet.control import BatchActivity
from ratchet.observe import ledger_metrics
from ratchet.observe.ledger_metrics import ledger_metrics_registry, render_ledger_metrics
from ratchet.observe.metrics import check_labels
from ratchet.testing import running_worker

pytestmark = pytest.mark.timeout(120)

GAUGES = ("ratchet_ledger_batch_watermark", "ratchet_ledger_batch_items_processed",
          "ratchet_ledger_batch_runs")


def _batch_series(control: Control) -> dict[tuple[str, str], float]:
    body, _ = render_ledger_metrics(control)
    return {(s.name, s.labels["type"]): s.value
            for family in text_string_to_metric_families(body.decode())
            for s in family.samples if s.name in GAUGES}


def test_batch_gauges_sum_the_unfinished_runs_per_type(app: App) -> None:
    gates = Gates()
    register(app, gates)
    # a: watermark 20, the batch at 30 committed above it (30 items processed);
    # b: watermark 50 (50 items); the stream (another type): watermark 30.
    a = app.submit("bt.items", {"n": 100, "size": 10, "parallel": 2, "hold": [20, 40]})
    b = app.submit("bt.items", {"n": 100, "size": 10, "hold": [50]})
    s = app.submit("bt.stream", {"n": 60, "size": 10, "hold": [30]})
    with running_worker(app, concurrency=3), Control(app.ledger_url) as control:
        try:
            held(control, a.task_id, 20, above=1)
            held(control, b.task_id, 50)
            held(control, s.task_id, 30)
            series = _batch_series(control)
            assert series == {
                ("ratchet_ledger_batch_watermark", "bt.items"): 70.0,
                ("ratchet_ledger_batch_items_processed", "bt.items"): 80.0,
                ("ratchet_ledger_batch_runs", "bt.items"): 2.0,
                ("ratchet_ledger_batch_watermark", "bt.stream"): 30.0,
                ("ratchet_ledger_batch_items_processed", "bt.stream"): 30.0,
                ("ratchet_ledger_batch_runs", "bt.stream"): 1.0,
            }
            assert sorted(control.batch_activity(), key=lambda x: x.name) == [
                BatchActivity("bt.items", 2, 70, 80), BatchActivity("bt.stream", 1, 30, 30)]
            assert check_labels(ledger_metrics_registry(control)) > 0
        finally:
            gates.release.set()
        for h in (a, b, s):
            assert app.wait(h.task_id, timeout_s=60).state is State.SUCCEEDED
        assert _batch_series(control) == {}


def test_batch_types_past_the_cap_are_summed_under_other(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ledger_metrics, "MAX_TYPE_SERIES", 3)
    rows = [BatchActivity(f"t{i}", 1, 10 * i, 10 * i + 1) for i in range(5)]
    capped = ledger_metrics._capped_activity(rows)
    assert capped == [rows[0], rows[1], BatchActivity("other", 3, 90, 93)]

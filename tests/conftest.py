"""Shared pytest configuration for every test tier.

* Ratchet reads a few environment variables (ledger URL, durability, payload limit, fault
  points). A developer's shell must not change what a test sees, so they are cleared for
  every test.
* Hypothesis runs with modest example counts and no deadline: the stateful tests drive a
  real SQLite file, whose fsync latency varies from machine to machine (and, under
  pytest-xdist, share the CPU with three other test processes).
* Under pytest-xdist (``./scripts/test`` runs the full suite on 4 workers) the ``slow``
  tests are handed out first, so no worker starts a minute-long test near the end of the
  run while the others sit idle. A run in one process keeps the collection order.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from pgsupport import private_schema

from ratchet import App, faults

BACKENDS = ["sqlite", "postgresql"]
"""Every ledger backend. Tests that take the ``backend`` or ``ledger_url`` fixture run once
per backend (the contract suite, worker tests, crash rows, takeover, the state machine)."""

RATCHET_ENV = (
    "RATCHET_LEDGER_URL",
    "RATCHET_DURABILITY",
    "RATCHET_MAX_PAYLOAD_BYTES",
    "RATCHET_CRASH_AT",
    "RATCHET_PAUSE_AT",
    "RATCHET_CRASH_SKIP",
    "RATCHET_CRASH_THREAD",
    "RATCHET_CRASH_AFTER",
    "RATCHET_TRACE",
    "RATCHET_TRACE_PARENT",
)

settings.register_profile(
    "ratchet",
    deadline=None,
    max_examples=50,
    # No example database: a failure saved by an older revision would be replayed against
    # new rules (stateful tests then report a confusing FlakyStrategyDefinition).
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ratchet")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (a worker has ``workerinput``), move ``slow`` tests to the front,
    keeping the order within each part (every worker must collect the same order)."""
    if not hasattr(config, "workerinput"):
        return
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _clean_ratchet_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No RATCHET_* variable from the outer shell leaks into a test; fault counters reset."""
    for name in RATCHET_ENV:
        monkeypatch.delenv(name, raising=False)
    faults.reset()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """The backend under test (``"sqlite"`` or ``"postgresql"``)."""
    return str(request.param)


@pytest.fixture
def ledger_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A URL of a fresh, empty store for this test: a SQLite file, or a private PostgreSQL
    schema (dropped afterwards; skipped with a message when no server is reachable, a
    failure under ``CI=true``)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path}/l.db"
        return
    if backend == "postgresql":
        with private_schema("rt_test") as (url, _schema):
            yield url
        return
    raise NotImplementedError(f"no store factory for backend {backend!r} yet")


@pytest.fixture
def app(ledger_url: str) -> Iterator[App]:
    """An :class:`App` on this test's fresh ledger (closed afterwards); tests register their
    tasks on it."""
    opened = App(ledger_url)
    yield opened
    opened.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Keep each phase's report on the item (``item.rep_call``), so a fixture can tell that
    its test failed and print the logs of the processes it started (tests/rigsupport.py)."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    setattr(item, f"rep_{report.when}", report)

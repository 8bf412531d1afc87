"""The ledger contract suite, importable: what every ledger dialect must pass (DESIGN §10).

Every test here talks to a ledger only through the :class:`~ratchet.ledger.base.Ledger`
protocol: submit and idempotency (:mod:`.submit`), claim, leases, takeover and concurrent
claimers (:mod:`.claim`), fenced commits, effects, resolution and reads (:mod:`.commit`),
retry budgets (:mod:`.budget`), ledger clock steps (:mod:`.clock`), quarantine
(:mod:`.quarantine`) and periodic schedules (:mod:`.schedules`). The suite needs pytest
(it is made of pytest test functions and fixtures) and is not imported by
:mod:`ratchet.testing` itself.

How a dialect runs it (Ratchet's own runners are ``tests/contract/test_contract_sqlite.py``
and ``tests/contract/test_contract_postgres.py``; a dialect in another tree does the same
in its own test suite)::

    # test_contract_mydb.py
    from collections.abc import Callable, Iterator

    import pytest

    from ratchet.ledger.base import Ledger
    from ratchet.testing.contract import *  # noqa: F403  (the suite's tests and fixtures)


    @pytest.fixture
    def ledger_factory(tmp_path) -> Iterator[Callable[[], Ledger]]:
        store = create_fresh_empty_store(tmp_path)       # one store per test
        yield lambda: open_my_ledger(store)              # each call: a new Ledger object
        drop_store(store)

The one fixture the runner provides is ``ledger_factory``: a zero-argument callable (see
:data:`~ratchet.testing.contract.fixtures.LedgerFactory`) whose every call opens another,
independent, migrated :class:`~ratchet.ledger.base.Ledger` object on the *same* fresh,
empty store of this test (as another process would: the concurrency tests open several).
The suite closes every object it opened at the end of the test; the runner's fixture
removes the store afterwards. ``import *`` brings every ``test_*`` function and the
suite's fixtures (``ledger``, ``open_store``, ``make_task``, ``sleep_until``) into the
runner's module, where pytest collects them. A dialect is done when the whole suite passes
with the ledger engine unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import budget, claim, clock, commit, quarantine, schedules, submit
from .fixtures import LedgerFactory, ledger, make_task, open_store, sleep_until

SUITE: tuple[ModuleType, ...] = (submit, claim, commit, budget, clock, quarantine,
                                  schedules)
"""The modules of the suite, in the order their tests run."""


def _tests(modules: tuple[ModuleType, ...]) -> dict[str, Callable[..., Any]]:
    """Every ``test_*`` function of ``modules``, by name.

    Raises:
        RuntimeError: two modules define a test of the same name (one would hide the other
            in a runner's namespace).
    """
    found: dict[str, Callable[..., Any]] = {}
    for module in modules:
        for name, obj in vars(module).items():
            if name.startswith("test_") and callable(obj):
                if name in found:
                    raise RuntimeError(f"contract test {name} is defined twice ({module.__name__})")
                found[name] = obj
    return found


TESTS = _tests(SUITE)
"""Every test function of the suite, by name."""

globals().update(TESTS)

__all__ = [  # what ``import *`` gives a runner: the fixtures and every test
    "LedgerFactory",
    "ledger",
    "make_task",
    "open_store",
    "sleep_until",
    *TESTS,
]

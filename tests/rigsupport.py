"""What the process-level suites (tests/crash, tests/workflows, tests/batches,
tests/pg_faults, tests/takeover) share around their rigs: whether a test failed (each
phase's report is kept on the item by the hook in tests/conftest.py), and a rig cleaned up
after its test with its processes' logs printed when the test failed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar

import pytest

__all__ = ["rig_session", "test_failed"]


class _Rig(Protocol):
    def cleanup(self) -> None: ...

    def dump(self) -> str: ...


R = TypeVar("R", bound=_Rig)


def test_failed(request: pytest.FixtureRequest) -> bool:
    """True when the requesting test's setup or call failed."""
    return any(getattr(getattr(request.node, f"rep_{when}", None), "failed", False)
               for when in ("setup", "call"))


test_failed.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


@contextmanager
def rig_session(request: pytest.FixtureRequest, rig: R) -> Iterator[R]:
    """Yield ``rig``; afterwards kill what it started (``cleanup``) and, when the test
    failed, print every process log it kept (``dump``)."""
    try:
        yield rig
    finally:
        try:
            rig.cleanup()
        finally:
            if test_failed(request):
                print(rig.dump())

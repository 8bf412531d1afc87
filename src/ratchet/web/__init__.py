"""The HTTP faces of Ratchet: a JSON API (:mod:`ratchet.web.api`), a server-rendered
dashboard (:mod:`ratchet.web.dashboard`) and Prometheus metrics, served by one stateless
process (``ratchet serve``; several replicas may run against one ledger).

Every route calls the public :class:`~ratchet.control.Control` API; nothing here opens
the ledger or reaches into worker internals.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .settings import WebSettings

if TYPE_CHECKING:
    from .app import create_app

__all__ = ["WebSettings", "create_app"]


def __getattr__(name: str) -> Any:
    """``create_app`` is loaded on first use: FastAPI and the API models cost about a
    quarter of a second, which every ``ratchet`` command (and every worker start) would
    pay for the settings alone (``tests/test_structure.py`` lists this late import)."""
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

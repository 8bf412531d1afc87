"""The HTTP faces of Ratchet: a JSON API (:mod:`ratchet.web.api`), a server-rendered
dashboard (:mod:`ratchet.web.dashboard`) and Prometheus metrics, served by one stateless
process (``ratchet serve``; several replicas may run against one ledger).

Every route calls the public :class:`~ratchet.control.Control` API; nothing here opens
the ledger or reaches into worker internals.
"""

from .app import create_app
from .settings import WebSettings

__all__ = ["WebSettings", "create_app"]

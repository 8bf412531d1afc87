"""A Django test runner that closes Ratchet's connections before the test databases are
dropped: ``TEST_RUNNER = "ratchet.contrib.django.testing.RatchetTestRunner"``."""

from __future__ import annotations

from typing import Any

from django.test.runner import DiscoverRunner

from . import close

__all__ = ["RatchetTestRunner"]


class RatchetTestRunner(DiscoverRunner):
    """:class:`django.test.runner.DiscoverRunner` that calls
    :func:`ratchet.contrib.django.close` before tearing the databases down (PostgreSQL
    refuses to drop a database with open sessions; the ledger's pool holds some)."""

    def teardown_databases(self, old_config: Any, **kwargs: Any) -> None:
        """Close Ratchet's connections, then drop the test databases."""
        close()
        super().teardown_databases(old_config, **kwargs)

"""``manage.py ratchet_worker``: a Ratchet worker for the project's App, with Django set up
(settings, apps, database connections) for the task bodies."""

from __future__ import annotations

import sys
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from ratchet import ConfigError, InvalidArguments, LedgerUnavailable, Worker
from ratchet.config import redact_url
from ratchet.contrib.django import CloseOldConnections, get_app


def _names(raw: str | None) -> list[str] | None:
    return None if raw is None else [n.strip() for n in raw.split(",") if n.strip()]


class Command(BaseCommand):
    """Run a worker until SIGTERM or Ctrl-C (graceful stop, as ``ratchet worker``).

    Exit status: 0 stopped cleanly, 3 leases handed back (grace ended or second signal),
    4 stopped at the stuck-thread limit, 1 a Ratchet error (printed on one line).
    """

    help = ("Run a Ratchet worker for RATCHET['APP'] on the project's ledger. SIGTERM or "
            "Ctrl-C stops it gracefully.")

    def add_arguments(self, parser: ArgumentParser) -> None:
        """The options of ``ratchet worker`` most deployments set."""
        parser.add_argument("--concurrency", "-c", type=int, default=8, metavar="N",
                            help="Tasks run at the same time (threads; default 8).")
        parser.add_argument("--queues", metavar="Q1,Q2", default=None,
                            help="Serve only these named queues (default: every queue).")
        parser.add_argument("--names", metavar="NAME,...", default=None,
                            help="Task names to run (default: all registered).")
        parser.add_argument("--shutdown-grace-s", type=float, default=25.0, metavar="SECONDS",
                            help="After SIGTERM, how long running tasks get to reach a step "
                            "boundary before their leases are handed back (default 25).")
        parser.add_argument("--no-scheduler", action="store_true",
                            help="Do not fire the app's periodic tasks from this worker.")

    def handle(self, *args: Any, **options: Any) -> None:
        """Build the :class:`ratchet.Worker`, install its signal handlers and run it."""
        try:
            app = get_app()
            worker = Worker(
                app,
                concurrency=options["concurrency"],
                names=_names(options["names"]),
                queues=_names(options["queues"]),
                shutdown_grace_s=options["shutdown_grace_s"],
                scheduler=not options["no_scheduler"],
                middleware=[CloseOldConnections()],
                stop_descendants=True,
            )
            worker.install_signal_handlers()
            self.stdout.write(
                f"ratchet worker {worker.holder}: tasks "
                f"{', '.join(f'{n} v{v}' for n, v in worker.kinds)}, concurrency "
                f"{options['concurrency']}, ledger {redact_url(app.ledger.config.url)}")
            self.stdout.flush()
            stats = worker.run()
        except (ConfigError, InvalidArguments, LedgerUnavailable) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(f"ratchet worker {worker.holder} stopped: {stats}")
        self.stdout.flush()
        if worker.exit_code:
            sys.exit(worker.exit_code)

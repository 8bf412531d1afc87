"""The ``ratchet demo`` main job: a faulty payment service, a billing app, a chaos runner.

* :mod:`ratchet.demo.payments` — a fake payment API: :mod:`ratchet.testing`'s counting
  service (its own process, real HTTP on loopback, its own SQLite file counting every
  execution, fault injection) with charges as its executions;
* :mod:`ratchet.demo.billing` — the demo's Ratchet app (``billing.charge``);
* :mod:`ratchet.demo.runner` — :func:`~ratchet.demo.runner.run_demo`: submits the work,
  runs worker processes, kills and pauses them (:class:`ratchet.testing.ProcessGroup`),
  and checks the result at the external side (:func:`ratchet.testing.check_exactly_once`).
"""

from __future__ import annotations

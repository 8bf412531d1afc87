"""The ``ratchet demo`` main job: a faulty payment service, a billing app, a chaos runner.

* :mod:`ratchet.demo.payments` — a fake payment API in its own process (real HTTP on
  loopback, its own SQLite file counting every execution), with fault injection;
* :mod:`ratchet.demo.billing` — the demo's Ratchet app (``billing.charge``);
* :mod:`ratchet.demo.runner` — :func:`~ratchet.demo.runner.run_demo`: submits the work,
  runs worker processes, kills and pauses them, and checks the result at the external side.
"""

from __future__ import annotations

"""The ``ratchet demo`` main job: four faulty payment services, a billing app, an order
workflow against a warehouse, a chaos runner.

* :mod:`ratchet.demo.payments` — a fake payment API: :mod:`ratchet.testing`'s counting
  service (its own process, real HTTP on loopback, its own SQLite file counting every
  execution, fault injection) with charges as its executions, in one of four kinds of
  target (:data:`~ratchet.demo.payments.KINDS`: honours the idempotency key, checks
  fencing tokens, answers lookups only, neither);
* :mod:`ratchet.demo.billing` — the demo's Ratchet app, one task per kind of target
  (:data:`~ratchet.demo.billing.TASKS`, ``billing.charge`` for the idempotent one);
* :mod:`ratchet.demo.warehouse` — the order workflow's warehouse: a counting service of
  reservations and releases whose shipper sends the ``shipped`` event for most reserved
  orders, a few seconds late, and never for some;
* :mod:`ratchet.demo.orders` — the order workflow (``order.fulfil``, on the billing app):
  reserve, charge (with a refund as its compensation), wait for ``shipped``; compensated
  when the wait times out;
* :mod:`ratchet.demo.runner` — :func:`~ratchet.demo.runner.run_demo`: submits the work,
  runs worker processes, kills them, freezes one sender per kind mid-call past its lease
  (:class:`ratchet.testing.ProcessGroup`), and checks each kind's guarantee at its service
  (:func:`ratchet.testing.check_exactly_once`, late effects through :class:`ratchet.Control`);
  its parts: :mod:`~ratchet.demo.settings` (knobs, the task and guarantee of each kind),
  :mod:`~ratchet.demo.prepare` (work dir, PostgreSQL schema), :mod:`~ratchet.demo.state`
  (what the parts of a run share), :mod:`~ratchet.demo.chaos` (kills, frozen senders),
  :mod:`~ratchet.demo.judging` (the verdict; :mod:`~ratchet.demo.order_judging` for the
  order workflows) and :mod:`~ratchet.demo.display` (progress
  and report).
"""

from __future__ import annotations

"""The parts of ``bench/soak.py``, the chaos soak (bench/README.md, "Chaos soak"):

* :mod:`.netns` — two network namespaces with veth pairs, and their teardown;
* :mod:`.forward` — the TCP forwarder (root namespace, veth address -> loopback);
* :mod:`.soakapp` — the app the ``ratchet worker`` subprocesses run;
* :mod:`.cluster` — a throw-away PostgreSQL cluster, or the shared server;
* :mod:`.faults` — the fault schedule run during the drain;
* :mod:`.outbox` — relays and the RabbitMQ consumer (once ``ctx.emit`` exists);
* :mod:`.report` — the checks and the printed / JSON report.
"""

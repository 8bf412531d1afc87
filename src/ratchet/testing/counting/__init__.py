"""The counting external service, one module per job; its public face is
:mod:`ratchet.testing.services` (which re-exports every name and documents the HTTP API).

* :mod:`.protocol` — what both sides of the wire agree on: headers, error strings, the
  ``Retry-After`` of a 503, :class:`~.protocol.FaultSettings`, :class:`~.protocol.ServiceError`;
* :mod:`.records` — the service's SQLite file read from outside (the external truth of a test);
* :mod:`.store` — the service's state inside its process: the file, faults, fencing;
* :mod:`.server` — the HTTP handler over the store and the process entry point (``main``);
* :mod:`.process` — spawning the service and the handle of a running one;
* :mod:`.client` — the httpx client a task uses to call the service.
"""

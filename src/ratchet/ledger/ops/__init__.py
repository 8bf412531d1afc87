"""The ledger engine's concerns, one module each (DESIGN §10).

:class:`~ratchet.ledger.engine.LedgerEngine` composes them; each works over the
:class:`~ratchet.ledger.ops.core.EngineCore` they share (the dialect, the parsed URL, the
schema gate, the ledger clock's watch) and names statements of the dialect's catalogue
(``ledger/sql/<dialect>.sql``), never SQL text:

* :mod:`.core`: the shared parts; :mod:`.schema`: which migrations a ledger has;
* :mod:`.submit`: submit and its dedupe;
* :mod:`.claims`: claims, takeovers, bulkheads at claim time; :mod:`.retire`: a delivery
  whose holder is gone (retirement, crash quarantine, operator requests applied);
  :mod:`.renew`: lease renewal;
* :mod:`.commit`: fenced commits (arbitration, failure streaks, retry budgets) and
  :mod:`.segment`, the rows one commit segment writes; :mod:`.steps`: transaction steps;
* :mod:`.commands`: cancel, retry, resolve, revoke; :mod:`.pauses`: pause and resume;
  :mod:`.quarantine`: quarantine list and replay; :mod:`.limits`: concurrency limits;
* :mod:`.reads`: tasks and timelines; :mod:`.stats`: ``ratchet status`` aggregates;
  :mod:`.counts`: the counts rollup behind them; :mod:`.retention`: prune and export;
* :mod:`.late_effects`: late effects and reconciliation; :mod:`.registry`: workers and
  task definitions.
"""

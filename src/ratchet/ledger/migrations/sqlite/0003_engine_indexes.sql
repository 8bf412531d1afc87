-- Ratchet ledger, schema version 3 (SQLite): indexes designed for the engine's statements,
-- so that no statement needs to steer the planner (the claim used "+name").
--
-- * tasks_leased and tasks_holder hold exactly the RUNNING rows, keyed on columns that are
--   NULL in every other state (every move out of RUNNING clears holder and lease_until).
--   A fenced transition ("... AND state = 'RUNNING'") no longer matches their predicate, so
--   it probes the primary key; the expired-lease scan and revocation still use them.
-- * tasks_name_state is dropped: the claim ("name IN (...) AND state IN (...)") preferred it
--   and sorted the whole backlog on every claim instead of walking tasks_ready (run_at
--   order, claimable rows only). ratchet status counts by a table scan instead.

DROP INDEX tasks_leased;
CREATE INDEX tasks_leased ON tasks (lease_until) WHERE lease_until IS NOT NULL;
DROP INDEX tasks_holder;
CREATE INDEX tasks_holder ON tasks (holder) WHERE holder IS NOT NULL;
DROP INDEX tasks_name_state;

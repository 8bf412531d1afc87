-- Ratchet ledger, schema version 2 (PostgreSQL): indexes designed for the engine's
-- statements, so that no statement needs to steer the planner.
--
-- * tasks_leased and tasks_holder hold exactly the RUNNING rows, keyed on columns that are
--   NULL in every other state (every move out of RUNNING clears holder and lease_until).
--   The fenced transition of a completion batch ("... AND state = 'RUNNING'") no longer
--   matches their predicate, so it cannot scan them (it used to hash-join every running
--   task once statistics existed; the statement wrote "state || ''" to avoid that); the
--   expired-lease scan and revocation still use them.
-- * tasks_ready is keyed on (name, run_at): the claim walks it in run_at order once per
--   claimed name (name = equality, then LIMIT), an index scan with or without statistics.
--   With (run_at, name) and "name = ANY(...)", the planner without statistics fetched the
--   whole ready set and sorted it on every claim (the claims ran with enable_sort off).
-- * tasks_name_state is dropped: the claim's other candidate for a bitmap scan plus sort.
--   ratchet status counts by a table scan instead.

DROP INDEX tasks_leased;
CREATE INDEX tasks_leased ON tasks (lease_until) WHERE lease_until IS NOT NULL;
DROP INDEX tasks_holder;
CREATE INDEX tasks_holder ON tasks (holder) WHERE holder IS NOT NULL;
DROP INDEX tasks_name_state;
DROP INDEX tasks_ready;
CREATE INDEX tasks_ready ON tasks (name, run_at) WHERE state IN ('PENDING', 'RETRY_WAIT');

-- Ratchet ledger, schema version 4 (PostgreSQL): operator control requests (issue 10:
-- cancel, pause; DESIGN §3, §8). Additive only: processes of the previous release never
-- read or write the new column, and the new index is partial on it.
--
-- * tasks.control_request: an operator's request to a RUNNING task's holder ('cancel' or
--   'pause'), applied by the holder at its next step/effect boundary with a fenced
--   transition, by the ledger when the lease expires or the holder is revoked, or (with an
--   effect intent still open) by the next holder once a lookup settled it. NULL otherwise.
-- * tasks_control: the rows with a request, by holder: a worker's heartbeat reads the
--   requests for the leases it holds (one probe of this small index, every 0.5 s, and at
--   once on a NOTIFY).

ALTER TABLE tasks ADD COLUMN control_request text;
CREATE INDEX tasks_control ON tasks (holder) WHERE control_request IS NOT NULL;

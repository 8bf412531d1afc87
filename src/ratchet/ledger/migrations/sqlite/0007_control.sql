-- Ratchet ledger, schema version 7 (SQLite): operator control requests (cancel,
-- pause; DESIGN §3, §8). Additive only: processes of the previous release never read or
-- write the new column and table, and the new index is partial.
--
-- * tasks.control_request: an operator's request to a RUNNING task's holder ('cancel' or
--   'pause'), applied by the holder at its next step/effect boundary with a fenced
--   transition, by the ledger when the lease expires or the holder is revoked, or (with an
--   effect intent still open) by the next holder once a lookup settled it. NULL otherwise.
-- * pauses: one versioned, audited record per pause (scope 'all' / 'type' / 'task',
--   target '' / the task type / the task id; version: the ledger's control version when it
--   was made; who, why, when; and who resumed it, why, when, at which version). Active while
--   resumed_at IS NULL. Every claim reads the active ones (PostgreSQL: under a shared
--   advisory lock that a pause takes exclusively), so no attempt starts in a paused scope.
-- * tasks_paused: PAUSED tasks by type, for resume.
-- The heartbeat's read of the requests on a worker's leases walks tasks_holder (the
-- worker's own RUNNING rows) and the few active pauses; no index of its own.

ALTER TABLE tasks ADD COLUMN control_request TEXT;

CREATE TABLE pauses (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    scope           TEXT NOT NULL,
    target          TEXT NOT NULL,
    version         INTEGER NOT NULL,
    paused_by       TEXT NOT NULL,
    reason          TEXT NOT NULL,
    created_at      REAL NOT NULL,
    resumed_at      REAL,
    resumed_by      TEXT,
    resume_reason   TEXT,
    resumed_version INTEGER
);
CREATE INDEX pauses_active ON pauses (scope, target) WHERE resumed_at IS NULL;
CREATE INDEX tasks_paused ON tasks (name) WHERE state = 'PAUSED';

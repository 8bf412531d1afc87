-- Ratchet ledger (SQLite): bulkheads (DESIGN §8). Additive only: processes of the previous
-- release keep working (they name no new column; their tasks get tenant NULL, and their
-- claims ignore the limits, so run every worker on this release before setting a limit).
--
-- * tasks.tenant: the value the submitter set (App.submit(..., tenant=...)), NULL if none.
-- * limits: cluster-wide concurrency limits, one row per scope: 'total' (name ''; the
--   cluster's number of slots in maximum), 'type' (a task name) or 'tenant'. reserved:
--   slots of the total kept for the scope while it has ready work; maximum: at most this
--   many RUNNING tasks of the scope (NULL: no cap). Set through ratchet.Control / `ratchet
--   limits set`, audited; version counts the changes of the row.

ALTER TABLE tasks ADD COLUMN tenant TEXT;

CREATE TABLE limits (
    scope      TEXT NOT NULL,
    name       TEXT NOT NULL,
    reserved   INTEGER NOT NULL,
    maximum    INTEGER,
    version    INTEGER NOT NULL,
    updated_at REAL NOT NULL,
    updated_by TEXT NOT NULL,
    reason     TEXT NOT NULL,
    PRIMARY KEY (scope, name)
) WITHOUT ROWID;

-- Ratchet ledger, schema version 2 (SQLite): the worker registry, for fast takeover of the
-- leases of a worker whose process is gone (same host only).

CREATE TABLE workers (
    holder     TEXT PRIMARY KEY,
    host_id    TEXT NOT NULL,
    hostname   TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    pid_start  TEXT,
    started_at REAL NOT NULL,
    last_seen  REAL NOT NULL,
    state      TEXT NOT NULL DEFAULT 'alive'
) WITHOUT ROWID;
CREATE INDEX workers_host ON workers (host_id, state);
CREATE INDEX tasks_holder ON tasks (holder) WHERE state = 'RUNNING';

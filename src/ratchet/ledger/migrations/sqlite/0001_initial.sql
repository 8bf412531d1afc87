-- Ratchet ledger, schema version 1 (SQLite).
-- Times are ledger-clock epoch seconds (REAL). JSON is stored as TEXT.

CREATE TABLE tasks (
    id              TEXT PRIMARY KEY,
    name            TEXT NOT NULL,
    version         INTEGER NOT NULL,
    params          TEXT NOT NULL,
    params_digest   TEXT NOT NULL,
    idempotency_key TEXT UNIQUE,
    state           TEXT NOT NULL,
    generation      INTEGER NOT NULL DEFAULT 0,
    attempt         INTEGER NOT NULL DEFAULT 0,
    max_attempts    INTEGER NOT NULL,
    lease_s         REAL NOT NULL,
    holder          TEXT,
    lease_until     REAL,
    run_at          REAL NOT NULL,
    created_at      REAL NOT NULL,
    updated_at      REAL NOT NULL,
    result          TEXT,
    last_error      TEXT,
    error_class     TEXT
) WITHOUT ROWID;

-- The ready set: only claimable rows are in the index, so terminal rows cost nothing.
CREATE INDEX tasks_ready ON tasks (run_at) WHERE state IN ('PENDING', 'RETRY_WAIT');
-- Expired-lease scan for takeover.
CREATE INDEX tasks_leased ON tasks (lease_until) WHERE state = 'RUNNING';
CREATE INDEX tasks_name_state ON tasks (name, state);

CREATE TABLE steps (
    task_id      TEXT NOT NULL,
    name         TEXT NOT NULL,
    result       TEXT NOT NULL,
    generation   INTEGER NOT NULL,
    committed_at REAL NOT NULL,
    PRIMARY KEY (task_id, name)
) WITHOUT ROWID;

CREATE TABLE effects (
    task_id       TEXT NOT NULL,
    name          TEXT NOT NULL,
    key           TEXT NOT NULL,
    params_digest TEXT NOT NULL,
    state         TEXT NOT NULL,
    result        TEXT,
    generation    INTEGER NOT NULL,
    attempt       INTEGER NOT NULL,
    calls         INTEGER NOT NULL DEFAULT 0,
    via_lookup    INTEGER NOT NULL DEFAULT 0,
    updated_at    REAL NOT NULL,
    PRIMARY KEY (task_id, name)
) WITHOUT ROWID;

CREATE TABLE audit (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id    TEXT NOT NULL,
    at         REAL NOT NULL,
    kind       TEXT NOT NULL,
    from_state TEXT,
    to_state   TEXT,
    generation INTEGER,
    holder     TEXT,
    detail     TEXT
);
CREATE INDEX audit_task ON audit (task_id, seq);
CREATE INDEX audit_kind ON audit (kind);

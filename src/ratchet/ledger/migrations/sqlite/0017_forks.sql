-- Ratchet ledger (SQLite): forks of a task from a step (DESIGN §8, fork). Additive only.
-- The same table as on PostgreSQL (see its 0017_forks.sql).

CREATE TABLE forks (
    task_id        TEXT PRIMARY KEY,
    source_id      TEXT NOT NULL,
    from_step      TEXT NOT NULL,
    from_seq       INTEGER NOT NULL,
    source_version INTEGER NOT NULL,
    version        INTEGER NOT NULL,
    created_at     REAL NOT NULL,
    by             TEXT NOT NULL,
    reason         TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX forks_source ON forks (source_id, created_at);

-- Ratchet ledger (SQLite): the transactional outbox (DESIGN §6, row 10). Additive only.
-- The same tables as on PostgreSQL (see its 0016_outbox.sql). One writer at a time: `id`
-- (AUTOINCREMENT, never reused after a prune) is the commit order, per key too; the
-- outbox_keys upsert an emit makes first is kept for the same statements on both.

CREATE TABLE outbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id  TEXT NOT NULL UNIQUE,
    topic       TEXT NOT NULL,
    key         TEXT,
    part        INTEGER NOT NULL,
    payload     TEXT NOT NULL,
    headers     TEXT,
    task_id     TEXT,
    created_at  REAL NOT NULL,
    sent_at     REAL,
    attempts    INTEGER NOT NULL DEFAULT 0,
    last_error  TEXT,
    sent_by     TEXT
);
CREATE INDEX outbox_unsent ON outbox (part, id) WHERE sent_at IS NULL;
CREATE INDEX outbox_sent ON outbox (sent_at) WHERE sent_at IS NOT NULL;

CREATE TABLE outbox_keys (
    key TEXT PRIMARY KEY
) WITHOUT ROWID;

CREATE TABLE outbox_leases (
    part        INTEGER PRIMARY KEY,
    holder      TEXT,
    generation  INTEGER NOT NULL DEFAULT 0,
    lease_until REAL
);
WITH RECURSIVE parts(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM parts WHERE n < 31)
INSERT INTO outbox_leases (part) SELECT n FROM parts;

-- Ratchet ledger, schema version 8 (SQLite): retry governance (DESIGN §7). Additive only:
-- processes of the previous release name none of these columns; the tasks they submit have
-- quarantine_after NULL and are never quarantined.
--
-- * tasks.quarantine_after: RetryPolicy.quarantine_after at submit (NULL: never).
-- * tasks.fingerprint / fingerprint_count: the last recorded failure's error fingerprint
--   and how many failures in a row had it; crash_count: deliveries whose worker died
--   (lease expiry, revocation). Counted by the engine in the failure's own transaction.
-- * tasks.quarantined (0/1) and quarantined_at: a FAILED task taken out of the retry path
--   (never redelivered automatically; replayed by an operator).

ALTER TABLE tasks ADD COLUMN quarantine_after INTEGER;
ALTER TABLE tasks ADD COLUMN fingerprint TEXT;
ALTER TABLE tasks ADD COLUMN fingerprint_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN crash_count INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN quarantined INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN quarantined_at REAL;

-- ratchet quarantine list / replay: only quarantined rows are in the index.
CREATE INDEX tasks_quarantine ON tasks (fingerprint, quarantined_at) WHERE quarantined = 1;

-- Retry budgets: calls counted and retries reserved per budget ("type:<task>",
-- "downstream:<name>"), 1 s bucket (epoch second) and worker, so a worker's commits update
-- only rows of their own.
CREATE TABLE budget_counts (
    budget  TEXT NOT NULL,
    bucket  INTEGER NOT NULL,
    holder  TEXT NOT NULL,
    calls   INTEGER NOT NULL DEFAULT 0,
    retries INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (budget, bucket, holder)
) WITHOUT ROWID;

-- Ratchet ledger, schema version 7 (PostgreSQL): retry governance (DESIGN §7). Additive
-- only: processes of the previous release name none of these columns; the tasks they
-- submit have quarantine_after NULL and are never quarantined.
--
-- * tasks.quarantine_after: RetryPolicy.quarantine_after at submit (NULL: never).
-- * tasks.fingerprint / fingerprint_count: the last recorded failure's error fingerprint
--   and how many failures in a row had it; crash_count: deliveries whose worker died
--   (lease expiry, revocation). Counted by the engine in the failure's own transaction.
-- * tasks.quarantined and quarantined_at: a FAILED task taken out of the retry path
--   (never redelivered automatically; replayed by an operator).

ALTER TABLE tasks ADD COLUMN quarantine_after integer;
ALTER TABLE tasks ADD COLUMN fingerprint text;
ALTER TABLE tasks ADD COLUMN fingerprint_count integer NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN crash_count integer NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN quarantined boolean NOT NULL DEFAULT false;
ALTER TABLE tasks ADD COLUMN quarantined_at double precision;

-- ratchet quarantine list / replay: only quarantined rows are in the index.
CREATE INDEX tasks_quarantine ON tasks (fingerprint, quarantined_at) WHERE quarantined;

-- Retry budgets: calls counted and retries reserved per budget ("type:<task>",
-- "downstream:<name>"), 1 s bucket (epoch second) and worker, so a worker's commits update
-- only rows of their own (no row lock shared between workers).
CREATE TABLE budget_counts (
    budget  text NOT NULL,
    bucket  bigint NOT NULL,
    holder  text NOT NULL,
    calls   integer NOT NULL DEFAULT 0,
    retries integer NOT NULL DEFAULT 0,
    PRIMARY KEY (budget, bucket, holder)
);

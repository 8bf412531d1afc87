-- Ratchet ledger (SQLite): long work in batches (DESIGN §6 row 9, the contiguous
-- watermark). Additive only: processes of the previous release name no new table.
--
-- * batch_runs: one row per ctx.batches run of a task (run = the checkpoint's stored name,
--   e.g. 'ratchet:batches:import'). watermark: every item position below it is committed;
--   above: the committed batches past it, a JSON list of [start, end] pairs (bounded by the
--   worker's window); succeeded / failed / skipped: item counts of the committed batches;
--   batches: how many committed; total: the item count when known; done: 1 once the source
--   was exhausted and every batch committed. Written only inside a fenced commit of the
--   task's holder (the task row's generation checked in the same transaction).
CREATE TABLE batch_runs (
    task_id    TEXT NOT NULL,
    run        TEXT NOT NULL,
    watermark  INTEGER NOT NULL DEFAULT 0,
    above      TEXT NOT NULL DEFAULT '[]',
    succeeded  INTEGER NOT NULL DEFAULT 0,
    failed     INTEGER NOT NULL DEFAULT 0,
    skipped    INTEGER NOT NULL DEFAULT 0,
    batches    INTEGER NOT NULL DEFAULT 0,
    total      INTEGER,
    done       INTEGER NOT NULL DEFAULT 0,
    started_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    generation INTEGER NOT NULL,
    PRIMARY KEY (task_id, run)
) WITHOUT ROWID;

-- Ratchet ledger (PostgreSQL): long work in batches (DESIGN §6 row 9, the contiguous
-- watermark). Additive only: processes of the previous release name no new table.
--
-- * batch_runs: one row per ctx.batches run of a task (run = the checkpoint's stored name,
--   e.g. 'ratchet:batches:import'). watermark: every item position below it is committed;
--   above: the committed batches past it, a JSON list of [start, end] pairs (bounded by the
--   worker's window); succeeded / failed / skipped: item counts of the committed batches;
--   batches: how many committed; total: the item count when known; done: true once the
--   source was exhausted and every batch committed. Written only inside a fenced commit of
--   the task's holder (the task row locked and its generation checked in the same
--   transaction).
CREATE TABLE batch_runs (
    task_id    text NOT NULL,
    run        text NOT NULL,
    watermark  bigint NOT NULL DEFAULT 0,
    above      text NOT NULL DEFAULT '[]',
    succeeded  bigint NOT NULL DEFAULT 0,
    failed     bigint NOT NULL DEFAULT 0,
    skipped    bigint NOT NULL DEFAULT 0,
    batches    bigint NOT NULL DEFAULT 0,
    total      bigint,
    done       boolean NOT NULL DEFAULT false,
    started_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    generation bigint NOT NULL,
    PRIMARY KEY (task_id, run)
);

-- effects_name_bytes: effects made inside a ctx.batches function are named
-- 'ratchet:batch:<run>@<20-digit position>/<effect>'. A resume reads those at or past the
-- watermark (batch_effects) and a claim reads every effect but those (claim_effects): both
-- are ranges of names compared bytewise (COLLATE "C"), which the primary key, sorted by
-- the database's collation, cannot serve; without this index both read every effect row of
-- the task, one per finished batch. (SQLite's primary key compares bytewise already.)
CREATE INDEX effects_name_bytes ON effects (task_id, name COLLATE "C");

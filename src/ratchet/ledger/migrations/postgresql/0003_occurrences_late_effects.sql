-- Ratchet ledger, schema version 3 (PostgreSQL): checkpoint positions and late effects
-- (DESIGN §5). Additive only, so processes of the previous release keep working while a
-- rolling upgrade runs (their statements name no new column and no new constraint).
--
-- * steps.seq and effects.seq: the checkpoint's position in the task's code path (0-based,
--   counting steps and effects together). A replay compares the calls it makes with the
--   recorded order and stops with a non-determinism error on a difference. NULL for rows
--   written by a release that did not record it (matched by name only).
-- * late_effects: append-only record of calls sent by a holder whose lease had already
--   been taken over (a frozen sender). No fence rejects these rows: they are the evidence
--   of a possible duplicate at a target that cannot deduplicate.

ALTER TABLE steps ADD COLUMN seq integer;
ALTER TABLE effects ADD COLUMN seq integer;

CREATE TABLE late_effects (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id    text NOT NULL,
    effect     text NOT NULL,
    key        text NOT NULL,
    generation bigint NOT NULL,
    holder     text NOT NULL,
    at         double precision NOT NULL,
    outcome    text NOT NULL,
    detail     text
);
CREATE INDEX late_effects_task ON late_effects (task_id, seq);

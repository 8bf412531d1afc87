-- Ratchet ledger, schema version 4 (SQLite): checkpoint positions and late effects
-- (DESIGN §5). Additive only (see the PostgreSQL migration 0003 for the reasons).
--
-- * steps.seq and effects.seq: the checkpoint's position in the task's code path.
-- * late_effects: append-only record of calls sent by a holder whose lease had already
--   been taken over (a frozen sender); no fence rejects these rows.

ALTER TABLE steps ADD COLUMN seq INTEGER;
ALTER TABLE effects ADD COLUMN seq INTEGER;

CREATE TABLE late_effects (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    task_id    TEXT NOT NULL,
    effect     TEXT NOT NULL,
    key        TEXT NOT NULL,
    generation INTEGER NOT NULL,
    holder     TEXT NOT NULL,
    at         REAL NOT NULL,
    outcome    TEXT NOT NULL,
    detail     TEXT
);
CREATE INDEX late_effects_task ON late_effects (task_id, seq);

-- Ratchet ledger (PostgreSQL): periodic schedules (DESIGN §8, periodic tasks). Additive
-- only: processes of the previous release name no new table.
--
-- * schedules: one row per schedule name, written by the schedulers of the workers whose
--   code has it. cursor_at (epoch seconds, whole): every tick at or before it is decided,
--   submitted (fired, last_fired_at) or recorded as missed (missed, last_missed_at,
--   last_missed_reason); a scheduler moves it with a compare-and-set read back through
--   RETURNING. registered_at / registered_by: the last scheduler start that had it;
--   seen_at / seen_by: the last time a running scheduler with it in its code said so (a
--   schedule removed from the code stops being seen).

CREATE TABLE schedules (
    name                text PRIMARY KEY,
    task                text NOT NULL,
    spec                text NOT NULL,
    tz                  text NOT NULL,
    misfire_grace_s     double precision NOT NULL,
    cursor_at           bigint NOT NULL,
    last_fired_at       bigint,
    fired               bigint NOT NULL DEFAULT 0,
    missed              bigint NOT NULL DEFAULT 0,
    last_missed_at      bigint,
    last_missed_reason  text,
    first_registered_at double precision NOT NULL,
    registered_at       double precision NOT NULL,
    registered_by       text NOT NULL,
    seen_at             double precision NOT NULL,
    seen_by             text NOT NULL
);

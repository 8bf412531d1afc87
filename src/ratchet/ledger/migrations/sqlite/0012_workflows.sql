-- Ratchet ledger (SQLite): workflows (DESIGN §3, waits; §5, compensation). Additive only:
-- processes of the previous release keep working (they name no new column or table; a task
-- of theirs never waits, has no parent and never compensates).
--
-- * tasks.parent_id: the task that submitted this one with ctx.submit (NULL otherwise).
-- * tasks.awaited: 1 while the parent waits for this child in ctx.gather / ctx.wait (set
--   by the parent's wait, cleared when the child ends and is counted).
-- * tasks.wait_kind / wait_name / wait_key / wait_step / wait_seq / wait_after /
--   wait_count: what a WAITING task waits for ('sleep', 'event', 'children'); for an
--   event its (name, key), the checkpoint a delivery is written into (its stored name and
--   position) and the last event of that (name, key) it already received; for children
--   how many it still waits for.
-- * events: the mailbox. One row per event id (a re-send of an id is the same event); seq
--   orders the events of one (name, key).
-- * tasks_waiting: parked rows (WAITING, COMPENSATING) by run_at, for the claim's wake-up
--   of those due; tasks_wait_event: WAITING rows by (event name, key), for a send's
--   delivery; tasks_parent: children by parent, for the cancel cascade and inspect.
-- * tasks_fan_in: when an awaited child ends (any path: its holder's write, lease expiry,
--   an operator's command), its parent's wait_count goes down by one, and the parent is
--   made PENDING when it reaches 0. A trigger, so that no path that ends a task can miss
--   it; a parent that is not WAITING any more (cancelled, paused) is not touched.

ALTER TABLE tasks ADD COLUMN parent_id TEXT;
ALTER TABLE tasks ADD COLUMN awaited INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN wait_kind TEXT;
ALTER TABLE tasks ADD COLUMN wait_name TEXT;
ALTER TABLE tasks ADD COLUMN wait_key TEXT;
ALTER TABLE tasks ADD COLUMN wait_step TEXT;
ALTER TABLE tasks ADD COLUMN wait_seq INTEGER;
ALTER TABLE tasks ADD COLUMN wait_after INTEGER;
ALTER TABLE tasks ADD COLUMN wait_count INTEGER;

CREATE INDEX tasks_waiting ON tasks (run_at) WHERE state IN ('WAITING', 'COMPENSATING');
CREATE INDEX tasks_wait_event ON tasks (wait_name, wait_key) WHERE state = 'WAITING';
CREATE INDEX tasks_parent ON tasks (parent_id) WHERE parent_id IS NOT NULL;

CREATE TABLE events (
    seq      INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL UNIQUE,
    name     TEXT NOT NULL,
    key      TEXT NOT NULL,
    payload  TEXT NOT NULL,
    sent_at  REAL NOT NULL,
    sent_by  TEXT
);
CREATE INDEX events_name_key ON events (name, key, seq);
CREATE INDEX events_sent_at ON events (sent_at);

CREATE TRIGGER tasks_fan_in AFTER UPDATE OF state ON tasks
WHEN NEW.awaited = 1
 AND NEW.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'COMPENSATED')
BEGIN
    UPDATE tasks SET awaited = 0 WHERE id = NEW.id;
    UPDATE tasks SET wait_count = wait_count - 1,
        state = CASE WHEN wait_count <= 1 THEN 'PENDING' ELSE state END,
        run_at = CASE WHEN wait_count <= 1 THEN MIN(run_at, NEW.updated_at) ELSE run_at END,
        updated_at = CASE WHEN wait_count <= 1 THEN NEW.updated_at ELSE updated_at END
    WHERE id = NEW.parent_id AND state = 'WAITING' AND wait_kind = 'children';
END;

-- Ratchet ledger (SQLite): flow control (DESIGN §8, flow control). Additive only:
-- processes of the previous release keep working (their tasks land in the 'default'
-- queue at priority 0, with no concurrency key, no rate key, unfair and not debounced).
--
-- * tasks.queue: the named queue (a worker serving some queues never claims others');
--   task_queues: every (name, queue) pair ever submitted, so a claim walks the ready set
--   once per pair it serves (the claim's read of it is one small table).
-- * tasks.priority: higher first within a queue; ties by run_at. tasks_ready holds every
--   ready row in (name, queue, run_at) order and the claim's walk of it skips non-zero
--   priorities (a filter); tasks_ready_priority holds only those, so a ledger where no
--   task has a priority pays nothing for them and a walk never crosses future rows of
--   another priority.
-- * tasks.fair_key: the fairness key of a task of a fair type (its tenant unless the type
--   names another; '' for none), NULL for other types; tasks_ready_fair lets a claim find
--   the distinct keys with ready work (a skip scan) and walk each one.
-- * tasks.ckey / ckey_max / key_slot / due_at: a concurrency key, the most of its tasks
--   that hold a slot, whether this task holds one, and the run_at a task parked for a slot
--   resumes with. A keyed task holds a slot from its admission until it ends; one without
--   waits WAITING (wait_kind 'key', run_at far in the future, so the wake-up never sees
--   it). the triggers below admit the oldest waiters into
--   free slots: tasks_key_release when when a holder ends, by any path (its holder's
--   fenced write, a retirement, an operator), tasks_key_park when a task without a slot
--   becomes claimable (an operator's resume or retry).
-- * tasks.rate_key: the rate-limit bucket key a task's code computed at submit;
--   tasks.flow_wait: why flow control holds a task back ('rate': its run_at was moved to
--   when its bucket has a token; 'key': it waits for a slot; 'debounce': its debounce
--   window is open). rate_limits: one token bucket per (scope, name), from the code or set
--   by an operator (audited in control_log); rate_buckets: the tokens per key.
-- * workers.slots / queues: a worker's concurrency (task threads) and the queues it serves
--   (a JSON list; NULL: every queue), for ratchet status (the slots serving each type and
--   queue, a queue no live worker serves).
-- * tasks.debounce_key / debounce_until: the debounce group of a task not yet claimed,
--   and the latest run_at its window allows (tasks_debounce: one open task per group).

ALTER TABLE tasks ADD COLUMN queue TEXT NOT NULL DEFAULT 'default';
ALTER TABLE tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN fair_key TEXT;
ALTER TABLE tasks ADD COLUMN ckey TEXT;
ALTER TABLE tasks ADD COLUMN ckey_max INTEGER;
ALTER TABLE tasks ADD COLUMN key_slot INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN due_at REAL;
ALTER TABLE tasks ADD COLUMN rate_key TEXT;
ALTER TABLE tasks ADD COLUMN flow_wait TEXT;
ALTER TABLE tasks ADD COLUMN debounce_key TEXT;
ALTER TABLE workers ADD COLUMN slots INTEGER;
ALTER TABLE workers ADD COLUMN queues TEXT;
ALTER TABLE tasks ADD COLUMN debounce_until REAL;

CREATE INDEX tasks_ready_queue ON tasks (queue, run_at)
    WHERE state IN ('PENDING', 'RETRY_WAIT');
CREATE INDEX tasks_ready_priority ON tasks (priority DESC, run_at)
    WHERE state IN ('PENDING', 'RETRY_WAIT') AND priority <> 0;
CREATE INDEX tasks_ready_fair ON tasks (name, queue, fair_key, priority DESC, run_at)
    WHERE state IN ('PENDING', 'RETRY_WAIT') AND fair_key IS NOT NULL;
CREATE INDEX tasks_key_wait ON tasks (name, ckey, created_at, id)
    WHERE state = 'WAITING' AND wait_kind = 'key';
CREATE INDEX tasks_key_slot ON tasks (name, ckey) WHERE key_slot = 1;
CREATE INDEX tasks_flow_wait ON tasks (name, flow_wait) WHERE flow_wait IS NOT NULL;
CREATE UNIQUE INDEX tasks_debounce ON tasks (name, debounce_key)
    WHERE debounce_key IS NOT NULL AND generation = 0 AND state IN ('PENDING', 'WAITING');

CREATE TABLE task_queues (
    name  TEXT NOT NULL,
    queue TEXT NOT NULL,
    PRIMARY KEY (name, queue)
) WITHOUT ROWID;
INSERT INTO task_queues (name, queue) SELECT DISTINCT name, 'default' FROM tasks;

-- key_refill: keys whose admission another PostgreSQL transaction held; SQLite has one
-- writer and admits at once, so it stays empty here.
CREATE TABLE key_refill (
    name TEXT NOT NULL,
    key  TEXT NOT NULL,
    max  INTEGER NOT NULL,
    at   REAL NOT NULL
);

CREATE TABLE rate_limits (
    scope      TEXT NOT NULL,
    name       TEXT NOT NULL,
    rate_per_s REAL NOT NULL,
    burst      INTEGER NOT NULL,
    key_param  TEXT,
    source     TEXT NOT NULL,
    version    INTEGER NOT NULL DEFAULT 1,
    updated_at REAL NOT NULL,
    updated_by TEXT,
    reason     TEXT,
    PRIMARY KEY (scope, name)
) WITHOUT ROWID;

CREATE TABLE rate_buckets (
    scope      TEXT NOT NULL,
    name       TEXT NOT NULL,
    key        TEXT NOT NULL,
    tokens     REAL NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (scope, name, key)
) WITHOUT ROWID;

-- SQLite runs no trigger from inside a trigger (recursive_triggers is off): each one
-- admits the oldest waiters itself, with the audit of each admission first (the same
-- rows: the same ordered pick of the same rows, before the update moves them).
CREATE TRIGGER tasks_key_release AFTER UPDATE OF state ON tasks
WHEN NEW.key_slot = 1 AND NEW.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'COMPENSATED')
BEGIN
    UPDATE tasks SET key_slot = 0 WHERE id = NEW.id;
    INSERT INTO audit (task_id, at, kind, from_state, to_state, generation, holder, detail)
    SELECT id, NEW.updated_at, 'wake', 'WAITING', 'PENDING', generation, NULL,
           json_object('cause', 'key slot', 'key', NEW.ckey)
    FROM tasks WHERE id IN (
        SELECT id FROM tasks
        WHERE name = NEW.name AND ckey = NEW.ckey AND state = 'WAITING' AND wait_kind = 'key'
        ORDER BY created_at, id
        LIMIT MAX(0, NEW.ckey_max - (SELECT count(*) FROM tasks
                                     WHERE name = NEW.name AND ckey = NEW.ckey
                                       AND key_slot = 1)));
    UPDATE tasks SET state = 'PENDING', key_slot = 1, wait_kind = NULL, flow_wait = NULL,
                     run_at = COALESCE(due_at, NEW.updated_at), due_at = NULL,
                     updated_at = MAX(updated_at, NEW.updated_at)
    WHERE id IN (
        SELECT id FROM tasks
        WHERE name = NEW.name AND ckey = NEW.ckey AND state = 'WAITING' AND wait_kind = 'key'
        ORDER BY created_at, id
        LIMIT MAX(0, NEW.ckey_max - (SELECT count(*) FROM tasks
                                     WHERE name = NEW.name AND ckey = NEW.ckey
                                       AND key_slot = 1)));
END;

CREATE TRIGGER tasks_key_park AFTER UPDATE OF state ON tasks
WHEN NEW.ckey IS NOT NULL AND NEW.key_slot = 0 AND NEW.state IN ('PENDING', 'RETRY_WAIT')
BEGIN
    UPDATE tasks SET state = 'WAITING', wait_kind = 'key', flow_wait = 'key',
                     due_at = run_at, run_at = 1e15
    WHERE id = NEW.id;
    INSERT INTO audit (task_id, at, kind, from_state, to_state, generation, holder, detail)
    VALUES (NEW.id, NEW.updated_at, 'key_wait', NEW.state, 'WAITING', NEW.generation, NULL,
            json_object('key', NEW.ckey));
    INSERT INTO audit (task_id, at, kind, from_state, to_state, generation, holder, detail)
    SELECT id, NEW.updated_at, 'wake', 'WAITING', 'PENDING', generation, NULL,
           json_object('cause', 'key slot', 'key', NEW.ckey)
    FROM tasks WHERE id IN (
        SELECT id FROM tasks
        WHERE name = NEW.name AND ckey = NEW.ckey AND state = 'WAITING' AND wait_kind = 'key'
        ORDER BY created_at, id
        LIMIT MAX(0, NEW.ckey_max - (SELECT count(*) FROM tasks
                                     WHERE name = NEW.name AND ckey = NEW.ckey
                                       AND key_slot = 1)));
    UPDATE tasks SET state = 'PENDING', key_slot = 1, wait_kind = NULL, flow_wait = NULL,
                     run_at = COALESCE(due_at, NEW.updated_at), due_at = NULL,
                     updated_at = MAX(updated_at, NEW.updated_at)
    WHERE id IN (
        SELECT id FROM tasks
        WHERE name = NEW.name AND ckey = NEW.ckey AND state = 'WAITING' AND wait_kind = 'key'
        ORDER BY created_at, id
        LIMIT MAX(0, NEW.ckey_max - (SELECT count(*) FROM tasks
                                     WHERE name = NEW.name AND ckey = NEW.ckey
                                       AND key_slot = 1)));
END;

-- Ratchet ledger (PostgreSQL): flow control (DESIGN §8, flow control). Additive only:
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
--   it). ratchet_key_fill (under an advisory lock per key) admits the oldest waiters into
--   free slots; tasks_key_release runs it when a holder ends, by any path (its holder's
--   fenced write, a retirement, an operator), tasks_key_park when a task without a slot
--   becomes claimable (an operator's resume or retry). The lock is only ever tried, never
--   waited for: one transaction ends tasks of several keys (a group commit) in any order,
--   so waiting could deadlock. A fill that finds its key's lock taken leaves a key_refill
--   row instead (no unique index: inserting one never waits either); the claims' wake-up
--   takes those rows (SKIP LOCKED) and fills their keys again.
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

ALTER TABLE tasks ADD COLUMN queue text NOT NULL DEFAULT 'default';
ALTER TABLE tasks ADD COLUMN priority integer NOT NULL DEFAULT 0;
ALTER TABLE tasks ADD COLUMN fair_key text;
ALTER TABLE tasks ADD COLUMN ckey text;
ALTER TABLE tasks ADD COLUMN ckey_max integer;
ALTER TABLE tasks ADD COLUMN key_slot boolean NOT NULL DEFAULT false;
ALTER TABLE tasks ADD COLUMN due_at double precision;
ALTER TABLE tasks ADD COLUMN rate_key text;
ALTER TABLE tasks ADD COLUMN flow_wait text;
ALTER TABLE tasks ADD COLUMN debounce_key text;
ALTER TABLE workers ADD COLUMN slots integer;
ALTER TABLE workers ADD COLUMN queues text;
ALTER TABLE tasks ADD COLUMN debounce_until double precision;

DROP INDEX tasks_ready;
CREATE INDEX tasks_ready ON tasks (name, queue, run_at, version)
    WHERE state IN ('PENDING', 'RETRY_WAIT');
CREATE INDEX tasks_ready_priority ON tasks (name, queue, priority DESC, run_at, version)
    WHERE state IN ('PENDING', 'RETRY_WAIT') AND priority <> 0;
CREATE INDEX tasks_ready_fair ON tasks (name, queue, fair_key, priority DESC, run_at)
    WHERE state IN ('PENDING', 'RETRY_WAIT') AND fair_key IS NOT NULL;
CREATE INDEX tasks_key_wait ON tasks (name, ckey, created_at, id)
    WHERE state = 'WAITING' AND wait_kind = 'key';
CREATE INDEX tasks_key_slot ON tasks (name, ckey) WHERE key_slot;
CREATE INDEX tasks_flow_wait ON tasks (name, flow_wait) WHERE flow_wait IS NOT NULL;
CREATE UNIQUE INDEX tasks_debounce ON tasks (name, debounce_key)
    WHERE debounce_key IS NOT NULL AND generation = 0 AND state IN ('PENDING', 'WAITING');

CREATE TABLE task_queues (
    name  text NOT NULL,
    queue text NOT NULL,
    PRIMARY KEY (name, queue)
);
INSERT INTO task_queues (name, queue) SELECT DISTINCT name, 'default' FROM tasks;

CREATE TABLE rate_limits (
    scope      text NOT NULL,
    name       text NOT NULL,
    rate_per_s double precision NOT NULL,
    burst      integer NOT NULL,
    key_param  text,
    source     text NOT NULL,
    version    integer NOT NULL DEFAULT 1,
    updated_at double precision NOT NULL,
    updated_by text,
    reason     text,
    PRIMARY KEY (scope, name)
);

CREATE TABLE rate_buckets (
    scope      text NOT NULL,
    name       text NOT NULL,
    key        text NOT NULL,
    tokens     double precision NOT NULL,
    updated_at double precision NOT NULL,
    PRIMARY KEY (scope, name, key)
);

CREATE TABLE key_refill (
    name text NOT NULL,
    key  text NOT NULL,
    max  integer NOT NULL,
    at   double precision NOT NULL
);

CREATE FUNCTION ratchet_key_fill(p_name text, p_key text, p_max integer, p_now float8)
RETURNS integer LANGUAGE plpgsql AS $$
DECLARE
    admitted integer;
BEGIN
    IF NOT pg_try_advisory_xact_lock(
            1381256267, hashtext(current_schema() || ':' || p_name || ':' || p_key)) THEN
        INSERT INTO key_refill (name, key, max, at) VALUES (p_name, p_key, p_max, p_now);
        RETURN 0;
    END IF;
    WITH picked AS (
        SELECT id FROM tasks
        WHERE name = p_name AND ckey = p_key AND state = 'WAITING' AND wait_kind = 'key'
        ORDER BY created_at, id
        LIMIT GREATEST(0, p_max - (SELECT count(*) FROM tasks
                                   WHERE name = p_name AND ckey = p_key AND key_slot))
        FOR UPDATE),
    moved AS (
        UPDATE tasks t SET state = 'PENDING', key_slot = true, wait_kind = NULL,
                           flow_wait = NULL, run_at = COALESCE(t.due_at, p_now),
                           due_at = NULL, updated_at = GREATEST(t.updated_at, p_now)
        FROM picked WHERE t.id = picked.id
        RETURNING t.id, t.generation)
    INSERT INTO audit (task_id, at, kind, from_state, to_state, generation, holder, detail)
    SELECT id, p_now, 'wake', 'WAITING', 'PENDING', generation, NULL,
           json_build_object('cause', 'key slot', 'key', p_key)::text
    FROM moved;
    GET DIAGNOSTICS admitted = ROW_COUNT;
    RETURN admitted;
END;
$$;

CREATE FUNCTION tasks_key_release() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tasks SET key_slot = false WHERE id = NEW.id;
    PERFORM ratchet_key_fill(NEW.name, NEW.ckey, NEW.ckey_max, NEW.updated_at);
    RETURN NULL;
END;
$$;

CREATE TRIGGER tasks_key_release AFTER UPDATE OF state ON tasks
FOR EACH ROW
WHEN (NEW.key_slot AND NEW.state IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'COMPENSATED'))
EXECUTE FUNCTION tasks_key_release();

CREATE FUNCTION tasks_key_park() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tasks SET state = 'WAITING', wait_kind = 'key', flow_wait = 'key',
                     due_at = run_at, run_at = 1e15
    WHERE id = NEW.id;
    INSERT INTO audit (task_id, at, kind, from_state, to_state, generation, holder, detail)
    VALUES (NEW.id, NEW.updated_at, 'key_wait', NEW.state, 'WAITING', NEW.generation, NULL,
            json_build_object('key', NEW.ckey)::text);
    PERFORM ratchet_key_fill(NEW.name, NEW.ckey, NEW.ckey_max, NEW.updated_at);
    RETURN NULL;
END;
$$;

CREATE TRIGGER tasks_key_park AFTER UPDATE OF state ON tasks
FOR EACH ROW
WHEN (NEW.ckey IS NOT NULL AND NOT NEW.key_slot AND NEW.state IN ('PENDING', 'RETRY_WAIT'))
EXECUTE FUNCTION tasks_key_park();

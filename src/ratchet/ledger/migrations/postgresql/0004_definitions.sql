-- Ratchet ledger (PostgreSQL): versioned task definitions (DESIGN §8). Additive for
-- processes of the previous release: they name neither new table, and tasks_ready keeps
-- its (name, run_at) prefix, so their claims are planned as before.
--
-- * definitions: one row per (name, version) a worker has registered: its spec (JSON:
--   retry policy, lease_s, params JSON Schema, and whatever later releases add), when it
--   was first and last registered. A worker registering the same (name, version) with
--   another spec replaces the spec; the change is audited (kind 'definition_changed').
-- * worker_definitions: which (name, version) pairs each registered worker runs.
-- * tasks_ready gains version as a third column: a claim walks (name, run_at) in order as
--   before and checks the version on the index entry itself, so the tasks of a version
--   this worker does not have are skipped without reading their rows.

CREATE TABLE definitions (
    name                text NOT NULL,
    version             integer NOT NULL,
    spec                text NOT NULL,
    first_registered_at double precision NOT NULL,
    last_registered_at  double precision NOT NULL,
    PRIMARY KEY (name, version)
);

CREATE TABLE worker_definitions (
    holder  text NOT NULL,
    name    text NOT NULL,
    version integer NOT NULL,
    PRIMARY KEY (holder, name, version)
);

DROP INDEX tasks_ready;
CREATE INDEX tasks_ready ON tasks (name, run_at, version) WHERE state IN ('PENDING', 'RETRY_WAIT');

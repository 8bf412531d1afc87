-- Ratchet ledger (SQLite): versioned task definitions (DESIGN §8). Additive only: a
-- process of the previous release names neither table and its claims ignore versions.
--
-- * definitions: one row per (name, version) a worker has registered: its spec (JSON:
--   retry policy, lease_s, params JSON Schema, and whatever later releases add), when it
--   was first and last registered. A worker registering the same (name, version) with
--   another spec replaces the spec; the change is audited (kind 'definition_changed').
-- * worker_definitions: which (name, version) pairs each registered worker runs. A pair is
--   live while a worker that has it is 'alive' in workers and seen recently; ratchet status
--   shows ready tasks of a version no live worker has.

CREATE TABLE definitions (
    name                TEXT NOT NULL,
    version             INTEGER NOT NULL,
    spec                TEXT NOT NULL,
    first_registered_at REAL NOT NULL,
    last_registered_at  REAL NOT NULL,
    PRIMARY KEY (name, version)
) WITHOUT ROWID;

CREATE TABLE worker_definitions (
    holder  TEXT NOT NULL,
    name    TEXT NOT NULL,
    version INTEGER NOT NULL,
    PRIMARY KEY (holder, name, version)
) WITHOUT ROWID;

-- Ratchet ledger, schema version 1 (PostgreSQL). Applied inside the ledger's own schema
-- (search_path), in one transaction, under an advisory lock.
-- Times are ledger-clock epoch seconds (double precision). JSON is stored as text, exactly
-- as the canonical serialiser wrote it (the params digest is computed over that text).

CREATE TABLE tasks (
    id              text PRIMARY KEY,
    name            text NOT NULL,
    version         integer NOT NULL,
    params          text NOT NULL,
    params_digest   text NOT NULL,
    idempotency_key text UNIQUE,
    state           text NOT NULL,
    generation      bigint NOT NULL DEFAULT 0,
    attempt         integer NOT NULL DEFAULT 0,
    max_attempts    integer NOT NULL,
    lease_s         double precision NOT NULL,
    holder          text,
    lease_until     double precision,
    run_at          double precision NOT NULL,
    created_at      double precision NOT NULL,
    updated_at      double precision NOT NULL,
    result          text,
    last_error      text,
    error_class     text
);

-- The ready set: only claimable rows are in the index, so terminal rows cost nothing.
CREATE INDEX tasks_ready ON tasks (run_at, name) WHERE state IN ('PENDING', 'RETRY_WAIT');
-- Expired-lease scan for takeover, and revocation of a dead holder's leases.
CREATE INDEX tasks_leased ON tasks (lease_until) WHERE state = 'RUNNING';
CREATE INDEX tasks_holder ON tasks (holder) WHERE state = 'RUNNING';
CREATE INDEX tasks_name_state ON tasks (name, state);

CREATE TABLE steps (
    task_id      text NOT NULL,
    name         text NOT NULL,
    result       text NOT NULL,
    generation   bigint NOT NULL,
    committed_at double precision NOT NULL,
    PRIMARY KEY (task_id, name)
);

CREATE TABLE effects (
    task_id       text NOT NULL,
    name          text NOT NULL,
    key           text NOT NULL,
    params_digest text NOT NULL,
    state         text NOT NULL,
    result        text,
    generation    bigint NOT NULL,
    attempt       integer NOT NULL,
    calls         integer NOT NULL DEFAULT 0,
    via_lookup    boolean NOT NULL DEFAULT false,
    updated_at    double precision NOT NULL,
    PRIMARY KEY (task_id, name)
);

CREATE TABLE audit (
    seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    task_id    text NOT NULL,
    at         double precision NOT NULL,
    kind       text NOT NULL,
    from_state text,
    to_state   text,
    generation bigint,
    holder     text,
    detail     text
);
CREATE INDEX audit_task ON audit (task_id, seq);
CREATE INDEX audit_kind ON audit (kind);

-- Worker registry (fast takeover of dead holders on the same host).
CREATE TABLE workers (
    holder     text PRIMARY KEY,
    host_id    text NOT NULL,
    hostname   text NOT NULL,
    pid        integer NOT NULL,
    pid_start  text,
    started_at double precision NOT NULL,
    last_seen  double precision NOT NULL,
    state      text NOT NULL DEFAULT 'alive'
);
CREATE INDEX workers_host ON workers (host_id, state);

CREATE TABLE schema_version (
    version integer NOT NULL
);

-- slotgate schema. Postgres is the source of truth; Redis is only transport.
-- Contracts: docs/DESIGN.md, section 4.5 "Postgres tables".

-- Every slot the planner laid out. The primary key makes planning idempotent:
-- only the process whose insert returns a row enqueues the slot.
CREATE TABLE planned_slot (
    kind        text        NOT NULL,
    day         date        NOT NULL,
    slot        integer     NOT NULL CHECK (slot >= 1),
    nominal_at  timestamptz NOT NULL,
    due_at      timestamptz NOT NULL,
    jitter_ms   bigint      NOT NULL CHECK (jitter_ms >= 0),
    source      text        NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, day, slot)
);
CREATE INDEX planned_slot_due ON planned_slot (due_at);

-- One-row fencing counter: every new leader lease takes epoch + 1 here, so
-- epochs keep rising even when Redis loses everything.
CREATE TABLE leader_epoch (
    id    boolean PRIMARY KEY DEFAULT true CHECK (id),
    epoch bigint  NOT NULL
);
INSERT INTO leader_epoch (id, epoch) VALUES (true, 0);

CREATE TABLE draft (
    id           bigserial   PRIMARY KEY,
    kind         text        NOT NULL,
    title        text        NOT NULL,
    body         text        NOT NULL DEFAULT '',
    status       text        NOT NULL DEFAULT 'ready'
                 CHECK (status IN ('draft', 'ready', 'publishing', 'published', 'failed')),
    ready_at     timestamptz NOT NULL DEFAULT now(),
    created_at   timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    url          text,
    slot_key     text
);
-- The picker's path: oldest ready draft of a kind.
CREATE INDEX draft_pick ON draft (kind, ready_at, id) WHERE status = 'ready';

-- The gate. UNIQUE (day, slot, kind) is the final guard against a second run.
CREATE TABLE publish_slot (
    id               bigserial   PRIMARY KEY,
    day              date        NOT NULL,
    slot             integer     NOT NULL,
    kind             text        NOT NULL,
    state            text        NOT NULL
                     CHECK (state IN ('claimed', 'publishing', 'published', 'skipped', 'failed')),
    post_id          bigint      REFERENCES draft (id),
    claimed_by       text        NOT NULL,
    attempt          integer     NOT NULL DEFAULT 1,
    claim_expires_at timestamptz,
    reason           text,
    response         jsonb,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    UNIQUE (day, slot, kind)
);
CREATE INDEX publish_slot_open ON publish_slot (claim_expires_at)
    WHERE state IN ('claimed', 'publishing');
CREATE INDEX publish_slot_kind_day ON publish_slot (kind, day);

-- Units of the daily cap in use per kind and local day. Taken with one
-- conditional upsert, so concurrent slots of one kind serialize on this row
-- and can never overshoot the cap.
CREATE TABLE daily_quota (
    kind text    NOT NULL,
    day  date    NOT NULL,
    used integer NOT NULL CHECK (used >= 0),
    PRIMARY KEY (kind, day)
);

-- One row per handled delivery, malformed ones included.
CREATE TABLE execution (
    id           bigserial   PRIMARY KEY,
    slot_key     text        NOT NULL,
    kind         text,
    day          date,
    slot         integer,
    entry_id     text,
    caller       text        NOT NULL,
    worker_id    text        NOT NULL,
    leader_epoch bigint,
    outcome      text        NOT NULL CHECK (outcome IN ('published', 'skipped', 'failed')),
    reason       text,
    detail       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    due_at       timestamptz,
    started_at   timestamptz NOT NULL,
    finished_at  timestamptz NOT NULL
);
CREATE INDEX execution_slot ON execution (kind, day, slot);
-- A stream entry is handled once: a redelivery of an entry whose outcome is
-- already committed is acknowledged without a second row.
CREATE UNIQUE INDEX execution_entry ON execution (entry_id) WHERE entry_id IS NOT NULL;

-- An operator's request for a slot to run outside the planner's schedule
-- (issue 26). A delivery's stream fields are written by anyone with Redis
-- access, so `caller manual|backfill` (exempt from `starting_deadline`) and
-- `early=1` (run before the slot's time) are honoured only for a slot with
-- a row here, written by the commands that deliver so: `planner trigger`
-- (and `--early`), `planner backfill`, `planner retry`, `planner dead
-- replay` and the console. The slot's gate row still makes it run at most
-- once; a row grants nothing for any other slot.
CREATE TABLE exemption_request (
    id           bigserial   PRIMARY KEY,
    kind         text        NOT NULL,
    day          date        NOT NULL,
    slot         integer     NOT NULL,
    caller       text        NOT NULL CHECK (caller IN ('manual', 'backfill')),
    early        boolean     NOT NULL DEFAULT false,
    requested_by text        NOT NULL,
    requested_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX exemption_request_slot ON exemption_request (kind, day, slot);

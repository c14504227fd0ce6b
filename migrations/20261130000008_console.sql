-- Operator verbs (`planner pause` / `planner resume`) and the console.
--
-- A paused kind: while a row here is in force (until_at IS NULL or in the
-- future), every delivery of the kind takes its slot's gate row as
-- skipped/paused, which is final: paused slots do not pile up for later.
-- One row per kind; `planner resume` deletes it. Read on the hot path by the
-- primary key, in the same statement that reads the slot's plan.
CREATE TABLE kind_pause (
    kind       text        PRIMARY KEY,
    paused_at  timestamptz NOT NULL,
    until_at   timestamptz,
    paused_by  text        NOT NULL,
    note       text        NOT NULL DEFAULT ''
);

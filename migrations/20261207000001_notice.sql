-- Notices (issue 42): an outbox of Standard Webhooks events an operator
-- routes to Slack, e-mail or a pager. An event is written in the same
-- transaction as the outcome it reports, so a crash between the outcome
-- and the send loses no event; the leader sends what is pending, and every
-- resend of one event carries the same `msg_id` (the `webhook-id` header),
-- so a receiver that dedupes by id shows it once.
--
-- Why a trigger for the slot events: a slot's fate is written by several
-- statements (the gate functions, the fenced finish, the reconciler's
-- missed_deadline, an operator's skip), and the rule "which fates are
-- told" must live in one place. A row trigger on publish_slot is that
-- place and runs inside whichever transaction writes the fate. Its WHEN
-- clause is false for every published, claimed and ordinary skipped row,
-- so the hot path queues no trigger event.
--
-- Events are written whether or not `[notify]` is configured: the table
-- holds only failures (rare), `planner prune` ages them out, and turning
-- notify on later does not need a migration. What the leader sends is the
-- config's business (`events`), not the schema's.

CREATE TABLE notice (
    id          bigserial   PRIMARY KEY,
    msg_id      text        NOT NULL UNIQUE
                DEFAULT 'msg_' || replace(gen_random_uuid()::text, '-', ''),
    event       text        NOT NULL
                CHECK (event IN ('slot.failed', 'slot.missed', 'slot.dead_lettered', 'runway.low')),
    kind        text,
    day         date,
    slot        integer,
    slot_key    text,
    outcome     text,
    reason      text,
    runs_dry_on date,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    state       text        NOT NULL DEFAULT 'pending'
                CHECK (state IN ('pending', 'sent', 'filtered', 'gave_up')),
    attempts    integer     NOT NULL DEFAULT 0,
    next_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    last_error  text,
    sent_at     timestamptz
);
CREATE INDEX notice_pending ON notice (next_at) WHERE state = 'pending';
-- One runway warning per kind and predicted dry day, however often the
-- leader forecasts.
CREATE UNIQUE INDEX notice_runway ON notice (kind, runs_dry_on) WHERE event = 'runway.low';

-- A slot that ends failed (not an operator's abandon of a failed slot: it
-- was failed already) or skipped/missed_deadline: one event per change of
-- state into it (a retried slot that fails again is told again).
CREATE FUNCTION slotgate_notice_slot() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.state = NEW.state THEN
        RETURN NULL;
    END IF;
    INSERT INTO notice (event, kind, day, slot, outcome, reason)
    VALUES (CASE WHEN NEW.state = 'failed' THEN 'slot.failed' ELSE 'slot.missed' END,
            NEW.kind, NEW.day, NEW.slot, NEW.state, NEW.reason);
    RETURN NULL;
END $$;

CREATE TRIGGER notice_slot AFTER INSERT OR UPDATE OF state ON publish_slot
    FOR EACH ROW
    WHEN (NEW.state = 'failed' OR (NEW.state = 'skipped' AND NEW.reason = 'missed_deadline'))
    EXECUTE FUNCTION slotgate_notice_slot();

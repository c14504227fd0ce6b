-- Postgres cannot hold the fleet, and Postgres's clock decides.
-- Contracts: README "Operator guide: Postgres timeouts and clocks" and the
-- Postgres section of docs/DESIGN.md.
--
-- 1. worker_clock: each worker's last measured clock offset against this
--    database (its clock minus Postgres's, midpoint of a round trip), so
--    `planner status` can show a worker whose clock is off.
--
-- 2. slotgate_gate_batch, replaced with the same signature: claim expiry,
--    the starting deadline and draft readiness are judged with the
--    database's clock instead of the worker's p_now. A claim lasts
--    (p_expires - p_now), counted from clock_timestamp() when its gate row
--    is written; the deadline and readiness are judged at
--    statement_timestamp(). p_now is still the worker's (injectable) clock
--    for what is only recorded (created_at, updated_at, published_at,
--    finished_at). A worker whose clock runs ahead can then neither treat
--    another worker's live claim as lapsed nor a slot as late.
--
-- 3. slotgate_finish_batch, replaced with the same signature: the worker
--    retries it in place after a store error, keeping the CMS's answers in
--    memory. When an earlier call did commit and only its answer was lost,
--    a slot whose claim (this worker, this attempt) is already settled is
--    reported fenced and nothing is written again, instead of a false
--    skipped/slot_taken.

CREATE TABLE worker_clock (
    worker_id   text        PRIMARY KEY,
    -- The worker's clock minus Postgres's, in milliseconds.
    skew_ms     bigint      NOT NULL,
    -- The round trip the measurement took (its uncertainty is half of it).
    rtt_ms      bigint      NOT NULL,
    measured_at timestamptz NOT NULL DEFAULT now()
);

CREATE OR REPLACE FUNCTION slotgate_gate_batch(
    p_key text[], p_kind text[], p_day date[], p_slot integer[],
    p_entry text[], p_caller text[], p_exempt boolean[],
    p_deadline_ms bigint[], p_cap integer[], p_started timestamptz[],
    p_record_only boolean[],
    p_worker text, p_epoch bigint, p_now timestamptz, p_expires timestamptz)
RETURNS TABLE (o_idx integer, o_gate bigint, o_post bigint, o_title text, o_body text,
               o_nominal timestamptz, o_due timestamptz, o_settled boolean)
LANGUAGE plpgsql AS $$
DECLARE
    n     integer := coalesce(array_length(p_key, 1), 0);
    gate  bigint[] := array_fill(NULL::bigint, ARRAY[n]);
    due   timestamptz[] := array_fill(NULL::timestamptz, ARRAY[n]);
    nominal timestamptz[] := array_fill(NULL::timestamptz, ARRAY[n]);
    v_nominal timestamptz;
    v_title text;
    v_body text;
    k     integer;
    v_id  bigint;
    v_due timestamptz;
    v_post bigint;
    v_url text;
    v_kind text;
    v_day date;
    v_cap integer;
    v_units integer;
    v_drafts bigint[];
    v_next integer;
BEGIN
    -- Phase 1: the gates, in the caller's (kind, day, slot) order.
    FOR k IN 1 .. n LOOP
        SELECT ps.due_at, ps.nominal_at INTO v_due, v_nominal FROM planned_slot ps
         WHERE ps.kind = p_kind[k] AND ps.day = p_day[k] AND ps.slot = p_slot[k];
        CONTINUE WHEN NOT FOUND;
        CONTINUE WHEN NOT p_exempt[k]
                  AND statement_timestamp() > v_due + p_deadline_ms[k] * interval '1 millisecond';
        INSERT INTO publish_slot (day, slot, kind, state, claimed_by, attempt,
                                  claim_expires_at, created_at, updated_at)
        VALUES (p_day[k], p_slot[k], p_kind[k], 'claimed', p_worker, 1,
                CASE WHEN p_record_only[k] THEN p_now
                     ELSE clock_timestamp() + (p_expires - p_now) END, p_now, p_now)
        ON CONFLICT (day, slot, kind) DO NOTHING
        RETURNING id INTO v_id;
        CONTINUE WHEN v_id IS NULL;
        gate[k] := v_id;
        due[k] := v_due;
        nominal[k] := v_nominal;
    END LOOP;

    -- Phase 2: the oldest ready drafts, picked for all of a kind's slots in
    -- one scan (one pick per slot would walk past the drafts that the
    -- other in-flight batches of the kind hold locked, once per slot), then
    -- each slot settled.
    FOR k IN 1 .. n LOOP
        CONTINUE WHEN gate[k] IS NULL;
        IF v_kind IS DISTINCT FROM p_kind[k] THEN
            v_kind := p_kind[k];
            v_next := 1;
            SELECT coalesce(array_agg(s.id ORDER BY s.ready_at, s.id), '{}') INTO v_drafts
              FROM (SELECT d.id, d.ready_at FROM draft d
                     WHERE d.kind = v_kind AND d.status = 'ready' AND d.ready_at <= statement_timestamp()
                     ORDER BY d.ready_at, d.id
                     LIMIT (SELECT count(*) FROM generate_subscripts(p_key, 1) j
                             WHERE p_kind[j] = v_kind AND gate[j] IS NOT NULL)
                     FOR UPDATE SKIP LOCKED) s;
        END IF;
        IF v_next > coalesce(array_length(v_drafts, 1), 0) THEN
            DELETE FROM publish_slot WHERE id = gate[k];
            gate[k] := NULL;
            CONTINUE;
        END IF;
        v_post := v_drafts[v_next];
        v_next := v_next + 1;
        IF NOT p_record_only[k] THEN
            -- Claimed for a webhook: the caller publishes and finishes it.
            UPDATE draft SET slot_key = p_key[k], status = 'publishing', url = NULL, published_at = NULL
             WHERE id = v_post
            RETURNING title, body INTO v_title, v_body;
            UPDATE publish_slot SET post_id = v_post, state = 'publishing', updated_at = p_now
             WHERE id = gate[k];
            o_idx := k; o_gate := gate[k]; o_post := v_post; o_title := v_title; o_body := v_body;
            o_nominal := nominal[k]; o_due := due[k]; o_settled := false;
            RETURN NEXT;
            CONTINUE;
        END IF;
        UPDATE draft
           SET slot_key = p_key[k], status = 'published',
               url = 'record-only://' || kind || '/' || id, published_at = p_now
         WHERE id = v_post
        RETURNING url, title, body INTO v_url, v_title, v_body;
        UPDATE publish_slot
           SET post_id = v_post, state = 'published', claim_expires_at = NULL,
               response = jsonb_build_object('url', v_url, 'record_only', true), updated_at = p_now
         WHERE id = gate[k];
        -- Same upsert as the one-delivery path (store::insert_execution).
        INSERT INTO execution (slot_key, kind, day, slot, entry_id, caller, worker_id, leader_epoch,
                               outcome, reason, detail, due_at, started_at, finished_at)
        VALUES (p_key[k], p_kind[k], p_day[k], p_slot[k], p_entry[k], left(p_caller[k], 64), p_worker,
                p_epoch, 'published', NULL, jsonb_build_object('url', v_url), due[k], p_started[k],
                p_now + (clock_timestamp() - statement_timestamp()))
        ON CONFLICT (entry_id) WHERE entry_id IS NOT NULL DO UPDATE
           SET worker_id = EXCLUDED.worker_id, leader_epoch = EXCLUDED.leader_epoch,
               outcome = EXCLUDED.outcome, reason = EXCLUDED.reason,
               detail = EXCLUDED.detail || jsonb_build_object('superseded', execution.detail),
               started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at
         WHERE execution.reason = 'slot_taken';
        o_idx := k; o_gate := gate[k]; o_post := v_post; o_title := v_title; o_body := v_body;
        o_nominal := nominal[k]; o_due := due[k]; o_settled := true;
        RETURN NEXT;
    END LOOP;

    -- Phase 3: the units of the cap, per (kind, day) in order, just before
    -- the commit.
    FOR v_kind, v_day, v_cap, v_units IN
        SELECT p_kind[j], p_day[j], max(p_cap[j]), count(*)::integer
          FROM generate_subscripts(p_key, 1) j
         WHERE gate[j] IS NOT NULL
         GROUP BY 1, 2
         ORDER BY 1, 2
    LOOP
        INSERT INTO daily_quota (kind, day, used)
        SELECT v_kind, v_day, v_units WHERE v_units <= v_cap
        ON CONFLICT (kind, day) DO UPDATE SET used = daily_quota.used + v_units
         WHERE daily_quota.used + v_units <= v_cap;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'daily cap of % on % cannot cover % more slots', v_kind, v_day, v_units
                  USING ERRCODE = 'SGQ01';
        END IF;
    END LOOP;
END
$$;

CREATE OR REPLACE FUNCTION slotgate_finish_batch(p_rows jsonb, p_worker text, p_epoch bigint, p_now timestamptz)
RETURNS TABLE (o_idx integer, o_fenced boolean)
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    v_ok boolean;
BEGIN
    FOR r IN
        SELECT * FROM jsonb_to_recordset(p_rows) AS x(
            idx integer, id bigint, attempt integer, post_id bigint, state text, reason text,
            response jsonb, url text, slot_key text, kind text, day date, slot integer,
            entry_id text, caller text, detail jsonb, lost_detail jsonb,
            due_at timestamptz, started_at timestamptz)
        ORDER BY x.id
    LOOP
        UPDATE publish_slot
           SET state = r.state, reason = r.reason, response = r.response,
               claim_expires_at = NULL, updated_at = p_now
         WHERE id = r.id AND claimed_by = p_worker AND attempt = r.attempt
           AND state IN ('claimed', 'publishing');
        v_ok := FOUND;
        IF NOT v_ok AND EXISTS (
               SELECT 1 FROM publish_slot
                WHERE id = r.id AND claimed_by = p_worker AND attempt = r.attempt
                  AND state NOT IN ('claimed', 'publishing')) THEN
            -- This claim's outcome is already committed: an earlier call of
            -- this function committed, and its answer was lost on the way
            -- back. Nothing to write again.
            o_idx := r.idx;
            o_fenced := true;
            RETURN NEXT;
            CONTINUE;
        END IF;
        IF v_ok THEN
            UPDATE draft
               SET status = r.state, url = COALESCE(r.url, url),
                   published_at = CASE WHEN r.state = 'published' THEN p_now ELSE published_at END
             WHERE id = r.post_id;
        END IF;
        INSERT INTO execution (slot_key, kind, day, slot, entry_id, caller, worker_id, leader_epoch,
                               outcome, reason, detail, due_at, started_at, finished_at)
        VALUES (r.slot_key, r.kind, r.day, r.slot, r.entry_id, left(r.caller, 64), p_worker, p_epoch,
                CASE WHEN v_ok THEN r.state ELSE 'skipped' END,
                CASE WHEN v_ok THEN r.reason ELSE 'slot_taken' END,
                CASE WHEN v_ok THEN r.detail ELSE r.lost_detail END,
                r.due_at, r.started_at, p_now + (clock_timestamp() - statement_timestamp()))
        ON CONFLICT (entry_id) WHERE entry_id IS NOT NULL DO UPDATE
           SET worker_id = EXCLUDED.worker_id, leader_epoch = EXCLUDED.leader_epoch,
               outcome = EXCLUDED.outcome, reason = EXCLUDED.reason,
               detail = EXCLUDED.detail || jsonb_build_object('superseded', execution.detail),
               started_at = EXCLUDED.started_at, finished_at = EXCLUDED.finished_at
         WHERE execution.reason = 'slot_taken' AND EXCLUDED.reason IS DISTINCT FROM 'slot_taken';
        o_idx := r.idx;
        o_fenced := v_ok;
        RETURN NEXT;
    END LOOP;
END
$$;

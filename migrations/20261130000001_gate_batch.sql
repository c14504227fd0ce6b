-- Batches: many plain deliveries through the gate in one round trip and one
-- commit (slotgate_gate_batch), and many finished publishes recorded the
-- same way (slotgate_finish_batch). Contracts: README "Changes to the design
-- contracts".
--
-- Why server-side functions: a slot is five row changes (gate, quota,
-- draft, gate again, execution). Sent one statement at a time that is eight
-- round trips and a commit per slot (thirteen and two with a webhook), and on
-- a small machine the Postgres backends spend their CPU on protocol, parsing
-- and fsync rather than on the rows. Here the statements are planned once per
-- session and a whole batch shares one commit.
--
-- slotgate_gate_batch: for a record-only kind the slot is settled in the
-- same transaction (published, with its execution row), exactly as the
-- one-delivery path does it. For a kind with a webhook the slot is claimed
-- (state 'publishing', the draft bound to it, claim_expires_at = p_expires)
-- and the caller publishes, then records the outcome with
-- slotgate_finish_batch; a crash in between leaves an open claim that the
-- next delivery resumes, as in the one-delivery path.
--
-- Only the plain case is decided here: a slot with no gate row yet, a plan
-- row, on time (or exempt), a ready draft and a free unit of its cap. Every
-- other delivery of the batch is left exactly as it was (any row this
-- function wrote for it is removed again inside the same transaction, so no
-- one else ever sees it) and is not returned (deferred): the worker then runs
-- it through the one-delivery path, which owns every other outcome
-- (slot_taken, resume, missed_deadline, quota_full, no_ready_draft). The
-- unique (day, slot, kind) row stays the only guard: this function inserts
-- it like everyone else.
--
-- The cap: all of the batch's units are taken at the very end, one
-- conditional upsert per (kind, day). A kind's quota row is the one lock
-- that concurrent slots of that kind queue on, so it is held only from there
-- to the commit. When the cap cannot cover every slot the batch settled,
-- the function raises SQLSTATE SGQ01 and the whole transaction rolls back;
-- the worker then runs those deliveries one at a time, and the one-delivery
-- path decides precisely which of them still fit and which are quota_full.
--
-- Lock order: the caller sorts the batch by (kind, day, slot). All gate rows
-- are inserted first, in that order; drafts are picked with SKIP LOCKED and
-- never wait; quota rows are taken last, in (kind, day) order. A transaction
-- holding a quota row never waits for a gate row, and gate and quota rows
-- are each taken in one global order, so two batches (or a batch and a
-- one-delivery transaction) may wait on each other but cannot deadlock.
--
-- Arguments are parallel arrays, one element per delivery:
--   p_key      slot key text ("kind:day:slot"), bound to the draft
--   p_kind, p_day, p_slot   the key's parts
--   p_entry    stream entry id (execution.entry_id)
--   p_caller   the message's caller
--   p_exempt   true when the caller is exempt from starting_deadline
--   p_deadline_ms  the kind's starting_deadline in milliseconds
--   p_cap      the kind's daily_cap
--   p_started  when the worker started handling the delivery
--   p_record_only  the kind has no publish URL
-- and, for the whole batch: p_worker (claimed_by, execution.worker_id),
-- p_epoch (execution.leader_epoch, may be NULL), p_now (the worker's clock:
-- gate timestamps, draft readiness, the deadline) and p_expires (when a
-- webhook slot's claim lapses without a heartbeat). An execution's
-- finished_at is p_now plus the time this statement has run so far, so it
-- follows the worker's (injectable) clock and still counts the batch's work.
--
-- Returns one row per delivery it settled or claimed: its array index
-- (1-based), the gate row, the draft (id, title, body), the slot's nominal
-- and due times, and whether it was settled (record-only). Indexes not
-- returned were deferred.
CREATE FUNCTION slotgate_gate_batch(
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
                  AND p_now > v_due + p_deadline_ms[k] * interval '1 millisecond';
        INSERT INTO publish_slot (day, slot, kind, state, claimed_by, attempt,
                                  claim_expires_at, created_at, updated_at)
        VALUES (p_day[k], p_slot[k], p_kind[k], 'claimed', p_worker, 1,
                CASE WHEN p_record_only[k] THEN p_now ELSE p_expires END, p_now, p_now)
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
                     WHERE d.kind = v_kind AND d.status = 'ready' AND d.ready_at <= p_now
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

-- slotgate_finish_batch: the outcomes of publishes claimed by
-- slotgate_gate_batch (or any claim of this worker), recorded in one
-- transaction. Each slot is fenced exactly as store::finish_slot fences it:
-- only while the claim is still this worker's at this attempt. A slot whose
-- claim was taken over keeps its row untouched and gets a skipped/slot_taken
-- execution (p_rows.lost_detail), as in the one-delivery path.
--
-- p_rows: a JSON array of objects, one per slot, with the keys
--   idx, id (publish_slot), attempt, post_id, state ('published' | 'failed'),
--   reason, response, url, slot_key, kind, day, slot, entry_id, caller,
--   detail, lost_detail, due_at, started_at
-- Returns, per idx, whether the fence held (the outcome was recorded).
CREATE FUNCTION slotgate_finish_batch(p_rows jsonb, p_worker text, p_epoch bigint, p_now timestamptz)
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

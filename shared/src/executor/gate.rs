//! Phase two, the gate: which of a walk's deliveries own their slots.
//!
//! Every delivery goes through the one gate, [`store::gate_batch`]: gate
//! row, draft pick and quota unit in one transaction, the unit taken last.
//! A batch ([`Reach::Plain`]) is one such transaction for all its slots; a
//! delivery walked alone ([`Reach::Whole`]) is a batch of one, and what the
//! plain case leaves for it is decided here too: a slot not due yet
//! (`not_due`, nothing else written), a settled skip (paused, missed
//! deadline, no draft, cap full), an open claim to take over, or a
//! duplicate refused as `slot_taken`.

use super::call::Claimed;
use super::prepare::{Ctx, Plan, PlanRead, Ready};
use super::{Claim, ExecError, Executor, Gate, Handled, Reach};
use crate::outcome::{Outcome, SkipReason};
use crate::receiver::DraftText;
use crate::slot::{ahead_of_time, PlannedSlot};
use crate::store::{self, StoreError};
use chrono::{DateTime, Utc};
use serde_json::json;

/// What the gate made of a walk's ready deliveries.
pub(super) struct Gated<'a> {
    /// Decided by the gate itself (settled, refused, already handled):
    /// (index, what), to be acknowledged before any call.
    pub(super) decided: Vec<(usize, Handled)>,
    /// Slots this walk owns, for the calls.
    pub(super) claimed: Vec<Claimed<'a>>,
}

/// Gates `ready` (see the module's overview). A batch's deliveries the
/// plain case does not decide are left out, as is the whole batch when a
/// daily cap cannot cover it (nothing was written).
pub(super) async fn gate<'a>(
    x: &Executor,
    ready: Vec<Ready<'a>>,
    reach: Reach,
) -> Result<Gated<'a>, ExecError> {
    let mut gated = Gated {
        decided: Vec::new(),
        claimed: Vec::new(),
    };
    if reach == Reach::Whole {
        for Ready { i, c, read } in ready {
            let read = read.expect("a delivery walked alone reads its plan in prepare");
            let planned = read.plan.slot.clone();
            let (claim, resumed) = match x.deadline(one(x, &c, &read)).await? {
                Gate::Taken(o) | Gate::Settled(o) => {
                    gated.decided.push((i, Handled::Recorded(o)));
                    continue;
                }
                Gate::Handled => {
                    gated.decided.push((i, Handled::AlreadyHandled));
                    continue;
                }
                Gate::Claimed(claim) => (claim, false),
                Gate::Resume(claim) => (claim, true),
            };
            gated.claimed.push(Claimed {
                i,
                c,
                planned,
                claim,
                draft: None,
                resumed,
            });
        }
        return Ok(gated);
    }
    let started_at = ready.first().map(|r| r.c.started_at);
    let now = x.clock.now();
    let mut ready = ready;
    // The gate's lock order (see `store::gate_batch`).
    ready.sort_by(|a, b| {
        (&a.c.key.kind, a.c.key.day, a.c.key.slot_no).cmp(&(
            &b.c.key.kind,
            b.c.key.day,
            b.c.key.slot_no,
        ))
    });
    let slots: Vec<store::BatchSlot> = ready.iter().map(|r| r.c.batch_slot()).collect();
    let Some(rows) = x
        .deadline(gate_slots(x, &slots, now, store::DraftPick::SkipLocked))
        .await?
    else {
        tracing::debug!(
            deliveries = slots.len(),
            "a daily cap cannot cover the whole batch; deciding its slots one at a time"
        );
        return Ok(gated);
    };
    let mut ready: Vec<Option<Ready<'a>>> = ready.into_iter().map(Some).collect();
    for r in rows.claims {
        let Some(Ready { i, c, .. }) = ready[r.idx as usize].take() else {
            continue;
        };
        let started_at = started_at.unwrap_or(c.started_at);
        crate::telemetry::lag(&c.key.kind, started_at - r.due_at);
        if r.settled {
            let lag_ms = (started_at - r.due_at).num_milliseconds();
            tracing::info!(slot = %c.key, caller = c.d.caller(), draft = r.post_id, lag_ms, "published (record-only, batched)");
            gated
                .decided
                .push((i, Handled::Recorded(Outcome::Published)));
            continue;
        }
        gated.claimed.push(Claimed {
            i,
            planned: PlannedSlot {
                key: c.key.clone(),
                nominal_at: r.nominal_at,
                due_at: r.due_at,
                jitter_ms: (r.due_at - r.nominal_at).num_milliseconds(),
            },
            c,
            claim: Claim {
                row_id: r.gate_id,
                attempt: 1,
                post_id: r.post_id,
            },
            draft: Some(DraftText {
                id: r.post_id,
                title: r.title,
                body: r.body,
                cms_id: r.cms_id,
            }),
            resumed: false,
        });
    }
    Ok(gated)
}

/// The gate for a delivery walked alone: not due → `not_due`; else the
/// plain case as a batch of one ([`plain`]); what it leaves (a settled
/// skip, an existing row to take over or refuse) is decided here.
///
/// The quota unit is taken last, just before the commit: concurrent slots
/// of one kind and day serialize on its row, so the shorter that lock is
/// held the more slots of a kind commit per second. When the cap turns out
/// to be full, the transaction is rolled back (the draft returns to the
/// pool) and a fresh one records `quota_full`. A quota row locked by a
/// stuck session ends the wait at `lock_timeout` with an error: the
/// delivery is retried later and other kinds keep flowing.
///
/// `read.db_now` is Postgres's clock: the starting deadline is judged by it.
#[tracing::instrument(name = "gate", skip_all, fields(slot = %c.key))]
async fn one(x: &Executor, c: &Ctx<'_>, read: &PlanRead) -> Result<Gate, ExecError> {
    let PlanRead {
        plan,
        db_now,
        paused,
    } = read;
    let (db_now, paused) = (*db_now, *paused);
    let planned = &plan.slot;
    let now = x.clock.now();
    let deadline = crate::clock::later(planned.due_at, c.kind.starting_deadline);
    let late = db_now > deadline && !c.exempt.deadline;
    // A slot never runs before its time, whoever calls (see
    // `ahead_of_time`). Judged by Postgres's clock, like the deadline and
    // the batch's filter: a worker whose clock runs fast must not publish
    // early (one clock decides every rule two processes share).
    match ahead_of_time(plan.runs_at(), db_now) {
        Some(ahead) if !c.exempt.early => return not_due(x, c, plan, ahead).await,
        _ => store_plan(x, plan).await?,
    }
    let due = Some(planned.due_at);
    let first = |kind: &str| crate::telemetry::lag(kind, c.started_at - planned.due_at);
    // An outcome known before claiming: the slot is settled by the gate
    // insert itself. A blacked-out day's slot is settled as such, paused
    // or late or not: the calendar decided it before anyone could; a paused
    // kind's slot is settled as paused, late or not.
    let blackout = c.kind.day(c.key.day).blackout;
    let late = late && !paused && !blackout;
    let mut settle = if blackout {
        Some(SkipReason::Blackout)
    } else if paused {
        Some(SkipReason::Paused)
    } else {
        late.then_some(SkipReason::MissedDeadline)
    };
    loop {
        if settle.is_none() {
            match plain(x, c, planned, now).await? {
                Plain::Decided(g) => return Ok(g),
                Plain::Settle(reason) => {
                    settle = Some(reason);
                    continue;
                }
                Plain::Exists => {}
            }
        }
        let mut tx = x.pool.begin().await?;
        if let Some(reason) = settle {
            let o = Outcome::Skipped(reason);
            let late_ms = (db_now - planned.due_at).num_milliseconds();
            let detail = if late {
                json!({"late_ms": late_ms})
            } else {
                json!({})
            };
            let rec = || x.execution(c, o, detail, due);
            if store::settle_skipped(&mut tx, &c.key, reason, &x.worker_id, now, rec).await? {
                tx.commit().await?;
                first(&c.key.kind);
                if late {
                    tracing::warn!(slot = %c.key, caller = c.d.caller(), late_ms, "slot missed its starting deadline; skipped");
                } else {
                    tracing::info!(slot = %c.key, caller = c.d.caller(), reason = reason.as_str(), "slot skipped");
                }
                return Ok(Gate::Settled(o));
            }
        }
        // The row exists: a duplicate, or a slot whose owner died
        // mid-publish. Whether its claim lapsed is Postgres's call
        // (`take_over`); a claim under this worker's id is resumed at
        // once, since this delivery holds the slot in this process.
        let row = store::get_slot(&mut tx, &c.key)
            .await?
            .ok_or(StoreError::RowNotFound)?;
        if row.is_open() {
            if let Some(taken) = store::take_over(
                &mut tx,
                row.id,
                row.attempt,
                &x.worker_id,
                now,
                x.visibility,
            )
            .await?
            {
                if let Some(post_id) = taken.post_id {
                    tx.commit().await?;
                    tracing::info!(slot = %c.key, attempt = taken.attempt, previous = %row.claimed_by, "resuming a slot whose claim expired (or was left by an earlier run of this worker)");
                    return Ok(Gate::Resume(Claim {
                        row_id: taken.id,
                        attempt: taken.attempt,
                        post_id,
                    }));
                }
            }
        }
        // A test build's hook (the `skip-gate` sabotage) may let a
        // duplicate through.
        let rec = || x.execution(c, Outcome::Published, json!({"sabotage": "skip-gate"}), due);
        if x.hooks
            .settle_duplicate(&mut tx, &row, c.kind, now, &rec)
            .await?
        {
            tx.commit().await?;
            return Ok(Gate::Settled(Outcome::Published));
        }
        let o = Outcome::Skipped(SkipReason::SlotTaken);
        let detail = json!({"replay": {"state": row.state, "reason": row.reason, "claimed_by": row.claimed_by, "attempt": row.attempt}});
        let recorded = store::insert_execution(&mut tx, &x.execution(c, o, detail, due)).await?;
        tx.commit().await?;
        if !recorded {
            // This very entry's outcome was committed before (its worker
            // died before acknowledging it): not a duplicate.
            return Ok(Gate::Handled);
        }
        tracing::warn!(slot = %c.key, caller = c.d.caller(), state = %row.state, "duplicate delivery blocked by the gate (slot_taken)");
        return Ok(Gate::Taken(o));
    }
}

/// What the plain case of the gate ([`plain`]) left to do.
enum Plain {
    /// Claimed or settled.
    Decided(Gate),
    /// Not taken; the slot is settled as skipped for this reason.
    Settle(SkipReason),
    /// The slot has a gate row already.
    Exists,
}

/// The plain case of the gate for one delivery: a [`store::gate_batch`]
/// of one, so a batch and a delivery alone run the same statements. The
/// starting deadline was judged by the caller (the slot goes in as exempt).
async fn plain(
    x: &Executor,
    c: &Ctx<'_>,
    planned: &PlannedSlot,
    now: DateTime<Utc>,
) -> Result<Plain, ExecError> {
    let slot = store::BatchSlot {
        exempt: true,
        ..c.batch_slot()
    };
    let one = std::slice::from_ref(&slot);
    let mut gated = gate_slots(x, one, now, store::DraftPick::SkipLocked).await?;
    if gated.as_ref().is_some_and(|g| !g.no_draft.is_empty()) {
        // The fast pick skips drafts other transactions hold, which they
        // may yet give back: ask again, waiting for them, before recording
        // that there was none (`store::DraftPick`).
        gated = gate_slots(x, one, now, store::DraftPick::Wait).await?;
    }
    let Some(gated) = gated else {
        return Ok(Plain::Settle(SkipReason::QuotaFull));
    };
    if let Some(r) = gated.claims.into_iter().next() {
        crate::telemetry::lag(&c.key.kind, c.started_at - planned.due_at);
        if r.settled {
            let lag_ms = (c.started_at - planned.due_at).num_milliseconds();
            tracing::info!(slot = %c.key, caller = c.d.caller(), draft = r.post_id, lag_ms, "published (record-only)");
            return Ok(Plain::Decided(Gate::Settled(Outcome::Published)));
        }
        return Ok(Plain::Decided(Gate::Claimed(Claim {
            row_id: r.gate_id,
            attempt: 1,
            post_id: r.post_id,
        })));
    }
    if gated.no_draft.is_empty() {
        return Ok(Plain::Exists);
    }
    // No ready draft. With the cap used up as well, the cap is the reason.
    let mut conn = x.pool.acquire().await?;
    let used = store::quota_used(&mut conn, &c.key.kind, c.key.day).await?;
    Ok(Plain::Settle(
        if used >= i64::from(c.kind.day(c.key.day).daily_cap) {
            SkipReason::QuotaFull
        } else {
            SkipReason::NoReadyDraft
        },
    ))
}

/// The one gate ([`store::gate_batch`]) for `slots`, under this worker's id
/// and epoch, a webhook claim lasting `visibility`. `None`: a cap could not
/// cover them and nothing was written.
async fn gate_slots(
    x: &Executor,
    slots: &[store::BatchSlot],
    now: DateTime<Utc>,
    pick: store::DraftPick,
) -> Result<Option<store::BatchGate>, StoreError> {
    let expires = crate::clock::later(now, x.visibility);
    store::gate_batch(
        &x.pool,
        &x.gate_turn,
        slots,
        &x.worker_id,
        x.epoch(),
        now,
        expires,
        pick,
    )
    .await
}

/// Stores the plan of a slot nobody planned, as it runs.
async fn store_plan(x: &Executor, plan: &Plan) -> Result<(), ExecError> {
    if !plan.stored {
        let mut conn = x.pool.acquire().await?;
        store::insert_planned(&mut conn, std::slice::from_ref(&plan.slot), "delivery").await?;
    }
    Ok(())
}

/// Records a delivery that came more than
/// [`EARLY_TOLERANCE`](crate::slot::EARLY_TOLERANCE) before its slot's
/// time: an execution row and nothing else — no gate row, no draft, no
/// unit of the cap — so the slot still runs at its time.
async fn not_due(
    x: &Executor,
    c: &Ctx<'_>,
    plan: &Plan,
    ahead: chrono::Duration,
) -> Result<Gate, ExecError> {
    let o = Outcome::Skipped(SkipReason::NotDue);
    let runs_at = plan.runs_at();
    let ahead_ms = ahead.num_milliseconds();
    let detail =
        json!({"runs_at": runs_at.to_rfc3339(), "ahead_ms": ahead_ms, "planned": plan.stored});
    let mut conn = x.pool.acquire().await?;
    let rec = x.execution(c, o, detail, Some(plan.slot.due_at));
    if !store::insert_execution(&mut conn, &rec).await? {
        return Ok(Gate::Handled);
    }
    tracing::warn!(slot = %c.key, caller = c.d.caller(), %runs_at, ahead_ms, "delivery came before its slot's time; recorded skipped/not_due and ran nothing (the slot still runs at its time; planner trigger --early runs it now)");
    Ok(Gate::Settled(o))
}

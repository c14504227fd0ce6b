//! The gate for one delivery: read the plan, refuse what is not due, then
//! the one gate as a batch of one, and what the plain case leaves: a
//! settled skip (paused, missed deadline, no draft, cap full), an open
//! claim to take over, or a duplicate refused as `slot_taken`.

use super::plan::Plan;
use super::{Claim, Ctx, ExecError, Executor, Gate};
use crate::outcome::{Outcome, SkipReason};
use crate::slot::ahead_of_time;
use crate::slot::PlannedSlot;
use crate::store::{self, StoreError};
use chrono::{DateTime, Utc};
use serde_json::json;
use std::collections::HashSet;

/// What the plain gate ([`Executor::gate_one`]) left to do.
pub(super) enum GateOne {
    /// Claimed or settled.
    Decided(Gate),
    /// Not taken; the slot is settled as skipped for this reason.
    Settle(SkipReason),
    /// The slot has a gate row already.
    Exists,
}

impl Executor {
    /// Gate → pick → quota, in one transaction: the plain case is the one
    /// gate as a batch of one ([`Executor::gate_one`]); what it leaves (a
    /// settled skip, an existing row to take over or refuse) is decided here.
    ///
    /// The quota unit is taken last, just before the commit: concurrent slots
    /// of one kind and day serialize on its row, so the shorter that lock is
    /// held the more slots of a kind commit per second. When the cap turns out
    /// to be full, the transaction is rolled back (the draft returns to the
    /// pool) and a fresh one records `quota_full`. A quota row locked by a
    /// stuck session ends the wait at `lock_timeout` with an error: the
    /// delivery is retried later and other kinds keep flowing.
    ///
    /// `db_now` is Postgres's clock: the starting deadline is judged by it.
    #[tracing::instrument(name = "gate", skip_all, fields(slot = %c.key))]
    pub(super) async fn gate(
        &self,
        c: &Ctx<'_>,
        plan: &Plan,
        db_now: DateTime<Utc>,
        paused: bool,
    ) -> Result<Gate, ExecError> {
        let planned = &plan.slot;
        let now = self.clock.now();
        let deadline = crate::clock::later(planned.due_at, c.kind.starting_deadline);
        let late = db_now > deadline && !c.exempt.deadline;
        // A slot never runs before its time, whoever calls (see
        // `ahead_of_time`). Judged by this worker's (injected) clock, like
        // the batch path's filter: the minute of tolerance dwarfs the skew a
        // worker is warned about (1 s).
        match ahead_of_time(plan.runs_at(), now) {
            Some(ahead) if !c.exempt.early => return self.skip_not_due(c, plan, ahead).await,
            _ => self.store_plan(plan).await?,
        }
        let due = Some(planned.due_at);
        let first = |kind: &str| crate::telemetry::lag(kind, c.started_at - planned.due_at);
        // An outcome known before claiming: the slot is settled by the gate
        // insert itself.
        // A paused kind's slot is settled as paused, late or not.
        let late = late && !paused;
        let mut settle = if paused {
            Some(SkipReason::Paused)
        } else {
            late.then_some(SkipReason::MissedDeadline)
        };
        loop {
            if settle.is_none() {
                match self.gate_one(c, planned, now).await? {
                    GateOne::Decided(g) => return Ok(g),
                    GateOne::Settle(reason) => {
                        settle = Some(reason);
                        continue;
                    }
                    GateOne::Exists => {}
                }
            }
            let mut tx = self.pool.begin().await?;
            if let Some(reason) = settle {
                let o = Outcome::Skipped(reason);
                let late_ms = (db_now - planned.due_at).num_milliseconds();
                let detail = if late {
                    json!({"late_ms": late_ms})
                } else {
                    json!({})
                };
                let rec = || self.record(c, o, detail, due);
                if store::settle_skipped(&mut tx, &c.key, reason, &self.worker_id, now, rec).await?
                {
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
                    &self.worker_id,
                    now,
                    self.visibility,
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
            let rec = || self.record(c, Outcome::Published, json!({"sabotage": "skip-gate"}), due);
            if self
                .hooks
                .settle_duplicate(&mut tx, &row, c.kind, now, &rec)
                .await?
            {
                tx.commit().await?;
                return Ok(Gate::Settled(Outcome::Published));
            }
            let o = Outcome::Skipped(SkipReason::SlotTaken);
            let detail = json!({"replay": {"state": row.state, "reason": row.reason, "claimed_by": row.claimed_by, "attempt": row.attempt}});
            let recorded =
                store::insert_execution(&mut tx, &self.record(c, o, detail, due)).await?;
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

    /// The plain case of the gate for one delivery: a [`store::gate_batch`]
    /// of one, so both paths run the same statements. The starting deadline
    /// was judged by the caller (the slot goes in as exempt).
    pub(super) async fn gate_one(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        now: DateTime<Utc>,
    ) -> Result<GateOne, ExecError> {
        let slot = store::BatchSlot {
            exempt: true,
            ..c.batch_slot()
        };
        let one = std::slice::from_ref(&slot);
        let mut gated = self
            .gate_slots(one, now, store::DraftPick::SkipLocked)
            .await?;
        if gated.as_ref().is_some_and(|g| !g.no_draft.is_empty()) {
            // The fast pick skips drafts other transactions hold, which
            // they may yet give back: ask again, waiting for them, before
            // recording that there was none (`store::DraftPick`).
            gated = self.gate_slots(one, now, store::DraftPick::Wait).await?;
        }
        let Some(gated) = gated else {
            return Ok(GateOne::Settle(SkipReason::QuotaFull));
        };
        if let Some(r) = gated.claims.into_iter().next() {
            crate::telemetry::lag(&c.key.kind, c.started_at - planned.due_at);
            if r.settled {
                let lag_ms = (c.started_at - planned.due_at).num_milliseconds();
                tracing::info!(slot = %c.key, caller = c.d.caller(), draft = r.post_id, lag_ms, "published (record-only)");
                return Ok(GateOne::Decided(Gate::Settled(Outcome::Published)));
            }
            return Ok(GateOne::Decided(Gate::Claimed(Claim {
                row_id: r.gate_id,
                attempt: 1,
                post_id: r.post_id,
            })));
        }
        if gated.no_draft.is_empty() {
            return Ok(GateOne::Exists);
        }
        // No ready draft. With the cap used up as well, the cap is the reason.
        let mut conn = self.pool.acquire().await?;
        let used = store::quota_used(&mut conn, &c.key.kind, c.key.day).await?;
        Ok(GateOne::Settle(if used >= i64::from(c.kind.daily_cap) {
            SkipReason::QuotaFull
        } else {
            SkipReason::NoReadyDraft
        }))
    }

    /// The one gate ([`store::gate_batch`]) for `slots`, under this
    /// worker's id and epoch, a webhook claim lasting `visibility`. `None`:
    /// a cap could not cover them and nothing was written.
    pub(super) async fn gate_slots(
        &self,
        slots: &[store::BatchSlot],
        now: DateTime<Utc>,
        pick: store::DraftPick,
    ) -> Result<Option<store::BatchGate>, StoreError> {
        let expires = crate::clock::later(now, self.visibility);
        store::gate_batch(
            &self.pool,
            slots,
            &self.worker_id,
            self.epoch(),
            now,
            expires,
            pick,
        )
        .await
    }

    /// Before a gate: each of these kinds whose drafts live at its CMS
    /// (WordPress) mirrors them first, so a post made ready shortly before
    /// its slot is seen ([`crate::receiver::Receiver::refresh_drafts`],
    /// bounded by the receiver; nothing for the other kinds). Both
    /// delivery paths call it, each kind once.
    pub(super) async fn refresh_drafts(&self, kinds: &[&str]) {
        let mut seen = HashSet::new();
        for &kind in kinds {
            if let (true, Some(route)) = (seen.insert(kind), self.receivers.route(kind)) {
                route.receiver.refresh_drafts(&self.pool).await;
            }
        }
    }
}

//! One delivery, start to finish: validate → gate → quota → pick → publish →
//! record → acknowledge.
//!
//! The gate is the `publish_slot` unique row; the quota is a conditional
//! upsert; the pick is `FOR UPDATE SKIP LOCKED`. All three commit in one
//! transaction with the draft bound to the slot, so a crash before the commit
//! leaves nothing behind and a crash after it leaves an open claim that the
//! next delivery resumes under the same key with the same draft.
//!
//! Every delivery ends in exactly one `execution` row, written in the same
//! transaction as the state it reports, and the stream entry is acknowledged
//! only after that commit.
//!
//! [`Executor::batch`] is the same pipeline for many deliveries at once
//! (a backlog): one gate commit for the batch, its webhook calls concurrent,
//! one commit for their outcomes. It decides only the plain case and leaves
//! everything else to [`Executor::handle`]; see the `gate_batch` migration.

use crate::clock::{unix_ms, SharedClock};
use crate::config::{Config, KindConfig};
use crate::outcome::{FailReason, Outcome, SkipReason};
use crate::publish::{CallReport, Webhook};
use crate::queue::{Delivery, Queue, QueueError};
use crate::retry::RetryPolicy;
use crate::slot::{planned_slot, PlannedSlot, SlotKey};
use crate::store::{self, ExecutionRecord, StoreError};
use chrono::{DateTime, Utc};
use rand::SeedableRng;
use serde_json::{json, Value};
use sqlx::PgPool;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A delivery seen more times than this is dead-lettered (`max_deliveries`).
pub const MAX_DELIVERIES: u64 = 10;

/// Callers that asked for a late run on purpose: exempt from `starting_deadline`.
pub const DEADLINE_EXEMPT: &[&str] = &["manual", "backfill"];

/// A `starting_deadline` longer than this (100 years) is treated as this,
/// so it fits a Postgres interval.
const MAX_DEADLINE_MS: i64 = 100 * 366 * 24 * 3600 * 1000;

/// What handling a delivery came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Handled {
    /// The delivery's outcome was recorded and the entry acknowledged.
    Recorded(Outcome),
    /// The entry's outcome had been recorded before (a redelivery after a
    /// crash between commit and acknowledgement); acknowledged, no new row.
    AlreadyHandled,
}

/// Infrastructure failures: the delivery is *not* acknowledged and will be
/// handled again.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("postgres: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

/// The gate's answer.
#[derive(Debug)]
pub enum Gate {
    /// This delivery owns the slot, with a draft bound to it.
    Claimed(Claim),
    /// Someone else owns or finished the slot; `slot_taken` is recorded.
    Taken(Outcome),
    /// This delivery decided the slot inside the gate transaction
    /// (`quota_full`, `no_ready_draft`, `missed_deadline`, or a record-only
    /// publish); the outcome is recorded.
    Settled(Outcome),
    /// The slot's previous owner died mid-publish; this delivery resumes it.
    Resume(Claim),
    /// This stream entry's outcome is already recorded (a redelivery after a
    /// crash between commit and acknowledgement): nothing new is written.
    /// The `execution.entry_id` upsert detects it, so the hot path needs no
    /// separate look-up.
    Handled,
}

/// A slot this delivery owns, fenced by `(worker, attempt)`.
#[derive(Debug, Clone)]
pub struct Claim {
    pub row_id: i64,
    pub attempt: i32,
    pub post_id: i64,
}

/// Executes deliveries. Cheap to clone; one per worker.
#[derive(Clone)]
pub struct Executor {
    pub config: Arc<Config>,
    pub pool: PgPool,
    pub queue: Queue,
    pub webhook: Webhook,
    pub clock: SharedClock,
    /// Also the consumer name in the stream group.
    pub worker_id: String,
    /// How long a claim lives without a heartbeat.
    pub visibility: Duration,
    /// The leader epoch this worker last saw (0 = none yet).
    pub epoch_seen: Arc<AtomicI64>,
    /// Replaces each kind's webhook retry policy (tests use short delays).
    pub retry_override: Option<RetryPolicy>,
}

struct Ctx<'a> {
    d: &'a Delivery,
    key: SlotKey,
    kind: &'a KindConfig,
    started_at: DateTime<Utc>,
}

impl Executor {
    fn epoch(&self) -> Option<i64> {
        Some(self.epoch_seen.load(Ordering::Relaxed)).filter(|e| *e > 0)
    }

    fn record(
        &self,
        c: &Ctx<'_>,
        outcome: Outcome,
        detail: Value,
        due_at: Option<DateTime<Utc>>,
    ) -> ExecutionRecord {
        ExecutionRecord {
            slot_key: c.key.to_string(),
            key: Some(c.key.clone()),
            entry_id: Some(c.d.entry_id.clone()),
            caller: c.d.caller().to_owned(),
            worker_id: self.worker_id.clone(),
            leader_epoch: self.epoch(),
            outcome: outcome.as_str(),
            reason: outcome.reason(),
            detail,
            due_at,
            started_at: c.started_at,
            finished_at: self.clock.now(),
        }
    }

    /// Handles one delivery completely, acknowledging it at the end. An
    /// `Err` means nothing was acknowledged; the entry stays pending.
    pub async fn handle(&self, d: &Delivery) -> Result<Handled, ExecError> {
        let started_at = self.clock.now();
        if d.deliveries > MAX_DELIVERIES {
            let detail = json!({"deliveries": d.deliveries});
            return self
                .dead_letter(d, FailReason::MaxDeliveries, detail, started_at)
                .await;
        }
        let (key, kind) = match self.validate(d) {
            Ok(v) => v,
            Err((reason, why)) => {
                return self
                    .dead_letter(d, reason, json!({"error": why}), started_at)
                    .await
            }
        };
        let c = Ctx {
            d,
            key,
            kind,
            started_at,
        };
        let (planned, paused) = self.planned(&c).await?;
        let outcome = match self.gate(&c, &planned, paused).await? {
            Gate::Taken(o) | Gate::Settled(o) => o,
            Gate::Claimed(claim) => self.publish(&c, &planned, claim, false).await?,
            Gate::Resume(claim) => self.publish(&c, &planned, claim, true).await?,
            Gate::Handled => {
                self.queue.ack(&d.entry_id).await?;
                tracing::info!(entry = %d.entry_id, slot = %c.key, "entry already handled; acknowledged again");
                return Ok(Handled::AlreadyHandled);
            }
        };
        self.queue.ack(&d.entry_id).await?;
        crate::telemetry::execution(&c.key.kind, outcome.as_str(), outcome.reason());
        Ok(Handled::Recorded(outcome))
    }

    /// Whether `d` may go through [`Executor::batch`]: a valid delivery
    /// under the delivery limit. Anything else (malformed, poisoned) needs
    /// the one-delivery path, which dead-letters it.
    pub fn batchable(&self, d: &Delivery) -> bool {
        d.deliveries <= MAX_DELIVERIES && self.validate(d).is_ok()
    }

    /// The batch path: takes the plain deliveries of `ds` (all
    /// [`Executor::batchable`]) through the gate in one statement and one
    /// commit; record-only slots are settled there, webhook slots are
    /// claimed, published concurrently and recorded together in a second
    /// statement. Then everything it decided is acknowledged at once.
    /// Returns the indexes into `ds` it decided; the others were left
    /// untouched and go through [`Executor::handle`].
    ///
    /// On `Err` the caller runs *every* delivery through `handle`: one whose
    /// outcome committed is found by its entry id (`Gate::Handled`); a
    /// webhook slot claimed here but not recorded is an open claim, exactly
    /// as after a crash mid-publish, and is resumed under the same key once
    /// the claim lapses.
    pub async fn batch(&self, ds: &[Delivery]) -> Result<Vec<usize>, ExecError> {
        let started_at = self.clock.now();
        // Deliveries of a paused kind are left to `handle`, which records
        // them skipped/paused (one read per batch).
        let paused = crate::pause::paused_kinds(&self.pool, started_at).await?;
        let mut items: Vec<(usize, store::BatchSlot)> = ds
            .iter()
            .enumerate()
            .filter_map(|(i, d)| {
                let (key, kind) = self.validate(d).ok()?;
                if paused.contains(&key.kind) {
                    return None;
                }
                let deadline_ms = i64::try_from(kind.starting_deadline.as_millis())
                    .unwrap_or(i64::MAX)
                    .min(MAX_DEADLINE_MS);
                Some((
                    i,
                    store::BatchSlot {
                        key,
                        entry_id: d.entry_id.clone(),
                        caller: d.caller().to_owned(),
                        exempt: DEADLINE_EXEMPT.contains(&d.caller()),
                        deadline_ms,
                        cap: kind.daily_cap,
                        started_at,
                        record_only: kind.publish_url.is_none(),
                    },
                ))
            })
            .collect();
        // The gate function's lock order (see its migration).
        items.sort_by(|a, b| {
            (&a.1.key.kind, a.1.key.day, a.1.key.slot_no).cmp(&(
                &b.1.key.kind,
                b.1.key.day,
                b.1.key.slot_no,
            ))
        });
        let (index, slots): (Vec<usize>, Vec<store::BatchSlot>) = items.into_iter().unzip();
        let now = self.clock.now();
        let expires =
            now + chrono::Duration::from_std(self.visibility).expect("visibility in range");
        let Some(rows) = store::gate_batch(
            &self.pool,
            &slots,
            &self.worker_id,
            self.epoch(),
            now,
            expires,
        )
        .await?
        else {
            tracing::debug!(
                deliveries = ds.len(),
                "a daily cap cannot cover the whole batch; deciding its slots one at a time"
            );
            return Ok(Vec::new());
        };
        for r in &rows {
            crate::telemetry::lag(&slots[r.idx as usize].key.kind, started_at - r.due_at);
        }
        let (settled, claimed): (Vec<_>, Vec<_>) = rows.into_iter().partition(|r| r.settled);
        let recorded = self.publish_claimed(ds, &index, &slots, claimed).await?;
        let entries: Vec<&str> = settled
            .iter()
            .map(|r| slots[r.idx as usize].entry_id.as_str())
            .chain(recorded.iter().map(|(i, _)| slots[*i].entry_id.as_str()))
            .collect();
        self.queue.ack_all(&entries).await?;
        let mut done = Vec::with_capacity(entries.len());
        for r in &settled {
            let b = &slots[r.idx as usize];
            crate::telemetry::execution(&b.key.kind, "published", None);
            let lag_ms = (started_at - r.due_at).num_milliseconds();
            tracing::info!(slot = %b.key, caller = %b.caller, draft = r.post_id, lag_ms, "published (record-only, batched)");
            done.push(index[r.idx as usize]);
        }
        for (i, o) in &recorded {
            crate::telemetry::execution(&slots[*i].key.kind, o.as_str(), o.reason());
            done.push(index[*i]);
        }
        Ok(done)
    }

    /// Publishes the webhook slots a batch claimed, all at once, and records
    /// their outcomes in one statement. Returns (slot index, outcome).
    async fn publish_claimed(
        &self,
        ds: &[Delivery],
        index: &[usize],
        slots: &[store::BatchSlot],
        claimed: Vec<store::BatchClaim>,
    ) -> Result<Vec<(usize, Outcome)>, ExecError> {
        if claimed.is_empty() {
            return Ok(Vec::new());
        }
        let work: Vec<(Ctx<'_>, PlannedSlot, Claim, DraftText, usize)> = claimed
            .into_iter()
            .map(|r| {
                let b = &slots[r.idx as usize];
                let kind = self.config.kind(&b.key.kind).expect("validated kind");
                let planned = PlannedSlot {
                    key: b.key.clone(),
                    nominal_at: r.nominal_at,
                    due_at: r.due_at,
                    jitter_ms: (r.due_at - r.nominal_at).num_milliseconds(),
                };
                let c = Ctx {
                    d: &ds[index[r.idx as usize]],
                    key: b.key.clone(),
                    kind,
                    started_at: b.started_at,
                };
                let claim = Claim {
                    row_id: r.gate_id,
                    attempt: 1,
                    post_id: r.post_id,
                };
                let draft = DraftText {
                    id: r.post_id,
                    title: r.title,
                    body: r.body,
                };
                (c, planned, claim, draft, r.idx as usize)
            })
            .collect();
        // Every claim keeps its heartbeat until the batch's outcomes are
        // committed, not just until its own call returned: the batch waits
        // for its slowest call, and a finished slot's claim must not lapse
        // meanwhile. (Dropped on an early return, they stop by themselves.)
        let heartbeats: Vec<Heartbeat> = work
            .iter()
            .map(|(c, _, claim, _, _)| self.heartbeat(claim, &c.d.entry_id))
            .collect();
        let effects = futures_util::future::join_all(
            work.iter()
                .map(|(c, planned, claim, draft, _)| self.calls(c, planned, claim, draft, false)),
        )
        .await;
        let mut rows = Vec::with_capacity(work.len());
        let mut outcomes = Vec::with_capacity(work.len());
        for (i, ((c, planned, claim, _, _), (publish, detail))) in
            work.iter().zip(effects).enumerate()
        {
            let (outcome, response, url, detail) = settle_fields(&publish, detail);
            let saw_loss = heartbeats[i].lost.load(Ordering::Relaxed);
            let lost_detail = json!({"claim_lost": true, "attempt": claim.attempt, "heartbeat_saw_loss": saw_loss});
            rows.push(store::BatchFinish {
                idx: i,
                id: claim.row_id,
                attempt: claim.attempt,
                post_id: claim.post_id,
                state: outcome.as_str(),
                reason: outcome.reason(),
                response,
                url,
                slot_key: c.key.to_string(),
                kind: c.key.kind.clone(),
                day: c.key.day,
                slot: c.key.slot_no as i32,
                entry_id: c.d.entry_id.clone(),
                caller: c.d.caller().to_owned(),
                detail,
                lost_detail,
                due_at: planned.due_at,
                started_at: c.started_at,
            });
            outcomes.push(outcome);
        }
        let fenced = store::finish_batch(
            &self.pool,
            &rows,
            &self.worker_id,
            self.epoch(),
            self.clock.now(),
        )
        .await?;
        for hb in heartbeats {
            hb.stop().await;
        }
        let mut out = Vec::with_capacity(fenced.len());
        for (i, held) in fenced {
            let (c, planned, claim, _, si) = &work[i];
            let o = if held {
                self.log_finished(c, planned, claim, outcomes[i], &rows[i].detail);
                outcomes[i]
            } else {
                tracing::warn!(slot = %c.key, attempt = claim.attempt, "claim lost to a takeover; recorded slot_taken (claim_lost) and changed nothing");
                Outcome::Skipped(SkipReason::SlotTaken)
            };
            out.push((*si, o));
        }
        Ok(out)
    }

    fn validate(&self, d: &Delivery) -> Result<(SlotKey, &KindConfig), (FailReason, String)> {
        let raw = d
            .slot()
            .ok_or((FailReason::BadMessage, "missing field `slot`".to_owned()))?;
        let key: SlotKey = raw
            .parse()
            .map_err(|e| (FailReason::BadMessage, format!("slot {raw:?}: {e}")))?;
        let kind = self.config.kind(&key.kind).ok_or((
            FailReason::UnknownKind,
            format!("kind {:?} is not configured", key.kind),
        ))?;
        if key.slot_no as usize > kind.slots.len() {
            return Err((
                FailReason::UnknownSlot,
                format!("slot_no {} outside 1..={}", key.slot_no, kind.slots.len()),
            ));
        }
        Ok((key, kind))
    }

    /// Records a malformed or hopeless delivery, then moves it to `P:dead`.
    async fn dead_letter(
        &self,
        d: &Delivery,
        reason: FailReason,
        detail: Value,
        started_at: DateTime<Utc>,
    ) -> Result<Handled, ExecError> {
        let raw = d.slot().unwrap_or("");
        let key: Option<SlotKey> = raw.parse().ok();
        let rec = ExecutionRecord {
            slot_key: raw.to_owned(),
            key: key.filter(|k| {
                self.config
                    .kind(&k.kind)
                    .is_some_and(|kc| k.slot_no as usize <= kc.slots.len())
            }),
            entry_id: Some(d.entry_id.clone()),
            caller: d.caller().to_owned(),
            worker_id: self.worker_id.clone(),
            leader_epoch: self.epoch(),
            outcome: "failed",
            reason: Some(reason.as_str()),
            detail,
            due_at: None,
            started_at,
            finished_at: self.clock.now(),
        };
        let mut conn = self.pool.acquire().await?;
        store::insert_execution(&mut conn, &rec).await?;
        drop(conn);
        self.queue
            .dead_letter(d, reason.as_str(), unix_ms(self.clock.now()))
            .await?;
        tracing::warn!(entry = %d.entry_id, slot = raw, caller = d.caller(), reason = reason.as_str(), deliveries = d.deliveries, "delivery dead-lettered");
        crate::telemetry::dead_letter(reason.as_str());
        crate::telemetry::execution(
            rec.key.as_ref().map_or("", |k| k.kind.as_str()),
            "failed",
            Some(reason.as_str()),
        );
        Ok(Handled::Recorded(Outcome::Failed(reason)))
    }

    /// The slot's stored plan; a delivery for a slot that was never planned
    /// (injected by hand) plans it on the spot — the plan is a pure function
    /// of the config, so this is the same row the planner would write.
    /// Also says whether the slot's kind is paused (same statement).
    async fn planned(&self, c: &Ctx<'_>) -> Result<(PlannedSlot, bool), ExecError> {
        let mut conn = self.pool.acquire().await?;
        let (stored, paused) =
            crate::pause::planned_and_paused(&mut conn, &c.key, self.clock.now()).await?;
        if let Some(p) = stored {
            return Ok((p, paused));
        }
        let p = planned_slot(c.kind, c.key.day, c.key.slot_no, &self.config.jitter_seed)
            .expect("validated slot_no");
        store::insert_planned(&mut conn, std::slice::from_ref(&p), "delivery").await?;
        Ok((
            store::get_planned(&mut conn, &c.key).await?.unwrap_or(p),
            paused,
        ))
    }

    /// Gate → pick → quota, in one transaction.
    ///
    /// The quota unit is taken last, just before the commit: concurrent slots
    /// of one kind and day serialize on its row, so the shorter that lock is
    /// held the more slots of a kind commit per second. When the cap turns out
    /// to be full, the transaction is rolled back (the draft returns to the
    /// pool) and a fresh one records `quota_full`.
    async fn gate(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        paused: bool,
    ) -> Result<Gate, ExecError> {
        let now = self.clock.now();
        let deadline = planned.due_at
            + chrono::Duration::from_std(c.kind.starting_deadline).unwrap_or(chrono::Duration::MAX);
        let late = now > deadline && !DEADLINE_EXEMPT.contains(&c.d.caller());
        let expires =
            now + chrono::Duration::from_std(self.visibility).expect("visibility in range");
        let due = Some(planned.due_at);
        let key_s = c.key.to_string();
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
            let mut tx = self.pool.begin().await?;
            if let Some(reason) = settle {
                if store::gate_insert(
                    &mut tx,
                    &c.key,
                    "skipped",
                    Some(reason.as_str()),
                    &self.worker_id,
                    None,
                    now,
                )
                .await?
                .is_some()
                {
                    let o = Outcome::Skipped(reason);
                    let late_ms = (now - planned.due_at).num_milliseconds();
                    let detail = if late {
                        json!({"late_ms": late_ms})
                    } else {
                        json!({})
                    };
                    store::insert_execution(&mut tx, &self.record(c, o, detail, due)).await?;
                    tx.commit().await?;
                    first(&c.key.kind);
                    if late {
                        tracing::warn!(slot = %c.key, caller = c.d.caller(), late_ms, "slot missed its starting deadline; skipped");
                    } else {
                        tracing::info!(slot = %c.key, caller = c.d.caller(), reason = reason.as_str(), "slot skipped");
                    }
                    return Ok(Gate::Settled(o));
                }
            } else if let Some(id) = store::gate_insert(
                &mut tx,
                &c.key,
                "claimed",
                None,
                &self.worker_id,
                Some(expires),
                now,
            )
            .await?
            {
                let record_only = c.kind.publish_url.is_none();
                let Some((post_id, url)) =
                    store::claim_draft(&mut tx, &c.key.kind, now, &key_s, record_only).await?
                else {
                    first(&c.key.kind);
                    // With the cap used up as well, the cap is the reason.
                    let used = store::quota_used(&mut tx, &c.key.kind, c.key.day).await?;
                    let reason = if used >= i64::from(c.kind.daily_cap) {
                        SkipReason::QuotaFull
                    } else {
                        SkipReason::NoReadyDraft
                    };
                    return self.skip_fresh(tx, c, id, reason, due).await;
                };
                let settled = if record_only {
                    // Nothing leaves Postgres, so the whole slot — gate,
                    // draft, quota, outcome — commits as one transaction.
                    let response = json!({"url": url, "record_only": true});
                    store::set_slot_draft(&mut tx, id, post_id, "published", Some(&response), now)
                        .await?;
                    store::insert_execution(
                        &mut tx,
                        &self.record(c, Outcome::Published, json!({"url": url}), due),
                    )
                    .await?;
                    true
                } else {
                    store::set_slot_draft(&mut tx, id, post_id, "publishing", None, now).await?;
                    false
                };
                if !store::take_quota(&mut tx, &c.key.kind, c.key.day, c.kind.daily_cap).await? {
                    tx.rollback().await?;
                    settle = Some(SkipReason::QuotaFull);
                    continue;
                }
                tx.commit().await?;
                first(&c.key.kind);
                if settled {
                    let lag_ms = (c.started_at - planned.due_at).num_milliseconds();
                    tracing::info!(slot = %c.key, caller = c.d.caller(), draft = post_id, lag_ms, "published (record-only)");
                    return Ok(Gate::Settled(Outcome::Published));
                }
                return Ok(Gate::Claimed(Claim {
                    row_id: id,
                    attempt: 1,
                    post_id,
                }));
            }
            // The row exists: a duplicate, or a slot whose owner died mid-publish.
            let row = store::get_slot(&mut tx, &c.key)
                .await?
                .ok_or(StoreError::RowNotFound)?;
            if row.is_open() && row.claim_expires_at.is_none_or(|t| t < now) {
                if let Some(taken) =
                    store::take_over(&mut tx, row.id, row.attempt, &self.worker_id, now, expires)
                        .await?
                {
                    if let Some(post_id) = taken.post_id {
                        tx.commit().await?;
                        tracing::info!(slot = %c.key, attempt = taken.attempt, previous = %row.claimed_by, "resuming a slot whose claim expired");
                        return Ok(Gate::Resume(Claim {
                            row_id: taken.id,
                            attempt: taken.attempt,
                            post_id,
                        }));
                    }
                }
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

    async fn skip_fresh(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
        c: &Ctx<'_>,
        id: i64,
        reason: SkipReason,
        due: Option<DateTime<Utc>>,
    ) -> Result<Gate, ExecError> {
        store::set_slot_skipped(&mut tx, id, reason.as_str(), self.clock.now()).await?;
        let o = Outcome::Skipped(reason);
        store::insert_execution(&mut tx, &self.record(c, o, json!({}), due)).await?;
        tx.commit().await?;
        tracing::info!(slot = %c.key, caller = c.d.caller(), reason = reason.as_str(), "slot skipped");
        Ok(Gate::Settled(o))
    }

    fn policy(&self, kind: &KindConfig) -> RetryPolicy {
        self.retry_override.unwrap_or(RetryPolicy {
            max_attempts: kind.http_attempts,
            base: kind.retry_base,
            cap: kind.retry_cap,
        })
    }

    /// Publish → index → record, for a slot this delivery owns.
    async fn publish(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: Claim,
        resumed: bool,
    ) -> Result<Outcome, ExecError> {
        let draft = {
            let mut conn = self.pool.acquire().await?;
            store::get_draft(&mut conn, claim.post_id)
                .await?
                .ok_or(StoreError::RowNotFound)?
        };
        let draft = DraftText {
            id: draft.id,
            title: draft.title,
            body: draft.body,
        };
        // The heartbeat keeps the claim and the stream entry alive while the
        // calls run.
        let heartbeat = self.heartbeat(&claim, &c.d.entry_id);
        let (publish, detail) = self.calls(c, planned, &claim, &draft, resumed).await;
        let claim_lost = heartbeat.stop().await;
        let effect = Effect {
            publish,
            detail,
            claim_lost,
        };
        self.finish(c, planned, &claim, effect).await
    }

    /// The external calls for a claimed slot: publish (or record-only), then
    /// the index push. Records nothing; the caller keeps the claim's
    /// heartbeat running around it.
    async fn calls(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        draft: &DraftText,
        resumed: bool,
    ) -> (
        Result<(String, Value, u32), CallReport>,
        serde_json::Map<String, Value>,
    ) {
        let key_s = c.key.to_string();
        let mut rng = rand::rngs::StdRng::from_entropy();
        let policy = self.policy(c.kind);
        let mut detail = serde_json::Map::new();
        if resumed {
            detail.insert("resumed".into(), json!(true));
            detail.insert("attempt".into(), json!(claim.attempt));
        }
        // Publish (or record-only).
        let publish: Result<(String, Value, u32), CallReport> = match &c.kind.publish_url {
            None => {
                let url = format!("record-only://{}/{}", c.key.kind, draft.id);
                Ok((url.clone(), json!({"url": url, "record_only": true}), 0))
            }
            Some(url) => {
                let body = json!({
                    "slot": key_s, "kind": c.key.kind, "day": c.key.day.to_string(), "slot_no": c.key.slot_no,
                    "nominal_at": planned.nominal_at.to_rfc3339(), "due_at": planned.due_at.to_rfc3339(),
                    "draft": {"id": draft.id, "title": draft.title, "body": draft.body},
                });
                let report = self
                    .webhook
                    .call(
                        "publish",
                        url,
                        &key_s,
                        &body,
                        c.kind.http_timeout,
                        policy,
                        &mut rng,
                    )
                    .await;
                match &report.result {
                    Ok(answer) => {
                        let url = answer
                            .body
                            .as_ref()
                            .and_then(|b| b.get("url"))
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                            .unwrap_or_else(|| format!("{url}#{key_s}"));
                        Ok((
                            url,
                            answer.body.clone().unwrap_or(Value::Null),
                            report.attempts,
                        ))
                    }
                    Err(_) => Err(report),
                }
            }
        };
        // Index push: its failure never undoes the publish.
        if let (Ok((url, _, _)), Some(index_url)) = (&publish, &c.kind.index_url) {
            let body = json!({"slot": key_s, "url": url, "draft_id": draft.id});
            let report = self
                .webhook
                .call(
                    "index",
                    index_url,
                    &format!("{key_s}:index"),
                    &body,
                    c.kind.http_timeout,
                    policy,
                    &mut rng,
                )
                .await;
            if let Some(e) = report.error_detail() {
                tracing::warn!(slot = %c.key, error = %e, "index push failed; the slot stays published");
                detail.insert("index_error".into(), e);
            }
        }
        (publish, detail)
    }

    async fn finish(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        effect: Effect,
    ) -> Result<Outcome, ExecError> {
        let now = self.clock.now();
        let due = Some(planned.due_at);
        let mut tx = self.pool.begin().await?;
        let (outcome, response, url, detail) = settle_fields(&effect.publish, effect.detail);
        let fenced = store::finish_slot(
            &mut tx,
            claim.row_id,
            &self.worker_id,
            claim.attempt,
            outcome.as_str(),
            outcome.reason(),
            response.as_ref(),
            now,
        )
        .await?;
        if !fenced {
            // Another worker took the slot over while we were away: our
            // result must not land. It finishes the slot under the same key.
            tx.rollback().await?;
            let o = Outcome::Skipped(SkipReason::SlotTaken);
            let mut conn = self.pool.acquire().await?;
            let detail = json!({"claim_lost": true, "attempt": claim.attempt, "heartbeat_saw_loss": effect.claim_lost});
            store::insert_execution(&mut conn, &self.record(c, o, detail, due)).await?;
            tracing::warn!(slot = %c.key, attempt = claim.attempt, "claim lost to a takeover; recorded slot_taken (claim_lost) and changed nothing");
            return Ok(o);
        }
        match &url {
            Some(url) => {
                store::finish_draft(&mut tx, claim.post_id, "published", Some(url), Some(now))
                    .await?
            }
            None => store::finish_draft(&mut tx, claim.post_id, "failed", None, None).await?,
        }
        store::insert_execution(&mut tx, &self.record(c, outcome, detail.clone(), due)).await?;
        tx.commit().await?;
        self.log_finished(c, planned, claim, outcome, &detail);
        Ok(outcome)
    }

    fn log_finished(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        outcome: Outcome,
        detail: &Value,
    ) {
        match outcome {
            Outcome::Published => {
                let lag_ms = (c.started_at - planned.due_at).num_milliseconds();
                tracing::info!(slot = %c.key, caller = c.d.caller(), draft = claim.post_id, lag_ms, "published");
            }
            _ => {
                tracing::warn!(slot = %c.key, draft = claim.post_id, detail = %detail, "publish failed; the slot keeps its draft until an operator retries or abandons it")
            }
        }
    }

    /// Keeps the claim and the stream entry alive while the webhook runs.
    fn heartbeat(&self, claim: &Claim, entry_id: &str) -> Heartbeat {
        let lost = Arc::new(AtomicBool::new(false));
        let stop = tokio_util::sync::CancellationToken::new();
        let (this, claim, entry, lost2, stop2) = (
            self.clone(),
            claim.clone(),
            entry_id.to_owned(),
            lost.clone(),
            stop.clone(),
        );
        let every = (self.visibility / 3).max(Duration::from_millis(50));
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop2.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                let now = this.clock.now();
                let expires =
                    now + chrono::Duration::from_std(this.visibility).expect("visibility in range");
                match store::extend_claim(
                    &this.pool,
                    claim.row_id,
                    &this.worker_id,
                    claim.attempt,
                    now,
                    expires,
                )
                .await
                {
                    Ok(true) => {}
                    Ok(false) => {
                        lost2.store(true, Ordering::Relaxed);
                        tracing::warn!(row = claim.row_id, "heartbeat found the claim taken over");
                        return;
                    }
                    Err(e) => tracing::warn!(error = %e, "claim heartbeat failed; will retry"),
                }
                if let Err(e) = this.queue.touch(&this.worker_id, &entry).await {
                    tracing::warn!(error = %e, "stream heartbeat failed; will retry");
                }
            }
        });
        Heartbeat { stop, task, lost }
    }
}

struct Heartbeat {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
    lost: Arc<AtomicBool>,
}

impl Heartbeat {
    /// Stops it; `true` when it saw the claim taken over.
    async fn stop(mut self) -> bool {
        self.stop.cancel();
        let _ = (&mut self.task).await;
        self.lost.load(Ordering::Relaxed)
    }
}

/// A publish abandoned half-way (its future dropped: a shutdown past the
/// grace period, an aborted task) must stop renewing its claim, or the slot
/// could never be resumed by anyone else while this process lives.
impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The parts of a draft a publish sends.
struct DraftText {
    id: i64,
    title: String,
    body: String,
}

/// What publishing a claimed slot produced, before it is recorded.
struct Effect {
    /// The URL, the CMS's answer and the attempts it took; or the failure.
    publish: Result<(String, Value, u32), CallReport>,
    detail: serde_json::Map<String, Value>,
    /// The heartbeat saw the claim taken over.
    claim_lost: bool,
}

/// What a finished publish records: the outcome, the gate row's response,
/// the draft's URL (`None` when it failed) and the execution's detail.
fn settle_fields(
    publish: &Result<(String, Value, u32), CallReport>,
    mut detail: serde_json::Map<String, Value>,
) -> (Outcome, Option<Value>, Option<String>, Value) {
    match publish {
        Ok((url, response, attempts)) => {
            detail.insert("url".into(), json!(url));
            if *attempts > 0 {
                detail.insert("attempts".into(), json!(attempts));
            }
            (
                Outcome::Published,
                Some(response.clone()),
                Some(url.clone()),
                Value::Object(detail),
            )
        }
        Err(report) => {
            detail.insert(
                "publish_error".into(),
                report.error_detail().unwrap_or(Value::Null),
            );
            (
                Outcome::Failed(FailReason::PublishError),
                None,
                None,
                Value::Object(detail),
            )
        }
    }
}

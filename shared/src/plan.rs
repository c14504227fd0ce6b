//! The control plane's operations: planning days, triggering and
//! backfilling slots, and the operator's retry/abandon of failed slots.
//!
//! Planning is idempotent by construction: `planned_slot`'s primary key lets
//! exactly one process create each slot, and only that process enqueues it.
//! A crash between the commit and the enqueue loses nothing: the leader's
//! reconciler re-delivers planned slots that are due and not queued.

use crate::clock::{unix_ms, SharedClock};
use crate::config::{Config, KindConfig};
use crate::outcome::{FailReason, Outcome, Reason, SkipReason, SlotState};
use crate::queue::{Queue, QueueError};
use crate::slot::{day_schedule, local_today, planned_slot, PlannedSlot, SlotKey};
use crate::store::{self, ExecutionRecord, StoreError};
use chrono::NaiveDate;
use futures_util::stream::{FuturesOrdered, StreamExt};
use serde_json::json;
use sqlx::PgPool;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Why a control-plane operation did nothing (or stopped part-way). The
/// infrastructure variants are worth retrying; the others are the
/// operator's request being wrong, and the message says how.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// Postgres failed; planning is idempotent, so running it again is safe.
    #[error("postgres: {0}")]
    Store(#[from] StoreError),
    /// Redis failed; slots already committed are delivered by the
    /// reconciler once due, so running the command again is safe.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The named kind is not in `slotgate.toml`.
    #[error("unknown kind {0:?} (not in the config)")]
    UnknownKind(String),
    /// The slot number is not one of the kind's slots on that day (not
    /// configured, or not on the day's calendar).
    #[error(
        "slot {slot_no} does not exist on {day}: kind {kind:?} has slots {numbers:?} that day"
    )]
    UnknownSlot {
        /// The kind asked for.
        kind: String,
        /// The day asked for.
        day: NaiveDate,
        /// The slot number asked for.
        slot_no: u32,
        /// The kind's slot numbers on that day, ascending.
        numbers: Vec<u32>,
    },
    /// The slot was never gated (nothing ran it yet), so there is nothing
    /// to retry or abandon.
    #[error("slot {0} has no row in publish_slot")]
    NoSuchSlot(String),
    /// Retry and abandon apply only to failed slots; anything else is
    /// either done or still owned by a worker.
    #[error("slot {key} is {state}{}: only failed slots that were not abandoned can be {action}", reason.as_ref().map(|r| format!("/{r}")).unwrap_or_default())]
    NotFailed {
        /// The slot asked for.
        key: String,
        /// Its state in `publish_slot`.
        state: SlotState,
        /// Its failure reason, if any (`abandoned` among them).
        reason: Option<Reason>,
        /// The verb refused (`retried`, `abandoned`), for the message.
        action: &'static str,
    },
    /// A backfill range that runs backwards.
    #[error("--from {from} is after --to {to}")]
    BadRange {
        /// The first day asked for.
        from: NaiveDate,
        /// The last day asked for.
        to: NaiveDate,
    },
    /// A trigger for a slot whose time has not come; refused rather than
    /// queued so that an early run is always a deliberate `--early`.
    #[error("slot {key} is due at {due_at} ({ahead_s} s from now): it runs then; `planner trigger --early` runs it now")]
    NotDue {
        /// The slot asked for.
        key: String,
        /// When it runs by itself.
        due_at: chrono::DateTime<chrono::Utc>,
        /// Seconds until then.
        ahead_s: i64,
    },
}

/// Slots per insert statement (and per scheduling round) when planning:
/// a million slots cost a hundred statements, not one statement with
/// arrays of a million or a round trip per slot.
const PLAN_BATCH: usize = 10_000;

/// Batches in flight at once when planning: two keep Postgres busy while
/// the planner encodes the next batch and Redis takes the last one's
/// schedule, within the planner's pool of four connections.
const PLAN_PARALLEL: usize = 2;

/// One slot in `plan`'s answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PlanEntry {
    /// The slot key as operators type it (`kind:day:slot_no`).
    pub slot: String,
    /// The slot's kind.
    pub kind: String,
    /// The kind's local day the slot belongs to.
    pub day: NaiveDate,
    /// The slot's position in the day's schedule.
    pub slot_no: u32,
    /// The scheduled time before jitter.
    pub nominal_at: chrono::DateTime<chrono::Utc>,
    /// When the slot is delivered: nominal time plus jitter.
    pub due_at: chrono::DateTime<chrono::Utc>,
    /// The jitter applied, so a spread-out run can be told from a late one.
    pub jitter_ms: i64,
    /// `false` when the slot already existed (its stored due time is shown).
    pub new: bool,
}

impl PlanEntry {
    fn of(p: &PlannedSlot, new: bool) -> Self {
        Self {
            slot: p.key.to_string(),
            kind: p.key.kind.clone(),
            day: p.key.day,
            slot_no: p.key.slot_no,
            nominal_at: p.nominal_at,
            due_at: p.due_at,
            jitter_ms: p.jitter_ms,
            new,
        }
    }
}

/// What [`Planner::plan_day`] did (or, on a dry run, would do).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DayPlan {
    /// The configured slots, new or existing.
    pub slots: Vec<PlanEntry>,
    /// Planned slots whose times were removed from the schedule.
    pub unscheduled: Vec<Unscheduled>,
    /// [`moved_slot_warnings`] of the two.
    pub warnings: Vec<String>,
}

/// A planned slot whose time is no longer in its kind's schedule (DESIGN
/// 4.18), and what became of it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Unscheduled {
    /// The slot key (`kind:day:slot_no`).
    pub slot: String,
    /// The slot's kind.
    pub kind: String,
    /// The slot's local day.
    pub day: NaiveDate,
    /// The slot's number, retired with its time.
    pub slot_no: u32,
    /// The local time that was removed.
    pub local_time: chrono::NaiveTime,
    /// When it was due.
    pub due_at: chrono::DateTime<chrono::Utc>,
    /// What became of it.
    #[serde(flatten)]
    pub fate: Fate,
}

/// What became of an [`Unscheduled`] slot.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(tag = "fate", rename_all = "snake_case")]
pub enum Fate {
    /// It had not run: its gate row was taken as `skipped/unscheduled`.
    Cancelled,
    /// A dry run: it has not run and would be cancelled.
    WouldBeCancelled,
    /// It had run (or was running) before its time was removed: left as
    /// it is. With new times on the same day, the day gets both.
    AlreadyGated {
        /// The gate row's state.
        state: SlotState,
    },
}

/// The warnings of a schedule edit that moves an already-run slot: for
/// each kind and day where a removed time's slot had run (or was running)
/// and the edit adds slots that are new on that day, one sentence saying
/// the day gets both. `planner plan` prints them (before the change with
/// `--dry-run`), `planner run` logs them.
pub fn moved_slot_warnings(planned: &[PlanEntry], gone: &[Unscheduled]) -> Vec<String> {
    let mut out = Vec::new();
    for g in gone {
        let Fate::AlreadyGated { state } = g.fate else {
            continue;
        };
        if state == SlotState::Skipped {
            continue;
        }
        let new: Vec<String> = planned
            .iter()
            .filter(|p| p.new && p.kind == g.kind && p.day == g.day)
            .map(|p| format!("{} (due {})", p.slot, p.due_at))
            .collect();
        if !new.is_empty() {
            out.push(format!(
                "{} ran at its time {} (now {}) before the time was removed from the schedule; the new slot(s) {} run on the same day too, so {} of {} gets both (the daily cap still applies)",
                g.slot,
                g.local_time,
                state.as_str(),
                new.join(", "),
                g.day,
                g.kind
            ));
        }
    }
    out
}

/// What `backfill` did.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Backfill {
    /// Slots of the range that had not been planned before.
    pub planned_new: usize,
    /// Past slots without an outcome, delivered now with caller `backfill`.
    pub delivered: Vec<String>,
    /// Future slots of the range, left to the delayed set.
    pub scheduled: usize,
}

/// The control plane.
#[derive(Clone)]
pub struct Planner {
    /// The kinds and their schedules.
    pub config: Arc<Config>,
    /// Where planned slots are created and failed slots reopened.
    pub pool: PgPool,
    /// Where planned slots are scheduled and triggers delivered.
    pub queue: Queue,
    /// Injected so "today" and "due" are testable.
    pub clock: SharedClock,
}

impl Planner {
    fn kind(&self, name: &str) -> Result<&KindConfig, PlanError> {
        self.config
            .kind(name)
            .ok_or_else(|| PlanError::UnknownKind(name.to_owned()))
    }

    fn kinds(&self, names: &[String]) -> Result<Vec<&KindConfig>, PlanError> {
        if names.is_empty() {
            return Ok(self.config.kinds.iter().collect());
        }
        names.iter().map(|n| self.kind(n)).collect()
    }

    /// The slots of `day` (default: each kind's local today) for `kinds`
    /// (default: all), computed from the config.
    pub fn layout(
        &self,
        day: Option<NaiveDate>,
        kinds: &[String],
    ) -> Result<Vec<PlannedSlot>, PlanError> {
        let now = self.clock.now();
        Ok(self
            .kinds(kinds)?
            .into_iter()
            .flat_map(|k| {
                day_schedule(
                    k,
                    day.unwrap_or_else(|| local_today(k.timezone, now)),
                    &self.config.jitter_seed,
                )
            })
            .collect())
    }

    /// Plans the slots: inserts the missing ones and enqueues exactly those.
    /// With `dry_run`, only reports what would be new.
    pub async fn plan(
        &self,
        day: Option<NaiveDate>,
        kinds: &[String],
        dry_run: bool,
    ) -> Result<Vec<PlanEntry>, PlanError> {
        let slots = self.layout(day, kinds)?;
        self.plan_slots(&slots, dry_run, "planner").await
    }

    /// `planner plan` and each `planner run` round: [`Planner::plan`], then
    /// [`Planner::unschedule`] for the same day and kinds, and the warnings
    /// of an edit that moves an already-run slot. What a schedule edit
    /// changes on the day (new slots, cancelled slots) and what stays
    /// (existing slots, removed times that already ran) is all in the
    /// answer; with `dry_run` nothing changes.
    pub async fn plan_day(
        &self,
        day: Option<NaiveDate>,
        kinds: &[String],
        dry_run: bool,
    ) -> Result<DayPlan, PlanError> {
        let slots = self.plan(day, kinds, dry_run).await?;
        let unscheduled = self.unschedule(day, kinds, dry_run).await?;
        let warnings = moved_slot_warnings(&slots, &unscheduled);
        Ok(DayPlan {
            slots,
            unscheduled,
            warnings,
        })
    }

    /// Plans `slots` [`PLAN_BATCH`] at a time, [`PLAN_PARALLEL`] batches in
    /// flight (one connection each), answering in the order given.
    async fn plan_slots(
        &self,
        slots: &[PlannedSlot],
        dry_run: bool,
        source: &str,
    ) -> Result<Vec<PlanEntry>, PlanError> {
        let mut batches = slots.chunks(PLAN_BATCH);
        let mut in_flight = FuturesOrdered::new();
        let mut out = Vec::with_capacity(slots.len());
        loop {
            while in_flight.len() < PLAN_PARALLEL {
                let Some(batch) = batches.next() else { break };
                in_flight.push_back(self.plan_batch(batch, dry_run, source));
            }
            match in_flight.next().await {
                Some(done) => out.extend(done?),
                None => return Ok(out),
            }
        }
    }

    /// One batch: inserts the missing slots (not on a dry run) and schedules
    /// exactly those before answering, so a crash leaves at most the batches
    /// in flight planned but not queued — the reconciler re-delivers them
    /// when due. Then reads back the stored plan of the slots that already
    /// existed: they keep their due time even if the config's jitter changed.
    async fn plan_batch(
        &self,
        batch: &[PlannedSlot],
        dry_run: bool,
        source: &str,
    ) -> Result<Vec<PlanEntry>, PlanError> {
        let new: HashSet<SlotKey> = if dry_run {
            HashSet::new()
        } else {
            let mut conn = self.pool.acquire().await?;
            let new: HashSet<SlotKey> = store::insert_planned(&mut conn, batch, source)
                .await?
                .into_iter()
                .collect();
            drop(conn);
            let enqueue: Vec<(String, i64)> = batch
                .iter()
                .filter(|s| new.contains(&s.key))
                .map(|s| (s.key.to_string(), unix_ms(s.due_at)))
                .collect();
            self.queue.schedule(&enqueue).await?;
            new
        };
        let others: Vec<SlotKey> = batch
            .iter()
            .filter(|s| !new.contains(&s.key))
            .map(|s| s.key.clone())
            .collect();
        let stored: HashMap<SlotKey, PlannedSlot> = if others.is_empty() {
            HashMap::new()
        } else {
            store::get_planned_many(&self.pool, &others)
                .await?
                .into_iter()
                .map(|p| (p.key.clone(), p))
                .collect()
        };
        // Not stored: created just now, or (dry run) would be.
        Ok(batch
            .iter()
            .map(|s| match stored.get(&s.key) {
                Some(p) => PlanEntry::of(p, false),
                None => PlanEntry::of(s, true),
            })
            .collect())
    }

    /// Cancels the planned slots of `day` (default: each kind's local
    /// today) for `kinds` (default: all) whose times were removed from the
    /// schedule, or that the kind's calendar no longer runs that day, and
    /// that have not run: each gets the gate row
    /// `skipped/unscheduled` and an execution row, and leaves the delayed
    /// set. Slots that already ran are reported and left alone. With
    /// `dry_run`, only reports. A kind with no retired numbers costs no
    /// statement.
    pub async fn unschedule(
        &self,
        day: Option<NaiveDate>,
        kinds: &[String],
        dry_run: bool,
    ) -> Result<Vec<Unscheduled>, PlanError> {
        let now = self.clock.now();
        let mut out = Vec::new();
        for k in self.kinds(kinds)? {
            let day = day.unwrap_or_else(|| local_today(k.timezone, now));
            // Retired times, and times the calendar no longer runs that
            // day (a weekday or a `[[kinds.on]]` list edited).
            let mut off = k.retired_slots.clone();
            if let Some(runs) = k.day(day).positions {
                off.extend(
                    k.slot_numbers
                        .iter()
                        .zip(&k.slots)
                        .enumerate()
                        .filter(|(i, _)| runs.binary_search(i).is_err())
                        .map(|(_, (n, t))| (*n, *t)),
                );
            }
            if off.is_empty() {
                continue;
            }
            let numbers: Vec<i32> = off.iter().map(|(n, _)| *n as i32).collect();
            let found = store::planned_with_numbers(&self.pool, &k.name, &[day], &numbers).await?;
            let mut gone = Vec::new();
            for (p, state) in found {
                let fate = match state {
                    Some(state) => Fate::AlreadyGated { state },
                    None if dry_run => Fate::WouldBeCancelled,
                    None => match self.cancel(&p, k, now).await? {
                        None => {
                            gone.push(p.key.to_string());
                            Fate::Cancelled
                        }
                        // A worker took it between the read and the cancel.
                        Some(state) => Fate::AlreadyGated { state },
                    },
                };
                let local_time = off
                    .iter()
                    .find(|(n, _)| *n == p.key.slot_no)
                    .map(|(_, t)| *t)
                    .expect("found by its retired number");
                out.push(Unscheduled {
                    slot: p.key.to_string(),
                    kind: k.name.clone(),
                    day: p.key.day,
                    slot_no: p.key.slot_no,
                    local_time,
                    due_at: p.due_at,
                    fate,
                });
            }
            self.queue.unschedule(&gone).await?;
        }
        Ok(out)
    }

    /// Takes the gate row of `p` as `skipped/unscheduled` with its execution
    /// row; `Some(state)` when a gate row was there first.
    async fn cancel(
        &self,
        p: &PlannedSlot,
        k: &KindConfig,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<Option<SlotState>, PlanError> {
        let reason = SkipReason::Unscheduled;
        let mut tx = self.pool.begin().await?;
        if let Err(row) = store::gate_skip(&mut tx, &p.key, reason, now).await? {
            tx.rollback().await?;
            return Ok(Some(row.map_or(SlotState::Skipped, |r| r.state)));
        }
        let rec = ExecutionRecord::new(
            p.key.to_string(),
            Some(p.key.clone()),
            Outcome::Skipped(reason),
            now,
            now,
        )
        .by("planner", "planner")
        .detail(json!({"note": "its time was removed from the schedule (or from its day's calendar)", "slots": k.slots.iter().map(|t| t.to_string()).collect::<Vec<_>>()}))
        .due(Some(p.due_at));
        store::insert_execution(&mut tx, &rec).await?;
        tx.commit().await?;
        tracing::info!(slot = %p.key, due_at = %p.due_at, "cancelled a planned slot whose time was removed from the schedule");
        Ok(None)
    }

    /// Validates a slot address against the config.
    pub fn slot(&self, kind: &str, day: NaiveDate, slot_no: u32) -> Result<PlannedSlot, PlanError> {
        let k = self.kind(kind)?;
        planned_slot(k, day, slot_no, &self.config.jitter_seed).ok_or_else(|| {
            let mut numbers: Vec<u32> = day_schedule(k, day, &self.config.jitter_seed)
                .iter()
                .map(|p| p.key.slot_no)
                .collect();
            numbers.sort_unstable();
            PlanError::UnknownSlot {
                kind: kind.to_owned(),
                day,
                slot_no,
                numbers,
            }
        })
    }

    /// Plans the slot if it never was (without enqueueing it), then delivers
    /// it now with `caller`. Returns the stream entry id. A slot that is not
    /// due yet is refused ([`PlanError::NotDue`]): the worker would record
    /// `not_due` and run nothing; [`Planner::trigger_early`] runs it.
    pub async fn trigger(
        &self,
        kind: &str,
        day: NaiveDate,
        slot_no: u32,
        caller: &str,
    ) -> Result<String, PlanError> {
        let p = self.slot(kind, day, slot_no)?;
        let now = self.clock.now();
        let stored = store::get_planned_many(&self.pool, std::slice::from_ref(&p.key)).await?;
        let due_at = stored.first().map_or(p.due_at, |s| s.due_at);
        if let Some(ahead) = crate::slot::ahead_of_time(due_at, now) {
            return Err(PlanError::NotDue {
                key: p.key.to_string(),
                due_at,
                ahead_s: ahead.num_seconds(),
            });
        }
        self.deliver_now(&p, caller, &[]).await
    }

    /// `planner trigger --early`: like [`Planner::trigger`] (caller
    /// `manual`), for a slot whose time has not come: the delivery carries
    /// `early=1`, the only way a slot runs before its time.
    pub async fn trigger_early(
        &self,
        kind: &str,
        day: NaiveDate,
        slot_no: u32,
    ) -> Result<String, PlanError> {
        let p = self.slot(kind, day, slot_no)?;
        self.deliver_now(&p, "manual", &[(crate::slot::EARLY_FIELD, "1")])
            .await
    }

    /// Plans `p` if it never was (without enqueueing it) and delivers it now.
    async fn deliver_now(
        &self,
        p: &PlannedSlot,
        caller: &str,
        extra: &[(&str, &str)],
    ) -> Result<String, PlanError> {
        let mut conn = self.pool.acquire().await?;
        store::insert_planned(&mut conn, std::slice::from_ref(p), "trigger").await?;
        drop(conn);
        // The operator's word for the exemption the delivery claims, in
        // Postgres before the delivery is on the stream (a `cronjob`
        // trigger claims none).
        if let Some(requester) = store::Requester::claimed_by(caller) {
            let early = extra
                .iter()
                .any(|(k, v)| *k == crate::slot::EARLY_FIELD && *v == "1");
            store::request_exemptions(
                &self.pool,
                std::slice::from_ref(&p.key),
                requester,
                early,
                "planner trigger",
            )
            .await?;
        }
        Ok(self
            .queue
            .deliver_with(&p.key.to_string(), caller, unix_ms(self.clock.now()), extra)
            .await?)
    }

    /// Plans every day of the range; delivers (caller `backfill`) each slot
    /// whose due time has passed and which has no outcome yet; leaves future
    /// slots to the delayed set.
    pub async fn backfill(
        &self,
        kind: &str,
        from: NaiveDate,
        to: NaiveDate,
    ) -> Result<Backfill, PlanError> {
        if from > to {
            return Err(PlanError::BadRange { from, to });
        }
        let k = self.kind(kind)?;
        let now = self.clock.now();
        let mut slots = Vec::new();
        let mut day = from;
        while day <= to {
            slots.extend(day_schedule(k, day, &self.config.jitter_seed));
            day = day.succ_opt().expect("date in range");
        }
        let mut conn = self.pool.acquire().await?;
        let new: HashSet<SlotKey> = store::insert_planned(&mut conn, &slots, "backfill")
            .await?
            .into_iter()
            .collect();
        drop(conn);
        let keys: Vec<SlotKey> = slots.iter().map(|s| s.key.clone()).collect();
        let stored = store::get_planned_many(&self.pool, &keys).await?;
        let done: HashSet<SlotKey> = store::gate_keys_in_range(&self.pool, kind, from, to)
            .await?
            .into_iter()
            .collect();
        let mut out = Backfill {
            planned_new: new.len(),
            ..Default::default()
        };
        let mut future = Vec::new();
        for p in stored {
            if p.due_at <= now {
                if !done.contains(&p.key) {
                    store::request_exemptions(
                        &self.pool,
                        std::slice::from_ref(&p.key),
                        store::Requester::Backfill,
                        false,
                        "planner backfill",
                    )
                    .await?;
                    self.queue
                        .deliver(&p.key.to_string(), "backfill", unix_ms(now))
                        .await?;
                    out.delivered.push(p.key.to_string());
                }
            } else if new.contains(&p.key) {
                future.push((p.key.to_string(), unix_ms(p.due_at)));
            }
        }
        out.scheduled = future.len();
        self.queue.schedule(&future).await?;
        Ok(out)
    }

    /// Operator: one more attempt for a failed slot, same key and draft. The
    /// slot is reopened with an already expired claim and delivered with
    /// caller `manual`; the delivery resumes it.
    pub async fn retry(&self, key: &SlotKey) -> Result<String, PlanError> {
        self.slot(&key.kind, key.day, key.slot_no)?;
        let now = self.clock.now();
        let mut tx = self.pool.begin().await?;
        let Some(row) = store::reopen_failed(&mut tx, key, now).await? else {
            return Err(self.not_failed(&mut tx, key, "retried").await);
        };
        if let Some(post_id) = row.post_id {
            store::rebind_draft(&mut tx, post_id, &key.to_string()).await?;
        }
        tx.commit().await?;
        store::request_exemptions(
            &self.pool,
            std::slice::from_ref(key),
            store::Requester::Manual,
            false,
            "planner retry",
        )
        .await?;
        Ok(self
            .queue
            .deliver(&key.to_string(), "manual", unix_ms(now))
            .await?)
    }

    /// Operator: gives a failed slot up (`failed/abandoned`). With
    /// `requeue_draft` the draft returns to `ready` and the slot's unit of the
    /// daily cap is released — only when the operator has checked the CMS did
    /// not publish it.
    pub async fn abandon(
        &self,
        key: &SlotKey,
        requeue_draft: bool,
    ) -> Result<Option<i64>, PlanError> {
        self.slot(&key.kind, key.day, key.slot_no)?;
        let now = self.clock.now();
        let mut tx = self.pool.begin().await?;
        let Some(row) = store::abandon_failed(&mut tx, key, now).await? else {
            return Err(self.not_failed(&mut tx, key, "abandoned").await);
        };
        if requeue_draft {
            if let Some(post_id) = row.post_id {
                store::requeue_draft(&mut tx, post_id).await?;
            }
            store::release_quota(&mut tx, &key.kind, key.day).await?;
        }
        let outcome = Outcome::Failed(FailReason::Abandoned);
        let rec = ExecutionRecord::new(key.to_string(), Some(key.clone()), outcome, now, now)
            .by("manual", "planner")
            .detail(json!({"requeue_draft": requeue_draft, "draft_id": row.post_id}));
        store::insert_execution(&mut tx, &rec).await?;
        tx.commit().await?;
        Ok(row.post_id)
    }

    async fn not_failed(
        &self,
        tx: &mut sqlx::PgConnection,
        key: &SlotKey,
        action: &'static str,
    ) -> PlanError {
        match store::get_slot(tx, key).await {
            Ok(Some(row)) => PlanError::NotFailed {
                key: key.to_string(),
                state: row.state,
                reason: row.reason,
                action,
            },
            Ok(None) => PlanError::NoSuchSlot(key.to_string()),
            Err(e) => PlanError::Store(e),
        }
    }
}

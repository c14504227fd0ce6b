//! Phase one, prepare: what a walk's deliveries are before any gate.
//!
//! Each delivery is checked once: believed at all (its bytes, key, kind and
//! slot number, [`validate`]) or set aside for the dead letter; held in
//! this process ([`InFlight`]) so a second copy of its slot waits; granted
//! the operator's exemption it claims, as far as Postgres grants it
//! ([`Exemption`]); gated on its kind's draft mirror where the drafts live
//! at a CMS; and read with its slot's plan, Postgres's clock and its kind's
//! pause in one statement.
//!
//! A delivery walked alone ([`Reach::Whole`]) waits for what it needs (its
//! kind's first mirror) and carries its plan to the gate, which decides
//! every case. A batch ([`Reach::Plain`]) waits for nothing: a delivery
//! whose mirror is not read yet, whose slot is not due or paused, or whose
//! slot this process holds already, is left out for a walk of its own.

use super::{ExecError, Executor, Reach, MAX_DEADLINE_MS, MAX_DELIVERIES};
use crate::config::{Config, KindConfig};
use crate::outcome::FailReason;
use crate::queue::Delivery;
use crate::slot::{ahead_of_time, planned_slot, PlannedSlot, SlotKey};
use crate::store;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// One delivery as every later phase sees it: the entry, the slot it
/// names and its kind's config, when its walk started, and what an
/// operator's request grants it. Made once here and passed down; no phase
/// reaches back for it.
pub(super) struct Ctx<'a> {
    pub(super) d: &'a Delivery,
    pub(super) key: SlotKey,
    pub(super) kind: &'a KindConfig,
    pub(super) started_at: DateTime<Utc>,
    /// What an operator's request grants this delivery.
    pub(super) exempt: Exemption,
}

impl Ctx<'_> {
    /// This delivery as one slot of a gate batch, exempt from the starting
    /// deadline when an operator's request grants it.
    pub(super) fn batch_slot(&self) -> store::BatchSlot {
        let deadline_ms = i64::try_from(self.kind.starting_deadline.as_millis())
            .unwrap_or(i64::MAX)
            .min(MAX_DEADLINE_MS);
        store::BatchSlot {
            key: self.key.clone(),
            entry_id: self.d.entry_id.clone(),
            caller: self.d.caller().to_owned(),
            exempt: self.exempt.deadline,
            deadline_ms,
            cap: self.kind.day(self.key.day).daily_cap,
            started_at: self.started_at,
            record_only: self.kind.record_only(),
            rotate: self.kind.rotate_by_category,
        }
    }
}

/// A slot's plan as a delivery finds it.
#[derive(Debug, Clone)]
pub(super) struct Plan {
    pub(super) slot: PlannedSlot,
    /// `false`: nobody planned the slot (a delivery injected by hand); the
    /// plan is the config's, stored only once the slot is due and runs.
    pub(super) stored: bool,
}

impl Plan {
    /// When the slot may run: its stored due time, or for a slot nobody
    /// planned, its nominal time.
    pub(super) fn runs_at(&self) -> DateTime<Utc> {
        if self.stored {
            self.slot.due_at
        } else {
            self.slot.nominal_at
        }
    }
}

/// What a walk alone read before its gate: the slot's plan, Postgres's
/// clock (every time rule is judged by it) and whether the kind is paused.
pub(super) struct PlanRead {
    pub(super) plan: Plan,
    pub(super) db_now: DateTime<Utc>,
    pub(super) paused: bool,
}

/// A delivery ready for the gate.
pub(super) struct Ready<'a> {
    /// Its index in the walk's deliveries.
    pub(super) i: usize,
    pub(super) c: Ctx<'a>,
    /// [`Reach::Whole`] only: the plan read the gate decides by (a batch's
    /// gate reads its own, in its transaction).
    pub(super) read: Option<PlanRead>,
}

/// What prepare made of a walk's deliveries.
pub(super) struct Prepared<'a> {
    pub(super) ready: Vec<Ready<'a>>,
    /// [`Reach::Whole`] only: a delivery not to be believed (index, why,
    /// detail), for the dead letter.
    pub(super) rejected: Vec<(usize, FailReason, Value)>,
    /// The slots held for this walk; released when it is dropped.
    pub(super) held: Vec<Held>,
}

/// Prepares `ds` for the gate (see the module's overview). An `Err` means
/// nothing was written; for a delivery alone, [`ExecError::Busy`] means its
/// slot is being handled by this process already.
pub(super) async fn prepare<'a>(
    x: &'a Executor,
    ds: &'a [Delivery],
    reach: Reach,
    started_at: DateTime<Utc>,
) -> Result<Prepared<'a>, ExecError> {
    let mut p = Prepared {
        ready: Vec::with_capacity(ds.len()),
        rejected: Vec::new(),
        held: Vec::with_capacity(ds.len()),
    };
    let mut valid: Vec<(usize, Ctx<'a>)> = Vec::with_capacity(ds.len());
    for (i, d) in ds.iter().enumerate() {
        if d.deliveries > MAX_DELIVERIES {
            p.rejected.push((
                i,
                FailReason::MaxDeliveries,
                json!({"deliveries": d.deliveries}),
            ));
            continue;
        }
        match validate(&x.config, d) {
            Ok((key, kind)) => valid.push((
                i,
                Ctx {
                    d,
                    key,
                    kind,
                    started_at,
                    exempt: Exemption::default(),
                },
            )),
            Err((reason, why)) => p.rejected.push((i, reason, json!({"error": why}))),
        }
    }
    match reach {
        Reach::Whole => {
            for (i, mut c) in valid.drain(..) {
                let Some(held) = x.in_flight.try_hold(&c.key) else {
                    return Err(ExecError::Busy(c.key.to_string()));
                };
                p.held.push(held);
                x.hooks.before_gate(x, &c.key, c.kind, started_at);
                c.exempt = exemption(x, c.d, &c.key).await?;
                // A kind whose drafts live at its CMS gates on the mirror
                // once this process has read it (its first background
                // refresh); no other kind waits, and later deliveries never do.
                x.receivers.await_mirror(&c.key.kind).await;
                let read = Some(x.deadline(plan_read(x, &c)).await?);
                p.ready.push(Ready { i, c, read });
            }
        }
        Reach::Plain => {
            // Intake sent only deliveries that validate; any other is left
            // to a walk of its own, which dead-letters it.
            p.rejected.clear();
            // One read per delivery that claims an exemption (rare:
            // operators' commands); the planner's deliveries claim none.
            for (_, c) in &mut valid {
                c.exempt = exemption(x, c.d, &c.key).await?;
            }
            // Nothing in a batch waits for another kind's CMS.
            valid.retain(|(_, c)| x.receivers.mirror_ready(&c.key.kind));
            // A slot not yet due (recorded `not_due` on its own walk) or of
            // a paused kind (recorded skipped/paused) is left out; one read
            // answers both, by Postgres's clock. (A slot nobody planned is
            // left out by the gate.)
            let mut not_yet = HashSet::new();
            let mut paused = HashSet::new();
            for (plan, kind_paused, db_now) in x
                .deadline(store::planned_and_paused_many(
                    &x.pool,
                    valid.iter().map(|(_, c)| &c.key),
                ))
                .await?
            {
                if ahead_of_time(plan.due_at, db_now).is_some() {
                    not_yet.insert(plan.key.clone());
                }
                if kind_paused {
                    paused.insert(plan.key);
                }
            }
            for (i, c) in valid {
                // A paused kind's or a blacked-out day's slot is settled
                // alone, with its reason.
                if (not_yet.contains(&c.key) && !c.exempt.early)
                    || paused.contains(&c.key)
                    || c.kind.day(c.key.day).blackout
                {
                    continue;
                }
                // A slot held elsewhere in this process is left out (its
                // own walk waits for it).
                let Some(held) = x.in_flight.try_hold(&c.key) else {
                    continue;
                };
                p.held.push(held);
                p.ready.push(Ready { i, c, read: None });
            }
        }
    }
    Ok(p)
}

/// Whether a delivery can be believed at all: its bytes, its key, its kind
/// and its slot number. Also intake's question ([`Executor::batch_kind`]).
pub(super) fn validate<'c>(
    config: &'c Config,
    d: &Delivery,
) -> Result<(SlotKey, &'c KindConfig), (FailReason, String)> {
    if let Some(defect) = d.defect() {
        return Err((FailReason::BadMessage, defect.to_string()));
    }
    let raw = d
        .slot()
        .ok_or((FailReason::BadMessage, "missing field `slot`".to_owned()))?;
    let key: SlotKey = raw
        .parse()
        .map_err(|e| (FailReason::BadMessage, format!("slot {raw:?}: {e}")))?;
    let kind = config.kind(&key.kind).ok_or((
        FailReason::UnknownKind,
        format!("kind {:?} is not configured", key.kind),
    ))?;
    if kind.slot_time(key.slot_no).is_some() && kind.slot_time_on(key.day, key.slot_no).is_none() {
        return Err((
            FailReason::UnknownSlot,
            format!(
                "slot_no {} is not on the calendar of {} (a {})",
                key.slot_no,
                key.day,
                chrono::Datelike::weekday(&key.day)
            ),
        ));
    }
    if kind.slot_time(key.slot_no).is_none() {
        let retired = kind.retired_slots.iter().find(|(n, _)| *n == key.slot_no);
        return Err((
            FailReason::UnknownSlot,
            match retired {
                Some((_, t)) => format!(
                    "slot_no {} was {t}, which is no longer in the schedule",
                    key.slot_no
                ),
                None => format!(
                    "slot_no {} is not in the schedule (slots {:?})",
                    key.slot_no,
                    kind.slot_numbers_sorted()
                ),
            },
        ));
    }
    Ok((key, kind))
}

/// The slot's stored plan, Postgres's clock and whether the slot's kind is
/// paused, in one statement; for a slot that was never planned (injected
/// by hand) the config's plan — a pure function of the config, so the same
/// row the planner would write. The gate stores it once the slot runs:
/// storing the plan of a slot that is not due would keep the planner from
/// scheduling it.
async fn plan_read(x: &Executor, c: &Ctx<'_>) -> Result<PlanRead, ExecError> {
    let mut conn = x.pool.acquire().await?;
    let read = store::planned_and_paused(&mut conn, &c.key).await?;
    let plan = match read.planned {
        Some(slot) => Plan { slot, stored: true },
        None => Plan {
            slot: planned_slot(c.kind, c.key.day, c.key.slot_no, &x.config.jitter_seed)
                .expect("validated slot_no"),
            stored: false,
        },
    };
    Ok(PlanRead {
        plan,
        db_now: read.db_now,
        paused: read.paused,
    })
}

/// What a delivery may do beyond the planner's schedule. The stream's
/// fields only *claim* it — `caller manual` or `backfill` (exempt from
/// `starting_deadline`; `cronjob` never is: a CronJob's run is a scheduled
/// one), `early=1` with `manual` (run before the slot's time) — and anyone
/// who can write to Redis can write them. A claim is granted only where an
/// operator's request row for the slot backs it
/// ([`store::exemption_granted`]); any other delivery is the planner's:
/// the deadline applies and an early one is `not_due`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Exemption {
    /// `starting_deadline` does not apply.
    pub deadline: bool,
    /// The slot may run before its time.
    pub early: bool,
}

/// The exemption `d` claims for `key`, as far as Postgres grants it (one
/// read, only for a delivery that claims one). A claim without a grant is
/// logged and treated as the planner's delivery; its caller is still
/// recorded as claimed.
async fn exemption(x: &Executor, d: &Delivery, key: &SlotKey) -> Result<Exemption, ExecError> {
    let Some(requester) = store::Requester::claimed_by(d.caller()) else {
        return Ok(Exemption::default());
    };
    let wants_early = requester == store::Requester::Manual && d.early() == Some("1");
    // A test build's hook (the `early` sabotage) may forge the operator's
    // grant, so that the rule it breaks is the worker's.
    if x.hooks.forges_grant(d) {
        return Ok(Exemption {
            deadline: true,
            early: wants_early,
        });
    }
    let granted = x
        .deadline(store::exemption_granted(&x.pool, key, requester))
        .await?;
    if !granted.deadline || (wants_early && !granted.early) {
        tracing::warn!(
            slot = %key,
            caller = d.caller(),
            early = wants_early,
            entry = %d.entry_id,
            "delivery claims an operator's exemption that no request in Postgres grants; handled as the planner's (the starting deadline applies, nothing runs early)"
        );
    }
    Ok(Exemption {
        deadline: granted.deadline,
        early: wants_early && granted.early,
    })
}

/// The slots this process is handling right now: one delivery per slot at a
/// time. A delivery takes its slot here before the gate and keeps it until
/// its outcome is committed (or it gives up); a second delivery of the same
/// slot meanwhile (a reclaimed copy, a redelivery) waits its turn
/// ([`ExecError::Busy`]) instead of meeting its own worker's claim and
/// mistaking it for a duplicate.
///
/// Holding the slot also tells the gate that a live claim under this
/// worker's id was *not* made by this process: it was left by an earlier
/// run under the same id, and is resumed at once.
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<Mutex<HashSet<SlotKey>>>);

impl InFlight {
    fn try_hold(&self, key: &SlotKey) -> Option<Held> {
        let mut set = self.0.lock().expect("in-flight set poisoned");
        set.insert(key.clone()).then(|| Held {
            set: self.clone(),
            key: key.clone(),
        })
    }
}

/// A slot held in [`InFlight`]; released when dropped (also when a walk's
/// future is dropped half-way).
#[derive(Debug)]
pub(super) struct Held {
    set: InFlight,
    key: SlotKey,
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Ok(mut set) = self.set.0.lock() {
            set.remove(&self.key);
        }
    }
}

//! The plan lookup: the slot's stored plan (or, for a slot nobody planned,
//! the config's), Postgres's clock and whether its kind is paused, in one
//! statement; a delivery that came before its slot's time is recorded
//! `not_due` and runs nothing.

use super::{Ctx, ExecError, Executor, Gate};
use crate::outcome::{Outcome, SkipReason};
use crate::slot::{planned_slot, PlannedSlot};
use crate::store;
use chrono::{DateTime, Utc};
use serde_json::json;

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

impl Executor {
    /// The slot's stored plan, Postgres's clock and whether the slot's kind
    /// is paused, in one statement; for a slot that was never planned
    /// (injected by hand) the config's plan — a pure function of the config,
    /// so the same row the planner would write. The gate stores it once the
    /// slot runs ([`Executor::store_plan`]): storing the plan of a slot that
    /// is not due would keep the planner from scheduling it.
    pub(super) async fn planned(
        &self,
        c: &Ctx<'_>,
    ) -> Result<(Plan, DateTime<Utc>, bool), ExecError> {
        let mut conn = self.pool.acquire().await?;
        let read = crate::store::planned_and_paused(&mut conn, &c.key, self.clock.now()).await?;
        if let Some(slot) = read.planned {
            return Ok((Plan { slot, stored: true }, read.db_now, read.paused));
        }
        let slot = planned_slot(c.kind, c.key.day, c.key.slot_no, &self.config.jitter_seed)
            .expect("validated slot_no");
        Ok((
            Plan {
                slot,
                stored: false,
            },
            read.db_now,
            read.paused,
        ))
    }

    /// Stores the plan of a slot nobody planned, as it runs.
    pub(super) async fn store_plan(&self, plan: &Plan) -> Result<(), ExecError> {
        if !plan.stored {
            let mut conn = self.pool.acquire().await?;
            store::insert_planned(&mut conn, std::slice::from_ref(&plan.slot), "delivery").await?;
        }
        Ok(())
    }

    /// Records a delivery that came more than [`EARLY_TOLERANCE`](crate::slot::EARLY_TOLERANCE) before
    /// its slot's time: an execution row and nothing else — no gate row, no
    /// draft, no unit of the cap — so the slot still runs at its time.
    pub(super) async fn skip_not_due(
        &self,
        c: &Ctx<'_>,
        plan: &Plan,
        ahead: chrono::Duration,
    ) -> Result<Gate, ExecError> {
        let o = Outcome::Skipped(SkipReason::NotDue);
        let runs_at = plan.runs_at();
        let ahead_ms = ahead.num_milliseconds();
        let detail =
            json!({"runs_at": runs_at.to_rfc3339(), "ahead_ms": ahead_ms, "planned": plan.stored});
        let mut conn = self.pool.acquire().await?;
        let rec = self.record(c, o, detail, Some(plan.slot.due_at));
        if !store::insert_execution(&mut conn, &rec).await? {
            return Ok(Gate::Handled);
        }
        tracing::warn!(slot = %c.key, caller = c.d.caller(), %runs_at, ahead_ms, "delivery came before its slot's time; recorded skipped/not_due and ran nothing (the slot still runs at its time; planner trigger --early runs it now)");
        Ok(Gate::Settled(o))
    }
}

//! [`Executor::handle`]: one delivery from the stream to its recorded
//! outcome, the steps in order — each a function of its own file:
//!
//! 1. too many deliveries, or malformed → [`dead_letter`](super::dead_letter);
//! 2. validate the entry against the config → [`validate`](super::validate),
//!    then one delivery per slot per process ([`in_flight`](super::in_flight))
//!    and the operator's grant (`validate`'s `exemption`);
//! 3. the slot's plan, Postgres's clock and the kind's pause → [`plan`](super::plan);
//! 4. the gate → [`gate`](super::gate): claimed, resumed, settled, taken or
//!    already handled;
//! 5. a claimed slot's calls → [`publish`](super::publish) (the receiver,
//!    then the indexer), and their fenced record → [`finish`](super::finish);
//! 6. acknowledge the entry once its outcome is committed.

use super::{Ctx, ExecError, Executor, Gate, Handled, MAX_DELIVERIES};
use crate::outcome::FailReason;
use crate::queue::Delivery;
use serde_json::json;

impl Executor {
    /// Handles one delivery completely, acknowledging it at the end. An
    /// `Err` means nothing was acknowledged; the entry stays pending.
    #[tracing::instrument(name = "handle", skip_all, fields(slot = d.slot().unwrap_or(""), entry = %d.entry_id))]
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
        let Some(_held) = self.in_flight.try_hold(&key) else {
            return Err(ExecError::Busy(key.to_string()));
        };
        self.hooks.before_gate(self, &key, kind, started_at);
        let exempt = self.exemption(d, &key).await?;
        let c = Ctx {
            d,
            key,
            kind,
            started_at,
            exempt,
        };
        self.refresh_drafts(&[c.key.kind.as_str()]).await;
        let (plan, db_now, paused) = self.deadline(self.planned(&c)).await?;
        let planned = &plan.slot;
        let outcome = match self.deadline(self.gate(&c, &plan, db_now, paused)).await? {
            Gate::Taken(o) | Gate::Settled(o) => o,
            Gate::Claimed(claim) => self.publish(&c, planned, claim, false).await?,
            Gate::Resume(claim) => self.publish(&c, planned, claim, true).await?,
            Gate::Handled => {
                self.queue.ack(d.entry()).await?;
                tracing::info!(entry = %d.entry_id, slot = %c.key, "entry already handled; acknowledged again");
                return Ok(Handled::AlreadyHandled);
            }
        };
        self.queue.ack(d.entry()).await?;
        crate::telemetry::execution(&c.key.kind, outcome.as_str(), outcome.reason());
        Ok(Handled::Recorded(outcome))
    }
}

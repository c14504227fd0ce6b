//! Step one: whether a delivery can be believed at all (its bytes, its
//! key, its kind, its slot number), and whether its slot's time has come.

use super::{ExecError, Executor};
use crate::config::KindConfig;
use crate::outcome::FailReason;
use crate::queue::Delivery;
use crate::slot::SlotKey;
use crate::store;

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

impl Executor {
    /// The exemption `d` claims for `key`, as far as Postgres grants it
    /// (one read, only for a delivery that claims one). A claim without a
    /// grant is logged and treated as the planner's delivery; its caller is
    /// still recorded as claimed.
    pub(super) async fn exemption(
        &self,
        d: &Delivery,
        key: &SlotKey,
    ) -> Result<Exemption, ExecError> {
        let Some(requester) = store::Requester::claimed_by(d.caller()) else {
            return Ok(Exemption::default());
        };
        let wants_early = requester == store::Requester::Manual && d.early() == Some("1");
        // A test build's hook (the `early` sabotage) may forge the
        // operator's grant, so that the rule it breaks is the worker's.
        if self.hooks.forges_grant(d) {
            return Ok(Exemption {
                deadline: true,
                early: wants_early,
            });
        }
        let granted = self
            .deadline(store::exemption_granted(&self.pool, key, requester))
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
}

impl Executor {
    pub(super) fn validate(
        &self,
        d: &Delivery,
    ) -> Result<(SlotKey, &KindConfig), (FailReason, String)> {
        if let Some(defect) = d.defect() {
            return Err((FailReason::BadMessage, defect.to_string()));
        }
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
}

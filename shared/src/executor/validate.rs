//! Step one: whether a delivery can be believed at all (its bytes, its
//! key, its kind, its slot number), and whether its slot's time has come.

use super::{Executor, EARLY_TOLERANCE};
use crate::config::KindConfig;
use crate::outcome::FailReason;
use crate::queue::Delivery;
use crate::slot::SlotKey;
use chrono::{DateTime, Utc};

/// Whether `d` asked to run its slot before its time: `early=1` from
/// caller `manual`, which is what `planner trigger --early` sends.
pub fn asks_early(d: &Delivery) -> bool {
    d.caller() == "manual" && d.early() == Some("1")
}

/// How long before `runs_at` the instant `now` is, when that is more than
/// [`EARLY_TOLERANCE`]: a slot must not run yet. The one statement of the
/// rule "a slot never runs before its time"; both delivery paths and
/// `planner trigger` ask it.
pub fn ahead_of_time(runs_at: DateTime<Utc>, now: DateTime<Utc>) -> Option<chrono::Duration> {
    let ahead = runs_at.signed_duration_since(now);
    (ahead.to_std().is_ok_and(|a| a > EARLY_TOLERANCE)).then_some(ahead)
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
        if key.slot_no as usize > kind.slots.len() {
            return Err((
                FailReason::UnknownSlot,
                format!("slot_no {} outside 1..={}", key.slot_no, kind.slots.len()),
            ));
        }
        Ok((key, kind))
    }
}

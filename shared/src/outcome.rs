//! The one recorded outcome every delivery ends in, and its reasons.
//!
//! `quota_full` and `no_ready_draft` are normal; `slot_taken` (a duplicate
//! was blocked) and `missed_deadline` deserve a look and are logged at WARN.

use std::fmt;

/// What a handled delivery ended in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The draft was published (or recorded, for a record-only kind) and
    /// took one unit of the daily cap.
    Published,
    /// Nothing was published, by design; the reason says which rule held.
    Skipped(SkipReason),
    /// Something went wrong; the reason says whether an operator can retry.
    Failed(FailReason),
}

/// Why a delivery published nothing although nothing went wrong; stored as
/// the `reason` column next to `skipped`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipReason {
    /// The slot's gate row already existed: a duplicate delivery was blocked,
    /// or this worker lost its claim to a takeover (`claim_lost`).
    SlotTaken,
    /// The kind's `daily_cap` was used up for the day.
    QuotaFull,
    /// No draft of the kind was ready.
    NoReadyDraft,
    /// The delivery came later than `due + starting_deadline`.
    MissedDeadline,
    /// The delivery came more than a minute before the slot is due (a
    /// delivery for a day that has not come). Nothing was taken; the slot
    /// still runs at its time.
    NotDue,
    /// The slot's day was pruned (`planner prune`) before the slot had an
    /// outcome: its gate row was sealed so it can never run. Stored on the
    /// gate row only; a later delivery meets it as `slot_taken`.
    Pruned,
    /// The kind was paused (`planner pause`) when the slot was delivered:
    /// the delivery took the slot's gate row as skipped, so the slot is
    /// final and does not run after `planner resume`.
    Paused,
    /// An operator skipped the slot ahead of time (`planner skip`); stored
    /// on the gate row and on a `manual` execution. A later delivery meets
    /// it as `slot_taken`.
    Operator,
    /// The draft bound to the slot was no longer ready at the CMS when the
    /// worker read it right before writing (a WordPress post pulled back,
    /// trashed or deleted by an editor). Nothing was published; the draft
    /// is released (no longer ready) and the slot's unit of the daily cap
    /// is given back. The slot is final: it does not pick another draft.
    DraftWithdrawn,
    /// The slot's time was removed from the kind's schedule before the
    /// slot ran: the planner took its gate row as skipped (`planner plan`,
    /// `planner run`), so no delivery of it runs. A later delivery meets it
    /// as `slot_taken`.
    Unscheduled,
}

/// Why a delivery failed; stored as the `reason` column next to `failed`.
/// Only `publish_error` leaves a slot an operator can retry; the malformed
/// ones and `max_deliveries` are dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailReason {
    /// The publish webhook refused or kept failing; the slot keeps its draft
    /// and its unit of the daily cap until an operator retries or abandons.
    PublishError,
    /// The delivery's entry had a defect in its bytes (non-UTF-8, an
    /// unknown or repeated field, an oversized slot), no `slot` field, or a
    /// slot key that does not parse.
    BadMessage,
    /// The slot key names a kind that is not configured.
    UnknownKind,
    /// `slot_no` is outside 1..=number of configured slots.
    UnknownSlot,
    /// The delivery was handed out more than
    /// [`MAX_DELIVERIES`](crate::executor::MAX_DELIVERIES) times.
    MaxDeliveries,
    /// An operator gave the failed slot up (`planner abandon`).
    Abandoned,
}

impl Outcome {
    /// `published`, `skipped` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Published => "published",
            Outcome::Skipped(_) => "skipped",
            Outcome::Failed(_) => "failed",
        }
    }
    /// The reason string, if any.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            Outcome::Published => None,
            Outcome::Skipped(r) => Some(r.as_str()),
            Outcome::Failed(r) => Some(r.as_str()),
        }
    }
}

impl SkipReason {
    /// The stored and reported spelling (`quota_full`, …): part of the
    /// public contract, so never renamed.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::SlotTaken => "slot_taken",
            SkipReason::QuotaFull => "quota_full",
            SkipReason::NoReadyDraft => "no_ready_draft",
            SkipReason::MissedDeadline => "missed_deadline",
            SkipReason::NotDue => "not_due",
            SkipReason::Pruned => "pruned",
            SkipReason::Paused => "paused",
            SkipReason::Operator => "operator",
            SkipReason::DraftWithdrawn => "draft_withdrawn",
            SkipReason::Unscheduled => "unscheduled",
        }
    }
    /// Reasons an operator should look at.
    pub fn deserves_a_look(self) -> bool {
        matches!(
            self,
            SkipReason::SlotTaken | SkipReason::MissedDeadline | SkipReason::NotDue
        )
    }
}

impl FailReason {
    /// The stored and reported spelling (`publish_error`, …): part of the
    /// public contract, so never renamed.
    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::PublishError => "publish_error",
            FailReason::BadMessage => "bad_message",
            FailReason::UnknownKind => "unknown_kind",
            FailReason::UnknownSlot => "unknown_slot",
            FailReason::MaxDeliveries => "max_deliveries",
            FailReason::Abandoned => "abandoned",
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            Some(r) => write!(f, "{}/{}", self.as_str(), r),
            None => f.write_str(self.as_str()),
        }
    }
}

//! The one recorded outcome every delivery ends in, and its reasons.
//!
//! `quota_full` and `no_ready_draft` are normal; `slot_taken` (a duplicate
//! was blocked) and `missed_deadline` deserve a look and are logged at WARN.
//!
//! Reading them back: a `reason` column decodes as a [`Reason`] and a row's
//! state with its reason as a [`Recorded`], in this module only. A person
//! with `psql` can write any text into `reason` (the column has no CHECK),
//! so text no variant spells decodes as [`Reason::Unknown`], kept as stored
//! so reports show it, instead of failing the read or being guessed at.

use sqlx::postgres::{PgTypeInfo, PgValueRef, Postgres};
use std::fmt;

/// A gate row's `state` (the `publish_slot` CHECK constraint): the row's
/// lifecycle, `claimed` → `publishing` → one of the final three. Lives with
/// the outcomes, not in `slot` (it is not part of a slot's identity) nor in
/// `store` (a row's state and its reason decode together, as [`Recorded`],
/// and every layer above the store branches on it).
///
/// Decoded through the derive from the `text` column; bound as
/// [`SlotState::as_str`] so a statement's parameter is a plain `text` whose
/// type sqlx knows without looking a type name up on the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, sqlx::Type, serde::Serialize)]
#[sqlx(type_name = "text", rename_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum SlotState {
    /// The gate row was taken; no draft is bound yet.
    Claimed,
    /// A draft is bound and the publish webhook is (about to be) called.
    Publishing,
    /// Final: the draft was published (the effect happened once).
    Published,
    /// Final: nothing was published, by design; the reason says why.
    Skipped,
    /// Final unless an operator retries it: the publish failed.
    Failed,
}

impl SlotState {
    /// The stored spelling, as the SQL text and the reports write it.
    pub fn as_str(self) -> &'static str {
        match self {
            SlotState::Claimed => "claimed",
            SlotState::Publishing => "publishing",
            SlotState::Published => "published",
            SlotState::Skipped => "skipped",
            SlotState::Failed => "failed",
        }
    }
    /// `claimed`/`publishing`: the publish outcome is not known yet.
    pub fn is_open(self) -> bool {
        matches!(self, SlotState::Claimed | SlotState::Publishing)
    }
}

/// The gate state an outcome leaves a slot in.
impl From<Outcome> for SlotState {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Published => SlotState::Published,
            Outcome::Skipped(_) => SlotState::Skipped,
            Outcome::Failed(_) => SlotState::Failed,
        }
    }
}

/// Padded, so tables can align it with `{:<11}`.
impl fmt::Display for SlotState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

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
    /// The slot's local day is in its kind's `blackout` list: planned, and
    /// taken as skipped by its delivery, so the day's fate is on record
    /// instead of a gap. Nothing is published; no cap unit is used.
    Blackout,
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
    /// Every reason, for decoding by spelling.
    pub const ALL: [SkipReason; 11] = [
        SkipReason::SlotTaken,
        SkipReason::QuotaFull,
        SkipReason::NoReadyDraft,
        SkipReason::MissedDeadline,
        SkipReason::NotDue,
        SkipReason::Pruned,
        SkipReason::Paused,
        SkipReason::Operator,
        SkipReason::DraftWithdrawn,
        SkipReason::Unscheduled,
        SkipReason::Blackout,
    ];
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
            SkipReason::Blackout => "blackout",
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
    /// Every reason, for decoding by spelling.
    pub const ALL: [FailReason; 6] = [
        FailReason::PublishError,
        FailReason::BadMessage,
        FailReason::UnknownKind,
        FailReason::UnknownSlot,
        FailReason::MaxDeliveries,
        FailReason::Abandoned,
    ];
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

/// A `reason` column as read back: a reason this build writes, or text it
/// does not know. The two spellings of [`SkipReason`] and [`FailReason`] do
/// not overlap, so the text alone says which it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A skip reason.
    Skipped(SkipReason),
    /// A failure reason.
    Failed(FailReason),
    /// Text no reason spells: written by hand (`psql`), or by a newer build.
    /// Kept as stored, so a report counts and shows it under its own name;
    /// nothing branches on it.
    Unknown(String),
}

impl Reason {
    /// The stored spelling.
    pub fn as_str(&self) -> &str {
        match self {
            Reason::Skipped(r) => r.as_str(),
            Reason::Failed(r) => r.as_str(),
            Reason::Unknown(s) => s,
        }
    }
}

/// The one decoding of a stored reason; never fails.
impl From<String> for Reason {
    fn from(s: String) -> Self {
        if let Some(r) = SkipReason::ALL.into_iter().find(|r| r.as_str() == s) {
            Reason::Skipped(r)
        } else if let Some(r) = FailReason::ALL.into_iter().find(|r| r.as_str() == s) {
            Reason::Failed(r)
        } else {
            Reason::Unknown(s)
        }
    }
}

/// Read from a `text` column through [`From<String>`](Reason::from).
impl sqlx::Type<Postgres> for Reason {
    fn type_info() -> PgTypeInfo {
        <String as sqlx::Type<Postgres>>::type_info()
    }
    fn compatible(ty: &PgTypeInfo) -> bool {
        <String as sqlx::Type<Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, Postgres> for Reason {
    fn decode(value: PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        Ok(Reason::from(<String as sqlx::Decode<Postgres>>::decode(
            value,
        )?))
    }
}

/// As stored (reports and `--json` show the spelling).
impl serde::Serialize for Reason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The stored spelling, padded so tables can align it.
impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// An outcome as a row records it: a gate row's `state` (or an execution's
/// `outcome`, whose three spellings are the final gate states) and its
/// `reason`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow, serde::Serialize)]
pub struct Recorded {
    /// The state, or the execution's outcome.
    pub state: SlotState,
    /// Why it was skipped or failed; `None` for a publish (and an open
    /// gate row).
    pub reason: Option<Reason>,
}

impl Recorded {
    /// The outcome, when the row is settled with a pair this build writes;
    /// `None` for an open gate row (`claimed`, `publishing`) and for a
    /// pair that is not (an [`Reason::Unknown`], a reason that belongs to
    /// the other outcome, a skip without one).
    pub fn outcome(&self) -> Option<Outcome> {
        match (self.state, &self.reason) {
            (SlotState::Published, None) => Some(Outcome::Published),
            (SlotState::Skipped, Some(Reason::Skipped(r))) => Some(Outcome::Skipped(*r)),
            (SlotState::Failed, Some(Reason::Failed(r))) => Some(Outcome::Failed(*r)),
            _ => None,
        }
    }
}

/// `state` or `state/reason`, as `trigger --wait` prints it.
impl fmt::Display for Recorded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            Some(r) => write!(f, "{}/{}", self.state.as_str(), r.as_str()),
            None => f.write_str(self.state.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_reads_back_as_itself() {
        for r in SkipReason::ALL {
            assert_eq!(Reason::from(r.as_str().to_owned()), Reason::Skipped(r));
        }
        for r in FailReason::ALL {
            assert_eq!(Reason::from(r.as_str().to_owned()), Reason::Failed(r));
        }
    }

    #[test]
    fn text_no_reason_spells_is_kept_as_stored() {
        let r = Reason::from("Quota_Full ".to_owned());
        assert_eq!(r, Reason::Unknown("Quota_Full ".into()));
        assert_eq!(r.as_str(), "Quota_Full ");
        let rec = Recorded {
            state: SlotState::Skipped,
            reason: Some(r),
        };
        assert_eq!(rec.outcome(), None);
        assert_eq!(rec.to_string(), "skipped/Quota_Full ");
    }

    #[test]
    fn a_pair_this_build_writes_is_an_outcome() {
        for o in [
            Outcome::Published,
            Outcome::Skipped(SkipReason::QuotaFull),
            Outcome::Failed(FailReason::PublishError),
        ] {
            let rec = Recorded {
                state: SlotState::from(o),
                reason: o.reason().map(|r| Reason::from(r.to_owned())),
            };
            assert_eq!(rec.outcome(), Some(o));
            assert_eq!(rec.to_string(), o.to_string());
        }
        // A reason of the other outcome is not read as either.
        let crossed = Recorded {
            state: SlotState::Skipped,
            reason: Some(Reason::Failed(FailReason::Abandoned)),
        };
        assert_eq!(crossed.outcome(), None);
        let open = Recorded {
            state: SlotState::Publishing,
            reason: None,
        };
        assert_eq!(open.outcome(), None);
    }
}

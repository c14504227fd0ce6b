//! Operator verbs beyond retry/abandon: pause and resume a kind, skip a slot
//! ahead of time, and list, replay and purge dead letters. The CLI and the
//! console's actions call these same functions, so an action from the page
//! is recorded exactly like its CLI twin (caller `manual`).

use crate::clock::unix_ms;
use crate::outcome::{Outcome, Reason, SkipReason, SlotState};
use crate::plan::{PlanError, Planner};
use crate::queue::QueueError;
use crate::slot::{PlannedSlot, SlotKey};
use crate::store::{self, ExecutionRecord, StoreError};
use chrono::{DateTime, TimeZone, Utc};
use serde::Serialize;
use serde_json::json;
use std::collections::HashMap;
use std::time::Duration;

/// The caller recorded for every operator verb.
pub const MANUAL: &str = "manual";

/// A `skip` note longer than this is cut (it is stored in the execution's
/// detail).
pub const MAX_NOTE_CHARS: usize = 500;

/// How many dead letters `replay` searches for the entry named.
const DEAD_SCAN: usize = 100_000;

/// Why an operator verb was refused or could not finish. A refusal changes
/// nothing; an outage part-way through `dead replay` may leave the new
/// delivery made and the dead letter kept (a duplicate delivery is safe).
#[derive(Debug, thiserror::Error)]
pub enum OperatorError {
    /// The kind or slot is not configured.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// Postgres failed; a transaction in flight was rolled back.
    #[error("postgres: {0}")]
    Store(#[from] StoreError),
    /// Redis failed; for `dead replay`, the dead letter is kept.
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// `skip` of a slot that has already run or been decided: the gate row
    /// is final, so the skip is refused rather than recorded twice.
    #[error("slot {key} already has a gate row ({}{}): it cannot be skipped", state.map_or("", SlotState::as_str), reason.as_ref().map(|r| format!("/{r}")).unwrap_or_default())]
    AlreadyGated {
        /// The slot key asked for.
        key: String,
        /// The existing gate row's state (`published`, `skipped`, …);
        /// `None` when the row went away again before it could be read.
        state: Option<SlotState>,
        /// The existing gate row's reason, if it has one.
        reason: Option<Reason>,
    },
    /// `pause --until` at or before now would be a pause that never holds.
    #[error("--until {0} is not in the future")]
    UntilPast(DateTime<Utc>),
    /// `dead replay` of an id that is neither a dead-letter id nor an
    /// original entry id among the newest dead letters.
    #[error("no dead letter with id {0:?}")]
    NoSuchDeadLetter(String),
    /// `dead replay` of a dead letter whose slot does not parse or is not
    /// configured: replaying it would only dead-letter it again.
    #[error(
        "dead letter {id} cannot be replayed: its slot {slot:?} is not a configured slot ({why})"
    )]
    NotReplayable {
        /// The dead-letter stream id.
        id: String,
        /// The slot field as stored (empty when it had none).
        slot: String,
        /// Why it is not a configured slot.
        why: String,
    },
    /// `dead replay` without `--force` of a slot past its due time (stored,
    /// else the config's) plus its kind's `starting_deadline` (by Postgres's
    /// clock, as the gate judges it). A dead letter is Redis data and a replay gives its slot
    /// an operator's exemption in Postgres, so an old slot is replayed only
    /// when the operator says so; nothing was delivered or requested.
    #[error("dead letter {id}: slot {key} was due at {due_at} and its starting deadline passed at {deadline}: it is not replayed; `planner dead replay --force {id}` replays it")]
    ReplayPastDeadline {
        /// The dead-letter stream id.
        id: String,
        /// The dead letter's slot.
        key: String,
        /// The slot's due time (stored, else the config's).
        due_at: DateTime<Utc>,
        /// `due_at` + the kind's `starting_deadline`.
        deadline: DateTime<Utc>,
    },
    /// `dead replay` without `--force` of a slot within its deadline that
    /// was never planned in Postgres: the planner never scheduled it, so
    /// only Redis says it should run; nothing was delivered or requested.
    #[error("dead letter {id}: slot {key} is not planned in Postgres: it is not replayed; `planner dead replay --force {id}` replays it")]
    ReplayNotPlanned {
        /// The dead-letter stream id.
        id: String,
        /// The dead letter's slot.
        key: String,
    },
}

impl OperatorError {
    /// A replay refused because its slot is past its deadline or not
    /// planned, which `--force` overrides (exit status 2, like a
    /// `trigger` of a slot not yet due).
    pub fn is_replay_refusal(&self) -> bool {
        matches!(
            self,
            OperatorError::ReplayPastDeadline { .. } | OperatorError::ReplayNotPlanned { .. }
        )
    }
}

/// A dead letter as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadEntry {
    /// The dead-letter stream's id (also accepted by `dead replay`).
    pub id: String,
    /// The partition whose dead-letter stream holds it (0 in the default
    /// layout).
    pub partition: u16,
    /// The original stream entry's id.
    pub entry_id: Option<String>,
    /// The slot field as received (may be anything a stranger sent).
    pub slot: Option<String>,
    /// Who delivered it (`planner`, `manual`, …), as received; `None` when
    /// the entry had no caller.
    pub caller: Option<String>,
    /// Why it was dead-lettered (`bad_message`, `unknown_kind`,
    /// `unknown_slot`, `max_deliveries`).
    pub reason: Option<String>,
    /// When it was dead-lettered (from the dead-letter stream id).
    pub at: Option<DateTime<Utc>>,
    /// The slot's due time: its plan in Postgres, else the config's;
    /// `None` when the slot field is not a configured slot.
    pub due_at: Option<DateTime<Utc>>,
    /// `due_at` + the kind's `starting_deadline`: past it, `dead replay`
    /// is refused without `--force`.
    pub deadline: Option<DateTime<Utc>>,
    /// Whether Postgres has the slot's plan (`dead replay` of one it does
    /// not have is refused without `--force`).
    pub planned: bool,
    /// Whether `deadline` had passed by Postgres's clock when listed.
    pub past_deadline: bool,
}

impl DeadEntry {
    fn of(id: String, partition: u16, mut fields: HashMap<String, String>) -> Self {
        let at = id
            .split('-')
            .next()
            .and_then(|ms| ms.parse::<i64>().ok())
            .and_then(|ms| Utc.timestamp_millis_opt(ms).single());
        DeadEntry {
            partition,
            entry_id: fields.remove("entry_id"),
            slot: fields.remove("slot"),
            caller: fields.remove("caller"),
            reason: fields.remove("reason"),
            at,
            id,
            due_at: None,
            deadline: None,
            planned: false,
            past_deadline: false,
        }
    }
}

impl Planner {
    fn known_kind(&self, kind: &str) -> Result<(), PlanError> {
        self.config
            .kind(kind)
            .map(|_| ())
            .ok_or_else(|| PlanError::UnknownKind(kind.to_owned()))
    }

    /// `planner pause`: pauses a configured kind until `until` (or resume).
    pub async fn pause(
        &self,
        kind: &str,
        until: Option<DateTime<Utc>>,
        note: &str,
    ) -> Result<(), OperatorError> {
        self.known_kind(kind)?;
        let now = self.clock.now();
        if until.is_some_and(|u| u <= now) {
            return Err(OperatorError::UntilPast(until.expect("checked")));
        }
        let note: String = note.chars().take(MAX_NOTE_CHARS).collect();
        crate::store::pause_kind(&self.pool, kind, until, MANUAL, &note, now).await?;
        tracing::info!(kind, until = ?until, "kind paused");
        Ok(())
    }

    /// `planner resume`: `false` when the kind was not paused.
    pub async fn resume(&self, kind: &str) -> Result<bool, OperatorError> {
        self.known_kind(kind)?;
        let was = crate::store::resume_kind(&self.pool, kind, self.clock.now()).await?;
        tracing::info!(kind, was_paused = was, "kind resumed");
        Ok(was)
    }

    /// `planner skip`: takes the slot's gate row ahead of time as
    /// `skipped/operator`, with a `manual` execution row carrying the note,
    /// so the slot never runs. Refused when the slot already has a gate row.
    pub async fn skip(&self, key: &SlotKey, note: &str) -> Result<(), OperatorError> {
        let planned = self.slot(&key.kind, key.day, key.slot_no)?;
        let now = self.clock.now();
        let mut tx = self.pool.begin().await?;
        store::insert_planned(&mut tx, std::slice::from_ref(&planned), "skip").await?;
        let reason = SkipReason::Operator;
        if let Err(row) = store::gate_skip(&mut tx, key, reason, now).await? {
            tx.rollback().await?;
            let (state, reason) = row.map(|r| (Some(r.state), r.reason)).unwrap_or_default();
            return Err(OperatorError::AlreadyGated {
                key: key.to_string(),
                state,
                reason,
            });
        }
        let due = store::get_planned_at(&mut tx, key)
            .await?
            .map(|(p, _)| p.due_at);
        let note: String = note.chars().take(MAX_NOTE_CHARS).collect();
        let outcome = Outcome::Skipped(reason);
        let rec = ExecutionRecord::new(key.to_string(), Some(key.clone()), outcome, now, now)
            .by(MANUAL, "planner")
            .detail(json!({"note": note}))
            .due(due);
        store::insert_execution(&mut tx, &rec).await?;
        tx.commit().await?;
        tracing::info!(slot = %key, "slot skipped by an operator");
        Ok(())
    }

    /// The configured slot a dead letter's slot field names, with its
    /// kind's `starting_deadline`; or why it names none.
    fn dead_slot(&self, raw: &str) -> Result<(PlannedSlot, Duration), String> {
        let key: SlotKey = raw.parse().map_err(|e| format!("{e}"))?;
        let planned = self
            .slot(&key.kind, key.day, key.slot_no)
            .map_err(|e| e.to_string())?;
        let grace = self
            .config
            .kind(&key.kind)
            .map(|k| k.starting_deadline)
            .ok_or_else(|| PlanError::UnknownKind(key.kind.clone()).to_string())?;
        Ok((planned, grace))
    }

    /// Dead letters, newest first, at most `limit`, each with its slot's
    /// due time, deadline and whether Postgres has its plan (one read for
    /// them all, skipped when none names a configured slot).
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadEntry>, OperatorError> {
        let mut dead = self.raw_dead_letters(limit).await?;
        let slots: Vec<Option<(PlannedSlot, Duration)>> = dead
            .iter()
            .map(|d| d.slot.as_deref().and_then(|s| self.dead_slot(s).ok()))
            .collect();
        let keys: Vec<SlotKey> = slots
            .iter()
            .flatten()
            .map(|(p, _)| p.key.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if keys.is_empty() {
            return Ok(dead);
        }
        // Boxed: the read's future is deep, and a caller's async body that
        // held it inline overflowed the compiler's layout depth limit.
        let stored: HashMap<SlotKey, DateTime<Utc>> =
            Box::pin(store::get_planned_many(&self.pool, &keys))
                .await?
                .into_iter()
                .map(|p| (p.key, p.due_at))
                .collect();
        let db_now = store::db_now(&self.pool).await?;
        for (d, slot) in dead.iter_mut().zip(slots) {
            let Some((p, grace)) = slot else { continue };
            let stored = stored.get(&p.key).copied();
            let due_at = stored.unwrap_or(p.due_at);
            let deadline = crate::clock::later(due_at, grace);
            d.planned = stored.is_some();
            d.due_at = Some(due_at);
            d.deadline = Some(deadline);
            d.past_deadline = db_now > deadline;
        }
        Ok(dead)
    }

    /// Dead letters as stored, newest first, at most `limit`.
    async fn raw_dead_letters(&self, limit: usize) -> Result<Vec<DeadEntry>, OperatorError> {
        Ok(self
            .queue
            .newest_dead_letters(limit)
            .await?
            .into_iter()
            .map(|d| DeadEntry::of(d.id, d.partition, d.fields))
            .collect())
    }

    /// `planner dead replay`: re-delivers the dead letter's slot with caller
    /// `manual` (after writing the operator's exemption request), then
    /// removes the dead letter. `id` is the dead-letter id or the original
    /// entry id. Returns the dead letter and the new entry id.
    ///
    /// A dead letter is Redis data, and anyone who can write to Redis can
    /// write one; the exemption is the operator's. So, unless `force`, a
    /// slot past its due time (stored, else the config's) +
    /// `starting_deadline` by Postgres's clock
    /// ([`OperatorError::ReplayPastDeadline`]) or not planned in Postgres
    /// ([`OperatorError::ReplayNotPlanned`]) is refused with nothing
    /// requested or delivered, as `trigger` refuses a slot not yet due. A
    /// dead letter whose slot is not a configured slot is refused even with
    /// `force`: it would only be dead-lettered again.
    pub async fn replay_dead(
        &self,
        id: &str,
        force: bool,
    ) -> Result<(DeadEntry, String), OperatorError> {
        let dead = self
            .raw_dead_letters(DEAD_SCAN)
            .await?
            .into_iter()
            .find(|d| d.id == id || d.entry_id.as_deref() == Some(id))
            .ok_or_else(|| OperatorError::NoSuchDeadLetter(id.to_owned()))?;
        let raw = dead.slot.clone().unwrap_or_default();
        let (planned, grace) =
            self.dead_slot(&raw)
                .map_err(|why| OperatorError::NotReplayable {
                    id: dead.id.clone(),
                    slot: raw.clone(),
                    why,
                })?;
        let key = planned.key;
        if !force {
            let mut conn = self.pool.acquire().await?;
            let stored = store::get_planned_at(&mut conn, &key).await?;
            drop(conn);
            let (due_at, db_now, is_planned) = match stored {
                Some((stored, db_now)) => (stored.due_at, db_now, true),
                None => (planned.due_at, store::db_now(&self.pool).await?, false),
            };
            let deadline = crate::clock::later(due_at, grace);
            if db_now > deadline {
                return Err(OperatorError::ReplayPastDeadline {
                    id: dead.id,
                    key: key.to_string(),
                    due_at,
                    deadline,
                });
            }
            if !is_planned {
                return Err(OperatorError::ReplayNotPlanned {
                    id: dead.id,
                    key: key.to_string(),
                });
            }
        }
        store::request_exemptions(
            &self.pool,
            std::slice::from_ref(&key),
            store::Requester::Manual,
            false,
            if force {
                "planner dead replay --force"
            } else {
                "planner dead replay"
            },
        )
        .await?;
        let entry = self
            .queue
            .deliver(&key.to_string(), MANUAL, unix_ms(self.clock.now()))
            .await?;
        self.queue
            .delete_dead_letter(dead.partition, &dead.id)
            .await?;
        tracing::info!(dead = %dead.id, slot = %key, entry = %entry, force, "dead letter replayed");
        Ok((dead, entry))
    }

    /// `planner dead purge`: deletes dead letters older than `older_than`;
    /// returns how many.
    pub async fn purge_dead(&self, older_than: Duration) -> Result<u64, OperatorError> {
        let cutoff = unix_ms(self.clock.now())
            - i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX / 2);
        let n = self.queue.purge_dead_letters_before(cutoff).await?;
        tracing::info!(purged = n, "dead letters purged");
        Ok(n)
    }
}

//! Following one triggered delivery until its slot has an outcome
//! (`planner trigger --wait`), so that the status of the process that
//! triggered it — a Kubernetes Job, a cron line — tells the truth.
//!
//! The answer follows the *slot*, not only the delivery: a duplicate run is
//! recorded `skipped/slot_taken`, and what the operator needs to know is
//! whether the slot itself published, was skipped or failed. So the wait
//! ends when both are known: this delivery's own execution row (found by its
//! stream entry id, so it is this run that was handled, not an earlier one)
//! and a final gate state. A delivery that failed without settling the slot
//! (dead-lettered) ends it too. Postgres is the only source: Redis may lose
//! the delivery, in which case the slot's final state is reported when the
//! wait runs out.

use crate::slot::SlotKey;
use crate::store::{self, SlotState, StoreError};
use serde::Serialize;
use sqlx::PgPool;
use std::fmt;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often Postgres is asked.
const POLL_EVERY: Duration = Duration::from_millis(200);

/// A final gate state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Final {
    /// The slot published (or recorded, for a record-only kind).
    Published,
    /// The slot will never run (cap used up, no draft, late, paused, …).
    Skipped,
    /// The slot failed; unless abandoned, an operator may retry it.
    Failed,
}

impl Final {
    /// The gate state's stored spelling, as printed by `trigger --wait`.
    pub fn as_str(self) -> &'static str {
        match self {
            Final::Published => "published",
            Final::Skipped => "skipped",
            Final::Failed => "failed",
        }
    }

    /// `None` for `claimed`/`publishing` (the outcome is not known yet).
    fn of(state: SlotState) -> Option<Final> {
        match state {
            SlotState::Published => Some(Final::Published),
            SlotState::Skipped => Some(Final::Skipped),
            SlotState::Failed => Some(Final::Failed),
            SlotState::Claimed | SlotState::Publishing => None,
        }
    }
}

/// The slot's gate state and reason.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SlotOutcome {
    /// How the slot ended.
    pub state: Final,
    /// The gate row's reason (`quota_full`, `publish_error`, …); `None` for
    /// a publish.
    pub reason: Option<String>,
}

/// The execution recorded for the delivery.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeliveryOutcome {
    /// The execution's outcome: `published`, `skipped` or `failed`.
    pub outcome: String,
    /// The execution's reason (`slot_taken` for a blocked duplicate, …);
    /// `None` for a publish.
    pub reason: Option<String>,
}

/// How a wait ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "wait", rename_all = "snake_case")]
pub enum Watched {
    /// The slot has a final outcome. `delivery` is `None` only when the
    /// delivery was never handled (Redis lost it) and the wait ran out.
    Settled {
        /// The slot's final state, which is what the exit status reports.
        slot: SlotOutcome,
        /// What this delivery itself was recorded as.
        delivery: Option<DeliveryOutcome>,
    },
    /// The delivery failed without settling the slot (it was dead-lettered).
    DeliveryFailed {
        /// This delivery's `failed/<reason>` execution.
        delivery: DeliveryOutcome,
    },
    /// No final outcome before the deadline; the slot may still run.
    TimedOut {
        /// This delivery's execution if it was handled; `None` when no
        /// worker handled it in time (or Redis lost it).
        delivery: Option<DeliveryOutcome>,
        /// The gate state seen last (`claimed`, `publishing`), if any.
        slot_state: Option<SlotState>,
        /// The last Postgres error, when the store could not be read.
        error: Option<String>,
    },
    /// Stopped by a signal before an outcome was known.
    Cancelled,
}

struct Seen {
    delivery: Option<DeliveryOutcome>,
    slot: Option<(SlotState, Option<String>)>,
}

async fn look(pool: &PgPool, key: &SlotKey, entry_id: &str) -> Result<Seen, StoreError> {
    let delivery = store::entry_outcome(pool, entry_id)
        .await?
        .map(|(outcome, reason)| DeliveryOutcome { outcome, reason });
    let mut conn = pool.acquire().await?;
    let slot = store::get_slot(&mut conn, key)
        .await?
        .map(|r| (r.state, r.reason));
    Ok(Seen { delivery, slot })
}

fn settled(slot: &Option<(SlotState, Option<String>)>) -> Option<SlotOutcome> {
    let (state, reason) = slot.as_ref()?;
    Some(SlotOutcome {
        state: Final::of(*state)?,
        reason: reason.clone(),
    })
}

/// Polls Postgres until the delivery `entry_id` of slot `key` was handled
/// and the slot has a final outcome, or `timeout` passes, or `cancel` fires.
/// Store errors are retried until the deadline (a Postgres restart must not
/// fail a run whose slot published).
pub async fn until_settled(
    pool: &PgPool,
    key: &SlotKey,
    entry_id: &str,
    timeout: Duration,
    cancel: &CancellationToken,
) -> Watched {
    let deadline = Instant::now() + timeout;
    let mut last = Seen {
        delivery: None,
        slot: None,
    };
    let mut error: Option<String>;
    loop {
        match look(pool, key, entry_id).await {
            Ok(seen) => {
                error = None;
                last = seen;
                if let Some(delivery) = &last.delivery {
                    if let Some(slot) = settled(&last.slot) {
                        return Watched::Settled {
                            slot,
                            delivery: Some(delivery.clone()),
                        };
                    }
                    if delivery.outcome == "failed" {
                        return Watched::DeliveryFailed {
                            delivery: delivery.clone(),
                        };
                    }
                }
            }
            Err(e) => {
                tracing::warn!(slot = %key, error = %e, "reading the slot's outcome failed; will retry");
                error = Some(e.to_string());
            }
        }
        if Instant::now() >= deadline {
            return match settled(&last.slot) {
                Some(slot) => Watched::Settled {
                    slot,
                    delivery: None,
                },
                None => Watched::TimedOut {
                    delivery: last.delivery,
                    slot_state: last.slot.map(|(s, _)| s),
                    error,
                },
            };
        }
        tokio::select! {
            _ = cancel.cancelled() => return Watched::Cancelled,
            _ = tokio::time::sleep_until((Instant::now() + POLL_EVERY).min(deadline)) => {}
        }
    }
}

/// `published/<reason>`-style text: `None` reasons are left out.
fn with(what: &str, reason: &Option<String>) -> String {
    match reason {
        Some(r) => format!("{what}/{r}"),
        None => what.to_owned(),
    }
}

/// One line for `planner trigger --wait` without `--json`.
impl fmt::Display for Watched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Watched::Settled { slot, delivery } => {
                write!(f, "slot {}; ", with(slot.state.as_str(), &slot.reason))?;
                match delivery {
                    Some(d) => write!(f, "this delivery {}", with(&d.outcome, &d.reason)),
                    None => f.write_str("this delivery was never handled"),
                }
            }
            Watched::DeliveryFailed { delivery } => write!(
                f,
                "this delivery {} without settling the slot",
                with(&delivery.outcome, &delivery.reason)
            ),
            Watched::TimedOut {
                slot_state, error, ..
            } => {
                write!(
                    f,
                    "no outcome within --wait-timeout (slot {})",
                    slot_state.map_or("not started", SlotState::as_str)
                )?;
                match error {
                    Some(e) => write!(f, "; last error: {e}"),
                    None => Ok(()),
                }
            }
            Watched::Cancelled => f.write_str("stopped by a signal before an outcome was known"),
        }
    }
}

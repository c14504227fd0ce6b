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

use crate::outcome::{Recorded, SlotState};
use crate::slot::SlotKey;
use crate::store::{self, StoreError};
use serde::Serialize;
use sqlx::PgPool;
use std::fmt;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often Postgres is asked.
const POLL_EVERY: Duration = Duration::from_millis(200);

/// The slot's final gate state and reason: `published`, `skipped` or
/// `failed`, never an open one.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct SlotOutcome(Recorded);

impl SlotOutcome {
    /// How the slot ended.
    pub fn state(&self) -> SlotState {
        self.0.state
    }
    /// The gate row's state and reason.
    pub fn recorded(&self) -> &Recorded {
        &self.0
    }
}

/// The execution recorded for the delivery: its outcome (`published`,
/// `skipped`, `failed`) and reason (`slot_taken` for a blocked duplicate,
/// …; `None` for a publish).
#[derive(Debug, Clone, PartialEq)]
pub struct DeliveryOutcome(pub Recorded);

/// `{"outcome", "reason"}`: an execution's columns, by their names.
impl Serialize for DeliveryOutcome {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("DeliveryOutcome", 2)?;
        st.serialize_field("outcome", &self.0.state)?;
        st.serialize_field("reason", &self.0.reason)?;
        st.end()
    }
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
    slot: Option<Recorded>,
}

async fn look(pool: &PgPool, key: &SlotKey, entry_id: &str) -> Result<Seen, StoreError> {
    let delivery = store::entry_outcome(pool, entry_id)
        .await?
        .map(DeliveryOutcome);
    let mut conn = pool.acquire().await?;
    let slot = store::get_slot(&mut conn, key).await?.map(|r| r.recorded());
    Ok(Seen { delivery, slot })
}

/// `None` while the slot has no gate row or an open one (`claimed`,
/// `publishing`): its outcome is not known yet.
fn settled(slot: &Option<Recorded>) -> Option<SlotOutcome> {
    slot.as_ref()
        .filter(|r| !r.state.is_open())
        .cloned()
        .map(SlotOutcome)
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
                    if delivery.0.state == SlotState::Failed {
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
                    slot_state: last.slot.map(|r| r.state),
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

/// One line for `planner trigger --wait` without `--json`.
impl fmt::Display for Watched {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Watched::Settled { slot, delivery } => {
                write!(f, "slot {}; ", slot.0)?;
                match delivery {
                    Some(d) => write!(f, "this delivery {}", d.0),
                    None => f.write_str("this delivery was never handled"),
                }
            }
            Watched::DeliveryFailed { delivery } => {
                write!(f, "this delivery {} without settling the slot", delivery.0)
            }
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

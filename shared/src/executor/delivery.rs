//! One delivery's shared state and the bookkeeping every step does the
//! same way: the context passed down the steps ([`Ctx`]), the execution
//! record each outcome is written as, the leader epoch it is stamped with,
//! and the client-side deadline every transaction runs under.

use super::{ExecError, Executor, Exemption, MAX_DEADLINE_MS};
use crate::config::KindConfig;
use crate::outcome::Outcome;
use crate::queue::Delivery;
use crate::slot::SlotKey;
use crate::store::{self, ExecutionRecord};
use chrono::{DateTime, Utc};
use serde_json::Value;
use std::future::Future;
use std::sync::atomic::Ordering;

/// One delivery as every step sees it: the entry, the slot it names and
/// its kind's config, when its handling started, and what an operator's
/// request grants it. Made once by [`Executor::handle`] after validation
/// and passed down; no step reaches back for it.
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
            partition: self.d.partition,
            caller: self.d.caller().to_owned(),
            exempt: self.exempt.deadline,
            deadline_ms,
            cap: self.kind.daily_cap,
            started_at: self.started_at,
            record_only: self.kind.record_only(),
        }
    }
}

impl Executor {
    pub(super) fn epoch(&self) -> Option<i64> {
        Some(self.epoch_seen.load(Ordering::Relaxed)).filter(|e| *e > 0)
    }

    /// Runs `f` (one or more transactions) under the transaction deadline.
    /// When it expires the future is dropped: its transaction rolls back
    /// and its connection is tested before reuse.
    pub(super) async fn deadline<T, E>(
        &self,
        f: impl Future<Output = Result<T, E>>,
    ) -> Result<T, ExecError>
    where
        ExecError: From<E>,
    {
        match tokio::time::timeout(self.tx_deadline, f).await {
            Ok(r) => r.map_err(ExecError::from),
            Err(_) => Err(ExecError::Deadline(self.tx_deadline)),
        }
    }

    pub(super) fn record(
        &self,
        c: &Ctx<'_>,
        outcome: Outcome,
        detail: Value,
        due_at: Option<DateTime<Utc>>,
    ) -> ExecutionRecord {
        ExecutionRecord::new(
            c.key.to_string(),
            Some(c.key.clone()),
            outcome,
            c.started_at,
            self.clock.now(),
        )
        .entry(c.d.entry_id.as_str())
        .by(c.d.caller(), self.worker_id.as_str())
        .epoch(self.epoch())
        .detail(detail)
        .due(due_at)
    }
}

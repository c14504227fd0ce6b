//! A delivery that cannot be handled (malformed, poisoned): recorded and
//! moved to the dead-letter stream, so the worker carries on.

use super::{ExecError, Executor, Handled};
use crate::clock::unix_ms;
use crate::outcome::{FailReason, Outcome};
use crate::queue::Delivery;
use crate::slot::SlotKey;
use crate::store::{self, ExecutionRecord};
use chrono::{DateTime, Utc};
use serde_json::Value;

impl Executor {
    /// Records a malformed or hopeless delivery, then moves it to `P:dead`.
    pub(super) async fn dead_letter(
        &self,
        d: &Delivery,
        reason: FailReason,
        detail: Value,
        started_at: DateTime<Utc>,
    ) -> Result<Handled, ExecError> {
        let raw = d.slot().unwrap_or("");
        // A defective entry's slot is not believed, even when it parses.
        let key: Option<SlotKey> = raw.parse().ok().filter(|_| d.defect().is_none());
        let key = key.filter(|k| {
            self.config
                .kind(&k.kind)
                .is_some_and(|kc| kc.slot_time(k.slot_no).is_some())
        });
        let outcome = Outcome::Failed(reason);
        let rec = ExecutionRecord::new(raw, key, outcome, started_at, self.clock.now())
            .entry(d.entry_id.as_str())
            .by(d.caller(), self.worker_id.as_str())
            .epoch(self.epoch())
            .detail(detail);
        self.deadline(async {
            let mut conn = self.pool.acquire().await?;
            store::insert_execution(&mut conn, &rec).await
        })
        .await?;
        self.queue
            .dead_letter(d, reason.as_str(), unix_ms(self.clock.now()))
            .await?;
        tracing::warn!(entry = %d.entry_id, slot = raw, caller = d.caller(), reason = reason.as_str(), deliveries = d.deliveries, "delivery dead-lettered");
        crate::telemetry::dead_letter(reason.as_str());
        crate::telemetry::execution(
            rec.key.as_ref().map_or("", |k| k.kind.as_str()),
            outcome.as_str(),
            outcome.reason(),
        );
        Ok(Handled::Recorded(outcome))
    }
}

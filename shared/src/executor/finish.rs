//! The fenced record of what a claimed slot's calls produced: one
//! transaction ([`store::finish_batch`] of one) that only the claim's owner
//! can commit, retried in place so a store error after the CMS answered
//! never leads to a second call.

use super::{Claim, Ctx, ExecError, Executor};
use crate::outcome::{FailReason, Outcome, SkipReason};
use crate::receiver::Effect;
use crate::retry::Reconnect;
use crate::slot::PlannedSlot;
use crate::store::{self, StoreError};
use serde_json::{json, Value};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

/// What publishing a claimed slot produced, before it is recorded: the
/// receiver's [`Effect`] and the execution's detail (index errors, resume).
pub(super) struct Produced {
    pub(super) effect: Effect,
    pub(super) detail: serde_json::Map<String, Value>,
}

/// What a finished publish records: the outcome, the gate row's response,
/// the draft's URL (`None` unless published) and the execution's detail.
pub(super) fn settle_fields(
    effect: &Effect,
    mut detail: serde_json::Map<String, Value>,
) -> (Outcome, Option<Value>, Option<String>, Value) {
    match effect {
        Effect::Published(p) => {
            detail.insert("url".into(), json!(p.url));
            if p.attempts > 0 {
                detail.insert("attempts".into(), json!(p.attempts));
            }
            if p.found {
                // Applied by an earlier try whose answer was lost; this
                // try's look-up found it and wrote nothing.
                detail.insert("found_applied".into(), json!(true));
            }
            (
                Outcome::Published,
                Some(p.response.clone()),
                Some(p.url.clone()),
                Value::Object(detail),
            )
        }
        Effect::Withdrawn(seen) => {
            detail.insert("withdrawn".into(), seen.clone());
            (
                Outcome::Skipped(SkipReason::DraftWithdrawn),
                None,
                None,
                Value::Object(detail),
            )
        }
        Effect::Failed(report) => {
            detail.insert(
                "publish_error".into(),
                report.error_detail().unwrap_or(Value::Null),
            );
            (
                Outcome::Failed(FailReason::PublishError),
                None,
                None,
                Value::Object(detail),
            )
        }
    }
}

impl Executor {
    /// Stores what the CMS answered: `store` (one transaction, under the
    /// deadline) is retried in place with full-jitter backoff until it
    /// commits. The answer stays in memory and the claim's heartbeat keeps
    /// running meanwhile, so a store error after the call never leads to a
    /// second call. (Only a crash or a shutdown past its grace leaves the
    /// claim open, to be resumed under the same key.)
    pub(super) async fn store_outcome<T, E, F, Fut>(&self, what: &str, mut store: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        ExecError: From<E>,
    {
        let mut backoff = Reconnect::new(self.entropy.rng());
        loop {
            match self.deadline(store()).await {
                Ok(v) => return v,
                Err(e) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(slot = what, error = %e, retry_in_ms = delay.as_millis() as u64, failures = backoff.failures(), "storing the outcome failed; retrying in place (the CMS's answer is kept; it is not called again)");
                    tokio::time::sleep(delay).await;
                }
            }
        }
    }

    /// Records a publish's outcome, fenced on the claim: a
    /// [`store::finish_batch`] of one. One transaction; the caller retries it.
    #[tracing::instrument(name = "finish", skip_all, fields(slot = %c.key, attempt = claim.attempt))]
    pub(super) async fn finish(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        effect: &Produced,
        claim_lost: &AtomicBool,
    ) -> Result<Outcome, ExecError> {
        let (row, outcome) = self.finish_row(
            c,
            planned,
            claim,
            &effect.effect,
            effect.detail.clone(),
            claim_lost,
        );
        let now = self.clock.now();
        let f = store::finish_batch(&self.pool, std::slice::from_ref(&row), &self.worker_id, now)
            .await?;
        let f = f.first().copied().ok_or(StoreError::RowNotFound)?;
        Ok(self.finished(c, planned, claim, outcome, &row, f))
    }

    /// What [`store::finish_batch`] records for one publish: its outcome
    /// when the claim's fence holds, `slot_taken` (claim lost) when not.
    pub(super) fn finish_row(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        effect: &Effect,
        detail: serde_json::Map<String, Value>,
        claim_lost: &AtomicBool,
    ) -> (store::BatchFinish, Outcome) {
        let due = Some(planned.due_at);
        let (outcome, response, url, detail) = settle_fields(effect, detail);
        let saw_loss = claim_lost.load(Ordering::Relaxed);
        let lost_detail =
            json!({"claim_lost": true, "attempt": claim.attempt, "heartbeat_saw_loss": saw_loss});
        let row = store::BatchFinish {
            id: claim.row_id,
            attempt: claim.attempt,
            post_id: claim.post_id,
            outcome,
            response,
            url,
            record: self.record(c, outcome, detail, due),
            lost: self.record(c, Outcome::Skipped(SkipReason::SlotTaken), lost_detail, due),
        };
        (row, outcome)
    }

    /// Logs how a finish went; returns the delivery's outcome.
    pub(super) fn finished(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        outcome: Outcome,
        row: &store::BatchFinish,
        f: store::Finished,
    ) -> Outcome {
        match f {
            store::Finished::Recorded => {
                self.log_finished(c, planned, claim, outcome, &row.record.detail);
                outcome
            }
            store::Finished::Earlier => {
                // Settled under this very claim: an earlier try of this
                // transaction committed and only its answer was lost.
                tracing::info!(slot = %c.key, "the outcome was committed by an earlier try");
                self.log_finished(c, planned, claim, outcome, &row.record.detail);
                outcome
            }
            store::Finished::Lost => {
                // Another worker took the slot over while we were away: our
                // result must not land. It finishes the slot under the same key.
                tracing::warn!(slot = %c.key, attempt = claim.attempt, "claim lost to a takeover; recorded slot_taken (claim_lost) and changed nothing");
                Outcome::Skipped(SkipReason::SlotTaken)
            }
        }
    }

    pub(super) fn log_finished(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        outcome: Outcome,
        detail: &Value,
    ) {
        match outcome {
            Outcome::Published => {
                let lag_ms = (c.started_at - planned.due_at).num_milliseconds();
                tracing::info!(slot = %c.key, caller = c.d.caller(), draft = claim.post_id, lag_ms, "published");
            }
            _ => {
                tracing::warn!(slot = %c.key, draft = claim.post_id, detail = %detail, "publish failed; the slot keeps its draft until an operator retries or abandons it")
            }
        }
    }
}

//! A claimed slot's external calls (publish, then index) and the fenced
//! record of what they produced, retried in place so a store error after
//! the CMS answered never leads to a second call.

use super::{Claim, Ctx, ExecError, Executor};
use crate::config::KindConfig;
use crate::outcome::{FailReason, Outcome, SkipReason};
use crate::publish::CallReport;
use crate::retry::{Reconnect, RetryPolicy};
use crate::slot::PlannedSlot;
use crate::store::{self, StoreError};
use serde_json::{json, Value};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

/// The parts of a draft a publish sends.
pub(super) struct DraftText {
    pub(super) id: i64,
    pub(super) title: String,
    pub(super) body: String,
}

/// What publishing a claimed slot produced, before it is recorded.
pub(super) struct Effect {
    /// The URL, the CMS's answer and the attempts it took; or the failure.
    pub(super) publish: Result<(String, Value, u32), CallReport>,
    pub(super) detail: serde_json::Map<String, Value>,
}

/// What a finished publish records: the outcome, the gate row's response,
/// the draft's URL (`None` when it failed) and the execution's detail.
pub(super) fn settle_fields(
    publish: &Result<(String, Value, u32), CallReport>,
    mut detail: serde_json::Map<String, Value>,
) -> (Outcome, Option<Value>, Option<String>, Value) {
    match publish {
        Ok((url, response, attempts)) => {
            detail.insert("url".into(), json!(url));
            if *attempts > 0 {
                detail.insert("attempts".into(), json!(attempts));
            }
            (
                Outcome::Published,
                Some(response.clone()),
                Some(url.clone()),
                Value::Object(detail),
            )
        }
        Err(report) => {
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
    pub(super) fn policy(&self, kind: &KindConfig) -> RetryPolicy {
        self.retry_override.unwrap_or(RetryPolicy {
            max_attempts: kind.http_attempts,
            base: kind.retry_base,
            cap: kind.retry_cap,
        })
    }

    /// Publish → index → record, for a slot this delivery owns.
    #[tracing::instrument(name = "publish", skip_all, fields(slot = %c.key, attempt = claim.attempt))]
    pub(super) async fn publish(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: Claim,
        resumed: bool,
    ) -> Result<Outcome, ExecError> {
        let draft = self
            .deadline(async {
                let mut conn = self.pool.acquire().await?;
                store::get_draft(&mut conn, claim.post_id)
                    .await?
                    .ok_or(StoreError::RowNotFound)
            })
            .await?;
        let draft = DraftText {
            id: draft.id,
            title: draft.title,
            body: draft.body,
        };
        // The heartbeat keeps the claim and the stream entry alive while the
        // calls run and until their outcome is stored.
        let heartbeat = self.heartbeat(&[(&claim, c.d.entry_id.as_str())]);
        let (publish, detail) = self.calls(c, planned, &claim, &draft, resumed).await;
        let effect = Effect { publish, detail };
        let outcome = self
            .store_outcome(&c.key.to_string(), || {
                self.finish(c, planned, &claim, &effect, heartbeat.lost(0))
            })
            .await;
        heartbeat.stop().await;
        Ok(outcome)
    }

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

    /// The external calls for a claimed slot: publish (or record-only), then
    /// the index push. Records nothing; the caller keeps the claim's
    /// heartbeat running around it.
    pub(super) async fn calls(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        draft: &DraftText,
        resumed: bool,
    ) -> (
        Result<(String, Value, u32), CallReport>,
        serde_json::Map<String, Value>,
    ) {
        let key_s = c.key.to_string();
        let mut rng = self.entropy.rng();
        let policy = self.policy(c.kind);
        let mut detail = serde_json::Map::new();
        if resumed {
            detail.insert("resumed".into(), json!(true));
            detail.insert("attempt".into(), json!(claim.attempt));
        }
        // Publish (or record-only).
        let publish: Result<(String, Value, u32), CallReport> = match &c.kind.publish_url {
            None => {
                let url = format!("record-only://{}/{}", c.key.kind, draft.id);
                Ok((url.clone(), json!({"url": url, "record_only": true}), 0))
            }
            // Test-only hook (see crate::sabotage): a publish that never calls.
            Some(_) if crate::sabotage::phantom(&key_s) => {
                Ok(crate::sabotage::phantom_answer(&key_s))
            }
            Some(url) => {
                let body = json!({
                    "slot": key_s, "kind": c.key.kind, "day": c.key.day.to_string(), "slot_no": c.key.slot_no,
                    "nominal_at": planned.nominal_at.to_rfc3339(), "due_at": planned.due_at.to_rfc3339(),
                    "draft": {"id": draft.id, "title": draft.title, "body": draft.body},
                });
                // Test-only: crate::sabotage may have it sent again.
                let mut key = key_s.clone();
                let report = loop {
                    let report = self
                        .webhook
                        .call(
                            "publish",
                            url,
                            &key,
                            &body,
                            &c.kind.auth,
                            c.kind.http_timeout,
                            policy,
                            &mut rng,
                        )
                        .await;
                    match crate::sabotage::send_again(&key_s, report.result.is_ok()) {
                        Some(again) => key = again,
                        None => break report,
                    }
                };
                match &report.result {
                    Ok(answer) => {
                        let url = answer
                            .url
                            .clone()
                            .unwrap_or_else(|| format!("{url}#{key_s}"));
                        Ok((url.clone(), answer.stored(&url), report.attempts))
                    }
                    Err(_) => Err(report),
                }
            }
        };
        // Index push: its failure never undoes the publish.
        if let (Ok((url, _, _)), Some(index_url)) = (&publish, &c.kind.index_url) {
            let body = json!({"slot": key_s, "url": url, "draft_id": draft.id});
            let report = self
                .webhook
                .call(
                    "index",
                    index_url,
                    &format!("{key_s}:index"),
                    &body,
                    &c.kind.auth,
                    c.kind.http_timeout,
                    policy,
                    &mut rng,
                )
                .await;
            if let Some(e) = report.error_detail() {
                tracing::warn!(slot = %c.key, error = %e, "index push failed; the slot stays published");
                detail.insert("index_error".into(), e);
            }
        }
        (publish, detail)
    }

    /// Records a publish's outcome, fenced on the claim: a
    /// [`store::finish_batch`] of one. One transaction; the caller retries it.
    #[tracing::instrument(name = "finish", skip_all, fields(slot = %c.key, attempt = claim.attempt))]
    pub(super) async fn finish(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        effect: &Effect,
        claim_lost: &AtomicBool,
    ) -> Result<Outcome, ExecError> {
        let (row, outcome) = self.finish_row(
            c,
            planned,
            claim,
            &effect.publish,
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
        publish: &Result<(String, Value, u32), CallReport>,
        detail: serde_json::Map<String, Value>,
        claim_lost: &AtomicBool,
    ) -> (store::BatchFinish, Outcome) {
        let due = Some(planned.due_at);
        let (outcome, response, url, detail) = settle_fields(publish, detail);
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

//! Phase four, the record: a walk's outcomes committed, then acknowledged.
//!
//! What the calls produced is recorded fenced on each claim: one
//! transaction for all of a walk's calls ([`store::finish_batch`]; a
//! delivery alone is a finish of one) that only each claim's owner can
//! commit, retried in place until it does, so a store error after the CMS
//! answered never leads to a second call. A delivery not to be believed is
//! recorded and moved to the dead-letter stream ([`dead_letter`]), so the
//! worker carries on. An entry is acknowledged only once its outcome is
//! committed ([`acknowledge`]).

use super::call::{Called, Heartbeat};
use super::prepare::Ctx;
use super::{Claim, ExecError, Executor, Handled, Reach};
use crate::clock::unix_ms;
use crate::outcome::{FailReason, Outcome, SkipReason};
use crate::queue::{Delivery, EntryRef};
use crate::receiver::Effect;
use crate::retry::Reconnect;
use crate::slot::{PlannedSlot, SlotKey};
use crate::store::{self, ExecutionRecord};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use std::future::Future;
use std::sync::atomic::Ordering;

/// Records what `called` (a wave of returned calls) produced in one fenced
/// transaction, retried in place until it commits. The walk's heartbeat
/// keeps the claims alive until then and is stopped by the walk once every
/// wave is recorded. Returns (index, outcome) per call, in order.
#[tracing::instrument(name = "finish", skip_all, fields(claims = called.len()))]
pub(super) async fn record(
    x: &Executor,
    called: Vec<Called<'_>>,
    heartbeat: &Heartbeat,
) -> Vec<(usize, Handled)> {
    if called.is_empty() {
        return Vec::new();
    }
    let (rows, outcomes): (Vec<store::BatchFinish>, Vec<Outcome>) = called
        .iter()
        .map(|cl| {
            let lost = heartbeat.lost(cl.at).load(Ordering::Relaxed);
            heartbeat.recording(cl.at);
            finish_row(x, cl, lost)
        })
        .unzip();
    // The calls are made: from here on the outcomes are stored, retried in
    // place until they are, never by calling again.
    let what = match called.as_slice() {
        [one] => one.claimed.c.key.to_string(),
        _ => "batch".to_owned(),
    };
    let now = x.clock.now();
    let finished = store_outcome(x, &what, || {
        store::finish_batch(&x.pool, &rows, &x.worker_id, now)
    })
    .await;
    called
        .iter()
        .zip(outcomes)
        .zip(rows.iter().zip(finished))
        .map(|((cl, outcome), (row, f))| {
            let c = &cl.claimed;
            let o = finished_as(&c.c, &c.planned, &c.claim, outcome, row, f);
            (c.i, Handled::Recorded(o))
        })
        .collect()
}

/// Acknowledges the entries of `done`, whose outcomes are committed, and
/// counts each recorded outcome. A delivery alone fails when Redis does
/// (nothing is acknowledged; its redelivery finds its outcome recorded).
/// A batch reports none of them decided then: the caller walks each
/// alone, which finds its outcome by its entry id and acknowledges it.
pub(super) async fn acknowledge(
    x: &Executor,
    ds: &[Delivery],
    done: Vec<(usize, Handled)>,
    reach: Reach,
) -> Result<Vec<(usize, Handled)>, ExecError> {
    if done.is_empty() {
        return Ok(done);
    }
    for (i, h) in &done {
        if let Handled::Recorded(o) = h {
            // A decided delivery was validated: its slot parses.
            if let Some(key) = ds[*i].slot().and_then(|s| s.parse::<SlotKey>().ok()) {
                crate::telemetry::execution(&key.kind, o.as_str(), o.reason());
            }
        }
    }
    let entries: Vec<EntryRef> = done.iter().map(|(i, _)| ds[*i].entry()).collect();
    match x.queue.ack_all(&entries).await {
        Ok(()) => {}
        Err(e) if reach == Reach::Whole => return Err(e.into()),
        Err(e) => {
            tracing::warn!(error = %e, entries = entries.len(), "acknowledging recorded outcomes failed; their deliveries are handled again and found recorded");
            return Ok(Vec::new());
        }
    }
    for (i, h) in &done {
        if *h == Handled::AlreadyHandled {
            tracing::info!(entry = %ds[*i].entry_id, slot = ds[*i].slot().unwrap_or(""), "entry already handled; acknowledged again");
        }
    }
    Ok(done)
}

/// Records a malformed or hopeless delivery, then moves it to `P:dead`.
pub(super) async fn dead_letter(
    x: &Executor,
    d: &Delivery,
    reason: FailReason,
    detail: Value,
    started_at: DateTime<Utc>,
) -> Result<Handled, ExecError> {
    let raw = d.slot().unwrap_or("");
    // A defective entry's slot is not believed, even when it parses.
    let key: Option<SlotKey> = raw.parse().ok().filter(|_| d.defect().is_none());
    let key = key.filter(|k| {
        x.config
            .kind(&k.kind)
            .is_some_and(|kc| kc.slot_time_on(k.day, k.slot_no).is_some())
    });
    let outcome = Outcome::Failed(reason);
    let rec = ExecutionRecord::new(raw, key, outcome, started_at, x.clock.now())
        .entry(d.entry_id.as_str())
        .by(d.caller(), x.worker_id.as_str())
        .epoch(x.epoch())
        .detail(detail);
    x.deadline(async {
        let mut conn = x.pool.acquire().await?;
        store::record_dead_letter(&mut conn, &rec).await
    })
    .await?;
    x.queue
        .dead_letter(d, reason.as_str(), unix_ms(x.clock.now()))
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

/// Stores what the CMS answered: `store` (one transaction, under the
/// deadline) is retried in place with full-jitter backoff until it
/// commits. The answer stays in memory and the claims' heartbeat keeps
/// running meanwhile, so a store error after the call never leads to a
/// second call. (Only a crash or a shutdown past its grace leaves a claim
/// open, to be resumed under the same key.)
async fn store_outcome<T, E, F, Fut>(x: &Executor, what: &str, mut store: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    ExecError: From<E>,
{
    let mut backoff = Reconnect::new(x.entropy.rng());
    loop {
        match x.deadline(store()).await {
            Ok(v) => return v,
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::warn!(slot = what, error = %e, retry_in_ms = delay.as_millis() as u64, failures = backoff.failures(), "storing the outcome failed; retrying in place (the CMS's answer is kept; it is not called again)");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// What [`store::finish_batch`] records for one publish: its outcome when
/// the claim's fence holds, `slot_taken` (claim lost) when not.
fn finish_row(x: &Executor, called: &Called<'_>, saw_loss: bool) -> (store::BatchFinish, Outcome) {
    let Called {
        claimed,
        effect,
        detail,
        ..
    } = called;
    let (c, claim) = (&claimed.c, &claimed.claim);
    let due = Some(claimed.planned.due_at);
    let (outcome, response, url, detail) = settle_fields(effect, detail.clone());
    let row = store::BatchFinish {
        id: claim.row_id,
        attempt: claim.attempt,
        post_id: claim.post_id,
        outcome,
        response,
        url,
        record: x.execution(c, outcome, detail, due),
        heartbeat_saw_loss: saw_loss,
    };
    (row, outcome)
}

/// Logs how a finish went; returns the delivery's outcome.
fn finished_as(
    c: &Ctx<'_>,
    planned: &PlannedSlot,
    claim: &Claim,
    outcome: Outcome,
    row: &store::BatchFinish,
    f: store::Finished,
) -> Outcome {
    match f {
        store::Finished::Recorded => {
            log_finished(c, planned, claim, outcome, &row.record.detail);
            outcome
        }
        store::Finished::Earlier => {
            // Settled under this very claim: an earlier try of this
            // transaction committed and only its answer was lost.
            tracing::info!(slot = %c.key, "the outcome was committed by an earlier try");
            log_finished(c, planned, claim, outcome, &row.record.detail);
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

fn log_finished(
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

/// What a finished publish records: the outcome, the gate row's response,
/// the draft's URL (`None` unless published) and the execution's detail.
fn settle_fields(
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
            if let Some(noted) = &p.noted {
                detail.insert("noted".into(), noted.clone());
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

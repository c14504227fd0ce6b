//! Phase three, the calls: what a walk's claimed slots do outside.
//!
//! Each claimed slot's kind's receiver publishes (reading before it writes
//! where it can), then its indexer pushes; a batch's calls run side by
//! side, each holding one of its worker's call permits until it returns,
//! and the walk takes them as they return ([`start`]). One heartbeat keeps every claim of the walk and its stream entry
//! alive meanwhile (a single delivery's is a heartbeat of one): each beat
//! is one fenced `UPDATE` for all the claims still held
//! ([`store::extend_claims`]) and one `XCLAIM … JUSTID` for their entries,
//! so a batch of 256 slow calls costs two round trips per beat, not 512,
//! and no task or timer per claim. It runs on until
//! [`record`](super::record) has stored every outcome, and says which claims
//! another worker took over.
//!
//! What the calls produced has every spelling of the kind's secrets hidden
//! first ([`hide_secrets`]): an answer may echo the request, and what is
//! stored is served by the console.

use super::prepare::Ctx;
use super::{Claim, ExecError, Executor};
use crate::config::KindConfig;
use crate::queue::EntryRef;
use crate::receiver::{Call, DraftText, Effect};
use crate::retry::RetryPolicy;
use crate::slot::PlannedSlot;
use crate::store::{self, StoreError};
use crate::untrusted::{scrub, scrub_json};
use futures_util::stream::FuturesUnordered;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

/// A slot this walk owns, as the gate handed it over.
pub(super) struct Claimed<'a> {
    /// Its delivery's index in the walk's deliveries.
    pub(super) i: usize,
    pub(super) c: Ctx<'a>,
    pub(super) planned: PlannedSlot,
    pub(super) claim: Claim,
    /// The draft bound to the slot, when the gate read it (a batch's
    /// claims); `None`: read here (a delivery alone, a resumed claim).
    pub(super) draft: Option<DraftText>,
    /// Resumed after its previous owner died mid-publish.
    pub(super) resumed: bool,
}

/// A claimed slot after its calls: the receiver's [`Effect`] (secrets
/// hidden) and the execution's detail (index errors, resume).
pub(super) struct Called<'a> {
    pub(super) claimed: Claimed<'a>,
    /// Its position among the heartbeat's claims.
    pub(super) at: usize,
    pub(super) effect: Effect,
    pub(super) detail: serde_json::Map<String, Value>,
}

/// Starts the calls of `claimed`, all at once, under one heartbeat, each
/// holding its token of `tokens` (one of its worker's call permits) until
/// it returns. Hands back the calls, to be awaited as they return, and the
/// heartbeat, which must run until every outcome is stored. An `Err` (a
/// draft could not be read) comes before any call.
pub(super) async fn start<'a, T: Send + 'a>(
    x: &'a Executor,
    mut claimed: Vec<Claimed<'a>>,
    tokens: Vec<Option<T>>,
) -> Result<
    (
        FuturesUnordered<impl Future<Output = Called<'a>> + Send + 'a>,
        Heartbeat,
    ),
    ExecError,
> {
    for cl in &mut claimed {
        if cl.draft.is_none() {
            let post_id = cl.claim.post_id;
            let draft = x
                .deadline(async {
                    let mut conn = x.pool.acquire().await?;
                    store::get_draft(&mut conn, post_id)
                        .await?
                        .ok_or(StoreError::RowNotFound)
                })
                .await?;
            cl.draft = Some(DraftText {
                id: draft.id,
                title: draft.title,
                body: draft.body,
                cms_id: draft.cms_id,
            });
        }
    }
    // Every claim keeps its heartbeat until its outcome is committed, not
    // just until its own call returned: the record of a wave may wait in
    // place for Postgres, and a finished slot's claim must not lapse
    // meanwhile. (Dropped on an early return, it stops by itself.)
    let heartbeat = heartbeat(
        x,
        &claimed
            .iter()
            .map(|cl| (&cl.claim, cl.c.d.entry()))
            .collect::<Vec<_>>(),
    );
    let span = tracing::info_span!("publish", claims = claimed.len());
    let running = claimed
        .into_iter()
        .zip(tokens)
        .enumerate()
        .map(|(at, (claimed, token))| {
            async move {
                let draft = claimed.draft.as_ref().expect("every draft read above");
                let (effect, detail) = calls(
                    x,
                    &claimed.c,
                    &claimed.planned,
                    &claimed.claim,
                    draft,
                    claimed.resumed,
                )
                .await;
                // The call has returned: its permit goes back now, not when
                // the wave it lands in is recorded.
                drop(token);
                Called {
                    claimed,
                    at,
                    effect,
                    detail,
                }
            }
            .instrument(span.clone())
        })
        .collect();
    Ok((running, heartbeat))
}

fn policy(x: &Executor, kind: &KindConfig) -> RetryPolicy {
    x.retry_override.unwrap_or(RetryPolicy {
        max_attempts: kind.http_attempts,
        base: kind.retry_base,
        cap: kind.retry_cap,
    })
}

/// The external calls for a claimed slot: the kind's receiver, then its
/// indexer. Records nothing; the caller keeps the claim's heartbeat
/// running around it.
async fn calls(
    x: &Executor,
    c: &Ctx<'_>,
    planned: &PlannedSlot,
    claim: &Claim,
    draft: &DraftText,
    resumed: bool,
) -> (Effect, serde_json::Map<String, Value>) {
    let key_s = c.key.to_string();
    let mut rng = x.entropy.rng();
    let mut detail = serde_json::Map::new();
    if resumed {
        detail.insert("resumed".into(), json!(true));
        detail.insert("attempt".into(), json!(claim.attempt));
    }
    let route = x
        .receivers
        .route(&c.key.kind)
        .expect("a validated delivery names a configured kind");
    let mut call = Call {
        slot: &c.key,
        planned,
        draft,
        idempotency_key: key_s.clone(),
        resumed,
        gate_may_forget: x.receivers.gate_may_forget(),
        now: x.clock.now(),
        policy: policy(x, c.kind),
    };
    // A test build's hooks (sabotage) may pretend the call, or send it
    // again; production calls once.
    let pretended = (!c.kind.record_only())
        .then(|| x.hooks.instead_of_call(&key_s))
        .flatten();
    let effect = if let Some(effect) = pretended {
        effect
    } else {
        loop {
            let effect = route.receiver.publish(&call, &mut rng).await;
            let ok = matches!(effect, Effect::Published(_));
            match x.hooks.send_again(&key_s, ok) {
                Some(again) => call.idempotency_key = again,
                None => break effect,
            }
        }
    };
    let secrets = c.kind.secret_spellings();
    // Index push: its failure never undoes the publish.
    if let (Effect::Published(p), Some(indexer)) = (&effect, &route.indexer) {
        if let Err(mut e) = indexer.push(&call, &p.url, &mut rng).await {
            scrub_json(&mut e, &secrets);
            tracing::warn!(slot = %c.key, error = %e, "index push failed; the slot stays published");
            detail.insert("index_error".into(), e);
        }
    }
    (hide_secrets(effect, &secrets), detail)
}

/// The walk's claims kept alive (see the module's overview).
pub(super) struct Heartbeat {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
    /// Per claim, in the order given: its heartbeat found it taken over.
    lost: Arc<[AtomicBool]>,
    /// Per claim, in the order given: its outcome is being stored, so a
    /// beat that finds it no longer held (the finish committed) drops it
    /// quietly.
    recording: Arc<[AtomicBool]>,
}

impl Heartbeat {
    /// Whether the heartbeat found claim `i` (in the order given) taken
    /// over; it stops renewing a claim once it has.
    pub(super) fn lost(&self, i: usize) -> &AtomicBool {
        &self.lost[i]
    }

    /// Says that claim `i`'s outcome is about to be stored: from now on
    /// the heartbeat finding it no longer held is the finish, not a
    /// takeover.
    pub(super) fn recording(&self, i: usize) {
        self.recording[i].store(true, Ordering::Relaxed);
    }

    /// Stops it.
    pub(super) async fn stop(mut self) {
        self.stop.cancel();
        let _ = (&mut self.task).await;
    }
}

/// A publish abandoned half-way (its future dropped: a shutdown past the
/// grace period, an aborted task) must stop renewing its claims, or those
/// slots could never be resumed by anyone else while this process lives.
impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// A claim the heartbeat still renews.
struct Held {
    /// Its position among the claims given, for its `lost` flag.
    at: usize,
    /// Its gate row and attempt: the fence.
    row: i64,
    attempt: i32,
    /// Its stream entry, touched with it.
    entry: (u16, String),
}

/// Keeps `claims` (each with its stream entry) and their entries alive
/// while their webhooks run, every `visibility/3`, until stopped.
fn heartbeat(x: &Executor, claims: &[(&Claim, EntryRef<'_>)]) -> Heartbeat {
    let lost: Arc<[AtomicBool]> = claims.iter().map(|_| AtomicBool::new(false)).collect();
    let recording: Arc<[AtomicBool]> = claims.iter().map(|_| AtomicBool::new(false)).collect();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut held: Vec<Held> = claims
        .iter()
        .enumerate()
        .map(|(at, (c, e))| Held {
            at,
            row: c.row_id,
            attempt: c.attempt,
            entry: (e.partition, e.id.to_owned()),
        })
        .collect();
    let (this, lost2, recording2, stop2) =
        (x.clone(), lost.clone(), recording.clone(), stop.clone());
    let every = (x.visibility / 3).max(Duration::from_millis(50));
    let task = tokio::spawn(async move {
        while !held.is_empty() {
            tokio::select! {
                _ = stop2.cancelled() => return,
                _ = tokio::time::sleep(every) => {}
            }
            let fence: Vec<(i64, i32)> = held.iter().map(|h| (h.row, h.attempt)).collect();
            match this
                .deadline(store::extend_claims(
                    &this.pool,
                    &fence,
                    &this.worker_id,
                    this.clock.now(),
                    this.visibility,
                ))
                .await
            {
                Ok(still) => {
                    let still: HashSet<i64> = still.into_iter().collect();
                    held.retain(|h| {
                        let kept = still.contains(&h.row);
                        if !kept && !recording2[h.at].load(Ordering::Relaxed) {
                            lost2[h.at].store(true, Ordering::Relaxed);
                            tracing::warn!(row = h.row, "heartbeat found the claim taken over");
                        }
                        kept
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, claims = held.len(), "claim heartbeat failed; will retry")
                }
            }
            let entries: Vec<EntryRef> = held
                .iter()
                .map(|h| EntryRef {
                    partition: h.entry.0,
                    id: &h.entry.1,
                })
                .collect();
            if let Err(e) = this.queue.touch_all(&this.worker_id, &entries).await {
                tracing::warn!(error = %e, entries = entries.len(), "stream heartbeat failed; will retry");
            }
        }
    });
    Heartbeat {
        stop,
        task,
        lost,
        recording,
    }
}

/// `effect` with every spelling of the kind's `secrets` hidden from what
/// is stored of it (the gate row's answer and what was noted, a failure's
/// error and `Location`, a withdrawal's detail), whichever receiver produced it: the
/// receivers hide what they sent from the answers they read, and this is
/// the one place that holds for every receiver (WordPress's Application
/// Password included) before anything reaches a row.
fn hide_secrets(effect: Effect, secrets: &[String]) -> Effect {
    if secrets.is_empty() {
        return effect;
    }
    match effect {
        Effect::Published(mut p) => {
            scrub_json(&mut p.response, secrets);
            if let Some(noted) = &mut p.noted {
                scrub_json(noted, secrets);
            }
            Effect::Published(p)
        }
        Effect::Withdrawn(mut seen) => {
            scrub_json(&mut seen, secrets);
            Effect::Withdrawn(seen)
        }
        Effect::Failed(mut report) => {
            match &mut report.result {
                Err(f) => {
                    f.error = scrub(&f.error, secrets);
                    f.location = f.location.as_deref().map(|l| scrub(l, secrets));
                }
                Ok(a) => a.text = scrub(&a.text, secrets),
            }
            Effect::Failed(report)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::receiver::{CallFailure, CallReport, Published};

    /// A WordPress kind with an IndexNow push: an Application Password, in
    /// both its spellings, and an IndexNow key.
    fn kind_secrets() -> Vec<String> {
        let text = "[[kinds]]\nname = \"article\"\ntimezone = \"UTC\"\nslots = [\"09:00\"]\ndaily_cap = 1\nstarting_deadline = \"1h\"\n\
            [kinds.wordpress]\nurl = \"https://blog.example\"\nuser = \"editor\"\napp_password_env = \"WP\"\n\
            [kinds.indexnow]\nendpoint = \"https://api.indexnow.org/indexnow\"\nkey_env = \"IX\"\nhost = \"blog.example\"\n";
        let vars = [
            ("WP", "abcd EFGH ijkl MNOP qrst UVWX"),
            ("IX", "0123456789abcdef"),
        ];
        let config = Config::parse_with_env(std::path::Path::new("t.toml"), text, &|n| {
            vars.iter()
                .find(|(k, _)| *k == n)
                .map(|(_, v)| v.to_string())
        })
        .expect("config");
        config.kinds[0].secret_spellings()
    }

    #[test]
    fn every_secret_of_the_kind_is_hidden_from_what_is_stored() {
        let secrets = kind_secrets();
        let echoed = "HTTP 400: {\"pw\":\"abcdEFGHijklMNOPqrstUVWX\",\"spaced\":\"abcd EFGH ijkl MNOP qrst UVWX\",\"k\":\"0123456789abcdef\"}";
        let failed = Effect::Failed(CallReport {
            attempts: 1,
            result: Err(CallFailure {
                status: Some(400),
                error: echoed.into(),
                retryable: false,
                location: Some("/x?k=0123456789abcdef".into()),
            }),
        });
        let Effect::Failed(r) = hide_secrets(failed, &secrets) else {
            unreachable!()
        };
        let detail = r.error_detail().unwrap().to_string();
        for secret in ["abcdEFGH", "abcd EFGH", "01234567"] {
            assert!(!detail.contains(secret), "{secret}: {detail}");
        }
        assert!(detail.contains("\\\"k\\\":\\\"***\\\""), "{detail}");
        let published = Effect::Published(Published {
            url: "https://blog.example/p".into(),
            response: serde_json::json!({"answer": "{\"echo\": \"0123456789abcdef\"}"}),
            attempts: 1,
            found: false,
            noted: None,
        });
        let Effect::Published(p) = hide_secrets(published, &secrets) else {
            unreachable!()
        };
        assert_eq!(p.response["answer"], "{\"echo\": \"***\"}");
    }
}

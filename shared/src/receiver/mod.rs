//! Receivers: where a claimed slot's effect happens, behind one trait.
//!
//! The gate makes a slot's *claim* exactly-once; the receiver is where the
//! *effect* lands, and it is the one place slotgate cannot see into. The
//! gap is "applied, answer lost": the CMS applied the publish and its
//! answer never arrived (a timeout, a reset, a worker killed mid-call). A
//! blind re-send then publishes twice unless the CMS honours the
//! `Idempotency-Key`, and no mainstream CMS does. So every receiver that
//! can look its effect up does so before it writes again
//! (**read-before-write**):
//!
//! | receiver | before a write | a write whose answer was lost |
//! |---|---|---|
//! | [`record_only`] | — (the effect is the gate row itself) | — |
//! | [`webhook`] without `probe_url` | — | re-sent with the same key; the CMS must dedupe |
//! | [`webhook`] with `probe_url` | probe after any unknown outcome or takeover | probed: `200 {"url"}` = applied, `404` = send, anything else (`409` in progress) = probe again |
//! | [`wordpress`], drafts in WordPress | the post's status, always | read again: `publish` = applied |
//! | [`wordpress`], drafts in slotgate | stage a `draft` with the marker, then look the marker up | the staged copies resolve to one post (lowest id), published by a status change |
//!
//! Read-before-write cannot see a write the CMS has *accepted but not yet
//! saved* (queued past the timeout). So where the receiver creates, the
//! write that may repeat is one nobody sees (**stage, then publish**: see
//! [`wordpress`]); a `probe_url` CMS must record a key on receipt and
//! answer `409` while it is in progress (see [`webhook`]).
//!
//! The executor calls [`Receiver::publish`] with one [`Call`] and gets one
//! [`Effect`] back; it never asks which receiver it holds. The index push
//! is the same shape ([`Indexer::push`]): [`webhook`]'s `index_url` or
//! [`indexnow`]. A push never undoes a publish: its failure is reported
//! as `index_error` beside the `published` outcome.
//!
//! [`Receivers`] holds one [`Route`] per kind, built once from the config.

pub mod indexnow;
pub mod record_only;
pub mod webhook;
pub mod wordpress;

use crate::clock::SharedClock;
use crate::config::Config;
use crate::retry::RetryPolicy;
use crate::slot::{PlannedSlot, SlotKey};
use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use rand::rngs::StdRng;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;

pub use webhook::{Answer, CallFailure, CallReport, Endpoint, Http, ANSWER_LIMIT};

/// The draft a publish sends: its slotgate id, its text, and — for a post
/// that lives in WordPress — the post's id there.
#[derive(Debug, Clone)]
pub struct DraftText {
    /// The `draft` row.
    pub id: i64,
    /// The title sent (or, for a WordPress post, kept there).
    pub title: String,
    /// The body sent.
    pub body: String,
    /// The post's id at the CMS, for drafts mirrored from WordPress.
    pub cms_id: Option<i64>,
}

/// One publish, as the executor hands it to a receiver: everything a
/// receiver may need, in one value (it replaces the eight arguments the
/// webhook call once took).
pub struct Call<'a> {
    /// The slot being published.
    pub slot: &'a SlotKey,
    /// Its schedule (the webhook body carries the nominal and due times).
    pub planned: &'a PlannedSlot,
    /// The draft bound to the slot.
    pub draft: &'a DraftText,
    /// The `Idempotency-Key` sent: the slot key (test-only sabotage may
    /// send under another).
    pub idempotency_key: String,
    /// The claim may have been worked on before (a takeover of a lapsed
    /// claim, an operator's `planner retry`): whatever was sent then may
    /// have been applied, so a receiver that can look up looks first.
    pub resumed: bool,
    /// The gate's memory may have lost this slot's row: the primary was not
    /// seen with a synchronous standby, and a failover to an asynchronous
    /// replica goes without the last committed gate rows (DESIGN 4.20). A
    /// fresh claim may then repeat a publish that was applied, so a receiver
    /// that can look up looks before its first send as well.
    pub gate_may_forget: bool,
    /// The publish time given to a CMS that dates posts (WordPress).
    pub now: DateTime<Utc>,
    /// Attempts and backoff of the call (each receiver knows its kind's
    /// `http_timeout`; tests shorten only this).
    pub policy: RetryPolicy,
}

/// A publish that took effect.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    /// Where the draft is now published.
    pub url: String,
    /// What the gate row keeps of the answer (bounded, see [`Answer::stored`]).
    pub response: Value,
    /// Calls made (0 for record-only).
    pub attempts: u32,
    /// The effect was found by a look-up (an earlier try applied it and
    /// its answer was lost); this try wrote nothing.
    pub found: bool,
    /// What the receiver noticed beside the effect, kept in the
    /// execution's detail as `noted` (WordPress: extra staged copies
    /// trashed, a post trashed after its publish).
    pub noted: Option<Value>,
}

/// What a receiver's publish came to. The caller branches on it, so it is
/// an enum, not an error.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Published (now, or found applied by an earlier try).
    Published(Published),
    /// The draft is no longer ready at the CMS (an editor pulled the post
    /// back, trashed or deleted it): nothing was published, and the detail
    /// says what was seen. Recorded `skipped/draft_withdrawn`.
    Withdrawn(Value),
    /// Refused, or still unknown after every attempt: `failed/publish_error`.
    Failed(CallReport),
}

/// Where a kind's publishes go.
pub trait Receiver: Send + Sync + std::fmt::Debug {
    /// Publishes `call.draft` for `call.slot`, reading before writing where
    /// the receiver can, so a try whose answer was lost is never repeated
    /// blindly.
    fn publish<'a>(&'a self, call: &'a Call<'a>, rng: &'a mut StdRng) -> BoxFuture<'a, Effect>;

    /// For a receiver whose drafts live at the CMS (WordPress): how often
    /// the worker's background refresh mirrors them into the draft table
    /// ([`crate::worker`]; never on a delivery's path, so a slow CMS delays
    /// no gate). `None` for the others.
    fn mirrors_drafts(&self) -> Option<std::time::Duration> {
        None
    }

    /// Lists the CMS's ready drafts now, for the worker's drafts step to
    /// mirror ([`crate::worker::drafts::sync`]: `planner drafts sync`, the
    /// background refresh); `Ok(None)` for a receiver whose drafts live in
    /// slotgate. A receiver only reads its CMS: what it lists is written to
    /// Postgres by the caller.
    fn list_drafts(&self) -> BoxFuture<'_, Result<Option<CmsDrafts>, CallFailure>> {
        Box::pin(async { Ok(None) })
    }

    /// Whether the CMS answers and accepts the kind's credentials (`planner
    /// check`, the worker's start); `Err` names what is wrong.
    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
}

/// A CMS's ready drafts as listed, oldest first; a complete listing lets
/// the mirror unready what it no longer shows.
#[derive(Debug, Clone, Default)]
pub struct CmsDrafts {
    /// (CMS id, title, creation time) of each ready post listed.
    pub posts: Vec<(i64, String, DateTime<Utc>)>,
    /// The listing reached its end (within `sync_limit`).
    pub complete: bool,
}

/// Where a kind's published URLs are pushed for indexing.
pub trait Indexer: Send + Sync + std::fmt::Debug {
    /// Pushes `url`; `Err` is the `index_error` detail. Never undoes the
    /// publish.
    fn push<'a>(
        &'a self,
        call: &'a Call<'a>,
        url: &'a str,
        rng: &'a mut StdRng,
    ) -> BoxFuture<'a, Result<(), Value>>;
}

/// A kind's receiver and indexer.
#[derive(Debug, Clone)]
pub struct Route {
    /// Where the publish goes.
    pub receiver: Arc<dyn Receiver>,
    /// Where the URL is pushed afterwards, if anywhere.
    pub indexer: Option<Arc<dyn Indexer>>,
}

/// Every kind's [`Route`], built once per process from the config. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct Receivers {
    routes: Arc<HashMap<String, Route>>,
    /// See [`Call::gate_may_forget`]; true until Postgres is seen with a
    /// synchronous standby.
    gate_may_forget: Arc<std::sync::atomic::AtomicBool>,
    /// Per kind: whether its drafts have been mirrored once by this
    /// process's background refresh (true for every kind nobody refreshes;
    /// see [`Receivers::await_mirror`]).
    mirrored: Arc<HashMap<String, tokio::sync::watch::Sender<bool>>>,
}

impl Receivers {
    /// The routes of every kind of `config`; `clock` dates signatures.
    pub fn for_config(config: &Config, clock: SharedClock) -> Self {
        let http = Http::for_config(config, clock);
        let mut routes = HashMap::new();
        for kind in &config.kinds {
            let receiver: Arc<dyn Receiver> = if let Some(wp) = &kind.wordpress {
                Arc::new(wordpress::WordPress::new(
                    &kind.name,
                    wp.clone(),
                    http.client_for(&kind.auth),
                    kind.http_timeout,
                    &config.jitter_seed,
                ))
            } else if let Some(url) = &kind.publish_url {
                Arc::new(webhook::WebhookReceiver {
                    http: http.clone(),
                    publish_url: url.clone(),
                    probe_url: kind.probe_url.clone(),
                    auth: kind.auth.clone(),
                    timeout: kind.http_timeout,
                })
            } else {
                Arc::new(record_only::RecordOnly)
            };
            let indexer: Option<Arc<dyn Indexer>> = if let Some(ix) = &kind.indexnow {
                Some(Arc::new(indexnow::IndexNow {
                    client: http.client_for(&kind.auth),
                    config: ix.clone(),
                    timeout: kind.http_timeout,
                }))
            } else {
                kind.index_url.as_ref().map(|url| {
                    Arc::new(webhook::WebhookIndexer {
                        http: http.clone(),
                        index_url: url.clone(),
                        auth: kind.auth.clone(),
                        timeout: kind.http_timeout,
                    }) as Arc<dyn Indexer>
                })
            };
            routes.insert(kind.name.clone(), Route { receiver, indexer });
        }
        // Only kinds whose drafts live at their CMS have a mirror to wait for.
        let mirrored = routes
            .iter()
            .filter(|(_, r)| r.receiver.mirrors_drafts().is_some())
            .map(|(k, _)| (k.clone(), tokio::sync::watch::channel(true).0))
            .collect();
        Self {
            routes: Arc::new(routes),
            mirrored: Arc::new(mirrored),
            gate_may_forget: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        }
    }

    /// Whether a fresh claim is looked up before its first send (see
    /// [`Call::gate_may_forget`]). True from the start: until Postgres has
    /// been seen with a synchronous standby, a lost gate row cannot be ruled
    /// out.
    pub fn gate_may_forget(&self) -> bool {
        self.gate_may_forget
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Records what the worker last saw of Postgres: `false` only while its
    /// commits wait for a synchronous standby.
    pub fn set_gate_may_forget(&self, may: bool) {
        self.gate_may_forget
            .store(may, std::sync::atomic::Ordering::SeqCst);
    }

    /// The kinds whose drafts live at their CMS, with how often each is
    /// mirrored.
    pub fn mirrored_kinds(&self) -> Vec<(String, std::time::Duration)> {
        let mut v: Vec<_> = self
            .routes
            .iter()
            .filter_map(|(k, r)| Some((k.clone(), r.receiver.mirrors_drafts()?)))
            .collect();
        v.sort();
        v
    }

    /// Marks `kind`'s mirror as not yet read by this process: its
    /// deliveries wait for [`Receivers::mirror_done`] (the background
    /// refresh calls both, so a worker that just started does not gate on a
    /// mirror older than itself).
    pub fn mirror_pending(&self, kind: &str) {
        if let Some(tx) = self.mirrored.get(kind) {
            tx.send_replace(false);
        }
    }

    /// `kind`'s first refresh in this process has ended (well or not).
    pub fn mirror_done(&self, kind: &str) {
        if let Some(tx) = self.mirrored.get(kind) {
            tx.send_replace(true);
        }
    }

    /// Whether `kind`'s deliveries may gate now (its first refresh ended,
    /// or nobody refreshes it); the batch leaves the others to the single
    /// path, so no kind in a batch waits for another kind's CMS.
    pub fn mirror_ready(&self, kind: &str) -> bool {
        self.mirrored.get(kind).is_none_or(|tx| *tx.borrow())
    }

    /// Waits until [`Receivers::mirror_ready`] for `kind`: only a delivery
    /// of that kind waits, and only for the first refresh after start.
    pub async fn await_mirror(&self, kind: &str) {
        if let Some(tx) = self.mirrored.get(kind) {
            let mut rx = tx.subscribe();
            let _ = rx.wait_for(|done| *done).await;
        }
    }

    /// The route of a configured kind (`None` for a kind the config does
    /// not name, which validation has dead-lettered before any call).
    pub fn route(&self, kind: &str) -> Option<&Route> {
        self.routes.get(kind)
    }

    /// [`Receiver::check`] of every kind: `(kind, what is wrong)` for each
    /// that fails, by kind name. `planner check` exits non-zero on any; the
    /// worker logs them at start.
    pub async fn check(&self) -> Vec<(String, String)> {
        let mut kinds: Vec<&String> = self.routes.keys().collect();
        kinds.sort();
        let mut problems = Vec::new();
        for kind in kinds {
            if let Err(e) = self.routes[kind].receiver.check().await {
                problems.push((kind.clone(), e));
            }
        }
        problems
    }
}

/// Sleeps the policy's backoff before try `attempt + 1`.
pub(crate) async fn back_off(policy: RetryPolicy, rng: &mut StdRng, attempt: u32) {
    tokio::time::sleep(policy.delay(rng, attempt.saturating_sub(1))).await;
}

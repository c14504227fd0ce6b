//! Deliberately broken worker paths — TEST ONLY.
//!
//! The chaos suite's judge must be able to fail: `chaos --sabotage NAME`
//! starts its workers as `chaos-worker --sabotage NAME` (this crate's
//! second binary: the production worker's code with a [`Saboteur`]
//! installed), and each [`Sabotage`] breaks exactly one rule of the gate,
//! once per process, so the run must end with the matching violation. The
//! production `worker` binary does not link this module and has no such
//! flag. A [`Saboteur`] is installed as the executor's [`DeliveryHooks`]:
//! the executor asks its hooks, never this module, so the rules themselves
//! stay in their one place and the production path knows no sabotage.

#![warn(missing_docs, unreachable_pub)]
// The spawned `Executor::handle` future nests the Redis Cluster client's
// futures past the default layout depth (as in the worker crate).
#![recursion_limit = "256"]

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use serde_json::json;
use slotgate::config::KindConfig;
use slotgate::executor::{DeliveryHooks, Executor, Hooks};
use slotgate::outcome::SlotState;
use slotgate::queue::Delivery;
use slotgate::receiver::{Effect, Published};
use slotgate::slot::{day_schedule, SlotKey};
use slotgate::store::{self, ExecutionRecord, SlotRow, StoreError};
use sqlx::PgConnection;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One broken path, and the violation the chaos judge must report for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sabotage {
    /// After a successful publish, publishes the same draft again under a
    /// second key (`<slot>#again`): the judge's `doubled`.
    DoublePublish,
    /// After a successful publish, calls the CMS again under the same key:
    /// a second applied call no fault explains, the judge's `replayed`.
    Replay,
    /// Records a webhook slot published without calling the CMS: `phantom`.
    Phantom,
    /// Runs a later slot of the same kind at once, before it is due: `early`.
    Early,
    /// A duplicate delivery of a finished record-only slot is not stopped by
    /// the gate row: it binds a second draft to the slot. The record-only
    /// judge's `draft_bound_twice`.
    SkipGate,
}

impl Sabotage {
    /// Every sabotage, so `--sabotage` can list the names it accepts.
    pub const ALL: [Sabotage; 5] = [
        Sabotage::DoublePublish,
        Sabotage::Replay,
        Sabotage::Phantom,
        Sabotage::Early,
        Sabotage::SkipGate,
    ];

    /// The `--sabotage` value that selects it, also logged when it fires.
    pub fn name(self) -> &'static str {
        match self {
            Sabotage::DoublePublish => "double-publish",
            Sabotage::Replay => "replay",
            Sabotage::Phantom => "phantom",
            Sabotage::Early => "early",
            Sabotage::SkipGate => "skip-gate",
        }
    }
}

impl std::str::FromStr for Sabotage {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Sabotage::ALL
            .into_iter()
            .find(|x| x.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Sabotage::ALL.iter().map(|x| x.name()).collect();
                format!(
                    "unknown sabotage {s:?} (expected one of {})",
                    names.join(", ")
                )
            })
    }
}

/// One armed [`Sabotage`], installed as the executor's
/// [`DeliveryHooks`]; it fires once per process.
pub struct Saboteur {
    armed: Sabotage,
    fired: AtomicBool,
}

impl Saboteur {
    /// Turns `s` on for this process's executor (`chaos-worker
    /// --sabotage`), logged at ERROR.
    pub fn arm(s: Sabotage) -> Hooks {
        tracing::error!(
            sabotage = s.name(),
            "SABOTAGE ARMED: this worker breaks the exactly-once rules on purpose (chaos self-test only; never in production)"
        );
        Hooks::new(Arc::new(Saboteur {
            armed: s,
            fired: AtomicBool::new(false),
        }))
    }

    /// Whether `s` is armed and has not fired yet; claims the one firing.
    fn fire(&self, s: Sabotage, key: &str) -> bool {
        let f = self.armed == s && !self.fired.swap(true, Ordering::SeqCst);
        if f {
            tracing::error!(sabotage = s.name(), slot = key, "SABOTAGE fired");
        }
        f
    }
}

impl DeliveryHooks for Saboteur {
    /// [`Sabotage::Early`]: the delivery it started claims the operator's
    /// grant for itself: the rule the sabotage breaks is the worker's
    /// "never before its time", not the request check in front of it.
    fn forges_grant(&self, d: &Delivery) -> bool {
        self.armed == Sabotage::Early && d.entry_id.starts_with(EARLY_ENTRY)
    }

    /// [`Sabotage::Early`]: on the first delivery, runs the first slot of
    /// the same kind and day that is due more than 5 s from now, at once.
    fn before_gate(&self, exec: &Executor, key: &SlotKey, kind: &KindConfig, now: DateTime<Utc>) {
        if self.armed != Sabotage::Early || self.fired.load(Ordering::SeqCst) {
            return;
        }
        let later = day_schedule(kind, key.day, &exec.config.jitter_seed)
            .into_iter()
            .filter(|p| p.key.slot_no != key.slot_no)
            .find(|p| p.due_at > now + chrono::Duration::seconds(5));
        let Some(no) = later.map(|p| p.key.slot_no) else {
            return;
        };
        let early = SlotKey::new(key.kind.clone(), key.day, no);
        if !self.fire(Sabotage::Early, &early.to_string()) {
            return;
        }
        let d = Delivery::synthetic(
            format!("{EARLY_ENTRY}{early}"),
            &early.to_string(),
            "manual",
        );
        let exec = exec.clone();
        tokio::spawn(async move {
            let _ = exec.handle(&d).await;
        });
    }

    /// [`Sabotage::SkipGate`]: a duplicate of a published record-only slot
    /// binds a fresh draft to the existing row instead of being blocked;
    /// the caller commits and reports it published.
    fn settle_duplicate<'a>(
        &'a self,
        conn: &'a mut PgConnection,
        row: &'a SlotRow,
        kind: &'a KindConfig,
        now: DateTime<Utc>,
        record: &'a (dyn Fn() -> ExecutionRecord + Send + Sync),
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            if !kind.record_only()
                || row.state != SlotState::Published
                || self.armed != Sabotage::SkipGate
                || self.fired.load(Ordering::SeqCst)
            {
                return Ok(false);
            }
            let key = row.key().to_string();
            let Some((post_id, url)) = store::claim_draft(conn, &row.kind, now, &key, true).await?
            else {
                return Ok(false);
            };
            if !self.fire(Sabotage::SkipGate, &key) {
                return Ok(false);
            }
            let response = json!({"url": url, "record_only": true, "sabotage": "skip-gate"});
            store::set_slot_draft(
                conn,
                row.id,
                post_id,
                SlotState::Published,
                Some(&response),
                now,
            )
            .await?;
            store::insert_execution(conn, &record()).await?;
            Ok(true)
        })
    }

    /// [`Sabotage::Phantom`]: the publish skips the CMS call and pretends
    /// it published.
    fn instead_of_call(&self, key: &str) -> Option<Effect> {
        if !self.fire(Sabotage::Phantom, key) {
            return None;
        }
        let url = format!("https://phantom.invalid/{key}");
        Some(Effect::Published(Published {
            response: json!({"url": url, "sabotage": "phantom"}),
            url,
            attempts: 0,
            found: false,
            noted: None,
        }))
    }

    /// [`Sabotage::DoublePublish`] and [`Sabotage::Replay`]: after a
    /// successful publish under `key`, the key to send the same body under
    /// again — a second key, or the same one.
    fn send_again(&self, key: &str, ok: bool) -> Option<String> {
        if !ok {
            return None;
        }
        if self.fire(Sabotage::DoublePublish, key) {
            Some(format!("{key}#again"))
        } else if self.fire(Sabotage::Replay, key) {
            Some(key.to_owned())
        } else {
            None
        }
    }
}

/// The entry id prefix of the [`Sabotage::Early`] delivery.
const EARLY_ENTRY: &str = "sabotage-early-";

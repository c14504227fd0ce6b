//! Deliberately broken worker paths — TEST ONLY.
//!
//! The chaos suite's judge must be able to fail: `chaos --sabotage NAME`
//! starts its workers with the hidden `worker --sabotage NAME` flag, and each
//! [`Sabotage`] breaks exactly one rule of the gate, once per process, so the
//! run must end with the matching violation. Nothing here runs unless that
//! flag was given; the worker logs it at ERROR when it starts. The hooks in
//! [`crate::executor`] are one line each, so the rules themselves stay in
//! their one place.

use crate::config::KindConfig;
use crate::executor::Executor;
use crate::queue::Delivery;
use crate::slot::{day_schedule, SlotKey};
use crate::store::{self, ExecutionRecord, SlotRow, SlotState, StoreError};
use chrono::{DateTime, Utc};
use serde_json::json;
use sqlx::PgConnection;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

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

static ACTIVE: OnceLock<Sabotage> = OnceLock::new();
static FIRED: AtomicBool = AtomicBool::new(false);

/// Turns `s` on for this process (the worker's hidden `--sabotage`).
pub fn arm(s: Sabotage) {
    if ACTIVE.set(s).is_ok() {
        tracing::error!(
            sabotage = s.name(),
            "SABOTAGE ARMED: this worker breaks the exactly-once rules on purpose (chaos self-test only; never in production)"
        );
    }
}

/// Whether `s` is armed and has not fired yet; claims the one firing.
fn fire(s: Sabotage) -> bool {
    ACTIVE.get() == Some(&s) && !FIRED.swap(true, Ordering::SeqCst)
}

fn fired(s: Sabotage, key: &str) {
    tracing::error!(sabotage = s.name(), slot = key, "SABOTAGE fired");
}

/// [`Sabotage::Phantom`]: whether this publish skips the CMS call (claims
/// the one firing).
pub fn phantom(key: &str) -> bool {
    let f = fire(Sabotage::Phantom);
    if f {
        fired(Sabotage::Phantom, key);
    }
    f
}

/// The answer a publish that never called the CMS pretends to have had.
pub fn phantom_answer(key: &str) -> crate::receiver::Effect {
    let url = format!("https://phantom.invalid/{key}");
    crate::receiver::Effect::Published(crate::receiver::Published {
        response: json!({"url": url, "sabotage": "phantom"}),
        url,
        attempts: 0,
        found: false,
    })
}

/// [`Sabotage::DoublePublish`] and [`Sabotage::Replay`]: after a
/// successful publish under `key`, the key to send the same body under
/// again — a second key, or the same one.
pub fn send_again(key: &str, ok: bool) -> Option<String> {
    if !ok {
        return None;
    }
    let again = if fire(Sabotage::DoublePublish) {
        format!("{key}#again")
    } else if fire(Sabotage::Replay) {
        key.to_owned()
    } else {
        return None;
    };
    fired(*ACTIVE.get().expect("armed"), key);
    Some(again)
}

/// [`Sabotage::Early`]: on the first delivery, runs the first slot of the
/// same kind and day that is due more than 5 s from now, at once.
pub fn early(exec: &Executor, key: &SlotKey, kind: &KindConfig, now: DateTime<Utc>) {
    if ACTIVE.get() != Some(&Sabotage::Early) || FIRED.load(Ordering::SeqCst) {
        return;
    }
    let later = day_schedule(kind, key.day, &exec.config.jitter_seed)
        .into_iter()
        .filter(|p| p.key.slot_no != key.slot_no)
        .find(|p| p.due_at > now + chrono::Duration::seconds(5));
    let Some(no) = later.map(|p| p.key.slot_no) else {
        return;
    };
    if !fire(Sabotage::Early) {
        return;
    }
    let early = SlotKey::new(key.kind.clone(), key.day, no);
    fired(Sabotage::Early, &early.to_string());
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

/// Whether `d` is the [`Sabotage::Early`] delivery, which claims the
/// operator's grant for itself: the rule the sabotage breaks is the
/// worker's "never before its time", not the request check in front of it.
pub fn forges_grant(d: &Delivery) -> bool {
    ACTIVE.get() == Some(&Sabotage::Early) && d.entry_id.starts_with(EARLY_ENTRY)
}

/// The entry id prefix of the [`Sabotage::Early`] delivery.
const EARLY_ENTRY: &str = "sabotage-early-";

/// [`Sabotage::SkipGate`]: a duplicate of a published record-only slot
/// binds a fresh draft to the existing row instead of being blocked; the
/// caller commits and reports it published. `Ok(None)`: not sabotaged.
pub async fn skip_gate(
    conn: &mut PgConnection,
    row: &SlotRow,
    kind: &KindConfig,
    now: DateTime<Utc>,
    record: impl FnOnce() -> ExecutionRecord,
) -> Result<Option<()>, StoreError> {
    if !kind.record_only() || row.state != SlotState::Published || !fire(Sabotage::SkipGate) {
        return Ok(None);
    }
    let key = row.key().to_string();
    let Some((post_id, url)) = store::claim_draft(conn, &row.kind, now, &key, true).await? else {
        return Ok(None);
    };
    fired(Sabotage::SkipGate, &key);
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
    Ok(Some(()))
}

//! The points where a test build may bend one delivery's path, behind one
//! trait the executor holds and production leaves empty.
//!
//! The chaos suite's judge must be shown to fail, so its self-test runs
//! workers that break one exactly-once rule on purpose (the chaos crate's
//! `chaos-worker` and its `Saboteur`). Those breakages used to be calls from the
//! executor into the sabotage module, which made the two depend on each
//! other and put test code on every delivery's path. Now the executor only
//! knows this trait: each method is a question asked at one step ("may
//! this delivery claim a grant nobody gave?", "call the CMS, or pretend
//! to?"), every default is the production answer, and whoever builds the
//! executor decides what is installed ([`crate::worker::WorkerOptions::hooks`];
//! the `worker` binary installs nothing and has no flag that would).

use super::Executor;
use crate::config::KindConfig;
use crate::queue::Delivery;
use crate::receiver::Effect;
use crate::slot::SlotKey;
use crate::store::{ExecutionRecord, SlotRow, StoreError};
use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use sqlx::PgConnection;
use std::sync::Arc;

/// The questions a delivery's steps ask; every default is production's
/// answer (nothing bent).
pub trait DeliveryHooks: Send + Sync {
    /// Validate: may `d` claim an operator's exemption no request in
    /// Postgres grants? Production: never.
    fn forges_grant(&self, _d: &Delivery) -> bool {
        false
    }

    /// Before the gate of `key` (`now`: when its handling started): a
    /// hook may start other deliveries on `exec`. Production: nothing.
    fn before_gate(
        &self,
        _exec: &Executor,
        _key: &SlotKey,
        _kind: &KindConfig,
        _now: DateTime<Utc>,
    ) {
    }

    /// Gate, a duplicate of a finished slot: instead of `slot_taken`, a
    /// hook may settle it itself inside the gate's transaction (`Ok(true)`:
    /// it did, and wrote `record()`). Production: `Ok(false)`.
    fn settle_duplicate<'a>(
        &'a self,
        _conn: &'a mut PgConnection,
        _row: &'a SlotRow,
        _kind: &'a KindConfig,
        _now: DateTime<Utc>,
        _record: &'a (dyn Fn() -> ExecutionRecord + Send + Sync),
    ) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async { Ok(false) })
    }

    /// Publish: an effect to report *instead of* calling the CMS under
    /// `key`. Production: `None` (call it).
    fn instead_of_call(&self, _key: &str) -> Option<Effect> {
        None
    }

    /// Publish, after a call under `key` (`ok`: it published): a key to
    /// send the same body under again. Production: `None`.
    fn send_again(&self, _key: &str, _ok: bool) -> Option<String> {
        None
    }
}

/// The production answers: nothing bent.
struct Straight;

impl DeliveryHooks for Straight {}

/// The hooks an executor holds; by default none (every answer production's).
#[derive(Clone)]
pub struct Hooks(Arc<dyn DeliveryHooks>);

impl Hooks {
    /// Installs `hooks` (the chaos self-test's sabotage).
    pub fn new(hooks: Arc<dyn DeliveryHooks>) -> Hooks {
        Hooks(hooks)
    }
}

impl Default for Hooks {
    fn default() -> Hooks {
        Hooks(Arc::new(Straight))
    }
}

impl std::ops::Deref for Hooks {
    type Target = dyn DeliveryHooks;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hooks")
    }
}

//! A claimed slot's external calls: the kind's receiver publishes (reading
//! before it writes where it can), then its indexer pushes; what they
//! produced is recorded by [`finish`](super::finish).

use super::finish::Produced;
use super::{Claim, Ctx, ExecError, Executor};
use crate::config::KindConfig;
use crate::outcome::Outcome;
use crate::receiver::{Call, DraftText, Effect};
use crate::retry::RetryPolicy;
use crate::slot::PlannedSlot;
use crate::store::{self, StoreError};
use serde_json::{json, Value};

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
            cms_id: draft.cms_id,
        };
        // The heartbeat keeps the claim and the stream entry alive while the
        // calls run and until their outcome is stored.
        let heartbeat = self.heartbeat(&[(&claim, c.d.entry())]);
        let (effect, detail) = self.calls(c, planned, &claim, &draft, resumed).await;
        let effect = Produced { effect, detail };
        let outcome = self
            .store_outcome(&c.key.to_string(), || {
                self.finish(c, planned, &claim, &effect, heartbeat.lost(0))
            })
            .await;
        heartbeat.stop().await;
        Ok(outcome)
    }

    /// The external calls for a claimed slot: the kind's receiver, then
    /// its indexer. Records nothing; the caller keeps the claim's heartbeat
    /// running around it.
    pub(super) async fn calls(
        &self,
        c: &Ctx<'_>,
        planned: &PlannedSlot,
        claim: &Claim,
        draft: &DraftText,
        resumed: bool,
    ) -> (Effect, serde_json::Map<String, Value>) {
        let key_s = c.key.to_string();
        let mut rng = self.entropy.rng();
        let mut detail = serde_json::Map::new();
        if resumed {
            detail.insert("resumed".into(), json!(true));
            detail.insert("attempt".into(), json!(claim.attempt));
        }
        let route = self
            .receivers
            .route(&c.key.kind)
            .expect("a validated delivery names a configured kind");
        let mut call = Call {
            slot: &c.key,
            planned,
            draft,
            idempotency_key: key_s.clone(),
            resumed,
            gate_may_forget: self.receivers.gate_may_forget(),
            now: self.clock.now(),
            policy: self.policy(c.kind),
        };
        // A test build's hooks (sabotage) may pretend the call, or send it
        // again; production calls once.
        let pretended = (!c.kind.record_only())
            .then(|| self.hooks.instead_of_call(&key_s))
            .flatten();
        let effect = if let Some(effect) = pretended {
            effect
        } else {
            loop {
                let effect = route.receiver.publish(&call, &mut rng).await;
                let ok = matches!(effect, Effect::Published(_));
                match self.hooks.send_again(&key_s, ok) {
                    Some(again) => call.idempotency_key = again,
                    None => break effect,
                }
            }
        };
        // Index push: its failure never undoes the publish.
        if let (Effect::Published(p), Some(indexer)) = (&effect, &route.indexer) {
            if let Err(e) = indexer.push(&call, &p.url, &mut rng).await {
                tracing::warn!(slot = %c.key, error = %e, "index push failed; the slot stays published");
                detail.insert("index_error".into(), e);
            }
        }
        (effect, detail)
    }
}

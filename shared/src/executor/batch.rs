//! Many deliveries through the one gate at once (a backlog): one gate
//! transaction, the webhook calls concurrent, one transaction for their
//! outcomes, one acknowledgement.

use super::heartbeat::Heartbeat;
use super::publish::DraftText;
use super::validate::{ahead_of_time, asks_early};
use super::{Claim, Ctx, ExecError, Executor, MAX_DELIVERIES};
use crate::outcome::Outcome;
use crate::queue::Delivery;
use crate::slot::PlannedSlot;
use crate::store;

impl Executor {
    /// Whether `d` may go through [`Executor::batch`]: a valid delivery
    /// under the delivery limit. Anything else (malformed, poisoned) needs
    /// the one-delivery path, which dead-letters it.
    pub fn batchable(&self, d: &Delivery) -> bool {
        self.batch_kind(d).is_some()
    }

    /// For a [`batchable`](Executor::batchable) delivery, its kind and
    /// whether that kind is record-only (its whole effect is then the gate
    /// transaction, so the worker's intake keeps the deliveries of one such
    /// kind together in one batch); `None` for any other. One validation
    /// answers both, so intake asks this once per delivery.
    pub fn batch_kind(&self, d: &Delivery) -> Option<(String, bool)> {
        if d.deliveries > MAX_DELIVERIES {
            return None;
        }
        let (key, kind) = self.validate(d).ok()?;
        Some((key.kind, kind.publish_url.is_none()))
    }

    /// The batch path: takes the plain deliveries of `ds` (all
    /// [`Executor::batchable`]) through the gate ([`store::gate_batch`]) in
    /// one transaction; record-only slots are settled there, webhook slots
    /// are claimed, published concurrently and recorded together in a
    /// second one ([`store::finish_batch`]). Then everything it decided is acknowledged at once.
    /// Returns the indexes into `ds` it decided; the others were left
    /// untouched and go through [`Executor::handle`].
    ///
    /// On `Err` the caller runs *every* delivery through `handle`: one whose
    /// outcome committed is found by its entry id (`Gate::Handled`). An
    /// `Err` never comes after a webhook call: once the calls are made,
    /// their outcomes are stored in place until they commit. A claim whose
    /// commit was in doubt (the gate's answer lost) is this worker's own
    /// open claim, which `handle` resumes at once under the same key; the
    /// CMS has not been called for it yet.
    pub async fn batch(&self, ds: &[Delivery]) -> Result<Vec<usize>, ExecError> {
        let started_at = self.clock.now();
        // Slots held until this returns; one held elsewhere in this process
        // is left out (its delivery goes through `handle`, which waits).
        let mut held = Vec::with_capacity(ds.len());
        let now = self.clock.now();
        // Each delivery validated once, here (intake checked it could be).
        let valid: Vec<(usize, Ctx<'_>)> = ds
            .iter()
            .enumerate()
            .filter_map(|(i, d)| {
                let (key, kind) = self.validate(d).ok()?;
                Some((
                    i,
                    Ctx {
                        d,
                        key,
                        kind,
                        started_at,
                    },
                ))
            })
            .collect();
        // A slot not yet due is left to `handle`, which records `not_due`,
        // and so is one of a paused kind (recorded skipped/paused); one read
        // answers both. (A slot nobody planned is left to it by the gate.)
        let mut not_yet = std::collections::HashSet::new();
        let mut paused = std::collections::HashSet::new();
        for (p, kind_paused) in self
            .deadline(crate::pause::planned_and_paused_many(
                &self.pool,
                valid.iter().map(|(_, c)| &c.key),
                started_at,
            ))
            .await?
        {
            if ahead_of_time(p.due_at, now).is_some() {
                not_yet.insert(p.key.clone());
            }
            if kind_paused {
                paused.insert(p.key);
            }
        }
        let mut items: Vec<(usize, store::BatchSlot)> = valid
            .into_iter()
            .filter_map(|(i, c)| {
                if not_yet.contains(&c.key) && !asks_early(c.d) {
                    return None;
                }
                if paused.contains(&c.key) {
                    return None;
                }
                held.push(self.in_flight.try_hold(&c.key)?);
                Some((i, c.batch_slot()))
            })
            .collect();
        // The gate's lock order (see `store::gate_batch`).
        items.sort_by(|a, b| {
            (&a.1.key.kind, a.1.key.day, a.1.key.slot_no).cmp(&(
                &b.1.key.kind,
                b.1.key.day,
                b.1.key.slot_no,
            ))
        });
        let (index, slots): (Vec<usize>, Vec<store::BatchSlot>) = items.into_iter().unzip();
        let Some(rows) = self
            .deadline(self.gate_slots(&slots, now, store::DraftPick::SkipLocked))
            .await?
        else {
            tracing::debug!(
                deliveries = ds.len(),
                "a daily cap cannot cover the whole batch; deciding its slots one at a time"
            );
            return Ok(Vec::new());
        };
        let rows = rows.claims;
        for r in &rows {
            crate::telemetry::lag(&slots[r.idx as usize].key.kind, started_at - r.due_at);
        }
        let (settled, claimed): (Vec<_>, Vec<_>) = rows.into_iter().partition(|r| r.settled);
        let recorded = self.publish_claimed(ds, &index, &slots, claimed).await?;
        let entries: Vec<&str> = settled
            .iter()
            .map(|r| slots[r.idx as usize].entry_id.as_str())
            .chain(recorded.iter().map(|(i, _)| slots[*i].entry_id.as_str()))
            .collect();
        self.queue.ack_all(&entries).await?;
        let mut done = Vec::with_capacity(entries.len());
        for r in &settled {
            let b = &slots[r.idx as usize];
            crate::telemetry::execution(&b.key.kind, "published", None);
            let lag_ms = (started_at - r.due_at).num_milliseconds();
            tracing::info!(slot = %b.key, caller = %b.caller, draft = r.post_id, lag_ms, "published (record-only, batched)");
            done.push(index[r.idx as usize]);
        }
        for (i, o) in &recorded {
            crate::telemetry::execution(&slots[*i].key.kind, o.as_str(), o.reason());
            done.push(index[*i]);
        }
        Ok(done)
    }

    /// Publishes the webhook slots a batch claimed, all at once, and records
    /// their outcomes in one statement. Returns (slot index, outcome).
    pub(super) async fn publish_claimed(
        &self,
        ds: &[Delivery],
        index: &[usize],
        slots: &[store::BatchSlot],
        claimed: Vec<store::BatchClaim>,
    ) -> Result<Vec<(usize, Outcome)>, ExecError> {
        if claimed.is_empty() {
            return Ok(Vec::new());
        }
        let work: Vec<(Ctx<'_>, PlannedSlot, Claim, DraftText, usize)> = claimed
            .into_iter()
            .map(|r| {
                let b = &slots[r.idx as usize];
                let kind = self.config.kind(&b.key.kind).expect("validated kind");
                let planned = PlannedSlot {
                    key: b.key.clone(),
                    nominal_at: r.nominal_at,
                    due_at: r.due_at,
                    jitter_ms: (r.due_at - r.nominal_at).num_milliseconds(),
                };
                let c = Ctx {
                    d: &ds[index[r.idx as usize]],
                    key: b.key.clone(),
                    kind,
                    started_at: b.started_at,
                };
                let claim = Claim {
                    row_id: r.gate_id,
                    attempt: 1,
                    post_id: r.post_id,
                };
                let draft = DraftText {
                    id: r.post_id,
                    title: r.title,
                    body: r.body,
                };
                (c, planned, claim, draft, r.idx as usize)
            })
            .collect();
        // Every claim keeps its heartbeat until the batch's outcomes are
        // committed, not just until its own call returned: the batch waits
        // for its slowest call, and a finished slot's claim must not lapse
        // meanwhile. (Dropped on an early return, they stop by themselves.)
        let heartbeats: Vec<Heartbeat> = work
            .iter()
            .map(|(c, _, claim, _, _)| self.heartbeat(claim, &c.d.entry_id))
            .collect();
        let effects = futures_util::future::join_all(
            work.iter()
                .map(|(c, planned, claim, draft, _)| self.calls(c, planned, claim, draft, false)),
        )
        .await;
        let (rows, outcomes): (Vec<store::BatchFinish>, Vec<Outcome>) = work
            .iter()
            .zip(effects)
            .zip(&heartbeats)
            .map(|(((c, planned, claim, _, _), (publish, detail)), hb)| {
                self.finish_row(c, planned, claim, &publish, detail, &hb.lost)
            })
            .unzip();
        // The calls are made: from here on the outcomes are stored, retried
        // in place until they are, never by calling again.
        let now = self.clock.now();
        let finished = self
            .store_outcome("batch", || {
                store::finish_batch(&self.pool, &rows, &self.worker_id, now)
            })
            .await;
        for hb in heartbeats {
            hb.stop().await;
        }
        let mut out = Vec::with_capacity(finished.len());
        for (i, f) in finished.into_iter().enumerate() {
            let (c, planned, claim, _, si) = &work[i];
            out.push((
                *si,
                self.finished(c, planned, claim, outcomes[i], &rows[i], f),
            ));
        }
        Ok(out)
    }
}

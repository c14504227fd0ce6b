//! Many deliveries through the one gate at once (a backlog): one gate
//! transaction, the webhook calls concurrent, one transaction for their
//! outcomes, one acknowledgement.

use super::validate::{ahead_of_time, Exemption};
use super::{Claim, Ctx, ExecError, Executor, MAX_DELIVERIES};
use crate::outcome::Outcome;
use crate::queue::{Delivery, EntryRef};
use crate::receiver::DraftText;
use crate::slot::PlannedSlot;
use crate::store;

impl Executor {
    /// Whether `d` may go through [`Executor::batch`]: a valid delivery
    /// under the delivery limit. Anything else (malformed, poisoned) needs
    /// the one-delivery path, which dead-letters it.
    pub fn batchable(&self, d: &Delivery) -> bool {
        self.batch_kind(d).is_some()
    }

    /// For a [`batchable`](Executor::batchable) delivery, whether its kind
    /// is record-only (its whole effect is then the gate transaction, so
    /// it takes no call permit); `None` for any other. One validation
    /// answers both, so intake asks this once per delivery.
    pub fn batch_kind(&self, d: &Delivery) -> Option<bool> {
        if d.deliveries > MAX_DELIVERIES {
            return None;
        }
        let (_, kind) = self.validate(d).ok()?;
        Some(kind.record_only())
    }

    /// The batch path: takes the plain deliveries of `ds` (all
    /// [`Executor::batchable`]) through the gate ([`store::gate_batch`]) in
    /// one transaction; record-only slots are settled there, webhook slots
    /// are claimed, published concurrently and recorded together in a
    /// second one ([`store::finish_batch`]). Every delivery it decided is
    /// acknowledged once its outcome is committed.
    /// Returns the indexes into `ds` it decided; the others were left
    /// untouched and go through [`Executor::handle`].
    ///
    /// On `Err` the caller runs *every* delivery through `handle`: one whose
    /// outcome committed is found by its entry id (`Gate::Handled`). An
    /// `Err` never comes after the gate committed: from there on an outcome
    /// that could not be acknowledged is simply not reported as decided,
    /// and `handle` finds it recorded. A claim whose commit was in doubt
    /// (the gate's answer lost) is this worker's own open claim, which
    /// `handle` resumes at once under the same key; the CMS has not been
    /// called for it yet.
    pub async fn batch(&self, ds: &[Delivery]) -> Result<Vec<usize>, ExecError> {
        self.batch_chunked(ds, Vec::<()>::new()).await
    }

    /// [`Executor::batch`] with the webhook slots it claims published in
    /// `extra.len() + 1` chunks side by side, each recorded in its own
    /// [`store::finish_batch`] and acknowledged as soon as its own calls
    /// have returned; each token of `extra` is dropped when its chunk is
    /// done (the worker passes the permits of `--concurrency` it holds
    /// beyond its first, so the next gate can start while slow calls of
    /// this one are still running).
    ///
    /// Why one gate for many chunks: every gate transaction takes its
    /// kinds' quota rows last and holds them through its commit, so gate
    /// transactions of one kind run one after another. With a burst handed
    /// out kind by kind, sixteen gate transactions of 32 webhook slots
    /// queued on one quota row (a 2-worker webhook burst spent 30 ms per
    /// quota take waiting, more than all its statements took); one gate
    /// for the kind's slots of a read, its calls in chunks, took the quota
    /// take from 30.6 ms per call to under 6.2 ms and a 10,000-slot burst
    /// from 4,756 to 5,798 slots/s (medians of 3, docs/BENCHMARKS.md).
    pub async fn batch_chunked<T: Send>(
        &self,
        ds: &[Delivery],
        extra: Vec<T>,
    ) -> Result<Vec<usize>, ExecError> {
        let started_at = self.clock.now();
        // Slots held until this returns; one held elsewhere in this process
        // is left out (its delivery goes through `handle`, which waits).
        let mut held = Vec::with_capacity(ds.len());
        let now = self.clock.now();
        // Each delivery validated once, here (intake checked it could be).
        let mut valid: Vec<(usize, Ctx<'_>)> = ds
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
                        exempt: Default::default(),
                    },
                ))
            })
            .collect();
        // One read per delivery that claims an exemption (rare: operators'
        // commands); the planner's deliveries claim none.
        for (_, c) in &mut valid {
            c.exempt = self.exemption(c.d, &c.key).await?;
        }
        let kinds: Vec<&str> = valid.iter().map(|(_, c)| c.key.kind.as_str()).collect();
        self.refresh_drafts(&kinds).await;
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
                if not_yet.contains(&c.key) && !c.exempt.early {
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
        let mut done = Vec::with_capacity(settled.len() + claimed.len());
        // Record-only slots are finished: acknowledged before any call.
        let entries: Vec<EntryRef> = settled
            .iter()
            .map(|r| slots[r.idx as usize].entry())
            .collect();
        if self.acked(&entries).await {
            for r in &settled {
                let b = &slots[r.idx as usize];
                crate::telemetry::execution(&b.key.kind, "published", None);
                let lag_ms = (started_at - r.due_at).num_milliseconds();
                tracing::info!(slot = %b.key, caller = %b.caller, draft = r.post_id, lag_ms, "published (record-only, batched)");
                done.push(index[r.idx as usize]);
            }
        }
        // Contiguous chunks keep the (kind, day, slot) order of the gate.
        let size = claimed.len().div_ceil(extra.len() + 1).max(1);
        let mut chunks: Vec<Vec<store::BatchClaim>> = Vec::new();
        let mut claimed = claimed.into_iter().peekable();
        while claimed.peek().is_some() {
            chunks.push(claimed.by_ref().take(size).collect());
        }
        let mut tokens = extra.into_iter();
        let runs = chunks.into_iter().map(|chunk| {
            let token = tokens.next();
            let (index, slots) = (&index, &slots);
            async move {
                let recorded = self.publish_claimed(ds, index, slots, chunk).await;
                let entries: Vec<EntryRef> =
                    recorded.iter().map(|(i, _)| slots[*i].entry()).collect();
                let acked = self.acked(&entries).await;
                drop(token);
                let mut done = Vec::with_capacity(recorded.len());
                for (i, o) in &recorded {
                    crate::telemetry::execution(&slots[*i].key.kind, o.as_str(), o.reason());
                    if acked {
                        done.push(index[*i]);
                    }
                }
                done
            }
        });
        for chunk in futures_util::future::join_all(runs).await {
            done.extend(chunk);
        }
        Ok(done)
    }

    /// Acknowledges entries whose outcomes are committed. `false` when
    /// Redis failed: those deliveries are then not reported as decided,
    /// so the caller runs them through [`Executor::handle`], which finds
    /// each outcome by its entry id and acknowledges it again.
    async fn acked(&self, entries: &[EntryRef<'_>]) -> bool {
        match self.queue.ack_all(entries).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, entries = entries.len(), "acknowledging recorded outcomes failed; their deliveries are handled again and found recorded");
                false
            }
        }
    }

    /// Publishes the webhook slots a batch claimed, all at once, and records
    /// their outcomes in one transaction, retried in place until it commits.
    /// Returns (slot index, outcome).
    pub(super) async fn publish_claimed(
        &self,
        ds: &[Delivery],
        index: &[usize],
        slots: &[store::BatchSlot],
        claimed: Vec<store::BatchClaim>,
    ) -> Vec<(usize, Outcome)> {
        if claimed.is_empty() {
            return Vec::new();
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
                    exempt: Exemption {
                        deadline: b.exempt,
                        early: false,
                    },
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
                    cms_id: r.cms_id,
                };
                (c, planned, claim, draft, r.idx as usize)
            })
            .collect();
        // Every claim keeps its heartbeat until the batch's outcomes are
        // committed, not just until its own call returned: the batch waits
        // for its slowest call, and a finished slot's claim must not lapse
        // meanwhile. One heartbeat renews them all. (Dropped on an early
        // return, it stops by itself.)
        let heartbeat = self.heartbeat(
            &work
                .iter()
                .map(|(c, _, claim, _, _)| (claim, c.d.entry()))
                .collect::<Vec<_>>(),
        );
        let effects = futures_util::future::join_all(
            work.iter()
                .map(|(c, planned, claim, draft, _)| self.calls(c, planned, claim, draft, false)),
        )
        .await;
        let (rows, outcomes): (Vec<store::BatchFinish>, Vec<Outcome>) = work
            .iter()
            .zip(effects)
            .enumerate()
            .map(|(i, ((c, planned, claim, _, _), (effect, detail)))| {
                self.finish_row(c, planned, claim, &effect, detail, heartbeat.lost(i))
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
        heartbeat.stop().await;
        let mut out = Vec::with_capacity(finished.len());
        for (i, f) in finished.into_iter().enumerate() {
            let (c, planned, claim, _, si) = &work[i];
            out.push((
                *si,
                self.finished(c, planned, claim, outcomes[i], &rows[i], f),
            ));
        }
        out
    }
}

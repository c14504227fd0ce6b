//! The whole walk of a delivery, top to bottom: one flow for a delivery
//! alone ([`Executor::handle`], [`Reach::Whole`]) and for a batch
//! ([`Executor::batch`], [`Reach::Plain`]: only the plain case, the rest left
//! for walks alone) — a delivery is a batch of one. Each phase is a file,
//! entered once: [`prepare`] (validate, hold, exemption, mirror, plan read)
//! → [`record::dead_letter`] for what is not to be believed → [`gate`] →
//! what it decided acknowledged → [`call`] (receivers, heartbeat) →
//! [`record`] (fenced finish, acknowledgement), wave by wave as the calls
//! return.

use super::{call, gate, prepare, record, ExecError, Executor, Handled, Reach, MAX_DELIVERIES};
use crate::queue::Delivery;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::time::Duration;
use tokio::time::Instant;

/// How long the calls that have returned wait for more before they are
/// recorded together. It bounds the wait between a call's answer and its
/// record (plus one finish statement) whatever the walk's other calls do,
/// and lets calls answered within it share one finish.
pub const WAVE: Duration = Duration::from_millis(10);

/// How a batchable delivery goes through a batch ([`Executor::batch_kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batchable<'c> {
    /// A record-only slot: settled inside the gate, it calls no one and
    /// takes no call permit.
    RecordOnly,
    /// A slot whose kind (named) calls a CMS: it takes one of the kind's
    /// call permits.
    Calls(&'c str),
}

/// What a walk holds of its worker's bounds ([`Executor::batch_holding`]),
/// each part released as soon as the walk no longer needs it.
pub struct Permits<G, C> {
    /// Held through the gate and the acknowledgement of what it decided;
    /// released before any call.
    pub gate: Option<G>,
    /// By the index of the delivery it is for (`None`: a slot that makes
    /// no call); each is released when its slot's call returns, the others
    /// once the gate has decided which slots this walk calls for.
    pub calls: Vec<Option<C>>,
}

impl Permits<(), ()> {
    /// Nothing held: a walk bounded by its caller alone.
    pub fn none() -> Permits<(), ()> {
        Permits {
            gate: None,
            calls: Vec::new(),
        }
    }
}

impl Executor {
    /// Handles one delivery completely, acknowledging it at the end. An
    /// `Err` means nothing was acknowledged; the entry stays pending.
    #[tracing::instrument(name = "handle", skip_all, fields(slot = d.slot().unwrap_or(""), entry = %d.entry_id))]
    pub async fn handle(&self, d: &Delivery) -> Result<Handled, ExecError> {
        let walked = self.walk(std::slice::from_ref(d), Reach::Whole, Permits::none());
        let (_, handled) = walked
            .await?
            .pop()
            .expect("a walk alone decides its delivery");
        Ok(handled)
    }

    /// Whether `d` may go through [`Executor::batch`]; anything else needs a
    /// walk alone, which dead-letters it.
    pub fn batchable(&self, d: &Delivery) -> bool {
        self.batch_kind(d).is_some()
    }

    /// For a [`batchable`](Executor::batchable) delivery, how it goes
    /// through a batch (whether it calls, and whose call permit it takes);
    /// `None` for any other. The one look at its key intake needs.
    pub fn batch_kind(&self, d: &Delivery) -> Option<Batchable<'_>> {
        if d.deliveries > MAX_DELIVERIES {
            return None;
        }
        let (_, kind) = prepare::validate(&self.config, d).ok()?;
        Some(if kind.record_only() {
            Batchable::RecordOnly
        } else {
            Batchable::Calls(&kind.name)
        })
    }

    /// The walk of the plain deliveries of `ds` (all batchable): one gate
    /// transaction, the webhook calls concurrent, their outcomes recorded
    /// as they return. Returns the indexes into `ds` it decided and
    /// acknowledged; the others were left untouched and go through
    /// [`Executor::handle`]. On `Err` the caller retries *every* delivery
    /// (alone through `handle`, or as a batch again), and each retry finds
    /// what was committed by its entry id (`Gate::Handled`) or resumes its
    /// claim under the same key. The `Err` may come after the gate
    /// committed, but never while a call is open: a batch's outcomes are
    /// stored in place until they commit and its acknowledgements never
    /// fail (`record`), so the only `Err` after the gate is a claimed
    /// draft that could not be read, before any call (`call::start`).
    pub async fn batch(&self, ds: &[Delivery]) -> Result<Vec<usize>, ExecError> {
        self.batch_holding(ds, Permits::none()).await
    }

    /// [`Executor::batch`] holding `permits` (the worker's bounds) and
    /// releasing each part as soon as it may: the gate's when the gate is
    /// done, a call's when its call returns. So the next gate can start
    /// while calls of this one run, and a slow call holds one call permit,
    /// not those of the calls beside it.
    ///
    /// Why one gate for all of a read's slots: gate transactions of one
    /// kind queue on its quota row (DESIGN section 2, "Batches"; measured
    /// in docs/benchmarks-archive.md, "One gate per kind for webhook
    /// slots, calls in chunks").
    pub async fn batch_holding<G: Send, C: Send>(
        &self,
        ds: &[Delivery],
        permits: Permits<G, C>,
    ) -> Result<Vec<usize>, ExecError> {
        let walked = self.walk(ds, Reach::Plain, permits).await?;
        Ok(walked.into_iter().map(|(i, _)| i).collect())
    }

    /// The walk: prepare → gate → call → record, the first two once for
    /// all of `ds`, the last two as the calls return ([`WAVE`]). Returns
    /// the deliveries it decided, acknowledged.
    async fn walk<G: Send, C: Send>(
        &self,
        ds: &[Delivery],
        reach: Reach,
        permits: Permits<G, C>,
    ) -> Result<Vec<(usize, Handled)>, ExecError> {
        let started_at = self.clock.now();
        // The slots stay held (in `_held`) until the walk returns.
        let prepare::Prepared {
            ready,
            rejected,
            held: _held,
        } = prepare::prepare(self, ds, reach, started_at).await?;
        let mut done = Vec::with_capacity(ds.len());
        for (i, reason, detail) in rejected {
            let d = &ds[i];
            done.push((
                i,
                record::dead_letter(self, d, reason, detail, started_at).await?,
            ));
        }
        let gated = gate::gate(self, ready, reach).await?;
        // Settled in the gate: acknowledged before any call.
        done.extend(record::acknowledge(self, ds, gated.decided, reach).await?);
        drop(permits.gate);
        // Each claimed slot keeps its call permit; those of the slots the
        // gate decided go back now.
        let mut calls = permits.calls;
        let tokens = (gated.claimed.iter())
            .map(|cl| calls.get_mut(cl.i).and_then(Option::take))
            .collect();
        drop(calls);
        let (mut running, heartbeat) = call::start(self, gated.claimed, tokens).await?;
        // The calls that returned are recorded and acknowledged together
        // `WAVE` after the first of them, or at once when none is left
        // running; the waves' records run beside the calls still open.
        let mut recording = FuturesUnordered::new();
        let mut wave = Vec::new();
        let mut closes: Option<Instant> = None;
        while !running.is_empty() || !recording.is_empty() {
            tokio::select! {
                Some(called) = running.next(), if !running.is_empty() => {
                    wave.push(called);
                    closes.get_or_insert_with(|| Instant::now() + WAVE);
                }
                // Fails only for a walk alone (`Reach::Whole`: its one call
                // has returned); a batch's waves never do (`record`).
                Some(acked) = recording.next(), if !recording.is_empty() => done.extend(acked?),
                _ = tokio::time::sleep_until(closes.unwrap_or_else(Instant::now)), if closes.is_some() => {
                    closes = None;
                }
            }
            if !wave.is_empty() && (closes.is_none() || running.is_empty()) {
                let (wave, heartbeat) = (std::mem::take(&mut wave), &heartbeat);
                closes = None;
                recording.push(async move {
                    let recorded = record::record(self, wave, heartbeat).await;
                    record::acknowledge(self, ds, recorded, reach).await
                });
            }
        }
        drop(recording);
        heartbeat.stop().await;
        Ok(done)
    }
}

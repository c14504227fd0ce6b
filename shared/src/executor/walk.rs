//! The whole walk of a delivery, top to bottom: one flow for a delivery
//! alone ([`Executor::handle`], [`Reach::Whole`]) and for a batch
//! ([`Executor::batch`], [`Reach::Plain`]: only the plain case, the rest left
//! for walks alone) — a delivery is a batch of one. Each phase is a file,
//! entered once: [`prepare`] (validate, hold, exemption, mirror, plan read)
//! → [`record::dead_letter`] for what is not to be believed → [`gate`] →
//! what it decided acknowledged → [`call`] (receivers, heartbeat) →
//! [`record`] (fenced finish, acknowledgement), chunk by chunk.

use super::{call, gate, prepare, record, ExecError, Executor, Handled, Reach, MAX_DELIVERIES};
use crate::queue::Delivery;

impl Executor {
    /// Handles one delivery completely, acknowledging it at the end. An
    /// `Err` means nothing was acknowledged; the entry stays pending.
    #[tracing::instrument(name = "handle", skip_all, fields(slot = d.slot().unwrap_or(""), entry = %d.entry_id))]
    pub async fn handle(&self, d: &Delivery) -> Result<Handled, ExecError> {
        let walked = self.walk(std::slice::from_ref(d), Reach::Whole, Vec::<()>::new());
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

    /// For a [`batchable`](Executor::batchable) delivery, whether its kind
    /// is record-only (it takes no call permit); `None` for any other.
    pub fn batch_kind(&self, d: &Delivery) -> Option<bool> {
        if d.deliveries > MAX_DELIVERIES {
            return None;
        }
        let (_, kind) = prepare::validate(&self.config, d).ok()?;
        Some(kind.record_only())
    }

    /// The walk of the plain deliveries of `ds` (all batchable): one gate
    /// transaction, the webhook calls concurrent, one record. Returns the
    /// indexes into `ds` it decided and acknowledged; the others were left
    /// untouched and go through [`Executor::handle`]. On `Err` (never after
    /// the gate committed) the caller runs *every* delivery through
    /// `handle`, which finds a committed outcome by its entry id.
    pub async fn batch(&self, ds: &[Delivery]) -> Result<Vec<usize>, ExecError> {
        self.batch_chunked(ds, Vec::<()>::new()).await
    }

    /// [`Executor::batch`] with the claimed webhook slots called in
    /// `extra.len() + 1` chunks side by side, each recorded and
    /// acknowledged as soon as its own calls have returned; each token of
    /// `extra` is dropped when its chunk is done (the worker passes the
    /// permits of `--concurrency` it holds beyond its first, so the next
    /// gate can start while slow calls of this one are still running).
    ///
    /// Why one gate for many chunks: gate transactions of one kind queue on
    /// its quota row (DESIGN section 2, "Batches"; measured in
    /// docs/benchmarks-archive.md, "One gate per kind for webhook slots,
    /// calls in chunks").
    pub async fn batch_chunked<T: Send>(
        &self,
        ds: &[Delivery],
        extra: Vec<T>,
    ) -> Result<Vec<usize>, ExecError> {
        let walked = self.walk(ds, Reach::Plain, extra).await?;
        Ok(walked.into_iter().map(|(i, _)| i).collect())
    }

    /// The walk: prepare → gate → call → record, each phase once for all
    /// of `ds`. Returns the deliveries it decided, acknowledged.
    async fn walk<T: Send>(
        &self,
        ds: &[Delivery],
        reach: Reach,
        extra: Vec<T>,
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
        // Contiguous chunks keep the gate's (kind, day, slot) order.
        let size = gated.claimed.len().div_ceil(extra.len() + 1).max(1);
        let mut chunks: Vec<Vec<call::Claimed>> = Vec::new();
        let mut claimed = gated.claimed.into_iter().peekable();
        while claimed.peek().is_some() {
            chunks.push(claimed.by_ref().take(size).collect());
        }
        let mut tokens = extra.into_iter();
        let runs = chunks.into_iter().map(|chunk| {
            let token = tokens.next();
            async move {
                let (called, heartbeat) = call::call(self, chunk).await?;
                let recorded = record::record(self, called, heartbeat).await;
                let acked = record::acknowledge(self, ds, recorded, reach).await;
                drop(token);
                acked
            }
        });
        for chunk in futures_util::future::join_all(runs).await {
            done.extend(chunk?);
        }
        Ok(done)
    }
}

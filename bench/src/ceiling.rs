//! The yardsticks `burst` and `crowd` are measured against, each run on the
//! same database (or the same stand-in CMS) right after the workers, so
//! its figure shares the machine's mood of the moment.
//!
//! - [`Shape::Settle`], the batched-write ceiling: per slot the least a
//!   record-only slot must write (a gate row, a draft update, an execution
//!   row, its share of a quota upsert), in one transaction per `per_tx`.
//! - [`Shape::TwoPhase`], the webhook write floor: the same rows as a
//!   webhook slot must write them, in two transactions per `per_tx` — the
//!   claim (gate row `publishing` with its expiry, the draft bound, the
//!   quota) committed before any call, then the outcome (the gate row and
//!   the draft `published` with the CMS's answer, the execution row). No
//!   call is made; the floor is what the writes alone cost.
//! - [`calls`]: publish calls per second through slotgate's own webhook
//!   client to the bench's stand-in CMS, with no database at all.
//!
//! Written with sqlx (no pgbench needed), one `UNNEST` statement per table.
//! Each client's transactions use one of ten quota rows (as ten kinds
//! would) and drafts of their own, so nothing but the quota row is shared.

use anyhow::Result;
use serde_json::json;
use slotgate::receiver::Endpoint;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::cms::Cms;

/// What a webhook burst is measured against besides the batched ceiling,
/// from the same run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WebhookYardsticks {
    /// The two-phase write floor ([`Shape::TwoPhase`]): its slots per
    /// second, and what they cost the meter.
    pub(crate) floor: Metered,
    /// The publish calls alone ([`calls`]): calls per second, and what
    /// they cost the meter.
    pub(crate) calls: Metered,
}

impl WebhookYardsticks {
    /// Both yardsticks on the database at `db_url`, right after a webhook
    /// burst of `workers` workers with `concurrency` permits and `batch`
    /// each: the two-phase floor, and the better of two call rates — as
    /// many calls in flight as the workers' chunks (one per permit), and as
    /// many as the workers may have (every call of every chunk); more in
    /// flight costs more per call. `meter` as in [`after_burst_metered`].
    pub(crate) async fn measure(
        db_url: &str,
        cms: &Cms,
        workers: usize,
        concurrency: usize,
        batch: usize,
        meter: &(dyn Fn() -> Result<Duration> + Sync),
    ) -> Result<WebhookYardsticks> {
        let floor = after_burst_metered(db_url, Shape::TwoPhase, meter).await?;
        let few = calls(cms, workers * concurrency, 3, meter).await?;
        let many = calls(cms, workers * concurrency * batch, 3, meter).await?;
        let calls = if many.rate > few.rate { many } else { few };
        Ok(WebhookYardsticks { floor, calls })
    }

    /// Slots per second if each slot's writes and its call ran one after
    /// the other with the whole machine to themselves (the two share the
    /// cores) and nothing else cost anything: a model, not a measurement.
    pub(crate) fn bound(&self) -> f64 {
        1.0 / (1.0 / self.floor.rate + 1.0 / self.calls.rate)
    }

    /// The least CPU a webhook slot costs: the floor's writes of one slot
    /// and one call, CPU-seconds per 10,000 (what the meter counted).
    pub(crate) fn cpu_per_10k(&self) -> f64 {
        self.floor.cpu_per_10k() + self.calls.cpu_per_10k()
    }
}

/// Which writes a ceiling run makes per slot (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// One transaction: the record-only slot's rows, each written once.
    Settle,
    /// Two transactions: claim, then outcome, as a webhook slot.
    TwoPhase,
}

/// One transaction's worth of slots of one client: their kind and day,
/// slot numbers, drafts and slot keys.
struct Slots<'a> {
    kind: &'a str,
    day: &'a str,
    slots: &'a [i32],
    ids: &'a [i64],
    keys: &'a [String],
}

/// `clients` tasks running `step(client)` over and over for `secs`
/// seconds → units done per second. `step` answers how many units it did;
/// 0 stops that task (its supply ran out).
async fn per_second<F, Fut>(clients: usize, secs: u64, step: F) -> Result<f64>
where
    F: Fn(usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<usize>> + Send,
{
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let step = step.clone();
            tokio::spawn(async move {
                let mut done = 0usize;
                while Instant::now() < end {
                    match step(c).await? {
                        0 => break,
                        n => done += n,
                    }
                }
                Ok::<usize, anyhow::Error>(done)
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok(total as f64 / start.elapsed().as_secs_f64())
}

/// The ceiling a burst is set against, on its database right after it:
/// 16 clients, 32 slots per transaction, 5 seconds (the settings every
/// figure in BENCHMARKS.md was measured with).
pub(crate) async fn after_burst(db_url: &str, shape: Shape) -> Result<f64> {
    let unmetered = || Ok(Duration::ZERO);
    Ok(after_burst_metered(db_url, shape, &unmetered).await?.rate)
}

/// What a ceiling run measured: its rate, and over its timed section only
/// (not the drafts it inserts first) the CPU its meter read and the slots
/// it wrote.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Metered {
    pub(crate) rate: f64,
    cpu: Duration,
    slots: f64,
}

impl Metered {
    /// CPU-seconds per 10,000 of the ceiling's slots.
    pub(crate) fn cpu_per_10k(&self) -> f64 {
        self.cpu.as_secs_f64() * 10_000.0 / self.slots.max(1.0)
    }

    /// Cores the ceiling kept busy: its CPU over its timed section's wall
    /// time (its slots at its rate).
    pub(crate) fn cores_busy(&self) -> f64 {
        self.cpu.as_secs_f64() * self.rate / self.slots.max(1.0)
    }
}

/// [`after_burst`] with `meter` (CPU so far of whatever should be counted,
/// e.g. Postgres and this process) read just before and just after the
/// timed section: what the ceiling's slots cost the machine, to set
/// beside what a burst's slots cost it (`breakdown`).
pub(crate) async fn after_burst_metered(
    db_url: &str,
    shape: Shape,
    meter: &(dyn Fn() -> Result<Duration> + Sync),
) -> Result<Metered> {
    batched(db_url, 16, 32, 5, shape, meter).await
}

/// `clients` concurrent clients writing `per_tx` slots per transaction
/// (per phase) in `shape` for `secs` seconds on `db_url` → slots per second.
async fn batched(
    db_url: &str,
    clients: usize,
    per_tx: usize,
    secs: u64,
    shape: Shape,
    meter: &(dyn Fn() -> Result<Duration> + Sync),
) -> Result<Metered> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(clients as u32)
        .connect(db_url)
        .await?;
    // Enough drafts for ~60,000 slots/s, taken in order by a shared counter.
    let drafts = 60_000 * secs as i64;
    let base: i64 = sqlx::query_scalar(
        "WITH d AS (INSERT INTO draft (kind, title, ready_at)
                    SELECT 'ceiling', 'ceiling ' || g, now() FROM generate_series(1, $1) g RETURNING id)
         SELECT min(id) FROM d",
    )
    .bind(drafts)
    .fetch_one(&pool)
    .await?;
    // A day of its own per shape, so two ceilings on one database never
    // meet on a gate row.
    let day = match shape {
        Shape::Settle => "2000-01-01",
        Shape::TwoPhase => "2000-01-02",
    };
    let next = Arc::new(AtomicI64::new(0));
    let cpu_at_start = meter()?;
    let rate = per_second(clients, secs, {
        let (pool, next) = (pool.clone(), next.clone());
        move |c| {
            let (pool, next) = (pool.clone(), next.clone());
            async move {
                let first = next.fetch_add(per_tx as i64, Ordering::Relaxed);
                if first + per_tx as i64 > drafts {
                    return Ok(0);
                }
                let kind = format!("ceiling{}", c % 10);
                let idx: Vec<i64> = (first..first + per_tx as i64).collect();
                let slots: Vec<i32> = idx.iter().map(|i| *i as i32 + 1).collect();
                let ids: Vec<i64> = idx.iter().map(|i| base + i).collect();
                let keys: Vec<String> = slots.iter().map(|s| format!("{kind}:{day}:{s}")).collect();
                let batch = Slots {
                    kind: &kind,
                    day,
                    slots: &slots,
                    ids: &ids,
                    keys: &keys,
                };
                match shape {
                    Shape::Settle => settle(&pool, &batch).await?,
                    Shape::TwoPhase => two_phase(&pool, &batch).await?,
                }
                Ok(per_tx)
            }
        }
    })
    .await?;
    // Every range handed out was written (a step runs to its end); only a
    // step past the drafts' end (a supply of 60,000 a second) wrote none.
    let slots = next.load(Ordering::Relaxed).min(drafts) as f64;
    let cpu = meter()?.saturating_sub(cpu_at_start);
    pool.close().await;
    Ok(Metered { rate, cpu, slots })
}

/// The gate rows of `b`, inserted `published` (record-only) or, when
/// `claimed`, `publishing` under a 30 s claim → their ids.
async fn gate_rows(
    tx: &mut sqlx::PgConnection,
    b: &Slots<'_>,
    claimed: bool,
) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar(
        "INSERT INTO publish_slot (day, slot, kind, state, claimed_by, post_id, claim_expires_at)
         SELECT $1::date, s, $2, CASE WHEN $5 THEN 'publishing' ELSE 'published' END, 'ceiling', p,
                CASE WHEN $5 THEN now() + interval '30 s' END
           FROM UNNEST($3::int[], $4::bigint[]) AS t(s, p)
         ON CONFLICT (day, slot, kind) DO NOTHING
         RETURNING id",
    )
    .bind(b.day)
    .bind(b.kind)
    .bind(b.slots)
    .bind(b.ids)
    .bind(claimed)
    .fetch_all(tx)
    .await
}

/// The quota upsert, the last statement of a gate transaction.
async fn quota(tx: &mut sqlx::PgConnection, b: &Slots<'_>) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO daily_quota (kind, day, used) VALUES ($1, $2::date, $3)
         ON CONFLICT (kind, day) DO UPDATE SET used = daily_quota.used + EXCLUDED.used",
    )
    .bind(b.kind)
    .bind(b.day)
    .bind(b.slots.len() as i32)
    .execute(tx)
    .await?;
    Ok(())
}

/// The execution rows of published slots.
async fn executions(tx: &mut sqlx::PgConnection, b: &Slots<'_>, detail: &str) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO execution (slot_key, kind, day, slot, entry_id, caller, worker_id,
                                outcome, detail, started_at, finished_at)
         SELECT k, $1, $2::date, s, k, 'ceiling', 'ceiling', 'published', $5::jsonb, now(), now()
           FROM UNNEST($3::int[], $4::text[]) AS t(s, k)",
    )
    .bind(b.kind)
    .bind(b.day)
    .bind(b.slots)
    .bind(b.keys)
    .bind(detail)
    .execute(tx)
    .await?;
    Ok(())
}

/// [`Shape::Settle`]: one transaction, each row written once.
async fn settle(pool: &sqlx::PgPool, b: &Slots<'_>) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    gate_rows(&mut tx, b, false).await?;
    sqlx::query(
        "UPDATE draft SET status = 'published', slot_key = t.k, published_at = now()
           FROM UNNEST($1::bigint[], $2::text[]) AS t(id, k) WHERE draft.id = t.id",
    )
    .bind(b.ids)
    .bind(b.keys)
    .execute(&mut *tx)
    .await?;
    executions(&mut tx, b, "{}").await?;
    quota(&mut tx, b).await?;
    tx.commit().await
}

/// [`Shape::TwoPhase`]: the claim committed, then the outcome.
async fn two_phase(pool: &sqlx::PgPool, b: &Slots<'_>) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    let gates = gate_rows(&mut tx, b, true).await?;
    sqlx::query(
        "UPDATE draft SET status = 'publishing', slot_key = t.k
           FROM UNNEST($1::bigint[], $2::text[]) AS t(id, k) WHERE draft.id = t.id",
    )
    .bind(b.ids)
    .bind(b.keys)
    .execute(&mut *tx)
    .await?;
    quota(&mut tx, b).await?;
    tx.commit().await?;
    // The CMS's answer, as large as the stand-in CMS's.
    let urls: Vec<String> = b
        .keys
        .iter()
        .map(|k| format!("https://cms.test/p/{k}"))
        .collect();
    let mut tx = pool.begin().await?;
    sqlx::query(
        "UPDATE publish_slot s
            SET state = 'published', response = jsonb_build_object('status', 200, 'url', t.u),
                claim_expires_at = NULL, updated_at = now()
           FROM UNNEST($1::bigint[], $2::text[]) AS t(id, u)
          WHERE s.id = t.id AND s.claimed_by = 'ceiling' AND s.state IN ('claimed', 'publishing')",
    )
    .bind(&gates)
    .bind(&urls)
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE draft SET status = 'published', url = t.u, published_at = now()
           FROM UNNEST($1::bigint[], $2::text[]) AS t(id, u) WHERE draft.id = t.id",
    )
    .bind(b.ids)
    .bind(&urls)
    .execute(&mut *tx)
    .await?;
    executions(&mut tx, b, r#"{"url": "https://cms.test/p"}"#).await?;
    tx.commit().await
}

/// Publish calls per second through slotgate's webhook client to `cms`,
/// `concurrency` in flight for `secs` seconds, each with its own
/// Idempotency-Key and a body shaped like a publish: what the calls alone
/// cost this machine (client, stand-in CMS and loopback), with no
/// database and no queue.
pub(crate) async fn calls(
    cms: &Cms,
    concurrency: usize,
    secs: u64,
    meter: &(dyn Fn() -> Result<Duration> + Sync),
) -> Result<Metered> {
    let hook = slotgate::receiver::Http::new();
    let url = cms.url("/publish");
    let auth = slotgate::config::WebhookAuth::default();
    let next = Arc::new(AtomicI64::new(0));
    let cpu_at_start = meter()?;
    let rate = per_second(concurrency, secs, {
        let next = next.clone();
        move |_| {
        let (hook, url, auth, next) = (hook.clone(), url.clone(), auth.clone(), next.clone());
        async move {
            let n = next.fetch_add(1, Ordering::Relaxed);
            let key = format!("calls:2000-01-03:{n}");
            let body = json!({
                "slot": key, "kind": "calls", "day": "2000-01-03", "slot_no": n,
                "nominal_at": "2000-01-03T00:00:00+00:00", "due_at": "2000-01-03T00:00:00+00:00",
                "draft": {"id": n, "title": format!("draft {n}"), "body": ""},
            });
            let to = Endpoint {
                name: "publish",
                url: &url,
                key: &key,
                auth: &auth,
                timeout: Duration::from_secs(10),
            };
            hook.call_once(&to, body.to_string().into())
                .await
                .map_err(|f| anyhow::anyhow!("publish call failed: {}", f.error))?;
            Ok(1)
        }
    }})
    .await?;
    // Every call started ran to its end.
    let slots = next.load(Ordering::Relaxed) as f64;
    let cpu = meter()?.saturating_sub(cpu_at_start);
    Ok(Metered { rate, cpu, slots })
}

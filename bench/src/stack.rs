//! A fresh installation to measure — testkit's deployment fixture run with
//! the release binaries — and the config of N kinds the benchmarks
//! generate.

use anyhow::{bail, Context, Result};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::process::Proc;
use testkit::stack::Bins;
use testkit::TestDb;

/// The release binaries beside this one (`cargo build --release -p
/// planner -p worker -p bench`): a bench measures what a user runs.
fn bins() -> Result<Bins> {
    let me = std::env::current_exe().context("the bench's own path")?;
    let bins = Bins::beside(&me);
    for p in [&bins.worker, &bins.planner] {
        if !p.exists() {
            bail!(
                "{} not built (cargo build --release -p planner -p worker)",
                p.display()
            );
        }
    }
    Ok(bins)
}

/// A fresh installation to measure: testkit's [`testkit::stack::Stack`]
/// (its own database, Redis prefix and config file; the environment every
/// process gets), run with the release binaries, and its config parsed
/// for the planner's own path.
pub(crate) struct Stack {
    pub(crate) kit: testkit::stack::Stack,
    pub(crate) config: Arc<slotgate::config::Config>,
}

/// The servers a [`Stack`] is made on: by default (`None`) the shared ones
/// of `DATABASE_URL` and `REDIS_URL`; either may instead be one the bench
/// started, to be measured by itself (`cluster`, `breakdown`).
#[derive(Clone, Copy, Default)]
pub(crate) struct Servers<'a> {
    /// A URL of any database on a Postgres where we may `CREATE DATABASE`.
    pub(crate) postgres: Option<&'a str>,
    /// The Redis URL the workers and the planner are given.
    pub(crate) redis: Option<&'a str>,
}

impl Stack {
    pub(crate) async fn new(toml: &str) -> Result<Stack> {
        Self::on(toml, Servers::default()).await
    }

    /// [`Stack::new`] on `servers` instead of the shared ones: its own
    /// database on that Postgres; on that Redis (a Cluster's seed nodes,
    /// say), the prefix is still the stack's own.
    pub(crate) async fn on(toml: &str, servers: Servers<'_>) -> Result<Stack> {
        let mut b = testkit::stack::Stack::builder(bins()?)
            .tag("bench")
            .env("RUST_LOG", "warn");
        if let Some(url) = servers.postgres {
            b = b.postgres(url);
        }
        if let Some(url) = servers.redis {
            b = b.redis_url(url);
        }
        let kit = b.build(toml).await;
        let config = Arc::new(slotgate::config::Config::load(&kit.config)?);
        Ok(Stack { kit, config })
    }

    /// The stack's database.
    pub(crate) fn db(&self) -> &TestDb {
        self.kit.db()
    }

    pub(crate) fn queue(&self) -> slotgate::queue::Queue {
        slotgate::queue::Queue::new(
            slotgate::queue::pool(&self.kit.redis.url, 8).expect("redis"),
            slotgate::queue::KeySpace::partitioned(
                self.kit.redis.prefix.clone(),
                self.config.redis_partitions,
                false,
            ),
        )
    }

    pub(crate) async fn plan(&self, day: chrono::NaiveDate) -> Result<usize> {
        let p = slotgate::plan::Planner {
            config: self.config.clone(),
            pool: self.db().pool.clone(),
            queue: self.queue(),
            clock: Arc::new(slotgate::clock::SystemClock),
        };
        Ok(p.plan(Some(day), &[], false).await?.len())
    }

    pub(crate) async fn drafts(&self, kind: &str, n: usize) -> Result<()> {
        self.drafts_with_body(kind, n, 0).await
    }

    /// [`Stack::drafts`] whose bodies are [`draft_body`]`(body_bytes)`.
    pub(crate) async fn drafts_with_body(
        &self,
        kind: &str,
        n: usize,
        body_bytes: usize,
    ) -> Result<()> {
        sqlx::query("INSERT INTO draft (kind, title, body, ready_at) SELECT $1, 'draft ' || g, $3, now() - interval '1 hour' FROM generate_series(1, $2) g")
            .bind(kind)
            .bind(n as i32)
            .bind(draft_body(body_bytes))
            .execute(&self.db().pool)
            .await?;
        Ok(())
    }

    /// A release `worker` with its shipped defaults; `args` add to them.
    pub(crate) fn worker(&self, id: &str, args: &[&str]) -> Proc {
        self.kit.shipped_worker(id, args, &[])
    }

    /// Runs the release `planner` against this stack and returns its wall
    /// time. Stdout is discarded: `plan` prints a line per slot.
    pub(crate) fn planner(&self, args: &[&str]) -> Result<Duration> {
        let started = Instant::now();
        let out = Command::new(&self.kit.bins.planner)
            .args(args)
            .envs(self.kit.envs(&[]))
            .stdout(std::process::Stdio::null())
            .output()
            .context("running planner")?;
        let took = started.elapsed();
        if !out.status.success() {
            bail!("planner {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(took)
    }

    /// The ceiling for loading `table`: the rows it holds now, taken by a
    /// bare `COPY` into a scratch table with the same columns, constraints
    /// and indexes — Postgres's own ingest, no parsing, no round trip per
    /// row → seconds. The rows are read out first, untimed.
    pub(crate) async fn copy_ceiling(&self, table: &str) -> Result<f64> {
        use futures_util::TryStreamExt;
        let mut c = self.db().pool.acquire().await?;
        let rows: Vec<u8> = c
            .copy_out_raw(&format!("COPY {table} TO STDOUT"))
            .await?
            .try_fold(Vec::new(), |mut all, b| async move {
                all.extend_from_slice(&b);
                Ok(all)
            })
            .await?;
        let scratch = format!("scratch_{table}");
        sqlx::query(&format!(
            "CREATE TABLE {scratch} (LIKE {table} INCLUDING ALL)"
        ))
        .execute(&mut *c)
        .await?;
        let started = Instant::now();
        let mut tx = sqlx::Acquire::begin(&mut *c).await?;
        let mut copy = tx
            .copy_in_raw(&format!("COPY {scratch} FROM STDIN"))
            .await?;
        for chunk in rows.chunks(1 << 20) {
            copy.send(chunk).await?;
        }
        copy.finish().await?;
        tx.commit().await?;
        let took = started.elapsed().as_secs_f64();
        sqlx::query(&format!("DROP TABLE {scratch}"))
            .execute(&mut *c)
            .await?;
        Ok(took)
    }

    pub(crate) async fn count(&self, sql: &str) -> i64 {
        testkit::count(&self.db().pool, sql).await
    }

    /// Seconds from the first start to the last finish of the executions,
    /// once all `n` of them published (`what` names the bench otherwise).
    pub(crate) async fn all_published_within(&self, n: i64, what: &str) -> Result<f64> {
        let secs: f64 = sqlx::query_scalar(
            "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at))::float8 FROM execution",
        )
        .fetch_one(&self.db().pool)
        .await?;
        let published = self
            .count("SELECT count(*) FROM execution WHERE outcome = 'published'")
            .await;
        if published != n {
            bail!("{what}: {published} of {n} published");
        }
        Ok(secs)
    }

    /// Polls `sql` until it counts `n`, failing at `timeout` or as soon as
    /// one of `workers` has exited: a worker that refused its flags (or
    /// died) would otherwise leave the bench waiting out the whole timeout.
    pub(crate) async fn wait_count(
        &self,
        sql: &str,
        n: i64,
        timeout: Duration,
        workers: &mut [Proc],
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.count(sql).await < n {
            if Instant::now() > deadline {
                bail!("timed out waiting for {n} from {sql}");
            }
            for w in workers.iter_mut() {
                if let Some(status) = w.exited() {
                    let log = w.log_text();
                    let lines: Vec<&str> = log.lines().collect();
                    bail!(
                        "worker {} exited ({status}) before {n} from {sql}; its last lines:\n{}",
                        w.name,
                        lines[lines.len().saturating_sub(5)..].join("\n")
                    );
                }
            }
            // Not faster: `sql` is typically a count over a table the run
            // is filling, and polled every 50 ms it took about 12 % of the
            // machine in a 100,000-slot crowd (120 scans of ~16 ms). Results
            // are read from the rows' own timestamps, so the poll's period
            // only delays the end of a run, never changes its figure.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(())
    }
}

/// SIGTERM to every worker; each has 30 s to finish.
pub(crate) fn stop_all(procs: &mut [Proc]) {
    testkit::process::terminate_all(procs, Duration::from_secs(30));
}

pub(crate) fn kinds_toml(
    kinds: usize,
    slots_per_kind: usize,
    time: &dyn Fn(usize) -> String,
    jitter: &str,
    cap: usize,
    extra: &str,
) -> String {
    let mut t = String::new();
    for k in 0..kinds {
        let slots: Vec<String> = (0..slots_per_kind)
            .map(|i| format!("\"{}\"", time(i)))
            .collect();
        t.push_str(&format!(
            "[[kinds]]\nname = \"k{k}\"\ntimezone = \"UTC\"\nslots = [{}]\njitter = \"{jitter}\"\ndaily_cap = {cap}\nstarting_deadline = \"48h\"\n{extra}\n\n",
            slots.join(", ")
        ));
    }
    t
}

/// A draft body of about `bytes` bytes (at least; empty for 0) that
/// Postgres compresses as it compresses a real post's HTML: paragraphs of
/// words drawn from a vocabulary of 512 made-up words, which `pglz` packs
/// to 0.6–0.7 of their size at 4–8 kB (measured with `pg_column_size`), so
/// from about 3 kB a body is kept out of line (TOAST), as a real one is.
/// One repeated phrase would compress to a few per cent and stay inline.
pub(crate) fn draft_body(bytes: usize) -> String {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 33) as usize
    };
    let vocabulary: Vec<String> = (0..512)
        .map(|_| {
            let len = 3 + next() % 7;
            (0..len)
                .map(|_| (b'a' + (next() % 26) as u8) as char)
                .collect()
        })
        .collect();
    let mut body = String::with_capacity(bytes + 512);
    while body.len() < bytes {
        body.push_str("<p>");
        for _ in 0..40 {
            body.push_str(&vocabulary[next() % vocabulary.len()]);
            body.push(' ');
        }
        body.push_str("</p>\n");
    }
    body
}

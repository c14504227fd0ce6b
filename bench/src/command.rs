//! The subcommands, one per benchmark family, and which module runs each:
//! the table `main` dispatches through.

use crate::{
    backoff, breakdown, burst, cluster, crowd, failover, footprint, forecast, herd, import, lag,
    migration, plan, reconcile, wordpress,
};
use anyhow::Result;
use clap::Subcommand;

#[derive(Subcommand, Clone)]
pub enum Cmd {
    /// Slots already due, record-only and webhook mode, N workers → slots/s vs pgbench's bare gate insert and the batched-write ceiling; webhook mode also vs its two-phase write floor and the publish calls alone.
    Burst {
        #[arg(long, default_value_t = 10_000)]
        slots: usize,
        #[arg(long, default_value = "1,2,4", value_delimiter = ',')]
        workers: Vec<usize>,
        /// Kinds the slots are spread over (each kind's quota row is taken by its slots in turn).
        #[arg(long, default_value_t = 10)]
        kinds: usize,
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Worker `--batch` (1 = one transaction per slot).
        #[arg(long, default_value_t = slotgate::worker::DEFAULT_BATCH)]
        batch: usize,
        /// Runs per configuration; the table shows medians.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// `record-only`, `webhook`, `webhook-probe` (a `probe_url`
        /// kind: one probe before each first send without a synchronous
        /// standby) and/or `record-notify` (record-only with a `[notify]`
        /// section: what notices cost a burst, against `record-only`)
        /// and/or `webhook-slow` (webhook, the stand-in CMS answering one
        /// publish in 100 after 2 s: what sporadically slow calls cost a
        /// burst, against the plain webhook bound).
        #[arg(long, default_value = "record-only,webhook", value_delimiter = ',', value_parser = ["record-only", "webhook", "webhook-probe", "record-notify", "webhook-slow"])]
        modes: Vec<String>,
        /// How the slots' times are laid out: `interleaved` (each kind's
        /// slots one second apart, kinds interleaved in due order, as real
        /// schedules are) and/or `same-time` (every slot at 00:00:00, so
        /// each kind's slots arrive together). `interleaved-priority` and
        /// `interleaved-rotation` are `interleaved` with the drafts'
        /// priorities spread over 0..5, or with every kind `rotate_by =
        /// "category"` and its drafts in 5 categories: the pick's variants
        /// against the plain one (every priority 0) in the same run. `user`
        /// is `interleaved` as a user runs it: drafts by `planner drafts
        /// import`, workers started, then `planner plan` of the day.
        #[arg(long, default_value = "user,interleaved,same-time", value_delimiter = ',', value_parser = ["user", "interleaved", "same-time", "interleaved-priority", "interleaved-rotation"])]
        shapes: Vec<String>,
        /// Bytes of each draft's body (0: empty, as before; a blog post's
        /// HTML is some 5,000–50,000): what a slot carries besides its key.
        #[arg(long, default_value_t = 0)]
        body_bytes: usize,
    },
    /// Where a burst's work goes (issue 43; record-only, or webhook with `--modes webhook`), on the user's path (`user`: `planner drafts import`, workers, then `planner plan`) and the bench's (`interleaved`), on a Postgres and a Redis of the bench's own → CPU-seconds per 10,000 slots of the workers, the planner, Postgres and Redis; Redis commands and Postgres statements per slot (and the top ones); slots/s vs the batched-write ceiling.
    Breakdown {
        #[arg(long, default_value_t = 10_000)]
        slots: usize,
        /// Worker processes.
        #[arg(long, default_value_t = 2)]
        workers: usize,
        /// Runs per shape (shapes alternating); the table shows medians.
        #[arg(long, default_value_t = 1)]
        runs: usize,
        /// Worker `--batch`, as in `burst`.
        #[arg(long, default_value_t = slotgate::worker::DEFAULT_BATCH)]
        batch: usize,
        /// `user` and/or `interleaved`, as in `burst --shapes`.
        #[arg(long, default_value = "user,interleaved", value_delimiter = ',', value_parser = ["user", "interleaved"])]
        shapes: Vec<String>,
        /// `record-only` and/or `webhook` (publishing to the bench's
        /// stand-in CMS, measured against the bound of its writes and calls
        /// alone, as in `burst`).
        #[arg(long, default_value = "record-only", value_delimiter = ',', value_parser = ["record-only", "webhook"])]
        modes: Vec<String>,
        /// Bytes of each draft's body (0: empty, as before; a blog post's
        /// HTML is some 5,000–50,000): what a slot carries besides its key.
        #[arg(long, default_value_t = 0)]
        body_bytes: usize,
    },
    /// Slots due spread over a window → scheduling lag p50/p99/max.
    Lag {
        #[arg(long, default_value_t = 2000)]
        slots: usize,
        #[arg(long, default_value_t = 10)]
        seconds: usize,
    },
    /// kill -9 the leader under load → seconds until the next promotion.
    Failover {
        #[arg(long, default_value = "3,10", value_delimiter = ',')]
        ttls: Vec<u64>,
    },
    /// Redis bytes per queued slot; worker peak RSS.
    Footprint {
        #[arg(long, default_value_t = 100_000)]
        slots: usize,
    },
    /// Record-only slots of many kinds all due at once → first start
    /// to last finish and worker RSS, next to the batched-write ceiling.
    Crowd {
        #[arg(long, default_value_t = 100_000)]
        slots: usize,
        #[arg(long, default_value_t = 10)]
        kinds: usize,
        #[arg(long, default_value_t = 2)]
        workers: usize,
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Worker `--batch`, as in `burst`.
        #[arg(long, default_value_t = slotgate::worker::DEFAULT_BATCH)]
        batch: usize,
        /// `interleaved` (kinds interleaved in due order, as real schedules
        /// are) or `same-time` (every slot at 00:00:00); all already due.
        #[arg(long, default_value = "interleaved", value_parser = ["interleaved", "same-time"])]
        shape: String,
    },
    /// Many kinds at the same nominal second, jitter 0 vs 60 s.
    Herd {
        #[arg(long, default_value_t = 5000)]
        slots: usize,
        #[arg(long, default_value_t = 50)]
        kinds: usize,
        #[arg(long, default_value_t = 60)]
        jitter: u64,
    },
    /// Seeded simulation of clients contending on one optimistic-concurrency row.
    Backoff {
        #[arg(long, default_value = "10,50,100,150,190", value_delimiter = ',')]
        clients: Vec<usize>,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Runs per point (medians are reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// One leader reconcile pass next to a long finished history
    /// (kinds × slots × days planned slots, gate rows and executions).
    Reconcile {
        #[arg(long, default_value_t = 10)]
        kinds: usize,
        #[arg(long, default_value_t = 100)]
        slots: usize,
        #[arg(long, default_value_t = 1000)]
        days: usize,
        #[arg(long, default_value_t = 10)]
        passes: usize,
        /// Due slots of today put in the stream before the timed passes
        /// (a fleet this far behind); 0: none.
        #[arg(long, default_value_t = 0)]
        backlog: usize,
    },
    /// `planner drafts import` → drafts/s vs a bare COPY and the old row-by-row insert.
    Import {
        #[arg(long, default_value_t = 100_000)]
        drafts: usize,
        /// Runs; the table shows medians.
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// `planner forecast --json` for kinds × days (two slots a day each) → seconds vs the same for one day.
    Forecast {
        #[arg(long, default_value_t = 1000)]
        kinds: usize,
        #[arg(long, default_value_t = 14)]
        days: usize,
        /// Ready drafts per kind (priorities 0..2).
        #[arg(long, default_value_t = 20)]
        drafts: usize,
        /// Runs; the table shows medians.
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// `planner plan` of kinds × slots slots, and again → seconds vs a bare COPY + ZADD.
    Plan {
        #[arg(long, default_value_t = 20)]
        kinds: usize,
        /// Slots per kind (at most 86,400: one a second).
        #[arg(long, default_value_t = 50_000)]
        slots: usize,
        /// Runs; the table shows medians.
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// WordPress publishes (drafts in WordPress: a status read and a write per slot; drafts in slotgate: stage, look up, publish) against the webhook path, with the same calls sent alone as baselines (and drafts in slotgate's old sequence, look up + create as publish) → ms per slot, the overhead and the extra request's cost. Needs Debian's wordpress, mariadb-server, php-cli, php-mysql.
    Wordpress {
        #[arg(long, default_value_t = 60)]
        slots: usize,
        /// The worker's `--concurrency`, and the calls in flight alone.
        #[arg(long, default_value_t = 4)]
        concurrency: usize,
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// An index build on an execution table of --rows rows while a worker delivers --per-sec slots/s: the released migrations' way (CREATE INDEX in a transaction) against CONCURRENTLY → lag of the slots due during the build, next to the lag outside it.
    Migration {
        #[arg(long, default_value_t = 1_000_000)]
        rows: usize,
        #[arg(long, default_value_t = 200)]
        per_sec: usize,
        /// Seconds of slots (the build starts a third of the way in).
        #[arg(long, default_value_t = 30)]
        seconds: usize,
    },
    /// A record-only burst on one standalone Redis against the same burst on a 3-master Redis Cluster with redis_partitions = 3, same run → slots/s and Redis commands per slot on each shard.
    Cluster {
        #[arg(long, default_value_t = 10_000)]
        slots: usize,
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Everything, with defaults.
    All,
}

impl Cmd {
    /// Runs the benchmark(s) the subcommand names.
    pub async fn run(self) -> Result<()> {
        match self {
            Cmd::Burst {
                slots,
                workers,
                kinds,
                concurrency,
                batch,
                modes,
                runs,
                shapes,
                body_bytes,
            } => {
                burst::run(
                    &shapes,
                    slots,
                    &workers,
                    kinds,
                    concurrency,
                    batch,
                    &modes,
                    runs,
                    body_bytes,
                )
                .await?;
            }
            Cmd::Breakdown {
                slots,
                workers,
                runs,
                batch,
                shapes,
                modes,
                body_bytes,
            } => {
                breakdown::run(&shapes, &modes, slots, workers, runs, batch, body_bytes).await?;
            }
            Cmd::Lag { slots, seconds } => {
                lag::run(slots, seconds).await?;
            }
            Cmd::Failover { ttls } => {
                failover::run(&ttls).await?;
            }
            Cmd::Footprint { slots } => {
                footprint::run(slots).await?;
            }
            Cmd::Herd {
                slots,
                kinds,
                jitter,
            } => {
                herd::run(slots, kinds, jitter).await?;
            }
            Cmd::Crowd {
                slots,
                kinds,
                workers,
                runs,
                batch,
                shape,
            } => {
                crowd::run(slots, kinds, workers, runs, batch, &shape).await?;
            }
            Cmd::Backoff {
                clients,
                seed,
                runs,
            } => {
                backoff::run(&clients, seed, runs);
            }
            Cmd::Reconcile {
                kinds,
                slots,
                days,
                passes,
                backlog,
            } => {
                reconcile::run(kinds, slots, days, passes, backlog).await?;
            }
            Cmd::Migration {
                rows,
                per_sec,
                seconds,
            } => {
                migration::run(rows, per_sec, seconds).await?;
            }
            Cmd::Cluster { slots, runs } => {
                cluster::run(slots, runs).await?;
            }
            Cmd::Import { drafts, runs } => {
                import::run(drafts, runs).await?;
            }
            Cmd::Forecast {
                kinds,
                days,
                drafts,
                runs,
            } => {
                forecast::run(kinds, days, drafts, runs).await?;
            }
            Cmd::Plan { kinds, slots, runs } => {
                plan::run(kinds, slots, runs).await?;
            }
            Cmd::Wordpress {
                slots,
                concurrency,
                runs,
            } => {
                wordpress::run(slots, concurrency, runs).await?;
            }
            Cmd::All => {
                backoff::run(&[10, 50, 100, 150, 190], 42, 5);
                footprint::run(100_000).await?;
                lag::run(2000, 10).await?;
                failover::run(&[3, 10]).await?;
                let modes = ["record-only".to_owned(), "webhook".to_owned()];
                let shapes = ["interleaved".to_owned(), "same-time".to_owned()];
                burst::run(
                    &shapes,
                    10_000,
                    &[1, 2, 4],
                    10,
                    8,
                    slotgate::worker::DEFAULT_BATCH,
                    &modes,
                    3,
                    0,
                )
                .await?;
                herd::run(5000, 50, 60).await?;
                import::run(100_000, 3).await?;
                plan::run(20, 50_000, 3).await?;
                crowd::run(
                    100_000,
                    10,
                    2,
                    3,
                    slotgate::worker::DEFAULT_BATCH,
                    "interleaved",
                )
                .await?;
            }
        }
        Ok(())
    }
}

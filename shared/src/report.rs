//! The per-day report (`planner report`), the queue status (`planner
//! status`) and the runway (`planner forecast`, and `planner run`'s
//! `slotgate_runway_days`), as data for `--json` and as tables for people.
//!
//! The tables show strings strangers wrote (worker ids, reasons, notes);
//! each goes through [`printable`] so none reaches a terminal as an escape
//! sequence (DESIGN.md section 4.15).

use crate::clock::{unix_ms, SharedClock};
use crate::config::Config;
use crate::lease::LeaseStatus;
use crate::outcome::{Reason, SkipReason, SlotState};
use crate::queue::{Depths, Queue, QueueError};
use crate::slot::local_today;
use crate::store::{self, ReportRow, StoreError};
use crate::terminal::printable;
use chrono::NaiveDate;
use serde::Serialize;
use serde_json::{json, Map, Value};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// `planner report --json`.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The day, when every kind reports the same one.
    pub day: Option<NaiveDate>,
    /// Each kind's day, present when they differ.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub days: Option<BTreeMap<String, NaiveDate>>,
    /// One row per planned slot of the day(s), in schedule order.
    pub slots: Vec<ReportRow>,
    /// Execution counts: `published`, and `skipped`/`failed` by reason (the
    /// usual skip reasons present even at zero, so the shape is stable).
    pub totals: Value,
}

/// The skip reasons `totals` lists even at zero, so the report's shape is
/// stable for the dashboards that read it.
const USUAL_SKIPS: [SkipReason; 4] = [
    SkipReason::SlotTaken,
    SkipReason::QuotaFull,
    SkipReason::NoReadyDraft,
    SkipReason::MissedDeadline,
];

/// Builds the report of `day` (default: each kind's local today).
pub async fn build(
    pool: &PgPool,
    config: &Config,
    clock: &SharedClock,
    day: Option<NaiveDate>,
    kinds: &[String],
) -> Result<Report, StoreError> {
    let now = clock.now();
    let chosen: Vec<_> = config
        .kinds
        .iter()
        .filter(|k| kinds.is_empty() || kinds.contains(&k.name))
        .collect();
    let per_kind: BTreeMap<String, NaiveDate> = chosen
        .iter()
        .map(|k| {
            (
                k.name.clone(),
                day.unwrap_or_else(|| local_today(k.timezone, now)),
            )
        })
        .collect();
    let names: Vec<String> = per_kind.keys().cloned().collect();
    let dates: Vec<NaiveDate> = per_kind.values().copied().collect();
    let slots = store::report_rows(pool, &names, &dates).await?;
    let mut skipped = Map::new();
    for r in USUAL_SKIPS {
        skipped.insert(r.as_str().into(), json!(0));
    }
    let (mut published, mut failed) = (0i64, Map::new());
    for (recorded, n) in store::execution_totals(pool, &names, &dates).await? {
        // Counted under the reason as stored, an unknown one included (a
        // row written by hand shows up under its own name).
        let reason = recorded
            .reason
            .as_ref()
            .map_or("unknown", Reason::as_str)
            .to_owned();
        match recorded.state {
            SlotState::Published => published += n,
            // One row per (outcome, reason): the counts are final.
            SlotState::Skipped => {
                skipped.insert(reason, json!(n));
            }
            SlotState::Failed | SlotState::Claimed | SlotState::Publishing => {
                failed.insert(reason, json!(n));
            }
        }
    }
    let same = dates.windows(2).all(|w| w[0] == w[1]);
    Ok(Report {
        day: if same {
            dates.first().copied().or(day)
        } else {
            None
        },
        days: if same { None } else { Some(per_kind) },
        slots,
        totals: json!({"published": published, "skipped": skipped, "failed": failed}),
    })
}

impl Report {
    /// A table for people; stored strings are shown [`printable`].
    pub fn render(&self) -> String {
        let mut s = String::new();
        match (&self.day, &self.days) {
            (Some(d), _) => writeln!(s, "day {d}").ok(),
            (None, Some(m)) => writeln!(
                s,
                "days {}",
                m.iter()
                    .map(|(k, d)| format!("{k}={d}"))
                    .collect::<Vec<_>>()
                    .join(" ")
            )
            .ok(),
            _ => None,
        };
        writeln!(
            s,
            "{:<32} {:<25} {:<11} {:<16} {:>6} {:>9} {:>5} {:>5}",
            "SLOT", "DUE (UTC)", "STATE", "REASON", "DRAFT", "LAG_MS", "DELIV", "DUPS"
        )
        .ok();
        for r in &self.slots {
            writeln!(
                s,
                "{:<32} {:<25} {:<11} {:<16} {:>6} {:>9} {:>5} {:>5}",
                printable(&r.slot),
                r.due_at.format("%Y-%m-%d %H:%M:%S%.3f"),
                r.state_str(),
                printable(r.reason.as_ref().map_or("-", Reason::as_str)),
                r.draft_id
                    .map(|d| d.to_string())
                    .unwrap_or_else(|| "-".into()),
                r.lag_ms
                    .map(|d| d.to_string())
                    .unwrap_or_else(|| "-".into()),
                r.deliveries,
                r.duplicates_blocked
            )
            .ok();
        }
        // JSON escapes C0 controls but not C1 or bidi characters in the
        // reasons it is keyed by.
        writeln!(s, "totals: {}", printable(&self.totals.to_string())).ok();
        s
    }
}

/// `planner status --json`.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// The Redis key prefix looked at.
    pub prefix: String,
    /// The worker holding the leader lease; `None` when nobody does (the
    /// singleton chores are not running).
    pub leader: Option<String>,
    /// The epoch mirrored in `P:epoch`: the current leader's, or the last
    /// one's when none leads.
    pub epoch: Option<i64>,
    /// Milliseconds until the lease expires unless renewed.
    pub lease_ms_left: Option<i64>,
    /// Worker id → milliseconds since its last heartbeat.
    pub workers: BTreeMap<String, i64>,
    /// The queue's depths and the age of its oldest pending entry.
    pub queue: Depths,
    /// Each partition's stream key, in order, when the queue is
    /// partitioned (DESIGN 4.19): what `redis-cli -c` is pointed at.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub partition_streams: Vec<String>,
    /// Worker id → its clock against Postgres's (when Postgres is
    /// configured; measured within [`CLOCKS_WITHIN`]).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub clocks: BTreeMap<String, ClockView>,
    /// The reader's own config fingerprint, when it compared
    /// ([`Status::compare_config`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config: Option<String>,
    /// Kinds paused by an operator (`planner pause`); filled by
    /// [`full_status`], absent from the JSON when none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub paused: Vec<crate::store::Pause>,
}

/// Clock measurements older than this belong to stopped workers.
pub const CLOCKS_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

/// A worker's clock in `planner status`.
#[derive(Debug, Clone, Serialize)]
pub struct ClockView {
    /// The worker's clock minus Postgres's.
    pub skew_ms: i64,
    /// The round trip of the measurement: the skew is only known to
    /// within half of it.
    pub rtt_ms: i64,
    /// Milliseconds since it was measured.
    pub age_ms: i64,
    /// More than 1 s off.
    pub off: bool,
    /// The worker's config fingerprint
    /// ([`crate::config::Config::fingerprint`]), when it stored one.
    pub config: Option<String>,
    /// It differs from the fingerprint of whoever reads the status
    /// ([`Status::compare_config`]): the two disagree on slots.
    pub config_differs: bool,
}

/// Reads the queue's state.
pub async fn status(queue: &Queue, clock: &SharedClock) -> Result<Status, QueueError> {
    let now = unix_ms(clock.now());
    let lease = LeaseStatus::read(queue).await?;
    let workers = queue
        .workers()
        .await?
        .into_iter()
        .map(|(id, at)| (id, now - at))
        .collect();
    Ok(Status {
        prefix: queue.keys().prefix().to_owned(),
        lease_ms_left: lease.ms_left,
        leader: lease.holder,
        epoch: lease.epoch,
        workers,
        queue: queue.depths(now).await?,
        partition_streams: match queue.keys().tagged() {
            true => queue.keys().parts().map(|(_, k)| k.ready()).collect(),
            false => Vec::new(),
        },
        clocks: BTreeMap::new(),
        config: None,
        paused: Vec::new(),
    })
}

/// `planner status`: the queue's state plus the pauses in force and the
/// workers' clocks (both live in Postgres).
pub async fn full_status(
    queue: &Queue,
    pool: &sqlx::PgPool,
    clock: &SharedClock,
) -> Result<Status, StatusError> {
    let mut s = status(queue, clock).await?;
    s.paused = crate::store::paused_kinds(pool, clock.now()).await?;
    s.set_clocks(crate::store::worker_clocks(pool, CLOCKS_WITHIN).await?);
    Ok(s)
}

/// Why `planner status` could not be put together; it says which store
/// failed, since either may be down alone.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The queue's state could not be read.
    #[error("reading Redis: {0}")]
    Queue(#[from] crate::queue::QueueError),
    /// The pauses or the workers' clocks could not be read.
    #[error("reading Postgres: {0}")]
    Store(#[from] crate::store::StoreError),
}

impl Status {
    /// Adds the workers' clock measurements.
    pub fn set_clocks(&mut self, clocks: Vec<store::WorkerClock>) {
        self.clocks = clocks
            .into_iter()
            .map(|c| {
                let skew = crate::clock::Skew {
                    skew_ms: c.skew_ms,
                    rtt_ms: c.rtt_ms,
                };
                let view = ClockView {
                    skew_ms: c.skew_ms,
                    rtt_ms: c.rtt_ms,
                    age_ms: c.age_ms,
                    off: skew.is_off(),
                    config: c.config,
                    config_differs: false,
                };
                (c.worker_id, view)
            })
            .collect();
    }

    /// Flags every worker whose config fingerprint is not `ours` (the
    /// reader's own, numbered config): a planner and workers on different
    /// configs dead-letter each other's slots or read partitions nobody
    /// fills.
    pub fn compare_config(&mut self, ours: String) {
        for c in self.clocks.values_mut() {
            c.config_differs = c.config.as_ref().is_some_and(|theirs| *theirs != ours);
        }
        self.config = Some(ours);
    }

    /// Workers whose config differs from the reader's.
    pub fn config_mismatches(&self) -> Vec<&str> {
        self.clocks
            .iter()
            .filter(|(_, c)| c.config_differs)
            .map(|(id, _)| id.as_str())
            .collect()
    }

    /// A table for people; ids and notes are shown [`printable`] (anyone
    /// with Redis write access chooses a worker id or a lease holder).
    pub fn render(&self) -> String {
        let mut s = String::new();
        writeln!(s, "prefix        {}", printable(&self.prefix)).ok();
        match &self.leader {
            Some(l) => writeln!(
                s,
                "leader        {} (epoch {}, lease {} ms left)",
                printable(l),
                self.epoch.map(|e| e.to_string()).unwrap_or("?".into()),
                self.lease_ms_left.unwrap_or(0)
            )
            .ok(),
            None => writeln!(
                s,
                "leader        none (last epoch {})",
                self.epoch.map(|e| e.to_string()).unwrap_or("-".into())
            )
            .ok(),
        };
        writeln!(s, "workers       {}", self.workers.len()).ok();
        for (id, age) in &self.workers {
            writeln!(s, "  {:<28} heartbeat {age} ms ago", printable(id)).ok();
        }
        for (id, c) in &self.clocks {
            let dir = if c.skew_ms >= 0 { "ahead of" } else { "behind" };
            let warn = if c.off {
                "  WARN: more than 1 s off"
            } else {
                ""
            };
            writeln!(
                s,
                "  {:<28} clock {} ms {dir} Postgres (±{} ms){warn}",
                printable(id),
                c.skew_ms.abs(),
                c.rtt_ms / 2 + 1
            )
            .ok();
            if c.config_differs {
                writeln!(
                    s,
                    "  {:<28} config {} WARN: differs from this planner's {} (the two disagree on slots: deploy one config)",
                    printable(id),
                    printable(c.config.as_deref().unwrap_or("")),
                    self.config.as_deref().unwrap_or("")
                )
                .ok();
            }
        }
        let q = &self.queue;
        writeln!(s, "delayed       {}", q.delayed).ok();
        writeln!(s, "ready         {}", q.ready).ok();
        writeln!(
            s,
            "pending       {}{}",
            q.pending,
            q.oldest_pending_ms
                .map(|a| format!(" (oldest {a} ms)"))
                .unwrap_or_default()
        )
        .ok();
        writeln!(s, "dead letters  {}", q.dead).ok();
        for (i, d) in q.partitions.iter().enumerate() {
            let stream = self.partition_streams.get(i).map_or("", String::as_str);
            writeln!(
                s,
                "  partition {i:<3} {} delayed {} ready {} pending {}{} dead {}",
                printable(stream),
                d.delayed,
                d.ready,
                d.pending,
                d.oldest_pending_ms
                    .map(|a| format!(" (oldest {a} ms)"))
                    .unwrap_or_default(),
                d.dead
            )
            .ok();
        }
        for p in &self.paused {
            writeln!(
                s,
                "paused        {} (since {}{}, by {}{})",
                printable(&p.kind),
                p.paused_at.format("%Y-%m-%dT%H:%M:%SZ"),
                p.until
                    .map(|u| format!(" until {}", u.format("%Y-%m-%dT%H:%M:%SZ")))
                    .unwrap_or_default(),
                printable(&p.paused_by),
                if p.note.is_empty() {
                    String::new()
                } else {
                    format!(": {}", printable(&p.note))
                }
            )
            .ok();
        }
        s
    }
}

/// The runway of `kinds` (a numbered config's, in the answer's order) for
/// `days` local days: `store::forecast_read`'s snapshot, Postgres's clock
/// included, through [`crate::forecast::simulate`]. Reads only.
pub async fn forecast(
    pool: &PgPool,
    config: &Config,
    kinds: &[&crate::config::KindConfig],
    days: u32,
) -> Result<crate::forecast::Forecast, StoreError> {
    let names: Vec<String> = kinds.iter().map(|k| k.name.clone()).collect();
    let rotating: Vec<String> = kinds
        .iter()
        .filter(|k| k.rotate_by_category)
        .map(|k| k.name.clone())
        .collect();
    let mut read = store::forecast_read(pool, &names, &rotating, days).await?;
    Ok(crate::forecast::simulate(&crate::forecast::Inputs {
        now: read.now,
        days,
        seed: &config.jitter_seed,
        kinds: kinds
            .iter()
            .map(|k| crate::forecast::KindInputs {
                config: k,
                state: read.kinds.remove(&k.name).unwrap_or_default(),
            })
            .collect(),
    }))
}

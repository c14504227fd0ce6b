//! `slotgate-bench cluster`: a record-only burst on one standalone Redis
//! (the default layout) against the same burst on a 3-master Redis Cluster
//! with `redis_partitions = 3`, in the same run. Each Redis is the bench's
//! own (started by testkit, statistics reset before the burst), so its
//! `INFO commandstats` counts only the burst: Redis commands per slot on
//! each shard, and slots/s. On a 2-core machine the cluster is not
//! expected to be faster (its three servers share the same cores); what it
//! shows is that each shard's share of the work divides by the partition
//! count.

use crate::stack::{kinds_toml, stop_all, Servers, Stack};
use anyhow::Result;
use chrono::Utc;
use serde_json::{json, Value};
use std::time::Duration;
use testkit::process::Proc;
use testkit::server::{command_calls, redis_cli, OwnedCluster, OwnedRedis};

/// One burst of `slots` record-only slots of 10 interleaved kinds on the
/// Redis at `url` with `partitions`; `ports` are the servers (masters)
/// whose commands are counted. Returns slots/s and commands per server.
async fn burst(url: &str, partitions: u16, ports: &[u16], slots: usize) -> Result<(f64, Vec<u64>)> {
    let kinds = 10;
    let per = slots / kinds;
    let time = |i: usize| format!("{:02}:{:02}:{:02}", i / 3600 % 24, i / 60 % 60, i % 60);
    let toml = format!(
        "redis_partitions = {partitions}\n{}",
        kinds_toml(kinds, per, &time, "0", per, "")
    );
    let stack = Stack::on(
        &toml,
        Servers {
            redis: Some(url),
            ..Servers::default()
        },
    )
    .await?;
    for k in 0..kinds {
        stack.drafts(&format!("k{k}"), per).await?;
    }
    let day = Utc::now().date_naive().pred_opt().expect("yesterday");
    for p in ports {
        redis_cli(*p, &["CONFIG", "RESETSTAT"])?;
    }
    let n = stack.plan(day).await? as i64;
    let mut procs: Vec<Proc> = (0..2)
        .map(|i| stack.worker(&format!("c{i}"), &["--lease-ttl", "3s"]))
        .collect();
    stack
        .wait_count(
            "SELECT count(*) FROM execution",
            n,
            Duration::from_secs(600),
            &mut procs,
        )
        .await?;
    stop_all(&mut procs);
    let secs = stack.all_published_within(n, "cluster bench").await?;
    Ok((
        n as f64 / secs,
        ports.iter().map(|p| command_calls(*p)).collect(),
    ))
}

/// One topology's runs.
struct Row {
    name: &'static str,
    /// Slots/s of each run.
    rates: Vec<f64>,
    /// Commands each server (master) ran, per run.
    commands: Vec<Vec<u64>>,
}

impl Row {
    fn new(name: &'static str) -> Self {
        Row {
            name,
            rates: Vec::new(),
            commands: Vec::new(),
        }
    }
}

/// Runs both bursts `runs` times, alternating; prints medians.
pub async fn run(slots: usize, runs: usize) -> Result<Value> {
    let single = tokio::task::spawn_blocking(OwnedRedis::start).await?;
    let cluster = tokio::task::spawn_blocking(|| OwnedCluster::start(3, 0)).await?;
    let masters = cluster.master_ports();
    // Per topology: its name, slots/s of each run, commands per server of each run.
    let mut rows = [
        Row::new("standalone, 1 partition"),
        Row::new("cluster of 3 masters, 3 partitions"),
    ];
    for _ in 0..runs {
        let (rate, cmds) = burst(&single.url(), 1, &[single.port], slots).await?;
        rows[0].rates.push(rate);
        rows[0].commands.push(cmds);
        let (rate, cmds) = burst(&cluster.url(), 3, &masters, slots).await?;
        rows[1].rates.push(rate);
        rows[1].commands.push(cmds);
    }
    println!("\n## Redis Cluster: {slots} record-only slots of 10 interleaved kinds, 2 workers, median of {runs}");
    println!(
        "{:<36} {:>10} {:>14} {:>30}",
        "redis", "slots/s", "cmds/slot", "cmds/slot per shard"
    );
    let mut out = Vec::new();
    for Row {
        name,
        rates,
        commands: cmds,
    } in &rows
    {
        let mut r = rates.clone();
        r.sort_by(f64::total_cmp);
        let rate = r[r.len() / 2];
        let shards = cmds[0].len();
        let per_shard: Vec<f64> = (0..shards)
            .map(|s| {
                let mut v: Vec<f64> = cmds.iter().map(|c| c[s] as f64 / slots as f64).collect();
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            })
            .collect();
        let total: f64 = per_shard.iter().sum();
        let shown: Vec<String> = per_shard.iter().map(|c| format!("{c:.2}")).collect();
        println!(
            "{name:<36} {rate:>10.0} {total:>14.2} {:>30}",
            shown.join(" / ")
        );
        out.push(json!({"redis": name, "slots_per_s": rate, "runs": rates, "commands_per_slot": total, "commands_per_slot_per_shard": per_shard}));
    }
    let v = json!({"slots": slots, "rows": out});
    crate::figures::emit("cluster", v.clone());
    Ok(v)
}

//! Processes going away or going wrong: `kill-9` of a worker (restarted
//! with its old id or a new one), `kill-9-mid-webhook` (the worker whose
//! publish call the CMS holds open), `leader-sigstop` (the lease holder
//! stopped past its TTL) and `clock-ahead` (a worker started under
//! libfaketime). The kill here is also the takeover of
//! `webhook-held-before-apply` ([`super::cms`]).

use super::{Harness, Injection, WorkerSlot};
use crate::model::{Class, Violation};
use crate::stack::CLOCK_AHEAD;
use anyhow::{bail, Context, Result};
use chrono::Utc;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// How often a kill fault chooses again when another fault (a kill of its
/// own, running concurrently) took its worker first.
pub(super) const KILL_TRIES: usize = 5;

/// [`crate::scenario::Ev::Kill`].
pub(super) async fn kill9(
    h: &Arc<Harness>,
    victim: usize,
    restart_ms: u64,
    reuse_id: bool,
) -> Result<Injection> {
    // Another fault (a kill of its own) may take the chosen
    // worker between the choice and the kill: choose again.
    for _ in 0..KILL_TRIES {
        let (idx, id) = running_worker(h, victim).await?;
        let mut affected = claimed_by(h, &id).await;
        affected.extend(h.open_due_within(Some(Duration::from_secs(1))));
        if let Some((what, verified)) = kill(h, idx, &id, restart_ms, reuse_id)? {
            return Ok(Injection::new(affected, what, verified));
        }
    }
    bail!("every worker chosen was taken by another fault first ({KILL_TRIES} tries)");
}

/// [`crate::scenario::Ev::KillMidWebhook`].
pub(super) async fn kill9_mid_webhook(
    h: &Arc<Harness>,
    hold_ms: u64,
    restart_ms: u64,
    reuse_id: bool,
) -> Result<Injection> {
    let hold = testkit::cms::Reply::Delay(Duration::from_millis(hold_ms), 200);
    Ok(kill_while_held(h, hold, restart_ms, reuse_id).await?.0)
}

/// Holds the next publish call (answers it with `hold`) and kills the
/// worker that made it, while the CMS holds it; when another fault got
/// there first (the owner no longer runs, or its claim moved on), the next
/// call, up to [`KILL_TRIES`] calls. The injection, the call's key, when
/// the hold was armed and when the kill was done.
pub(super) async fn kill_while_held(
    h: &Arc<Harness>,
    hold: testkit::cms::Reply,
    restart_ms: u64,
    reuse_id: bool,
) -> Result<(Injection, String, SystemTime, SystemTime)> {
    let mut last = String::new();
    for _ in 0..KILL_TRIES {
        let armed_at = SystemTime::now();
        match kill_while_held_once(h, hold.clone(), restart_ms, reuse_id).await? {
            Ok((injection, key, killed_at)) => return Ok((injection, key, armed_at, killed_at)),
            // The owner of the held call was killed (or its claim
            // moved) by another fault meanwhile: hold the next call.
            Err(why) => last = why,
        }
    }
    bail!("{last} ({KILL_TRIES} tries)");
}

/// One try of [`kill_while_held`]: `Ok(Err(why))` when another fault got
/// there first.
async fn kill_while_held_once(
    h: &Arc<Harness>,
    hold: testkit::cms::Reply,
    restart_ms: u64,
    reuse_id: bool,
) -> Result<std::result::Result<(Injection, String, SystemTime), String>> {
    let (keys, hold) = super::cms::held_calls(h, 1, hold).await?;
    let key = keys[0].clone();
    h.webhook.disarm_hold(hold);
    let Ok(slot) = key.parse::<slotgate::slot::SlotKey>() else {
        bail!("held a call with key {key:?}");
    };
    let owner: Option<String> = sqlx::query_scalar(
        "SELECT claimed_by FROM publish_slot WHERE kind = $1 AND day = $2::date AND slot = $3 AND state IN ('claimed', 'publishing')",
    )
    .bind(&slot.kind)
    .bind(slot.day)
    .bind(slot.slot_no as i32)
    .fetch_optional(&h.stack.kit.pool)
    .await?;
    let Some(owner) = owner else {
        return Ok(Err(format!("the held call's slot {key} has no open claim")));
    };
    let idx = {
        let w = h.workers.lock().unwrap();
        w.iter()
            .find(|s| s.id == owner && s.proc.is_some())
            .map(|s| s.idx)
    };
    let Some(idx) = idx else {
        return Ok(Err(format!(
            "{key} is claimed by {owner}, which is not running"
        )));
    };
    let mut affected = claimed_by(h, &owner).await;
    affected.insert(key.clone());
    let Some((what, verified)) = kill(h, idx, &owner, restart_ms, reuse_id)? else {
        return Ok(Err(format!("{owner} was killed by another fault first")));
    };
    let killed_at = SystemTime::now();
    Ok(Ok((
        Injection::new(
            affected,
            format!("{what}, while the CMS held its publish call for {key}"),
            verified,
        ),
        key,
        killed_at,
    )))
}

/// `kill -9` of worker slot `idx` (if it still runs `id`), and its
/// restart after `restart_ms`. Verified: its exit status is SIGKILL
/// (a worker that had already exited by itself is not a kill). `None`
/// when slot `idx` no longer runs `id`: another fault got there first.
fn kill(
    h: &Arc<Harness>,
    idx: usize,
    id: &str,
    restart_ms: u64,
    reuse_id: bool,
) -> Result<Option<(String, bool)>> {
    let (proc, gen) = {
        let mut w = h.workers.lock().unwrap();
        let s = &mut w[idx];
        // Another fault took it first: the caller chooses again.
        if s.id != id {
            return Ok(None);
        }
        let Some(p) = s.proc.take() else {
            return Ok(None);
        };
        s.gen += 1;
        (p, s.gen)
    };
    let pid = proc.pid();
    let mut proc = proc;
    let (status, verified) = match proc.kill_9() {
        Ok(st) => (st, true),
        Err(st) => (st, false),
    };
    if !verified {
        h.found(Violation::new(
            Class::WorkerExit,
            None,
            format!(
                "worker {} had exited by itself ({status}) before it was killed",
                proc.name
            ),
        ));
    }
    drop(proc);
    let h = h.clone();
    let new_id = if reuse_id {
        id.to_owned()
    } else {
        format!("w{}g{gen}", idx + 1)
    };
    let what =
        format!("kill -9 {id} (pid {pid}, exit: {status}); restart in {restart_ms} ms as {new_id}");
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(restart_ms)).await;
        let mut w = h.workers.lock().unwrap();
        let s = &mut w[idx];
        if s.gen == gen && s.proc.is_none() {
            let log_name = format!("w{}g{gen}", idx + 1);
            s.proc = Some(h.stack.spawn_worker(&log_name, &new_id, s.clock_ahead));
            s.id = new_id;
        }
    });
    Ok(Some((what, verified)))
}

/// SIGSTOP of the lease holder until a new lease epoch is observed
/// (at least `pause_ms`), then SIGCONT. Verified: the process was in
/// state T, and another worker took the lease with a higher epoch.
pub(super) async fn stop_leader(h: &Harness, pause_ms: u64) -> Result<Injection> {
    // The holder of the lease, once it is one of the running workers
    // (a freshly killed leader's lease outlives it).
    let deadline = Instant::now() + Duration::from_secs(10);
    let (leader, id, idx, gen, pid, epoch) = loop {
        if let Some((id, epoch)) = lease(h).await? {
            let found = {
                let w = h.workers.lock().unwrap();
                w.iter()
                    .find(|s| s.id == id)
                    .and_then(|s| s.proc.as_ref().map(|p| (s.idx, s.gen, p.pid())))
            };
            if let Some((idx, gen, pid)) = found {
                break (format!("{id}:{epoch}"), id, idx, gen, pid, epoch);
            }
        }
        if Instant::now() > deadline {
            bail!("no running worker held the lease for 10 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut affected = claimed_by(h, &id).await;
    affected.extend(h.open_due_within(Some(Duration::from_millis(pause_ms))));
    let started = Instant::now();
    h.with_worker(idx, gen, |p| p.try_signal("STOP"))
        .unwrap_or_else(|| Err(std::io::ErrorKind::NotFound.into()))
        .with_context(|| format!("SIGSTOP {pid}"))?;
    let mut stopped = false;
    let mut new_epoch = None;
    let until = started + Duration::from_millis(pause_ms).max(Duration::from_secs(15));
    while Instant::now() < until {
        stopped = stopped || h.with_worker(idx, gen, |p| p.state()).flatten() == Some('T');
        if new_epoch.is_none() {
            new_epoch = lease(h).await.ok().flatten().filter(|(_, e)| *e > epoch);
        }
        let paused = started.elapsed() >= Duration::from_millis(pause_ms);
        if stopped && new_epoch.is_some() && paused {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    h.with_worker(idx, gen, |p| p.resume());
    let took = started.elapsed();
    Ok(Injection::new(
        affected,
        format!(
            "SIGSTOP leader {leader} (pid {pid}) for {took:?} (state T: {stopped}; new lease during the pause: {})",
            new_epoch
                .as_ref()
                .map_or("none".to_owned(), |(i, e)| format!("{i}:{e}"))
        ),
        stopped && new_epoch.is_some(),
    ))
}

/// The lease holder and epoch, from `P:leader`.
async fn lease(h: &Harness) -> Result<Option<(String, i64)>> {
    let mut c = h.stack.redis.clone();
    let v: Option<String> = redis::cmd("GET")
        .arg(h.stack.keys.leader())
        .query_async(&mut c)
        .await?;
    Ok(v.and_then(|v| {
        let (id, e) = v.rsplit_once(':')?;
        Some((id.to_owned(), e.parse().ok()?))
    }))
}

/// Checks the worker started with its clock ahead (the first one).
/// Verified: its liveness heartbeat in Redis carries a time at least
/// 30 s ahead.
pub(super) async fn clock_ahead(h: &Harness) -> Result<Injection> {
    if testkit::process::libfaketime().is_none() {
        bail!("libfaketime is not installed (apt-get install faketime)");
    }
    let (idx, id) = wait_for_worker(h, "the worker with its clock ahead is not running", |w| {
        w.iter().find(|s| s.clock_ahead && s.proc.is_some())
    })
    .await?;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut c = h.stack.redis.clone();
        let beat: Option<i64> = redis::cmd("HGET")
            .arg(h.stack.keys.workers())
            .arg(&id)
            .query_async(&mut c)
            .await?;
        let now = Utc::now().timestamp_millis();
        if let Some(ms) = beat {
            let ahead = ms - now;
            return Ok(Injection::new(
                HashSet::new(),
                format!("worker #{idx} {id} runs with libfaketime {CLOCK_AHEAD}; its heartbeat is {:.1} s ahead", ahead as f64 / 1000.0),
                ahead > 30_000,
            ));
        }
        if Instant::now() > deadline {
            bail!("{id} (libfaketime {CLOCK_AHEAD}) sent no heartbeat in 15 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first running worker from `victim` on (index and id).
async fn running_worker(h: &Harness, victim: usize) -> Result<(usize, String)> {
    wait_for_worker(h, "no worker running", |w| {
        let n = w.len();
        (0..n)
            .map(|i| &w[(victim + i) % n])
            .find(|s| s.proc.is_some())
    })
    .await
}

/// The worker `pick` chooses (index and id), waited for up to 20 s:
/// every worker, or the one a fault needs, may be down for a moment —
/// killed by another fault and restarted within `restart_ms` (≤ 3 s) —
/// which must not fail the fault. `what` names the failure after 20 s.
async fn wait_for_worker(
    h: &Harness,
    what: &str,
    pick: impl Fn(&[WorkerSlot]) -> Option<&WorkerSlot>,
) -> Result<(usize, String)> {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let found = pick(&h.workers.lock().unwrap()).map(|s| (s.idx, s.id.clone()));
        match found {
            Some(v) => return Ok(v),
            None if Instant::now() > until => bail!("{what} for 20 s"),
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Open slots claimed by a worker.
async fn claimed_by(h: &Harness, worker: &str) -> HashSet<String> {
    sqlx::query_as::<_, (String, String, i32)>(
        "SELECT kind, day::text, slot FROM publish_slot WHERE claimed_by = $1 AND state IN ('claimed', 'publishing') AND kind = ANY($2)",
    )
    .bind(worker)
    .bind(&h.kind_names)
    .fetch_all(&h.stack.kit.pool)
    .await
    .unwrap_or_default()
    .into_iter()
    .map(|(k, d, s)| format!("{k}:{d}:{s}"))
    .collect()
}

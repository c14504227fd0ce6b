//! Second deliveries of a slot: `concurrent-dup` (copies added at once, at
//! its due time), `serial-dup` (copies after it finished), `trigger-dup`
//! (`planner trigger`), `redis-cli-xadd-dup` (a raw XADD), `backfill-dup`
//! (`planner backfill`), and the harness's part of `--sabotage skip-gate`.
//! The gate must turn away every copy of a finished slot.

use super::{is_entry_id, while_poisoned, Harness, Injection};
use crate::model::{Expect, Fault};
use crate::scenario::Target;
use anyhow::{bail, Result};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// [`crate::scenario::Ev::ConcurrentDup`].
pub(super) async fn concurrent(
    h: &Harness,
    target: Target,
    copies: u32,
    offset_ms: i64,
) -> Result<Injection> {
    let key = h.sc.target_key(target, &h.stack.day);
    let at = h.due[&key] + chrono::Duration::milliseconds(offset_ms);
    // The due time on the wall clock, as a monotonic instant.
    let wait = (at - chrono::Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep_until((Instant::now() + wait).into()).await;
    let after_done = h.terminal.borrow().contains(&key);
    let mut p = redis::pipe();
    for _ in 0..copies {
        p.cmd("XADD")
            .arg(h.stack.ready())
            .arg("*")
            .arg("slot")
            .arg(&key)
            .arg("caller")
            .arg(Fault::ConcurrentDup.caller());
    }
    // One transaction: every copy sees the same stream, so a
    // poisoned stream refuses all of them, and the retry adds
    // no copy twice.
    p.atomic();
    let ids: Vec<String> = while_poisoned(|| async {
        let mut c = h.stack.redis.clone();
        Ok(p.query_async(&mut c).await?)
    })
    .await?;
    let expect = if after_done {
        Expect::Taken
    } else {
        Expect::Any
    };
    h.added(
        Fault::ConcurrentDup,
        expect,
        ids.iter().map(|id| (Some(id.clone()), Some(key.clone()))),
    );
    Ok(Injection::new(
        HashSet::from([key.clone()]),
        format!(
            "{key} x{copies} at once ({}): entries {ids:?}",
            if after_done {
                "already done"
            } else {
                "not done yet"
            }
        ),
        ids.len() == copies as usize && ids.iter().all(|i| is_entry_id(i)),
    ))
}

/// [`crate::scenario::Ev::SerialDup`].
pub(super) async fn serial(
    h: &Harness,
    target: Target,
    delay_ms: u64,
    copies: u32,
    until: Instant,
) -> Result<Injection> {
    let key = after_finished(h, target, until, delay_ms).await?;
    let mut ids = Vec::new();
    for i in 0..copies {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let id = h
            .xadd(&[("slot", &key), ("caller", Fault::SerialDup.caller())])
            .await?;
        h.added(
            Fault::SerialDup,
            Expect::Taken,
            [(Some(id.clone()), Some(key.clone()))],
        );
        ids.push(id);
    }
    Ok(Injection::new(
        HashSet::from([key.clone()]),
        format!("{key} x{copies}, {delay_ms} ms after it finished: entries {ids:?}"),
        true,
    ))
}

/// [`crate::scenario::Ev::Trigger`].
pub(super) async fn trigger(
    h: &Harness,
    target: Target,
    delay_ms: u64,
    until: Instant,
) -> Result<Injection> {
    let key = after_finished(h, target, until, delay_ms).await?;
    let entry = h.stack.trigger(&key).await?;
    if !is_entry_id(&entry) {
        bail!("planner trigger {key} printed the entry id {entry:?}");
    }
    Ok(late(
        h,
        Fault::TriggerDup,
        &key,
        entry,
        "planner trigger",
        delay_ms,
    ))
}

/// [`crate::scenario::Ev::Xadd`].
pub(super) async fn xadd(
    h: &Harness,
    target: Target,
    delay_ms: u64,
    until: Instant,
) -> Result<Injection> {
    let key = after_finished(h, target, until, delay_ms).await?;
    let stream = h.stack.ready();
    let caller = Fault::XaddDup.caller();
    let target = h.stack.kit.redis_cli_target().await;
    // A stream another fault poisoned answers an error (redis-cli exits 0
    // all the same) until slotgate repairs it: waited out, as the
    // harness's own XADDs do.
    let added = while_poisoned(|| async {
        let o = tokio::process::Command::new("redis-cli")
            .args(&target)
            .args(["XADD", &stream, "*"])
            .args(["slot", &key, "caller", caller])
            .stdin(std::process::Stdio::null())
            .output()
            .await?;
        let id = String::from_utf8_lossy(&o.stdout).trim().to_owned();
        if !o.status.success() {
            bail!(
                "redis-cli XADD failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
        }
        if !is_entry_id(&id) {
            bail!("redis-cli XADD answered {id:?}");
        }
        Ok(id)
    })
    .await;
    let (id, how) = match added {
        Ok(id) => (id, "redis-cli XADD"),
        Err(e) if e.downcast_ref::<std::io::Error>().is_some() => (
            h.xadd(&[("slot", &key), ("caller", caller)]).await?,
            "XADD (redis-cli not installed)",
        ),
        Err(e) => return Err(e),
    };
    Ok(late(h, Fault::XaddDup, &key, id, how, delay_ms))
}

/// `planner backfill` of a kind's day, retried until it delivered
/// something (a backfill finding nothing due and open injected nothing).
/// Prefers `kind`; any kind with open due slots will do.
pub(super) async fn backfill(h: &Harness, kind: usize, until: Instant) -> Result<Injection> {
    let deadline = (Instant::now() + Duration::from_secs(20)).min(until);
    let mut tries = 0;
    loop {
        let open = h.open_due_within(Some(Duration::ZERO));
        let mut order: Vec<usize> = vec![kind];
        order.extend((0..h.sc.kinds.len()).filter(|k| *k != kind));
        let pick = order.into_iter().find(|k| {
            let prefix = format!("{}:", h.sc.kinds[*k].name);
            open.iter().any(|s| s.starts_with(&prefix))
        });
        if let Some(k) = pick {
            tries += 1;
            let name = &h.sc.kinds[k].name;
            let b = h.stack.backfill(name).await?;
            if !b.is_empty() {
                h.added(
                    Fault::BackfillDup,
                    Expect::Any,
                    b.iter().map(|key| (None, Some(key.clone()))),
                );
                return Ok(Injection::new(
                    b.iter().cloned().collect(),
                    format!(
                        "planner backfill --kind {name} (try {tries}): delivered {} slot(s) due and without an outcome",
                        b.len()
                    ),
                    true,
                ));
            }
        }
        if Instant::now() > deadline {
            bail!("backfill delivered nothing ({tries} tries): no slot was due and open");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The harness's part of `--sabotage skip-gate`: from halfway through,
/// duplicates of published record-only slots of kinds with drafts left
/// (a few, a second apart), which the sabotaged gate lets through. The other sabotages need
/// nothing but ordinary deliveries.
pub async fn sabotage(h: &Harness) -> Result<()> {
    h.sleep_until_ms(h.sc.duration.as_millis() as u64 / 2).await;
    let record_only: Vec<&str> =
        h.sc.kinds
            .iter()
            .filter(|k| k.record_only)
            .map(|k| k.name.as_str())
            .collect();
    for _ in 0..3 {
        let row: Option<(String, String, i32)> = sqlx::query_as(
            "SELECT kind, day::text, slot FROM publish_slot s WHERE state = 'published' AND kind = ANY($1)
                AND EXISTS (SELECT 1 FROM draft d WHERE d.kind = s.kind AND d.status = 'ready')
              ORDER BY updated_at DESC LIMIT 1",
        )
        .bind(&record_only)
        .fetch_optional(&h.stack.kit.pool)
        .await?;
        if let Some((kind, day, slot)) = row {
            let key = format!("{kind}:{day}:{slot}");
            let id = h
                .xadd(&[("slot", &key), ("caller", "chaos-sabotage")])
                .await?;
            h.added(
                Fault::SerialDup,
                Expect::Taken,
                [(Some(id), Some(key.clone()))],
            );
            h.note(format!(
                "SABOTAGE self-test: delivered published record-only {key} again"
            ));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Ok(())
}

/// Waits for `target` to finish, then `delay_ms` more: the moment a serial
/// or cross-caller duplicate of a finished slot is injected. Its key.
async fn after_finished(
    h: &Harness,
    target: Target,
    until: Instant,
    delay_ms: u64,
) -> Result<String> {
    let key = h.sc.target_key(target, &h.stack.day);
    if !h.wait_done(&key, until).await {
        bail!("{key} never finished");
    }
    tokio::time::sleep(Duration::from_millis(delay_ms)).await;
    Ok(key)
}

/// A copy of `key` added (as `entry`, by `how`) `delay_ms` after the
/// slot finished: recorded as one the gate must turn away, and
/// described so.
fn late(
    h: &Harness,
    fault: Fault,
    key: &str,
    entry: String,
    how: &str,
    delay_ms: u64,
) -> Injection {
    h.added(
        fault,
        Expect::Taken,
        [(Some(entry.clone()), Some(key.to_owned()))],
    );
    Injection::new(
        HashSet::from([key.to_owned()]),
        format!("{how} {key}, {delay_ms} ms after it finished: entry {entry}"),
        true,
    )
}

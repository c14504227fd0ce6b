//! The CMS misbehaving at the harness's word, for the next publish calls:
//! `redirect` (answered 301 to another path), `cms-late` (answered just
//! past the HTTP timeout) and `webhook-held-before-apply` (`--cms probe`:
//! recorded on receipt, applied only later, probes answered `409`
//! meanwhile; with a takeover, its worker killed by [`super::process`]).
//! The random per-call webhook faults are the CMS's own
//! ([`crate::webhook`]).

use super::process::{self, KILL_TRIES};
use super::{Harness, Injection};
use crate::scenario::{CMS_LATE_BY_MS, HTTP_TIMEOUT_MS};
use anyhow::{bail, Result};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};
use testkit::cms::Reply;

/// [`crate::scenario::Ev::Redirect`].
pub(super) async fn redirect(h: &Harness, calls: u32) -> Result<Injection> {
    let moved = h.stack.cms.url("/moved");
    let reply = Reply::StatusWith(301, vec![("location".into(), moved.clone())]);
    answer_next(h, calls, reply, format!("answered 301 (location {moved})")).await
}

/// [`crate::scenario::Ev::CmsLate`].
pub(super) async fn late(h: &Harness, calls: u32) -> Result<Injection> {
    let late = Duration::from_millis(HTTP_TIMEOUT_MS + CMS_LATE_BY_MS);
    let what = format!("answered after {late:?} (timeout {HTTP_TIMEOUT_MS} ms)");
    answer_next(h, calls, Reply::Delay(late, 200), what).await
}

/// The next `n` publish calls answered with `reply`. Verified: they
/// came, and were answered so.
async fn answer_next(h: &Harness, n: u32, reply: Reply, what: String) -> Result<Injection> {
    let (keys, _) = held_calls(h, n, reply).await?;
    Ok(Injection::new(
        keys.iter().cloned().collect(),
        format!("{what}: the publish calls of {keys:?}"),
        keys.len() == n as usize,
    ))
}

/// Arms the CMS to answer the next `n` publish calls with `reply`;
/// returns their keys (and the last hold's id) once they came.
pub(super) async fn held_calls(h: &Harness, n: u32, reply: Reply) -> Result<(Vec<String>, u64)> {
    let mut rxs = Vec::new();
    let mut last = 0;
    for _ in 0..n {
        let (id, rx) = h.webhook.arm(reply.clone());
        rxs.push((id, rx));
        last = id;
    }
    let mut keys = Vec::new();
    for (id, rx) in rxs {
        match tokio::time::timeout(Duration::from_secs(15), rx).await {
            Ok(Ok(k)) => keys.push(k),
            _ => {
                h.webhook.disarm_hold(id);
                bail!("no publish call came within 15 s");
            }
        }
    }
    Ok((keys, last))
}

/// [`crate::scenario::Ev::HeldBeforeApply`]: the next publish call recorded on receipt
/// and applied only `hold_ms` later (the CMS answers its key's probes
/// `409` meanwhile); with `takeover` (restart after, reuse the id), the
/// worker that made it killed while it is held. Verified by the CMS's
/// own record: the call was received, applied later than the HTTP
/// timeout, and a probe of its key was answered `409` while it was held
/// — after the kill, with a takeover (so by another process). When the
/// CMS's record shows no such probe (another fault killed the worker
/// before it probed, say), the next publish call is held again, up to
/// [`KILL_TRIES`] calls; each try is logged.
pub(super) async fn held_before_apply(
    h: &Arc<Harness>,
    hold_ms: u64,
    takeover: Option<(u64, bool)>,
) -> Result<Injection> {
    let mut tries = 0;
    loop {
        tries += 1;
        let injection = hold_before_apply_once(h, hold_ms, takeover).await?;
        if injection.verified || tries >= KILL_TRIES {
            return Ok(injection);
        }
        h.log(format!(
            "webhook-held-before-apply try {tries} not verified, holding the next publish call: {}",
            injection.what
        ));
    }
}

/// One try of [`held_before_apply`].
async fn hold_before_apply_once(
    h: &Arc<Harness>,
    hold_ms: u64,
    takeover: Option<(u64, bool)>,
) -> Result<Injection> {
    let hold = Reply::Delay(Duration::from_millis(hold_ms), 200);
    let (mut injection, key, armed_at, killed_at) = match takeover {
        None => {
            let armed_at = SystemTime::now();
            let (keys, _) = held_calls(h, 1, hold).await?;
            let key = keys[0].clone();
            let affected = HashSet::from([key.clone()]);
            (
                Injection::new(affected, String::new(), true),
                key,
                armed_at,
                None,
            )
        }
        Some((restart_ms, reuse_id)) => {
            let (injection, key, armed_at, killed_at) =
                process::kill_while_held(h, hold, restart_ms, reuse_id).await?;
            (injection, key, armed_at, Some(killed_at))
        }
    };
    // The CMS's record of the held call, once it was applied.
    let deadline = Instant::now() + Duration::from_millis(hold_ms) + Duration::from_secs(10);
    let post = loop {
        let post = h
            .stack
            .cms
            .calls_to("/publish")
            .into_iter()
            .find(|c| c.key.as_deref() == Some(key.as_str()) && c.at >= armed_at);
        if post.as_ref().is_some_and(|c| c.answered_at.is_some()) || Instant::now() > deadline {
            break post;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let Some(post) = post else {
        bail!("the CMS has no record of the held publish call for {key}");
    };
    let timeout = Duration::from_millis(HTTP_TIMEOUT_MS);
    let applied_after = post
        .answered_at
        .filter(|_| post.applied())
        .and_then(|t| t.duration_since(post.at).ok());
    let held_until = post.answered_at.unwrap_or_else(SystemTime::now);
    let from = killed_at.unwrap_or(post.at).max(post.at);
    let probes = h.stack.cms.calls();
    // What a probe of a key in progress is answered: 409 by the
    // contract; 404 by the CMS of the judge's self-test, which breaks it.
    let in_progress = if h.sc.probe_contract_broken { 404 } else { 409 };
    let answered_409 = probes
        .iter()
        .filter(|c| c.path.starts_with("/probe") && c.key.as_deref() == Some(key.as_str()))
        .filter(|c| c.status == Some(in_progress) && c.at > from && c.at < held_until)
        .count();
    let applied_late = applied_after.is_some_and(|d| d > timeout);
    injection.verified &= applied_late && answered_409 > 0;
    let kill = std::mem::take(&mut injection.what);
    injection.what = format!(
        "{}the publish call for {key} received, applied {} (timeout {HTTP_TIMEOUT_MS} ms); {answered_409} probe(s) of its key answered {in_progress} while it was held{}",
        if kill.is_empty() { String::new() } else { format!("{kill}; ") },
        match applied_after {
            Some(d) => format!("{:.2} s after it arrived", d.as_secs_f64()),
            None => "never".to_owned(),
        },
        if killed_at.is_some() { " after the kill" } else { "" },
    );
    Ok(injection)
}

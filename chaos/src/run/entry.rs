//! Stream entries a stranger writes, which the workers must handle without
//! an effect: `malformed` (dead-lettered with its reason), `poison-entry`
//! (non-UTF-8, 512 KiB, the top of the ID space), `oversize-entry` (64 MiB,
//! and no worker's memory grows by it) and `future-delivery` (a slot of a
//! day that has not come).

use super::{stream_fields, Harness, Injection};
use crate::model::{Expect, Fault};
use crate::scenario::{Malformed, Poison};
use anyhow::{bail, Context, Result};
use std::collections::HashSet;
use std::time::{Duration, Instant};

/// [`crate::scenario::Ev::Malformed`].
pub(super) async fn malformed(h: &Harness, what: Malformed) -> Result<Injection> {
    let day = &h.stack.day;
    let k0 = &h.sc.kinds[0];
    let slot = match what {
        Malformed::MissingSlot => None,
        Malformed::BadKey => Some("not-a-slot-key".to_owned()),
        Malformed::UnknownKind => Some(format!("ghost:{day}:1")),
        Malformed::SlotOutOfRange => {
            // Far past the count: `schedule-edit` numbers a
            // new time `len + 1`.
            Some(format!("{}:{day}:{}", k0.name, k0.offsets.len() + 100))
        }
    };
    let caller = Fault::Malformed.caller();
    let id = match &slot {
        Some(s) => h.xadd(&[("slot", s), ("caller", caller)]).await?,
        None => h.xadd(&[("caller", caller), ("note", "no slot")]).await?,
    };
    let expect = Expect::Dead(what.reason());
    h.added(Fault::Malformed, expect, [(Some(id.clone()), slot.clone())]);
    let seen = watch_dead_letter(h, &id).await;
    Ok(Injection::new(
        HashSet::new(),
        format!(
            "{} ({}) entry {id}, expect dead letter {}{}",
            what.name(),
            slot.as_deref().unwrap_or("-"),
            what.reason(),
            if seen { " (seen)" } else { "" }
        ),
        true,
    ))
}

/// One poison entry. Verified: Redis took it (the top-of-space ID
/// as given).
pub(super) async fn poison(h: &Harness, what: Poison) -> Result<Injection> {
    let caller = Fault::PoisonEntry.caller().as_bytes();
    let (id, slot, expect) = match what {
        Poison::NonUtf8 => {
            let bad: &[u8] = b"\xff\xfe:\xc3\x28:1";
            let id = h
                .xadd_raw("*", &[("slot", bad), ("caller", caller)])
                .await?;
            (id, "<non-UTF-8>".to_owned(), Expect::Dead("bad_message"))
        }
        Poison::Oversized => {
            let big = vec![b'x'; 512 * 1024];
            let id = h
                .xadd_raw("*", &[("slot", &big), ("caller", caller)])
                .await?;
            (id, "<512 KiB>".to_owned(), Expect::Dead("bad_message"))
        }
        Poison::TopId => {
            // A copy of a finished slot, so only the ID is hostile.
            let slot = h
                .terminal
                .borrow()
                .iter()
                .next()
                .cloned()
                .unwrap_or_default();
            let top = "18446744073709551615-18446744073709551615";
            let id = h
                .xadd_raw(top, &[("slot", slot.as_bytes()), ("caller", caller)])
                .await?;
            if id != top {
                bail!("XADD {top} answered {id}");
            }
            (id, slot, Expect::Unjudged)
        }
    };
    h.added(
        Fault::PoisonEntry,
        expect,
        [(Some(id.clone()), Some(slot.clone()))],
    );
    if let Expect::Dead(_) = expect {
        watch_dead_letter(h, &id).await;
    }
    Ok(Injection::new(
        HashSet::new(),
        format!("{} ({slot}) entry {id}", what.name()),
        true,
    ))
}

/// One entry whose `slot` is 64 MiB. Verified: it was dead-lettered
/// and no running worker's peak memory reached the entry's size (each
/// cuts entries inside Redis before reading them).
pub(super) async fn oversize(h: &Harness) -> Result<Injection> {
    const SIZE: usize = 64 << 20;
    let big = vec![b'x'; SIZE];
    let caller = Fault::OversizeEntry.caller().as_bytes();
    let id = h
        .xadd_raw("*", &[("slot", &big), ("caller", caller)])
        .await?;
    drop(big);
    let expect = Expect::Dead("bad_message");
    let slot = Some("<64 MiB>".to_owned());
    h.added(Fault::OversizeEntry, expect, [(Some(id.clone()), slot)]);
    let seen = watch_dead_letter(h, &id).await;
    let peak = h.workers_peak_rss_mib();
    Ok(Injection::new(
        HashSet::new(),
        format!("64 MiB entry {id}: dead letter seen {seen}, workers' peak RSS {peak:.0} MiB"),
        seen && peak < (SIZE >> 20) as f64,
    ))
}

/// [`crate::scenario::Ev::FutureDelivery`].
pub(super) async fn future_delivery(h: &Harness, kind: usize) -> Result<Injection> {
    let day: chrono::NaiveDate = h.stack.day.parse()?;
    let tomorrow = day.succ_opt().context("a day after")?;
    let key = format!("{}:{tomorrow}:1", h.sc.kinds[kind].name);
    let id = h
        .xadd(&[("slot", &key), ("caller", Fault::FutureDelivery.caller())])
        .await?;
    h.added(
        Fault::FutureDelivery,
        Expect::NotDue,
        [(Some(id.clone()), Some(key.clone()))],
    );
    Ok(Injection::new(
        HashSet::from([key.clone()]),
        format!("delivered {key}, a day that has not come: entry {id}"),
        true,
    ))
}

/// Looks for the dead letter of entry `id` for up to 10 s and keeps it.
async fn watch_dead_letter(h: &Harness, id: &str) -> bool {
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        if let Ok(page) = h.stack.dead_letters().await {
            for e in page {
                let fields = stream_fields(&e.map);
                if fields.get("entry_id").map(String::as_str) == Some(id) {
                    h.records.lock().unwrap().dead_seen.push(fields);
                    return true;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}

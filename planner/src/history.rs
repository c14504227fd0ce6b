//! `planner audit --with-history`: what Postgres knows of each audited
//! slotgate config's kinds — the numbers its times were given, and which of
//! today's slots of the times no longer configured already ran — so the
//! audit can warn before an edit moves a slot that already ran (DESIGN
//! 4.18, rule `slotgate-moves-run-slot`).

use chrono::{DateTime, Utc};
use slotgate::config::Config;
use slotgate::outcome::SlotState;
use slotgate::slot::local_today;
use slotgate::store;
use slotgate_audit::{HistorySource, KindHistory};
use std::collections::HashMap;
use std::sync::Arc;

/// A [`HistorySource`] reading `pool` as of `now`. The audit is
/// synchronous; each lookup blocks this (multi-threaded) runtime's worker
/// on the two reads. A failed read is said on stderr and the rule skipped
/// for that config: the rest of the audit stands.
pub fn source(pool: sqlx::PgPool, now: DateTime<Utc>) -> HistorySource {
    HistorySource(Arc::new(move |config: &Config| {
        let handle = tokio::runtime::Handle::current();
        let read = tokio::task::block_in_place(|| handle.block_on(history(&pool, config, now)));
        read.unwrap_or_else(|e| {
            eprintln!(
                "planner audit: {}: cannot read the slot history from Postgres ({e}); rule slotgate-moves-run-slot skipped",
                config.path.display()
            );
            HashMap::new()
        })
    }))
}

async fn history(
    pool: &sqlx::PgPool,
    config: &Config,
    now: DateTime<Utc>,
) -> Result<HashMap<String, KindHistory>, sqlx::Error> {
    let kinds: Vec<(&str, &[chrono::NaiveTime])> = config
        .kinds
        .iter()
        .map(|k| (k.name.as_str(), k.slots.as_slice()))
        .collect();
    let names: Vec<&str> = kinds.iter().map(|(k, _)| *k).collect();
    let mut stored = store::stored_numbers(pool, &names).await?;
    let numbering = store::numbering_of(&kinds, &stored);
    let mut out = HashMap::new();
    for k in &config.kinds {
        let Some(numbered) = stored.remove(&k.name) else {
            continue;
        };
        let retired: Vec<i32> = numbering[&k.name]
            .retired
            .iter()
            .map(|(no, _)| *no as i32)
            .collect();
        let today = local_today(k.timezone, now);
        let ran_today = store::planned_with_numbers(pool, &k.name, &[today], &retired)
            .await?
            .into_iter()
            .filter_map(|(p, state)| {
                state
                    .filter(|s| *s != SlotState::Skipped)
                    .map(|s| (p.key.slot_no, s.as_str().to_owned()))
            })
            .collect();
        out.insert(
            k.name.clone(),
            KindHistory {
                numbered,
                ran_today,
            },
        );
    }
    Ok(out)
}

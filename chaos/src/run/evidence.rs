//! The run's evidence, gathered once it ended — the executions, the gate
//! rows, the drafts left, the ledger of Postgres changes, the queue's
//! residue and dead letters, the harness's own records, the CMS's calls
//! and (WordPress) the site's witness — and handed to the one judge.

use super::Harness;
use crate::judge::{self, Evidence, Exec, GateRow};
use crate::{ledger, scenario};
use anyhow::{Context, Result};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// Reads everything the judge weighs and judges it; `settled` is whether
/// the run settled before its deadline.
pub async fn judge(h: &Harness, settled: bool) -> Result<judge::Verdict> {
    if let Some(site) = &h.site {
        super::wordpress::verify(h, site).await?;
    }
    let pool = &h.stack.kit.pool;
    let executions: Vec<Exec> = sqlx::query_as::<
        _,
        (
            String,
            String,
            Option<String>,
            String,
            Option<String>,
            serde_json::Value,
        ),
    >(
        "SELECT slot_key, caller, entry_id, outcome, reason, detail FROM execution WHERE id > $1 ORDER BY id",
    )
    .bind(h.exec_floor)
    .fetch_all(pool)
    .await
    .context("reading executions")?
    .into_iter()
    .map(
        |(slot_key, caller, entry_id, outcome, reason, detail)| Exec {
            slot_key,
            caller,
            entry_id,
            outcome,
            reason,
            detail,
        },
    )
    .collect();
    let rows: HashMap<String, GateRow> =
        sqlx::query_as::<_, (String, String, i32, String, Option<String>, Option<i64>)>(
            "SELECT kind, day::text, slot, state, reason, post_id FROM publish_slot WHERE kind = ANY($1)",
        )
        .bind(&h.kind_names)
        .fetch_all(pool)
        .await
        .context("reading gate rows")?
        .into_iter()
        .map(|(k, d, s, state, reason, post_id)| {
            (
                format!("{k}:{d}:{s}"),
                GateRow {
                    state,
                    reason,
                    post_id,
                },
            )
        })
        .collect();
    let ready_left: HashMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
        "SELECT kind, count(*) FROM draft WHERE status = 'ready' AND kind = ANY($1) GROUP BY kind",
    )
    .bind(&h.kind_names)
    .fetch_all(pool)
    .await?
    .into_iter()
    .collect();
    let events = ledger::read(pool, h.ledger_floor).await?;
    let names: HashSet<&str> = h.kind_names.iter().map(String::as_str).collect();
    let (facts, mut found) = ledger::judge(&events, &names);
    let drafts_publishing: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM draft WHERE status = 'publishing' AND kind = ANY($1)",
    )
    .bind(&h.kind_names)
    .fetch_one(pool)
    .await?;
    let residue = h.stack.residue().await?;
    let dead: Vec<HashMap<String, String>> = h
        .stack
        .dead_letters()
        .await?
        .iter()
        .map(|id| super::stream_fields(&id.map))
        .collect();
    let kind_index: HashMap<&str, usize> =
        h.sc.kinds
            .iter()
            .enumerate()
            .map(|(i, k)| (k.name.as_str(), i))
            .collect();
    let planned = h.planned();
    let plan = planned
        .iter()
        .map(|p| (p.slot.clone(), kind_index[p.kind.as_str()]))
        .collect();
    let (faults, deliveries, wipes, dead_seen) = {
        let r = h.records.lock().unwrap();
        found.extend(r.found.iter().cloned());
        (
            r.faults.clone(),
            r.deliveries.clone(),
            r.wipes.clone(),
            r.dead_seen.clone(),
        )
    };
    let ev = Evidence {
        kinds: &h.sc.kinds,
        plan,
        due: planned.iter().map(|p| (p.slot.clone(), p.due_at)).collect(),
        executions,
        rows,
        drafts_publishing,
        ready_left,
        calls: h.stack.cms.calls(),
        http_timeout: Duration::from_millis(scenario::HTTP_TIMEOUT_MS),
        probe: h.sc.probe,
        webhook_log: h.webhook.log(),
        scheduled: h.sc.events.iter().map(|e| e.fault()).collect(),
        faults,
        deliveries,
        wipes,
        residue,
        cms_in_flight: h.stack.cms.in_flight(),
        dead,
        dead_seen,
        settled,
        ledger: facts,
        found,
        wordpress: match &h.site {
            Some(site) => Some(site.witness(h).await?),
            None => None,
        },
    };
    Ok(judge::judge(&ev))
}

//! `schedule-edit`: the operator edits a kind's schedule mid-run — a new
//! time inserted at the front, a slot not yet due taken out — runs
//! `planner plan` and restarts the workers with the new config, one by one.
//! Every other slot keeps its key, the removed one is cancelled, the new
//! one runs once.

use super::{Harness, Injection};
use crate::model::{Class, PlanSlot, Violation};
use crate::scenario::Target;
use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use std::collections::HashSet;
use std::time::Duration;

/// `schedule-edit`: rewrites the config with `kind`'s schedule edited,
/// runs `planner plan` with it and restarts the workers one by one
/// (SIGTERM, then the same id with the new config). Verified: the plan
/// cancelled the removed slot, planned exactly one new slot (number
/// `slots + 1`, the new time), and every other slot kept its key.
pub(super) async fn schedule_edit(
    h: &Harness,
    kind: usize,
    removed: u32,
    added_s: u64,
) -> Result<Injection> {
    #[derive(Deserialize)]
    struct Entry {
        slot: String,
        kind: String,
        due_at: DateTime<Utc>,
    }
    #[derive(Deserialize)]
    struct Gone {
        slot: String,
        fate: String,
    }
    #[derive(Deserialize)]
    struct Planned {
        slots: Vec<Entry>,
        unscheduled: Vec<Gone>,
    }
    let k = &h.sc.kinds[kind];
    let removed_key = h.sc.target_key(
        Target {
            kind,
            slot_no: removed,
        },
        &h.stack.day,
    );
    let added_key = format!("{}:{}:{}", k.name, h.stack.day, k.offsets.len() + 1);
    h.stack.write_edited_config(&h.sc, kind, removed, added_s)?;
    let out = h
        .stack
        .planner_ok(&["plan", "--day", &h.stack.day, "--json"])
        .await?;
    let p: Planned = serde_json::from_str(out.trim()).context("plan --json output")?;
    // New is judged against the run's own plan, not by the `new` flag: a
    // `pg-terminate` can end the planner after it committed the new slot,
    // and the retry (`Stack::planner`) then reports it as already there.
    let planned: HashSet<&str> = h.plan.iter().map(|e| e.slot.as_str()).collect();
    let new: Vec<&Entry> = p
        .slots
        .iter()
        .filter(|e| !planned.contains(e.slot.as_str()))
        .collect();
    let before: HashSet<&str> = planned
        .iter()
        .copied()
        .filter(|s| *s != removed_key)
        .collect();
    let kept: HashSet<&str> = p
        .slots
        .iter()
        .map(|e| e.slot.as_str())
        .filter(|s| planned.contains(s))
        .collect();
    let cancelled = p
        .unscheduled
        .iter()
        .any(|g| g.slot == removed_key && g.fate == "cancelled");
    let one_new = new.len() == 1 && new[0].slot == added_key;
    if let Some(e) = new.first() {
        h.planned_later.lock().unwrap().push(PlanSlot {
            slot: e.slot.clone(),
            kind: e.kind.clone(),
            due_at: e.due_at,
        });
    }
    // The workers read the config at start: one by one, so the others
    // keep running meanwhile.
    let mut restarted = 0;
    let workers = h.workers.lock().unwrap().len();
    for idx in 0..workers {
        let taken = {
            let mut w = h.workers.lock().unwrap();
            let s = &mut w[idx];
            // A worker another fault took down is left to that fault's
            // restart (which reads the new config too).
            match s.proc.take() {
                Some(p) => {
                    s.gen += 1;
                    Some((p, s.id.clone(), s.gen))
                }
                None => None,
            }
        };
        let Some((mut proc, id, gen)) = taken else {
            continue;
        };
        let status = tokio::task::spawn_blocking(move || {
            let st = proc.terminate(Duration::from_secs(15));
            if st.is_none() {
                let _ = proc.kill_9();
            }
            (st, proc.name.clone())
        })
        .await?;
        if !status.0.is_some_and(|s| s.success()) {
            h.found(Violation::new(
                Class::WorkerExit,
                None,
                format!(
                    "worker {} did not exit cleanly on SIGTERM for the schedule edit: {:?}",
                    status.1, status.0
                ),
            ));
        }
        let mut w = h.workers.lock().unwrap();
        let s = &mut w[idx];
        if s.gen == gen && s.proc.is_none() {
            s.proc = Some(h.stack.spawn_worker(&format!("{id}e"), &id, s.clock_ahead));
            restarted += 1;
        }
    }
    let verified = cancelled && one_new && kept == before;
    Ok(Injection::new(
        HashSet::from([removed_key.clone(), added_key.clone()]),
        format!(
            "{}: time +{added_s}s inserted in front, {removed_key} removed; plan: {removed_key} cancelled {cancelled}, new {:?}, {} of {} other keys kept; {restarted} workers restarted with the new config",
            k.name,
            new.iter().map(|e| e.slot.as_str()).collect::<Vec<_>>(),
            kept.intersection(&before).count(),
            before.len()
        ),
        verified,
    ))
}

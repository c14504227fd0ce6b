//! Running a scenario: plan, start workers, inject the seeded faults —
//! each one verified to have happened, or the run cannot be judged — and
//! settle.
//!
//! This file is the harness's core: [`Harness::start`], the watchers of
//! the workers and of the slots' outcomes, the [`Records`] the judges
//! read, the helpers the faults share, [`Harness::drive`] (schedule,
//! settle, stop) and [`run_event`], which sends each scheduled event to its
//! family's file (and `evidence.rs` ([`evidence`]) reads what the judge
//! weighs once the run ended):
//!
//! - `duplicate.rs` ([`duplicate`]): `concurrent-dup`, `serial-dup`,
//!   `trigger-dup`, `redis-cli-xadd-dup`, `backfill-dup` (and the
//!   duplicates of `--sabotage skip-gate`);
//! - `process.rs` ([`process`]): `kill-9`, `kill-9-mid-webhook`,
//!   `leader-sigstop`, `clock-ahead`;
//! - `store.rs` ([`store`]): `redis-prefix-wipe`, `pg-terminate`,
//!   `redis-master-failover`, `sentinel-failover`, `pg-failover`;
//! - `quota.rs` ([`quota`]): `quota-held`, `stall-burst`;
//! - `entry.rs` ([`entry`]): `malformed`, `poison-entry`,
//!   `oversize-entry`, `future-delivery`;
//! - `cms.rs` ([`cms`]): `redirect`, `cms-late`,
//!   `webhook-held-before-apply`;
//! - `edit.rs` ([`edit`]): `schedule-edit`;
//! - `wordpress.rs` ([`wordpress`]): the WordPress scenario's site and its
//!   faults, `wp-applied-lost`, `wp-kill-mid-write`, `wp-held-before-save`,
//!   `editor-draft`, `editor-trash`, `editor-delete` (its duplicates are
//!   [`duplicate`]'s).
//!
//! A scenario's events run each at its own time, concurrently, or (the
//! WordPress scenario's, [`Scenario::in_order`]) one after another.

mod cms;
pub mod duplicate;
mod edit;
mod entry;
pub mod evidence;
mod process;
mod quota;
mod store;
pub mod wordpress;

use crate::model::{Class, Delivery, Expect, Fault, FaultRecord, PlanSlot, Violation};
use crate::scenario::{Ev, Scenario};
use crate::stack::Stack;
use crate::webhook::WebhookChaos;
use anyhow::{bail, Result};
use chaos_sabotage::Sabotage;
use chrono::{DateTime, Utc};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::process::Proc;
use tokio::sync::watch;

/// Runs a harness XADD, waiting while another fault has poisoned the
/// stream (a top-of-space id, another type): slotgate's next writer repairs
/// it within about a second, and a `redis-cli` user would retry too.
async fn while_poisoned<T, F, Fut>(mut add: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match add().await {
            Err(e)
                if Instant::now() < deadline && {
                    let m = format!("{e:#}");
                    m.contains("exhausted the last possible ID") || m.contains("WRONGTYPE")
                } =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            r => return r,
        }
    }
}

/// What one injection did.
struct Injection {
    affected: HashSet<String>,
    what: String,
    verified: bool,
    /// Its trace can only be seen after the run, when it is verified
    /// (`wp-held-before-save`'s late save).
    later: bool,
}

impl Injection {
    fn new(affected: HashSet<String>, what: String, verified: bool) -> Injection {
        Injection {
            affected,
            what,
            verified,
            later: false,
        }
    }
}

/// What the run recorded, for the judges.
#[derive(Default)]
pub struct Records {
    pub faults: Vec<FaultRecord>,
    pub deliveries: Vec<Delivery>,
    pub wipes: Vec<Instant>,
    pub notes: Vec<String>,
    /// Dead letters seen right after a malformed injection was handled
    /// (a later wipe may delete `P:dead`).
    pub dead_seen: Vec<HashMap<String, String>>,
    /// Violations seen while running (workers that exited by themselves).
    pub found: Vec<Violation>,
}

struct WorkerSlot {
    idx: usize,
    gen: u32,
    id: String,
    proc: Option<Proc>,
    /// Runs under faketime, its clock ahead (`clock-ahead`).
    clock_ahead: bool,
}

/// One run: its scenario and stack, the workers it started, the slots'
/// outcomes as it watches them, and what it recorded. Shared (`Arc`) by
/// the schedule's tasks, the watchers and the restarts a kill schedules.
pub struct Harness {
    pub sc: Scenario,
    pub stack: Stack,
    pub plan: Vec<PlanSlot>,
    /// Slots planned after the start (`schedule-edit`'s new time).
    planned_later: Mutex<Vec<PlanSlot>>,
    due: HashMap<String, DateTime<Utc>>,
    /// Monotonic instant of the window's start (`stack.base`).
    pub t0: Instant,
    workers: Mutex<Vec<WorkerSlot>>,
    terminal: watch::Receiver<Arc<HashSet<String>>>,
    terminal_tx: watch::Sender<Arc<HashSet<String>>>,
    pub records: Mutex<Records>,
    pub webhook: WebhookChaos,
    /// This run's kinds (a reused database may hold other runs' rows).
    pub kind_names: Vec<String>,
    /// Executions with a larger id are this run's.
    pub exec_floor: i64,
    /// Ledger events with a larger id are this run's.
    pub ledger_floor: i64,
    /// `--cms wordpress`: the WordPress the kinds publish to.
    pub site: Option<wordpress::Site>,
}

impl Harness {
    /// Sets the run up: config, migrations, drafts, plan, workers; the
    /// kinds at the stand-in CMS, or at `site`'s WordPress.
    pub async fn start(
        sc: Scenario,
        mut stack: Stack,
        workers: usize,
        site: Option<wordpress::Site>,
    ) -> Result<Arc<Harness>> {
        let webhook = WebhookChaos::new(sc.seed, sc.webhook);
        stack.cms.set_chooser(Some(webhook.chooser()));
        if sc.probe && !sc.probe_contract_broken {
            stack.cms.follow_probe_contract(Duration::from_millis(
                crate::scenario::PROBE_APPLY_AFTER_MS,
            ));
        }
        let lead = Duration::from_secs(4);
        match &site {
            Some(site) => site.write_config(&mut stack, &sc, lead)?,
            None => stack.write_config(&sc, lead)?,
        }
        stack.planner_ok(&["migrate"]).await?;
        if site.is_some() {
            stack.planner_ok(&["check"]).await?;
        }
        // The ledger sees every change from the drafts' import on.
        crate::ledger::install(&stack.kit.pool).await?;
        let ledger_floor = crate::ledger::floor(&stack.kit.pool).await?;
        let exec_floor: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM execution")
            .fetch_one(&stack.kit.pool)
            .await?;
        // Each draft's body is a token of the harness's own, so the judge
        // knows drafts without reading slotgate's tables (the WordPress
        // site's drafts are known by their titles).
        let drafts: Vec<serde_json::Value> = match &site {
            Some(site) => site.drafts(),
            None => sc
                .kinds
                .iter()
                .flat_map(|k| {
                    (0..k.drafts).map(|i| {
                        serde_json::json!({
                            "kind": k.name,
                            "title": format!("{} #{i}", k.name),
                            "body": crate::stack::draft_token(&k.name, i),
                        })
                    })
                })
                .collect(),
        };
        stack.import_drafts(drafts).await?;
        let planned = stack.plan_day(sc.slots()).await?;
        let base_in = (stack.base - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        let t0 = Instant::now() + base_in;
        let due = planned.iter().map(|p| (p.slot.clone(), p.due_at)).collect();
        let (terminal_tx, terminal) = watch::channel(Arc::new(HashSet::new()));
        let h = Arc::new(Harness {
            plan: planned,
            planned_later: Mutex::new(Vec::new()),
            due,
            t0,
            workers: Mutex::new(Vec::new()),
            terminal,
            terminal_tx,
            records: Mutex::new(Records::default()),
            webhook,
            kind_names: sc.kinds.iter().map(|k| k.name.clone()).collect(),
            exec_floor,
            ledger_floor,
            sc,
            stack,
            site,
        });
        {
            let mut w = h.workers.lock().unwrap();
            for idx in 0..workers {
                let id = format!("w{}", idx + 1);
                // `clock-ahead`: the first worker (the likely leader) runs
                // with its wall clock ahead from the start.
                let clock_ahead = idx == 0
                    && h.sc
                        .events
                        .iter()
                        .any(|e| matches!(e, Ev::ClockAhead { .. }));
                let proc = h.stack.spawn_worker(&id, &id, clock_ahead);
                w.push(WorkerSlot {
                    idx,
                    gen: 1,
                    id,
                    proc: Some(proc),
                    clock_ahead,
                });
            }
        }
        let watcher = h.clone();
        tokio::spawn(async move { watcher.watch_terminal().await });
        let watcher = h.clone();
        tokio::spawn(async move { watcher.watch_workers().await });
        Ok(h)
    }

    /// A worker that exits without being killed is a violation (it is
    /// restarted so the run can still be judged). Stops with the run.
    async fn watch_workers(self: Arc<Self>) {
        while !self.terminal_tx.is_closed() {
            let exited: Vec<(usize, String, std::process::ExitStatus)> = {
                let mut w = self.workers.lock().unwrap();
                w.iter_mut()
                    .filter_map(|s| {
                        let st = s.proc.as_mut()?.child.try_wait().ok()??;
                        let name = s.proc.take()?.name.clone();
                        Some((s.idx, name, st))
                    })
                    .collect()
            };
            for (idx, name, st) in exited {
                self.found(Violation::new(
                    Class::WorkerExit,
                    None,
                    format!("worker {name} exited by itself ({st}); see its log"),
                ));
                self.restart(idx, format!("{name}r"));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    fn found(&self, v: Violation) {
        self.log(format!("VIOLATION {v}"));
        self.records.lock().unwrap().found.push(v);
    }

    /// `f` of worker slot `idx`'s process, if it still runs generation `gen`.
    fn with_worker<T>(&self, idx: usize, gen: u32, f: impl FnOnce(&Proc) -> T) -> Option<T> {
        let w = self.workers.lock().unwrap();
        let s = &w[idx];
        (s.gen == gen).then_some(s.proc.as_ref()).flatten().map(f)
    }

    /// Starts worker slot `idx` again (same id) under log name `log_name`.
    fn restart(&self, idx: usize, log_name: String) {
        let mut w = self.workers.lock().unwrap();
        let s = &mut w[idx];
        s.gen += 1;
        s.proc = Some(self.stack.spawn_worker(&log_name, &s.id, s.clock_ahead));
    }

    /// Seconds since the start of the window (negative before it).
    pub fn now_s(&self) -> f64 {
        let now = Instant::now();
        if now >= self.t0 {
            (now - self.t0).as_secs_f64()
        } else {
            -(self.t0 - now).as_secs_f64()
        }
    }

    pub fn log(&self, msg: impl AsRef<str>) {
        println!("[{:>+9.3}s] {}", self.now_s(), msg.as_ref());
    }

    fn note(&self, msg: String) {
        self.log(&msg);
        self.records.lock().unwrap().notes.push(msg);
    }

    fn record(&self, fault: Fault, i: Injection) {
        self.log(format!(
            "{:<20} {} ({} slot(s) in reach){}",
            fault.name(),
            i.what,
            i.affected.len(),
            match (i.verified, i.later) {
                (true, _) => "",
                (false, true) => " — verified after the run",
                (false, false) => " — NOT VERIFIED",
            }
        ));
        self.records.lock().unwrap().faults.push(FaultRecord {
            fault,
            affected: i.affected,
            injected: true,
            verified: i.verified,
        });
    }

    /// Records deliveries the harness added — (entry id, slot) each, all
    /// at this moment — and what must become of them.
    fn added(
        &self,
        fault: Fault,
        expect: Expect,
        entries: impl IntoIterator<Item = (Option<String>, Option<String>)>,
    ) {
        let at = Instant::now();
        let mut r = self.records.lock().unwrap();
        r.deliveries
            .extend(entries.into_iter().map(|(entry, slot)| Delivery {
                fault,
                entry,
                slot,
                at,
                expect,
            }));
    }

    /// Polls the gate table for slots with an outcome.
    async fn watch_terminal(&self) {
        loop {
            let kinds: Vec<&str> = self.kind_names.iter().map(String::as_str).collect();
            if let Ok(set) = self.stack.outcomes(&kinds).await {
                if set.len() != self.terminal.borrow().len() {
                    let _ = self.terminal_tx.send(Arc::new(set));
                }
            }
            if self.terminal_tx.is_closed() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    }

    pub fn terminal_count(&self) -> usize {
        self.terminal.borrow().len()
    }

    /// Whether `key` got an outcome by `until`.
    async fn wait_done(&self, key: &str, until: Instant) -> bool {
        let mut rx = self.terminal.clone();
        loop {
            if rx.borrow_and_update().contains(key) {
                return true;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            if tokio::time::timeout(left, rx.changed()).await.is_err() {
                return false;
            }
        }
    }

    /// Every slot planned so far: the start's plan and any planned later.
    pub fn planned(&self) -> Vec<PlanSlot> {
        let mut all = self.plan.clone();
        all.extend(self.planned_later.lock().unwrap().iter().cloned());
        all
    }

    /// Planned slots without an outcome that are due by `now + within`.
    fn open_due_within(&self, within: Option<Duration>) -> HashSet<String> {
        let limit = within.map(|w| Utc::now() + chrono::Duration::from_std(w).unwrap_or_default());
        let done = self.terminal.borrow().clone();
        self.planned()
            .iter()
            .filter(|p| !done.contains(&p.slot) && limit.is_none_or(|l| p.due_at <= l))
            .map(|p| p.slot.clone())
            .collect()
    }

    /// XADD of text fields, waiting out a poisoned stream ([`while_poisoned`]).
    async fn xadd(&self, fields: &[(&str, &str)]) -> Result<String> {
        let fields: Vec<(&str, &[u8])> = fields.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        while_poisoned(|| self.xadd_raw("*", &fields)).await
    }

    /// XADD with an explicit id and raw field values.
    async fn xadd_raw(&self, id: &str, fields: &[(&str, &[u8])]) -> Result<String> {
        let id = self.stack.xadd(id, fields).await?;
        if !is_entry_id(&id) {
            bail!("XADD answered {id:?}");
        }
        Ok(id)
    }

    /// Runs the schedule, lets the system settle, stops the workers and
    /// waits for calls still at the CMS; whether it settled.
    pub async fn drive(self: &Arc<Self>, settle: Duration, sabotage: Option<Sabotage>) -> bool {
        let window_end = self.t0 + self.sc.duration;
        let deadline = window_end + settle;
        if sabotage == Some(Sabotage::SkipGate) {
            let s = self.clone();
            tokio::spawn(async move {
                if let Err(e) = duplicate::sabotage(&s).await {
                    s.log(format!("sabotage duplicates failed: {e:#}"));
                }
            });
        }
        self.run_schedule(deadline).await;
        self.log("schedule done; waiting for the system to settle");
        let settled = self
            .settle(deadline.max(Instant::now() + Duration::from_secs(5)))
            .await;
        self.log(if settled {
            "settled; stopping workers"
        } else {
            "stopping workers"
        });
        self.stop_workers().await;
        // Calls answered late (held or slow) land before the ledger is read.
        let t = Instant::now();
        while self.stack.cms.in_flight() > 0 && t.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        settled
    }

    /// Runs every scheduled event, concurrently or in order
    /// ([`Scenario::in_order`]); returns when all are done or `until`.
    pub async fn run_schedule(self: &Arc<Self>, until: Instant) {
        let one = |ev: Ev| {
            let h = self.clone();
            async move {
                let fault = ev.fault();
                match run_event(&h, ev, until).await {
                    Ok(i) => h.record(fault, i),
                    Err(e) => {
                        h.note(format!("{}: COULD NOT INJECT: {e:#}", fault.name()));
                        h.records.lock().unwrap().faults.push(FaultRecord {
                            fault,
                            affected: HashSet::new(),
                            injected: false,
                            verified: false,
                        });
                    }
                }
            }
        };
        let all = async {
            if self.sc.in_order {
                for ev in self.sc.events.clone() {
                    one(ev).await;
                }
            } else {
                let mut set = tokio::task::JoinSet::new();
                for ev in self.sc.events.clone() {
                    set.spawn(one(ev));
                }
                while set.join_next().await.is_some() {}
            }
        };
        if tokio::time::timeout_at(until.into(), all).await.is_err() {
            // Their records say "not injected": the run cannot be judged.
            self.note("schedule: some events were still waiting at the deadline".into());
        }
    }

    async fn sleep_until_ms(&self, at_ms: u64) {
        tokio::time::sleep_until((self.t0 + Duration::from_millis(at_ms)).into()).await;
    }

    /// The highest peak RSS (MiB) of the workers running now.
    fn workers_peak_rss_mib(&self) -> f64 {
        self.workers
            .lock()
            .unwrap()
            .iter()
            .filter_map(|w| w.proc.as_ref()?.peak_rss_mib())
            .fold(0.0, f64::max)
    }

    /// Workers currently running.
    pub fn running(&self) -> usize {
        self.workers
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.proc.is_some())
            .count()
    }

    /// Waits until every planned slot has an outcome, nothing is queued and
    /// the CMS answered everything — twice in a row, a second apart.
    pub async fn settle(&self, until: Instant) -> bool {
        let mut stable = 0;
        let mut last_report = Instant::now();
        loop {
            let (len, pending, delayed) = self.stack.residue().await.unwrap_or((1, 1, 1));
            let done = self.terminal_count();
            let planned = self.planned().len();
            let quiet = done >= planned
                && len == 0
                && pending == 0
                && delayed == 0
                && self.stack.cms.in_flight() == 0
                && self.running() == self.workers.lock().unwrap().len();
            stable = if quiet { stable + 1 } else { 0 };
            if stable >= 3 {
                return true;
            }
            if Instant::now() >= until {
                self.note(format!(
                    "not settled by the deadline: {done}/{planned} slots with an outcome, stream {len} ({pending} pending), delayed {delayed}, CMS in flight {}",
                    self.stack.cms.in_flight()
                ));
                return false;
            }
            if last_report.elapsed() >= Duration::from_secs(10) {
                last_report = Instant::now();
                self.log(format!(
                    "settling: {done}/{planned} slots with an outcome, stream {len} ({pending} pending), delayed {delayed}"
                ));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// SIGTERM to every worker; waits for them (SIGKILL after 15 s).
    pub async fn stop_workers(&self) {
        let procs: Vec<Proc> = {
            let mut w = self.workers.lock().unwrap();
            w.iter_mut().filter_map(|s| s.proc.take()).collect()
        };
        let exits = tokio::task::spawn_blocking(move || {
            let mut procs = procs;
            testkit::process::terminate_all(&mut procs, Duration::from_secs(15))
        })
        .await
        .unwrap_or_default();
        for (n, st) in exits
            .iter()
            .filter(|(_, st)| !st.is_some_and(|s| s.success()))
        {
            let unclean = format!("worker {n} did not exit cleanly on SIGTERM: {st:?}");
            self.found(Violation::new(Class::WorkerExit, None, unclean));
        }
    }
}

/// Runs one scheduled event: waits for its time, when it has one of its
/// own (a duplicate's is its slot's), then injects it with its family's
/// function.
async fn run_event(h: &Arc<Harness>, ev: Ev, until: Instant) -> Result<Injection> {
    if let Some(at_ms) = ev.at_ms() {
        h.sleep_until_ms(at_ms).await;
    }
    match ev {
        Ev::ConcurrentDup {
            target,
            copies,
            offset_ms,
        } => duplicate::concurrent(h, target, copies, offset_ms).await,
        Ev::SerialDup {
            target,
            delay_ms,
            copies,
        } => duplicate::serial(h, target, delay_ms, copies, until).await,
        Ev::Trigger { target, delay_ms } => duplicate::trigger(h, target, delay_ms, until).await,
        Ev::Xadd { target, delay_ms } => duplicate::xadd(h, target, delay_ms, until).await,
        Ev::Backfill { kind, .. } => duplicate::backfill(h, kind, until).await,
        Ev::Kill {
            victim,
            restart_ms,
            reuse_id,
            ..
        } => process::kill9(h, victim, restart_ms, reuse_id).await,
        Ev::KillMidWebhook {
            hold_ms,
            restart_ms,
            reuse_id,
            ..
        } => process::kill9_mid_webhook(h, hold_ms, restart_ms, reuse_id).await,
        Ev::LeaderStop { pause_ms, .. } => process::stop_leader(h, pause_ms).await,
        Ev::ClockAhead { .. } => process::clock_ahead(h).await,
        Ev::RedisWipe { .. } => store::wipe(h).await,
        Ev::PgTerminate { .. } => store::pg_terminate(h).await,
        Ev::RedisMasterFailover { partition, .. } => store::cluster_failover(h, partition).await,
        Ev::SentinelFailover { .. } => store::sentinel_failover(h).await,
        Ev::PgFailover { .. } => store::pg_failover(h).await,
        Ev::QuotaHeld { kind, hold_ms, .. } => quota::hold(h, kind, hold_ms).await,
        Ev::StallBurst {
            kind,
            hold_ms,
            copies,
            ..
        } => quota::stall_burst(h, kind, hold_ms, copies).await,
        Ev::Malformed { what, .. } => entry::malformed(h, what).await,
        Ev::Poison { what, .. } => entry::poison(h, what).await,
        Ev::Oversize { .. } => entry::oversize(h).await,
        Ev::FutureDelivery { kind, .. } => entry::future_delivery(h, kind).await,
        Ev::Redirect { calls, .. } => cms::redirect(h, calls).await,
        Ev::CmsLate { calls, .. } => cms::late(h, calls).await,
        Ev::HeldBeforeApply {
            hold_ms,
            takeover,
            restart_ms,
            reuse_id,
            ..
        } => {
            let takeover = takeover.then_some((restart_ms, reuse_id));
            cms::held_before_apply(h, hold_ms, takeover).await
        }
        Ev::ScheduleEdit {
            kind,
            removed,
            added_s,
            ..
        } => edit::schedule_edit(h, kind, removed, added_s).await,
        Ev::WordPress { fault, .. } => wordpress::inject(h, fault, until).await,
    }
}

/// `<ms>-<seq>`, as Redis answers XADD, or `<ms>-<seq>@<partition>` as
/// an entry of a partition past 0 is recorded (and `planner trigger`
/// prints it).
fn is_entry_id(id: &str) -> bool {
    let id = match id.split_once('@') {
        Some((id, p)) if !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()) => id,
        Some(_) => return false,
        None => id,
    };
    id.split_once('-').is_some_and(|(a, b)| {
        !a.is_empty() && !b.is_empty() && a.bytes().chain(b.bytes()).all(|c| c.is_ascii_digit())
    })
}

/// A stream entry's fields as strings.
pub fn stream_fields(map: &HashMap<String, redis::Value>) -> HashMap<String, String> {
    map.iter()
        .filter_map(|(k, v)| {
            redis::from_redis_value::<String>(v)
                .ok()
                .map(|s| (k.clone(), s))
        })
        .collect()
}

//! Running a scenario: plan, start workers, inject the seeded faults —
//! each one verified to have happened, or the run cannot be judged — and
//! settle.

use crate::model::{Class, Delivery, Expect, Fault, FaultRecord, PlanSlot, Violation};
use crate::scenario::{Ev, Malformed, Poison, Scenario, Target, CMS_LATE_BY_MS, HTTP_TIMEOUT_MS};
use crate::stack::{Stack, CLOCK_AHEAD};
use crate::webhook::WebhookChaos;
use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
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

/// How often a kill fault chooses again when another fault (a kill of its
/// own, running concurrently) took its worker first.
const KILL_TRIES: usize = 5;

/// What one injection did.
struct Injection {
    affected: HashSet<String>,
    what: String,
    verified: bool,
}

impl Injection {
    fn new(affected: HashSet<String>, what: String, verified: bool) -> Injection {
        Injection {
            affected,
            what,
            verified,
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
}

fn slot_parts(key: &str) -> Option<(&str, &str, i32)> {
    let mut it = key.rsplitn(3, ':');
    let no = it.next()?.parse().ok()?;
    let day = it.next()?;
    let kind = it.next()?;
    Some((kind, day, no))
}

impl Harness {
    /// Sets the run up: config, migrations, drafts, plan, workers.
    pub async fn start(sc: Scenario, mut stack: Stack, workers: usize) -> Result<Arc<Harness>> {
        let webhook = WebhookChaos::new(sc.seed, sc.webhook);
        stack.cms.set_chooser(Some(webhook.chooser()));
        if sc.probe && !sc.probe_contract_broken {
            stack.cms.follow_probe_contract(Duration::from_millis(
                crate::scenario::PROBE_APPLY_AFTER_MS,
            ));
        }
        stack.write_config(&sc, Duration::from_secs(4))?;
        stack.planner_ok(&["migrate"]).await?;
        // The ledger sees every change from the drafts' import on.
        crate::ledger::install(&stack.pool).await?;
        let ledger_floor = crate::ledger::floor(&stack.pool).await?;
        let exec_floor: i64 = sqlx::query_scalar("SELECT coalesce(max(id), 0) FROM execution")
            .fetch_one(&stack.pool)
            .await?;
        let drafts = stack.write_drafts(&sc)?;
        stack
            .planner_ok(&[
                "drafts",
                "import",
                drafts.to_str().unwrap_or("drafts.jsonl"),
            ])
            .await?;
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
            if i.verified { "" } else { " — NOT VERIFIED" }
        ));
        self.records.lock().unwrap().faults.push(FaultRecord {
            fault,
            affected: i.affected,
            injected: true,
            verified: i.verified,
        });
    }

    fn add_delivery(&self, d: Delivery) {
        self.records.lock().unwrap().deliveries.push(d);
    }

    /// Polls the gate table for slots with an outcome.
    async fn watch_terminal(&self) {
        loop {
            let rows: Result<Vec<(String, String, i32)>, _> = sqlx::query_as(
                "SELECT kind, day::text, slot FROM publish_slot WHERE state IN ('published', 'skipped', 'failed') AND kind = ANY($1)",
            )
            .bind(&self.kind_names)
            .fetch_all(&self.stack.pool)
            .await;
            if let Ok(rows) = rows {
                let set: HashSet<String> = rows
                    .into_iter()
                    .map(|(k, d, s)| format!("{k}:{d}:{s}"))
                    .collect();
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

    fn is_done(&self, key: &str) -> bool {
        self.terminal.borrow().contains(key)
    }

    /// Waits for `key` to finish, then `delay_ms` more: the moment a serial
    /// or cross-caller duplicate of a finished slot is injected.
    async fn after_finished(&self, key: &str, until: Instant, delay_ms: u64) -> Result<()> {
        if !self.wait_done(key, until).await {
            bail!("{key} never finished");
        }
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        Ok(())
    }

    /// Records a duplicate delivery of an already finished slot.
    fn add_duplicate(&self, fault: Fault, entry: Option<String>, key: &str) {
        self.add_delivery(Delivery {
            fault,
            entry,
            slot: Some(key.to_owned()),
            at: Instant::now(),
            expect: Expect::Taken,
        });
    }

    /// A copy of `key` added (as `entry`, by `how`) `delay_ms` after the
    /// slot finished: recorded as one the gate must turn away, and
    /// described so.
    fn late_duplicate(
        &self,
        fault: Fault,
        key: &str,
        entry: String,
        how: &str,
        delay_ms: u64,
    ) -> Injection {
        self.add_duplicate(fault, Some(entry.clone()), key);
        Injection::new(
            HashSet::from([key.to_owned()]),
            format!("{how} {key}, {delay_ms} ms after it finished: entry {entry}"),
            true,
        )
    }

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

    /// Open slots claimed by a worker.
    async fn claimed_by(&self, worker: &str) -> HashSet<String> {
        sqlx::query_as::<_, (String, String, i32)>(
            "SELECT kind, day::text, slot FROM publish_slot WHERE claimed_by = $1 AND state IN ('claimed', 'publishing') AND kind = ANY($2)",
        )
        .bind(worker)
        .bind(&self.kind_names)
        .fetch_all(&self.stack.pool)
        .await
        .unwrap_or_default()
        .into_iter()
        .map(|(k, d, s)| format!("{k}:{d}:{s}"))
        .collect()
    }

    fn instant_of(&self, at: DateTime<Utc>) -> Instant {
        let now_w = Utc::now();
        let now_i = Instant::now();
        match (at - now_w).to_std() {
            Ok(d) => now_i + d,
            Err(_) => now_i,
        }
    }

    fn key_of(&self, t: Target) -> String {
        self.sc.target_key(t, &self.stack.day)
    }

    async fn xadd(&self, fields: &[(&str, &str)]) -> Result<String> {
        let fields: Vec<(&str, &[u8])> = fields.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        while_poisoned(|| self.xadd_raw("*", &fields)).await
    }

    /// XADD with an explicit id and raw field values.
    async fn xadd_raw(&self, id: &str, fields: &[(&str, &[u8])]) -> Result<String> {
        let mut c = self.stack.redis.clone();
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.stack.ready()).arg(id);
        for (k, v) in fields {
            cmd.arg(*k).arg(*v);
        }
        let id: String = cmd.query_async(&mut c).await?;
        if !is_entry_id(&id) {
            bail!("XADD answered {id:?}");
        }
        Ok(id)
    }

    /// Runs every scheduled event; returns when all are done or `until`.
    pub async fn run_schedule(self: &Arc<Self>, until: Instant) {
        let mut set = tokio::task::JoinSet::new();
        for ev in self.sc.events.clone() {
            let h = self.clone();
            set.spawn(async move {
                let fault = ev.fault();
                match h.run_event(ev, until).await {
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
            });
        }
        let all = async { while set.join_next().await.is_some() {} };
        if tokio::time::timeout_at(until.into(), all).await.is_err() {
            // Their records say "not injected": the run cannot be judged.
            self.note("schedule: some events were still waiting at the deadline".into());
        }
    }

    async fn sleep_until_ms(&self, at_ms: u64) {
        tokio::time::sleep_until((self.t0 + Duration::from_millis(at_ms)).into()).await;
    }

    async fn run_event(self: &Arc<Self>, ev: Ev, until: Instant) -> Result<Injection> {
        Ok(match ev {
            Ev::ConcurrentDup {
                target,
                copies,
                offset_ms,
            } => {
                self.inject_concurrent_dup(target, copies, offset_ms)
                    .await?
            }
            Ev::SerialDup {
                target,
                delay_ms,
                copies,
            } => {
                self.inject_serial_dup(target, delay_ms, copies, until)
                    .await?
            }
            Ev::Trigger { target, delay_ms } => {
                self.inject_trigger(target, delay_ms, until).await?
            }
            Ev::Xadd { target, delay_ms } => self.inject_xadd(target, delay_ms, until).await?,
            Ev::Backfill { at_ms, kind } => {
                self.sleep_until_ms(at_ms).await;
                self.backfill(kind, until).await?
            }
            Ev::Kill {
                at_ms,
                victim,
                restart_ms,
                reuse_id,
            } => {
                self.inject_kill(at_ms, victim, restart_ms, reuse_id)
                    .await?
            }
            Ev::KillMidWebhook {
                at_ms,
                hold_ms,
                restart_ms,
                reuse_id,
            } => {
                self.inject_kill_mid_webhook(at_ms, hold_ms, restart_ms, reuse_id)
                    .await?
            }
            Ev::LeaderStop { at_ms, pause_ms } => {
                self.sleep_until_ms(at_ms).await;
                self.stop_leader(pause_ms).await?
            }
            Ev::RedisWipe { at_ms } => {
                self.sleep_until_ms(at_ms).await;
                let affected = self.open_due_within(None);
                let n = self.stack.wipe_prefix().await?;
                self.records.lock().unwrap().wipes.push(Instant::now());
                Injection::new(
                    affected,
                    format!("deleted {n} key(s) of prefix {}", self.stack.prefix),
                    n > 0,
                )
            }
            Ev::PgTerminate { at_ms } => self.inject_pg_terminate(at_ms).await?,
            Ev::Malformed { at_ms, what } => self.inject_malformed(at_ms, what).await?,
            Ev::Poison { at_ms, what } => {
                self.sleep_until_ms(at_ms).await;
                self.poison(what).await?
            }
            Ev::QuotaHeld {
                at_ms,
                kind,
                hold_ms,
            } => {
                self.sleep_until_ms(at_ms).await;
                self.hold_quota(kind, hold_ms).await?
            }
            Ev::Redirect { at_ms, calls } => {
                self.sleep_until_ms(at_ms).await;
                let moved = self.stack.cms.url("/moved");
                let reply =
                    testkit::cms::Reply::StatusWith(301, vec![("location".into(), moved.clone())]);
                self.answer_next(calls, reply, format!("answered 301 (location {moved})"))
                    .await?
            }
            Ev::Oversize { at_ms } => {
                self.sleep_until_ms(at_ms).await;
                self.oversize().await?
            }
            Ev::StallBurst {
                at_ms,
                kind,
                hold_ms,
                copies,
            } => {
                self.sleep_until_ms(at_ms).await;
                self.stall_burst(kind, hold_ms, copies).await?
            }
            Ev::ScheduleEdit {
                at_ms,
                kind,
                removed,
                added_s,
            } => {
                self.sleep_until_ms(at_ms).await;
                self.schedule_edit(kind, removed, added_s).await?
            }
            Ev::CmsLate { at_ms, calls } => {
                self.sleep_until_ms(at_ms).await;
                let late = Duration::from_millis(HTTP_TIMEOUT_MS + CMS_LATE_BY_MS);
                let reply = testkit::cms::Reply::Delay(late, 200);
                let what = format!("answered after {late:?} (timeout {HTTP_TIMEOUT_MS} ms)");
                self.answer_next(calls, reply, what).await?
            }
            Ev::FutureDelivery { at_ms, kind } => self.inject_future_delivery(at_ms, kind).await?,
            Ev::ClockAhead { at_ms } => {
                self.sleep_until_ms(at_ms).await;
                self.clock_ahead_worker().await?
            }
            Ev::RedisMasterFailover { at_ms, partition } => {
                self.sleep_until_ms(at_ms).await;
                let affected = self.open_due_within(Some(Duration::from_secs(5)));
                let (what, verified) = self.stack.fail_over(partition).await?;
                // Replication is asynchronous: writes the killed master took
                // but had not passed on are gone, as in a wipe of its
                // shard. Entries the harness added before are judged as
                // after a wipe (handled, or dropped with it); slots are
                // judged as always (Postgres has them; the reconciler
                // queues them again).
                self.records.lock().unwrap().wipes.push(Instant::now());
                Injection::new(affected, what, verified)
            }
            Ev::SentinelFailover { at_ms } => {
                self.sleep_until_ms(at_ms).await;
                let affected = self.open_due_within(Some(Duration::from_secs(5)));
                let (what, verified) = self.stack.sentinel_fail_over().await?;
                // Replication is asynchronous here too: judged as after a
                // wipe, as a Cluster master's failover is.
                self.records.lock().unwrap().wipes.push(Instant::now());
                Injection::new(affected, what, verified)
            }
            Ev::PgFailover { at_ms } => {
                self.sleep_until_ms(at_ms).await;
                self.pg_failover().await?
            }
            Ev::HeldBeforeApply {
                at_ms,
                hold_ms,
                takeover,
                restart_ms,
                reuse_id,
            } => {
                self.sleep_until_ms(at_ms).await;
                self.held_before_apply(hold_ms, takeover.then_some((restart_ms, reuse_id)))
                    .await?
            }
        })
    }

    /// [`Ev::ConcurrentDup`].
    async fn inject_concurrent_dup(
        self: &Arc<Self>,
        target: Target,
        copies: u32,
        offset_ms: i64,
    ) -> Result<Injection> {
        let key = self.key_of(target);
        let due = self.due[&key];
        let at = due + chrono::Duration::milliseconds(offset_ms);
        tokio::time::sleep_until(self.instant_of(at).into()).await;
        let after_done = self.is_done(&key);
        let mut p = redis::pipe();
        for _ in 0..copies {
            p.cmd("XADD")
                .arg(self.stack.ready())
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
            let mut c = self.stack.redis.clone();
            Ok(p.query_async(&mut c).await?)
        })
        .await?;
        let now = Instant::now();
        for id in &ids {
            self.add_delivery(Delivery {
                fault: Fault::ConcurrentDup,
                entry: Some(id.clone()),
                slot: Some(key.clone()),
                at: now,
                expect: if after_done {
                    Expect::Taken
                } else {
                    Expect::Any
                },
            });
        }
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

    /// [`Ev::SerialDup`].
    async fn inject_serial_dup(
        self: &Arc<Self>,
        target: Target,
        delay_ms: u64,
        copies: u32,
        until: Instant,
    ) -> Result<Injection> {
        let key = self.key_of(target);
        self.after_finished(&key, until, delay_ms).await?;
        let mut ids = Vec::new();
        for i in 0..copies {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let id = self
                .xadd(&[("slot", &key), ("caller", Fault::SerialDup.caller())])
                .await?;
            self.add_duplicate(Fault::SerialDup, Some(id.clone()), &key);
            ids.push(id);
        }
        Ok(Injection::new(
            HashSet::from([key.clone()]),
            format!("{key} x{copies}, {delay_ms} ms after it finished: entries {ids:?}"),
            true,
        ))
    }

    /// [`Ev::Trigger`].
    async fn inject_trigger(
        self: &Arc<Self>,
        target: Target,
        delay_ms: u64,
        until: Instant,
    ) -> Result<Injection> {
        let key = self.key_of(target);
        self.after_finished(&key, until, delay_ms).await?;
        let kind = &self.sc.kinds[target.kind].name;
        let no = target.slot_no.to_string();
        let (ok, out, err) = self
            .stack
            .planner(&[
                "trigger",
                "--kind",
                kind,
                "--day",
                &self.stack.day,
                "--slot",
                &no,
            ])
            .await?;
        if !ok {
            bail!("planner trigger {key}: {}", err.trim());
        }
        let entry = out
            .split("(entry ")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .map(str::to_owned)
            .filter(|id| is_entry_id(id));
        let Some(entry) = entry else {
            bail!("planner trigger printed no entry id: {out:?}");
        };
        Ok(self.late_duplicate(Fault::TriggerDup, &key, entry, "planner trigger", delay_ms))
    }

    /// [`Ev::Xadd`].
    async fn inject_xadd(
        self: &Arc<Self>,
        target: Target,
        delay_ms: u64,
        until: Instant,
    ) -> Result<Injection> {
        let key = self.key_of(target);
        self.after_finished(&key, until, delay_ms).await?;
        let stream = self.stack.ready();
        let caller = Fault::XaddDup.caller();
        let out = tokio::process::Command::new("redis-cli")
            .args(self.stack.redis_cli_target().await)
            .args(["XADD", &stream, "*"])
            .args(["slot", &key, "caller", caller])
            .stdin(std::process::Stdio::null())
            .output()
            .await;
        let (id, how) = match out {
            Ok(o) if o.status.success() => {
                let id = String::from_utf8_lossy(&o.stdout).trim().to_owned();
                if !is_entry_id(&id) {
                    bail!("redis-cli XADD answered {id:?}");
                }
                (id, "redis-cli XADD")
            }
            Ok(o) => bail!(
                "redis-cli XADD failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ),
            Err(_) => (
                self.xadd(&[("slot", &key), ("caller", caller)]).await?,
                "XADD (redis-cli not installed)",
            ),
        };
        Ok(self.late_duplicate(Fault::XaddDup, &key, id, how, delay_ms))
    }

    /// [`Ev::Kill`].
    async fn inject_kill(
        self: &Arc<Self>,
        at_ms: u64,
        victim: usize,
        restart_ms: u64,
        reuse_id: bool,
    ) -> Result<Injection> {
        self.sleep_until_ms(at_ms).await;
        // Another fault (a kill of its own) may take the chosen
        // worker between the choice and the kill: choose again.
        let mut picked = None;
        for _ in 0..KILL_TRIES {
            let (idx, id) = self.running_worker(victim).await?;
            let mut affected = self.claimed_by(&id).await;
            affected.extend(self.open_due_within(Some(Duration::from_secs(1))));
            if let Some(done) = self.kill(idx, &id, restart_ms, reuse_id)? {
                picked = Some((affected, done));
                break;
            }
        }
        let Some((affected, (what, verified))) = picked else {
            bail!("every worker chosen was taken by another fault first ({KILL_TRIES} tries)");
        };
        Ok(Injection::new(affected, what, verified))
    }

    /// [`Ev::KillMidWebhook`].
    async fn inject_kill_mid_webhook(
        self: &Arc<Self>,
        at_ms: u64,
        hold_ms: u64,
        restart_ms: u64,
        reuse_id: bool,
    ) -> Result<Injection> {
        self.sleep_until_ms(at_ms).await;
        let mut last = String::new();
        let mut done = None;
        for _ in 0..KILL_TRIES {
            let hold = testkit::cms::Reply::Delay(Duration::from_millis(hold_ms), 200);
            match self.kill_mid_webhook(hold, restart_ms, reuse_id).await? {
                Ok((injection, _, _)) => {
                    done = Some(injection);
                    break;
                }
                // The owner of the held call was killed (or its claim
                // moved) by another fault meanwhile: hold the next call.
                Err(why) => last = why,
            }
        }
        let Some(injection) = done else {
            bail!("{last} ({KILL_TRIES} tries)");
        };
        Ok(injection)
    }

    /// [`Ev::PgTerminate`].
    async fn inject_pg_terminate(self: &Arc<Self>, at_ms: u64) -> Result<Injection> {
        self.sleep_until_ms(at_ms).await;
        // The workers' own connections; retried until there was one
        // (a pool may be between connections).
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut tries = 0;
        Ok(loop {
            tries += 1;
            let affected = self.open_due_within(Some(Duration::from_secs(1)));
            let n: i64 = sqlx::query_scalar(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'slotgate' AND pid <> pg_backend_pid()",
            )
            .bind(&self.stack.db_name)
            .fetch_one(&self.stack.pool)
            .await?;
            if n > 0 {
                break Injection::new(
                    affected,
                    format!("terminated {n} slotgate backend(s) (try {tries})"),
                    true,
                );
            }
            if Instant::now() > deadline {
                bail!("no slotgate backend to terminate in 10 s ({tries} tries)");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        })
    }

    /// [`Ev::Malformed`].
    async fn inject_malformed(self: &Arc<Self>, at_ms: u64, what: Malformed) -> Result<Injection> {
        self.sleep_until_ms(at_ms).await;
        let day = &self.stack.day;
        let k0 = &self.sc.kinds[0];
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
            Some(s) => self.xadd(&[("slot", s), ("caller", caller)]).await?,
            None => {
                self.xadd(&[("caller", caller), ("note", "no slot")])
                    .await?
            }
        };
        self.add_delivery(Delivery {
            fault: Fault::Malformed,
            entry: Some(id.clone()),
            slot: slot.clone(),
            at: Instant::now(),
            expect: Expect::Dead(what.reason()),
        });
        let seen = self.watch_dead_letter(&id).await;
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

    /// [`Ev::FutureDelivery`].
    async fn inject_future_delivery(
        self: &Arc<Self>,
        at_ms: u64,
        kind: usize,
    ) -> Result<Injection> {
        self.sleep_until_ms(at_ms).await;
        let day: chrono::NaiveDate = self.stack.day.parse()?;
        let tomorrow = day.succ_opt().context("a day after")?;
        let key = format!("{}:{tomorrow}:1", self.sc.kinds[kind].name);
        let id = self
            .xadd(&[("slot", &key), ("caller", Fault::FutureDelivery.caller())])
            .await?;
        self.add_delivery(Delivery {
            fault: Fault::FutureDelivery,
            entry: Some(id.clone()),
            slot: Some(key.clone()),
            at: Instant::now(),
            expect: Expect::NotDue,
        });
        Ok(Injection::new(
            HashSet::from([key.clone()]),
            format!("delivered {key}, a day that has not come: entry {id}"),
            true,
        ))
    }

    /// `pg-failover`: the primary killed, the synchronous standby promoted
    /// and the address moved (see [`Stack::pg_fail_over`]). Verified when
    /// the server behind the address is out of recovery and a worker
    /// committed an execution there after the switch (within 30 s): the
    /// fleet carried on on the promoted server. No wipe is recorded: with
    /// a synchronous standby no acknowledged commit is lost, and the judge
    /// holds the run to that.
    async fn pg_failover(&self) -> Result<Injection> {
        let affected = self.open_due_within(Some(Duration::from_secs(5)));
        let what = {
            // After the harness's own held sessions let go, and before the
            // next one starts (see `Stack::pg_sessions`).
            let _all = self.stack.pg_sessions.write().await;
            self.stack.pg_fail_over().await?
        };
        let pool = &self.stack.pool;
        let deadline = Instant::now() + Duration::from_secs(30);
        // The harness's own pool reconnects through the moved address.
        let (in_recovery, floor) = loop {
            let r: Result<(bool, i64), _> = sqlx::query_as(
                "SELECT pg_is_in_recovery(), (SELECT coalesce(max(id), 0) FROM execution)",
            )
            .fetch_one(pool)
            .await;
            match r {
                Ok(v) => break v,
                Err(e) if Instant::now() > deadline => {
                    return Err(e).context("reading the promoted server")
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        let switched = Instant::now();
        let mut after = None;
        while Instant::now() < deadline {
            let worker: Option<String> = sqlx::query_scalar(
                "SELECT worker_id FROM execution WHERE id > $1 ORDER BY id LIMIT 1",
            )
            .bind(floor)
            .fetch_optional(pool)
            .await
            .ok()
            .flatten();
            if let Some(w) = worker {
                after = Some(w);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(Injection::new(
            affected,
            format!(
                "{what}; {}; {}",
                if in_recovery {
                    "the address leads to a server in recovery"
                } else {
                    "the address leads to the promoted server"
                },
                match &after {
                    Some(w) => format!(
                        "worker {w} committed an execution there {:.1?} after",
                        switched.elapsed()
                    ),
                    None => "no execution committed there within 30 s".to_owned(),
                }
            ),
            !in_recovery && after.is_some(),
        ))
    }

    /// `schedule-edit`: rewrites the config with `kind`'s schedule edited,
    /// runs `planner plan` with it and restarts the workers one by one
    /// (SIGTERM, then the same id with the new config). Verified: the plan
    /// cancelled the removed slot, planned exactly one new slot (number
    /// `slots + 1`, the new time), and every other slot kept its key.
    async fn schedule_edit(&self, kind: usize, removed: u32, added_s: u64) -> Result<Injection> {
        #[derive(Deserialize)]
        struct Entry {
            slot: String,
            kind: String,
            due_at: DateTime<Utc>,
            new: bool,
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
        let k = &self.sc.kinds[kind];
        let removed_key = self.sc.target_key(
            Target {
                kind,
                slot_no: removed,
            },
            &self.stack.day,
        );
        let added_key = format!("{}:{}:{}", k.name, self.stack.day, k.offsets.len() + 1);
        self.stack
            .write_edited_config(&self.sc, kind, removed, added_s)?;
        let out = self
            .stack
            .planner_ok(&["plan", "--day", &self.stack.day, "--json"])
            .await?;
        let p: Planned = serde_json::from_str(out.trim()).context("plan --json output")?;
        let new: Vec<&Entry> = p.slots.iter().filter(|e| e.new).collect();
        let before: HashSet<&str> = self
            .plan
            .iter()
            .map(|e| e.slot.as_str())
            .filter(|s| *s != removed_key)
            .collect();
        let kept: HashSet<&str> = p
            .slots
            .iter()
            .filter(|e| !e.new)
            .map(|e| e.slot.as_str())
            .collect();
        let cancelled = p
            .unscheduled
            .iter()
            .any(|g| g.slot == removed_key && g.fate == "cancelled");
        let one_new = new.len() == 1 && new[0].slot == added_key;
        if let Some(e) = new.first() {
            self.planned_later.lock().unwrap().push(PlanSlot {
                slot: e.slot.clone(),
                kind: e.kind.clone(),
                due_at: e.due_at,
            });
        }
        // The workers read the config at start: one by one, so the others
        // keep running meanwhile.
        let mut restarted = 0;
        let workers = self.workers.lock().unwrap().len();
        for idx in 0..workers {
            let taken = {
                let mut w = self.workers.lock().unwrap();
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
                self.found(Violation::new(
                    Class::WorkerExit,
                    None,
                    format!(
                        "worker {} did not exit cleanly on SIGTERM for the schedule edit: {:?}",
                        status.1, status.0
                    ),
                ));
            }
            let mut w = self.workers.lock().unwrap();
            let s = &mut w[idx];
            if s.gen == gen && s.proc.is_none() {
                s.proc = Some(
                    self.stack
                        .spawn_worker(&format!("{id}e"), &id, s.clock_ahead),
                );
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

    /// `planner backfill` of a kind's day, retried until it delivered
    /// something (a backfill finding nothing due and open injected nothing).
    /// Prefers `kind`; any kind with open due slots will do.
    async fn backfill(&self, kind: usize, until: Instant) -> Result<Injection> {
        let deadline = (Instant::now() + Duration::from_secs(20)).min(until);
        let day = self.stack.day.clone();
        let mut tries = 0;
        loop {
            let open = self.open_due_within(Some(Duration::ZERO));
            let mut order: Vec<usize> = vec![kind];
            order.extend((0..self.sc.kinds.len()).filter(|k| *k != kind));
            let pick = order.into_iter().find(|k| {
                let prefix = format!("{}:", self.sc.kinds[*k].name);
                open.iter().any(|s| s.starts_with(&prefix))
            });
            if let Some(k) = pick {
                tries += 1;
                let name = &self.sc.kinds[k].name;
                let (ok, out, err) = self
                    .stack
                    .planner(&["backfill", "--kind", name, "--from", &day, "--to", &day])
                    .await?;
                if !ok {
                    bail!("planner backfill --kind {name}: {}", err.trim());
                }
                #[derive(Deserialize)]
                struct Backfill {
                    delivered: Vec<String>,
                }
                let b: Backfill =
                    serde_json::from_str(out.trim()).context("planner backfill output")?;
                if !b.delivered.is_empty() {
                    let now = Instant::now();
                    for key in &b.delivered {
                        self.add_delivery(Delivery {
                            fault: Fault::BackfillDup,
                            entry: None,
                            slot: Some(key.clone()),
                            at: now,
                            expect: Expect::Any,
                        });
                    }
                    return Ok(Injection::new(
                        b.delivered.iter().cloned().collect(),
                        format!(
                            "planner backfill --kind {name} (try {tries}): delivered {} slot(s) due and without an outcome",
                            b.delivered.len()
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

    /// The next `n` publish calls answered with `reply`. Verified: they
    /// came, and were answered so.
    async fn answer_next(
        &self,
        n: u32,
        reply: testkit::cms::Reply,
        what: String,
    ) -> Result<Injection> {
        let (keys, _) = self.held_calls(n, reply).await?;
        Ok(Injection::new(
            keys.iter().cloned().collect(),
            format!("{what}: the publish calls of {keys:?}"),
            keys.len() == n as usize,
        ))
    }

    /// Arms the CMS to answer the next `n` publish calls with `reply`;
    /// returns their keys (and the last hold's id) once they came.
    async fn held_calls(&self, n: u32, reply: testkit::cms::Reply) -> Result<(Vec<String>, u64)> {
        let mut rxs = Vec::new();
        let mut last = 0;
        for _ in 0..n {
            let (id, rx) = self.webhook.arm(reply.clone());
            rxs.push((id, rx));
            last = id;
        }
        let mut keys = Vec::new();
        for (id, rx) in rxs {
            match tokio::time::timeout(Duration::from_secs(15), rx).await {
                Ok(Ok(k)) => keys.push(k),
                _ => {
                    self.webhook.disarm_hold(id);
                    bail!("no publish call came within 15 s");
                }
            }
        }
        Ok((keys, last))
    }

    /// SIGSTOP of the lease holder until a new lease epoch is observed
    /// (at least `pause_ms`), then SIGCONT. Verified: the process was in
    /// state T, and another worker took the lease with a higher epoch.
    async fn stop_leader(&self, pause_ms: u64) -> Result<Injection> {
        // The holder of the lease, once it is one of the running workers
        // (a freshly killed leader's lease outlives it).
        let deadline = Instant::now() + Duration::from_secs(10);
        let (leader, id, idx, gen, pid, epoch) = loop {
            if let Some((id, epoch)) = self.leader().await? {
                let found = {
                    let w = self.workers.lock().unwrap();
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
        let mut affected = self.claimed_by(&id).await;
        affected.extend(self.open_due_within(Some(Duration::from_millis(pause_ms))));
        let started = Instant::now();
        self.with_worker(idx, gen, |p| p.try_signal("STOP"))
            .unwrap_or_else(|| Err(std::io::ErrorKind::NotFound.into()))
            .with_context(|| format!("SIGSTOP {pid}"))?;
        let mut stopped = false;
        let mut new_epoch = None;
        let until = started + Duration::from_millis(pause_ms).max(Duration::from_secs(15));
        while Instant::now() < until {
            stopped = stopped || self.with_worker(idx, gen, |p| p.state()).flatten() == Some('T');
            if new_epoch.is_none() {
                new_epoch = self
                    .leader()
                    .await
                    .ok()
                    .flatten()
                    .filter(|(_, e)| *e > epoch);
            }
            let paused = started.elapsed() >= Duration::from_millis(pause_ms);
            if stopped && new_epoch.is_some() && paused {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.with_worker(idx, gen, |p| p.resume());
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
    async fn leader(&self) -> Result<Option<(String, i64)>> {
        let mut c = self.stack.redis.clone();
        let v: Option<String> = redis::cmd("GET")
            .arg(self.stack.keys.leader())
            .query_async(&mut c)
            .await?;
        Ok(v.and_then(|v| {
            let (id, e) = v.rsplit_once(':')?;
            Some((id.to_owned(), e.parse().ok()?))
        }))
    }

    /// One poison entry. Verified: Redis took it (the top-of-space ID
    /// as given).
    async fn poison(&self, what: Poison) -> Result<Injection> {
        let caller = Fault::PoisonEntry.caller().as_bytes();
        let (id, slot, expect) = match what {
            Poison::NonUtf8 => {
                let bad: &[u8] = b"\xff\xfe:\xc3\x28:1";
                let id = self
                    .xadd_raw("*", &[("slot", bad), ("caller", caller)])
                    .await?;
                (id, "<non-UTF-8>".to_owned(), Expect::Dead("bad_message"))
            }
            Poison::Oversized => {
                let big = vec![b'x'; 512 * 1024];
                let id = self
                    .xadd_raw("*", &[("slot", &big), ("caller", caller)])
                    .await?;
                (id, "<512 KiB>".to_owned(), Expect::Dead("bad_message"))
            }
            Poison::TopId => {
                // A copy of a finished slot, so only the ID is hostile.
                let slot = self
                    .terminal
                    .borrow()
                    .iter()
                    .next()
                    .cloned()
                    .unwrap_or_default();
                let top = "18446744073709551615-18446744073709551615";
                let id = self
                    .xadd_raw(top, &[("slot", slot.as_bytes()), ("caller", caller)])
                    .await?;
                if id != top {
                    bail!("XADD {top} answered {id}");
                }
                (id, slot, Expect::Unjudged)
            }
        };
        self.add_delivery(Delivery {
            fault: Fault::PoisonEntry,
            entry: Some(id.clone()),
            slot: Some(slot.clone()),
            at: Instant::now(),
            expect,
        });
        if let Expect::Dead(_) = expect {
            self.watch_dead_letter(&id).await;
        }
        Ok(Injection::new(
            HashSet::new(),
            format!("{} ({slot}) entry {id}", what.name()),
            true,
        ))
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

    /// One entry whose `slot` is 64 MiB. Verified: it was dead-lettered
    /// and no running worker's peak memory reached the entry's size (each
    /// cuts entries inside Redis before reading them).
    async fn oversize(&self) -> Result<Injection> {
        const SIZE: usize = 64 << 20;
        let big = vec![b'x'; SIZE];
        let id = self
            .xadd_raw(
                "*",
                &[
                    ("slot", &big),
                    ("caller", Fault::OversizeEntry.caller().as_bytes()),
                ],
            )
            .await?;
        drop(big);
        self.add_delivery(Delivery {
            fault: Fault::OversizeEntry,
            entry: Some(id.clone()),
            slot: Some("<64 MiB>".to_owned()),
            at: Instant::now(),
            expect: Expect::Dead("bad_message"),
        });
        let seen = self.watch_dead_letter(&id).await;
        let peak = self.workers_peak_rss_mib();
        Ok(Injection::new(
            HashSet::new(),
            format!("64 MiB entry {id}: dead letter seen {seen}, workers' peak RSS {peak:.0} MiB"),
            seen && peak < (SIZE >> 20) as f64,
        ))
    }

    /// Another session holds `kind`'s quota row while `copies` deliveries
    /// of its open slots (round robin) are added with one pipeline, then
    /// lets go after `hold_ms` once a slotgate backend waited on it.
    /// Verified: a backend waited, every copy was accepted, and no running
    /// worker's peak RSS reached 100 MiB while it held them back.
    async fn stall_burst(&self, kind: usize, hold_ms: u64, copies: u32) -> Result<Injection> {
        let _session = self.stack.pg_sessions.read().await;
        let name = self.sc.kinds[kind].name.clone();
        let (tx, started) = self.lock_quota(&name).await?;
        let mut open: Vec<String> = self
            .open_due_within(Some(Duration::from_millis(hold_ms)))
            .into_iter()
            .filter(|k| k.starts_with(&format!("{name}:")))
            .collect();
        open.sort();
        if open.is_empty() {
            open = self
                .plan
                .iter()
                .filter(|p| p.slot.starts_with(&format!("{name}:")))
                .map(|p| p.slot.clone())
                .collect();
        }
        let mut pipe = redis::pipe();
        for i in 0..copies as usize {
            pipe.cmd("XADD")
                .arg(self.stack.ready())
                .arg("*")
                .arg("slot")
                .arg(&open[i % open.len()])
                .arg("caller")
                .arg(Fault::StallBurst.caller());
        }
        let mut c = self.stack.redis.clone();
        let ids: Vec<String> = pipe.query_async(&mut c).await?;
        let now = Instant::now();
        for (i, id) in ids.iter().enumerate() {
            self.add_delivery(Delivery {
                fault: Fault::StallBurst,
                entry: Some(id.clone()),
                slot: Some(open[i % open.len()].clone()),
                at: now,
                expect: Expect::Any,
            });
        }
        let waiter = self.hold_until_waited(tx, started, hold_ms).await?;
        let peak = self.workers_peak_rss_mib();
        Ok(Injection::new(
            open.into_iter().collect(),
            format!(
                "held the quota row of {name} for {:?} with {} copies added (a slotgate backend waited: {waiter}); workers' peak RSS {peak:.0} MiB",
                started.elapsed(),
                ids.len()
            ),
            waiter && ids.len() == copies as usize && peak < 100.0,
        ))
    }

    /// Another session holds `kind`'s quota row of the day locked for at
    /// least `hold_ms`, and until a slotgate backend was seen waiting on it
    /// (at most 15 s). Verified: that wait.
    async fn hold_quota(&self, kind: usize, hold_ms: u64) -> Result<Injection> {
        let _session = self.stack.pg_sessions.read().await;
        let name = self.sc.kinds[kind].name.clone();
        let (tx, started) = self.lock_quota(&name).await?;
        let affected = self
            .open_due_within(Some(Duration::from_millis(hold_ms)))
            .into_iter()
            .filter(|k| k.starts_with(&format!("{name}:")))
            .collect();
        let waiter = self.hold_until_waited(tx, started, hold_ms).await?;
        Ok(Injection::new(
            affected,
            format!(
                "held the quota row of {name} for {:?} (a slotgate backend waited on it: {waiter})",
                started.elapsed()
            ),
            waiter,
        ))
    }

    /// Locks `kind`'s quota row of the day in a transaction of its own
    /// (a row with nothing used is the same state as no row).
    async fn lock_quota(
        &self,
        kind: &str,
    ) -> Result<(sqlx::Transaction<'static, sqlx::Postgres>, Instant)> {
        let day = &self.stack.day;
        sqlx::query("INSERT INTO daily_quota (kind, day, used) VALUES ($1, $2::date, 0) ON CONFLICT DO NOTHING")
            .bind(kind)
            .bind(day)
            .execute(&self.stack.pool)
            .await?;
        let mut tx = self.stack.pool.begin().await?;
        sqlx::query("SELECT used FROM daily_quota WHERE kind = $1 AND day = $2::date FOR UPDATE")
            .bind(kind)
            .bind(day)
            .fetch_one(&mut *tx)
            .await?;
        Ok((tx, Instant::now()))
    }

    /// Keeps `tx` (and its lock) open for at least `hold_ms` from `started`
    /// and until a slotgate backend was seen waiting on a lock (at most
    /// 15 s), then rolls it back. Whether one was seen.
    async fn hold_until_waited(
        &self,
        tx: sqlx::Transaction<'static, sqlx::Postgres>,
        started: Instant,
        hold_ms: u64,
    ) -> Result<bool> {
        let mut waiter = false;
        while started.elapsed() < Duration::from_secs(15) {
            if !waiter {
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'slotgate' AND wait_event_type = 'Lock'",
                )
                .bind(&self.stack.db_name)
                .fetch_one(&self.stack.pool)
                .await?;
                waiter = n > 0;
            }
            if waiter && started.elapsed() >= Duration::from_millis(hold_ms) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tx.rollback().await?;
        Ok(waiter)
    }

    /// The first running worker from `victim` on (index and id).
    async fn running_worker(&self, victim: usize) -> Result<(usize, String)> {
        self.wait_for_worker("no worker running", |w| {
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
        &self,
        what: &str,
        pick: impl Fn(&[WorkerSlot]) -> Option<&WorkerSlot>,
    ) -> Result<(usize, String)> {
        let until = Instant::now() + Duration::from_secs(20);
        loop {
            let found = pick(&self.workers.lock().unwrap()).map(|s| (s.idx, s.id.clone()));
            match found {
                Some(v) => return Ok(v),
                None if Instant::now() > until => bail!("{what} for 20 s"),
                None => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Checks the worker started with its clock ahead (the first one).
    /// Verified: its liveness heartbeat in Redis carries a time at least
    /// 30 s ahead.
    async fn clock_ahead_worker(&self) -> Result<Injection> {
        if testkit::process::libfaketime().is_none() {
            bail!("libfaketime is not installed (apt-get install faketime)");
        }
        let (idx, id) = self
            .wait_for_worker("the worker with its clock ahead is not running", |w| {
                w.iter().find(|s| s.clock_ahead && s.proc.is_some())
            })
            .await?;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let mut c = self.stack.redis.clone();
            let beat: Option<i64> = redis::cmd("HGET")
                .arg(self.stack.keys.workers())
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

    /// Looks for the dead letter of entry `id` for up to 10 s and keeps it.
    async fn watch_dead_letter(&self, id: &str) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(page) = self.stack.dead_letters().await {
                for e in page {
                    let fields = stream_fields(&e.map);
                    if fields.get("entry_id").map(String::as_str) == Some(id) {
                        self.records.lock().unwrap().dead_seen.push(fields);
                        return true;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        false
    }

    /// The harness's part of `--sabotage skip-gate`: from halfway through,
    /// duplicates of published record-only slots of kinds with drafts left
    /// (a few, a second apart), which the sabotaged gate lets through. The other sabotages need
    /// nothing but ordinary deliveries.
    pub async fn sabotage_duplicates(&self) -> Result<()> {
        self.sleep_until_ms(self.sc.duration.as_millis() as u64 / 2)
            .await;
        let record_only: Vec<&str> = self
            .sc
            .kinds
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
            .fetch_optional(&self.stack.pool)
            .await?;
            if let Some((kind, day, slot)) = row {
                let key = format!("{kind}:{day}:{slot}");
                let id = self
                    .xadd(&[("slot", &key), ("caller", "chaos-sabotage")])
                    .await?;
                self.add_duplicate(Fault::SerialDup, Some(id), &key);
                self.note(format!(
                    "SABOTAGE self-test: delivered published record-only {key} again"
                ));
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Ok(())
    }

    /// Holds the next publish call (answers it with `hold`) and kills the
    /// worker that made it, while the CMS holds it; the injection, the
    /// call's key and when the kill was done. `Ok(Err(why))` when another
    /// fault got there first (the owner no longer runs, or its claim moved
    /// on): try the next call.
    async fn kill_mid_webhook(
        self: &Arc<Self>,
        hold: testkit::cms::Reply,
        restart_ms: u64,
        reuse_id: bool,
    ) -> Result<std::result::Result<(Injection, String, SystemTime), String>> {
        let (keys, hold) = self.held_calls(1, hold).await?;
        let key = keys[0].clone();
        self.webhook.disarm_hold(hold);
        let Some((kind, day, no)) = slot_parts(&key) else {
            bail!("held a call with key {key:?}");
        };
        let owner: Option<String> = sqlx::query_scalar(
            "SELECT claimed_by FROM publish_slot WHERE kind = $1 AND day = $2::date AND slot = $3 AND state IN ('claimed', 'publishing')",
        )
        .bind(kind)
        .bind(day)
        .bind(no)
        .fetch_optional(&self.stack.pool)
        .await?;
        let Some(owner) = owner else {
            return Ok(Err(format!("the held call's slot {key} has no open claim")));
        };
        let idx = {
            let w = self.workers.lock().unwrap();
            w.iter()
                .find(|s| s.id == owner && s.proc.is_some())
                .map(|s| s.idx)
        };
        let Some(idx) = idx else {
            return Ok(Err(format!(
                "{key} is claimed by {owner}, which is not running"
            )));
        };
        let mut affected = self.claimed_by(&owner).await;
        affected.insert(key.clone());
        let Some((what, verified)) = self.kill(idx, &owner, restart_ms, reuse_id)? else {
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

    /// [`Ev::HeldBeforeApply`]: the next publish call recorded on receipt
    /// and applied only `hold_ms` later (the CMS answers its key's probes
    /// `409` meanwhile); with `takeover` (restart after, reuse the id), the
    /// worker that made it killed while it is held. Verified by the CMS's
    /// own record: the call was received, applied later than the HTTP
    /// timeout, and a probe of its key was answered `409` while it was held
    /// — after the kill, with a takeover (so by another process). When the
    /// CMS's record shows no such probe (another fault killed the worker
    /// before it probed, say), the next publish call is held again, up to
    /// [`KILL_TRIES`] calls; each try is logged.
    async fn held_before_apply(
        self: &Arc<Self>,
        hold_ms: u64,
        takeover: Option<(u64, bool)>,
    ) -> Result<Injection> {
        let mut tries = 0;
        loop {
            tries += 1;
            let injection = self.hold_before_apply_once(hold_ms, takeover).await?;
            if injection.verified || tries >= KILL_TRIES {
                return Ok(injection);
            }
            self.log(format!(
                "webhook-held-before-apply try {tries} not verified, holding the next publish call: {}",
                injection.what
            ));
        }
    }

    /// One try of [`Self::held_before_apply`].
    async fn hold_before_apply_once(
        self: &Arc<Self>,
        hold_ms: u64,
        takeover: Option<(u64, bool)>,
    ) -> Result<Injection> {
        let hold = testkit::cms::Reply::Delay(Duration::from_millis(hold_ms), 200);
        let (mut injection, key, armed_at, killed_at) = match takeover {
            None => {
                let armed_at = SystemTime::now();
                let (keys, _) = self.held_calls(1, hold).await?;
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
                let mut last = String::new();
                let mut done = None;
                for _ in 0..KILL_TRIES {
                    let armed_at = SystemTime::now();
                    match self
                        .kill_mid_webhook(hold.clone(), restart_ms, reuse_id)
                        .await?
                    {
                        Ok((injection, key, killed_at)) => {
                            done = Some((injection, key, armed_at, Some(killed_at)));
                            break;
                        }
                        Err(why) => last = why,
                    }
                }
                let Some(done) = done else {
                    bail!("{last} ({KILL_TRIES} tries)");
                };
                done
            }
        };
        // The CMS's record of the held call, once it was applied.
        let deadline = Instant::now() + Duration::from_millis(hold_ms) + Duration::from_secs(10);
        let post = loop {
            let post = self
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
        let probes = self.stack.cms.calls();
        // What a probe of a key in progress is answered: 409 by the
        // contract; 404 by the CMS of the judge's self-test, which breaks it.
        let in_progress = if self.sc.probe_contract_broken {
            404
        } else {
            409
        };
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

    /// `kill -9` of worker slot `idx` (if it still runs `id`), and its
    /// restart after `restart_ms`. Verified: its exit status is SIGKILL
    /// (a worker that had already exited by itself is not a kill). `None`
    /// when slot `idx` no longer runs `id`: another fault got there first.
    fn kill(
        self: &Arc<Self>,
        idx: usize,
        id: &str,
        restart_ms: u64,
        reuse_id: bool,
    ) -> Result<Option<(String, bool)>> {
        let (proc, gen) = {
            let mut w = self.workers.lock().unwrap();
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
            self.found(Violation::new(
                Class::WorkerExit,
                None,
                format!(
                    "worker {} had exited by itself ({status}) before it was killed",
                    proc.name
                ),
            ));
        }
        drop(proc);
        let h = self.clone();
        let new_id = if reuse_id {
            id.to_owned()
        } else {
            format!("w{}g{gen}", idx + 1)
        };
        let what = format!(
            "kill -9 {id} (pid {pid}, exit: {status}); restart in {restart_ms} ms as {new_id}"
        );
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

    /// Workers currently running.
    pub fn running(&self) -> usize {
        self.workers
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.proc.is_some())
            .count()
    }

    /// Redis residue: (ready entries, pending entries, delayed slots).
    pub async fn residue(&self) -> Result<(u64, u64, u64)> {
        self.stack.residue().await
    }

    /// Waits until every planned slot has an outcome, nothing is queued and
    /// the CMS answered everything — twice in a row, a second apart.
    pub async fn settle(&self, until: Instant) -> bool {
        let mut stable = 0;
        let mut last_report = Instant::now();
        loop {
            let (len, pending, delayed) = self.residue().await.unwrap_or((1, 1, 1));
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
        for (name, st) in &exits {
            match st {
                Some(s) if s.success() => {}
                other => self.found(Violation::new(
                    Class::WorkerExit,
                    None,
                    format!("worker {name} did not exit cleanly on SIGTERM: {other:?}"),
                )),
            }
        }
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

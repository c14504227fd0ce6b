//! Running a scenario: plan, start workers, inject the seeded faults, settle.

use crate::scenario::{Ev, Fault, Malformed, Scenario, Target};
use crate::stack::Stack;
use crate::webhook::WebhookChaos;
use anyhow::{bail, Context, Result};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::process::Proc;
use tokio::sync::watch;

/// One planned slot, as `planner plan --json` printed it.
#[derive(Debug, Clone, Deserialize)]
pub struct PlanSlot {
    pub slot: String,
    pub kind: String,
    pub due_at: DateTime<Utc>,
}

/// A fault as it was injected.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    pub fault: Fault,
    /// Slots it could have touched.
    pub affected: HashSet<String>,
}

/// A delivery the harness added.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub fault: Fault,
    /// Stream entry id, when known (`backfill` does not print them).
    pub entry: Option<String>,
    pub slot: Option<String>,
    pub at: Instant,
    /// The slot had its outcome before this delivery was added.
    pub after_done: bool,
    /// For malformed deliveries: the dead-letter reason expected.
    pub expect_reason: Option<&'static str>,
}

#[derive(Default)]
pub struct Records {
    pub faults: Vec<FaultRecord>,
    pub deliveries: Vec<Delivery>,
    pub wipes: Vec<Instant>,
    pub notes: Vec<String>,
    /// Dead letters seen right after a malformed injection was handled
    /// (a later wipe may delete `P:dead`).
    pub dead_seen: Vec<HashMap<String, String>>,
}

struct WorkerSlot {
    idx: usize,
    gen: u32,
    id: String,
    proc: Option<Proc>,
}

pub struct Harness {
    pub sc: Scenario,
    pub stack: Stack,
    pub plan: Vec<PlanSlot>,
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
    /// Every worker process that ever ran: (log name, exit status at the end).
    pub exits: Mutex<Vec<(String, Option<std::process::ExitStatus>)>>,
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
        stack.write_config(&sc, Duration::from_secs(4))?;
        stack.planner_ok(&["migrate"]).await?;
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
        #[derive(Deserialize)]
        struct Planned {
            slots: Vec<PlanSlot>,
        }
        let out = stack
            .planner_ok(&["plan", "--day", &stack.day, "--json"])
            .await?;
        let planned: Planned = serde_json::from_str(out.trim()).context("plan --json output")?;
        if planned.slots.len() != sc.slots() {
            bail!(
                "planned {} slots, the scenario has {}",
                planned.slots.len(),
                sc.slots()
            );
        }
        let base_in = (stack.base - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        let t0 = Instant::now() + base_in;
        let due = planned
            .slots
            .iter()
            .map(|p| (p.slot.clone(), p.due_at))
            .collect();
        let (terminal_tx, terminal) = watch::channel(Arc::new(HashSet::new()));
        let h = Arc::new(Harness {
            plan: planned.slots,
            due,
            t0,
            workers: Mutex::new(Vec::new()),
            terminal,
            terminal_tx,
            records: Mutex::new(Records::default()),
            webhook,
            exits: Mutex::new(Vec::new()),
            kind_names: sc.kinds.iter().map(|k| k.name.clone()).collect(),
            exec_floor,
            sc,
            stack,
        });
        {
            let mut w = h.workers.lock().unwrap();
            for idx in 0..workers {
                let id = format!("w{}", idx + 1);
                let proc = h.stack.spawn_worker(&id, &id);
                w.push(WorkerSlot {
                    idx,
                    gen: 1,
                    id,
                    proc: Some(proc),
                });
            }
        }
        let watcher = h.clone();
        tokio::spawn(async move { watcher.watch_terminal().await });
        Ok(h)
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

    fn record(&self, fault: Fault, affected: HashSet<String>, what: String) {
        self.log(format!(
            "{:<20} {what} ({} slot(s) in reach)",
            fault.name(),
            affected.len()
        ));
        self.records
            .lock()
            .unwrap()
            .faults
            .push(FaultRecord { fault, affected });
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
            after_done: true,
            expect_reason: None,
        });
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

    /// Planned slots without an outcome that are due by `now + within`.
    fn open_due_within(&self, within: Option<Duration>) -> HashSet<String> {
        let limit = within.map(|w| Utc::now() + chrono::Duration::from_std(w).unwrap_or_default());
        let done = self.terminal.borrow().clone();
        self.plan
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
        let mut c = self.stack.redis.clone();
        let mut cmd = redis::cmd("XADD");
        cmd.arg(self.stack.key("ready")).arg("*");
        for (k, v) in fields {
            cmd.arg(*k).arg(*v);
        }
        Ok(cmd.query_async(&mut c).await?)
    }

    /// Runs every scheduled event; returns when all are done or `until`.
    pub async fn run_schedule(self: &Arc<Self>, until: Instant) {
        let mut set = tokio::task::JoinSet::new();
        for ev in self.sc.events.clone() {
            let h = self.clone();
            set.spawn(async move {
                if let Err(e) = h.run_event(ev.clone(), until).await {
                    h.note(format!("{}: not injected: {e:#}", ev.fault().name()));
                }
            });
        }
        let all = async { while set.join_next().await.is_some() {} };
        if tokio::time::timeout_at(until.into(), all).await.is_err() {
            self.note("schedule: some events were still waiting at the deadline".into());
        }
    }

    async fn sleep_until_ms(&self, at_ms: u64) {
        tokio::time::sleep_until((self.t0 + Duration::from_millis(at_ms)).into()).await;
    }

    async fn run_event(self: &Arc<Self>, ev: Ev, until: Instant) -> Result<()> {
        match ev {
            Ev::ConcurrentDup {
                target,
                copies,
                offset_ms,
            } => {
                let key = self.key_of(target);
                let due = self.due[&key];
                let at = due + chrono::Duration::milliseconds(offset_ms);
                tokio::time::sleep_until(self.instant_of(at).into()).await;
                let after_done = self.is_done(&key);
                let mut p = redis::pipe();
                for _ in 0..copies {
                    p.cmd("XADD")
                        .arg(self.stack.key("ready"))
                        .arg("*")
                        .arg("slot")
                        .arg(&key)
                        .arg("caller")
                        .arg(Fault::ConcurrentDup.caller());
                }
                let mut c = self.stack.redis.clone();
                let ids: Vec<String> = p.query_async(&mut c).await?;
                let now = Instant::now();
                for id in &ids {
                    self.add_delivery(Delivery {
                        fault: Fault::ConcurrentDup,
                        entry: Some(id.clone()),
                        slot: Some(key.clone()),
                        at: now,
                        after_done,
                        expect_reason: None,
                    });
                }
                self.record(
                    Fault::ConcurrentDup,
                    HashSet::from([key.clone()]),
                    format!(
                        "{key} x{copies} at once ({})",
                        if after_done {
                            "already done"
                        } else {
                            "not done yet"
                        }
                    ),
                );
            }
            Ev::SerialDup {
                target,
                delay_ms,
                copies,
            } => {
                let key = self.key_of(target);
                self.after_finished(&key, until, delay_ms).await?;
                for i in 0..copies {
                    if i > 0 {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    let id = self
                        .xadd(&[("slot", &key), ("caller", Fault::SerialDup.caller())])
                        .await?;
                    self.add_duplicate(Fault::SerialDup, Some(id), &key);
                }
                self.record(
                    Fault::SerialDup,
                    HashSet::from([key.clone()]),
                    format!("{key} x{copies}, {delay_ms} ms after it finished"),
                );
            }
            Ev::Trigger { target, delay_ms } => {
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
                    .map(str::to_owned);
                if entry.is_none() {
                    self.note(format!("planner trigger printed no entry id: {out:?}"));
                }
                self.add_duplicate(Fault::TriggerDup, entry, &key);
                self.record(
                    Fault::TriggerDup,
                    HashSet::from([key.clone()]),
                    format!("planner trigger {key}, {delay_ms} ms after it finished"),
                );
            }
            Ev::Xadd { target, delay_ms } => {
                let key = self.key_of(target);
                self.after_finished(&key, until, delay_ms).await?;
                let stream = self.stack.key("ready");
                let caller = Fault::XaddDup.caller();
                let out = tokio::process::Command::new("redis-cli")
                    .args(["-u", &self.stack.opts.redis_url, "XADD", &stream, "*"])
                    .args(["slot", &key, "caller", caller])
                    .stdin(std::process::Stdio::null())
                    .output()
                    .await;
                let (id, how) = match out {
                    Ok(o) if o.status.success() => {
                        let id = String::from_utf8_lossy(&o.stdout).trim().to_owned();
                        if !id.contains('-') {
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
                self.add_duplicate(Fault::XaddDup, Some(id), &key);
                self.record(
                    Fault::XaddDup,
                    HashSet::from([key.clone()]),
                    format!("{how} {key}, {delay_ms} ms after it finished"),
                );
            }
            Ev::Backfill { at_ms, kind } => {
                self.sleep_until_ms(at_ms).await;
                let name = &self.sc.kinds[kind].name;
                let day = &self.stack.day;
                let (ok, out, err) = self
                    .stack
                    .planner(&["backfill", "--kind", name, "--from", day, "--to", day])
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
                let now = Instant::now();
                for key in &b.delivered {
                    self.add_delivery(Delivery {
                        fault: Fault::BackfillDup,
                        entry: None,
                        slot: Some(key.clone()),
                        at: now,
                        after_done: false,
                        expect_reason: None,
                    });
                }
                self.record(
                    Fault::BackfillDup,
                    b.delivered.iter().cloned().collect(),
                    format!(
                        "planner backfill --kind {name}: delivered {} slot(s) due and without an outcome",
                        b.delivered.len()
                    ),
                );
            }
            Ev::Kill {
                at_ms,
                victim,
                restart_ms,
                reuse_id,
            } => {
                self.sleep_until_ms(at_ms).await;
                let (idx, id) = {
                    let w = self.workers.lock().unwrap();
                    let n = w.len();
                    let Some(s) = (0..n)
                        .map(|i| &w[(victim + i) % n])
                        .find(|s| s.proc.is_some())
                    else {
                        bail!("no worker running");
                    };
                    (s.idx, s.id.clone())
                };
                let mut affected = self.claimed_by(&id).await;
                affected.extend(self.open_due_within(Some(Duration::from_secs(1))));
                if let Some(what) = self.kill(idx, &id, restart_ms, reuse_id) {
                    self.record(Fault::Kill9, affected, what);
                }
            }
            Ev::KillMidWebhook {
                at_ms,
                hold_ms,
                restart_ms,
                reuse_id,
            } => {
                self.sleep_until_ms(at_ms).await;
                let (hold, rx) = self.webhook.arm_hold(Duration::from_millis(hold_ms));
                let key = match tokio::time::timeout(Duration::from_secs(15), rx).await {
                    Ok(Ok(k)) => k,
                    _ => {
                        self.webhook.disarm_hold(hold);
                        bail!("no publish call came within 15 s");
                    }
                };
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
                    bail!("the held call's slot {key} has no open claim");
                };
                let idx = {
                    let w = self.workers.lock().unwrap();
                    w.iter()
                        .find(|s| s.id == owner && s.proc.is_some())
                        .map(|s| s.idx)
                };
                let Some(idx) = idx else {
                    bail!("{key} is claimed by {owner}, which is not running");
                };
                let mut affected = self.claimed_by(&owner).await;
                affected.insert(key.clone());
                if let Some(what) = self.kill(idx, &owner, restart_ms, reuse_id) {
                    self.record(
                        Fault::Kill9MidWebhook,
                        affected,
                        format!("{what}, while the CMS held its publish call for {key}"),
                    );
                }
            }
            Ev::LeaderStop { at_ms, pause_ms } => {
                self.sleep_until_ms(at_ms).await;
                // The holder of the lease, once it is one of the running
                // workers (a freshly killed leader's lease outlives it).
                let deadline = Instant::now() + Duration::from_secs(10);
                let (leader, id, idx, gen, pid) = loop {
                    let mut c = self.stack.redis.clone();
                    let v: Option<String> = redis::cmd("GET")
                        .arg(self.stack.key("leader"))
                        .query_async(&mut c)
                        .await?;
                    if let Some(leader) = v {
                        let id = leader
                            .rsplit_once(':')
                            .map(|(id, _)| id.to_owned())
                            .unwrap_or(leader.clone());
                        let found = {
                            let w = self.workers.lock().unwrap();
                            w.iter()
                                .find(|s| s.id == id)
                                .and_then(|s| s.proc.as_ref().map(|p| (s.idx, s.gen, p.pid())))
                        };
                        if let Some((idx, gen, pid)) = found {
                            break (leader, id, idx, gen, pid);
                        }
                    }
                    if Instant::now() > deadline {
                        bail!("no running worker held the lease for 10 s");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                };
                let mut affected = self.claimed_by(&id).await;
                affected.extend(self.open_due_within(Some(Duration::from_millis(pause_ms))));
                signal(pid, nix::sys::signal::Signal::SIGSTOP);
                self.record(
                    Fault::LeaderStop,
                    affected,
                    format!("SIGSTOP leader {leader} (pid {pid}) for {pause_ms} ms"),
                );
                tokio::time::sleep(Duration::from_millis(pause_ms)).await;
                let still = {
                    let w = self.workers.lock().unwrap();
                    w[idx].gen == gen && w[idx].proc.is_some()
                };
                if still {
                    signal(pid, nix::sys::signal::Signal::SIGCONT);
                    self.log(format!(
                        "{:<20} SIGCONT {id} (pid {pid})",
                        Fault::LeaderStop.name()
                    ));
                }
            }
            Ev::RedisWipe { at_ms } => {
                self.sleep_until_ms(at_ms).await;
                let affected = self.open_due_within(None);
                let n = self.stack.wipe_prefix().await?;
                self.records.lock().unwrap().wipes.push(Instant::now());
                self.record(
                    Fault::RedisWipe,
                    affected,
                    format!("deleted {n} key(s) of prefix {}", self.stack.prefix),
                );
            }
            Ev::PgTerminate { at_ms } => {
                self.sleep_until_ms(at_ms).await;
                let affected = self.open_due_within(Some(Duration::from_secs(1)));
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'slotgate'",
                )
                .bind(&self.stack.db_name)
                .fetch_one(&self.stack.pool)
                .await?;
                self.record(
                    Fault::PgTerminate,
                    affected,
                    format!("terminated {n} slotgate backend(s)"),
                );
            }
            Ev::Malformed { at_ms, what } => {
                self.sleep_until_ms(at_ms).await;
                let day = &self.stack.day;
                let k0 = &self.sc.kinds[0];
                let slot = match what {
                    Malformed::MissingSlot => None,
                    Malformed::BadKey => Some("not-a-slot-key".to_owned()),
                    Malformed::UnknownKind => Some(format!("ghost:{day}:1")),
                    Malformed::SlotOutOfRange => {
                        Some(format!("{}:{day}:{}", k0.name, k0.offsets.len() + 1))
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
                    after_done: false,
                    expect_reason: Some(what.reason()),
                });
                self.watch_dead_letter(&id).await;
                self.record(
                    Fault::Malformed,
                    HashSet::new(),
                    format!(
                        "{} ({}) entry {id}, expect dead letter {}",
                        what.name(),
                        slot.as_deref().unwrap_or("-"),
                        what.reason()
                    ),
                );
            }
        }
        Ok(())
    }

    /// Looks for the dead letter of entry `id` for up to 10 s and keeps it.
    async fn watch_dead_letter(&self, id: &str) {
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            let mut c = self.stack.redis.clone();
            let page: Result<redis::streams::StreamRangeReply, _> = redis::cmd("XRANGE")
                .arg(self.stack.key("dead"))
                .arg("-")
                .arg("+")
                .query_async(&mut c)
                .await;
            if let Ok(page) = page {
                for e in page.ids {
                    let fields = stream_fields(&e.map);
                    if fields.get("entry_id").map(String::as_str) == Some(id) {
                        self.records.lock().unwrap().dead_seen.push(fields);
                        return;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Self-test of the judge (`--sabotage`, never in a real run): halfway
    /// through, deletes the gate row of a published slot — as if the unique
    /// row were not there — and delivers the slot again. The verdict must
    /// then show a doubled effect and fail.
    pub async fn sabotage(&self) -> Result<()> {
        self.sleep_until_ms(self.sc.duration.as_millis() as u64 / 2)
            .await;
        let row: Option<(i64, String, String, i32)> = sqlx::query_as(
            "SELECT id, kind, day::text, slot FROM publish_slot WHERE state = 'published' ORDER BY id DESC LIMIT 1",
        )
        .fetch_optional(&self.stack.pool)
        .await?;
        let Some((id, kind, day, slot)) = row else {
            bail!("nothing published yet");
        };
        sqlx::query("DELETE FROM publish_slot WHERE id = $1")
            .bind(id)
            .execute(&self.stack.pool)
            .await?;
        let key = format!("{kind}:{day}:{slot}");
        self.xadd(&[("slot", &key), ("caller", "chaos-sabotage")])
            .await?;
        self.note(format!(
            "SABOTAGE (--sabotage self-test): deleted the gate row of published {key} and delivered it again"
        ));
        Ok(())
    }

    /// `kill -9` of worker slot `idx` (if it still runs `id`), and its
    /// restart after `restart_ms`.
    fn kill(
        self: &Arc<Self>,
        idx: usize,
        id: &str,
        restart_ms: u64,
        reuse_id: bool,
    ) -> Option<String> {
        let (proc, gen) = {
            let mut w = self.workers.lock().unwrap();
            let s = &mut w[idx];
            if s.id != id {
                return None;
            }
            let p = s.proc.take()?;
            s.gen += 1;
            (p, s.gen)
        };
        let pid = proc.pid();
        let name = proc.name.clone();
        // Drop sends SIGKILL and reaps it.
        let mut proc = proc;
        let _ = proc.child.kill();
        let status = proc.child.wait().ok();
        self.exits.lock().unwrap().push((name, status));
        drop(proc);
        let h = self.clone();
        let new_id = if reuse_id {
            id.to_owned()
        } else {
            format!("w{}g{gen}", idx + 1)
        };
        let what = format!("kill -9 {id} (pid {pid}); restart in {restart_ms} ms as {new_id}");
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(restart_ms)).await;
            let mut w = h.workers.lock().unwrap();
            let s = &mut w[idx];
            if s.gen == gen && s.proc.is_none() {
                let log_name = format!("w{}g{gen}", idx + 1);
                s.proc = Some(h.stack.spawn_worker(&log_name, &new_id));
                s.id = new_id;
            }
        });
        Some(what)
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
        let mut c = self.stack.redis.clone();
        let len: u64 = redis::cmd("XLEN")
            .arg(self.stack.key("ready"))
            .query_async(&mut c)
            .await?;
        let delayed: u64 = redis::cmd("ZCARD")
            .arg(self.stack.key("delayed"))
            .query_async(&mut c)
            .await?;
        let pending: u64 = match redis::cmd("XPENDING")
            .arg(self.stack.key("ready"))
            .arg("workers")
            .query_async::<redis::Value>(&mut c)
            .await
        {
            Ok(redis::Value::Array(v)) => v
                .first()
                .and_then(|x| redis::from_redis_value::<u64>(x).ok())
                .unwrap_or(0),
            _ => 0,
        };
        Ok((len, pending, delayed))
    }

    /// Waits until every planned slot has an outcome, nothing is queued and
    /// the CMS answered everything — twice in a row, a second apart.
    pub async fn settle(&self, until: Instant) -> bool {
        let mut stable = 0;
        let mut last_report = Instant::now();
        loop {
            let (len, pending, delayed) = self.residue().await.unwrap_or((1, 1, 1));
            let done = self.terminal_count();
            let quiet = done >= self.plan.len()
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
                    "not settled by the deadline: {done}/{} slots with an outcome, stream {len} ({pending} pending), delayed {delayed}, CMS in flight {}",
                    self.plan.len(),
                    self.stack.cms.in_flight()
                ));
                return false;
            }
            if last_report.elapsed() >= Duration::from_secs(10) {
                last_report = Instant::now();
                self.log(format!(
                    "settling: {done}/{} slots with an outcome, stream {len} ({pending} pending), delayed {delayed}",
                    self.plan.len()
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
        for p in &procs {
            signal(p.pid(), nix::sys::signal::Signal::SIGCONT);
            signal(p.pid(), nix::sys::signal::Signal::SIGTERM);
        }
        let exits = tokio::task::spawn_blocking(move || {
            procs
                .into_iter()
                .map(|mut p| {
                    let st = p.wait_timeout(Duration::from_secs(15));
                    (p.name.clone(), st)
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        for (name, st) in &exits {
            match st {
                Some(s) if s.success() => {}
                other => self.note(format!(
                    "worker {name} did not exit cleanly on SIGTERM: {other:?}"
                )),
            }
        }
        self.exits.lock().unwrap().extend(exits);
    }
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

fn signal(pid: i32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig);
}

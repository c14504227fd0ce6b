//! Postgres that does not cooperate, with real worker processes: a kind's
//! quota row locked by another session, the worker's backends terminated
//! between the CMS's answer and the outcome's commit, a worker whose clock
//! runs ahead of the database's. Each test verifies that its fault happened
//! and judges the end state from Postgres and the stand-in CMS.
//!
//! The Postgres session settings are passed through their environment
//! variables (not flags), so these tests run unchanged against a worker
//! that does not know them yet.

use chrono::{Duration as CDuration, Utc};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::cms::{Cms, Reply};
use testkit::process::Proc;
use testkit::stack::{Bins, Stack};
use testkit::wait_for;

fn worker_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_worker"))
}

/// The zone every test here plans in: there the process started
/// ([`testkit::zone::process_start`]) between 09:00 and 10:00, so slot
/// times a few seconds (or an hour) from now fall on the same local day
/// whatever the time of day the suite runs at (`HH:MM:SS` of a UTC kind
/// planned for "today" just before 00:00 UTC would land ~24 h in the past).
fn zone() -> testkit::zone::Zone {
    testkit::zone::around_noon(
        testkit::zone::process_start(),
        Duration::from_secs(6 * 3600),
    )
}

/// Local `HH:MM:SS` in [`zone`] `secs` from now, for a slot of a
/// compressed day.
fn at(secs: i64) -> String {
    zone().hms(Utc::now() + CDuration::seconds(secs))
}

/// A kind in [`zone`] with `times`, jitter 0 and a long starting deadline.
fn kind(name: &str, times: &[String], cap: u32, extra: &str) -> String {
    let slots: Vec<String> = times.iter().map(|t| format!("{t:?}")).collect();
    format!(
        "[[kinds]]\nname = {name:?}\ntimezone = {:?}\nslots = [{}]\njitter = \"0\"\ndaily_cap = {cap}\nstarting_deadline = \"48h\"\n{extra}\n",
        zone().name(),
        slots.join(", ")
    )
}

/// The shared stack and the day its slots fall on.
struct Pg {
    stack: Stack,
    day: String,
}

impl std::ops::Deref for Pg {
    type Target = Stack;
    fn deref(&self) -> &Stack {
        &self.stack
    }
}

impl Pg {
    async fn new(config: &str) -> Pg {
        Pg {
            stack: Stack::builder(Bins::beside(worker_bin()))
                .tag("pg")
                .build(config)
                .await,
            day: zone().day(Utc::now()).to_string(),
        }
    }

    /// A worker whose wall clock runs `offset` (libfaketime syntax, e.g.
    /// "+40s") off the test's. Preloaded directly rather than through
    /// the `faketime` wrapper, which forks: killing the wrapper would leave
    /// the worker running.
    fn skewed_worker(&self, id: &str, offset: &str, args: &[&str]) -> Proc {
        let lib = testkit::process::libfaketime()
            .expect("libfaketime (apt-get install faketime; scripts/test.sh does it as root)");
        let envs = testkit::process::clock_offset_envs(lib.to_str().unwrap(), offset);
        let envs: Vec<(&str, &str)> = envs.iter().map(|(k, v)| (*k, v.as_str())).collect();
        self.worker(id, args, &envs)
    }

    async fn drafts(&self, kind: &str, n: usize) {
        sqlx::query(
            "INSERT INTO draft (kind, title, ready_at)
             SELECT $1, $1 || ' ' || i, now() - make_interval(secs => 600 - i) FROM generate_series(1, $2) i",
        )
        .bind(kind)
        .bind(n as i32)
        .execute(&self.db().pool)
        .await
        .unwrap();
    }

    async fn count(&self, sql: &str) -> i64 {
        testkit::count(&self.db().pool, sql).await
    }

    /// Terminates every backend of this test's workers; returns how many.
    async fn terminate_workers_backends(&self) -> i64 {
        self.count(&format!(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
              WHERE datname = '{}' AND application_name = 'slotgate'",
            self.db().name
        ))
        .await
    }

    /// Waits until `n` slots are published and no delivery is left in the
    /// stream (every entry acknowledged).
    async fn wait_published(&self, n: i64, timeout: Duration) {
        wait_for(&format!("{n} published slots"), timeout, || async {
            let done = self
                .count("SELECT count(*) FROM publish_slot WHERE state = 'published'")
                .await;
            let mut c = self.redis.conn().await;
            let pending: redis::Value = redis::cmd("XPENDING")
                .arg(
                    slotgate::queue::KeySpace::new(self.redis.prefix.as_str())
                        .part(0)
                        .ready(),
                )
                .arg("workers")
                .query_async(&mut c)
                .await
                .unwrap_or(redis::Value::Nil);
            let pending = match pending {
                redis::Value::Array(v) => match v.first() {
                    Some(redis::Value::Int(n)) => *n,
                    _ => 0,
                },
                _ => 0,
            };
            let delayed: i64 = redis::cmd("ZCARD")
                .arg(
                    slotgate::queue::KeySpace::new(self.redis.prefix.as_str())
                        .part(0)
                        .delayed(),
                )
                .query_async(&mut c)
                .await
                .unwrap_or(0);
            (done >= n && pending == 0 && delayed == 0).then_some(())
        })
        .await
    }

    /// Every slot published once: one gate row, one draft, one published
    /// execution each, and no duplicate recorded.
    async fn assert_published_once(&self, n: i64) {
        assert_eq!(self.count("SELECT count(*) FROM publish_slot").await, n);
        assert_eq!(
            self.count("SELECT count(*) FROM publish_slot WHERE state = 'published'")
                .await,
            n
        );
        assert_eq!(
            self.count("SELECT count(DISTINCT post_id) FROM publish_slot")
                .await,
            n,
            "a draft bound to two slots"
        );
        assert_eq!(
            self.count("SELECT count(*) FROM draft WHERE status = 'published'")
                .await,
            n
        );
        assert_eq!(
            self.count("SELECT count(*) FROM execution WHERE outcome = 'published'")
                .await,
            n,
            "one published execution per slot"
        );
        assert_eq!(
            self.count("SELECT count(*) FROM execution WHERE reason = 'slot_taken'")
                .await,
            0,
            "no duplicate recorded"
        );
    }
}

/// Publish calls the CMS received, per Idempotency-Key.
fn publish_calls_per_key(cms: &Cms) -> HashMap<String, usize> {
    let mut per_key = HashMap::new();
    for c in cms.calls_to("/publish") {
        *per_key.entry(c.key.unwrap_or_default()).or_default() += 1;
    }
    per_key
}

/// Another session runs `lock` (a `FOR UPDATE` or `LOCK TABLE`) in a
/// transaction it keeps open: the transaction and its backend's pid.
async fn hold_lock(
    pool: &sqlx::PgPool,
    lock: &str,
) -> (sqlx::Transaction<'static, sqlx::Postgres>, i32) {
    let mut holder = pool.begin().await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    sqlx::query(lock).execute(&mut *holder).await.unwrap();
    (holder, pid)
}

/// Whether the backend `pid` holds a granted lock on table `daily_quota`
/// inside an open transaction (a `SELECT … FOR UPDATE` takes RowShareLock).
async fn holds_quota_lock(pool: &sqlx::PgPool, pid: i32) -> bool {
    testkit::count(
        pool,
        &format!(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
              JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.pid = {pid} AND c.relname = 'daily_quota' AND l.mode = 'RowShareLock'
               AND l.granted AND a.state = 'idle in transaction'"
        ),
    )
    .await
        == 1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_row_locked_for_45s_stalls_only_its_own_kind() {
    // 40 slots of "stuck" fall due first, 10 of "other" two seconds later:
    // without a lock timeout, the stuck ones fill every in-flight permit.
    let stuck: Vec<String> = vec![at(6); 40];
    let other: Vec<String> = vec![at(8); 10];
    let s = Pg::new(&format!(
        "{}{}",
        kind("stuck", &stuck, 100, ""),
        kind("other", &other, 100, "")
    ))
    .await;
    s.drafts("stuck", 40).await;
    s.drafts("other", 10).await;
    sqlx::query("INSERT INTO daily_quota (kind, day, used) VALUES ('stuck', $1::date, 0)")
        .bind(&s.day)
        .execute(&s.db().pool)
        .await
        .unwrap();
    // Another session locks the stuck kind's quota row and keeps its
    // transaction open.
    let (holder, pid) = hold_lock(
        &s.db().pool,
        "SELECT used FROM daily_quota WHERE kind = 'stuck' FOR UPDATE",
    )
    .await;
    let locked_at = Instant::now();
    assert!(
        holds_quota_lock(&s.db().pool, pid).await,
        "the quota row is locked"
    );
    s.planner(&["plan", "--day", &s.day]);
    let envs = [("SLOTGATE_PG_LOCK_TIMEOUT", "300ms")];
    let args = ["--batch", "1", "--concurrency", "4"];
    let mut workers: Vec<Proc> = (0..2)
        .map(|i| s.worker(&format!("w{i}"), &args, &envs))
        .collect();
    wait_for(
        "the other kind's 10 slots, while the lock is held",
        Duration::from_secs(35),
        || async {
            (s.count(
                "SELECT count(*) FROM publish_slot WHERE kind = 'other' AND state = 'published'",
            )
            .await
                == 10)
                .then_some(())
        },
    )
    .await;
    assert!(
        holds_quota_lock(&s.db().pool, pid).await,
        "the lock was held all along"
    );
    assert_eq!(
        s.count("SELECT count(*) FROM publish_slot WHERE kind = 'stuck'")
            .await,
        0,
        "no stuck slot got past its quota row"
    );
    let (max_lag, avg_lag): (f64, f64) = sqlx::query_as(
        "SELECT max(extract(epoch FROM started_at - due_at))::float8, avg(extract(epoch FROM started_at - due_at))::float8
           FROM execution WHERE kind = 'other' AND outcome = 'published'",
    )
    .fetch_one(&s.db().pool)
    .await
    .unwrap();
    eprintln!("other kind's lag while the stuck kind's quota row was locked: max {max_lag:.3} s, mean {avg_lag:.3} s");
    assert!(max_lag <= 10.0, "the other kind ran {max_lag:.3} s late");
    // Keep the row locked for 45 s in all, then let go.
    let hold = Duration::from_secs(45).saturating_sub(locked_at.elapsed());
    tokio::time::sleep(hold).await;
    assert!(holds_quota_lock(&s.db().pool, pid).await);
    holder.rollback().await.unwrap();
    let released_at = Instant::now();
    s.wait_published(50, Duration::from_secs(90)).await;
    eprintln!(
        "the stuck kind's 40 slots published {:?} after the release",
        released_at.elapsed()
    );
    s.assert_published_once(50).await;
    let timed_out = workers
        .iter()
        .map(Proc::log_text)
        .filter(|l| l.contains("lock timeout"))
        .count();
    assert!(
        timed_out > 0,
        "the workers' statements hit the lock timeout"
    );
    for w in &mut workers {
        assert!(w.exited().is_none(), "{} runs", w.name);
    }
}

/// Issue 26: 20,001 deliveries of a kind stalled by a locked quota row
/// took one worker from 14 MB to 401 MB (held deliveries took no permit,
/// so intake read the whole stream) and each was touched on its own timer
/// (~17,000 Redis calls a second). Now a worker holds back at most
/// `MAX_HELD`, leaves the rest unread in the stream, and touches what it
/// holds in batches; once the row is free every delivery is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_under_20001_deliveries_holds_a_bounded_number() {
    const N: usize = 20_001;
    // 4,001 slots a day and the longest deadline (7 days), so that each
    // of the 5 days before today (in the test's zone) is due and within
    // it, whatever the time of day: 20,001 distinct slots, each with a
    // draft.
    const PER_DAY: usize = 4_001;
    let times = vec!["00:00".to_owned(); PER_DAY];
    let s = Pg::new(&kind("stuck", &times, PER_DAY as u32, "").replace("\"48h\"", "\"7d\"")).await;
    sqlx::query(
        "INSERT INTO draft (kind, title, ready_at)
         SELECT 'stuck', 'stuck ' || i, now() - interval '1 day' FROM generate_series(1, $1) i",
    )
    .bind(N as i32)
    .execute(&s.db().pool)
    .await
    .unwrap();
    // Another session takes a lock on the quota table that lets every
    // read through but no write, and keeps its transaction open.
    let (holder, pid) = hold_lock(&s.db().pool, "LOCK TABLE daily_quota IN EXCLUSIVE MODE").await;
    let locked = || async {
        s.count(&format!(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
              WHERE l.pid = {pid} AND c.relname = 'daily_quota' AND l.mode = 'ExclusiveLock' AND l.granted"
        ))
        .await
            == 1
    };
    assert!(locked().await, "the quota table is locked");
    let ready = slotgate::queue::KeySpace::new(s.redis.prefix.as_str())
        .part(0)
        .ready();
    let yesterday = zone().day(Utc::now()) - CDuration::days(1);
    let slots: Vec<String> = (0..N)
        .map(|i| {
            let day = yesterday - CDuration::days((i / PER_DAY) as i64);
            format!("stuck:{day}:{}", i % PER_DAY + 1)
        })
        .collect();
    let mut c = s.redis.conn().await;
    for chunk in slots.chunks(1000) {
        let mut p = redis::pipe();
        for slot in chunk {
            p.cmd("XADD")
                .arg(&ready)
                .arg("*")
                .arg("slot")
                .arg(slot)
                .arg("caller")
                .arg("planner")
                .ignore();
        }
        p.query_async::<()>(&mut c).await.unwrap();
    }
    let w = s.worker("w", &[], &[("SLOTGATE_PG_LOCK_TIMEOUT", "300ms")]);
    // Both, in either order: a read may reach the bound while its
    // deliveries' gates still wait out the lock timeout.
    wait_for(
        "the worker at its bound of held deliveries, its deliveries met the lock",
        Duration::from_secs(90),
        || async {
            let log = w.log_text();
            (log.contains("holding back the most deliveries a worker may")
                && log.contains("lock timeout"))
            .then_some(())
        },
    )
    .await;
    let pending = || async {
        let mut c = s.redis.conn().await;
        let v: redis::Value = redis::cmd("XPENDING")
            .arg(&ready)
            .arg("workers")
            .query_async(&mut c)
            .await
            .unwrap();
        match v {
            redis::Value::Array(v) => match v.first() {
                Some(redis::Value::Int(n)) => *n,
                _ => 0,
            },
            _ => 0,
        }
    };
    let held = pending().await;
    assert!(locked().await, "the lock was held all along");
    assert_eq!(
        s.count("SELECT count(*) FROM execution").await,
        0,
        "nothing got past the locked row"
    );
    // At most the bound in hand (what a failing task hands back while
    // it is still counted in flight may pass it briefly).
    assert!(
        held <= 2_000 + 64,
        "{held} deliveries pending for the worker"
    );
    let peak = w.peak_rss_mib().expect("the worker's peak RSS");
    eprintln!("stalled kind, {N} deliveries: {held} held by the worker, peak RSS {peak:.1} MiB");
    assert!(peak < 100.0, "the worker peaked at {peak:.1} MiB");
    holder.rollback().await.unwrap();
    wait_for(
        &format!("{N} recorded deliveries"),
        Duration::from_secs(300),
        || async { (s.count("SELECT count(*) FROM execution").await == N as i64).then_some(()) },
    )
    .await;
    assert_eq!(
        s.count("SELECT count(*) FROM execution WHERE outcome = 'published'")
            .await,
        N as i64
    );
    let peak = w.peak_rss_mib().expect("the worker's peak RSS");
    eprintln!("after the {N} deliveries ran: peak RSS {peak:.1} MiB");
    assert!(peak < 100.0, "the worker peaked at {peak:.1} MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_terminated_after_the_cms_answered_do_not_call_it_twice() {
    let cms = Cms::start().await;
    let release = Arc::new(tokio::sync::Notify::new());
    cms.script("/publish", [Reply::Hold(release.clone(), 200)]);
    let extra = format!(
        "publish_url = {:?}\nhttp_timeout = \"90s\"",
        cms.url("/publish")
    );
    let s = Pg::new(&kind("a", &[at(0)], 5, &extra)).await;
    s.drafts("a", 3).await;
    let key = format!("a:{}:1", s.day);
    let ready = slotgate::queue::KeySpace::new(s.redis.prefix.as_str()).ready();
    s.redis.deliver(&ready, &key, "planner").await;
    let w = s.worker("wa", &["--batch", "1"], &[]);
    wait_for("the publish call", Duration::from_secs(15), || async {
        (!cms.calls_to("/publish").is_empty()).then_some(())
    })
    .await;
    // Every backend of the worker goes, then the CMS answers at once: the
    // worker learns of it only when it stores the outcome.
    let terminated = s.terminate_workers_backends().await;
    release.notify_one();
    assert!(terminated >= 1, "a backend of the worker was terminated");
    s.wait_published(1, Duration::from_secs(30)).await;
    // (Before the fix the slot was published only by a second call: the
    // retry recorded slot_taken, the claim lapsed and was resumed.)
    let calls = cms.calls_to("/publish");
    assert_eq!(calls.len(), 1, "the CMS was called again: {calls:?}");
    assert_eq!(calls[0].key.as_deref(), Some(key.as_str()));
    s.assert_published_once(1).await;
    let log = w.log_text();
    assert!(
        log.contains("storing the outcome failed"),
        "the store error after the call happened: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_terminated_before_a_batch_is_recorded_do_not_call_the_cms_twice() {
    let cms = Cms::start().await;
    let release = Arc::new(tokio::sync::Notify::new());
    // The first delivery is read alone and published at once; the next
    // three are read together and go through the batch path, their calls
    // held open.
    cms.script(
        "/publish",
        [
            Reply::Status(200),
            Reply::Hold(release.clone(), 200),
            Reply::Hold(release.clone(), 200),
            Reply::Hold(release.clone(), 200),
        ],
    );
    let extra = format!(
        "publish_url = {:?}\nhttp_timeout = \"90s\"",
        cms.url("/publish")
    );
    let s = Pg::new(&kind("a", &vec![at(0); 4], 10, &extra)).await;
    s.drafts("a", 6).await;
    // Planned (the batch path decides planned slots only), due at once.
    s.planner(&["plan", "--day", &s.day]);
    let w = s.worker("wa", &["--batch", "8", "--concurrency", "1"], &[]);
    wait_for(
        "three held publish calls",
        Duration::from_secs(15),
        || async { (cms.in_flight() == 3).then_some(()) },
    )
    .await;
    let terminated = s.terminate_workers_backends().await;
    release.notify_waiters();
    assert!(terminated >= 1, "a backend of the worker was terminated");
    s.wait_published(4, Duration::from_secs(30)).await;
    let per_key = publish_calls_per_key(&cms);
    assert_eq!(per_key.len(), 4, "{per_key:?}");
    assert!(
        per_key.values().all(|n| *n == 1),
        "the CMS was called again: {per_key:?}"
    );
    s.assert_published_once(4).await;
    let log = w.log_text();
    assert!(
        log.contains("storing the outcome failed") && log.contains(r#"slot="batch""#),
        "the store error after the batch's calls happened: {log}"
    );
}

/// A CMS that holds its calls open holds up only its own kind: the slots
/// read with its slots, and the reads after them, go on, and its kind
/// never holds more than its share of the worker's call permits. (When a
/// chunk of calls held its permit and its record until its slowest call
/// returned, the fast slots in the slow calls' chunks stayed unrecorded;
/// and with a call permit per call but no share, the slow kind's ten
/// slots took all eight permits and every kind waited.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_held_open_at_one_kinds_cms_hold_up_no_other_kind() {
    // 2 × 4 = 8 call permits; a kind's share is 4 (all but a read's worth
    // of 4, or half).
    let slow_calls = slow_cmss_hold_up_no_other_kind(&[&["aslow"]], Fast::Calls).await;
    assert_eq!(slow_calls, 4, "the slow kind called for its share only");
}

/// Two kinds whose CMSs hold their calls open hold up no third kind
/// either: the last permit is kept for kinds that hold no call (with a
/// share per kind alone, the two took all eight permits between them and
/// the fast kind waited for their timeouts).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_held_open_at_two_kinds_cmss_hold_up_no_third_kind() {
    // 8 call permits; a kind's share is 4, all kinds together may hold 7,
    // and the last is a foothold for a kind that holds none.
    let slow_calls = slow_cmss_hold_up_no_other_kind(&[&["aslow"], &["bslow"]], Fast::Calls).await;
    assert!(
        (1..=7).contains(&slow_calls),
        "the slow kinds left the last permit: {slow_calls} calls"
    );
}

/// Four kinds whose CMSs hold their calls open take every call permit
/// (shares and footholds: 4 + 3 + 1), and no webhook slot of any other
/// kind can be called until one returns; but they hold up no record-only
/// kind: a read admits no more calls than permits are free, so the fourth
/// kind's slots wait in intake and the reads go on. (When its foothold was
/// admitted with no permit free, intake waited for one, and every kind
/// with it, until the calls' timeouts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_held_open_at_four_kinds_cmss_hold_up_no_record_only_kind() {
    let slow: [&[&str]; 4] = [&["aslow"], &["bslow"], &["cslow"], &["dslow"]];
    let slow_calls = slow_cmss_hold_up_no_other_kind(&slow, Fast::RecordOnly).await;
    assert_eq!(slow_calls, 8, "the slow kinds held every permit");
}

/// Four kinds of one CMS that holds its calls open (a site with four
/// kinds) hold up no kind of another CMS: they take one CMS's foothold
/// between them. (With a foothold per kind, three of them took the last
/// permits, and the other CMS's kind waited for their timeouts.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_held_open_at_one_cms_of_four_kinds_hold_up_no_other_cms() {
    let slow: [&[&str]; 1] = [&["aslow", "bslow", "cslow", "dslow"]];
    let slow_calls = slow_cmss_hold_up_no_other_kind(&slow, Fast::Calls).await;
    assert_eq!(
        slow_calls, 7,
        "the slow CMS's kinds left the last permit: a share, then the rest but a foothold"
    );
}

/// What the kind `fast` of [`slow_cmss_hold_up_no_other_kind`] is.
#[derive(Clone, Copy)]
enum Fast {
    /// A webhook kind whose CMS answers at once.
    Calls,
    /// A record-only kind: it takes no call permit.
    RecordOnly,
}

/// Ten slots of each of `slow` kinds (each inner list the kinds of one
/// CMS, which holds every publish open until released) and 24 of a kind
/// `fast` (of a CMS of its own that answers at once, or record-only), all
/// due,
/// one worker with `--concurrency 2 --batch 4`: every fast slot is
/// recorded while the slow calls are open, and no slow slot is; then the
/// slow calls are let go and every slot is published once → how many
/// slow calls were open meanwhile. (The slow kinds sort first, so their
/// slots are read first.)
async fn slow_cmss_hold_up_no_other_kind(slow_cmss: &[&[&str]], fast: Fast) -> usize {
    let release = Arc::new(tokio::sync::Notify::new());
    let mut config = String::new();
    // Each slow kind with the CMS it calls; each slow CMS once.
    let mut slow: Vec<(&str, Arc<Cms>)> = Vec::new();
    let mut servers: Vec<Arc<Cms>> = Vec::new();
    for kinds in slow_cmss {
        let cms = Arc::new(Cms::start().await);
        servers.push(cms.clone());
        let held = release.clone();
        cms.set_chooser(Some(Arc::new(move |_, _, _| {
            Some(Reply::Hold(held.clone(), 200))
        })));
        for k in kinds.iter() {
            let extra = format!(
                "publish_url = {:?}\nhttp_timeout = \"90s\"",
                cms.url(&format!("/slow-{k}"))
            );
            config += &kind(k, &vec![at(0); 10], 10, &extra);
            slow.push((k, cms.clone()));
        }
    }
    let fast_cms = Cms::start().await;
    let fast = match fast {
        Fast::Calls => format!("publish_url = {:?}", fast_cms.url("/publish")),
        Fast::RecordOnly => String::new(),
    };
    config += &kind("fast", &vec![at(0); 24], 30, &fast);
    let s = Pg::new(&config).await;
    for (k, _) in &slow {
        s.drafts(k, 10).await;
    }
    s.drafts("fast", 24).await;
    s.planner(&["plan", "--day", &s.day]);
    let w = s.worker("w", &["--concurrency", "2", "--batch", "4"], &[]);
    wait_for(
        "every fast slot recorded while the slow calls are open",
        Duration::from_secs(30),
        || async {
            (s.count(
                "SELECT count(*) FROM execution WHERE kind = 'fast' AND outcome = 'published'",
            )
            .await
                == 24)
                .then_some(())
        },
    )
    .await;
    let slow_calls = || -> usize {
        (slow.iter())
            .map(|(k, cms)| cms.calls_to(&format!("/slow-{k}")).len())
            .sum()
    };
    let open = slow_calls();
    let in_flight: usize = servers.iter().map(|cms| cms.in_flight()).sum();
    assert_eq!(in_flight, open, "the slow kinds' calls are still open");
    assert_eq!(
        s.count("SELECT count(*) FROM execution WHERE kind <> 'fast'")
            .await,
        0,
        "no slow slot is recorded before its call returns"
    );
    // The slow CMSs answer at once from now on; the open calls are let go.
    for cms in &servers {
        cms.set_chooser(None);
    }
    release.notify_waiters();
    let all = 24 + 10 * slow.len() as i64;
    s.wait_published(all, Duration::from_secs(30)).await;
    s.assert_published_once(all).await;
    assert_eq!(slow_calls(), 10 * slow.len(), "{}", w.log_text());
    open
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_40s_ahead_takes_over_no_live_claim() {
    let cms = Cms::start().await;
    // Every publish takes 8 s: the claims outlive the 3 s visibility many
    // times over and live only by their heartbeats.
    cms.set_chooser(Some(Arc::new(|_, _, _| {
        Some(Reply::Delay(Duration::from_secs(8), 200))
    })));
    let extra = format!(
        "publish_url = {:?}\nhttp_timeout = \"90s\"",
        cms.url("/publish")
    );
    let s = Pg::new(&kind("a", &vec![at(0); 3], 20, &extra)).await;
    s.drafts("a", 6).await;
    let keys: Vec<String> = (1..=3).map(|n| format!("a:{}:{n}", s.day)).collect();
    let ready = slotgate::queue::KeySpace::new(s.redis.prefix.as_str()).ready();
    for k in &keys {
        s.redis.deliver(&ready, k, "planner").await;
    }
    // The normal worker claims all three and is busy publishing them.
    let args = ["--batch", "1", "--concurrency", "3"];
    let _normal = s.worker("normal", &args, &[]);
    wait_for("three publish calls", Duration::from_secs(15), || async {
        (cms.calls_to("/publish").len() == 3).then_some(())
    })
    .await;
    // A worker whose clock runs 40 s ahead gets a duplicate of each slot
    // (the normal worker has no permit free to read them).
    let fast = s.skewed_worker("fast", "+40s", &args);
    wait_for(
        "the skewed worker to start",
        Duration::from_secs(15),
        || async { fast.log_text().contains("worker starting").then_some(()) },
    )
    .await;
    for k in &keys {
        s.redis.deliver(&ready, k, "manual").await;
    }
    wait_for(
        "the duplicates to be handled",
        Duration::from_secs(30),
        || async {
            (s.count("SELECT count(*) FROM execution WHERE caller = 'manual'")
                .await
                == 3)
                .then_some(())
        },
    )
    .await;
    s.wait_published(3, Duration::from_secs(30)).await;
    let per_key = publish_calls_per_key(&cms);
    assert_eq!(per_key.len(), 3, "{per_key:?}");
    assert!(
        per_key.values().all(|n| *n == 1),
        "a slot's CMS call was made twice: {per_key:?}"
    );
    assert_eq!(
        s.count("SELECT count(*) FROM publish_slot WHERE attempt = 1 AND claimed_by = 'normal' AND state = 'published'")
            .await,
        3,
        "a live claim was taken over"
    );
    assert_eq!(
        s.count(
            "SELECT count(*) FROM execution WHERE outcome = 'published' AND worker_id = 'normal'"
        )
        .await,
        3
    );
    // The fault: the skewed worker met the live claims (the duplicates were
    // its), with its clock really 40 s ahead (its started_at come from it).
    assert_eq!(
        s.count("SELECT count(*) FROM execution WHERE caller = 'manual' AND worker_id = 'fast' AND reason = 'slot_taken' AND detail->'replay'->>'claimed_by' = 'normal' AND started_at - due_at > interval '30 seconds'")
            .await,
        3,
        "the skewed worker blocked the three duplicates"
    );
    assert!(
        fast.log_text().contains("ahead of Postgres"),
        "{}",
        fast.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_worker_warns_and_planner_status_shows_it() {
    let s = Pg::new(&kind("a", &[at(3600)], 5, "")).await;
    let metrics = format!("127.0.0.1:{}", testkit::server::pick_port());
    let fast = s.skewed_worker("fast", "+5s", &["--metrics-addr", &metrics]);
    let normal = s.worker("normal", &[], &[]);
    wait_for("the skew warning", Duration::from_secs(15), || async {
        fast.log_text().contains("ahead of Postgres").then_some(())
    })
    .await;
    let line = fast
        .log_text()
        .lines()
        .find(|l| l.contains("ahead of Postgres"))
        .unwrap()
        .to_owned();
    assert!(line.contains("WARN"), "{line}");
    let status = wait_for(
        "both workers' clocks in status",
        Duration::from_secs(15),
        || async {
            let out = s.planner(&["status", "--json"]);
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            (v["clocks"]["fast"].is_object() && v["clocks"]["normal"].is_object()).then_some(v)
        },
    )
    .await;
    let fast_skew = status["clocks"]["fast"]["skew_ms"].as_i64().unwrap();
    let normal_skew = status["clocks"]["normal"]["skew_ms"].as_i64().unwrap();
    assert!((4000..=6000).contains(&fast_skew), "{status}");
    assert!(normal_skew.abs() < 1000, "{status}");
    assert_eq!(status["clocks"]["fast"]["off"], true, "{status}");
    assert_eq!(status["clocks"]["normal"]["off"], false, "{status}");
    let text = s.planner(&["status"]);
    let fast_line = text
        .lines()
        .find(|l| l.contains("fast") && l.contains("clock"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        fast_line.contains("ahead") && fast_line.contains("WARN"),
        "{text}"
    );
    assert!(!normal.log_text().contains("ahead of Postgres"));
    // The offset is a metric too, for an alert that does not read logs.
    let skew: f64 = wait_for("the skew metric", Duration::from_secs(15), || async {
        let (_, body) = testkit::http_get(&metrics, "/metrics").await.ok()?;
        body.lines()
            .find(|l| l.starts_with("slotgate_worker_clock_skew_seconds "))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    })
    .await;
    assert!((4.0..=6.0).contains(&skew), "{skew}");
}

#[test]
fn postgres_settings_out_of_bounds_exit_2_naming_the_flag() {
    for (args, envs, flag) in [
        (
            vec!["--pg-lock-timeout", "20s"],
            vec![],
            "--pg-lock-timeout",
        ),
        (
            vec!["--pg-keepalive-idle", "3h"],
            vec![],
            "--pg-keepalive-idle",
        ),
        (
            vec![],
            vec![("SLOTGATE_PG_KEEPALIVE_COUNT", "0")],
            "--pg-keepalive-count",
        ),
        (
            vec![],
            vec![("SLOTGATE_PG_STATEMENT_TIMEOUT", "soon")],
            "--pg-statement-timeout",
        ),
    ] {
        let out = std::process::Command::new(worker_bin())
            .args([
                "--database-url",
                "postgres://127.0.0.1:1/x",
                "--redis-url",
                "redis://127.0.0.1:1/",
            ])
            .args(&args)
            .envs(envs.iter().copied())
            .output()
            .expect("worker");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} {envs:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?} {envs:?}: {stderr}");
    }
}

//! Faults with real worker processes: kill -9, SIGSTOP, SIGTERM, a wiped
//! Redis prefix, terminated and stopped Postgres. Each test judges the end
//! state from Postgres (and the stand-in CMS where there is one): every
//! planned slot ends exactly once, within the cap, no draft published twice.

use chrono::{Duration as CDuration, Utc};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use testkit::cms::{Cms, Reply};
use testkit::process::Proc;
use testkit::server::{OwnedPostgres, OwnedRedis};
use testkit::{wait_for, TestDb, TestRedis};

fn worker_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_worker"))
}

fn planner_bin() -> PathBuf {
    testkit::process::sibling(&worker_bin(), "planner")
}

/// The zone every test here plans in: it was about noon there when the
/// process started ([`testkit::zone::process_start`]), so slot times a few
/// seconds from now never wrap past a local midnight.
fn zone() -> testkit::zone::Zone {
    testkit::zone::around_noon(testkit::zone::process_start(), Duration::from_secs(600))
}

/// Local times `offsets` seconds from now, for a compressed day.
fn times_from_now(offsets: &[i64]) -> Vec<String> {
    let now = Utc::now();
    let z = zone();
    offsets
        .iter()
        .map(|s| z.hms(now + CDuration::seconds(*s)))
        .collect()
}

fn kind_toml(name: &str, times: &[String], cap: u32, extra: &str) -> String {
    let slots: Vec<String> = times.iter().map(|t| format!("\"{t}\"")).collect();
    format!("[[kinds]]\nname = \"{name}\"\ntimezone = \"{}\"\nslots = [{}]\njitter = \"0\"\ndaily_cap = {cap}\nstarting_deadline = \"48h\"\n{extra}\n", zone().name(), slots.join(", "))
}

/// `kill -9` of `p`, verified: it exits with SIGKILL.
fn kill_9(p: &mut Proc) {
    if let Err(status) = p.kill_9() {
        panic!("{} exited by itself: {status}", p.name);
    }
}

struct Cluster {
    db_url: String,
    pool: sqlx::PgPool,
    redis: TestRedis,
    dir: PathBuf,
    config: PathBuf,
    day: String,
}

impl Cluster {
    async fn new(db: &TestDb, config: &str) -> Cluster {
        Self::on(db.url.clone(), db.pool.clone(), TestRedis::new(), config).await
    }

    async fn on(db_url: String, pool: sqlx::PgPool, redis: TestRedis, config: &str) -> Cluster {
        let dir = std::env::temp_dir().join(format!("slotgate-faults-{}", redis.prefix));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("slotgate.toml");
        std::fs::write(&path, config).unwrap();
        Cluster {
            db_url,
            pool,
            redis,
            dir,
            config: path,
            day: zone().day(Utc::now()).to_string(),
        }
    }

    fn envs(&self) -> Vec<(&str, &str)> {
        vec![
            ("DATABASE_URL", self.db_url.as_str()),
            ("REDIS_URL", self.redis.url.as_str()),
            ("SLOTGATE_PREFIX", self.redis.prefix.as_str()),
            ("SLOTGATE_CONFIG", self.config.to_str().unwrap()),
        ]
    }

    fn worker(&self, id: &str, extra: &[&str]) -> Proc {
        // Defaults, each overridable by `extra` (clap rejects a repeated flag).
        let mut args = vec!["--id", id];
        for (flag, value) in [
            ("--lease-ttl", "3s"),
            ("--visibility", "3s"),
            ("--reconcile-every", "1s"),
            ("--concurrency", "4"),
        ] {
            if !extra.contains(&flag) {
                args.extend([flag, value]);
            }
        }
        args.extend_from_slice(extra);
        Proc::spawn(id, &worker_bin(), &args, &self.envs(), &self.dir)
    }

    fn planner(&self, args: &[&str]) -> String {
        testkit::process::run_ok(&planner_bin(), args, &self.envs())
    }

    async fn drafts(&self, kind: &str, n: usize) {
        for i in 0..n {
            sqlx::query("INSERT INTO draft (kind, title, ready_at) VALUES ($1, $2, now() - make_interval(secs => $3))")
                .bind(kind)
                .bind(format!("{kind} {i}"))
                .bind((n - i) as f64)
                .execute(&self.pool)
                .await
                .unwrap();
        }
    }

    async fn leader(&self) -> Option<String> {
        let mut c = self.redis.conn().await;
        redis::cmd("GET")
            .arg(slotgate::queue::KeySpace::new(self.redis.prefix.as_str()).leader())
            .query_async(&mut c)
            .await
            .unwrap()
    }

    async fn xadd(&self, slot: &str, caller: &str) {
        let ready = slotgate::queue::KeySpace::new(self.redis.prefix.as_str()).ready();
        self.redis.deliver(&ready, slot, caller).await;
    }

    async fn count(&self, sql: &str) -> i64 {
        testkit::count(&self.pool, sql).await
    }

    /// Waits until `n` slots have a terminal gate row and nothing is queued.
    async fn wait_settled(&self, n: i64, timeout: Duration) {
        wait_for(&format!("{n} settled slots"), timeout, || async {
            let done = self.count("SELECT count(*) FROM publish_slot WHERE state IN ('published', 'skipped', 'failed')").await;
            if done < n {
                return None;
            }
            let mut c = self.redis.conn().await;
            let len: i64 = redis::cmd("XLEN").arg(slotgate::queue::KeySpace::new(self.redis.prefix.as_str()).part(0).ready()).query_async(&mut c).await.unwrap_or(0);
            let delayed: i64 = redis::cmd("ZCARD").arg(slotgate::queue::KeySpace::new(self.redis.prefix.as_str()).part(0).delayed()).query_async(&mut c).await.unwrap_or(0);
            (len == 0 && delayed == 0).then_some(())
        })
        .await
    }

    /// The exactly-once invariants, from Postgres.
    async fn assert_exactly_once(&self, planned: i64, cap: i64) {
        assert_eq!(
            self.count("SELECT count(*) FROM planned_slot").await,
            planned
        );
        assert_eq!(
            self.count("SELECT count(*) FROM publish_slot").await,
            planned,
            "one gate row per planned slot"
        );
        assert_eq!(self.count("SELECT count(*) FROM publish_slot WHERE state NOT IN ('published', 'skipped', 'failed')").await, 0);
        let published = self
            .count("SELECT count(*) FROM publish_slot WHERE state = 'published'")
            .await;
        assert!(published <= cap, "published {published} > cap {cap}");
        assert_eq!(self.count("SELECT count(*) FROM (SELECT post_id FROM publish_slot WHERE post_id IS NOT NULL GROUP BY post_id HAVING count(*) > 1) d").await, 0, "a draft bound to two slots");
        assert_eq!(
            self.count("SELECT count(*) FROM draft WHERE status = 'published'")
                .await,
            published
        );
        assert_eq!(
            self.count("SELECT count(*) FROM execution WHERE outcome = 'published'")
                .await,
            published,
            "one published execution per published slot"
        );
    }
}

/// One slot delivered, and a CMS whose first publish call takes `delay` (the
/// client waits up to 90 s): the set-up of every mid-publish fault.
async fn slow_publish(db: &TestDb, delay: Duration, drafts: usize) -> (Cms, Cluster, String) {
    let cms = Cms::start().await;
    cms.script("/publish", [Reply::Delay(delay, 200)]);
    let extra = format!(
        "publish_url = \"{}\"\nhttp_timeout = \"90s\"",
        cms.url("/publish")
    );
    let c = Cluster::new(db, &kind_toml("a", &["00:00:00".to_owned()], 5, &extra)).await;
    c.drafts("a", drafts).await;
    let key = format!("a:{}:1", c.day);
    c.xadd(&key, "planner").await;
    (cms, c, key)
}

fn parse_lease(v: &str) -> (String, i64) {
    let (id, epoch) = v.rsplit_once(':').unwrap();
    (id.to_owned(), epoch.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_the_leader_fails_over_within_ttl_plus_1s_and_slots_still_run_once() {
    let db = TestDb::new().await;
    let times = times_from_now(&[5, 6, 7, 8, 9, 10]);
    let c = Cluster::new(&db, &kind_toml("a", &times, 10, "")).await;
    c.drafts("a", 10).await;
    c.planner(&["plan", "--day", &c.day]);
    let mut procs: Vec<Proc> = (0..3).map(|i| c.worker(&format!("w{i}"), &[])).collect();
    let first = wait_for("a leader", Duration::from_secs(15), || c.leader()).await;
    let (old_id, old_epoch) = parse_lease(&first);
    let victim = procs.iter().position(|p| p.name == old_id).unwrap();
    let killed_at = Instant::now();
    kill_9(&mut procs[victim]);
    let next = wait_for("a new leader", Duration::from_secs(10), || async {
        c.leader().await.filter(|v| parse_lease(v).0 != old_id)
    })
    .await;
    let failover = killed_at.elapsed();
    let (new_id, new_epoch) = parse_lease(&next);
    eprintln!(
        "failover after kill -9: {failover:?} ({old_id}:{old_epoch} -> {new_id}:{new_epoch})"
    );
    assert!(
        failover <= Duration::from_secs(4),
        "failover took {failover:?} > TTL + 1 s"
    );
    assert!(new_epoch > old_epoch);
    c.wait_settled(6, Duration::from_secs(40)).await;
    c.assert_exactly_once(6, 10).await;
    assert_eq!(
        c.count("SELECT count(*) FROM publish_slot WHERE state = 'published'")
            .await,
        6
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_ttl_steps_down_without_acting() {
    let db = TestDb::new().await;
    let times = times_from_now(&[6, 7, 8]);
    let c = Cluster::new(&db, &kind_toml("a", &times, 10, "")).await;
    c.drafts("a", 5).await;
    let procs: Vec<Proc> = (0..2).map(|i| c.worker(&format!("w{i}"), &[])).collect();
    let first = wait_for("a leader", Duration::from_secs(15), || c.leader()).await;
    let (old_id, _) = parse_lease(&first);
    let stale = procs.iter().find(|p| p.name == old_id).unwrap();
    stale.signal("STOP");
    // Slots planned while the leader sleeps: only the new leader may promote them.
    c.planner(&["plan", "--day", &c.day]);
    let next = wait_for("a new leader", Duration::from_secs(10), || async {
        c.leader().await.filter(|v| parse_lease(v).0 != old_id)
    })
    .await;
    // Keep it paused until the new leader acted on its own: it promoted the
    // slots planned meanwhile.
    wait_for(
        "the new leader to promote a slot",
        Duration::from_secs(20),
        || async { (c.count("SELECT count(*) FROM execution").await > 0).then_some(()) },
    )
    .await;
    let mark = stale.log_text().len();
    stale.signal("CONT");
    wait_for(
        "the stale leader to notice",
        // Its next tick (every TTL/3) decides at once; the margin is for a
        // loaded CI machine resuming a stopped process.
        Duration::from_secs(20),
        || async {
            // Either way of noticing counts: the renewal answered "not
            // yours" (lease lost), or its deadline, already past when the
            // process resumed, fired first (cannot renew). Both step down.
            stale.log_text()[mark..]
                .contains("; stepping down")
                .then_some(())
        },
    )
    .await;
    // Exactly one holder afterwards, and it is the new one.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let v = c.leader().await.expect("a leader");
        assert_eq!(parse_lease(&v).0, parse_lease(&next).0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = stale.log_text()[mark..].to_owned();
    // A pause can land between the tenure check and the Redis call it
    // guards: that one call goes out on resume, and the fence refuses it.
    // Any second try would mean the stale leader went on acting.
    assert!(
        after.matches("promotion refused").count() <= 1,
        "the stale leader went on trying to promote: {after}"
    );
    assert!(!after.contains("became leader"), "{after}");
    c.wait_settled(3, Duration::from_secs(30)).await;
    c.assert_exactly_once(3, 10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_webhook_resumes_with_the_same_key_and_draft() {
    let db = TestDb::new().await;
    let (cms, c, key) = slow_publish(&db, Duration::from_secs(60), 3).await;
    let mut a = c.worker("wa", &["--visibility", "2s"]);
    wait_for(
        "the first publish call",
        Duration::from_secs(15),
        || async { (!cms.calls_to("/publish").is_empty()).then_some(()) },
    )
    .await;
    kill_9(&mut a);
    let _b = c.worker("wb", &["--visibility", "2s"]);
    wait_for(
        "the slot to be published",
        Duration::from_secs(30),
        || async {
            (c.count("SELECT count(*) FROM publish_slot WHERE state = 'published'")
                .await
                == 1)
                .then_some(())
        },
    )
    .await;
    let calls = cms.calls_to("/publish");
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls.iter().all(|x| x.key.as_deref() == Some(key.as_str())));
    assert_eq!(
        calls[0].body["draft"]["id"], calls[1].body["draft"]["id"],
        "same draft"
    );
    let (attempt, claimed_by): (i32, String) =
        sqlx::query_as("SELECT attempt, claimed_by FROM publish_slot")
            .fetch_one(&c.pool)
            .await
            .unwrap();
    assert_eq!((attempt, claimed_by.as_str()), (2, "wb"));
    let detail: serde_json::Value =
        sqlx::query_scalar("SELECT detail FROM execution WHERE outcome = 'published'")
            .fetch_one(&c.pool)
            .await
            .unwrap();
    assert_eq!(detail["resumed"], true);
    c.wait_settled(1, Duration::from_secs(10)).await;
    c.assert_exactly_once(1, 5).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiping_the_redis_prefix_mid_day_loses_and_doubles_nothing() {
    let db = TestDb::new().await;
    let offsets: Vec<i64> = (0..30).map(|i| 2 + i / 4).collect();
    let c = Cluster::new(&db, &kind_toml("a", &times_from_now(&offsets), 20, "")).await;
    c.drafts("a", 25).await;
    c.planner(&["plan", "--day", &c.day]);
    let _w: Vec<Proc> = (0..2).map(|i| c.worker(&format!("w{i}"), &[])).collect();
    wait_for("some executions", Duration::from_secs(20), || async {
        (c.count("SELECT count(*) FROM execution").await >= 5).then_some(())
    })
    .await;
    c.redis.wipe().await;
    c.wait_settled(30, Duration::from_secs(60)).await;
    c.assert_exactly_once(30, 20).await;
    assert_eq!(
        c.count("SELECT count(*) FROM publish_slot WHERE state = 'published'")
            .await,
        20
    );
    assert_eq!(
        c.count("SELECT count(*) FROM publish_slot WHERE reason = 'quota_full'")
            .await,
        10
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_postgres_backends_are_survived() {
    let db = TestDb::new().await;
    let offsets: Vec<i64> = (0..40).map(|i| 2 + i / 8).collect();
    let c = Cluster::new(&db, &kind_toml("a", &times_from_now(&offsets), 30, "")).await;
    c.drafts("a", 40).await;
    c.planner(&["plan", "--day", &c.day]);
    let mut w: Vec<Proc> = (0..2).map(|i| c.worker(&format!("w{i}"), &[])).collect();
    wait_for("some executions", Duration::from_secs(20), || async {
        (c.count("SELECT count(*) FROM execution").await >= 3).then_some(())
    })
    .await;
    // Three rounds, each terminating at least one of the workers' own
    // backends, once they have one (again).
    let terminate = format!("SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{}' AND application_name = 'slotgate'", db.name);
    let mut killed = 0;
    for round in 0..3 {
        killed += wait_for(
            &format!("a slotgate backend to terminate (round {round})"),
            Duration::from_secs(20),
            || async { Some(c.count(&terminate).await).filter(|n| *n > 0) },
        )
        .await;
    }
    assert!(killed >= 3, "terminated {killed} backends");
    c.wait_settled(40, Duration::from_secs(60)).await;
    c.assert_exactly_once(40, 30).await;
    assert_eq!(
        c.count("SELECT count(*) FROM publish_slot WHERE state = 'published'")
            .await,
        30
    );
    for p in &mut w {
        assert!(p.exited().is_none(), "{} still running", p.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_down_for_10s_is_survived_without_restart() {
    let pg = OwnedPostgres::start();
    let admin = sqlx::PgPool::connect(&pg.url("postgres")).await.unwrap();
    sqlx::query("CREATE DATABASE faults")
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let url = pg.url("faults");
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    testkit::MIGRATOR.run(&pool).await.unwrap();
    let offsets: Vec<i64> = (0..20).map(|i| 2 + i / 2).collect();
    let c = Cluster::on(
        url,
        pool.clone(),
        TestRedis::new(),
        &kind_toml("a", &times_from_now(&offsets), 15, ""),
    )
    .await;
    c.drafts("a", 20).await;
    c.planner(&["plan", "--day", &c.day]);
    let mut w: Vec<Proc> = (0..2).map(|i| c.worker(&format!("w{i}"), &[])).collect();
    wait_for("some executions", Duration::from_secs(20), || async {
        (c.count("SELECT count(*) FROM execution").await >= 2).then_some(())
    })
    .await;
    pool.close().await;
    pg.stop();
    // The outage's length, not a wait for anything.
    tokio::time::sleep(Duration::from_secs(10)).await;
    for p in &mut w {
        assert!(p.exited().is_none(), "{} survived the outage", p.name);
    }
    pg.restart();
    let c = Cluster {
        pool: sqlx::PgPool::connect(&c.db_url).await.unwrap(),
        ..c
    };
    c.wait_settled(20, Duration::from_secs(60)).await;
    c.assert_exactly_once(20, 15).await;
    assert_eq!(
        c.count("SELECT count(*) FROM publish_slot WHERE state = 'published'")
            .await,
        15
    );
    let logs: String = w.iter().map(Proc::log_text).collect();
    assert!(logs.contains("WARN"), "the outage was logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_publish_finishes_it_within_the_grace_period() {
    let db = TestDb::new().await;
    let (cms, c, _key) = slow_publish(&db, Duration::from_secs(2), 1).await;
    let mut w = c.worker("w0", &["--shutdown-grace", "20s"]);
    wait_for("the publish call", Duration::from_secs(15), || async {
        (!cms.calls_to("/publish").is_empty()).then_some(())
    })
    .await;
    w.signal("TERM");
    let status = w
        .wait_timeout(Duration::from_secs(20))
        .expect("worker exits");
    assert!(status.success(), "{status:?}: {}", w.log_text());
    assert_eq!(
        c.count("SELECT count(*) FROM execution WHERE outcome = 'published'")
            .await,
        1
    );
    c.wait_settled(1, Duration::from_secs(5)).await;
    let mut r = c.redis.conn().await;
    let leader: Option<String> = redis::cmd("GET")
        .arg(slotgate::queue::KeySpace::new(c.redis.prefix.as_str()).leader())
        .query_async(&mut r)
        .await
        .unwrap();
    assert_eq!(leader, None, "the lease was released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_past_the_grace_period_leaves_the_delivery_to_another_worker() {
    let db = TestDb::new().await;
    let (cms, c, key) = slow_publish(&db, Duration::from_secs(30), 1).await;
    let mut a = c.worker("wa", &["--shutdown-grace", "1s", "--visibility", "2s"]);
    wait_for("the publish call", Duration::from_secs(15), || async {
        (!cms.calls_to("/publish").is_empty()).then_some(())
    })
    .await;
    a.signal("TERM");
    let status = a
        .wait_timeout(Duration::from_secs(10))
        .expect("worker exits after its grace period");
    assert!(status.success(), "{status:?}");
    assert!(
        a.log_text().contains("unfinished deliveries stay pending"),
        "{}",
        a.log_text()
    );
    // Never half-recorded: no execution, the slot still open.
    assert_eq!(c.count("SELECT count(*) FROM execution").await, 0);
    assert_eq!(
        c.count("SELECT count(*) FROM publish_slot WHERE state = 'publishing'")
            .await,
        1
    );
    let _b = c.worker("wb", &["--visibility", "2s"]);
    c.wait_settled(1, Duration::from_secs(30)).await;
    c.assert_exactly_once(1, 5).await;
    let calls = cms.calls_to("/publish");
    assert_eq!(calls.len(), 2);
    assert!(calls.iter().all(|x| x.key.as_deref() == Some(key.as_str())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once() {
    let db = TestDb::new().await;
    let (cms, c, _key) = slow_publish(&db, Duration::from_secs(30), 1).await;
    let mut w = c.worker("w0", &["--shutdown-grace", "60s"]);
    wait_for("the publish call", Duration::from_secs(15), || async {
        (!cms.calls_to("/publish").is_empty()).then_some(())
    })
    .await;
    w.signal("TERM");
    wait_for(
        "the first signal to be seen",
        Duration::from_secs(5),
        || async { w.log_text().contains("signal received").then_some(()) },
    )
    .await;
    w.signal("TERM");
    let status = w
        .wait_timeout(Duration::from_secs(5))
        .expect("exits at once");
    assert_eq!(status.code(), Some(130));
    assert_eq!(
        c.count("SELECT count(*) FROM execution").await,
        0,
        "nothing half-recorded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_then_back_empty_is_survived_without_restart() {
    let db = TestDb::new().await;
    // A Redis server of this test's own, keeping nothing on disk.
    let mut server = OwnedRedis::start();
    let redis = TestRedis {
        url: server.url(),
        prefix: format!("own{}", server.port),
    };
    let offsets: Vec<i64> = (0..20).map(|i| 2 + i / 2).collect();
    let c = Cluster::on(
        db.url.clone(),
        db.pool.clone(),
        redis,
        &kind_toml("a", &times_from_now(&offsets), 15, ""),
    )
    .await;
    c.drafts("a", 20).await;
    c.planner(&["plan", "--day", &c.day]);
    let mut w: Vec<Proc> = (0..2).map(|i| c.worker(&format!("w{i}"), &[])).collect();
    wait_for("some executions", Duration::from_secs(20), || async {
        (c.count("SELECT count(*) FROM execution").await >= 2).then_some(())
    })
    .await;
    // Redis dies and comes back empty (no persistence) after 4 s (the
    // outage's length, not a wait for anything).
    server.kill_9();
    tokio::time::sleep(Duration::from_secs(4)).await;
    for p in &mut w {
        assert!(p.exited().is_none(), "{} survived the outage", p.name);
    }
    server.restart();
    c.wait_settled(20, Duration::from_secs(60)).await;
    c.assert_exactly_once(20, 15).await;
    assert_eq!(
        c.count("SELECT count(*) FROM publish_slot WHERE state = 'published'")
            .await,
        15
    );
    let logs: String = w.iter().map(Proc::log_text).collect();
    assert!(
        logs.contains("redis unavailable") || logs.contains("lease tick failed"),
        "the outage was logged"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_batched_burst_loses_and_doubles_nothing() {
    // 300 record-only and 60 webhook slots due at once: workers take them in
    // batches (gate and record-only commits, then concurrent 300 ms calls).
    let db = TestDb::new().await;
    let cms = Cms::start().await;
    cms.set_chooser(Some(std::sync::Arc::new(|_, _, _| {
        Some(Reply::Delay(Duration::from_millis(300), 200))
    })));
    let due = times_from_now(&[2]);
    let extra = format!("publish_url = \"{}\"", cms.url("/publish"));
    let config = [
        kind_toml("a", &vec![due[0].clone(); 300], 1000, ""),
        kind_toml("b", &vec![due[0].clone(); 60], 1000, &extra),
    ]
    .concat();
    let c = Cluster::new(&db, &config).await;
    c.drafts("a", 300).await;
    c.drafts("b", 60).await;
    c.planner(&["plan", "--day", &c.day]);
    let batch = ["--batch", "16"];
    let victim = c.worker("w0", &batch);
    let _w1 = c.worker("w1", &batch);
    // Kill one worker while webhook calls are in flight, mid-burst.
    wait_for(
        "webhook calls in flight",
        Duration::from_secs(30),
        || async { (cms.in_flight() >= 2).then_some(()) },
    )
    .await;
    let mut victim = victim;
    kill_9(&mut victim);
    let killed_with = c.count("SELECT count(*) FROM execution").await;
    let _w2 = c.worker("w2", &batch);
    c.wait_settled(360, Duration::from_secs(90)).await;
    c.assert_exactly_once(360, 2000).await;
    assert!(killed_with < 360, "the kill came after the burst");
    assert_eq!(
        c.count("SELECT count(*) FROM publish_slot WHERE state = 'published'")
            .await,
        360
    );
    // Every webhook slot's effect landed once, under its own key.
    let applied = cms.applied("/publish");
    assert_eq!(applied.len(), 60, "one effect per webhook slot");
    assert_eq!(
        c.count("SELECT count(*) FROM execution WHERE outcome <> 'published' AND reason <> 'slot_taken'")
            .await,
        0,
        "nothing failed or was skipped for any other reason"
    );
}

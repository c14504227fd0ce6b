//! A worker process facing a poisoned ready stream: someone added the last
//! possible id by hand, so Redis refuses every later `XADD *`. The worker
//! moves the stream aside, says so (WARN, `slotgate_stream_repairs_total`),
//! and the day's slots still run once each.

use slotgate::config::Config;
use slotgate::plan::Planner;
use slotgate::queue::{aside_glob, KeySpace, Queue};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use testkit::process::Proc;
use testkit::{http_get, wait_for, TestDb, TestRedis};

const CONFIG: &str = "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"00:00\", \"00:00:01\", \"00:00:02\"]\ndaily_cap = 3\nstarting_deadline = \"48h\"\n";

/// A test's own database (with three drafts of kind `a`), Redis prefix and
/// config file under a directory named after `tag`.
struct Fixture {
    db: TestDb,
    redis: TestRedis,
    dir: PathBuf,
    cfg: PathBuf,
}

impl Fixture {
    async fn new(tag: &str) -> Fixture {
        let db = TestDb::new().await;
        let redis = TestRedis::new();
        let dir = std::env::temp_dir().join(format!("slotgate-{tag}-{}", redis.prefix));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("slotgate.toml");
        std::fs::write(&cfg, CONFIG).unwrap();
        sqlx::query(
            "INSERT INTO draft (kind, title) VALUES ('a', 'one'), ('a', 'two'), ('a', 'three')",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        Fixture {
            db,
            redis,
            dir,
            cfg,
        }
    }

    /// Plans today's three slots.
    async fn plan_today(&self) {
        let planner = Planner {
            config: Arc::new(Config::parse(&self.cfg, CONFIG).unwrap()),
            pool: self.db.pool.clone(),
            queue: Queue::new(
                slotgate::queue::pool(&self.redis.url, 2).unwrap(),
                KeySpace::new(self.redis.prefix.clone()),
            ),
            clock: Arc::new(slotgate::clock::SystemClock),
        };
        let day = chrono::Utc::now().date_naive();
        assert_eq!(planner.plan(Some(day), &[], false).await.unwrap().len(), 3);
    }

    /// A worker process `w` with `args` after its id and lease TTL.
    fn worker(&self, args: &[&str]) -> Proc {
        let envs = [
            ("DATABASE_URL", self.db.url.as_str()),
            ("REDIS_URL", self.redis.url.as_str()),
            ("SLOTGATE_PREFIX", self.redis.prefix.as_str()),
            ("SLOTGATE_CONFIG", self.cfg.to_str().unwrap()),
        ];
        let mut all = vec!["--id", "w", "--lease-ttl", "3s"];
        all.extend_from_slice(args);
        Proc::spawn(
            "w",
            &PathBuf::from(env!("CARGO_BIN_EXE_worker")),
            &all,
            &envs,
            &self.dir,
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_repairs_a_stream_at_the_last_id_and_counts_it() {
    let fx = Fixture::new("hostile").await;
    let (db, redis) = (&fx.db, &fx.redis);
    let ready = slotgate::queue::KeySpace::new(redis.prefix.as_str())
        .part(0)
        .ready();
    let mut c = redis.conn().await;
    let _: String = redis::cmd("XADD")
        .arg(&ready)
        .arg("18446744073709551615-18446744073709551615")
        .arg("slot")
        .arg("poison")
        .query_async(&mut c)
        .await
        .unwrap();
    fx.plan_today().await;
    let addr = format!("127.0.0.1:{}", testkit::server::pick_port());
    let w = fx.worker(&["--metrics-addr", &addr]);
    let published = || async {
        testkit::count(
            &db.pool,
            "SELECT count(*) FROM execution WHERE outcome = 'published'",
        )
        .await
    };
    wait_for("3 published slots", Duration::from_secs(30), || async {
        (published().await >= 3).then_some(())
    })
    .await;
    let (_, body) = wait_for("the metrics", Duration::from_secs(10), || async {
        http_get(&addr, "/metrics").await.ok()
    })
    .await;
    assert!(
        body.contains(r#"slotgate_stream_repairs_total{stream="ready"} 1"#),
        "{body}"
    );
    let log = w.log_text();
    assert!(
        log.contains("WARN") && log.contains("moved it aside"),
        "no WARN about the repair in\n{log}"
    );
    let per_slot: Vec<(String, i64)> = sqlx::query_as(
        "SELECT slot_key, count(*) FROM execution WHERE outcome = 'published' GROUP BY 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(per_slot.len(), 3, "{per_slot:?}");
    assert!(per_slot.iter().all(|(_, n)| *n == 1), "{per_slot:?}");
    let broken: Vec<String> = redis::cmd("KEYS")
        .arg(aside_glob(&ready))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(broken.len(), 1, "{broken:?}");
}

/// Issue 26: one stream entry of 64 MiB took a worker from 14 MB to
/// 146 MB before it was cut. Entries are now cut inside Redis before they
/// are read: the worker's peak memory stays below the size of one such
/// entry, each oversized entry is recorded `failed/bad_message` and
/// dead-lettered, and the day's slots still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_entries_are_cut_in_redis_and_dead_lettered() {
    const MIB: usize = 1 << 20;
    let fx = Fixture::new("oversize").await;
    let (db, redis) = (&fx.db, &fx.redis);
    let day = chrono::Utc::now().date_naive();
    let ready = slotgate::queue::KeySpace::new(redis.prefix.as_str())
        .part(0)
        .ready();
    let mut c = redis.conn().await;
    let huge = "x".repeat(64 * MIB);
    let slot1 = format!("a:{day}:1");
    let mut many = redis::cmd("XADD");
    many.arg(&ready).arg("*").arg("slot").arg(&slot1);
    for i in 0..20 {
        many.arg(format!("f{i}")).arg("v");
    }
    for cmd in [
        redis::cmd("XADD")
            .arg(&ready)
            .arg("*")
            .arg("slot")
            .arg(&huge)
            .clone(),
        redis::cmd("XADD")
            .arg(&ready)
            .arg("*")
            .arg("slot")
            .arg(&slot1)
            .arg("caller")
            .arg(&huge)
            .clone(),
        many,
    ] {
        let _: String = cmd.query_async(&mut c).await.unwrap();
    }
    drop(huge);
    fx.plan_today().await;
    let w = fx.worker(&[]);
    let outcomes = || async {
        sqlx::query_as::<_, (String, Option<String>, i64)>(
            "SELECT outcome, reason, count(*) FROM execution GROUP BY 1, 2 ORDER BY 1, 2",
        )
        .fetch_all(&db.pool)
        .await
        .unwrap()
    };
    let want = vec![
        ("failed".to_owned(), Some("bad_message".to_owned()), 3),
        ("published".to_owned(), None, 3),
    ];
    wait_for(
        "3 bad messages and 3 published slots",
        Duration::from_secs(30),
        || async { (outcomes().await == want).then_some(()) },
    )
    .await;
    let details: Vec<String> = sqlx::query_scalar(
        "SELECT detail::text FROM execution WHERE reason = 'bad_message' ORDER BY id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(details.len(), 3);
    for d in &details {
        assert!(d.contains("cut in Redis") && d.len() < 4096, "{d}");
    }
    // The two 64 MiB entries are recorded with their size (64 MiB and a
    // few bytes: 67,108,8xx).
    assert_eq!(
        details.iter().filter(|d| d.contains("671088")).count(),
        2,
        "{details:?}"
    );
    // Dead-lettered after its execution is recorded.
    let dead = slotgate::queue::KeySpace::new(redis.prefix.as_str())
        .part(0)
        .dead();
    wait_for("3 dead letters", Duration::from_secs(10), || async {
        let mut c = redis.conn().await;
        let n: i64 = redis::cmd("XLEN")
            .arg(&dead)
            .query_async(&mut c)
            .await
            .unwrap();
        (n == 3).then_some(())
    })
    .await;
    let peak = w.peak_rss_mib().expect("the worker's peak RSS");
    eprintln!("worker peak RSS with two 64 MiB entries on the stream: {peak:.1} MiB");
    assert!(peak < 64.0, "the worker peaked at {peak:.1} MiB");
}

//! A worker process facing a poisoned ready stream: someone added the last
//! possible id by hand, so Redis refuses every later `XADD *`. The worker
//! moves the stream aside, says so (WARN, `slotgate_stream_repairs_total`),
//! and the day's slots still run once each.

use slotgate::config::Config;
use slotgate::plan::Planner;
use slotgate::queue::{KeySpace, Queue};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use testkit::process::Proc;
use testkit::{http_get, wait_for, TestDb, TestRedis};

const CONFIG: &str = "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"00:00\", \"00:00:01\", \"00:00:02\"]\ndaily_cap = 3\nstarting_deadline = \"48h\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_repairs_a_stream_at_the_last_id_and_counts_it() {
    let db = TestDb::new().await;
    let redis = TestRedis::new();
    let dir = std::env::temp_dir().join(format!("slotgate-hostile-{}", redis.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("slotgate.toml");
    std::fs::write(&cfg, CONFIG).unwrap();
    sqlx::query(
        "INSERT INTO draft (kind, title) VALUES ('a', 'one'), ('a', 'two'), ('a', 'three')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let ready = format!("{}:ready", redis.prefix);
    let mut c = redis.conn().await;
    let _: String = redis::cmd("XADD")
        .arg(&ready)
        .arg("18446744073709551615-18446744073709551615")
        .arg("slot")
        .arg("poison")
        .query_async(&mut c)
        .await
        .unwrap();
    let planner = Planner {
        config: Arc::new(Config::parse(&cfg, CONFIG).unwrap()),
        pool: db.pool.clone(),
        queue: Queue::new(
            slotgate::queue::pool(&redis.url, 2).unwrap(),
            KeySpace::new(redis.prefix.clone()),
        ),
        clock: Arc::new(slotgate::clock::SystemClock),
    };
    let day = chrono::Utc::now().date_naive();
    assert_eq!(planner.plan(Some(day), &[], false).await.unwrap().len(), 3);
    let addr = format!("127.0.0.1:{}", testkit::server::pick_port());
    let envs = [
        ("DATABASE_URL", db.url.as_str()),
        ("REDIS_URL", redis.url.as_str()),
        ("SLOTGATE_PREFIX", redis.prefix.as_str()),
        ("SLOTGATE_CONFIG", cfg.to_str().unwrap()),
    ];
    let w = Proc::spawn(
        "w",
        &PathBuf::from(env!("CARGO_BIN_EXE_worker")),
        &["--id", "w", "--lease-ttl", "3s", "--metrics-addr", &addr],
        &envs,
        &dir,
    );
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
        .arg(format!("{ready}:broken:*"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(broken.len(), 1, "{broken:?}");
}

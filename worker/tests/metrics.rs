//! `worker --metrics-addr`: Prometheus text, liveness and readiness.

use std::path::PathBuf;
use std::time::Duration;
use testkit::process::Proc;
use testkit::{http_get, wait_for, TestDb, TestRedis};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_executions_and_health_endpoints_answer() {
    let db = TestDb::new().await;
    let redis = TestRedis::new();
    let dir = std::env::temp_dir().join(format!("slotgate-metrics-{}", redis.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("slotgate.toml");
    std::fs::write(&cfg, "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"00:00\", \"00:00\", \"00:00\"]\ndaily_cap = 1\nstarting_deadline = \"48h\"\n").unwrap();
    sqlx::query(
        "INSERT INTO draft (kind, title) VALUES ('a', 'one'), ('a', 'two'), ('a', 'three')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let day = chrono::Utc::now().date_naive();
    let mut c = redis.conn().await;
    for n in [1, 2, 3, 1] {
        let _: String = redis::cmd("XADD")
            .arg(format!("{}:ready", redis.prefix))
            .arg("*")
            .arg("slot")
            .arg(format!("a:{day}:{n}"))
            .arg("caller")
            .arg("test")
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let _: String = redis::cmd("XADD")
        .arg(format!("{}:ready", redis.prefix))
        .arg("*")
        .arg("slot")
        .arg("zzz")
        .query_async(&mut c)
        .await
        .unwrap();
    let addr = format!("127.0.0.1:{}", testkit::server::pick_port());
    let envs = [
        ("DATABASE_URL", db.url.as_str()),
        ("REDIS_URL", redis.url.as_str()),
        ("SLOTGATE_PREFIX", redis.prefix.as_str()),
        ("SLOTGATE_CONFIG", cfg.to_str().unwrap()),
    ];
    let _w = Proc::spawn(
        "w",
        &PathBuf::from(env!("CARGO_BIN_EXE_worker")),
        &["--id", "w", "--lease-ttl", "3s", "--metrics-addr", &addr],
        &envs,
        &dir,
    );
    let expected = [
        r#"slotgate_executions_total{kind="a",outcome="published",reason=""} 1"#,
        r#"slotgate_executions_total{kind="a",outcome="skipped",reason="quota_full"} 2"#,
        r#"slotgate_executions_total{kind="a",outcome="skipped",reason="slot_taken"} 1"#,
        r#"slotgate_executions_total{kind="",outcome="failed",reason="bad_message"} 1"#,
        r#"slotgate_dead_letters_total{reason="bad_message"} 1"#,
        r#"slotgate_lease_changes_total{change="acquired"} 1"#,
        "slotgate_leader 1",
        "slotgate_queue_pending 0",
        "slotgate_queue_delayed 0",
        "slotgate_dead_letters 1",
        r#"slotgate_schedule_lag_seconds_count{kind="a"} 3"#,
    ];
    // Polls until all five deliveries show; on timeout, names what is missing.
    let mut body = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        if let Ok((200, b)) = http_get(&addr, "/metrics").await {
            body = b;
            if expected.iter().all(|l| body.contains(l)) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let missing: Vec<&str> = expected
        .iter()
        .copied()
        .filter(|l| !body.contains(l))
        .collect();
    assert!(missing.is_empty(), "missing {missing:?} in\n{body}");
    assert!(
        body.contains("# TYPE slotgate_schedule_lag_seconds histogram"),
        "{body}"
    );
    assert_eq!(http_get(&addr, "/healthz").await.unwrap().0, 200);
    assert_eq!(
        http_get(&addr, "/readyz").await.unwrap(),
        (200, "ready\n".to_owned())
    );
    assert_eq!(http_get(&addr, "/nope").await.unwrap().0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_fails_while_a_store_is_unreachable_and_healthz_does_not() {
    let dir = std::env::temp_dir().join(format!("slotgate-readyz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("slotgate.toml");
    std::fs::write(&cfg, "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"00:00\"]\ndaily_cap = 1\nstarting_deadline = \"48h\"\n").unwrap();
    let redis = TestRedis::new();
    let dead_pg = format!(
        "postgres://postgres@127.0.0.1:{}/x",
        testkit::server::pick_port()
    );
    let addr = format!("127.0.0.1:{}", testkit::server::pick_port());
    let envs = [
        ("DATABASE_URL", dead_pg.as_str()),
        ("REDIS_URL", redis.url.as_str()),
        ("SLOTGATE_PREFIX", redis.prefix.as_str()),
        ("SLOTGATE_CONFIG", cfg.to_str().unwrap()),
    ];
    let mut w = Proc::spawn(
        "w",
        &PathBuf::from(env!("CARGO_BIN_EXE_worker")),
        &["--id", "w", "--metrics-addr", &addr],
        &envs,
        &dir,
    );
    let (status, body) = wait_for("readyz to answer", Duration::from_secs(20), || async {
        http_get(&addr, "/readyz").await.ok()
    })
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("postgres"), "{body}");
    assert_eq!(http_get(&addr, "/healthz").await.unwrap().0, 200);
    // The worker keeps running (backing off), it does not crash-loop.
    assert!(w.exited().is_none());
}

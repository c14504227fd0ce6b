//! `worker --metrics-addr`: Prometheus text, liveness and readiness.

use std::path::PathBuf;
use std::time::Duration;
use testkit::process::Proc;
use testkit::{http_get, wait_for, TestDb, TestRedis};

/// A `worker` process with `config` on `database_url` and `redis`,
/// serving `--metrics-addr` on a free port: the process and that address.
fn worker_with_metrics(
    database_url: &str,
    redis: &TestRedis,
    config: &str,
    args: &[&str],
) -> (Proc, String) {
    let dir = std::env::temp_dir().join(format!("slotgate-metrics-{}", redis.prefix));
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("slotgate.toml");
    std::fs::write(&cfg, config).unwrap();
    let addr = format!("127.0.0.1:{}", testkit::server::pick_port());
    let envs = [
        ("DATABASE_URL", database_url),
        ("REDIS_URL", redis.url.as_str()),
        ("SLOTGATE_PREFIX", redis.prefix.as_str()),
        ("SLOTGATE_CONFIG", cfg.to_str().unwrap()),
    ];
    let mut all = vec!["--id", "w", "--metrics-addr", &addr];
    all.extend_from_slice(args);
    let w = Proc::spawn(
        "w",
        &PathBuf::from(env!("CARGO_BIN_EXE_worker")),
        &all,
        &envs,
        &dir,
    );
    (w, addr)
}

/// One UTC kind `a` with one slot at 00:00 and a cap of one.
const ONE_SLOT: &str = "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"00:00\"]\ndaily_cap = 1\nstarting_deadline = \"48h\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_executions_and_health_endpoints_answer() {
    let db = TestDb::new().await;
    let redis = TestRedis::new();
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
            .arg(
                slotgate::queue::KeySpace::new(redis.prefix.as_str())
                    .part(0)
                    .ready(),
            )
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
        .arg(
            slotgate::queue::KeySpace::new(redis.prefix.as_str())
                .part(0)
                .ready(),
        )
        .arg("*")
        .arg("slot")
        .arg("zzz")
        .query_async(&mut c)
        .await
        .unwrap();
    let (_w, addr) = worker_with_metrics(
        &db.url,
        &redis,
        "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"00:00\", \"00:00\", \"00:00\"]\ndaily_cap = 1\nstarting_deadline = \"48h\"\n",
        &["--lease-ttl", "3s"],
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
    let redis = TestRedis::new();
    let dead_pg = format!(
        "postgres://postgres@127.0.0.1:{}/x",
        testkit::server::pick_port()
    );
    let (mut w, addr) = worker_with_metrics(&dead_pg, &redis, ONE_SLOT, &[]);
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

/// A live worker on another config (its fingerprint stored with its clock)
/// is named in `/readyz`'s body; readiness itself stays 200, as old and new
/// configs meet by design during a rolling update.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_worker_on_another_config() {
    let db = TestDb::new().await;
    let redis = TestRedis::new();
    sqlx::query(
        "INSERT INTO worker_clock (worker_id, skew_ms, rtt_ms, measured_at, config)
         VALUES ('stale-worker', 0, 1, clock_timestamp() + interval '1 hour', 'ffffffffffff')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let (_w, addr) = worker_with_metrics(&db.url, &redis, ONE_SLOT, &[]);
    let (status, body) = wait_for(
        "readyz to name the stale worker",
        Duration::from_secs(20),
        || async {
            match http_get(&addr, "/readyz").await {
                Ok((s, b)) if b.contains("stale-worker") => Some((s, b)),
                _ => None,
            }
        },
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("ffffffffffff") && body.contains("differs"),
        "{body}"
    );
    assert!(
        !body.contains("w ("),
        "the worker itself agrees with itself: {body}"
    );
}

/// The health listener is served like the console (axum behind
/// `slotgate_process::listener`): connections past its cap are answered
/// `503` at once instead of each holding a file descriptor and a task, and
/// the endpoints answer again once they close. (The hand-written server it
/// replaced had no cap: the extra connection got no answer at all.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_listener_caps_open_connections() {
    use tokio::io::AsyncReadExt;
    let redis = TestRedis::new();
    let dead_pg = format!(
        "postgres://postgres@127.0.0.1:{}/x",
        testkit::server::pick_port()
    );
    let (_w, addr) = worker_with_metrics(&dead_pg, &redis, ONE_SLOT, &[]);
    wait_for("healthz to answer", Duration::from_secs(20), || async {
        matches!(http_get(&addr, "/healthz").await, Ok((200, _))).then_some(())
    })
    .await;
    // Idle connections that never send a request take every place.
    let mut idle = Vec::new();
    for _ in 0..slotgate_process::health::MAX_CONNECTIONS {
        idle.push(tokio::net::TcpStream::connect(&addr).await.unwrap());
    }
    // The listener accepts in order: once the cap is reached, a further
    // connection is refused with a 503 naming the cap (polled, since the
    // accepts of the idle ones may still be under way).
    let body = wait_for(
        "a connection over the cap refused",
        Duration::from_secs(5),
        || async {
            let mut s = tokio::net::TcpStream::connect(&addr).await.ok()?;
            let mut buf = Vec::new();
            tokio::time::timeout(Duration::from_millis(500), s.read_to_end(&mut buf))
                .await
                .ok()?
                .ok()?;
            let (status, body) = testkit::status_and_body(&buf);
            (status == 503).then_some(body)
        },
    )
    .await;
    assert!(
        body.contains("too many connections open (the cap is 64)"),
        "{body}"
    );
    drop(idle);
    let (status, body) = wait_for(
        "healthz to answer again",
        Duration::from_secs(20),
        || async {
            http_get(&addr, "/healthz")
                .await
                .ok()
                .filter(|(s, _)| *s == 200)
        },
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
}

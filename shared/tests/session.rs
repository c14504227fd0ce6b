//! Every session slotgate opens carries its timeouts and keepalives, and
//! Postgres enforces them: a statement waiting on a row another session
//! holds gives up after `lock_timeout`, and a claim is judged by
//! Postgres's clock.

use slotgate::session::Session;
use std::time::Duration;

async fn show(pool: &sqlx::PgPool, setting: &str) -> String {
    sqlx::query_scalar(&format!("SHOW {setting}"))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_carry_the_configured_timeouts_and_keepalives() {
    let db = testkit::TestDb::new().await;
    let session = Session {
        lock_timeout: Duration::from_millis(250),
        statement_timeout: Duration::from_secs(7),
        idle_in_transaction_timeout: Duration::from_secs(12),
        transaction_deadline: Duration::from_secs(9),
        keepalive_idle: Duration::from_secs(21),
        keepalive_interval: Duration::from_secs(4),
        keepalive_count: 5,
        ..Session::default()
    };
    let pool = slotgate::store::connect(&db.url, 2, &session)
        .await
        .unwrap();
    assert_eq!(show(&pool, "lock_timeout").await, "250ms");
    assert_eq!(show(&pool, "statement_timeout").await, "7s");
    assert_eq!(
        show(&pool, "idle_in_transaction_session_timeout").await,
        "12s"
    );
    // Keepalives apply to TCP connections (the test servers are on TCP).
    assert_eq!(show(&pool, "tcp_keepalives_idle").await, "21");
    assert_eq!(show(&pool, "tcp_keepalives_interval").await, "4");
    assert_eq!(show(&pool, "tcp_keepalives_count").await, "5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_held_by_another_session_fails_after_lock_timeout() {
    let db = testkit::TestDb::new().await;
    sqlx::query("INSERT INTO daily_quota (kind, day, used) VALUES ('a', '2026-01-01', 0)")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query("SELECT used FROM daily_quota WHERE kind = 'a' FOR UPDATE")
        .fetch_one(&mut *holder)
        .await
        .unwrap();
    let session = Session {
        lock_timeout: Duration::from_millis(200),
        ..Session::default()
    };
    let pool = slotgate::store::connect(&db.url, 1, &session)
        .await
        .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let started = std::time::Instant::now();
    let err = slotgate::store::take_quota(&mut conn, "a", "2026-01-01".parse().unwrap(), 10)
        .await
        .unwrap_err();
    let waited = started.elapsed();
    let slotgate::store::StoreError::Database(d) = &err else {
        panic!("{err}");
    };
    assert_eq!(d.code().as_deref(), Some("55P03"), "{err}");
    assert!(
        slotgate::executor::ExecError::from(err).is_stall(),
        "a lock timeout stalls the kind"
    );
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    holder.rollback().await.unwrap();
    assert!(
        slotgate::store::take_quota(&mut conn, "a", "2026-01-01".parse().unwrap(), 10)
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lapses_by_postgres_clock_only() {
    let db = testkit::TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    let key: slotgate::slot::SlotKey = "a:2026-01-01:1".parse().unwrap();
    // A worker whose clock runs an hour ahead claims for 30 s of *Postgres*
    // time, not until its own now + 30 s.
    let ahead = chrono::Utc::now() + chrono::Duration::hours(1);
    let id = slotgate::store::gate_insert(
        &mut conn,
        &key,
        slotgate::outcome::SlotState::Publishing,
        None,
        "fast",
        Some(ahead + chrono::Duration::seconds(30)),
        ahead,
    )
    .await
    .unwrap()
    .unwrap();
    let left: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM claim_expires_at - clock_timestamp())::float8 FROM publish_slot WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    assert!((25.0..=30.0).contains(&left), "{left}");
    // Another worker, also an hour ahead, cannot take it over.
    let taken =
        slotgate::store::take_over(&mut conn, id, 1, "other", ahead, Duration::from_secs(30))
            .await
            .unwrap();
    assert!(taken.is_none(), "a live claim was taken over");
    let expired = slotgate::store::expired_claims(&db.pool, ahead, 10)
        .await
        .unwrap();
    assert!(expired.is_empty(), "a live claim was reported expired");
    // Once it lapsed by Postgres's clock, it can.
    sqlx::query(
        "UPDATE publish_slot SET claim_expires_at = clock_timestamp() - interval '1 second'",
    )
    .execute(&mut *conn)
    .await
    .unwrap();
    let taken = slotgate::store::take_over(
        &mut conn,
        id,
        1,
        "other",
        chrono::Utc::now(),
        Duration::from_secs(30),
    )
    .await
    .unwrap()
    .expect("a lapsed claim is taken over");
    assert_eq!((taken.attempt, taken.claimed_by.as_str()), (2, "other"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_size_flags_replace_the_binarys_default() {
    // Lazy pools: nothing connects, so no server is needed.
    let session = Session {
        pool_size: Some(3),
        acquire_timeout: Duration::from_millis(700),
        ..Session::default()
    };
    let pg = slotgate::store::connect_lazy("postgres://u@127.0.0.1:1/x", 10, &session).unwrap();
    assert_eq!(pg.options().get_max_connections(), 3);
    assert_eq!(
        pg.options().get_acquire_timeout(),
        Duration::from_millis(700)
    );
    let pg = slotgate::store::connect_lazy("postgres://u@127.0.0.1:1/x", 10, &Session::default())
        .unwrap();
    assert_eq!(pg.options().get_max_connections(), 10);

    let opts = slotgate::queue::RedisOptions {
        pool_size: Some(3),
        ..Default::default()
    };
    let redis = slotgate::queue::pool_with("redis://127.0.0.1:1/", 10, &opts).unwrap();
    assert_eq!(redis.max_size(), 3);
    let redis = slotgate::queue::pool("redis://127.0.0.1:1/", 10).unwrap();
    assert_eq!(redis.max_size(), 10);
}

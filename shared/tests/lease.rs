//! The leader lease is taken only by a worker whose epoch is the newest: one
//! paused between asking Postgres for its epoch and taking the lease must
//! not come back as a leader older than one that came after it.

use crate::common::{kind_toml, Env};
use slotgate::lease::{Change, Lease};
use std::sync::atomic::AtomicI64;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_epoch_is_older_than_the_last_leaders_does_not_take_the_lease() {
    let env = Env::new(&kind_toml("a", &["12:00"], 1, "")).await;
    let keys = env.queue.keys().clone();
    let mut c = env.redis.conn().await;
    // Another leader took epoch 1000 meanwhile, and its lease lapsed.
    let _: () = redis::cmd("SET")
        .arg(keys.epoch())
        .arg(1000)
        .query_async(&mut c)
        .await
        .unwrap();
    let mut lease = Lease::new(
        env.queue.clone(),
        env.db.pool.clone(),
        "w",
        Duration::from_secs(3),
        Arc::new(AtomicI64::new(0)),
    );
    assert_eq!(lease.tick().await.unwrap(), Change::Following);
    let holder: Option<String> = redis::cmd("GET")
        .arg(keys.leader())
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(holder, None, "the lease stays free");
    // Once Postgres hands out a later epoch, the lease is taken with it.
    sqlx::query("UPDATE leader_epoch SET epoch = 1000")
        .execute(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(lease.tick().await.unwrap(), Change::Acquired(1001));
    let holder: Option<String> = redis::cmd("GET")
        .arg(keys.leader())
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(holder.as_deref(), Some("w:1001"));
    // A hand-written P:epoch that is not a number grants and blocks nothing.
    let _: () = redis::cmd("DEL")
        .arg(keys.leader())
        .query_async(&mut c)
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg(keys.epoch())
        .arg("garbage")
        .query_async(&mut c)
        .await
        .unwrap();
    let mut other = Lease::new(
        env.queue.clone(),
        env.db.pool.clone(),
        "w2",
        Duration::from_secs(3),
        Arc::new(AtomicI64::new(0)),
    );
    assert_eq!(other.tick().await.unwrap(), Change::Acquired(1002));
}

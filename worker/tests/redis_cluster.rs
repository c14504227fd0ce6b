//! slotgate on a real Redis Cluster (3 masters, a replica each, started
//! from Debian's `redis-server` by testkit), with `redis_partitions = 3`:
//! the planner and two worker processes reach it through its seed nodes;
//! each master holds a share of the partitions; a partition's delayed set
//! lost is rebuilt by the reconciler; a slot added by hand to another
//! partition's stream is delivered; a master killed mid-run is replaced by
//! its replica and every slot is still published exactly once, none
//! dead-lettered.

use chrono::{Duration as CDuration, Utc};
use slotgate::queue::{KeySpace, Queue};
use std::path::PathBuf;
use std::time::Duration;
use testkit::server::redis_cli;
use testkit::stack::{Bins, Stack};
use testkit::wait_for;
use testkit::zone::{around_noon, Zone};

fn worker_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_worker"))
}

/// Three record-only kinds in `zone`, each with a slot every second from
/// `from` seconds from now, `per_kind` of them; jitter 0.
fn config(zone: &Zone, partitions: u16, from: i64, per_kind: i64) -> String {
    let start = Utc::now() + CDuration::seconds(from);
    let mut out = format!("redis_partitions = {partitions}\n");
    for k in ["a", "b", "c"] {
        let times: Vec<String> = (0..per_kind)
            .map(|i| format!("{:?}", zone.hms(start + CDuration::seconds(i))))
            .collect();
        out += &format!(
            "[[kinds]]\nname = {k:?}\ntimezone = {:?}\nslots = [{}]\njitter = \"0\"\ndaily_cap = {per_kind}\nstarting_deadline = \"1h\"\n\n",
            zone.name(),
            times.join(", ")
        );
    }
    out
}

/// The stack on a Cluster of its own (3 masters, a replica each), which
/// the stack keeps with its fail-over.
struct Clustered(Stack);

impl std::ops::Deref for Clustered {
    type Target = Stack;
    fn deref(&self) -> &Stack {
        &self.0
    }
}

impl Clustered {
    async fn new(config: &str) -> Clustered {
        Clustered(
            Stack::builder(Bins::beside(worker_bin()))
                .tag("cluster")
                .redis_cluster(3, 1)
                .env("RUST_LOG", "info")
                .build(config)
                .await,
        )
    }

    fn queue(&self, partitions: u16) -> Queue {
        Queue::new(
            slotgate::queue::pool(&self.redis.url, 4).unwrap(),
            KeySpace::partitioned(self.redis.prefix.clone(), partitions, false),
        )
    }

    async fn count(&self, sql: &str) -> i64 {
        testkit::count(&self.db().pool, sql).await
    }

    /// The master serving `key` now.
    async fn master_of(&self, key: &str) -> u16 {
        let cluster = self.cluster.as_ref().expect("the stack's own Cluster");
        cluster
            .lock()
            .await
            .master_of(key)
            .unwrap_or_else(|| panic!("no master serves {key}"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_partitions_on_three_masters_publish_every_slot_once_through_a_master_failover() {
    let per_kind = 20;
    // Planned where it is about noon, so the slots a few seconds from now
    // fall on the local day `planner plan` plans, whatever the time of day.
    let zone = around_noon(Utc::now(), Duration::from_secs(600));
    let s = Clustered::new(&config(&zone, 3, 6, per_kind)).await;
    s.planner(&["migrate"]);
    for k in ["a", "b", "c"] {
        sqlx::query(
            "INSERT INTO draft (kind, title, ready_at) SELECT $1, $1 || ' ' || i, now() - interval '1 hour' FROM generate_series(1, $2) i",
        )
        .bind(k)
        .bind(per_kind as i32)
        .execute(&s.db().pool)
        .await
        .unwrap();
    }
    s.planner(&["plan"]);

    // Planned slots wait in three delayed sets, one per partition, each on
    // its own master (the partition tags are spread over the slot ranges
    // `redis-cli --cluster create` deals out).
    let q = s.queue(3);
    let keys = q.keys().clone();
    let mut owners = Vec::new();
    for (_, part) in keys.parts() {
        let delayed = part.delayed();
        let owner = s.master_of(&delayed).await;
        let n: u64 = redis_cli(owner, &["ZCARD", &delayed])
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(
            n > 0,
            "{delayed} on {owner} holds none of the planned slots"
        );
        owners.push(owner);
    }
    let mut distinct = owners.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "partitions on masters {owners:?}");
    assert_eq!(q.depths(0).await.unwrap().delayed, 3 * per_kind as u64);

    // Partition 2's delayed set lost (as after a shard's data is lost):
    // the leader's reconciler re-delivers its slots from Postgres. And a
    // slot added by hand, `redis-cli -c` style, to another partition's
    // stream than its own is delivered all the same (the gate decides).
    let lost: u64 = redis_cli(owners[2], &["ZCARD", &keys.part(2).delayed()])
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(lost > 0);
    redis_cli(owners[2], &["DEL", &keys.part(2).delayed()]).unwrap();
    let day = zone.day(Utc::now());
    let by_hand = (1..=per_kind)
        .map(|n| format!("c:{day}:{n}"))
        .find(|k| keys.partition_of(k) != 0)
        .expect("a slot of another partition");
    redis_cli(
        owners[0],
        &[
            "XADD",
            &keys.part(0).ready(),
            "*",
            "slot",
            &by_hand,
            "caller",
            "manual",
        ],
    )
    .unwrap();

    let mut workers = [s.worker("w1", &[], &[]), s.worker("w2", &[], &[])];
    // Some slots published, then partition 1's master killed.
    wait_for("the first publishes", Duration::from_secs(30), || async {
        (s.count("SELECT count(*) FROM publish_slot WHERE state = 'published'")
            .await
            >= 6)
            .then_some(())
    })
    .await;
    // Partition 1's master killed: its replica takes over (the node then
    // rejoins as a replica).
    let victim = owners[1];
    let failover = s
        .cluster_fail_over(keys.part(1).delayed())
        .await
        .expect("a fail-over of the Cluster");
    assert!(failover.verified, "{}", failover.what);
    let promoted = s.master_of(&keys.part(1).delayed()).await;
    assert_ne!(promoted, victim, "a replica took over partition 1");

    let total = 3 * per_kind;
    wait_for(
        &format!("{total} published slots, the stream drained"),
        Duration::from_secs(60),
        || async {
            let published = s
                .count("SELECT count(*) FROM publish_slot WHERE state = 'published'")
                .await;
            let d = q.depths(Utc::now().timestamp_millis()).await.ok()?;
            (published == total && d.ready + d.pending + d.delayed == 0).then_some(())
        },
    )
    .await;
    for w in &mut workers {
        assert!(w.exited().is_none(), "a worker exited: {}", w.log_text());
    }
    // Exactly once: one published execution per slot, nothing failed,
    // nothing dead-lettered.
    assert_eq!(
        s.count("SELECT count(*) FROM execution WHERE outcome = 'published'")
            .await,
        total
    );
    assert_eq!(
        s.count("SELECT count(*) FROM execution WHERE outcome = 'failed'")
            .await,
        0
    );
    // The entry added by hand to partition 0 was read and recorded
    // (published or, if its planned delivery came first, slot_taken).
    let (k, d, n) = {
        let mut p = by_hand.split(':');
        (
            p.next().unwrap().to_owned(),
            p.next().unwrap().to_owned(),
            p.next().unwrap().parse::<i32>().unwrap(),
        )
    };
    let hand: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM execution WHERE caller = 'manual' AND kind = $1 AND day = $2::date AND slot = $3",
    )
    .bind(&k)
    .bind(&d)
    .bind(n)
    .fetch_one(&s.db().pool)
    .await
    .unwrap();
    assert_eq!(
        hand, 1,
        "the hand-added delivery of {by_hand} was recorded once"
    );
    assert_eq!(q.depths(0).await.unwrap().dead, 0);
    assert_eq!(q.dead_letters(10).await.unwrap().len(), 0);
}

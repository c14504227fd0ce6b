//! slotgate on a real Redis Cluster (3 masters, a replica each, started
//! from Debian's `redis-server` by testkit), with `redis_partitions = 3`:
//! the planner and two worker processes reach it through its seed nodes;
//! each master holds a share of the partitions; a master killed mid-run is
//! replaced by its replica and every slot is still published exactly once,
//! none dead-lettered.

use chrono::{Duration as CDuration, Utc};
use slotgate::queue::{KeySpace, Queue};
use std::path::PathBuf;
use std::time::Duration;
use testkit::process::Proc;
use testkit::server::{redis_cli, OwnedCluster};
use testkit::{wait_for, TestDb};

fn worker_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_worker"))
}

/// Three record-only UTC kinds, each with a slot every second from
/// `from` seconds from now, `per_kind` of them; jitter 0.
fn config(partitions: u16, from: i64, per_kind: i64) -> String {
    let start = Utc::now() + CDuration::seconds(from);
    let mut out = format!("redis_partitions = {partitions}\n");
    for k in ["a", "b", "c"] {
        let times: Vec<String> = (0..per_kind)
            .map(|i| {
                format!(
                    "{:?}",
                    (start + CDuration::seconds(i))
                        .format("%H:%M:%S")
                        .to_string()
                )
            })
            .collect();
        out += &format!(
            "[[kinds]]\nname = {k:?}\ntimezone = \"UTC\"\nslots = [{}]\njitter = \"0\"\ndaily_cap = {per_kind}\nstarting_deadline = \"1h\"\n\n",
            times.join(", ")
        );
    }
    out
}

struct Stack {
    db: TestDb,
    url: String,
    prefix: String,
    dir: PathBuf,
    config: PathBuf,
}

impl Stack {
    async fn new(url: String, config: &str) -> Stack {
        let db = TestDb::new().await;
        let prefix = format!("cl{}", &db.name[db.name.len() - 8..]);
        let dir = std::env::temp_dir().join(format!("slotgate-cluster-{prefix}"));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("slotgate.toml");
        std::fs::write(&path, config).unwrap();
        Stack {
            db,
            url,
            prefix,
            dir,
            config: path,
        }
    }

    fn envs(&self) -> Vec<(&str, &str)> {
        vec![
            ("DATABASE_URL", self.db.url.as_str()),
            ("REDIS_URL", self.url.as_str()),
            ("SLOTGATE_PREFIX", self.prefix.as_str()),
            ("SLOTGATE_CONFIG", self.config.to_str().unwrap()),
            ("RUST_LOG", "info"),
        ]
    }

    fn worker(&self, id: &str) -> Proc {
        let args = [
            "--id",
            id,
            "--lease-ttl",
            "3s",
            "--visibility",
            "3s",
            "--reconcile-every",
            "1s",
        ];
        Proc::spawn(id, &worker_bin(), &args, &self.envs(), &self.dir)
    }

    fn planner(&self, args: &[&str]) -> String {
        let planner = testkit::process::sibling(&worker_bin(), "planner");
        testkit::process::run_ok(&planner, args, &self.envs())
    }

    fn queue(&self, partitions: u16) -> Queue {
        Queue::new(
            slotgate::queue::pool(&self.url, 4).unwrap(),
            KeySpace::partitioned(self.prefix.clone(), partitions, false),
        )
    }

    async fn count(&self, sql: &str) -> i64 {
        testkit::count(&self.db.pool, sql).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_partitions_on_three_masters_publish_every_slot_once_through_a_master_failover() {
    let mut cluster = tokio::task::spawn_blocking(|| OwnedCluster::start(3, 1))
        .await
        .unwrap();
    let per_kind = 20;
    let s = Stack::new(cluster.url(), &config(3, 6, per_kind)).await;
    s.planner(&["migrate"]);
    for k in ["a", "b", "c"] {
        sqlx::query(
            "INSERT INTO draft (kind, title, ready_at) SELECT $1, $1 || ' ' || i, now() - interval '1 hour' FROM generate_series(1, $2) i",
        )
        .bind(k)
        .bind(per_kind as i32)
        .execute(&s.db.pool)
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
        let owner = cluster
            .master_of(&delayed)
            .expect("a master serves the partition");
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

    let mut workers = [s.worker("w1"), s.worker("w2")];
    // Some slots published, then partition 1's master killed.
    wait_for("the first publishes", Duration::from_secs(30), || async {
        (s.count("SELECT count(*) FROM publish_slot WHERE state = 'published'")
            .await
            >= 6)
            .then_some(())
    })
    .await;
    let victim = owners[1];
    cluster.kill_9(victim);
    let healed = tokio::task::spawn_blocking(move || {
        let r = cluster.wait_healthy();
        (cluster, r)
    })
    .await
    .unwrap();
    let cluster = healed.0;
    healed.1.expect("the cluster fails over to the replica");
    let promoted = cluster.master_of(&keys.part(1).delayed()).unwrap();
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
    assert_eq!(q.depths(0).await.unwrap().dead, 0);
    assert_eq!(q.dead_letters(10).await.unwrap().len(), 0);
}

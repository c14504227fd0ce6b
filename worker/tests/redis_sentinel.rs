//! slotgate behind Redis Sentinel (a primary, a replica and three
//! Sentinels, started from Debian's `redis-server` by testkit): the
//! planner and two worker processes reach Redis through a
//! `redis+sentinel://` URL only. A primary killed mid-run is replaced by
//! its replica and every slot is still published exactly once, none
//! failed or dead-lettered; a primary demoted by a failover gets no client
//! write; and the two passwords (the data nodes', the Sentinels') are
//! each checked, a wrong one refused with an error that names it and does
//! not print it; and a deployment on TLS only, reached through a
//! `rediss+sentinel://` URL, delivers and follows a failover.

use chrono::{Duration as CDuration, Utc};
use slotgate::queue::{KeySpace, Queue, RedisOptions};
use std::path::{Path, PathBuf};
use std::time::Duration;
use testkit::process::Proc;
use testkit::server::{info_field, redis_cli, OwnedSentinel, SentinelAuth, Transport};
use testkit::stack::{Bins, Stack};
use testkit::wait_for;
use testkit::zone::around_noon;

fn worker_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_worker"))
}

/// Three record-only kinds, each with a slot every second from `from`
/// seconds from now, `per_kind` of them; jitter 0. Their zone is one where
/// it is about noon, so the slots fall on the local day `planner plan`
/// plans, whatever the time of day.
fn config(from: i64, per_kind: i64) -> String {
    let start = Utc::now() + CDuration::seconds(from);
    let zone = around_noon(start, Duration::from_secs(600));
    let mut out = String::new();
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

/// The stack behind the Sentinels (their `redis+sentinel://` URL), and
/// the Sentinels' own password its processes get.
struct Guarded {
    stack: Stack,
    sentinel_password: Option<String>,
    /// The CA of a deployment on TLS (`SLOTGATE_REDIS_CA`).
    ca: Option<PathBuf>,
}

impl std::ops::Deref for Guarded {
    type Target = Stack;
    fn deref(&self) -> &Stack {
        &self.stack
    }
}

impl Guarded {
    async fn new(
        sentinel: &OwnedSentinel,
        sentinel_password: Option<&str>,
        config: &str,
    ) -> Guarded {
        let mut b = Stack::builder(Bins::beside(worker_bin()))
            .tag("sentinel")
            .redis_url(sentinel.url())
            .env("RUST_LOG", "info");
        if let Some(p) = sentinel_password {
            b = b.env("SLOTGATE_REDIS_SENTINEL_PASSWORD", p);
        }
        let ca = sentinel.ca().map(Path::to_path_buf);
        if let Some(ca) = &ca {
            b = b.env("SLOTGATE_REDIS_CA", ca.to_str().unwrap());
        }
        Guarded {
            stack: b.build(config).await,
            sentinel_password: sentinel_password.map(str::to_owned),
            ca,
        }
    }

    fn queue(&self) -> Queue {
        let opts = RedisOptions {
            sentinel_password: self.sentinel_password.clone(),
            ca: self.ca.clone(),
            ..RedisOptions::default()
        };
        Queue::new(
            slotgate::queue::pool_with(&self.redis.url, 4, &opts).unwrap(),
            KeySpace::new(self.redis.prefix.clone()),
        )
    }

    async fn count(&self, sql: &str) -> i64 {
        testkit::count(&self.db().pool, sql).await
    }

    async fn published(&self) -> i64 {
        self.count("SELECT count(*) FROM publish_slot WHERE state = 'published'")
            .await
    }

    /// Migrates, imports `per_kind` drafts per kind and plans them.
    async fn plan(&self, per_kind: i64) {
        self.planner(&["migrate"]);
        for k in ["a", "b", "c"] {
            sqlx::query(
                "INSERT INTO draft (kind, title, ready_at) SELECT $1, $1 || ' ' || i, now() - interval '1 hour' FROM generate_series(1, $2) i",
            )
            .bind(k)
            .bind(per_kind as i32)
            .execute(&self.db().pool)
            .await
            .unwrap();
        }
        self.planner(&["plan"]);
    }

    /// Waits until all `total` slots are published and the queue is
    /// drained, then checks exactly once: one published execution per
    /// slot, nothing failed, nothing dead-lettered, no worker exited.
    async fn assert_all_published_once(&self, q: &Queue, total: i64, workers: &mut [Proc]) {
        wait_for(
            &format!("{total} published slots, the stream drained"),
            Duration::from_secs(60),
            || async {
                let published = self.published().await;
                let d = q.depths(Utc::now().timestamp_millis()).await.ok()?;
                (published == total && d.ready + d.pending + d.delayed == 0).then_some(())
            },
        )
        .await;
        for w in workers.iter_mut() {
            assert!(w.exited().is_none(), "a worker exited: {}", w.log_text());
        }
        assert_eq!(
            self.count("SELECT count(*) FROM execution WHERE outcome = 'published'")
                .await,
            total
        );
        assert_eq!(
            self.count("SELECT count(*) FROM execution WHERE outcome = 'failed'")
                .await,
            0
        );
        assert_eq!(q.depths(0).await.unwrap().dead, 0);
        assert_eq!(q.dead_letters(10).await.unwrap().len(), 0);
    }
}

/// Client connections on the data node at `port` other than the
/// Sentinels' own (named `sentinel-…`) and the asking `redis-cli`: the
/// slotgate processes' pooled connections.
fn app_clients(s: &OwnedSentinel, port: u16) -> usize {
    s.data_cli(port, &["CLIENT", "LIST"])
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.contains(" name=sentinel-") && !l.contains(" cmd=client|list"))
        .count()
}

/// `kill -9` of the primary (`first`) and the Sentinels' promotion of its
/// replica, awaited: the set-up and the promoted node's port.
async fn fail_over(mut sentinel: OwnedSentinel, first: u16) -> (OwnedSentinel, u16) {
    let killed = sentinel.kill_9_primary();
    assert_eq!(killed, first);
    let (sentinel, promoted) = tokio::task::spawn_blocking(move || {
        let r = sentinel.wait_failed_over(killed);
        (sentinel, r)
    })
    .await
    .unwrap();
    let promoted = promoted.expect("the Sentinels promote the replica");
    assert_ne!(promoted, killed);
    (sentinel, promoted)
}

/// Scripts ran on `promoted`: the slots after a failover went through it.
fn assert_scripts_ran_on(sentinel: &OwnedSentinel, promoted: u16) {
    let calls = sentinel
        .data_cli(promoted, &["INFO", "commandstats"])
        .unwrap();
    assert!(
        calls.contains("cmdstat_evalsha") || calls.contains("cmdstat_eval"),
        "no script ran on the promoted primary {promoted}: {calls}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_replaced_by_its_replica_and_every_slot_is_published_once() {
    let sentinel = tokio::task::spawn_blocking(OwnedSentinel::start)
        .await
        .unwrap();
    let per_kind = 20;
    let s = Guarded::new(&sentinel, None, &config(6, per_kind)).await;
    s.plan(per_kind).await;
    let q = s.queue();
    let first = sentinel.named_primary().unwrap();
    // The plan went through the Sentinel URL to the primary it names.
    let zcard = sentinel
        .data_cli(first, &["ZCARD", &q.keys().part(0).delayed()])
        .unwrap();
    assert_eq!(zcard.trim(), (3 * per_kind).to_string());

    let mut workers = [s.worker("w1", &[], &[]), s.worker("w2", &[], &[])];
    wait_for("the first publishes", Duration::from_secs(30), || async {
        (s.published().await >= 6).then_some(())
    })
    .await;
    let at_kill = s.published().await;
    let (sentinel, promoted) = fail_over(sentinel, first).await;
    assert_eq!(sentinel.live_ports(), vec![promoted]);
    assert!(
        at_kill < 3 * per_kind,
        "the kill came after the last publish ({at_kill})"
    );

    s.assert_all_published_once(&q, 3 * per_kind, &mut workers)
        .await;
    // The slots after the failover went through the promoted replica.
    assert_scripts_ran_on(&sentinel, promoted);
}

/// How long after the Sentinels name a new primary slotgate may still
/// write to the old one: its check asks them every 100 ms, and a command
/// sent just before (a read blocking up to 1 s) still completes there.
const GRACE: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demoted_primary_gets_no_write_once_the_sentinels_name_another() {
    let sentinel = tokio::task::spawn_blocking(OwnedSentinel::start)
        .await
        .unwrap();
    let per_kind = 25;
    let s = Guarded::new(&sentinel, None, &config(6, per_kind)).await;
    s.plan(per_kind).await;
    let q = s.queue();
    let mut workers = [s.worker("w1", &[], &[]), s.worker("w2", &[], &[])];
    wait_for("the first publishes", Duration::from_secs(30), || async {
        (s.published().await >= 6).then_some(())
    })
    .await;
    let first = sentinel.named_primary().unwrap();
    assert!(
        app_clients(&sentinel, first) >= 2,
        "the workers hold no connection to the primary {first}"
    );

    // A manual failover keeps the old primary running: the Sentinels name
    // the replica at once, but reconfigure the old primary only seconds
    // later; until then it answers ROLE master and would take writes
    // (lost when it resyncs).
    let (sentinel, switched) = tokio::task::spawn_blocking(move || {
        let r = sentinel
            .start_failover()
            .and_then(|old| Ok((old, sentinel.wait_failed_over(old)?)));
        (sentinel, r)
    })
    .await
    .unwrap();
    let switched_at = std::time::Instant::now();
    let (old, new) = switched.expect("a manual failover");
    assert_eq!(old, first);
    let at_switch = sentinel.write_calls(old).unwrap();
    let at_demotion = s.published().await;
    assert!(
        at_demotion < 3 * per_kind - 10,
        "too few slots left after the failover ({at_demotion} published)"
    );

    // Until it is reconfigured as a replica, its client writes are
    // counted: after GRACE they must not grow.
    let (sentinel, watched) = tokio::task::spawn_blocking(move || {
        let mut after_grace: Option<(std::time::Instant, u64)> = None;
        let mut last = at_switch;
        let deadline = switched_at + Duration::from_secs(40);
        while std::time::Instant::now() < deadline {
            if sentinel.role(old).as_deref() == Some("slave") {
                return (sentinel, Ok((after_grace, last, std::time::Instant::now())));
            }
            let Some(w) = sentinel.write_calls(old) else {
                continue;
            };
            if sentinel.role(old).as_deref() != Some("master") {
                continue;
            }
            last = w;
            match after_grace {
                None if switched_at.elapsed() >= GRACE => {
                    after_grace = Some((std::time::Instant::now(), w))
                }
                Some((_, at)) if w != at => {
                    return (
                        sentinel,
                        Err(format!(
                            "{} writes reached the old primary {old} more than {GRACE:?} after the Sentinels named {new}",
                            w - at
                        )),
                    )
                }
                _ => {}
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        (sentinel, Err("the old primary was never reconfigured".into()))
    })
    .await
    .unwrap();
    let (after_grace, last, converted_at) = watched.unwrap();
    let (grace_at, at_grace) = after_grace.expect("the old primary was reconfigured within GRACE");
    let watched_for = converted_at - grace_at;
    eprintln!(
        "old primary {old}: {} client writes in the first {GRACE:?} after the switch, 0 in the {watched_for:?} after until it was reconfigured",
        at_grace - at_switch
    );
    assert!(
        watched_for >= Duration::from_secs(3),
        "the old primary was watched as a master for {watched_for:?} only"
    );
    assert_eq!(last, at_grace);

    s.assert_all_published_once(&q, 3 * per_kind, &mut workers)
        .await;
    // The old primary is now a replica of the new one, and not one client
    // command was refused there as a write to a replica (READONLY).
    let repl = sentinel.data_cli(old, &["INFO", "replication"]).unwrap();
    assert_eq!(info_field(&repl, "role").as_deref(), Some("slave"));
    assert_eq!(
        info_field(&repl, "master_port").as_deref(),
        Some(new.to_string().as_str())
    );
    let errors = sentinel.data_cli(old, &["INFO", "errorstats"]).unwrap();
    assert!(
        !errors.contains("errorstat_READONLY"),
        "writes reached the demoted primary {old}: {errors}"
    );
    assert!(sentinel.write_calls(new).unwrap() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_and_data_passwords_are_each_checked_and_never_printed() {
    let data_pw = "data-pw-3f9a1c";
    let sentinel_pw = "sentinel-pw-77b2e0";
    let sentinel = tokio::task::spawn_blocking(move || {
        OwnedSentinel::launch(SentinelAuth {
            data: Some(data_pw.into()),
            sentinel: Some(sentinel_pw.into()),
        })
        .expect("a Sentinel deployment with passwords")
    })
    .await
    .unwrap();

    // The right passwords: the planner and a worker publish every slot.
    let per_kind = 3;
    let s = Guarded::new(&sentinel, Some(sentinel_pw), &config(3, per_kind)).await;
    s.plan(per_kind).await;
    let q = s.queue();
    q.ping().await.expect("ping through the Sentinels");
    let mut workers = [s.worker("w1", &[], &[])];
    s.assert_all_published_once(&q, 3 * per_kind, &mut workers)
        .await;

    // Each wrong password, alone: the queue's error names the side and
    // never prints any password.
    let wrong = "wrong-pw-c0ffee";
    for (url, sentinel_password, says) in [
        (
            sentinel.url(),
            Some(wrong.to_owned()),
            "SLOTGATE_REDIS_SENTINEL_PASSWORD",
        ),
        (sentinel.url(), None, "SLOTGATE_REDIS_SENTINEL_PASSWORD"),
        (
            sentinel.url_with_password(Some(wrong)),
            Some(sentinel_pw.to_owned()),
            "the URL's password",
        ),
        (
            sentinel.url_with_password(None),
            Some(sentinel_pw.to_owned()),
            "the URL's password",
        ),
    ] {
        let opts = RedisOptions {
            sentinel_password: sentinel_password.clone(),
            ..RedisOptions::default()
        };
        let q = Queue::new(
            slotgate::queue::pool_with(&url, 1, &opts).unwrap(),
            KeySpace::new("wrongpw"),
        );
        let e = q.ping().await.expect_err("a wrong password").to_string();
        assert!(e.contains(says), "{url} / {sentinel_password:?}: {e}");
        for pw in [data_pw, sentinel_pw, wrong] {
            assert!(!e.contains(pw), "the error prints a password: {e}");
        }
    }

    // A worker with the wrong Sentinel password keeps trying and logs
    // why, naming the password to fix and printing none.
    let mut w = s.worker("bad", &[], &[("SLOTGATE_REDIS_SENTINEL_PASSWORD", wrong)]);
    wait_for(
        "the worker's refused-password line",
        Duration::from_secs(30),
        || async {
            w.log_text()
                .contains("SLOTGATE_REDIS_SENTINEL_PASSWORD")
                .then_some(())
        },
    )
    .await;
    assert!(w.exited().is_none(), "the worker exited: {}", w.log_text());
    let log = w.log_text();
    for pw in [data_pw, sentinel_pw, wrong] {
        assert!(!log.contains(pw), "the worker logs a password: {log}");
    }
    drop(sentinel);
}

/// Issue 27: the Sentinels and the data nodes speak only TLS, with a CA of
/// the test's own: the planner and a worker, given a `rediss+sentinel://`
/// URL and that CA (`SLOTGATE_REDIS_CA`), publish every slot, and when the
/// primary is killed the worker follows the Sentinels to the promoted
/// replica without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinels_and_data_nodes_on_tls_deliver_and_follow_a_failover() {
    let sentinel = tokio::task::spawn_blocking(|| {
        OwnedSentinel::launch_with(SentinelAuth::default(), Transport::Tls)
            .expect("a Sentinel deployment on TLS")
    })
    .await
    .unwrap();
    assert!(
        sentinel.url().starts_with("rediss+sentinel://"),
        "{}",
        sentinel.url()
    );
    let first = sentinel.named_primary().unwrap();
    // Plain TCP gets no answer from any process: TLS is the only way in.
    for port in [first, sentinel.sentinel_ports[0]] {
        let plain = redis_cli(port, &["PING"]).unwrap_or_default();
        assert_ne!(plain.trim(), "PONG", "{port} answered plain TCP");
    }
    let per_kind = 10;
    let s = Guarded::new(&sentinel, None, &config(6, per_kind)).await;
    s.plan(per_kind).await;
    let q = s.queue();
    q.ping().await.expect("ping over TLS through the Sentinels");
    let zcard = sentinel
        .data_cli(first, &["ZCARD", &q.keys().part(0).delayed()])
        .unwrap();
    assert_eq!(zcard.trim(), (3 * per_kind).to_string());

    let mut workers = [s.worker("w1", &[], &[])];
    wait_for("the first publishes", Duration::from_secs(30), || async {
        (s.published().await >= 3).then_some(())
    })
    .await;
    let at_kill = s.published().await;
    let (sentinel, promoted) = fail_over(sentinel, first).await;
    assert!(
        at_kill < 3 * per_kind,
        "the kill came after the last publish ({at_kill})"
    );
    s.assert_all_published_once(&q, 3 * per_kind, &mut workers)
        .await;
    assert_scripts_ran_on(&sentinel, promoted);
    let log = workers[0].log_text();
    assert!(!log.contains("InvalidCertificate"), "{log}");
}

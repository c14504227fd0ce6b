//! Postgres failover with real worker processes (issue 27.3): a primary
//! with a streaming replica on loopback (`testkit::server::PgPair`), the
//! worker reaching it through one stable address (a proxy the test moves
//! to the promoted replica, as a virtual IP follows a failover).
//!
//! What is measured, each fault verified before it counts:
//! - asynchronous replication: gate rows committed (and acknowledged) while
//!   the replica's WAL link is frozen (the replica is verified to lag) may
//!   be gone after the primary is killed (`kill -9`, verified) and the
//!   replica promoted (at least one is, verified: the fault happened). The
//!   tests assert the contract, not how much the replication timing lost:
//!   what was replicated before the link froze survives; every duplicate
//!   of a surviving gate row is refused, every slot whose gate row was lost
//!   runs again by its duplicate, each with one recorded outcome; and in
//!   the history that survived nothing is published twice. The tests print
//!   the loss; they document it, they do not hide it.
//! - a synchronous standby (`remote_apply`): the commit of a slot made
//!   while the link is frozen is verified to wait (`SyncRep`), nothing
//!   acknowledged is lost, and every duplicate is refused.
//! - a worker whose address leads to a standby (in recovery) refuses to
//!   write there without crash-looping or failing deliveries, says why,
//!   reports not ready, and carries on when the server is promoted.
//! - the read-before-write after an asynchronous failover: WordPress
//!   (drafts in slotgate) finds the post of a lost gate row and writes
//!   nothing; a webhook kind with `probe_url` finds the publish too, since
//!   without a synchronous standby every claim is probed before its first
//!   send (before that rule, a fresh claim was not, and the publish went out
//!   again under the same Idempotency-Key).
//! - a synchronous standby does not cover a commit whose wait is cancelled
//!   (`pg_cancel_backend`): Postgres returns success, and the slot is
//!   acknowledged though the standby lacks it. The worker's own statement
//!   timeout does not cancel the wait.
//!
//! Every worker is the real binary, started as other worker tests start it.

use chrono::Utc;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use testkit::cms::Cms;
use testkit::server::{PgPair, Replication, SyncLevel};
use testkit::stack::{Bins, Stack};
use testkit::wait_for;

fn worker_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_worker"))
}

/// Long enough for a worker to notice a dead server, reconnect through the
/// moved address and run what was delivered, on a loaded 2-core machine.
const T: Duration = Duration::from_secs(30);

/// Yesterday (UTC): every time of it is past, and within a 48 h
/// starting deadline.
fn yesterday() -> String {
    (Utc::now().date_naive() - chrono::Days::new(1)).to_string()
}

/// A UTC kind with ten slots (01:00 … 10:00), jitter 0, a cap of 100 and
/// a 48 h starting deadline; `extra` adds keys (a receiver).
fn kind(name: &str, extra: &str) -> String {
    let slots: Vec<String> = (1..=10).map(|h| format!("\"{h:02}:00\"")).collect();
    format!(
        "[[kinds]]\nname = {name:?}\ntimezone = \"UTC\"\nslots = [{}]\njitter = \"0\"\ndaily_cap = 100\nstarting_deadline = \"48h\"\n{extra}\n",
        slots.join(", ")
    )
}

/// A pair, a migrated database on it, and the stack (a Redis prefix and
/// a config file) whose processes reach the database through the front.
struct Ha {
    stack: Stack,
    pair: PgPair,
    db: String,
    day: String,
    kind: String,
}

impl std::ops::Deref for Ha {
    type Target = Stack;
    fn deref(&self) -> &Stack {
        &self.stack
    }
}

impl Ha {
    async fn new(replication: Replication, kind_name: &str, config: &str) -> Ha {
        let pair = PgPair::start(replication).await;
        let db = pair.create_db().await;
        let stack = Stack::builder(Bins::beside(worker_bin()))
            .tag("ha")
            .database_url(pair.url(&db))
            .build(config)
            .await;
        Ha {
            stack,
            pair,
            db,
            day: yesterday(),
            kind: kind_name.to_owned(),
        }
    }

    /// `planner check` through the worker's address: its exit status and
    /// standard error.
    fn planner_check(&self) -> (Option<i32>, String) {
        let out = std::process::Command::new(&self.bins.planner)
            .arg("check")
            .env("DATABASE_URL", self.pair.url(&self.db))
            .env("SLOTGATE_CONFIG", &self.config)
            .env_remove("REDIS_URL")
            .output()
            .expect("run planner check");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn slot(&self, n: u32) -> String {
        format!("{}:{}:{n}", self.kind, self.day)
    }

    /// Delivers slot `n` as the planner would; its stream entry id.
    async fn deliver(&self, n: u32) -> String {
        let mut c = self.redis.conn().await;
        redis::cmd("XADD")
            .arg(
                slotgate::queue::KeySpace::new(self.redis.prefix.as_str())
                    .part(0)
                    .ready(),
            )
            .arg("*")
            .arg("slot")
            .arg(self.slot(n))
            .arg("caller")
            .arg("planner")
            .query_async(&mut c)
            .await
            .expect("XADD")
    }

    async fn drafts(&self, url: &str, n: usize) {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        sqlx::query(
            "INSERT INTO draft (kind, title, ready_at)
             SELECT $1, $1 || ' ' || i, now() - make_interval(secs => 600 - i) FROM generate_series(1, $2) i",
        )
        .bind(&self.kind)
        .bind(n as i32)
        .execute(&pool)
        .await
        .unwrap();
        pool.close().await;
    }

    /// Deliveries read but not acknowledged.
    async fn pending(&self) -> i64 {
        let mut c = self.redis.conn().await;
        let v: redis::Value = redis::cmd("XPENDING")
            .arg(
                slotgate::queue::KeySpace::new(self.redis.prefix.as_str())
                    .part(0)
                    .ready(),
            )
            .arg("workers")
            .query_async(&mut c)
            .await
            .unwrap_or(redis::Value::Nil);
        match v {
            redis::Value::Array(v) => match v.first() {
                Some(redis::Value::Int(n)) => *n,
                _ => 0,
            },
            _ => 0,
        }
    }

    /// Waits until every one of `entries` has its execution row at `url`
    /// and nothing is left unacknowledged; the rows' (slot, outcome,
    /// reason) in entry order.
    async fn wait_handled(
        &self,
        url: &str,
        entries: &[String],
        what: &str,
    ) -> Vec<(String, String, Option<String>)> {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        let rows = wait_for(what, T, || async {
            let rows: Vec<(String, String, String, Option<String>)> = sqlx::query_as(
                "SELECT entry_id, slot_key, outcome, reason FROM execution WHERE entry_id = ANY($1)",
            )
            .bind(entries)
            .fetch_all(&pool)
            .await
            .ok()?;
            (rows.len() == entries.len() && self.pending().await == 0).then_some(rows)
        })
        .await;
        pool.close().await;
        entries
            .iter()
            .map(|e| {
                let (_, slot, outcome, reason) = rows.iter().find(|r| &r.0 == e).unwrap().clone();
                (slot, outcome, reason)
            })
            .collect()
    }
}

async fn count(url: &str, sql: &str) -> i64 {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let n = testkit::count(&pool, sql).await;
    pool.close().await;
    n
}

/// Delivers slots `from..=to` and waits until each is handled on the
/// primary and acknowledged; asserts each was published.
async fn publish(s: &Ha, from: u32, to: u32, what: &str) {
    let mut entries = Vec::new();
    for n in from..=to {
        entries.push(s.deliver(n).await);
    }
    let done = s
        .wait_handled(&s.pair.primary_url(&s.db), &entries, what)
        .await;
    for (slot, outcome, reason) in &done {
        assert_eq!(outcome, "published", "{slot}: {outcome} {reason:?}");
    }
}

/// Kills the primary (verified) and promotes the replica (verified); how
/// long the promotion took. The worker's address still leads to the dead
/// primary, so what survived can be counted before the worker gets there
/// (the caller then moves the address).
async fn fail_over(s: &Ha) -> Duration {
    s.pair.kill_primary();
    let t = Instant::now();
    s.pair.promote().await;
    t.elapsed()
}

/// What an asynchronous failover cost: gate rows committed (and
/// acknowledged) on the old primary, the slots whose gate rows are on the
/// promoted replica and those that are not, the replica's lag in bytes
/// when the primary died, and how long the promotion took.
struct Loss {
    committed: i64,
    survived: Vec<u32>,
    lost: Vec<u32>,
    lag: i64,
    promoted_in: Duration,
}

/// The slot numbers with a gate row at `url`, ascending.
async fn gated(url: &str) -> Vec<u32> {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let slots: Vec<i32> = sqlx::query_scalar("SELECT slot FROM publish_slot ORDER BY slot")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    slots.into_iter().map(|n| n as u32).collect()
}

/// The contract that survives any failover: in the history at `url`,
/// every slot of `1..=to` has one gate row, `published`, and exactly one
/// `published` execution — nothing published twice, nothing lost without
/// an outcome.
async fn published_once(url: &str, to: u32) {
    let pool = sqlx::PgPool::connect(url).await.unwrap();
    let rows: Vec<(i32, Option<String>, i64)> = sqlx::query_as(
        "SELECT n, (SELECT state FROM publish_slot g WHERE g.slot = n),
                (SELECT count(*) FROM execution e WHERE e.slot = n AND e.outcome = 'published')
           FROM generate_series(1, $1) n ORDER BY n",
    )
    .bind(to as i32)
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    for (n, state, published) in rows {
        assert_eq!(
            (state.as_deref(), published),
            (Some("published"), 1),
            "slot {n}: one published gate row and one published execution"
        );
    }
}

/// Publishes slots `1..=following` while the replica follows (and waits
/// until it has them), freezes the replica's WAL link, publishes
/// `following + 1..=to` while it lags (verified), fails over and moves
/// the address to the promoted replica.
async fn lose_to_async_failover(s: &Ha, following: u32, to: u32) -> Loss {
    publish(s, 1, following, "slots published while the replica follows").await;
    s.pair.wait_caught_up().await;
    s.pair.freeze_link();
    publish(
        s,
        following + 1,
        to,
        "slots published while the replica lags",
    )
    .await;
    let committed = count(
        &s.pair.primary_url(&s.db),
        "SELECT count(*) FROM publish_slot",
    )
    .await;
    let lag = s.pair.lag_bytes().await;
    assert!(lag > 0, "the replica did not lag: the fault did not happen");
    let promoted_in = fail_over(s).await;
    let survived = gated(&s.pair.replica_url(&s.db)).await;
    s.pair.repoint_front_to_replica();
    let lost: Vec<u32> = (1..=to).filter(|n| !survived.contains(n)).collect();
    assert!(
        !lost.is_empty(),
        "the failover lost no gate row: the fault did not happen"
    );
    assert!(
        (1..=following).all(|n| survived.contains(&n)),
        "what the replica had replayed before the link froze survives: {survived:?}"
    );
    Loss {
        committed,
        survived,
        lost,
        lag,
        promoted_in,
    }
}

/// A pair whose primary's commits wait for the standby to apply them
/// (`remote_apply`), with 20 drafts of kind `note`.
async fn sync_pair() -> Ha {
    let s = Ha::new(
        Replication::Sync(SyncLevel::RemoteApply),
        "note",
        &kind("note", ""),
    )
    .await;
    s.drafts(&s.pair.primary_url(&s.db), 20).await;
    s
}

/// Freezes the standby's WAL link and delivers slot 4; its entry id, once
/// a worker's backend waits for the standby (`SyncRep`) and `also` (a
/// condition on `pg_stat_activity`) holds.
async fn hold_slot_4(s: &Ha, what: &str, also: &str) -> String {
    s.pair.freeze_link();
    let held = s.deliver(4).await;
    let primary = s.pair.primary_url(&s.db);
    let waiting = format!(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'slotgate' \
         AND wait_event = 'SyncRep' AND {also}"
    );
    wait_for(what, T, || async {
        (count(&primary, &waiting).await > 0).then_some(())
    })
    .await;
    held
}

/// Delivers a duplicate of each of slots `1..=to` and waits until each is
/// handled on the promoted replica: how many ran again (`published`) and
/// how many the gate refused (`slot_taken`), and how long the first took
/// from the moment the duplicates went out.
async fn duplicates(s: &Ha, to: u32) -> (Vec<u32>, Vec<u32>, Duration) {
    let t = Instant::now();
    let mut entries = Vec::new();
    for n in 1..=to {
        entries.push(s.deliver(n).await);
    }
    let done = s
        .wait_handled(
            &s.pair.replica_url(&s.db),
            &entries,
            "every duplicate handled on the promoted replica",
        )
        .await;
    let took = t.elapsed();
    let (mut ran, mut refused) = (Vec::new(), Vec::new());
    for (n, (slot, outcome, reason)) in (1..=to).zip(&done) {
        match (outcome.as_str(), reason.as_deref()) {
            ("published", _) => ran.push(n),
            ("skipped", Some("slot_taken")) => refused.push(n),
            other => panic!("{slot}: unexpected {other:?}"),
        }
    }
    (ran, refused, took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_async_failover_loses_acknowledged_gate_rows_and_their_duplicates_run_again() {
    let s = Ha::new(Replication::Async, "note", &kind("note", "")).await;
    s.drafts(&s.pair.primary_url(&s.db), 20).await;
    let (code, err) = tokio::task::block_in_place(|| s.planner_check());
    assert_eq!(code, Some(0), "a warning, not a failure: {err}");
    assert!(
        err.contains("warning: postgres: the primary has no synchronous standby"),
        "{err}"
    );
    let mut w = s.worker("w1", &[], &[]);
    let Loss {
        committed,
        survived,
        lost,
        lag,
        promoted_in,
    } = lose_to_async_failover(&s, 3, 8).await;
    wait_for("the worker's warning at start", T, || async {
        w.log_text()
            .contains("the primary has no synchronous standby")
            .then_some(())
    })
    .await;
    assert_eq!(committed, 8, "8 gate rows committed and acknowledged");
    eprintln!(
        "async failover: {committed} gate rows acknowledged, slots {survived:?} on the promoted \
         replica, {lost:?} lost ({lag} bytes of WAL behind; promoted in {promoted_in:?})"
    );
    // How many were lost is the replication's timing; what happens to
    // each is the contract. A duplicate of every slot (each recorded with
    // one outcome, `published` or `skipped/slot_taken`, by `duplicates`):
    let (ran, refused, took) = duplicates(&s, 8).await;
    eprintln!(
        "duplicates after the async failover: slots {ran:?} ran again, {refused:?} refused; \
         handled {took:?} after the address moved"
    );
    assert_eq!(ran, lost, "every lost gate row let its duplicate through");
    assert_eq!(refused, survived, "every surviving gate row refused it");
    published_once(&s.pair.replica_url(&s.db), 8).await;
    let log = w.log_text();
    assert_eq!(
        log.matches("the primary has no synchronous standby")
            .count(),
        1,
        "warned once, not again after the switch (the promoted replica has none either):\n{log}"
    );
    assert!(
        w.exited().is_none(),
        "the worker survived the switch without a restart:\n{}",
        w.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_synchronous_standby_keeps_every_acknowledged_gate_row_across_failover() {
    let s = sync_pair().await;
    // Generous limits, so the held commit below is ended by the kill, not
    // by a timeout (what a timeout does is README's business).
    let envs = [
        ("SLOTGATE_PG_STATEMENT_TIMEOUT", "60s"),
        ("SLOTGATE_PG_TRANSACTION_DEADLINE", "60s"),
    ];
    let (code, err) = tokio::task::block_in_place(|| s.planner_check());
    assert_eq!(code, Some(0), "{err}");
    assert!(!err.contains("warning"), "{err}");
    assert!(
        err.contains("commits wait for a synchronous standby (synchronous_commit = remote_apply)"),
        "{err}"
    );
    let mut w = s.worker("w1", &[], &envs);
    publish(&s, 1, 3, "slots 1-3 published with a synchronous standby").await;
    wait_for(
        "the worker's note of the synchronous standby",
        T,
        || async {
            w.log_text()
                .contains("Postgres commits wait for a synchronous standby")
                .then_some(())
        },
    )
    .await;
    assert!(
        !w.log_text().contains("no synchronous standby"),
        "{}",
        w.log_text()
    );
    // Slot 4 was never planned: its first write is the on-the-spot plan
    // (its own commit), then the gate's commit. Either one waiting for
    // the standby holds the slot back.
    let held = hold_slot_4(
        &s,
        "slot 4's first commit waiting for the standby",
        "(query ILIKE 'commit%' OR query ILIKE 'INSERT INTO planned_slot%')",
    )
    .await;
    assert!(s.pending().await > 0, "slot 4 is not acknowledged");
    let promoted_in = fail_over(&s).await;
    let replica = s.pair.replica_url(&s.db);
    let survived = count(
        &replica,
        "SELECT count(*) FROM publish_slot WHERE state = 'published'",
    )
    .await;
    s.pair.repoint_front_to_replica();
    // Slot 4 was never acknowledged: the worker retries it on the new
    // primary, where it runs for the first time.
    let after = s
        .wait_handled(&replica, &[held], "slot 4 retried on the promoted replica")
        .await;
    assert_eq!(after[0].1, "published", "{after:?}");
    let (ran, refused, took) = duplicates(&s, 4).await;
    eprintln!(
        "sync (remote_apply) failover: {survived} of 3 acknowledged gate rows on the promoted \
         replica (promoted in {promoted_in:?}); duplicates ran {ran:?}, refused {refused:?}, \
         handled {took:?} after they went out"
    );
    assert_eq!(survived, 3, "no acknowledged gate row was lost");
    assert!(ran.is_empty(), "no duplicate ran: {ran:?}");
    assert_eq!(refused, vec![1, 2, 3, 4]);
    assert_eq!(
        count(
            &replica,
            "SELECT count(*) FROM execution WHERE outcome = 'published'"
        )
        .await,
        4,
        "each slot published once in the surviving history"
    );
    assert!(w.exited().is_none(), "{}", w.log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_facing_a_standby_waits_for_writes_and_carries_on_after_promotion() {
    let s = Ha::new(Replication::Async, "note", &kind("note", "")).await;
    s.drafts(&s.pair.primary_url(&s.db), 20).await;
    let addr = format!("127.0.0.1:{}", testkit::server::pick_port());
    let mut w = s.worker("w1", &["--metrics-addr", &addr], &[]);
    publish(&s, 1, 1, "slot 1 published on the primary").await;
    s.pair.wait_caught_up().await;
    // The address moves to the replica while it is still a standby (a
    // virtual IP moved before the promotion).
    s.pair.repoint_front_to_replica();
    let waiting = s.deliver(2).await;
    wait_for("the worker to say the server refuses writes", T, || async {
        w.log_text()
            .contains("Postgres refuses writes")
            .then_some(())
    })
    .await;
    let (status, body) = wait_for("/readyz to report the standby", T, || async {
        let (status, body) = testkit::http_get(&addr, "/readyz").await.ok()?;
        (status == 503).then_some((status, body))
    })
    .await;
    assert!(body.contains("standby in recovery"), "{status}: {body}");
    let replica = s.pair.replica_url(&s.db);
    assert_eq!(
        count(&replica, "SELECT count(*) FROM execution").await,
        1,
        "nothing recorded on the standby"
    );
    assert!(s.pending().await > 0, "slot 2 waits, unacknowledged");
    assert!(w.exited().is_none(), "no exit on a read-only server");
    let (code, err) = tokio::task::block_in_place(|| s.planner_check());
    assert_eq!(code, Some(1), "a standby is a problem: {err}");
    assert!(err.contains("standby in recovery"), "{err}");
    s.pair.promote().await;
    let t = Instant::now();
    let done = s
        .wait_handled(&replica, &[waiting], "slot 2 after the promotion")
        .await;
    eprintln!(
        "the waiting slot ran {:?} after the promotion finished",
        t.elapsed()
    );
    assert_eq!(done[0].1, "published", "{done:?}");
    wait_for("/readyz 200 again", T, || async {
        let (status, _) = testkit::http_get(&addr, "/readyz").await.ok()?;
        (status == 200).then_some(())
    })
    .await;
    let log = w.log_text();
    assert!(log.contains("Postgres takes writes again"), "{log}");
    assert!(
        !log.contains("giving up on this delivery"),
        "the refusals were not counted as failures:\n{log}"
    );
    assert_eq!(
        count(
            &replica,
            "SELECT count(*) FROM execution WHERE outcome <> 'published'"
        )
        .await,
        0
    );
    assert!(w.exited().is_none(), "{log}");
}

/// The duplicate of slot 2 after an async failover that lost its gate row,
/// for a kind with a receiver: slot 1 replicated, slot 2 published while
/// the replica lagged, the primary killed, the replica promoted. Returns
/// the duplicate's execution (outcome, detail).
async fn duplicate_after_loss(s: &Ha, envs: &[(&str, &str)]) -> (String, serde_json::Value) {
    let mut w = s.worker("w1", &[], envs);
    // Slot 1 replicated before the link froze (it survives), slot 2 after:
    // the only one the failover can have lost, and it did (both verified).
    let loss = lose_to_async_failover(s, 1, 2).await;
    assert_eq!(loss.lost, vec![2], "slot 2's gate row was lost");
    let replica = s.pair.replica_url(&s.db);
    let dup = s.deliver(2).await;
    s.wait_handled(&replica, std::slice::from_ref(&dup), "slot 2's duplicate")
        .await;
    let pool = sqlx::PgPool::connect(&replica).await.unwrap();
    let row: (String, serde_json::Value) =
        sqlx::query_as("SELECT outcome, detail FROM execution WHERE entry_id = $1")
            .bind(&dup)
            .fetch_one(&pool)
            .await
            .unwrap();
    pool.close().await;
    assert!(w.exited().is_none(), "{}", w.log_text());
    row
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_an_async_failover_a_probe_url_kind_finds_the_lost_slots_publish_and_sends_nothing() {
    let cms = Cms::start().await;
    let extra = format!(
        "publish_url = \"{}\"\nprobe_url = \"{}\"\nhttp_timeout = \"2s\"",
        cms.url("/publish"),
        cms.url("/probe")
    );
    let s = Ha::new(Replication::Async, "post", &kind("post", &extra)).await;
    s.drafts(&s.pair.primary_url(&s.db), 5).await;
    let (outcome, detail) = duplicate_after_loss(&s, &[]).await;
    let key = s.slot(2);
    let of_slot_2 = |path: &str| {
        cms.calls_to(path)
            .into_iter()
            .filter(|c| c.key.as_deref() == Some(key.as_str()))
            .count()
    };
    let (sent, probed) = (of_slot_2("/publish"), of_slot_2("/probe"));
    eprintln!(
        "probe_url kind after an async failover: slot 2 sent {sent} time(s), probed {probed} times"
    );
    assert_eq!(outcome, "published", "{detail}");
    // Without a synchronous standby every claim is looked up before its
    // first send (DESIGN 4.20): the duplicate's fresh claim finds the
    // publish its lost gate row had made.
    assert_eq!(
        detail["found_applied"], true,
        "the look-up found slot 2's publish: {detail}"
    );
    assert_eq!(sent, 1, "slot 2 sent once: {:?}", cms.calls());
    assert_eq!(
        probed, 2,
        "a look before the first send, and one for the duplicate"
    );
    assert_eq!(
        cms.effects("/publish"),
        2,
        "slots 1 and 2 applied once each, even by a CMS that ignores the key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_an_async_failover_wordpress_finds_the_lost_slots_post_and_writes_nothing() {
    let wp = tokio::task::block_in_place(testkit::server::OwnedWordPress::start);
    let (user, password) = wp.admin();
    let extra = format!(
        "http_timeout = \"5s\"\n[kinds.wordpress]\nurl = \"{}\"\nuser = \"{user}\"\napp_password_env = \"TEST_WP_PASSWORD\"\n",
        wp.url()
    );
    let s = Ha::new(Replication::Async, "article", &kind("article", &extra)).await;
    s.drafts(&s.pair.primary_url(&s.db), 5).await;
    let (outcome, detail) = duplicate_after_loss(&s, &[("TEST_WP_PASSWORD", password)]).await;
    assert_eq!(outcome, "published", "{detail}");
    assert_eq!(
        detail["found_applied"], true,
        "the look-up before the create found slot 2's post: {detail}"
    );
    let posts = wp.posts().await;
    // The slot's marker: the default slug template, then the tag of the
    // default jitter_seed and the kind. The rerun staged a copy before its
    // look-up found the post; that copy went to the trash, never out.
    let tag =
        slotgate::receiver::wordpress::marker_tag(slotgate::config::DEFAULT_JITTER_SEED, "article");
    let slug = format!("article-{}-2-{tag}", s.day);
    let public: Vec<_> = posts.iter().filter(|p| p.status == "publish").collect();
    let of_slot_2 = public.iter().filter(|p| p.slug == slug).count();
    eprintln!(
        "WordPress after an async failover: {} posts ({} public), {of_slot_2} public for slot 2",
        posts.len(),
        public.len()
    );
    assert_eq!(of_slot_2, 1, "one public post for slot 2: {posts:?}");
    assert_eq!(public.len(), 2, "{posts:?}");
    assert!(
        posts
            .iter()
            .all(|p| p.status == "publish" || p.status == "trash"),
        "the rerun's staged copy is trashed: {posts:?}"
    );
}

/// What a synchronous standby does not cover: a commit whose wait for the
/// standby is *cancelled* returns success (Postgres: "canceling wait for
/// synchronous replication … already committed locally"), so the slot is
/// acknowledged though the standby never got it, the failover loses it
/// and its duplicate runs again. The worker's own `--pg-statement-timeout`
/// does not end the wait (Postgres disarms it before the commit): measured
/// here with a 1 s timeout and a wait verified still going after 3 s. An
/// operator's `pg_cancel_backend` (or a pooler's cancel) does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_wait_for_the_standby_lets_an_unreplicated_commit_through() {
    let s = sync_pair().await;
    let envs = [
        ("SLOTGATE_PG_STATEMENT_TIMEOUT", "1s"),
        ("SLOTGATE_PG_LOCK_TIMEOUT", "500ms"),
    ];
    let mut w = s.worker("w1", &[], &envs);
    publish(&s, 1, 3, "slots 1-3 published with a synchronous standby").await;
    let held = hold_slot_4(
        &s,
        "slot 4's commit waiting for the standby past the 1 s statement timeout",
        "now() - state_change > interval '3 s'",
    )
    .await;
    let primary = s.pair.primary_url(&s.db);
    // Cancel every wait for the standby until slot 4 is acknowledged.
    let pool = sqlx::PgPool::connect(&primary).await.unwrap();
    let cancelled = std::sync::atomic::AtomicI64::new(0);
    wait_for(
        "slot 4 acknowledged after its waits were cancelled",
        T,
        || {
            let (pool, held, cancelled, s) = (&pool, &held, &cancelled, &s);
            async move {
                let n = testkit::count(
                    pool,
                    "SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity \
                      WHERE application_name = 'slotgate' AND wait_event = 'SyncRep'",
                )
                .await;
                cancelled.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
                let done: i64 =
                    sqlx::query_scalar("SELECT count(*) FROM execution WHERE entry_id = $1")
                        .bind(held)
                        .fetch_one(pool)
                        .await
                        .ok()?;
                (done == 1 && s.pending().await == 0).then_some(())
            }
        },
    )
    .await;
    pool.close().await;
    let cancelled = cancelled.into_inner();
    assert!(cancelled > 0, "a wait was cancelled: the fault happened");
    assert!(
        s.pair.lag_bytes().await > 0,
        "the standby lacks what the primary acknowledged"
    );
    fail_over(&s).await;
    let replica = s.pair.replica_url(&s.db);
    let survived = gated(&replica).await;
    s.pair.repoint_front_to_replica();
    let (ran, refused, _) = duplicates(&s, 4).await;
    // Slot 4 runs again on the new primary: by its duplicate, or first by
    // the worker's own reclaimed copy of its entry (the wait outlasted the
    // test's 3 s visibility, so the entry was reclaimed meanwhile).
    let again = count(
        &replica,
        "SELECT count(*) FROM execution WHERE kind = 'note' AND slot = 4 AND outcome = 'published'",
    )
    .await;
    eprintln!(
        "sync standby, waits cancelled {cancelled} times: slot 4 acknowledged; gate rows of slots \
         {survived:?} survived; slot 4 published again on the new primary ({again}); duplicates \
         ran {ran:?}, refused {refused:?}"
    );
    // Slots 1-3 were applied by the standby before their commits
    // returned; slot 4 was committed after the link froze, so its gate row
    // cannot be on the standby: that is the fault, not a timing.
    assert_eq!(
        survived,
        vec![1, 2, 3],
        "slot 4's acknowledged gate row was lost"
    );
    assert_eq!(again, 1, "slot 4 ran again after the failover");
    assert_eq!(&refused[..3], &[1, 2, 3]);
    published_once(&replica, 4).await;
    let log = w.log_text();
    assert!(
        log.contains("canceling wait for synchronous replication"),
        "Postgres's warning reaches the worker's log:\n{log}"
    );
    assert!(w.exited().is_none(), "{log}");
}

/// Issue 27: `planner run` (the long-running planner) across a switch to
/// a promoted replica reached through the same address, without a
/// restart. Its rounds made while the replica's link is frozen are lost
/// with the primary; while the address leads to the replica still in
/// recovery the planner writes nothing there, says why and turns
/// unhealthy, but keeps running; once the replica is promoted its next
/// rounds plan again what was lost and it is healthy again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn planner_run_refuses_a_standby_and_plans_again_after_the_promotion() {
    let s = Ha::new(Replication::Async, "note", &kind("note", "")).await;
    s.pair.wait_caught_up().await;
    s.pair.freeze_link();
    let addr = format!("127.0.0.1:{}", testkit::server::pick_port());
    let args = [
        "run",
        "--every",
        "1s",
        "--round-deadline",
        "2s",
        "--metrics-addr",
        &addr,
    ];
    let mut run = s.planner_proc("planner-run", &args, &[]);
    let healthz = || async {
        testkit::http_get(&addr, "/healthz")
            .await
            .map(|(status, _)| status)
            .unwrap_or(0)
    };
    let primary = s.pair.primary_url(&s.db);
    let planned_sql = "SELECT count(*) FROM planned_slot";
    let planned = wait_for("a planning round on the primary", T, || async {
        let n = count(&primary, planned_sql).await;
        (n > 0 && healthz().await == 200).then_some(n)
    })
    .await;
    assert!(s.pair.lag_bytes().await > 0, "the replica did not lag");
    s.pair.kill_primary();
    // The address moves to the replica while it is still a standby.
    s.pair.repoint_front_to_replica();
    let replica = s.pair.replica_url(&s.db);
    assert_eq!(
        count(&replica, planned_sql).await,
        0,
        "the rounds made while the link was frozen are lost"
    );
    wait_for(
        "the planner to turn unhealthy on the standby",
        T,
        || async { (healthz().await == 503).then_some(()) },
    )
    .await;
    let log = run.log_text();
    assert!(
        log.contains("planning failed") && log.contains("read-only"),
        "the planner says why it plans nothing:\n{log}"
    );
    assert!(run.exited().is_none(), "no exit on a standby:\n{log}");
    assert_eq!(count(&replica, planned_sql).await, 0);
    s.pair.promote().await;
    let t = Instant::now();
    wait_for(
        "the planner to plan again on the promoted replica",
        T,
        || async {
            (count(&replica, planned_sql).await >= planned && healthz().await == 200).then_some(())
        },
    )
    .await;
    eprintln!(
        "planner run: {planned} planned slots lost with the primary, planned again {:?} after the promotion",
        t.elapsed()
    );
    assert!(
        run.exited().is_none(),
        "the planner survived the switch without a restart:\n{}",
        run.log_text()
    );
}

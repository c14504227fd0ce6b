//! Hostile bytes and a poisoned stream: whatever a stranger with `redis-cli`
//! puts on the ready stream, every entry ends in one outcome, the entries
//! read with it run normally, copies of it stay bounded, and the stream
//! repairs itself when Redis refuses to add to it.

use crate::common::{kind_toml, today, yesterday, Env, T};
use redis::Value;
use slotgate::queue::aside_glob;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// The last possible stream id: after it, Redis refuses every `XADD *`.
const MAX_ID: &str = "18446744073709551615-18446744073709551615";

/// The fields a dead letter may carry (the delivery's three, slotgate's four).
const DEAD_FIELDS: [&str; 7] = [
    "slot",
    "caller",
    "enqueued_at",
    "reason",
    "entry_id",
    "deliveries",
    "dead_at",
];

/// A bounded copy: 256 bytes plus the `…` that marks a cut.
const BOUND: usize = 256 + 3;

type Fields = Vec<(Vec<u8>, Vec<u8>)>;

fn f(name: &[u8], value: &[u8]) -> (Vec<u8>, Vec<u8>) {
    (name.to_vec(), value.to_vec())
}

/// `XADD <stream> <id> …` with raw byte arguments, as `redis-cli` can send.
async fn xadd_raw(env: &Env, stream: &str, id: &str, fields: &Fields) -> String {
    let mut c = env.redis.conn().await;
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg(id);
    for (k, v) in fields {
        cmd.arg(&k[..]).arg(&v[..]);
    }
    cmd.query_async(&mut c).await.unwrap()
}

/// Entries that must each end `failed/bad_message`; the slots they name
/// (4..=8) would publish if one were taken for a good delivery.
fn bad_entries() -> Vec<(&'static str, Fields)> {
    let day = today();
    let key = |n: u32| format!("article:{day}:{n}").into_bytes();
    let huge = format!("article:{day}:6{}", "x".repeat(200_000)).into_bytes();
    vec![
        (
            "non-UTF-8 value",
            vec![f(b"slot", &key(5)), f(b"caller", b"\xff\xfe\xfd")],
        ),
        (
            "non-UTF-8 field name",
            vec![
                f(b"slot", &key(4)),
                f(b"caller", b"hostile"),
                f(b"\xff\xfe", b"x"),
            ],
        ),
        (
            "200 KB slot",
            vec![f(b"slot", &huge), f(b"caller", b"hostile")],
        ),
        (
            "missing slot",
            vec![f(b"caller", b"hostile"), f(b"enqueued_at", b"1")],
        ),
        (
            "junk field",
            vec![
                f(b"slot", &key(7)),
                f(b"caller", b"hostile"),
                f(b"note", &vec![b'j'; 100_000]),
            ],
        ),
        (
            "repeated field",
            vec![f(b"slot", &key(8)), f(b"slot", &key(8))],
        ),
        (
            // Cut in Redis before it is read: the entry is oversized.
            "200 KB caller",
            vec![f(b"slot", &key(4)), f(b"caller", &vec![b'c'; 200_000])],
        ),
    ]
}

/// Good entries: slots 1 and 2, and slot 3 with a 200-byte `caller`
/// (recorded truncated, not refused: the caller is not trusted for
/// anything; a `caller` over 256 bytes makes the entry oversized).
fn good_entries() -> Vec<Fields> {
    let day = today();
    let key = |n: u32| format!("article:{day}:{n}").into_bytes();
    vec![
        vec![f(b"slot", &key(1)), f(b"caller", b"planner")],
        vec![f(b"slot", &key(2)), f(b"caller", b"planner")],
        vec![f(b"slot", &key(3)), f(b"caller", &[b'c'; 200])],
    ]
}

/// Raw dead letters: entry id → field name → value (lossy).
async fn dead_letters(env: &Env) -> Vec<HashMap<String, Vec<u8>>> {
    let mut c = env.redis.conn().await;
    let v: Value = redis::cmd("XRANGE")
        .arg(env.queue.keys().dead())
        .arg("-")
        .arg("+")
        .query_async(&mut c)
        .await
        .unwrap();
    let Value::Array(entries) = v else {
        panic!("XRANGE answered {v:?}")
    };
    entries
        .into_iter()
        .map(|e| {
            let Value::Array(mut parts) = e else {
                panic!("entry {e:?}")
            };
            let Value::Array(flat) = parts.remove(1) else {
                panic!("fields")
            };
            flat.chunks(2)
                .map(|p| {
                    let name: Vec<u8> = redis::from_redis_value(&p[0]).unwrap();
                    let value: Vec<u8> = redis::from_redis_value(&p[1]).unwrap();
                    (String::from_utf8_lossy(&name).into_owned(), value)
                })
                .collect()
        })
        .collect()
}

/// Checks what a run of [`good_entries`] and [`bad_entries`] must leave.
async fn assert_outcomes(env: &Env, bad_ids: &[String]) {
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&3), "{o:?}");
    assert_eq!(o.get("failed/bad_message"), Some(&7), "{o:?}");
    assert_eq!(o.len(), 2, "nothing else: {o:?}");
    // One row per entry, bad ones under their own entry ids.
    let rows: Vec<(Option<String>, i32, i32, i32, String)> = sqlx::query_as(
        "SELECT entry_id, octet_length(slot_key), octet_length(caller), \
         octet_length(detail::text), outcome FROM execution",
    )
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 10);
    for (entry, slot_len, caller_len, detail_len, _) in &rows {
        assert!(
            *slot_len as usize <= BOUND && *caller_len as usize <= BOUND,
            "{entry:?}: slot {slot_len} B, caller {caller_len} B"
        );
        assert!(*detail_len <= 1024, "{entry:?}: detail {detail_len} B");
    }
    let failed: BTreeSet<String> = rows
        .iter()
        .filter(|r| r.4 == "failed")
        .filter_map(|r| r.0.clone())
        .collect();
    assert_eq!(failed, bad_ids.iter().cloned().collect());
    // Dead-lettered with only the known fields, each bounded.
    let dead = dead_letters(env).await;
    assert_eq!(dead.len(), 7, "{dead:?}");
    let mut dead_ids = BTreeSet::new();
    for d in &dead {
        for (name, value) in d {
            assert!(DEAD_FIELDS.contains(&name.as_str()), "field {name:?}");
            assert!(value.len() <= BOUND, "{name}: {} B", value.len());
        }
        assert_eq!(d["reason"], b"bad_message");
        dead_ids.insert(String::from_utf8(d["entry_id"].clone()).unwrap());
    }
    assert_eq!(dead_ids, bad_ids.iter().cloned().collect());
    // Everything acknowledged.
    let d = env
        .queue
        .depths(chrono::Utc::now().timestamp_millis())
        .await
        .unwrap();
    assert_eq!((d.ready, d.pending, d.dead), (0, 0, 7), "{d:?}");
}

fn eight_slots() -> String {
    kind_toml(
        "article",
        &[
            "00:00", "00:00:01", "00:00:02", "00:00:03", "00:00:04", "00:00:05", "00:00:06",
            "00:00:07",
        ],
        8,
        "",
    )
}

/// A test's env with 8 drafts and the consumer group; and the stream's name.
async fn eight_drafts_and_a_group() -> (Env, String) {
    let env = Env::new(&eight_slots()).await;
    env.add_drafts("article", 8).await;
    env.queue.ensure_group().await.unwrap();
    let ready = env.queue.keys().ready();
    (env, ready)
}

/// `consumer` takes up to `count` new entries and never acknowledges them.
async fn read_and_die(env: &Env, consumer: &str, count: usize) {
    let mut c = env.redis.conn().await;
    let _: Value = redis::cmd("XREADGROUP")
        .arg("GROUP")
        .arg(slotgate::queue::GROUP)
        .arg(consumer)
        .arg("COUNT")
        .arg(count)
        .arg("STREAMS")
        .arg(env.queue.keys().ready())
        .arg(">")
        .query_async(&mut c)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_entries_on_the_read_path_fail_alone_and_good_ones_run() {
    let (env, ready) = eight_drafts_and_a_group().await;
    let mut bad_ids = Vec::new();
    // Interleaved, so every read batch mixes good and bad entries.
    let mut good = good_entries().into_iter();
    for (_, fields) in bad_entries() {
        if let Some(g) = good.next() {
            xadd_raw(&env, &ready, "*", &g).await;
        }
        bad_ids.push(xadd_raw(&env, &ready, "*", &fields).await);
    }
    let w = env.start_workers(2, |_| {});
    env.wait_executions(10, T).await;
    w.stop().await;
    assert_outcomes(&env, &bad_ids).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_entries_on_the_reclaim_path_fail_alone_and_good_ones_run() {
    let (env, ready) = eight_drafts_and_a_group().await;
    let mut bad_ids = Vec::new();
    for (_, fields) in bad_entries() {
        bad_ids.push(xadd_raw(&env, &ready, "*", &fields).await);
    }
    for g in good_entries() {
        xadd_raw(&env, &ready, "*", &g).await;
    }
    // A consumer takes them all and dies without acknowledging anything.
    read_and_die(&env, "ghost", 100).await;
    let d = env
        .queue
        .depths(chrono::Utc::now().timestamp_millis())
        .await
        .unwrap();
    assert_eq!(d.pending, 10, "the ghost holds every entry: {d:?}");
    let w = env.start_workers(2, |o| o.visibility = Duration::from_millis(300));
    env.wait_executions(10, T).await;
    w.stop().await;
    assert_outcomes(&env, &bad_ids).await;
}

/// Keys of a pattern on the test's Redis.
async fn keys_like(env: &Env, pattern: &str) -> Vec<String> {
    testkit::scan(&mut env.redis.conn().await, pattern)
        .await
        .unwrap()
}

async fn poison(env: &Env) {
    let ready = env.queue.keys().ready();
    xadd_raw(
        env,
        &ready,
        MAX_ID,
        &vec![f(b"slot", b"poison"), f(b"caller", b"hostile")],
    )
    .await;
    // Redis now refuses every `XADD *` on the stream.
    let mut c = env.redis.conn().await;
    let refused: redis::RedisResult<String> = redis::cmd("XADD")
        .arg(&ready)
        .arg("*")
        .arg("slot")
        .arg("x")
        .query_async(&mut c)
        .await;
    assert!(refused.is_err(), "{refused:?}");
}

/// Published executions per slot key.
async fn published(env: &Env) -> HashMap<String, i64> {
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT slot_key, count(*) FROM execution WHERE outcome = 'published' GROUP BY 1",
    )
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    rows.into_iter().collect()
}

/// Runs workers until all 8 slots are published, and checks each was once.
async fn run_the_day(env: &Env) {
    let w = env.start_workers(2, |_| {});
    testkit::wait_for("8 published slots", T, || async {
        (published(env).await.len() == 8).then_some(())
    })
    .await;
    w.stop().await;
    let p = published(env).await;
    assert!(p.values().all(|n| *n == 1), "each slot once: {p:?}");
}

/// Waits until every entry of the ready stream is acknowledged.
async fn wait_drained(env: &Env) {
    testkit::wait_for("an empty stream", T, || async {
        let d = env.queue.depths(0).await.unwrap();
        (d.ready + d.pending == 0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_at_the_last_id_is_moved_aside_and_the_day_still_runs_once() {
    let env = Env::new(&eight_slots()).await;
    env.add_drafts("article", 8).await;
    poison(&env).await;
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    run_the_day(&env).await;
    let gate = testkit::count(&env.db.pool, "SELECT count(*) FROM publish_slot").await;
    assert_eq!(gate, 8);
    let broken = keys_like(&env, &aside_glob(&env.queue.keys().ready())).await;
    assert!(
        !broken.is_empty(),
        "the broken stream is kept for inspection"
    );
    let mut c = env.redis.conn().await;
    let kept: Vec<Value> = redis::cmd("XRANGE")
        .arg(&broken[0])
        .arg(MAX_ID)
        .arg(MAX_ID)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(kept.len(), 1, "{broken:?} holds the poisoned entry");
    // The new stream takes ids again.
    env.queue.deliver("article:x", "test", 0).await.unwrap();
}

/// The review's chaos seed 777: a duplicate delivery sat in the stream when
/// an entry at the last id made the next writer move the stream aside; the
/// reconciler re-delivers planned slots without an outcome, not copies, so
/// the duplicate was never recorded. The entries the stream held come back
/// under their own ids, and each gets its one recorded outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entries_queued_in_a_stream_moved_aside_are_each_recorded() {
    let (env, ready) = eight_drafts_and_a_group().await;
    let today = today();
    let mut queued = Vec::new();
    for (n, caller) in [(1, "planner"), (1, "manual"), (2, "backfill")] {
        let slot = format!("article:{today}:{n}");
        let id = xadd_raw(
            &env,
            &ready,
            "*",
            &vec![f(b"slot", slot.as_bytes()), f(b"caller", caller.as_bytes())],
        )
        .await;
        queued.push(id);
    }
    poison(&env).await;
    // The next writer finds the stream broken and moves it aside.
    env.queue
        .deliver(&format!("article:{today}:3"), "planner", 0)
        .await
        .unwrap();
    let broken = keys_like(&env, &aside_glob(&ready)).await;
    assert_eq!(
        broken.len(),
        1,
        "the stream was moved aside: the fault happened"
    );
    let w = env.start_workers(1, |_| {});
    testkit::wait_for("every queued entry recorded", T, || async {
        let n: i64 = sqlx::query_scalar("SELECT count(*) FROM execution WHERE entry_id = ANY($1)")
            .bind(&queued)
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
        (n == queued.len() as i64).then_some(())
    })
    .await;
    wait_drained(&env).await;
    w.stop().await;
    let o = env.outcomes().await;
    assert_eq!(
        o.get("published"),
        Some(&3),
        "slots 1, 2 and 3 once each: {o:?}"
    );
    assert_eq!(
        o.get("skipped/slot_taken"),
        Some(&1),
        "the duplicate of slot 1: {o:?}"
    );
    let poisoned = testkit::count(
        &env.db.pool,
        "SELECT count(*) FROM execution WHERE slot_key = 'poison' OR entry_id LIKE '18446744073709551615-%'",
    )
    .await;
    assert_eq!(poisoned, 0, "the entry that broke the stream stays aside");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_and_backfill_repair_a_poisoned_stream() {
    let env = Env::new(&eight_slots()).await;
    env.add_drafts("article", 8).await;
    let p = env.planner();
    // A backfill delivers the slots already due: yesterday's, at any hour.
    let day = yesterday();
    poison(&env).await;
    p.trigger("article", day, 1, "manual").await.unwrap();
    poison(&env).await;
    let b = p.backfill("article", day, day).await.unwrap();
    assert_eq!(b.delivered.len(), 8, "{b:?}");
    let broken = keys_like(&env, &aside_glob(&env.queue.keys().ready())).await;
    assert_eq!(broken.len(), 2, "{broken:?}");
    run_the_day(&env).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_capped() {
    let env = Env::new(&eight_slots()).await;
    env.queue.ensure_group().await.unwrap();
    let mut c = env.redis.conn().await;
    let mut p = redis::pipe();
    for i in 0..300 {
        p.cmd("XADD")
            .arg(env.queue.keys().ready())
            .arg("*")
            .arg("slot")
            .arg(format!("junk{i}"))
            .ignore();
    }
    p.query_async::<()>(&mut c).await.unwrap();
    let cancel = tokio_util::sync::CancellationToken::new();
    let mut w = env.worker("w0", |_| {});
    w.queue = w.queue.with_dead_letter_cap(10);
    let h = tokio::spawn(w.run(cancel.clone()));
    env.wait_executions(300, T).await;
    wait_drained(&env).await;
    cancel.cancel();
    h.await.unwrap();
    // `MAXLEN ~` trims whole stream nodes: at most one node over the cap.
    let (_, node): (String, usize) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("stream-node-max-entries")
        .query_async::<Vec<(String, usize)>>(&mut c)
        .await
        .unwrap()
        .remove(0);
    let len: usize = redis::cmd("XLEN")
        .arg(env.queue.keys().dead())
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(len <= 10 + node && len < 300, "P:dead holds {len}");
    assert_eq!(
        env.outcomes().await.get("failed/bad_message"),
        Some(&300),
        "every entry still recorded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_consumers_and_stale_workers_are_forgotten() {
    let env = Env::new(&eight_slots()).await;
    env.queue.ensure_group().await.unwrap();
    let (ready, workers) = (env.queue.keys().ready(), env.queue.keys().workers());
    let mut c = env.redis.conn().await;
    let group = slotgate::queue::GROUP;
    for ghost in ["ghost-a", "ghost-b"] {
        let _: i64 = redis::cmd("XGROUP")
            .arg("CREATECONSUMER")
            .arg(&ready)
            .arg(group)
            .arg(ghost)
            .query_async(&mut c)
            .await
            .unwrap();
    }
    // ghost-b holds an entry: it must stay, whatever its age.
    env.xadd(&[("slot", "held"), ("caller", "test")]).await;
    read_and_die(&env, "ghost-b", 1).await;
    // Heartbeats planted ten days old, and one that is not a number.
    let old = chrono::Utc::now().timestamp_millis() - 10 * 86_400_000;
    let _: i64 = redis::cmd("HSET")
        .arg(&workers)
        .arg("ghost-a")
        .arg(old)
        .arg("ghost-b")
        .arg(old)
        .arg("ghost-junk")
        .arg("not a number")
        .query_async(&mut c)
        .await
        .unwrap();
    let w = env.start_workers(1, |o| {
        o.visibility = Duration::from_secs(60);
        o.forget_after = Duration::from_secs(3);
    });
    // The live worker gets one entry (so it is a consumer: Redis 7.0 makes
    // none for a read that finds nothing), then nothing more: its idle time
    // grows past the limit, and only its heartbeat says it is alive.
    env.xadd(&[("slot", "junk"), ("caller", "test")]).await;
    env.wait_executions(1, T).await;
    let consumers = |c: redis::aio::MultiplexedConnection| {
        let ready = ready.clone();
        async move {
            let mut c = c;
            let v: Vec<HashMap<String, Value>> = redis::cmd("XINFO")
                .arg("CONSUMERS")
                .arg(&ready)
                .arg(group)
                .query_async(&mut c)
                .await
                .unwrap();
            v.into_iter()
                .map(|m| {
                    let name: String = redis::from_redis_value(&m["name"]).unwrap();
                    let pending: i64 = redis::from_redis_value(&m["pending"]).unwrap();
                    let idle: i64 = redis::from_redis_value(&m["idle"]).unwrap();
                    (name, (pending, idle))
                })
                .collect::<HashMap<String, (i64, i64)>>()
        }
    };
    // Until ghost-a is gone and the live worker has been idle past the
    // limit for two more leader passes (reconcile_every is 1 s), or is gone.
    let cs = testkit::wait_for("ghost-a forgotten", T, || async {
        let cs = consumers(c.clone()).await;
        let ws: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(&workers)
            .query_async(&mut c.clone())
            .await
            .unwrap();
        let w0_idle = cs.get("w0").map_or(i64::MAX, |(_, idle)| *idle);
        (!cs.contains_key("ghost-a")
            && !ws.contains_key("ghost-a")
            && !ws.contains_key("ghost-junk")
            && w0_idle > 5_000)
            .then_some(cs)
    })
    .await;
    assert_eq!(
        cs.get("ghost-b").map(|c| c.0),
        Some(1),
        "a consumer holding work stays: {cs:?}"
    );
    assert!(cs.contains_key("w0"), "the live worker stays: {cs:?}");
    let ws: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(&workers)
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(ws.contains_key("w0"), "{ws:?}");
    assert!(
        !ws.contains_key("ghost-b"),
        "its heartbeat is stale: {ws:?}"
    );
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_key_of_another_type_is_moved_aside_and_the_day_still_runs_once() {
    let env = Env::new(&eight_slots()).await;
    env.add_drafts("article", 8).await;
    let ready = env.queue.keys().ready();
    let mut c = env.redis.conn().await;
    let _: () = redis::cmd("SET")
        .arg(&ready)
        .arg("not a stream")
        .query_async(&mut c)
        .await
        .unwrap();
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    run_the_day(&env).await;
    let broken = keys_like(&env, &aside_glob(&ready)).await;
    assert_eq!(broken.len(), 1, "{broken:?}");
    let kept: String = redis::cmd("GET")
        .arg(&broken[0])
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(kept, "not a stream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_dead_letter_stream_is_moved_aside_and_dead_letters_still_land() {
    let env = Env::new(&eight_slots()).await;
    env.queue.ensure_group().await.unwrap();
    let dead = env.queue.keys().dead();
    xadd_raw(&env, &dead, MAX_ID, &vec![f(b"reason", b"poison")]).await;
    let bad = env.xadd(&[("slot", "junk"), ("caller", "test")]).await;
    let w = env.start_workers(1, |_| {});
    env.wait_executions(1, T).await;
    wait_drained(&env).await;
    w.stop().await;
    assert_eq!(env.outcomes().await.get("failed/bad_message"), Some(&1));
    let letters = dead_letters(&env).await;
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0]["entry_id"], bad.as_bytes());
    let broken = keys_like(&env, &aside_glob(&dead)).await;
    assert_eq!(broken.len(), 1, "{broken:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_written_heartbeat_does_not_break_the_worker_list() {
    let env = Env::new(&eight_slots()).await;
    let mut c = env.redis.conn().await;
    let _: i64 = redis::cmd("HSET")
        .arg(env.queue.keys().workers())
        .arg("w1")
        .arg(1_790_000_000_000i64)
        .arg("junk")
        .arg("not a number")
        .arg(&b"\xff\xfe"[..])
        .arg(5)
        .query_async(&mut c)
        .await
        .unwrap();
    let w = env.queue.workers().await.unwrap();
    assert_eq!(w.get("w1"), Some(&1_790_000_000_000), "{w:?}");
    assert!(!w.contains_key("junk"), "{w:?}");
    assert_eq!(w.get("\u{fffd}\u{fffd}"), Some(&5), "{w:?}");
}

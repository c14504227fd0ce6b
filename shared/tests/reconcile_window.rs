//! The reconciler reads only the slots due in its window: history before
//! it is not touched, while due unfinished slots in it are still
//! re-delivered and slots past their deadline in it are still recorded
//! `missed_deadline`.

use crate::common::{kind_toml, Env};
use chrono::{Duration as CDuration, NaiveTime, TimeZone, Utc};
use slotgate::clock::ManualClock;
use slotgate::reconcile::{Pass, Reconciler};
use slotgate::slot::{PlannedSlot, SlotKey};
use std::sync::Arc;
use std::time::Duration;

fn slot_at(day_offset: i64, now: chrono::DateTime<Utc>) -> PlannedSlot {
    let day = now.date_naive() + CDuration::days(day_offset);
    let at = Utc.from_utc_datetime(&day.and_time(NaiveTime::from_hms_opt(0, 0, 0).unwrap()));
    PlannedSlot {
        key: SlotKey::new("article", day, 1),
        nominal_at: at,
        due_at: at,
        jitter_ms: 0,
    }
}

/// Noon yesterday (UTC): that day's 00:00 and 06:00 are twelve and six
/// hours due by the leader's clock whatever the hour, and due by Redis's
/// real clock too, which a re-delivery also waits for (noon *today* made a
/// 06:00 slot not yet due by Redis before 06:00 UTC, and the test fail).
fn noon_yesterday() -> chrono::DateTime<Utc> {
    Utc.from_utc_datetime(
        &(Utc::now().date_naive() - CDuration::days(1))
            .and_time(NaiveTime::from_hms_opt(12, 0, 0).unwrap()),
    )
}

/// The leading worker's reconciler, on `env`'s config, at `now`.
fn leader(env: &Env, now: chrono::DateTime<Utc>) -> Reconciler {
    Reconciler {
        config: env.config.clone(),
        pool: env.db.pool.clone(),
        queue: env.queue.clone(),
        clock: Arc::new(ManualClock::new(now)),
        worker_id: "leader".into(),
        grace: Duration::from_secs(2),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_before_the_window_is_not_touched_and_due_slots_are_redelivered() {
    // Starting deadline 48h; the window reaches 48h + a day back.
    let env = Env::new(&kind_toml("article", &["00:00"], 5, "")).await;
    let noon = noon_yesterday();
    let history = slot_at(-30, noon); // long past its deadline, never recorded
    let missed = slot_at(-2, noon); // 60h ago: past its deadline, inside the window
    let due = slot_at(0, noon); // 12h ago: due, never delivered
    let mut conn = env.db.pool.acquire().await.unwrap();
    slotgate::store::insert_planned(
        &mut conn,
        &[history.clone(), missed.clone(), due.clone()],
        "test",
    )
    .await
    .unwrap();
    drop(conn);
    let r = leader(&env, noon);
    let pass = r.run_once(1, || true).await.unwrap();
    let expected = Pass {
        redelivered: 1,
        missed: 1,
        ..Pass::default()
    };
    assert_eq!(pass, expected);
    let queued = env.queue.queued_slots().await.unwrap();
    assert_eq!(queued, [due.key.to_string()].into_iter().collect());
    let rows: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT kind || ':' || day || ':' || slot, state, reason FROM publish_slot")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(
        rows,
        vec![(
            missed.key.to_string(),
            "skipped".to_owned(),
            Some("missed_deadline".to_owned())
        )]
    );
    let touched = testkit::count(
        &env.db.pool,
        &format!(
            "SELECT count(*) FROM execution WHERE day = '{}'",
            history.key.day
        ),
    )
    .await;
    assert_eq!(touched, 0, "history outside the window is not touched");
    // A second pass changes nothing: the due slot is queued now.
    assert_eq!(r.run_once(1, || true).await.unwrap(), Pass::default());
}

/// A planner on a newer config planned slot 2; the leading worker's config
/// has one slot. Re-delivered, slot 2 would be dead-lettered `unknown_slot`
/// by every worker on this config and re-delivered again on the next pass
/// (5,700 dead letters in ~70 s for 200 slots): the reconciler leaves it
/// alone and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_the_leaders_config_does_not_know_is_not_redelivered() {
    let env = Env::new(&kind_toml("article", &["00:00"], 5, "")).await;
    let noon = noon_yesterday();
    let known = slot_at(0, noon);
    let unknown = PlannedSlot {
        key: SlotKey::new("article", known.key.day, 2),
        ..known.clone()
    };
    let mut conn = env.db.pool.acquire().await.unwrap();
    slotgate::store::insert_planned(&mut conn, &[known.clone(), unknown.clone()], "planner")
        .await
        .unwrap();
    drop(conn);
    let r = leader(&env, noon);
    for _ in 0..2 {
        let pass = r.run_once(1, || true).await.unwrap();
        assert_eq!(pass.unknown, 1, "{pass:?}");
    }
    let queued = env.queue.queued_slots().await.unwrap();
    assert_eq!(
        queued,
        [known.key.to_string()].into_iter().collect(),
        "only the known slot is re-delivered"
    );
}

/// A pass asks Redis about its candidates only (`Queue::queued_among`:
/// their scores, not the delayed sets read whole): a due slot still waiting
/// in the delayed set (its promotion not yet run) is queued and is not
/// re-delivered, a due slot queued nowhere is; and what a set holds beyond
/// the slots asked is not reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_slot_still_in_the_delayed_set_is_queued_and_not_redelivered() {
    let env = Env::new(&kind_toml("article", &["00:00", "06:00"], 5, "")).await;
    let noon = noon_yesterday();
    let waiting = slot_at(0, noon);
    let six = waiting.due_at + CDuration::hours(6);
    let lost = PlannedSlot {
        key: SlotKey::new("article", waiting.key.day, 2),
        nominal_at: six,
        due_at: six,
        jitter_ms: 0,
    };
    let mut conn = env.db.pool.acquire().await.unwrap();
    slotgate::store::insert_planned(&mut conn, &[waiting.clone(), lost.clone()], "test")
        .await
        .unwrap();
    drop(conn);
    // In the delayed set: the waiting slot (due, not promoted yet) and a
    // member no pass asks about.
    let stranger = format!("article:{}:9", waiting.key.day);
    env.queue
        .schedule(&[
            (waiting.key.to_string(), waiting.due_at.timestamp_millis()),
            (
                stranger.clone(),
                (noon + CDuration::days(1)).timestamp_millis(),
            ),
        ])
        .await
        .unwrap();
    let r = leader(&env, noon);
    let pass = r.run_once(1, || true).await.unwrap();
    let expected = Pass {
        redelivered: 1,
        ..Pass::default()
    };
    assert_eq!(pass, expected, "the waiting slot is not re-delivered");
    // Only the lost slot went to the stream; the waiting one is where it was.
    let mut c = env.redis.conn().await;
    let stream: Vec<(String, std::collections::HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg(env.queue.keys().ready())
        .arg("-")
        .arg("+")
        .query_async(&mut c)
        .await
        .unwrap();
    let delivered: Vec<&str> = stream.iter().map(|(_, f)| f["slot"].as_str()).collect();
    assert_eq!(delivered, vec![lost.key.to_string()]);
    let asked = [
        waiting.key.to_string(),
        lost.key.to_string(),
        format!("article:{}:3", waiting.key.day),
    ];
    assert_eq!(
        env.queue.queued_among(&asked).await.unwrap(),
        [waiting.key.to_string(), lost.key.to_string()]
            .into_iter()
            .collect(),
        "the delayed and the ready slot asked, not the stranger nor the slot queued nowhere"
    );
    // A second pass changes nothing: both are queued now.
    assert_eq!(r.run_once(1, || true).await.unwrap(), Pass::default());
}

/// `Queue::queued_among` reads a stream page by page until it has found
/// every slot asked: a slot at the head and one on the third page of 1,000
/// entries are both found, one queued nowhere is not, and slots queued but
/// not asked are not reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_among_finds_the_slots_asked_anywhere_in_a_long_stream() {
    let env = Env::new(&kind_toml("article", &["00:00"], 5, "")).await;
    let day = noon_yesterday().date_naive();
    let key = |n: u32| format!("article:{day}:{n}");
    let now_ms = noon_yesterday().timestamp_millis();
    for n in 1..=2_500 {
        env.queue.deliver(&key(n), "planner", now_ms).await.unwrap();
    }
    let found = |asked: Vec<String>| {
        let q = env.queue.clone();
        async move { q.queued_among(&asked).await.unwrap() }
    };
    assert_eq!(
        found(vec![key(1), key(2_500), key(9_999)]).await,
        [key(1), key(2_500)].into_iter().collect(),
    );
    assert_eq!(
        found(vec![key(2), key(1)]).await,
        [key(1), key(2)].into_iter().collect(),
    );
    assert_eq!(
        found(vec![key(1_999)]).await,
        [key(1_999)].into_iter().collect()
    );
    assert!(found(Vec::new()).await.is_empty());
}

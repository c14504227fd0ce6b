//! The reconciler reads only the slots due in its window: history before
//! it is not touched, while due unfinished slots in it are still
//! re-delivered and slots past their deadline in it are still recorded
//! `missed_deadline`.

mod common;

use chrono::{Duration as CDuration, NaiveTime, TimeZone, Utc};
use common::{kind_toml, Env};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_before_the_window_is_not_touched_and_due_slots_are_redelivered() {
    // Starting deadline 48h; the window reaches 48h + a day back.
    let env = Env::new(&kind_toml("article", &["00:00"], 5, "")).await;
    // Noon today, so "today 00:00" is twelve hours due whatever the hour.
    let noon = Utc.from_utc_datetime(
        &Utc::now()
            .date_naive()
            .and_time(NaiveTime::from_hms_opt(12, 0, 0).unwrap()),
    );
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
    let r = Reconciler {
        config: env.config.clone(),
        pool: env.db.pool.clone(),
        queue: env.queue.clone(),
        clock: Arc::new(ManualClock::new(noon)),
        worker_id: "leader".into(),
        grace: Duration::from_secs(2),
    };
    let pass = r.run_once(1, || true).await.unwrap();
    assert_eq!(
        pass,
        Pass {
            redelivered: 1,
            resumed: 0,
            missed: 1
        }
    );
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

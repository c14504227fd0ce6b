//! A schedule edit re-keys nothing (DESIGN 4.18): a time keeps the slot
//! number it was first given, so adding, removing or moving a time never
//! runs another time's slot twice or not at all; a removed time's planned
//! slot that has not run is cancelled with a recorded reason and leaves the
//! delayed set; a day that already ran a removed time's slot and gets a new
//! one is reported.

mod common;

use chrono::{NaiveDate, NaiveTime};
use common::{kind_toml, today, Env};
use slotgate::executor::Handled;
use slotgate::outcome::SlotState;
use slotgate::outcome::{FailReason, Outcome};
use slotgate::plan::Fate;

fn article(slots: &[&str]) -> String {
    kind_toml("article", slots, 5, "")
}

fn hm(s: &str) -> NaiveTime {
    NaiveTime::parse_from_str(s, "%H:%M").unwrap()
}

/// Delivers each slot number of `day` `times` times (as `redis-cli` would)
/// and runs every delivery through an executor of the current config.
async fn deliver(env: &Env, day: NaiveDate, numbers: &[u32], times: usize) -> Vec<Handled> {
    for no in numbers {
        for _ in 0..times {
            env.xadd(&[
                ("slot", &format!("article:{day}:{no}")),
                ("caller", "planner"),
            ])
            .await;
        }
    }
    let exec = env.executor("w");
    let mut out = Vec::new();
    for d in env.read_all("w").await {
        out.push(exec.handle(&d).await.unwrap());
    }
    out
}

/// (local nominal time, gate state) of every planned slot of `day`.
async fn day_slots(env: &Env, day: NaiveDate) -> Vec<(NaiveTime, u32, Option<String>)> {
    let rows: Vec<(NaiveTime, i32, Option<String>)> = sqlx::query_as(
        "SELECT (p.nominal_at AT TIME ZONE 'UTC')::time, p.slot, g.state
           FROM planned_slot p
           LEFT JOIN publish_slot g ON (g.day, g.slot, g.kind) = (p.day, p.slot, p.kind)
          WHERE p.day = $1 ORDER BY 1",
    )
    .bind(day)
    .fetch_all(&env.db.pool)
    .await
    .unwrap();
    rows.into_iter().map(|(t, n, s)| (t, n as u32, s)).collect()
}

/// The case: `slots = ["12:00"]` ran, then 09:00 was inserted in
/// front. By list position, 09:00 became slot 1 (already run: refused) and
/// 12:00 slot 2 (new: run again), so the day had 12:00 twice and 09:00
/// never. Now 12:00 stays slot 1 and 09:00 is slot 2.
#[tokio::test]
async fn inserting_a_time_in_front_gives_one_slot_at_each_time_and_nothing_twice() {
    let mut env = Env::new(&article(&["12:00"])).await;
    env.load_numbered(&article(&["12:00"])).await;
    env.add_drafts("article", 4).await;
    // Yesterday: every slot is due and within the 48 h deadline, whatever
    // the time of day.
    let day = today() - chrono::Duration::days(1);
    env.planner().plan_day(Some(day), &[], false).await.unwrap();
    let first = deliver(&env, day, &[1], 1).await;
    assert_eq!(first, vec![Handled::Recorded(Outcome::Published)]);

    env.load_numbered(&article(&["09:00", "12:00"])).await;
    assert_eq!(env.config.kinds[0].slot_numbers, vec![2, 1]);
    let plan = env.planner().plan_day(Some(day), &[], false).await.unwrap();
    let shown: Vec<(u32, NaiveTime, bool)> = plan
        .slots
        .iter()
        .map(|s| (s.slot_no, s.nominal_at.time(), s.new))
        .collect();
    assert_eq!(shown, vec![(2, hm("09:00"), true), (1, hm("12:00"), false)]);
    assert!(
        plan.unscheduled.is_empty() && plan.warnings.is_empty(),
        "{plan:?}"
    );

    // Every slot of the day delivered twice more.
    let handled = deliver(&env, day, &[1, 2], 2).await;
    let published = handled
        .iter()
        .filter(|h| **h == Handled::Recorded(Outcome::Published))
        .count();
    assert_eq!(published, 1, "only 09:00 is new: {handled:?}");
    assert_eq!(
        day_slots(&env, day).await,
        vec![
            (hm("09:00"), 2, Some("published".into())),
            (hm("12:00"), 1, Some("published".into())),
        ]
    );
    let drafts = testkit::count(
        &env.db.pool,
        "SELECT count(DISTINCT slot_key) FROM draft WHERE status = 'published'",
    )
    .await;
    assert_eq!(drafts, 2, "two drafts, one per time");
}

/// Whether `member` is in the delayed set.
async fn queued(env: &Env, member: &str) -> bool {
    let mut c = env.redis.conn().await;
    let score: Option<i64> = redis::cmd("ZSCORE")
        .arg(format!("{}:delayed", env.redis.prefix))
        .arg(member)
        .query_async(&mut c)
        .await
        .unwrap();
    score.is_some()
}

/// Removing a time: its planned slot that has not run is cancelled
/// (`--dry-run` shows it first and changes nothing), its delayed-set entry
/// goes, the other times keep their numbers, and a stray delivery of it
/// runs nothing.
#[tokio::test]
async fn removing_a_time_cancels_its_planned_slot_and_keeps_the_others() {
    let mut env = Env::new(&article(&["09:00", "12:00", "18:00"])).await;
    env.load_numbered(&article(&["09:00", "12:00", "18:00"]))
        .await;
    env.add_drafts("article", 4).await;
    // Tomorrow: nothing of it is due, whatever the time of day.
    let day = today() + chrono::Duration::days(1);
    env.planner().plan_day(Some(day), &[], false).await.unwrap();
    let member = format!("article:{day}:2");
    assert!(queued(&env, &member).await);

    env.load_numbered(&article(&["09:00", "18:00"])).await;
    assert_eq!(env.config.kinds[0].slot_numbers, vec![1, 3]);
    assert_eq!(env.config.kinds[0].retired_slots, vec![(2, hm("12:00"))]);
    let dry = env.planner().plan_day(Some(day), &[], true).await.unwrap();
    assert_eq!(dry.unscheduled.len(), 1, "{dry:?}");
    assert_eq!(dry.unscheduled[0].slot, member);
    assert_eq!(dry.unscheduled[0].fate, Fate::WouldBeCancelled);
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT count(*) FROM publish_slot").await,
        0
    );
    assert!(queued(&env, &member).await, "a dry run changes nothing");

    let plan = env.planner().plan_day(Some(day), &[], false).await.unwrap();
    assert_eq!(plan.unscheduled[0].fate, Fate::Cancelled);
    assert!(plan.slots.iter().all(|s| !s.new), "{plan:?}");
    assert!(
        !queued(&env, &member).await,
        "its delayed-set entry is gone"
    );
    assert_eq!(
        day_slots(&env, day).await,
        vec![
            (hm("09:00"), 1, None),
            (hm("12:00"), 2, Some("skipped".into())),
            (hm("18:00"), 3, None),
        ]
    );
    let o = env.outcomes().await;
    assert_eq!(o.get("skipped/unscheduled"), Some(&1), "{o:?}");
    // Planning again cancels nothing twice.
    let again = env.planner().plan_day(Some(day), &[], false).await.unwrap();
    assert_eq!(
        again.unscheduled[0].fate,
        Fate::AlreadyGated {
            state: SlotState::Skipped
        }
    );
    assert_eq!(env.outcomes().await.get("skipped/unscheduled"), Some(&1));

    // A stray delivery of the cancelled slot (redis-cli) runs nothing.
    let handled = deliver(&env, day, &[2], 1).await;
    assert_eq!(
        handled,
        vec![Handled::Recorded(Outcome::Failed(FailReason::UnknownSlot))]
    );
    let ready = testkit::count(
        &env.db.pool,
        "SELECT count(*) FROM draft WHERE status = 'ready'",
    )
    .await;
    assert_eq!(ready, 4, "no draft taken");

    // The time comes back: it gets its number back, and the day's slot
    // stays cancelled (its gate row is final).
    env.load_numbered(&article(&["09:00", "12:00", "18:00"]))
        .await;
    assert_eq!(env.config.kinds[0].slot_numbers, vec![1, 2, 3]);
    assert!(env.config.kinds[0].retired_slots.is_empty());
}

/// Moving a time that already ran today: the day gets both, and the plan
/// says so (before the change with `--dry-run`).
#[tokio::test]
async fn moving_an_already_run_time_is_reported() {
    let mut env = Env::new(&article(&["12:00"])).await;
    env.load_numbered(&article(&["12:00"])).await;
    env.add_drafts("article", 4).await;
    let day = today() - chrono::Duration::days(1);
    env.planner().plan_day(Some(day), &[], false).await.unwrap();
    deliver(&env, day, &[1], 1).await;

    env.load_numbered(&article(&["12:30"])).await;
    let dry = env.planner().plan_day(Some(day), &[], true).await.unwrap();
    assert_eq!(
        dry.unscheduled[0].fate,
        Fate::AlreadyGated {
            state: SlotState::Published
        }
    );
    assert_eq!(dry.warnings.len(), 1, "{dry:?}");
    let w = &dry.warnings[0];
    assert!(
        w.contains(&format!("article:{day}:1")) && w.contains(&format!("article:{day}:2")),
        "{w}"
    );
}

/// Replicas that start together with the same edited config agree on the
/// numbers, and each listing is numbered once.
#[tokio::test]
async fn concurrent_numbering_agrees() {
    let env = Env::new(&article(&["12:00"])).await;
    let times = [hm("12:00"), hm("09:00"), hm("09:00"), hm("18:00")];
    let runs = (0..6).map(|_| {
        let pool = env.db.pool.clone();
        tokio::spawn(async move {
            slotgate::store::number_slots(&pool, &[("article", &times[..])])
                .await
                .unwrap()
        })
    });
    let all: Vec<_> = futures_util::future::join_all(runs)
        .await
        .into_iter()
        .map(|r| r.unwrap()["article"].active.clone())
        .collect();
    assert!(all.iter().all(|a| *a == vec![1, 2, 3, 4]), "{all:?}");
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT count(*) FROM slot_number").await,
        4
    );
}

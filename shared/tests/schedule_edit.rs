//! A schedule edit re-keys nothing (DESIGN 4.18): a time keeps the slot
//! number it was first given, so adding, removing or moving a time never
//! runs another time's slot twice or not at all; a removed time's planned
//! slot that has not run is cancelled with a recorded reason and leaves the
//! delayed set; a day that already ran a removed time's slot and gets a new
//! one is reported.

use crate::common::{kind_toml, today, Env};
use chrono::{NaiveDate, NaiveTime};
use slotgate::executor::Handled;
use slotgate::outcome::SlotState;
use slotgate::outcome::{FailReason, Outcome, SkipReason};
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

/// The issue's case: `slots = ["12:00"]` ran, then 09:00 was inserted in
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
        .arg(
            slotgate::queue::KeySpace::new(env.redis.prefix.as_str())
                .part(0)
                .delayed(),
        )
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

/// A kind in Europe/Berlin with a calendar (issue 41).
fn berlin(body: &str) -> String {
    format!(
        "[[kinds]]\nname = \"article\"\ntimezone = \"Europe/Berlin\"\ndaily_cap = 2\nstarting_deadline = \"2h\"\n{body}\n"
    )
}

fn utc(s: &str) -> NaiveTime {
    hm(s)
}

/// A real week in a zone whose clocks go forward on its Sunday
/// (2027-03-28, 02:00 → 03:00 in Berlin): weekdays at 09:00 and 15:00, a
/// Saturday list with its own cap, a Sunday time inside the DST gap, a
/// blacked-out Wednesday planned like any day.
#[tokio::test]
async fn a_calendar_week_plans_weekdays_day_lists_and_blackouts_through_a_dst_change() {
    let cal = berlin(
        r#"slots = ["09:00", "15:00"]
weekdays = ["mon", "tue", "wed", "thu", "fri"]
blackout = ["2027-03-24"]
[[kinds.on]]
days = ["sat"]
slots = ["10:30", "15:00"]
daily_cap = 1
[[kinds.on]]
days = ["sun"]
slots = ["02:30"]
daily_cap = 1"#,
    );
    let mut env = Env::new(&cal).await;
    env.load_numbered(&cal).await;
    let monday = NaiveDate::from_ymd_opt(2027, 3, 22).unwrap();
    let mut week = Vec::new();
    for d in 0..7 {
        let day = monday + chrono::Duration::days(d);
        env.planner().plan_day(Some(day), &[], false).await.unwrap();
        week.push(day_slots(&env, day).await);
    }
    // Before the change Berlin is UTC+1: 09:00 and 15:00 are 08:00Z, 14:00Z.
    let weekday = vec![(utc("08:00"), 1, None), (utc("14:00"), 2, None)];
    for d in [0, 1, 2, 3, 4] {
        assert_eq!(week[d], weekday, "day {d}");
    }
    assert!(
        env.config.kinds[0]
            .day(monday + chrono::Duration::days(2))
            .blackout
    );
    // Saturday: 15:00 is the weekdays' slot 2; 10:30 is a new number.
    assert_eq!(
        week[5],
        vec![(utc("09:30"), 3, None), (utc("14:00"), 2, None)]
    );
    assert_eq!(
        env.config.kinds[0]
            .day(monday + chrono::Duration::days(5))
            .daily_cap,
        1
    );
    // Sunday: 02:30 does not exist that night; it runs at 03:00 CEST (01:00Z).
    assert_eq!(week[6], vec![(utc("01:00"), 4, None)]);
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT count(*) FROM planned_slot").await,
        13
    );
}

/// Calendar edits keep every slot's identity: a Saturday list reuses the
/// weekday time's number, and a weekday dropped from `weekdays` has its
/// planned, unrun slots cancelled (`skipped/unscheduled`) like a removed
/// time, while the other days keep theirs.
#[tokio::test]
async fn a_calendar_edit_rekeys_nothing_and_cancels_a_dropped_days_slots() {
    let before = berlin(
        r#"slots = ["09:00", "15:00"]
weekdays = ["mon", "tue", "wed", "thu", "fri"]"#,
    );
    let mut env = Env::new(&before).await;
    env.load_numbered(&before).await;
    let friday = NaiveDate::from_ymd_opt(2027, 3, 26).unwrap();
    let saturday = friday + chrono::Duration::days(1);
    env.planner()
        .plan_day(Some(friday), &[], false)
        .await
        .unwrap();
    env.planner()
        .plan_day(Some(saturday), &[], false)
        .await
        .unwrap();
    assert_eq!(day_slots(&env, friday).await.len(), 2);
    assert!(day_slots(&env, saturday).await.is_empty());

    let after = berlin(
        r#"slots = ["09:00", "15:00"]
weekdays = ["mon", "tue", "wed", "thu"]
[[kinds.on]]
days = ["sat"]
slots = ["15:00", "10:30"]"#,
    );
    env.load_numbered(&after).await;
    assert_eq!(env.config.kinds[0].slot_numbers, vec![1, 2, 3]);
    let fri = env
        .planner()
        .plan_day(Some(friday), &[], false)
        .await
        .unwrap();
    let mut cancelled: Vec<(String, Fate)> = fri
        .unscheduled
        .iter()
        .map(|u| (u.slot.clone(), u.fate))
        .collect();
    cancelled.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        cancelled,
        vec![
            (format!("article:{friday}:1"), Fate::Cancelled),
            (format!("article:{friday}:2"), Fate::Cancelled),
        ]
    );
    assert_eq!(
        day_slots(&env, friday).await,
        vec![
            (utc("08:00"), 1, Some("skipped".into())),
            (utc("14:00"), 2, Some("skipped".into())),
        ]
    );
    env.planner()
        .plan_day(Some(saturday), &[], false)
        .await
        .unwrap();
    assert_eq!(
        day_slots(&env, saturday).await,
        vec![(utc("09:30"), 3, None), (utc("14:00"), 2, None)]
    );
    let o = env.outcomes().await;
    assert_eq!(o.get("skipped/unscheduled"), Some(&2), "{o:?}");
    assert_eq!(o.len(), 1, "{o:?}");
}

/// Today's weekday as a calendar names it (`"mon"` …).
fn weekday_name(day: NaiveDate) -> String {
    chrono::Datelike::weekday(&day).to_string().to_lowercase()
}

/// What a delivery of a calendar's slot records (any hour: the kind's
/// zone is UTC and its slots are at 00:00 of today, with a 48 h deadline):
/// a blacked-out day's slots are `skipped/blackout` with nothing taken, a
/// weekday the calendar does not run is `failed/unknown_slot`, and a day
/// list's own cap binds.
#[tokio::test]
async fn deliveries_record_blackouts_refuse_off_days_and_keep_a_day_lists_cap() {
    let day = today();
    let blackout = kind_toml(
        "article",
        &["00:00", "00:00"],
        5,
        &format!("blackout = [\"{day}\"]"),
    );
    let mut env = Env::new(&blackout).await;
    env.load_numbered(&blackout).await;
    env.add_drafts("article", 3).await;
    let handled = deliver(&env, day, &[1, 2], 2).await;
    assert_eq!(
        handled,
        vec![
            Handled::Recorded(Outcome::Skipped(SkipReason::Blackout)),
            Handled::Recorded(Outcome::Skipped(SkipReason::SlotTaken)),
            Handled::Recorded(Outcome::Skipped(SkipReason::Blackout)),
            Handled::Recorded(Outcome::Skipped(SkipReason::SlotTaken)),
        ]
    );
    let ready = "SELECT count(*) FROM draft WHERE status = 'ready'";
    assert_eq!(
        testkit::count(&env.db.pool, ready).await,
        3,
        "no draft taken"
    );
    assert_eq!(
        testkit::count(
            &env.db.pool,
            "SELECT coalesce(sum(used), 0)::bigint FROM daily_quota"
        )
        .await,
        0,
        "no cap unit used"
    );

    // Today's weekday is not among `weekdays`, and its own list has one
    // time with a cap of 1 reached by a second listing of it.
    let other = weekday_name(day + chrono::Duration::days(1));
    let off = kind_toml(
        "article",
        &["00:00"],
        5,
        &format!("weekdays = [\"{other}\"]\n[[kinds.on]]\ndays = [\"{}\"]\nslots = [\"00:00\", \"00:00\", \"00:00\"]\ndaily_cap = 1", weekday_name(day)),
    );
    let mut env = Env::new(&off).await;
    env.load_numbered(&off).await;
    env.add_drafts("article", 3).await;
    let handled = deliver(&env, day, &[1, 2, 3], 1).await;
    assert_eq!(
        handled,
        vec![
            Handled::Recorded(Outcome::Published),
            Handled::Recorded(Outcome::Skipped(SkipReason::QuotaFull)),
            Handled::Recorded(Outcome::Skipped(SkipReason::QuotaFull)),
        ],
        "today's list runs all three listings, under its own cap of 1"
    );
    let only_weekdays = kind_toml(
        "article",
        &["00:00"],
        5,
        &format!("weekdays = [\"{other}\"]"),
    );
    let mut env = Env::new(&only_weekdays).await;
    env.load_numbered(&only_weekdays).await;
    env.add_drafts("article", 1).await;
    let handled = deliver(&env, day, &[1], 1).await;
    assert_eq!(
        handled,
        vec![Handled::Recorded(Outcome::Failed(FailReason::UnknownSlot))],
        "a weekday the calendar does not run has no slots"
    );
    assert_eq!(
        testkit::count(&env.db.pool, ready).await,
        1,
        "no draft taken"
    );
}

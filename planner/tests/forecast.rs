//! `planner forecast`: the runway JSON for a calendar with priorities, a
//! `[[kinds.on]]` cap, a blackout, a draft ready later and a pause; the
//! forecast of today against what a worker then records for today's
//! slots; bad `--days` and `--kind` exit 2 naming them.
//!
//! The real `planner` binary against a test database and Redis prefix;
//! slots run on an in-process worker (the library's runtime, as in
//! `cronjob.rs`). Kinds live in a zone where it is about 09:00
//! (`testkit::zone::around_noon`), so nothing depends on the time of day.

use crate::common;
use chrono::{DateTime, Duration as CDuration, NaiveDate, TimeZone, Utc};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::process::Output;
use std::time::Duration;
use testkit::stack::{Bins, Stack};
use testkit::zone::{around_noon, Zone};
use testkit::{count, wait_for};
use tokio_util::sync::CancellationToken;

const PLANNER: &str = env!("CARGO_BIN_EXE_planner");

/// A zone where it is 09:00–09:59 now, and stays the same day for hours.
fn zone() -> Zone {
    around_noon(Utc::now(), Duration::from_secs(6 * 3600))
}

/// A kind in `zone` without jitter; `extra` adds keys (and tables last).
fn kind(zone: &Zone, name: &str, slots: &[String], cap: u32, extra: &str) -> String {
    let slots: Vec<String> = slots.iter().map(|t| format!("{t:?}")).collect();
    format!(
        "[[kinds]]\nname = {name:?}\ntimezone = {:?}\nslots = [{}]\njitter = \"0\"\ndaily_cap = {cap}\nstarting_deadline = \"1h\"\n{extra}\n",
        zone.name(),
        slots.join(", ")
    )
}

/// The instant of local `hh:00` on `day` in `zone`.
fn local(zone: &Zone, day: NaiveDate, hh: u32) -> DateTime<Utc> {
    zone.offset()
        .from_local_datetime(&day.and_hms_opt(hh, 0, 0).unwrap())
        .unwrap()
        .with_timezone(&Utc)
}

async fn stack() -> Stack {
    // The config is written by each test once it knows its times.
    Stack::builder(Bins::beside(PLANNER))
        .tag("forecast")
        .build("")
        .await
}

fn json_of(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

async fn add_draft(stack: &Stack, kind: &str, priority: i32, ready_at: DateTime<Utc>) -> i64 {
    sqlx::query_scalar(
        "INSERT INTO draft (kind, title, status, priority, ready_at) VALUES ($1, 't', 'ready', $2, $3) RETURNING id",
    )
    .bind(kind)
    .bind(priority)
    .bind(ready_at)
    .fetch_one(&stack.db().pool)
    .await
    .unwrap()
}

/// Every table the forecast could write to, counted.
async fn row_counts(stack: &Stack) -> Vec<i64> {
    let mut out = Vec::new();
    for t in [
        "publish_slot",
        "daily_quota",
        "planned_slot",
        "execution",
        "kind_pause",
        "draft",
        "slot_number",
    ] {
        out.push(count(&stack.db().pool, &format!("SELECT count(*) FROM {t}")).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runway_follows_priority_caps_blackout_ready_at_and_pause() {
    let stack = stack().await;
    let zone = zone();
    let d: Vec<NaiveDate> = zone.day(Utc::now()).iter_days().take(5).collect();
    // news: 11:00 and 15:00 every day, but d1 (its weekday) runs three
    // times with a cap of one, and d2 is blacked out. quiet: no drafts,
    // paused until d1 12:00.
    let on_day = d[1].format("%a").to_string().to_lowercase();
    let config = format!(
        "{}{}",
        kind(
            &zone,
            "news",
            &["11:00".into(), "15:00".into()],
            2,
            &format!(
                "blackout = [\"{}\"]\n[[kinds.on]]\ndays = [{on_day:?}]\nslots = [\"11:00\", \"12:00\", \"15:00\"]\ndaily_cap = 1",
                d[2]
            ),
        ),
        kind(&zone, "quiet", &["11:00".into(), "15:00".into()], 2, ""),
    );
    std::fs::write(&stack.config, config).unwrap();
    // Four drafts ready now, one ready at d3 13:00 (for d3's 15:00 only).
    for p in [0, 1, 2, 3] {
        add_draft(&stack, "news", p, Utc::now() - CDuration::hours(1)).await;
    }
    add_draft(&stack, "news", 9, local(&zone, d[3], 13)).await;
    let until = local(&zone, d[1], 12).to_rfc3339();
    stack.planner(&["pause", "--kind", "quiet", "--until", &until]);
    let before = row_counts(&stack).await;

    let got = json_of(
        &stack
            .planner_output(&["forecast", "--days", "5", "--json"], &[])
            .await,
    );
    let day = |i: usize, slots: u32, publish: u32, skipped: Value| json!({"day": d[i].to_string(), "slots": slots, "publish": publish, "skipped": skipped});
    assert_eq!(
        got,
        json!({"kinds": [
            {"kind": "news", "runs_dry_on": d[4].to_string(), "days": [
                day(0, 2, 2, json!({})),
                day(1, 3, 1, json!({"quota_full": 2})),
                day(2, 2, 0, json!({"blackout": 2})),
                day(3, 2, 2, json!({})),
                day(4, 2, 0, json!({"no_ready_draft": 2})),
            ]},
            {"kind": "quiet", "runs_dry_on": d[1].to_string(), "days": [
                day(0, 2, 0, json!({"paused": 2})),
                day(1, 2, 0, json!({"paused": 1, "no_ready_draft": 1})),
                day(2, 2, 0, json!({"no_ready_draft": 2})),
                day(3, 2, 0, json!({"no_ready_draft": 2})),
                day(4, 2, 0, json!({"no_ready_draft": 2})),
            ]},
        ]})
    );
    // One kind, 14 days by default; and the table for people.
    let one = json_of(
        &stack
            .planner_output(&["forecast", "--kind", "quiet", "--json"], &[])
            .await,
    );
    assert_eq!(one["kinds"].as_array().unwrap().len(), 1);
    assert_eq!(one["kinds"][0]["days"].as_array().unwrap().len(), 14);
    let table = stack.planner(&["forecast", "--days", "5"]);
    assert!(
        table.contains(&format!("news: runs dry on {}", d[4])),
        "{table}"
    );
    assert!(table.contains("blackout=2"), "{table}");
    // It only reads.
    assert_eq!(row_counts(&stack).await, before);
}

/// Today's recorded outcomes of `kind`: published (or publishing) slots,
/// and the others by reason.
async fn recorded(stack: &Stack, kind: &str, day: NaiveDate) -> (i64, BTreeMap<String, i64>) {
    let rows: Vec<(String, Option<String>, i64)> = sqlx::query_as(
        "SELECT state, reason, count(*) FROM publish_slot WHERE kind = $1 AND day = $2 GROUP BY 1, 2",
    )
    .bind(kind)
    .bind(day)
    .fetch_all(&stack.db().pool)
    .await
    .unwrap();
    let mut published = 0;
    let mut skipped = BTreeMap::new();
    for (state, reason, n) in rows {
        match state.as_str() {
            "published" | "publishing" | "claimed" => published += n,
            _ => *skipped.entry(reason.unwrap_or(state)).or_insert(0) += n,
        }
    }
    (published, skipped)
}

/// Forecast today, then run today's slots (a compressed day: slots seconds
/// apart) and compare: per kind, the recorded outcomes per reason are the
/// forecast's, with priority, a draft ready between two slots, a cap, a
/// blackout and a pause ending mid-day in play.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn todays_forecast_is_what_the_day_records() {
    let stack = stack().await;
    let zone = zone();
    let t0 = Utc::now();
    let today = zone.day(t0);
    let at = |s: i64| zone.hms(t0 + CDuration::seconds(s));
    // live: cap 3; two drafts ready (the newer one of higher priority) and
    // one ready at +28 s, between the slots at +24 s and +32 s. dark:
    // blacked out today. held: paused until +16 s.
    let config = format!(
        "{}{}{}",
        kind(
            &zone,
            "live",
            &[at(8), at(16), at(24), at(32), at(40)],
            3,
            ""
        ),
        kind(
            &zone,
            "dark",
            &[at(8), at(16)],
            3,
            &format!("blackout = [\"{today}\"]")
        ),
        kind(&zone, "held", &[at(8), at(24)], 3, ""),
    );
    std::fs::write(&stack.config, config).unwrap();
    let old = add_draft(&stack, "live", 0, t0 - CDuration::minutes(10)).await;
    let urgent = add_draft(&stack, "live", 5, t0 - CDuration::minutes(5)).await;
    let later = add_draft(&stack, "live", 9, t0 + CDuration::seconds(28)).await;
    add_draft(&stack, "dark", 0, t0 - CDuration::minutes(10)).await;
    add_draft(&stack, "held", 0, t0 - CDuration::minutes(10)).await;
    let until = (t0 + CDuration::seconds(16)).to_rfc3339();
    stack.planner(&["pause", "--kind", "held", "--until", &until]);
    stack.planner(&["plan"]);

    let f = json_of(
        &stack
            .planner_output(&["forecast", "--days", "1", "--json"], &[])
            .await,
    );
    let forecast: BTreeMap<String, (i64, BTreeMap<String, i64>)> = f["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            let d = &k["days"][0];
            assert_eq!(d["day"], today.to_string());
            let skipped = d["skipped"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(r, n)| (r.clone(), n.as_i64().unwrap()))
                .collect();
            (
                k["kind"].as_str().unwrap().to_owned(),
                (d["publish"].as_i64().unwrap(), skipped),
            )
        })
        .collect();
    let expect = |publish, skipped: &[(&str, i64)]| {
        (
            publish,
            skipped
                .iter()
                .map(|(r, n)| ((*r).to_owned(), *n))
                .collect::<BTreeMap<_, _>>(),
        )
    };
    assert_eq!(
        forecast["live"],
        expect(3, &[("no_ready_draft", 1), ("quota_full", 1)])
    );
    assert_eq!(forecast["dark"], expect(0, &[("blackout", 2)]));
    assert_eq!(forecast["held"], expect(1, &[("paused", 1)]));
    assert_eq!(f["kinds"][0]["runs_dry_on"], today.to_string());

    let cancel = CancellationToken::new();
    let worker = common::start_worker(&stack, &cancel);
    wait_for(
        "today's 9 slots recorded",
        Duration::from_secs(90),
        || async {
            let n = count(
            &stack.db().pool,
            "SELECT count(*) FROM publish_slot WHERE state IN ('published', 'skipped', 'failed')",
        )
        .await;
            (n == 9).then_some(())
        },
    )
    .await;
    cancel.cancel();
    worker.await.unwrap();
    for kind in ["live", "dark", "held"] {
        assert_eq!(
            recorded(&stack, kind, today).await,
            forecast[kind],
            "{kind}: recorded vs forecast"
        );
    }
    // The pick the forecast simulated: priority first, then the draft
    // that became ready between the third and fourth slots.
    let bound: Vec<(i32, Option<i64>)> =
        sqlx::query_as("SELECT slot, post_id FROM publish_slot WHERE kind = 'live' ORDER BY slot")
            .fetch_all(&stack.db().pool)
            .await
            .unwrap();
    assert_eq!(
        bound,
        [
            (1, Some(urgent)),
            (2, Some(old)),
            (3, None),
            (4, Some(later)),
            (5, None)
        ]
    );
}

/// `--days` outside 1..=366 and an unknown `--kind` exit 2, naming them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_days_and_unknown_kinds_exit_2_naming_them() {
    let stack = stack().await;
    let zone = zone();
    std::fs::write(&stack.config, kind(&zone, "news", &["11:00".into()], 1, "")).unwrap();
    for (args, names) in [
        (vec!["forecast", "--days", "0"], "--days"),
        (vec!["forecast", "--days", "367"], "--days"),
        (vec!["forecast", "--days", "soon"], "--days"),
        (vec!["forecast", "--kind", "nope"], "\"nope\""),
        (
            vec!["forecast", "--kind", "news", "--kind", "nope", "--json"],
            "\"nope\"",
        ),
    ] {
        let out = stack.planner_output(&args, &[]).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(names), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
    let out = stack
        .planner_output(&["forecast", "--days", "366", "--json"], &[])
        .await;
    assert_eq!(
        json_of(&out)["kinds"][0]["days"].as_array().unwrap().len(),
        366
    );
}

/// `planner run` exports each planned kind's runway after its round:
/// `slotgate_runway_days{kind}`, days until the first day a slot finds no
/// ready draft, 14 when the drafts last the forecast; a `--skip-kind`
/// kind has none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planner_run_exports_each_kinds_runway() {
    let stack = stack().await;
    let zone = zone();
    let config = format!(
        "{}{}{}",
        kind(&zone, "news", &["11:00".into(), "15:00".into()], 2, ""),
        kind(&zone, "daily", &["11:00".into()], 1, ""),
        kind(&zone, "cronjob", &["11:00".into()], 1, ""),
    );
    std::fs::write(&stack.config, config).unwrap();
    // news: today's two slots and tomorrow's first; daily: 20 days' worth.
    for _ in 0..3 {
        add_draft(&stack, "news", 0, Utc::now() - CDuration::hours(1)).await;
    }
    for _ in 0..20 {
        add_draft(&stack, "daily", 0, Utc::now() - CDuration::hours(1)).await;
    }
    let addr = format!("127.0.0.1:{}", testkit::server::pick_port());
    let mut run = stack.planner_proc(
        "planner-run",
        &["run", "--metrics-addr", &addr, "--skip-kind", "cronjob"],
        &[],
    );
    let body = wait_for("the runway gauges", Duration::from_secs(30), || {
        let addr = addr.clone();
        async move {
            let (_, body) = testkit::http_get(&addr, "/metrics").await.ok()?;
            (body.contains(r#"slotgate_runway_days{kind="news"} 1"#)
                && body.contains(r#"slotgate_runway_days{kind="daily"} 14"#))
            .then_some(body)
        }
    })
    .await;
    assert!(!body.contains(r#"kind="cronjob""#), "{body}");
    run.terminate(Duration::from_secs(10));
}

//! Operator verbs against real Postgres and Redis: pause/resume, skip, and
//! dead-letter replay and purge.

use crate::common::{kind_toml, today, Env, T};
use slotgate::operator::OperatorError;
use slotgate::outcome::SlotState;
use slotgate::outcome::{Reason, SkipReason};
use slotgate::queue::Delivery;
use slotgate::slot::SlotKey;

fn key(kind: &str, slot: u32) -> SlotKey {
    format!("{kind}:{}:{slot}", today()).parse().unwrap()
}

/// Delivers `k` (caller planner) and handles everything waiting, as `w1`.
async fn deliver(env: &Env, exec: &slotgate::executor::Executor, k: &SlotKey) {
    env.xadd(&[("slot", &k.to_string()), ("caller", "planner")])
        .await;
    for d in env.read_all("w1").await {
        exec.handle(&d).await.unwrap();
    }
}

async fn gate_row(env: &Env, k: &SlotKey) -> Option<(String, Option<String>)> {
    sqlx::query_as(
        "SELECT state, reason FROM publish_slot WHERE kind = $1 AND day = $2 AND slot = $3",
    )
    .bind(&k.kind)
    .bind(k.day)
    .bind(k.slot_no as i32)
    .fetch_optional(&env.db.pool)
    .await
    .unwrap()
}

async fn exemption_requests(env: &Env) -> i64 {
    testkit::count(&env.db.pool, "SELECT count(*) FROM exemption_request").await
}

/// Stores `k`'s plan, as `planner plan` does (not enqueued).
async fn plan(env: &Env, p: &slotgate::plan::Planner, k: &SlotKey) {
    let planned = p.slot(&k.kind, k.day, k.slot_no).unwrap();
    let mut conn = env.db.pool.acquire().await.unwrap();
    slotgate::store::insert_planned(&mut conn, &[planned], "plan")
        .await
        .unwrap();
}

async fn executions_of(env: &Env, k: &SlotKey) -> Vec<(String, Option<String>, String)> {
    sqlx::query_as("SELECT outcome, reason, caller FROM execution WHERE slot_key = $1 ORDER BY id")
        .bind(k.to_string())
        .fetch_all(&env.db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_kind_records_its_slots_paused_for_good_and_runs_again_after_resume() {
    let env = Env::new(&format!(
        "{}{}",
        kind_toml(
            "article",
            &["00:00", "00:00:01", "00:00:02", "00:00:03"],
            10,
            ""
        ),
        kind_toml("note", &["00:00"], 10, "")
    ))
    .await;
    env.add_drafts("article", 4).await;
    env.add_drafts("note", 1).await;
    let p = env.planner();
    p.pause("article", None, "CMS migration").await.unwrap();
    let paused = slotgate::store::paused_kinds(&env.db.pool, chrono::Utc::now())
        .await
        .unwrap();
    assert_eq!(paused.len(), 1);
    assert_eq!(
        (paused[0].kind.as_str(), paused[0].note.as_str()),
        ("article", "CMS migration")
    );
    // Three deliveries of the paused kind and one of another kind, through
    // the batch path first (as a worker reading a backlog does): it decides
    // only the other kind's slot and leaves the paused ones to `handle`.
    for s in 1..=3 {
        env.xadd(&[
            ("slot", &key("article", s).to_string()),
            ("caller", "planner"),
        ])
        .await;
    }
    env.xadd(&[("slot", &key("note", 1).to_string()), ("caller", "planner")])
        .await;
    // The batch decides only planned slots: plan the day (not enqueued).
    let mut conn = env.db.pool.acquire().await.unwrap();
    for k in &env.config.kinds {
        let slots = slotgate::slot::day_schedule(k, today(), &env.config.jitter_seed);
        slotgate::store::insert_planned(&mut conn, &slots, "plan")
            .await
            .unwrap();
    }
    drop(conn);
    let exec = env.executor("w0");
    let ds = env.read_all("w0").await;
    assert_eq!(ds.len(), 4);
    assert!(ds.iter().all(|d| exec.batchable(d)));
    let decided = exec.batch(&ds).await.unwrap();
    assert_eq!(decided, vec![3], "only the unpaused kind's slot is batched");
    for (i, d) in ds.iter().enumerate() {
        if !decided.contains(&i) {
            exec.handle(d).await.unwrap();
        }
    }
    assert_eq!(env.executions().await, 4);
    for s in 1..=3 {
        assert_eq!(
            gate_row(&env, &key("article", s)).await,
            Some(("skipped".into(), Some("paused".into()))),
            "slot {s}"
        );
    }
    assert_eq!(
        gate_row(&env, &key("note", 1)).await,
        Some(("published".into(), None))
    );
    let report = slotgate::report::build(
        &env.db.pool,
        &env.config,
        &env.clock,
        Some(today()),
        &["article".into()],
    )
    .await
    .unwrap();
    assert_eq!(report.totals["skipped"]["paused"], 3);
    let status = slotgate::report::full_status(&env.queue, &env.db.pool, &env.clock)
        .await
        .unwrap();
    assert_eq!(status.paused.len(), 1);

    // Resume: a paused slot stays paused (final); a new slot runs.
    assert!(p.resume("article").await.unwrap());
    let w = env.start_workers(1, |_| {});
    assert!(!p.resume("article").await.unwrap());
    env.xadd(&[
        ("slot", &key("article", 1).to_string()),
        ("caller", "planner"),
    ])
    .await;
    env.xadd(&[
        ("slot", &key("article", 4).to_string()),
        ("caller", "planner"),
    ])
    .await;
    env.wait_executions(6, T).await;
    w.stop().await;
    assert_eq!(
        gate_row(&env, &key("article", 4)).await,
        Some(("published".into(), None))
    );
    assert_eq!(
        executions_of(&env, &key("article", 1)).await,
        vec![
            ("skipped".into(), Some("paused".into()), "planner".into()),
            (
                "skipped".into(),
                Some("slot_taken".into()),
                "planner".into()
            ),
        ]
    );
    // Unknown kinds and past ends are refused.
    assert!(matches!(
        p.pause("nope", None, "").await,
        Err(OperatorError::Plan(_))
    ));
    assert!(matches!(
        p.pause(
            "article",
            Some(chrono::Utc::now() - chrono::Duration::minutes(1)),
            ""
        )
        .await,
        Err(OperatorError::UntilPast(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_with_an_end_lapses_by_itself() {
    let env = Env::new(&kind_toml("article", &["00:00", "00:00:01"], 10, "")).await;
    env.add_drafts("article", 2).await;
    let p = env.planner();
    let until = chrono::Utc::now() + chrono::Duration::milliseconds(1500);
    p.pause("article", Some(until), "").await.unwrap();
    let exec = env.executor("w1");
    deliver(&env, &exec, &key("article", 1)).await;
    assert_eq!(
        gate_row(&env, &key("article", 1)).await,
        Some(("skipped".into(), Some("paused".into())))
    );
    testkit::wait_for("the pause to lapse", T, || async {
        slotgate::store::paused_kinds(&env.db.pool, chrono::Utc::now())
            .await
            .unwrap()
            .is_empty()
            .then_some(())
    })
    .await;
    deliver(&env, &exec, &key("article", 2)).await;
    assert_eq!(
        gate_row(&env, &key("article", 2)).await,
        Some(("published".into(), None))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_slot_never_runs_and_a_gated_slot_cannot_be_skipped() {
    let env = Env::new(&kind_toml("article", &["00:00", "00:00:01"], 10, "")).await;
    env.add_drafts("article", 2).await;
    let p = env.planner();
    let k = key("article", 1);
    p.skip(&k, "holiday").await.unwrap();
    assert_eq!(
        gate_row(&env, &k).await,
        Some(("skipped".into(), Some("operator".into())))
    );
    let detail: serde_json::Value =
        sqlx::query_scalar("SELECT detail FROM execution WHERE slot_key = $1")
            .bind(k.to_string())
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(detail["note"], "holiday");
    // A second skip is refused and changes nothing.
    let again = p.skip(&k, "again").await;
    assert!(
        matches!(&again, Err(OperatorError::AlreadyGated { state, reason, .. })
            if *state == Some(SlotState::Skipped) && *reason == Some(Reason::Skipped(SkipReason::Operator))),
        "{again:?}"
    );
    // A later delivery meets the gate row: slot_taken.
    let exec = env.executor("w1");
    deliver(&env, &exec, &k).await;
    assert_eq!(
        executions_of(&env, &k).await,
        vec![
            ("skipped".into(), Some("operator".into()), "manual".into()),
            (
                "skipped".into(),
                Some("slot_taken".into()),
                "planner".into()
            ),
        ]
    );
    // Drafts untouched: the skipped slot took none.
    assert_eq!(
        testkit::count(
            &env.db.pool,
            "SELECT count(*) FROM draft WHERE status = 'ready'"
        )
        .await,
        2
    );
    // A published slot cannot be skipped either.
    let k2 = key("article", 2);
    deliver(&env, &exec, &k2).await;
    assert!(matches!(
        p.skip(&k2, "").await,
        Err(OperatorError::AlreadyGated {
            state: Some(SlotState::Published),
            ..
        })
    ));
    // A slot outside the config is refused.
    assert!(p.skip(&key("article", 3), "").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_letter_is_listed_replayed_with_caller_manual_and_purged() {
    let env = Env::new(&kind_toml("article", &["00:00"], 10, "")).await;
    env.add_drafts("article", 1).await;
    let p = env.planner();
    let exec = env.executor("w1");
    let k = key("article", 1);
    // A valid slot that was handed out too often is dead-lettered...
    let mut poisoned = Delivery::synthetic("1-1".into(), &k.to_string(), "planner");
    poisoned.deliveries = slotgate::executor::MAX_DELIVERIES + 1;
    // An old dead letter, as redis-cli could leave one (for the purge).
    let mut c = env.redis.conn().await;
    let _: String = redis::cmd("XADD")
        .arg(
            slotgate::queue::KeySpace::new(env.redis.prefix.as_str())
                .part(0)
                .dead(),
        )
        .arg("1000-0")
        .arg("slot")
        .arg("old")
        .arg("reason")
        .arg("bad_message")
        .query_async(&mut c)
        .await
        .unwrap();
    env.queue.ensure_group().await.unwrap();
    exec.handle(&poisoned).await.unwrap();
    // ... and so is garbage a stranger sent.
    env.xadd(&[("slot", "not a slot"), ("caller", "stranger")])
        .await;
    for d in env.read_all("w1").await {
        exec.handle(&d).await.unwrap();
    }
    let dead = p.dead_letters(10).await.unwrap();
    assert_eq!(dead.len(), 3);
    assert_eq!(dead[2].slot.as_deref(), Some("old"));
    // Newest first.
    assert_eq!(dead[0].slot.as_deref(), Some("not a slot"));
    assert_eq!(dead[0].reason.as_deref(), Some("bad_message"));
    assert_eq!(dead[1].slot.as_deref(), Some(k.to_string().as_str()));
    assert_eq!(dead[1].entry_id.as_deref(), Some("1-1"));
    assert_eq!(dead[1].reason.as_deref(), Some("max_deliveries"));
    assert!(dead[1].at.is_some());
    // Garbage cannot be replayed.
    for force in [false, true] {
        assert!(matches!(
            p.replay_dead(&dead[0].id, force).await,
            Err(OperatorError::NotReplayable { .. })
        ));
        assert!(matches!(
            p.replay_dead("9-9", force).await,
            Err(OperatorError::NoSuchDeadLetter(_))
        ));
    }
    // The slot is within its deadline but was never planned in Postgres:
    // only Redis says it should run, so the replay is refused and nothing
    // changes (the dead letter stays, no request is written).
    assert!(!dead[1].planned && !dead[1].past_deadline);
    assert!(dead[1].due_at.is_some() && dead[1].deadline > dead[1].due_at);
    assert!(dead[0].due_at.is_none() && dead[0].deadline.is_none());
    assert!(matches!(
        p.replay_dead("1-1", false).await,
        Err(OperatorError::ReplayNotPlanned { .. })
    ));
    assert_eq!(exemption_requests(&env).await, 0);
    assert_eq!(p.dead_letters(10).await.unwrap().len(), 3);
    // Planned, as the planner does every day: now it is a routine replay.
    plan(&env, &p, &k).await;
    assert!(p.dead_letters(10).await.unwrap()[1].planned);
    // Replay by the original entry id: re-delivered with caller manual.
    let (replayed, _entry) = p.replay_dead("1-1", false).await.unwrap();
    assert_eq!(exemption_requests(&env).await, 1);
    assert_eq!(replayed.id, dead[1].id);
    assert_eq!(p.dead_letters(10).await.unwrap().len(), 2);
    for d in env.read_all("w1").await {
        assert_eq!(d.caller(), "manual");
        exec.handle(&d).await.unwrap();
    }
    assert_eq!(
        executions_of(&env, &k).await.last().cloned(),
        Some(("published".into(), None, "manual".into()))
    );
    // Purge: the old dead letter goes, the fresh one stays.
    let n = p
        .purge_dead(std::time::Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(n, 1);
    let left = p.dead_letters(10).await.unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].slot.as_deref(), Some("not a slot"));
}

/// Issue 39 (security review): a dead letter is Redis data, and `dead
/// replay` gives its slot an operator's exemption in Postgres before
/// delivering it. A dead letter forged with `redis-cli XADD P:dead` for a
/// slot of 2019 was replayed by a routine `dead replay`: a request row, and
/// the 2019 slot published. Without `--force` it is now refused — past its
/// due time + `starting_deadline` by Postgres's clock, planned or not —
/// with nothing requested, delivered or published and the dead letter
/// kept; `dead list` shows why (due time, deadline, planned). With
/// `--force` (the operator's word) it runs as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_dead_letter_of_a_slot_past_its_deadline_is_replayed_only_with_force() {
    use chrono::TimeZone;
    let env = Env::new(&kind_toml("article", &["09:00"], 10, "")).await;
    env.add_drafts("article", 1).await;
    let p = env.planner();
    let exec = env.executor("w1");
    let old: SlotKey = "article:2019-06-01:1".parse().unwrap();
    let mut c = env.redis.conn().await;
    let id: String = redis::cmd("XADD")
        .arg(
            slotgate::queue::KeySpace::new(env.redis.prefix.as_str())
                .part(0)
                .dead(),
        )
        .arg("*")
        .arg("slot")
        .arg(old.to_string())
        .arg("caller")
        .arg("planner")
        .arg("reason")
        .arg("unknown_kind")
        .arg("entry_id")
        .arg("1559379600000-0")
        .query_async(&mut c)
        .await
        .unwrap();
    let due = chrono::Utc.with_ymd_and_hms(2019, 6, 1, 9, 0, 0).unwrap();
    let deadline = due + chrono::Duration::hours(48);
    let listed = p.dead_letters(10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].due_at, Some(due));
    assert_eq!(listed[0].deadline, Some(deadline));
    assert!(!listed[0].planned && listed[0].past_deadline);
    // Refused, by the dead letter's id and by its entry id; and still so
    // once the old slot has a plan in Postgres.
    for planned in [false, true] {
        if planned {
            plan(&env, &p, &old).await;
            assert!(p.dead_letters(10).await.unwrap()[0].planned);
        }
        for name in [id.as_str(), "1559379600000-0"] {
            match p.replay_dead(name, false).await {
                Err(e @ OperatorError::ReplayPastDeadline { .. }) => {
                    assert!(e.is_replay_refusal());
                    let text = e.to_string();
                    assert!(
                        text.contains(&format!("`planner dead replay --force {id}` replays it")),
                        "{text}"
                    );
                    let OperatorError::ReplayPastDeadline {
                        key,
                        due_at,
                        deadline: d,
                        ..
                    } = e
                    else {
                        unreachable!()
                    };
                    assert_eq!((key, due_at, d), (old.to_string(), due, deadline));
                }
                other => panic!("replay of {name} (planned: {planned}): {other:?}"),
            }
        }
    }
    // Nothing changed: no request row, nothing on the stream, nothing
    // recorded, the dead letter kept.
    assert_eq!(exemption_requests(&env).await, 0);
    assert!(env.read_all("w1").await.is_empty());
    assert_eq!(env.executions().await, 0);
    assert_eq!(p.dead_letters(10).await.unwrap().len(), 1);
    // `--force`: the operator's word, as before — the request row, a
    // delivery with caller manual, and the old slot published.
    let (replayed, _entry) = p.replay_dead(&id, true).await.unwrap();
    assert_eq!(replayed.id, id);
    let by: Vec<(String, String)> =
        sqlx::query_as("SELECT caller, requested_by FROM exemption_request")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(
        by,
        vec![("manual".into(), "planner dead replay --force".into())]
    );
    let ds = env.read_all("w1").await;
    assert_eq!(ds.len(), 1);
    for d in ds {
        assert_eq!(d.caller(), "manual");
        exec.handle(&d).await.unwrap();
    }
    assert_eq!(
        executions_of(&env, &old).await,
        vec![("published".into(), None, "manual".into())]
    );
    assert!(p.dead_letters(10).await.unwrap().is_empty());
}

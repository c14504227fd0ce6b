//! `planner run` when Postgres goes silent: its connection runs through a
//! TCP proxy the test freezes (connections accepted, nothing forwarded —
//! no error, no reset, no answer), so no server-side timeout can help. Each
//! round's client-side deadline must fire, be logged as an error, and turn
//! `/healthz` unhealthy; once the proxy thaws, rounds succeed and `/healthz`
//! is healthy again.

use std::process::Command;
use std::time::Duration;
use testkit::proxy::Proxy;
use testkit::stack::{Bins, Stack};
use testkit::{wait_for, TestDb};

/// Generous deadlines of the polls (the health bound under test is 5 s).
const T: Duration = Duration::from_secs(60);

const CONFIG: &str = r#"
[[kinds]]
name = "article"
timezone = "UTC"
slots = ["06:00", "12:00", "18:00"]
jitter = "10m"
daily_cap = 3
starting_deadline = "2h"
"#;

/// A test's own database behind a freezable proxy, and a stack (Redis
/// prefix, `CONFIG`, a directory) whose processes reach the database only
/// through the proxy: (db, proxy, stack).
async fn behind_a_proxy(tag: &str) -> (TestDb, Proxy, Stack) {
    let db = TestDb::new().await;
    let (proxy, url) = Proxy::for_url(&db.url).await.unwrap();
    let stack = Stack::builder(Bins::beside(env!("CARGO_BIN_EXE_planner")))
        .tag(tag)
        .database_url(url)
        .build(CONFIG)
        .await;
    (db, proxy, stack)
}

async fn healthz(addr: &str) -> (u16, String) {
    testkit::http_get(addr, "/healthz")
        .await
        .unwrap_or((0, String::new()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_postgres_link_makes_run_unhealthy_until_it_thaws() {
    let (db, proxy, stack) = behind_a_proxy("deadlines").await;
    let metrics = format!("127.0.0.1:{}", testkit::server::pick_port());
    // Bound of /healthz: 3 x 1 s + 2 s = 5 s.
    let mut run = stack.planner_proc(
        "run",
        &[
            "run",
            "--every",
            "1s",
            "--round-deadline",
            "2s",
            "--metrics-addr",
            &metrics,
        ],
        &[],
    );

    // A round succeeded (its slots are in Postgres, through the proxy) and
    // the planner says it is healthy.
    wait_for("a successful round and /healthz 200", T, || async {
        let planned = testkit::count(&db.pool, "SELECT count(*) FROM planned_slot").await;
        (planned > 0 && healthz(&metrics).await.0 == 200).then_some(())
    })
    .await;
    assert!(
        proxy.accepted() > 0,
        "the planner connects through the proxy"
    );

    proxy.freeze();
    let (status, body) = wait_for("/healthz to turn unhealthy", T, || async {
        let (status, body) = healthz(&metrics).await;
        (status != 200 && status != 0).then_some((status, body))
    })
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("no planning round has succeeded"),
        "the body says why: {body}"
    );
    wait_for("the log to name the missed deadline", T, || async {
        let log = run.log_text();
        (log.contains("ERROR") && log.contains("missed its deadline of 2s")).then_some(())
    })
    .await;
    assert!(
        body.contains("missed its deadline"),
        "the body names the last error: {body}"
    );
    assert!(run.exited().is_none(), "still running: {}", run.log_text());

    proxy.thaw();
    wait_for("/healthz to be healthy again", T, || async {
        (healthz(&metrics).await.0 == 200).then_some(())
    })
    .await;

    let status = run
        .terminate(Duration::from_secs(10))
        .expect("exits on SIGTERM");
    assert!(status.success(), "exit {status:?}: {}", run.log_text());
}

#[test]
fn a_round_deadline_out_of_bounds_is_refused() {
    for bad in ["0s", "500ms", "2h", "soon"] {
        let out = Command::new(env!("CARGO_BIN_EXE_planner"))
            .args(["run", "--round-deadline", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--round-deadline {bad}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("--round-deadline"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A one-shot command through a frozen link stops at its `--deadline`,
/// exits 1 and says why; before, `planner plan` waited for as long as the
/// link stayed silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_shot_command_through_a_frozen_link_stops_at_its_deadline() {
    let (_db, proxy, stack) = behind_a_proxy("deadline").await;
    // The pool's own wait for a connection is longer than the deadline
    // under test, so only the deadline can end the frozen command.
    let args = [
        "plan",
        "--day",
        "2030-03-01",
        "--deadline",
        "2s",
        "--pg-acquire-timeout",
        "60s",
    ];
    // Through a live link it plans.
    let out = stack.planner_output(&args, &[]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        proxy.accepted() > 0,
        "the planner connects through the proxy"
    );

    proxy.freeze();
    let mut plan = stack.planner_proc("plan", &args, &[]);
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = plan.exited() {
            break status;
        }
        assert!(started.elapsed() < T, "still running after {T:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(1), "{}", plan.log_text());
    let log = plan.log_text();
    assert!(
        log.contains("planner plan: no answer within --deadline 2s"),
        "the error names the deadline: {log}"
    );
    proxy.thaw();
}

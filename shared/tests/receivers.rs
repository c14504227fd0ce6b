//! The webhook receiver's `probe_url` and the IndexNow push, against a real
//! local HTTP server that counts what a CMS ignoring idempotency keys would
//! have applied (`Cms::effects`).

use crate::common::{kind_toml, today, Env, T};
use serde_json::Value;
use slotgate::executor::Handled;
use slotgate::outcome::Outcome;
use slotgate::retry::RetryPolicy;
use std::sync::Arc;
use std::time::Duration;
use testkit::cms::{Cms, Reply};

async fn env_with(cms: &Cms, extra: &str) -> Env {
    let urls = format!(
        "publish_url = \"{}\"\nhttp_timeout = \"2s\"\n{extra}",
        cms.url("/publish"),
    );
    let env = Env::new(&kind_toml("article", &["00:00"], 5, &urls)).await;
    env.add_drafts("article", 1).await;
    env
}

/// Delivers today's slot 1 and runs one worker until it has an outcome.
async fn run_first_slot(env: &Env) {
    let key = format!("article:{}:1", today());
    env.xadd(&[("slot", &key), ("caller", "planner")]).await;
    let w = env.start_workers(1, |_| {});
    env.wait_executions(1, T).await;
    w.stop().await;
}

async fn execution(env: &Env) -> (String, Option<String>, Value) {
    sqlx::query_as("SELECT outcome, reason, detail FROM execution LIMIT 1")
        .fetch_one(&env.db.pool)
        .await
        .unwrap()
}

/// What `probe_url` is for: without it, a publish applied with its answer
/// lost is sent again, and a CMS that ignores the key applies it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_probe_url_a_lost_answer_is_sent_again() {
    let cms = Cms::start().await;
    let env = env_with(&cms, "").await;
    cms.script("/publish", [Reply::AppliedThenReset]);
    run_first_slot(&env).await;
    assert_eq!(env.outcomes().await.get("published"), Some(&1));
    assert_eq!(
        cms.effects("/publish"),
        2,
        "the fault happened and the re-send went out: {:?}",
        cms.calls()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_url_finds_a_lost_answer_applied_and_sends_nothing_more() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &format!("probe_url = \"{}\"", cms.url("/probe"))).await;
    cms.script("/publish", [Reply::AppliedThenReset]);
    run_first_slot(&env).await;
    let (outcome, _, detail) = execution(&env).await;
    assert_eq!(outcome, "published");
    assert_eq!(detail["found_applied"], true, "{detail}");
    assert_eq!(detail["url"], "https://cms.test/1", "{detail}");
    assert_eq!(cms.effects("/publish"), 1, "{:?}", cms.calls());
    // One look before the first send (the test's Postgres has no
    // synchronous standby: DESIGN 4.20), one after the lost answer.
    let probes = cms.slot_calls_to("/probe");
    assert_eq!(probes.len(), 2);
    for p in &probes {
        assert_eq!(
            p.key.as_deref(),
            Some(format!("article:{}:1", today()).as_str()),
            "the probe carries the publish's idempotency key"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_answering_404_lets_the_resend_go() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &format!("probe_url = \"{}\"", cms.url("/probe"))).await;
    // A 503 may have been applied: probed first; nothing was, so it is sent.
    cms.script("/publish", [Reply::Status(503)]);
    run_first_slot(&env).await;
    let (outcome, _, detail) = execution(&env).await;
    assert_eq!(outcome, "published");
    assert!(detail.get("found_applied").is_none(), "{detail}");
    // The look before the first send, and the one after the 503.
    assert_eq!(cms.slot_calls_to("/probe").len(), 2);
    assert_eq!(cms.calls_to("/publish").len(), 2);
    assert_eq!(cms.effects("/publish"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_without_a_clear_answer_is_retried_and_nothing_is_sent_meanwhile() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &format!("probe_url = \"{}\"", cms.url("/probe"))).await;
    cms.script("/publish", [Reply::AppliedThenReset]);
    // 404 to the look before the first send (no synchronous standby:
    // DESIGN 4.20); then, after the lost answer, one unclear answer. The
    // look counts as an attempt, so one unclear answer fits the test's 4.
    cms.script("/probe", [Reply::Status(404), Reply::Status(503)]);
    run_first_slot(&env).await;
    let (outcome, _, detail) = execution(&env).await;
    assert_eq!(outcome, "published", "{detail}");
    assert_eq!(detail["found_applied"], true, "{detail}");
    assert_eq!(cms.slot_calls_to("/probe").len(), 3);
    assert_eq!(cms.calls_to("/publish").len(), 1, "no send while unknown");
    assert_eq!(cms.effects("/publish"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_that_never_answers_clearly_fails_the_slot_without_a_resend() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &format!("probe_url = \"{}\"", cms.url("/probe"))).await;
    cms.script("/publish", [Reply::AppliedThenReset]);
    // 404 to the look before the first send, then never a clear answer.
    cms.script(
        "/probe",
        std::iter::once(Reply::Status(404)).chain((0..10).map(|_| Reply::Status(503))),
    );
    run_first_slot(&env).await;
    let (outcome, reason, detail) = execution(&env).await;
    assert_eq!(
        (outcome.as_str(), reason.as_deref()),
        ("failed", Some("publish_error"))
    );
    assert!(
        detail["publish_error"]["error"]
            .as_str()
            .unwrap()
            .starts_with("probe"),
        "{detail}"
    );
    assert_eq!(cms.calls_to("/publish").len(), 1);
}

const INDEXNOW_KEY: &str = "0123456789abcdef";

fn indexnow(cms: &Cms, host: &str) -> String {
    std::env::set_var("TEST_INDEXNOW_KEY", INDEXNOW_KEY);
    format!(
        "[kinds.indexnow]\nendpoint = \"{}\"\nkey_env = \"TEST_INDEXNOW_KEY\"\nhost = \"{host}\"\n",
        cms.url("/indexnow")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexnow_gets_the_protocols_request_after_a_publish() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &indexnow(&cms, "cms.test")).await;
    cms.script("/indexnow", [Reply::Status(202)]);
    run_first_slot(&env).await;
    let (outcome, _, detail) = execution(&env).await;
    assert_eq!(outcome, "published");
    assert!(detail.get("index_error").is_none(), "{detail}");
    let reqs: Vec<_> = cms
        .requests()
        .into_iter()
        .filter(|r| r.path == "/indexnow")
        .collect();
    assert_eq!(reqs.len(), 1);
    assert_eq!(
        reqs[0].header("content-type"),
        Some("application/json; charset=utf-8")
    );
    let body: Value = serde_json::from_slice(&reqs[0].raw).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"host": "cms.test", "key": INDEXNOW_KEY, "urlList": ["https://cms.test/1"]})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indexnow_refusal_is_an_index_error_and_the_slot_stays_published() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &indexnow(&cms, "cms.test")).await;
    cms.script("/indexnow", [Reply::Status(403)]);
    run_first_slot(&env).await;
    let (outcome, _, detail) = execution(&env).await;
    assert_eq!(outcome, "published");
    assert_eq!(detail["index_error"]["status"], 403, "{detail}");
    assert_eq!(cms.calls_to("/indexnow").len(), 1, "a 403 is not retried");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_of_another_host_is_not_pushed() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &indexnow(&cms, "blog.example.com")).await;
    run_first_slot(&env).await;
    let (outcome, _, detail) = execution(&env).await;
    assert_eq!(outcome, "published");
    assert_eq!(detail["index_error"]["indexnow"], "not sent", "{detail}");
    assert!(cms.calls_to("/indexnow").is_empty());
    // The key is never in what is recorded.
    assert!(!detail.to_string().contains(INDEXNOW_KEY));
}

/// A kind publishing to `cms` with `probe_url`, each try limited to
/// `timeout`, and retry settings `retry` (TOML lines); one draft.
async fn probe_env(cms: &Cms, timeout: &str, retry: &str) -> Env {
    let urls = format!(
        "publish_url = \"{}\"\nprobe_url = \"{}\"\nhttp_timeout = \"{timeout}\"\n{retry}",
        cms.url("/publish"),
        cms.url("/probe"),
    );
    let env = Env::new(&kind_toml("article", &["00:00"], 5, &urls)).await;
    env.add_drafts("article", 1).await;
    env
}

/// Enough probing to outlast a CMS that applies 2.5 s after receipt: up to
/// 20 attempts, backoff from 250 ms capped at 1 s.
const PATIENT: RetryPolicy = RetryPolicy {
    max_attempts: 20,
    base: Duration::from_millis(250),
    cap: Duration::from_secs(1),
};

/// The same as TOML lines of the kind, for an executor that uses the
/// kind's own policy.
const PATIENT_TOML: &str = "http_attempts = 20\nretry_base = \"250ms\"\nretry_cap = \"1s\"";

/// Waits until the CMS has finished every call (a held POST applied).
async fn settled(cms: &Cms) {
    testkit::wait_for("the CMS to finish every call", T, || async {
        (cms.in_flight() == 0).then_some(())
    })
    .await;
}

/// Issue 38: a POST that waits at the CMS past the client's timeout, at a
/// CMS that follows the probe contract (record the key on receipt, answer
/// the probe 409 until applied). The probe after the timeout sees the key
/// in progress; slotgate probes again, never sends, and records the publish
/// once it is applied. (Against a CMS that answers 404 until the write is
/// saved — what the contract forbids — the re-send goes and applies twice.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_queued_past_the_timeout_at_a_contract_cms_applies_once() {
    let cms = Cms::start().await;
    cms.follow_probe_contract(Duration::from_millis(2500));
    let env = probe_env(&cms, "1s", "").await;
    let key = format!("article:{}:1", today());
    env.xadd(&[("slot", &key), ("caller", "planner")]).await;
    let w = env.start_workers(1, |o| o.retry_override = Some(PATIENT));
    env.wait_executions(1, T).await;
    w.stop().await;
    settled(&cms).await;
    let (outcome, _, detail) = execution(&env).await;
    assert_eq!(outcome, "published", "{detail}");
    assert_eq!(detail["found_applied"], true, "{detail}");
    assert_eq!(detail["url"], "https://cms.test/1", "{detail}");
    assert_eq!(env.executions().await, 1);
    let probes: Vec<Option<u16>> = cms
        .slot_calls_to("/probe")
        .iter()
        .map(|c| c.status)
        .collect();
    assert!(
        probes.contains(&Some(409)),
        "the write was in progress when probed: {probes:?}"
    );
    assert_eq!(cms.calls_to("/publish").len(), 1, "{:?}", cms.calls());
    assert_eq!(cms.effects("/publish"), 1, "applied once");
    let state: String = sqlx::query_scalar("SELECT state FROM publish_slot")
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(state, "published");
}

/// Issue 38: the same write, with a takeover instead of a timeout: worker A
/// is cut off after its POST reached the CMS, its claim lapses, worker B
/// resumes the slot and probes while A's write is still being applied. B
/// sees 409, waits it out, and finds the publish applied: one effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_still_applying_at_a_takeover_is_found_not_sent_again() {
    let cms = Cms::start().await;
    cms.follow_probe_contract(Duration::from_millis(2500));
    let env = probe_env(&cms, "10s", PATIENT_TOML).await;
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    let key = format!("article:{}:1", today());
    env.xadd(&[("slot", &key), ("caller", "planner")]).await;
    let ds = env.read_all("w").await;
    assert_eq!(ds.len(), 1);
    let a = env.executor("a");
    let d = ds[0].clone();
    let run = tokio::spawn(async move { a.handle(&d).await });
    testkit::wait_for("A's POST to reach the CMS", T, || async {
        (!cms.calls_to("/publish").is_empty()).then_some(())
    })
    .await;
    // A is cut off after sending; its write is still being applied.
    run.abort();
    let _ = run.await;
    assert_eq!(env.executions().await, 0);
    sqlx::query("UPDATE publish_slot SET claim_expires_at = now() - interval '1 second'")
        .execute(&env.db.pool)
        .await
        .unwrap();
    let b = env.executor("b");
    assert_eq!(
        b.handle(&ds[0]).await.unwrap(),
        Handled::Recorded(Outcome::Published)
    );
    settled(&cms).await;
    let (outcome, _, detail) = execution(&env).await;
    assert_eq!(outcome, "published", "{detail}");
    assert_eq!(detail["resumed"], true, "{detail}");
    assert_eq!(detail["found_applied"], true, "{detail}");
    assert_eq!(env.executions().await, 1);
    let probes: Vec<Option<u16>> = cms
        .slot_calls_to("/probe")
        .iter()
        .map(|c| c.status)
        .collect();
    assert!(probes.contains(&Some(409)), "{probes:?}");
    assert_eq!(cms.calls_to("/publish").len(), 1, "{:?}", cms.calls());
    assert_eq!(cms.effects("/publish"), 1, "applied once");
}

/// Issue 38: a probe URL that answers 200 to anything (a soft-404 page, a
/// single-page app's route, `{}`, an answer too long to read whole) is not
/// a probe's answer: nothing is taken as applied, nothing is sent, and the
/// slot fails saying what the probe answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_answering_200_without_a_url_records_nothing_published_and_sends_nothing() {
    let answers = [
        Reply::Body(
            200,
            "text/html".into(),
            "<html><h1>Not found</h1></html>".into(),
        ),
        Reply::Body(200, "application/json".into(), "{}".into()),
        Reply::Body(200, "application/json".into(), r#"{"url": 17}"#.into()),
        Reply::Oversized(100_000),
    ];
    for answer in answers {
        let cms = Cms::start().await;
        let reply = answer.clone();
        cms.set_chooser(Some(Arc::new(
            move |path: &str, _: Option<&str>, _: &Value| {
                path.starts_with("/probe").then(|| reply.clone())
            },
        )));
        let env = probe_env(&cms, "2s", "").await;
        run_first_slot(&env).await;
        let (outcome, reason, detail) = execution(&env).await;
        assert_eq!(
            (outcome.as_str(), reason.as_deref()),
            ("failed", Some("publish_error")),
            "{answer:?}: {detail}"
        );
        let error = detail["publish_error"]["error"].as_str().unwrap();
        assert!(
            error.starts_with(
                "probe answered HTTP 200 without a complete JSON body holding a string \"url\""
            ),
            "{error}"
        );
        assert!(
            cms.calls_to("/publish").is_empty(),
            "nothing sent: {:?}",
            cms.calls()
        );
        assert_eq!(
            cms.slot_calls_to("/probe").len(),
            4,
            "probed until the attempts ran out"
        );
        let published = testkit::count(
            &env.db.pool,
            "SELECT count(*) FROM draft WHERE status = 'published' OR url IS NOT NULL",
        )
        .await;
        assert_eq!(published, 0, "{answer:?}");
    }
}

/// Issue 38: `Blog.Example` and `blog.example` are one host name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexnow_compares_the_host_without_regard_to_case() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &indexnow(&cms, "CMS.Test")).await;
    cms.script("/indexnow", [Reply::Status(200)]);
    run_first_slot(&env).await;
    let (outcome, _, detail) = execution(&env).await;
    assert_eq!(outcome, "published");
    assert!(detail.get("index_error").is_none(), "{detail}");
    let pushed = cms.calls_to("/indexnow");
    assert_eq!(pushed.len(), 1, "pushed: {detail}");
    assert_eq!(pushed[0].body["host"], "cms.test");
    assert_eq!(pushed[0].body["urlList"][0], "https://cms.test/1");
}

/// Issue 38: an IndexNow endpoint that refuses the push with the request
/// echoed back (the key in it) has the key kept out of the stored detail,
/// which the console serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_indexnow_refusal_echoing_the_request_keeps_the_key_out_of_the_record() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &indexnow(&cms, "cms.test")).await;
    cms.script("/indexnow", [Reply::EchoBody(400)]);
    run_first_slot(&env).await;
    let (outcome, _, detail) = execution(&env).await;
    assert_eq!(outcome, "published");
    assert_eq!(detail["index_error"]["status"], 400, "{detail}");
    let error = detail["index_error"]["error"].as_str().unwrap();
    assert!(error.starts_with("HTTP 400: "), "{error}");
    let stored = testkit::count(
        &env.db.pool,
        &format!(
            "SELECT count(*) FROM execution WHERE detail::text LIKE '%{INDEXNOW_KEY}%' \
             OR detail::text LIKE '%{}%'",
            &INDEXNOW_KEY[..8]
        ),
    )
    .await;
    assert_eq!(stored, 0, "the key is not stored: {detail}");
}

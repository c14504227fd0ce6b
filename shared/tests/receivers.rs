//! The webhook receiver's `probe_url` and the IndexNow push, against a real
//! local HTTP server that counts what a CMS ignoring idempotency keys would
//! have applied (`Cms::effects`).

mod common;

use common::{kind_toml, today, Env, T};
use serde_json::Value;
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
    let probes = cms.calls_to("/probe");
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
    assert_eq!(cms.calls_to("/probe").len(), 2);
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
    assert_eq!(cms.calls_to("/probe").len(), 3);
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

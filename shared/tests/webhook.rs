//! The publish and index webhooks against a real local HTTP server.

use crate::common::{kind_toml, today, Env, T};
use slotgate::receiver::Endpoint;
use std::time::Duration;
use testkit::cms::{Cms, Reply};

async fn env_with(cms: &Cms, slots: &[&str], extra: &str) -> Env {
    let urls = format!(
        "publish_url = \"{}\"\nindex_url = \"{}\"\nhttp_timeout = \"300ms\"\n{extra}",
        cms.url("/publish"),
        cms.url("/index")
    );
    Env::new(&kind_toml("article", slots, 5, &urls)).await
}

/// Delivers today's slot 1 (caller `planner`) and runs one worker until it
/// has an outcome; returns the slot key.
async fn run_first_slot(env: &Env) -> String {
    let key = format!("article:{}:1", today());
    env.xadd(&[("slot", &key), ("caller", "planner")]).await;
    let w = env.start_workers(1, |_| {});
    env.wait_executions(1, T).await;
    w.stop().await;
    key
}

async fn detail(env: &Env, outcome: &str) -> serde_json::Value {
    sqlx::query_scalar("SELECT detail FROM execution WHERE outcome = $1 LIMIT 1")
        .bind(outcome)
        .fetch_one(&env.db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_on_503_and_timeouts_reuse_the_idempotency_key() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &["00:00"], "").await;
    env.add_drafts("article", 1).await;
    cms.script(
        "/publish",
        [
            Reply::Status(503),
            Reply::Delay(Duration::from_secs(2), 200),
            Reply::Reset,
            Reply::Status(429),
        ],
    );
    let key = format!("article:{}:1", today());
    env.xadd(&[("slot", &key), ("caller", "planner")]).await;
    let w = env.start_workers(1, |o| o.retry_override.as_mut().unwrap().max_attempts = 6);
    env.wait_executions(1, T).await;
    w.stop().await;
    assert_eq!(env.outcomes().await.get("published"), Some(&1));
    let calls = cms.calls_to("/publish");
    assert_eq!(
        calls.len(),
        5,
        "503, timeout, reset, 429, then 200: {calls:?}"
    );
    assert!(
        calls.iter().all(|c| c.key.as_deref() == Some(key.as_str())),
        "same key on every try"
    );
    assert!(
        calls
            .iter()
            .all(|c| c.body["draft"]["id"] == calls[0].body["draft"]["id"]),
        "same draft on every try"
    );
    assert_eq!(calls[0].body["slot"], key);
    assert_eq!(detail(&env, "published").await["attempts"], 5);
    let index = cms.calls_to("/index");
    assert_eq!(index.len(), 1);
    assert_eq!(
        index[0].key.as_deref(),
        Some(format!("{key}:index").as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_400_fails_at_once_and_the_draft_is_not_reused() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &["00:00", "00:00:01"], "").await;
    let drafts = env.add_drafts("article", 2).await;
    cms.script("/publish", [Reply::Status(400)]);
    let day = today();
    env.xadd(&[("slot", &format!("article:{day}:1")), ("caller", "planner")])
        .await;
    let w = env.start_workers(1, |_| {});
    env.wait_executions(1, T).await;
    assert_eq!(cms.calls_to("/publish").len(), 1, "4xx is not retried");
    let d = detail(&env, "failed").await;
    assert_eq!(d["publish_error"]["status"], 400, "{d}");
    assert_eq!(d["publish_error"]["attempts"], 1, "{d}");
    // The failed slot keeps its draft; the next slot gets the other one.
    env.xadd(&[("slot", &format!("article:{day}:2")), ("caller", "planner")])
        .await;
    env.wait_executions(2, T).await;
    w.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("failed/publish_error"), Some(&1), "{o:?}");
    assert_eq!(o.get("published"), Some(&1), "{o:?}");
    let (status, slot): (String, Option<String>) =
        sqlx::query_as("SELECT status, slot_key FROM draft WHERE id = $1")
            .bind(drafts[0])
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(
        (status.as_str(), slot),
        ("failed", Some(format!("article:{day}:1")))
    );
    let (status2, slot2): (String, Option<String>) =
        sqlx::query_as("SELECT status, slot_key FROM draft WHERE id = $1")
            .bind(drafts[1])
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(
        (status2.as_str(), slot2),
        ("published", Some(format!("article:{day}:2")))
    );
    let published_ids: Vec<serde_json::Value> = cms
        .applied("/publish")
        .values()
        .map(|b| b["draft"]["id"].clone())
        .collect();
    assert_eq!(published_ids, vec![serde_json::json!(drafts[1])]);
    // The failed slot kept its unit of the cap.
    assert_eq!(
        testkit::count(&env.db.pool, "SELECT used::bigint FROM daily_quota").await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_5xx_fails_after_bounded_attempts() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &["00:00"], "").await;
    env.add_drafts("article", 1).await;
    cms.script("/publish", vec![Reply::Status(502); 10]);
    env.xadd(&[
        ("slot", &format!("article:{}:1", today())),
        ("caller", "planner"),
    ])
    .await;
    let w = env.start_workers(1, |_| {});
    env.wait_executions(1, T).await;
    w.stop().await;
    assert_eq!(
        cms.calls_to("/publish").len(),
        4,
        "max_attempts = 4 in the test policy"
    );
    let d = detail(&env, "failed").await;
    assert_eq!(d["publish_error"]["attempts"], 4);
    assert_eq!(d["publish_error"]["status"], 502);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_failure_leaves_the_slot_published() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &["00:00"], "").await;
    env.add_drafts("article", 1).await;
    cms.script("/index", vec![Reply::Status(500); 10]);
    run_first_slot(&env).await;
    assert_eq!(env.outcomes().await.get("published"), Some(&1));
    let d = detail(&env, "published").await;
    assert_eq!(d["index_error"]["status"], 500, "{d}");
    assert_eq!(d["url"], "https://cms.test/1", "{d}");
    let state: String = sqlx::query_scalar("SELECT state FROM publish_slot")
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(state, "published");
    let url: Option<String> = sqlx::query_scalar("SELECT url FROM draft")
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(url.as_deref(), Some("https://cms.test/1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_urls_are_spoken_with_tls() {
    // The stand-in CMS speaks plain HTTP, so a TLS handshake with it fails:
    // a retryable transport error, not "scheme is not http" (a client built
    // without TLS would refuse https URLs outright).
    let cms = Cms::start().await;
    let url = cms.url("/publish").replace("http://", "https://");
    let r = slotgate::receiver::Http::new()
        .call_once(
            &Endpoint {
                name: "publish",
                url: &url,
                key: "k",
                auth: &Default::default(),
                timeout: Duration::from_secs(1),
            },
            (&b"{}"[..]).into(),
        )
        .await;
    let f = r.expect_err("a TLS handshake with a plain HTTP server fails");
    assert!(f.retryable, "{f:?}");
    assert!(!f.error.contains("scheme"), "{f:?}");
    assert_eq!(f.status, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirect_is_not_a_publish_and_is_not_followed_or_retried() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &["00:00", "00:00:01"], "").await;
    let drafts = env.add_drafts("article", 2).await;
    cms.script(
        "/publish",
        [
            Reply::Redirect(301, "/moved".into()),
            Reply::Redirect(302, format!("/elsewhere/{}", "x".repeat(1000))),
        ],
    );
    let day = today();
    let w = env.start_workers(1, |_| {});
    for n in [1, 2] {
        env.xadd(&[
            ("slot", &format!("article:{day}:{n}")),
            ("caller", "planner"),
        ])
        .await;
        env.wait_executions(n, T).await;
    }
    w.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("failed/publish_error"), Some(&2), "{o:?}");
    assert_eq!(o.get("published"), None, "{o:?}");
    let calls = cms.calls();
    assert_eq!(
        calls.len(),
        2,
        "one POST per slot, nothing followed: {calls:?}"
    );
    assert!(calls.iter().all(|c| c.path == "/publish"), "{calls:?}");
    assert!(cms.applied("/moved").is_empty() && cms.calls_to("/index").is_empty());
    let rows: Vec<(serde_json::Value,)> =
        sqlx::query_as("SELECT detail FROM execution WHERE outcome = 'failed' ORDER BY slot")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    let first = &rows[0].0["publish_error"];
    assert_eq!(first["status"], 301, "{first}");
    assert_eq!(first["attempts"], 1, "not retried: {first}");
    assert_eq!(first["location"], "/moved", "{first}");
    let second = &rows[1].0["publish_error"];
    assert_eq!(second["status"], 302, "{second}");
    let location = second["location"].as_str().unwrap();
    assert!(
        location.starts_with("/elsewhere/xxx") && location.len() < 300,
        "{location}"
    );
    let states: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT status, url FROM draft WHERE id = ANY($1) ORDER BY id")
            .bind(&drafts)
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(
        states,
        vec![("failed".to_owned(), None), ("failed".to_owned(), None)],
        "no draft marked published"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_answer_is_read_up_to_the_limit_and_stored_truncated() {
    let cms = Cms::start().await;
    let env = env_with(&cms, &["00:00"], "").await;
    env.add_drafts("article", 1).await;
    cms.script("/publish", [Reply::Oversized(4 * 1024 * 1024)]);
    let key = run_first_slot(&env).await;
    assert_eq!(env.outcomes().await.get("published"), Some(&1));
    let stored = testkit::count(
        &env.db.pool,
        "SELECT (length(response::text) + (SELECT max(length(detail::text)) FROM execution))::bigint FROM publish_slot",
    )
    .await;
    assert!(stored < 2048, "stored answer bounded: {stored} bytes");
    let response: serde_json::Value = sqlx::query_scalar("SELECT response FROM publish_slot")
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(response["answer_cut_at"], 65536, "{response}");
    assert!(
        response["answer"].as_str().unwrap().starts_with("{\""),
        "{response}"
    );
    // The URL could not be read from a cut answer: the draft gets the
    // publish URL with the slot, as for any answer without one.
    let url: Option<String> = sqlx::query_scalar("SELECT url FROM draft")
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(url, Some(format!("{}#{key}", cms.url("/publish"))));
}

/// Issue 38: a CMS that refuses a publish with the request echoed back
/// (its `Authorization` header with the bearer token, as a debugging proxy
/// or error page may) has the token kept out of the stored detail, which
/// the console serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_echoing_the_request_keeps_the_token_out_of_the_record() {
    const TOKEN: &str = "tok-3f9a7c1e5b2d";
    std::env::set_var("TEST_ECHO_TOKEN", TOKEN);
    let cms = Cms::start().await;
    let env = env_with(
        &cms,
        &["00:00"],
        "auth = \"bearer\"\ntoken_env = \"TEST_ECHO_TOKEN\"",
    )
    .await;
    env.add_drafts("article", 1).await;
    cms.script("/publish", [Reply::Echo(400)]);
    run_first_slot(&env).await;
    let requests = cms.requests();
    assert_eq!(
        requests[0].header("authorization"),
        Some(format!("Bearer {TOKEN}").as_str()),
        "the token was sent"
    );
    let d = detail(&env, "failed").await;
    assert_eq!(d["publish_error"]["status"], 400, "{d}");
    let error = d["publish_error"]["error"].as_str().unwrap();
    assert!(error.starts_with("HTTP 400: {\"error\""), "{error}");
    assert!(!d.to_string().contains(&TOKEN[..8]), "{d}");
}

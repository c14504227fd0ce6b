//! The publish and index webhooks against a real local HTTP server.

mod common;

use common::{kind_toml, today, Env, T};
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
    let key = format!("article:{}:1", today());
    env.xadd(&[("slot", &key), ("caller", "planner")]).await;
    let w = env.start_workers(1, |_| {});
    env.wait_executions(1, T).await;
    w.stop().await;
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
    let r = slotgate::publish::Webhook::new()
        .call_once(
            "publish",
            &url,
            "k",
            &serde_json::json!({}),
            Duration::from_secs(1),
        )
        .await;
    let f = r.expect_err("a TLS handshake with a plain HTTP server fails");
    assert!(f.retryable, "{f:?}");
    assert!(!f.error.contains("scheme"), "{f:?}");
    assert_eq!(f.status, None);
}

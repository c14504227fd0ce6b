//! The throwaway WordPress against itself: what slotgate's WordPress tests
//! rely on, each test with an instance of its own. Among them the facts of
//! WordPress's REST API that shape slotgate's design (a retried create is a
//! second post; a write can be saved although its answer never came).

use std::time::{Duration, Instant};
use testkit::server::OwnedWordPress;

/// A started instance, with how long the start took on stderr.
fn start() -> OwnedWordPress {
    let t = Instant::now();
    let wp = OwnedWordPress::start();
    eprintln!("OwnedWordPress::launch took {:?}", t.elapsed());
    wp
}

/// A POST of a post to the REST API as `(user, password)`, with `timeout`.
async fn post_as(
    wp: &OwnedWordPress,
    (user, password): (&str, &str),
    body: serde_json::Value,
    timeout: Duration,
) -> reqwest::Result<reqwest::Response> {
    reqwest::Client::new()
        .post(format!("{}/wp-json/wp/v2/posts", wp.url()))
        .basic_auth(user, Some(password))
        .timeout(timeout)
        .json(&body)
        .send()
        .await
}

const T: Duration = Duration::from_secs(30);

#[tokio::test]
async fn application_password_works_over_php_s_and_helpers_reach_the_posts_table() {
    let wp = start();
    assert!(wp.posts().await.is_empty(), "the sample post is removed");

    // A draft is visible only to an authenticated editor: Basic auth with
    // the application password reached WordPress through `php -S`.
    let draft = wp.create_post("A draft", "draft", None).await;
    let url = format!("{}/wp-json/wp/v2/posts?context=edit&status=draft", wp.url());
    let (user, password) = wp.admin();
    let resp = reqwest::Client::new()
        .get(&url)
        .basic_auth(user, Some(password))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let listed: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(listed[0]["id"], draft, "{listed}");
    let anonymous = reqwest::get(&url).await.unwrap().status();
    assert!(anonymous.is_client_error(), "anonymous drafts: {anonymous}");

    // Pretty permalinks: the REST API's link is /<slug>/, as `posts()` says.
    let published = wp.create_post("Hello there", "publish", None).await;
    let rest: serde_json::Value =
        reqwest::get(format!("{}/wp-json/wp/v2/posts/{published}", wp.url()))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let future = wp
        .create_post("Later", "future", Some("2099-01-02T03:04:05"))
        .await;
    let trashed = wp.create_post("Trashed", "publish", None).await;
    let deleted = wp.create_post("Deleted", "publish", None).await;
    wp.set_status(draft, "pending").await;
    wp.trash(trashed).await;
    wp.delete(deleted).await;

    let posts = wp.posts().await;
    let by_id = |id: i64| posts.iter().find(|p| p.id == id).cloned();
    let p = by_id(published).expect("published post");
    assert_eq!(
        (p.status.as_str(), p.slug.as_str()),
        ("publish", "hello-there")
    );
    assert_eq!(p.link, format!("{}/hello-there/", wp.url()));
    assert_eq!(rest["link"], p.link.as_str());
    let f = by_id(future).expect("future post");
    assert_eq!(
        (f.status.as_str(), f.date_gmt.as_str()),
        ("future", "2099-01-02 03:04:05")
    );
    assert_eq!(by_id(draft).expect("draft").status, "pending");
    assert_eq!(by_id(trashed).expect("trashed post").status, "trash");
    assert_eq!(by_id(deleted), None, "deleted for good");
    assert_eq!(posts.len(), 4, "{posts:?}");
}

/// WordPress ignores `Idempotency-Key`: a create retried after a lost
/// answer is a second post. This is why slotgate reads before it writes
/// again.
#[tokio::test]
async fn same_idempotency_key_still_creates_two_posts() {
    let wp = start();
    let key = uuid::Uuid::new_v4().to_string();
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (user, password) = wp.admin();
        let resp = reqwest::Client::new()
            .post(format!("{}/wp-json/wp/v2/posts", wp.url()))
            .basic_auth(user, Some(password))
            .header("Idempotency-Key", &key)
            .json(&serde_json::json!({ "title": "Twice", "status": "publish" }))
            .timeout(T)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 201);
        let post: serde_json::Value = resp.json().await.unwrap();
        ids.push(post["id"].as_i64().unwrap());
    }
    assert_ne!(ids[0], ids[1]);
    let twice: Vec<_> = wp
        .posts()
        .await
        .into_iter()
        .filter(|p| p.title == "Twice" && p.status == "publish")
        .collect();
    assert_eq!(twice.len(), 2, "{twice:?}");
}

/// The hold fault: the write is saved, its answer never reaches a client
/// that waits 2 s; meanwhile the other workers of `php -S` still serve.
#[tokio::test]
async fn a_held_write_is_saved_though_the_client_timed_out() {
    let wp = start();
    assert_eq!(wp.held_writes(), 0);
    wp.hold_writes(5, 1);

    let t = Instant::now();
    let held = post_as(
        &wp,
        wp.admin(),
        serde_json::json!({ "title": "Applied, answer lost", "status": "publish" }),
        Duration::from_secs(2),
    );
    // While that request sleeps in a worker, another one is answered.
    let other = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let t = Instant::now();
        let status = reqwest::Client::new()
            .get(format!("{}/wp-json/", wp.url()))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .map(|r| r.status());
        (status, t.elapsed())
    };
    let (held, (other, other_took)) = tokio::join!(held, other);
    let err = held.expect_err("the held write must time out");
    assert!(err.is_timeout(), "{err}");
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert_eq!(other.expect("a request beside the held one"), 200);
    assert!(other_took < Duration::from_secs(2), "{other_took:?}");

    assert_eq!(wp.held_writes(), 1);
    let saved: Vec<_> = wp
        .posts()
        .await
        .into_iter()
        .filter(|p| p.title == "Applied, answer lost")
        .collect();
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert_eq!(saved[0].status, "publish");

    // The count is used up: the next write is answered, and not counted.
    let resp = post_as(
        &wp,
        wp.admin(),
        serde_json::json!({ "title": "Answered", "status": "draft" }),
        Duration::from_secs(3),
    )
    .await
    .expect("an unheld write");
    assert_eq!(resp.status(), 201);
    assert_eq!(wp.held_writes(), 1);

    // Released: nothing held even with a count set before.
    wp.hold_writes(5, 3);
    wp.release_holds();
    let resp = post_as(
        &wp,
        wp.admin(),
        serde_json::json!({ "title": "Released", "status": "draft" }),
        Duration::from_secs(3),
    )
    .await
    .expect("a write after release_holds");
    assert_eq!(resp.status(), 201);
    assert_eq!(wp.held_writes(), 1);
}

#[tokio::test]
async fn a_contributor_may_not_publish() {
    let wp = start();
    let resp = post_as(
        &wp,
        wp.contributor(),
        serde_json::json!({ "title": "By a contributor", "status": "publish" }),
        T,
    )
    .await
    .unwrap();
    let status = resp.status();
    let body = resp.text().await.unwrap();
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("rest_cannot_publish"), "{body}");

    // A draft is allowed (the password works); publishing it is not.
    let resp = post_as(
        &wp,
        wp.contributor(),
        serde_json::json!({ "title": "Contributor draft", "status": "draft" }),
        T,
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 201);
    let id = resp.json::<serde_json::Value>().await.unwrap()["id"]
        .as_i64()
        .unwrap();
    let (user, password) = wp.contributor();
    let resp = reqwest::Client::new()
        .post(format!("{}/wp-json/wp/v2/posts/{id}", wp.url()))
        .basic_auth(user, Some(password))
        .json(&serde_json::json!({ "status": "publish" }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);

    let posts = wp.posts().await;
    assert_eq!(posts.len(), 1, "{posts:?}");
    assert_eq!(posts[0].status, "draft");
}

#[tokio::test]
async fn a_bad_application_password_gets_401() {
    let wp = start();
    let (user, _) = wp.admin();
    let resp = post_as(
        &wp,
        (user, "abcd efgh ijkl mnop qrst uvwx"),
        serde_json::json!({ "title": "Forged", "status": "publish" }),
        T,
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 401);
    assert!(wp.posts().await.is_empty());
}

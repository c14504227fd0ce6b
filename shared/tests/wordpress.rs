//! WordPress kinds against a real, throwaway WordPress (Debian's
//! `wordpress` on `php -S` with its own MariaDB; `testkit::server`), judged
//! by WordPress's own posts table. "Applied, answer lost" is a real fault:
//! the fixture's must-use plugin holds a REST write after WordPress saved
//! it, past the worker's `http_timeout`.

use crate::common::{kind_toml, today, Env, T};
use serde_json::Value;
use std::time::Duration;
use testkit::server::OwnedWordPress;

/// A kind publishing to `wp` as `user` (password from an env var of this
/// test process), `drafts` in WordPress (`Some("pending")`) or in slotgate.
async fn wp_env(
    wp: &OwnedWordPress,
    user: (&str, &str),
    drafts: Option<&str>,
    slots: &[&str],
    cap: u32,
) -> Env {
    std::env::set_var("TEST_WP_PASSWORD", user.1);
    let drafts = drafts
        .map(|d| format!("drafts = \"{d}\"\nrefresh_every = \"10m\"\n"))
        .unwrap_or_default();
    let extra = format!(
        "http_timeout = \"2s\"\n[kinds.wordpress]\nurl = \"{}\"\nuser = \"{}\"\napp_password_env = \"TEST_WP_PASSWORD\"\n{drafts}",
        wp.url(),
        user.0
    );
    Env::new(&kind_toml("article", slots, cap, &extra)).await
}

fn slot(n: u32) -> String {
    format!("article:{}:{n}", today())
}

/// Delivers `slots` (caller `planner`) and runs one worker until `n`
/// executions are recorded.
async fn run(env: &Env, slots: &[u32], n: i64) {
    for s in slots {
        env.xadd(&[("slot", &slot(*s)), ("caller", "planner")])
            .await;
    }
    let w = env.start_workers(1, |_| {});
    env.wait_executions(n, T).await;
    w.stop().await;
}

async fn executions(env: &Env) -> Vec<(String, String, Option<String>, Value)> {
    sqlx::query_as("SELECT slot_key, outcome, reason, detail FROM execution ORDER BY id")
        .fetch_all(&env.db.pool)
        .await
        .unwrap()
}

/// Runs slot 1 with WordPress holding its first write past the worker's
/// timeout ("applied, answer lost"); checks the fault happened and the
/// slot's one execution is `published` with `found_applied`; its detail.
async fn run_with_one_write_held(wp: &OwnedWordPress, env: &Env) -> Value {
    wp.hold_writes(5, 1);
    run(env, &[1], 1).await;
    assert_eq!(
        wp.held_writes(),
        1,
        "the write was held: the fault happened"
    );
    let ex = executions(env).await;
    assert_eq!(ex.len(), 1);
    let (_, outcome, _, detail) = &ex[0];
    assert_eq!(outcome, "published", "{detail}");
    assert_eq!(detail["found_applied"], true, "{detail}");
    detail.clone()
}

async fn quota_used(env: &Env) -> i32 {
    sqlx::query_scalar("SELECT coalesce(sum(used), 0)::int FROM daily_quota")
        .fetch_one(&env.db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_status_change_whose_answer_is_lost_is_read_back_not_written_again() {
    let wp = OwnedWordPress::start();
    let id = wp.create_post("Ready to go", "pending", None).await;
    let env = wp_env(&wp, wp.admin(), Some("pending"), &["00:00"], 5).await;
    let detail = &run_with_one_write_held(&wp, &env).await;
    let posts = wp.posts().await;
    let published: Vec<_> = posts.iter().filter(|p| p.status == "publish").collect();
    assert_eq!(published.len(), 1, "{posts:?}");
    assert_eq!(published[0].id, id);
    assert_eq!(detail["url"], published[0].link.as_str(), "{detail}");
    let url: String = sqlx::query_scalar("SELECT url FROM draft WHERE cms_id = $1")
        .bind(id)
        .fetch_one(&env.db.pool)
        .await
        .unwrap();
    assert_eq!(url, published[0].link);
}

/// The marker of today's `article` slot `n` (drafts in slotgate, default
/// template): the slug filled in, then the installation's and kind's tag.
fn marker(env: &Env, n: u32) -> String {
    let tag = slotgate::receiver::wordpress::marker_tag(&env.config.jitter_seed, "article");
    format!("article-{}-{n}-{tag}", today())
}

/// Mirrors the kind's drafts from WordPress now, as a worker's background
/// refresh does (tests that drive an executor by hand have none).
async fn sync(env: &Env) {
    let receivers = slotgate::receiver::Receivers::for_config(&env.config, env.clock.clone());
    let route = receivers.route("article").unwrap();
    slotgate::worker::drafts::sync(&*route.receiver, "article", &env.db.pool)
        .await
        .expect("sync the drafts");
}

/// A `[kinds.wordpress]` section (drafts `pending`) pointing at the
/// stand-in `cms`, for the faults the real WordPress cannot make (a proxy's
/// 404, a listing that never answers, a page repeating an id).
fn wordpress_at(cms: &testkit::cms::Cms) -> String {
    std::env::set_var("TEST_WP_PASSWORD", "xxxx");
    format!(
        "[kinds.wordpress]\nurl = \"{}\"\nuser = \"editor\"\napp_password_env = \"TEST_WP_PASSWORD\"\ndrafts = \"pending\"\n",
        cms.base
    )
}

/// Waits until WordPress has saved `n` posts (held writes included).
async fn wait_posts(wp: &OwnedWordPress, n: usize) -> Vec<testkit::server::WpPost> {
    testkit::wait_for(&format!("{n} posts saved"), T, || async {
        let posts = wp.posts().await;
        (posts.len() >= n).then_some(posts)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_applied_publish_whose_answer_is_lost_makes_one_post() {
    let wp = OwnedWordPress::start();
    let env = wp_env(&wp, wp.admin(), None, &["00:00"], 5).await;
    env.add_drafts("article", 1).await;
    // The stage (a create) goes through; the status change is held past
    // the timeout after WordPress saved it.
    wp.hold_updates(5, 1);
    run(&env, &[1], 1).await;
    assert_eq!(
        wp.held_writes(),
        1,
        "the publish was held: the fault happened"
    );
    let ex = executions(&env).await;
    let (_, outcome, _, detail) = &ex[0];
    assert_eq!(outcome, "published", "{detail}");
    assert_eq!(detail["found_applied"], true, "{detail}");
    let posts = wp.posts().await;
    assert_eq!(posts.len(), 1, "exactly one post: {posts:?}");
    assert_eq!(posts[0].status, "publish");
    assert_eq!(posts[0].slug, marker(&env, 1));
    assert_eq!(detail["url"], posts[0].link.as_str());
}

/// The post-mortem's incident at a WordPress under load: creates accepted
/// and queued past the client's timeout, saved later. Staged as drafts, the
/// late copies stay invisible; the slot makes one public post.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creates_held_before_their_save_past_the_timeout_make_one_public_post() {
    let wp = OwnedWordPress::start();
    let env = wp_env(&wp, wp.admin(), None, &["00:00"], 5).await;
    env.add_drafts("article", 1).await;
    wp.hold_creates_before_save(5, 2);
    env.xadd(&[("slot", &slot(1)), ("caller", "planner")]).await;
    let w = env.start_workers(1, |o| {
        o.retry_override = Some(slotgate::retry::RetryPolicy {
            max_attempts: 3,
            base: Duration::from_millis(10),
            cap: Duration::from_millis(50),
        })
    });
    env.wait_executions(1, T).await;
    w.stop().await;
    assert_eq!(
        wp.held_writes(),
        2,
        "two creates were held before their save"
    );
    // The two held creates are saved after the slot was recorded.
    let posts = wait_posts(&wp, 3).await;
    let public: Vec<_> = posts.iter().filter(|p| p.status == "publish").collect();
    assert_eq!(public.len(), 1, "one public post for one slot: {posts:?}");
    assert_eq!(public[0].slug, marker(&env, 1));
    assert!(
        posts
            .iter()
            .filter(|p| p.id != public[0].id)
            .all(|p| p.status == "draft"),
        "the late copies stay unpublished drafts: {posts:?}"
    );
    let ex = executions(&env).await;
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0].1, "published", "{:?}", ex[0].3);
    assert_eq!(ex[0].3["url"], public[0].link.as_str());
}

/// A worker cut off while its create waits at WordPress; another takes the
/// claim over and stages its own copy; the first copy is saved afterwards.
/// One public post.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_while_a_create_is_held_makes_one_public_post() {
    let wp = OwnedWordPress::start();
    let env = wp_env(&wp, wp.admin(), None, &["00:00"], 5).await;
    env.add_drafts("article", 1).await;
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    wp.hold_creates_before_save(6, 1);
    env.xadd(&[("slot", &slot(1)), ("caller", "planner")]).await;
    let ds = env.read_all("w1").await;
    assert_eq!(ds.len(), 1);
    let first = env.executor("w1");
    let d = ds[0].clone();
    let run = tokio::spawn(async move { first.handle(&d).await });
    testkit::wait_for("the first create held at WordPress", T, || async {
        (wp.held_writes() == 1).then_some(())
    })
    .await;
    // The first worker is cut off after sending; its claim lapses.
    run.abort();
    let _ = run.await;
    sqlx::query("UPDATE publish_slot SET claim_expires_at = now() - interval '1 second'")
        .execute(&env.db.pool)
        .await
        .unwrap();
    let other = env.executor("w2");
    other.handle(&ds[0]).await.unwrap();
    let posts = wait_posts(&wp, 2).await;
    let public: Vec<_> = posts.iter().filter(|p| p.status == "publish").collect();
    assert_eq!(public.len(), 1, "one public post: {posts:?}");
    assert_eq!(
        posts.iter().filter(|p| p.status == "draft").count(),
        1,
        "the first worker's copy, saved late, stays a draft: {posts:?}"
    );
    let ex = executions(&env).await;
    assert_eq!(ex.len(), 1);
    assert_eq!(ex[0].1, "published", "{:?}", ex[0].3);
    assert_eq!(ex[0].3["resumed"], true, "{:?}", ex[0].3);
}

/// Someone else's post carrying the slot's marker as its slug (any
/// Contributor can set one) is not the slot's post: slotgate publishes its
/// own, and leaves the stranger's alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_strangers_post_with_the_marker_slug_is_not_taken() {
    let wp = OwnedWordPress::start();
    let env = wp_env(&wp, wp.admin(), None, &["00:00"], 5).await;
    env.add_drafts("article", 1).await;
    let stranger = wp
        .create_post_as(
            wp.contributor(),
            serde_json::json!({"title": "not yours", "status": "pending", "slug": marker(&env, 1)}),
        )
        .await;
    run(&env, &[1], 1).await;
    let ex = executions(&env).await;
    assert_eq!(ex[0].1, "published", "{:?}", ex[0].3);
    assert_ne!(ex[0].3["found_applied"], true, "{:?}", ex[0].3);
    let posts = wp.posts().await;
    let theirs = posts.iter().find(|p| p.id == stranger).unwrap();
    assert_eq!(theirs.status, "pending", "the stranger's post is untouched");
    let public: Vec<_> = posts.iter().filter(|p| p.status == "publish").collect();
    assert_eq!(public.len(), 1, "{posts:?}");
    assert_ne!(public[0].id, stranger);
    assert_eq!(ex[0].3["url"], public[0].link.as_str());
}

/// Two kinds whose names WordPress reduces to one slug (`news_a`,
/// `news-a`), or two installations, never share a marker.
#[test]
fn markers_differ_by_kind_and_installation() {
    use slotgate::receiver::wordpress::marker_tag;
    assert_ne!(
        marker_tag("slotgate", "news_a"),
        marker_tag("slotgate", "news-a")
    );
    assert_ne!(
        marker_tag("site-one", "news"),
        marker_tag("site-two", "news")
    );
    assert_eq!(marker_tag("s", "k"), marker_tag("s", "k"), "stable");
}

/// A `404` that is not WordPress's own `rest_post_invalid_id` (a proxy's
/// page, a cache, a moved site) does not withdraw the draft for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_that_is_not_wordpresss_withdraws_nothing() {
    let cms = testkit::cms::Cms::start().await;
    cms.set_chooser(Some(std::sync::Arc::new(|path: &str, _, _| {
        path.starts_with("/wp-json/wp/v2/posts/")
            .then_some(testkit::cms::Reply::Status(404))
    })));
    let extra = format!(
        "http_timeout = \"2s\"\nhttp_attempts = 2\nretry_base = \"10ms\"\nretry_cap = \"20ms\"\n{}",
        wordpress_at(&cms)
    );
    let env = Env::new(&kind_toml("article", &["00:00"], 5, &extra)).await;
    slotgate::store::sync_cms_drafts(
        &env.db.pool,
        "article",
        &[(
            7,
            "Ready".into(),
            chrono::Utc::now() - chrono::Duration::hours(1),
        )],
        true,
    )
    .await
    .unwrap();
    env.xadd(&[("slot", &slot(1)), ("caller", "planner")]).await;
    let exec = env.executor("w1");
    for d in env.read_all("w1").await {
        exec.handle(&d).await.unwrap();
    }
    assert!(
        cms.calls()
            .iter()
            .any(|c| c.path.starts_with("/wp-json/wp/v2/posts/7")),
        "the post was read: the fault happened"
    );
    let ex = executions(&env).await;
    assert_eq!(ex.len(), 1);
    assert_eq!(
        (ex[0].1.as_str(), ex[0].2.as_deref()),
        ("failed", Some("publish_error")),
        "unknown, not withdrawn: {:?}",
        ex[0].3
    );
    let released: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM draft WHERE cms_id = 7 AND status = 'draft' AND slot_key IS NULL",
    )
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(released, 0, "the draft is not released as withdrawn");
}

/// A post published by the slot and trashed by an editor before the
/// worker's read-back went out: `published`, its cap unit spent, the
/// trash noted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_published_then_trashed_before_the_read_back_is_recorded_published() {
    let wp = OwnedWordPress::start();
    let id = wp.create_post("Goes out", "pending", None).await;
    let env = wp_env(&wp, wp.admin(), Some("pending"), &["00:00"], 5).await;
    wp.hold_updates(5, 1);
    env.xadd(&[("slot", &slot(1)), ("caller", "planner")]).await;
    let w = env.start_workers(1, |_| {});
    testkit::wait_for("the publish saved and held", T, || async {
        (wp.held_writes() == 1).then_some(())
    })
    .await;
    wp.trash(id).await;
    env.wait_executions(1, T).await;
    w.stop().await;
    let ex = executions(&env).await;
    let (_, outcome, _, detail) = &ex[0];
    assert_eq!(outcome, "published", "{detail}");
    assert_eq!(detail["found_applied"], true, "{detail}");
    assert_eq!(detail["noted"]["trashed_after_publish"], true, "{detail}");
    assert_eq!(quota_used(&env).await, 1, "its cap unit is spent");
}

/// A WordPress listing that waits does not hold up another kind's
/// deliveries: the record-only slot is recorded while the listing is
/// still unanswered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_listing_holds_up_no_other_kind() {
    let cms = testkit::cms::Cms::start().await;
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let held = release.clone();
    cms.set_chooser(Some(std::sync::Arc::new(move |path: &str, _, _| {
        path.starts_with("/wp-json/wp/v2/posts?")
            .then(|| testkit::cms::Reply::Hold(held.clone(), 200))
    })));
    let wp = wordpress_at(&cms);
    let toml = format!(
        "{}{}",
        kind_toml("article", &["00:00"], 5, &wp),
        kind_toml("note", &["00:00"], 5, "")
    );
    let env = Env::new(&toml).await;
    env.add_drafts("note", 1).await;
    env.xadd(&[("slot", &slot(1)), ("caller", "planner")]).await;
    env.xadd(&[
        ("slot", &format!("note:{}:1", today())),
        ("caller", "planner"),
    ])
    .await;
    let w = env.start_workers(1, |_| {});
    testkit::wait_for("the note slot recorded", T, || async {
        let o = env.outcomes().await;
        (o.get("published") == Some(&1)).then_some(())
    })
    .await;
    assert!(
        cms.calls()
            .iter()
            .any(|c| c.path.starts_with("/wp-json/wp/v2/posts?"))
            && cms.in_flight() >= 1,
        "the listing was asked and is still unanswered"
    );
    let note: String =
        sqlx::query_scalar("SELECT slot_key FROM execution WHERE outcome = 'published'")
            .fetch_one(&env.db.pool)
            .await
            .unwrap();
    assert!(note.starts_with("note:"), "{note}");
    release.notify_waiters();
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn withdrawn_posts_are_not_published_and_give_their_cap_unit_back() {
    let wp = OwnedWordPress::start();
    let mut ids = Vec::new();
    for (i, t) in ["A", "B", "C", "D"].iter().enumerate() {
        let date = format!("2026-01-0{}T10:00:00", i + 1);
        ids.push(wp.create_post(t, "pending", Some(&date)).await);
    }
    let env = wp_env(
        &wp,
        wp.admin(),
        Some("pending"),
        &["00:00", "00:00:01", "00:00:02", "00:00:03"],
        4,
    )
    .await;
    // Driven by hand: no background refresh, so the mirror is read once.
    sync(&env).await;
    let exec = env.executor("w1");
    // Slot 1 mirrors the four and publishes the oldest, A.
    env.xadd(&[("slot", &slot(1)), ("caller", "planner")]).await;
    for d in env.read_all("w1").await {
        exec.handle(&d).await.unwrap();
    }
    assert_eq!(executions(&env).await[0].1, "published");
    // The editor withdraws the other three after the mirror saw them
    // ready: only the read before the write can see it now.
    wp.set_status(ids[1], "draft").await;
    wp.trash(ids[2]).await;
    wp.delete(ids[3]).await;
    for n in [2, 3, 4] {
        env.xadd(&[("slot", &slot(n)), ("caller", "planner")]).await;
    }
    for d in env.read_all("w1").await {
        exec.handle(&d).await.unwrap();
    }
    let ex = executions(&env).await;
    let withdrawn: Vec<_> = ex
        .iter()
        .filter(|e| e.1 == "skipped" && e.2.as_deref() == Some("draft_withdrawn"))
        .collect();
    assert_eq!(withdrawn.len(), 3, "{ex:?}");
    let mut seen: Vec<String> = withdrawn
        .iter()
        .map(|e| e.3["withdrawn"]["seen"].as_str().unwrap().to_owned())
        .collect();
    seen.sort();
    assert_eq!(seen, ["deleted", "draft", "trash"]);
    let posts = wp.posts().await;
    let by_id = |id: i64| posts.iter().find(|p| p.id == id).map(|p| p.status.as_str());
    assert_eq!(by_id(ids[0]), Some("publish"));
    assert_eq!(by_id(ids[1]), Some("draft"));
    assert_eq!(
        by_id(ids[2]),
        Some("trash"),
        "a write would have restored it"
    );
    assert_eq!(by_id(ids[3]), None);
    assert_eq!(
        quota_used(&env).await,
        1,
        "the three skipped slots gave their units back"
    );
    let unbound: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM draft WHERE cms_id = ANY($1) AND status = 'draft' AND slot_key IS NULL",
    )
    .bind(&ids[1..])
    .fetch_one(&env.db.pool)
    .await
    .unwrap();
    assert_eq!(unbound, 3, "each withdrawn draft is released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_ready_posts_go_first_within_the_cap_without_a_manual_sync() {
    let wp = OwnedWordPress::start();
    // Created newest first, so ids and dates disagree.
    let newest = wp
        .create_post("newest", "pending", Some("2026-03-01T08:00:00"))
        .await;
    let middle = wp
        .create_post("middle", "pending", Some("2026-02-01T08:00:00"))
        .await;
    let oldest = wp
        .create_post("oldest", "pending", Some("2026-01-01T08:00:00"))
        .await;
    let not_ready = wp
        .create_post("just a draft", "draft", Some("2025-01-01T08:00:00"))
        .await;
    let env = wp_env(
        &wp,
        wp.admin(),
        Some("pending"),
        &["00:00", "00:00:01", "00:00:02"],
        2,
    )
    .await;
    // One at a time, so "first" is well defined.
    run(&env, &[1], 1).await;
    run(&env, &[2], 2).await;
    run(&env, &[3], 3).await;
    let ex = executions(&env).await;
    let outcomes: Vec<(String, Option<String>)> =
        ex.iter().map(|e| (e.1.clone(), e.2.clone())).collect();
    assert_eq!(
        outcomes,
        [
            ("published".into(), None),
            ("published".into(), None),
            ("skipped".into(), Some("quota_full".into()))
        ]
    );
    let posts = wp.posts().await;
    let status = |id: i64| posts.iter().find(|p| p.id == id).unwrap().status.clone();
    assert_eq!(status(oldest), "publish");
    assert_eq!(status(middle), "publish");
    assert_eq!(status(newest), "pending");
    assert_eq!(status(not_ready), "draft");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicates_from_every_caller_meet_the_gate_and_write_nothing() {
    let wp = OwnedWordPress::start();
    let env = wp_env(&wp, wp.admin(), None, &["00:00"], 5).await;
    env.add_drafts("article", 3).await;
    for caller in ["planner", "manual", "backfill", "cronjob", "redis-cli"] {
        env.xadd(&[("slot", &slot(1)), ("caller", caller)]).await;
    }
    let w = env.start_workers(2, |_| {});
    env.wait_executions(5, T).await;
    w.stop().await;
    let o = env.outcomes().await;
    assert_eq!(o.get("published"), Some(&1), "{o:?}");
    assert_eq!(o.get("skipped/slot_taken"), Some(&4), "{o:?}");
    let posts = wp.posts().await;
    assert_eq!(posts.len(), 1, "one post at WordPress: {posts:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_password_is_a_clear_publish_error_and_publishes_nothing() {
    let wp = OwnedWordPress::start();
    let id = wp.create_post("Ready", "pending", None).await;
    let env = wp_env(
        &wp,
        (wp.admin().0, "xxxx xxxx xxxx xxxx xxxx xxxx"),
        Some("pending"),
        &["00:00"],
        5,
    )
    .await;
    // The mirror cannot be read with a bad password; give it the post as
    // an earlier sync would have.
    let synced = slotgate::store::sync_cms_drafts(
        &env.db.pool,
        "article",
        &[(
            id,
            "Ready".into(),
            chrono::Utc::now() - chrono::Duration::hours(1),
        )],
        true,
    )
    .await
    .unwrap();
    assert_eq!(synced.added, 1);
    run(&env, &[1], 1).await;
    let ex = executions(&env).await;
    let (_, outcome, reason, detail) = &ex[0];
    assert_eq!(
        (outcome.as_str(), reason.as_deref()),
        ("failed", Some("publish_error"))
    );
    let err = detail["publish_error"]["error"].as_str().unwrap();
    // WordPress treats an Application Password it does not know as no
    // login at all, so its answer is a 401 for the post.
    assert!(err.starts_with("HTTP 401: rest_"), "{err}");
    assert!(
        !detail.to_string().contains("xxxx"),
        "no password in the record"
    );
    assert!(wp.posts().await.iter().all(|p| p.status != "publish"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_site_check_names_a_user_who_may_not_publish_and_a_site_that_is_not_wordpress() {
    let wp = OwnedWordPress::start();
    let env = wp_env(&wp, wp.contributor(), None, &["00:00"], 5).await;
    let problems = slotgate::receiver::Receivers::for_config(&env.config, env.clock.clone())
        .check()
        .await;
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].1.contains("publish_posts"), "{problems:?}");
    // The admin passes.
    let env = wp_env(&wp, wp.admin(), None, &["00:00"], 5).await;
    let problems = slotgate::receiver::Receivers::for_config(&env.config, env.clock.clone())
        .check()
        .await;
    assert!(problems.is_empty(), "{problems:?}");
    // Something else at the address.
    let cms = testkit::cms::Cms::start().await;
    std::env::set_var("TEST_WP_PASSWORD", "x");
    let text = kind_toml(
        "article",
        &["00:00"],
        1,
        &format!(
            "http_timeout = \"{}s\"\n[kinds.wordpress]\nurl = \"{}\"\nuser = \"u\"\napp_password_env = \"TEST_WP_PASSWORD\"\n",
            Duration::from_secs(2).as_secs(),
            cms.url("/site")
        ),
    );
    let config = slotgate::config::Config::parse(std::path::Path::new("t.toml"), &text).unwrap();
    let problems = slotgate::receiver::Receivers::for_config(&config, env.clock.clone())
        .check()
        .await;
    assert!(
        problems[0].1.contains("does not answer as WordPress"),
        "{problems:?}"
    );
}

/// Slots of a kind with drafts in WordPress that arrive together go
/// through the batch path: one refresh, one gate, the picked posts'
/// WordPress ids carried out of the gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_slots_publishes_the_oldest_posts_once_each_through_the_batch() {
    let wp = OwnedWordPress::start();
    let mut ids = Vec::new();
    for i in 1..=4 {
        let date = format!("2026-01-0{i}T10:00:00");
        ids.push(
            wp.create_post(&format!("post {i}"), "pending", Some(&date))
                .await,
        );
    }
    let env = wp_env(
        &wp,
        wp.admin(),
        Some("pending"),
        &["00:00", "00:00:01", "00:00:02"],
        3,
    )
    .await;
    // Planned, as the batch gate takes planned slots only.
    env.planner().plan(Some(today()), &[], false).await.unwrap();
    for n in [1, 2, 3] {
        env.xadd(&[("slot", &slot(n)), ("caller", "planner")]).await;
    }
    sync(&env).await;
    // Every entry read before the gate, so the three form one batch.
    let exec = env.executor("w1");
    let ds = env.read_all("w1").await;
    assert_eq!(ds.len(), 3);
    assert!(ds.iter().all(|d| exec.batchable(d)));
    let decided = exec.batch(&ds).await.unwrap();
    assert_eq!(decided.len(), 3, "the batch decided every slot");
    assert_eq!(env.outcomes().await.get("published"), Some(&3));
    let posts = wp.posts().await;
    let status = |id: i64| posts.iter().find(|p| p.id == id).unwrap().status.clone();
    assert_eq!(
        ids.iter().map(|id| status(*id)).collect::<Vec<_>>(),
        ["publish", "publish", "publish", "pending"]
    );
}

/// A pending post whose title alone makes a page of the listing longer than
/// the answer limit (10,000 Cyrillic characters: WordPress escapes each as
/// `\uXXXX`, twice per title) does not stop the mirror: the page is asked
/// again smaller, every ready post is mirrored, the long title cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_page_past_the_answer_limit_is_read_smaller_not_failed() {
    let wp = OwnedWordPress::start();
    let long: String = "Ж".repeat(10_000);
    let mut ids = Vec::new();
    for (i, title) in ["first", long.as_str(), "third"].iter().enumerate() {
        let date = format!("2026-01-0{}T10:00:00", i + 1);
        ids.push(wp.create_post(title, "pending", Some(&date)).await);
    }
    let env = wp_env(&wp, wp.admin(), Some("pending"), &["00:00"], 5).await;
    sync(&env).await;
    let mirrored: Vec<(i64, String)> =
        sqlx::query_as("SELECT cms_id, title FROM draft WHERE kind = 'article' ORDER BY cms_id")
            .fetch_all(&env.db.pool)
            .await
            .unwrap();
    assert_eq!(
        mirrored.iter().map(|m| m.0).collect::<Vec<_>>(),
        ids,
        "every ready post is mirrored"
    );
    assert_eq!(mirrored[0].1, "first");
    assert_eq!(mirrored[2].1, "third");
    assert!(
        mirrored[1].1.chars().count() <= slotgate::receiver::wordpress::TITLE_LIMIT,
        "the long title is cut: {} characters",
        mirrored[1].1.chars().count()
    );
}

/// A listing that repeats an id across pages (a post moved between two
/// page reads) does not stop the mirror: the id is kept once (the upsert
/// cannot take one row twice in a statement).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_that_repeats_an_id_across_pages_is_mirrored_once() {
    let cms = testkit::cms::Cms::start().await;
    let page = |ids: std::ops::RangeInclusive<i64>| {
        let items: Vec<serde_json::Value> = ids
            .map(|id| serde_json::json!({"id": id, "date_gmt": "2026-01-01T10:00:00", "title": {"raw": format!("post {id}")}}))
            .collect();
        serde_json::Value::Array(items).to_string()
    };
    let (first, second) = (page(1..=50), page(50..=51));
    cms.set_chooser(Some(std::sync::Arc::new(move |path: &str, _, _| {
        if !path.starts_with("/wp-json/wp/v2/posts?") {
            return None;
        }
        let body = if path.contains("offset=0") {
            &first
        } else {
            &second
        };
        Some(testkit::cms::Reply::Body(
            200,
            "application/json".into(),
            body.clone(),
        ))
    })));
    let wp = wordpress_at(&cms);
    let env = Env::new(&kind_toml("article", &["00:00"], 5, &wp)).await;
    sync(&env).await;
    assert!(
        cms.calls().iter().any(|c| c.path.contains("offset=50")),
        "a second page was read: the fault happened"
    );
    let mirrored = testkit::count(
        &env.db.pool,
        "SELECT count(DISTINCT cms_id) FROM draft WHERE kind = 'article' AND status = 'ready'",
    )
    .await;
    assert_eq!(mirrored, 51);
}

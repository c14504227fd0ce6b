//! Notices (`[notify]`), with the real worker binary and a receiver that
//! records what arrives: a slot that failed, one that missed its deadline
//! and a dead letter are each told once, signed as the Standard Webhooks
//! spec says (checked here by a verifier written from the spec, not by
//! slotgate's signer); a published slot is not. A receiver that hangs
//! delays no outcome, and a leader killed while it sends leaves the event
//! to the next leader under the same `webhook-id`.

use base64::Engine;
use chrono::Utc;
use hmac::{Hmac, Mac};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use testkit::cms::{Cms, Reply};
use testkit::stack::{Bins, Stack};
use testkit::wait_for;

/// The spec's own example key (24 bytes).
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// Every request to `/notify` so far, each checked by [`verify`]: its
/// `webhook-id` and body.
fn verified_sends(cms: &testkit::cms::Cms) -> Vec<(String, Value)> {
    cms.requests()
        .iter()
        .filter(|r| r.path == "/notify")
        .map(verify)
        .collect()
}

/// Verifies one request as a Standard Webhooks receiver does: the
/// signature `v1,<base64 HMAC-SHA256 of "<id>.<ts>.<body>">` with the key
/// base64-decoded from after `whsec_`, among the space-separated
/// signatures of `webhook-signature`, and a timestamp within 5 minutes.
fn verify(r: &testkit::cms::Request) -> (String, Value) {
    let id = r.header("webhook-id").expect("webhook-id").to_owned();
    let ts = r.header("webhook-timestamp").expect("webhook-timestamp");
    let sigs = r.header("webhook-signature").expect("webhook-signature");
    let ts_n: i64 = ts.parse().expect("a Unix second");
    assert!(
        (Utc::now().timestamp() - ts_n).abs() <= 300,
        "timestamp {ts} too far from now"
    );
    let key = base64::engine::general_purpose::STANDARD
        .decode(SECRET.trim_start_matches("whsec_"))
        .unwrap();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).unwrap();
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(ts.as_bytes());
    mac.update(b".");
    mac.update(&r.raw);
    let want = format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
    );
    assert!(
        sigs.split(' ').any(|s| s == want),
        "signature {sigs} does not verify (want {want})"
    );
    assert_eq!(r.header("content-type"), Some("application/json"));
    (id, serde_json::from_slice(&r.raw).expect("a JSON body"))
}

/// A stack whose kinds all run yesterday's slots at once (a zone where
/// the test runs around noon): `web` publishes to the stand-in CMS,
/// `late` has a 1-minute starting deadline, `rec` is record-only.
async fn stack(cms: &Cms) -> (Stack, testkit::zone::Zone) {
    let zone = testkit::zone::around_noon(Utc::now(), Duration::from_secs(3 * 3600));
    let tz = zone.name();
    let config = format!(
        "[[kinds]]\nname = \"web\"\ntimezone = {tz:?}\nslots = [\"00:00\"]\njitter = \"0\"\ndaily_cap = 5\nstarting_deadline = \"7d\"\npublish_url = \"{}\"\nhttp_attempts = 1\n\
         [[kinds]]\nname = \"late\"\ntimezone = {tz:?}\nslots = [\"00:00\"]\njitter = \"0\"\ndaily_cap = 5\nstarting_deadline = \"1m\"\n\
         [[kinds]]\nname = \"rec\"\ntimezone = {tz:?}\nslots = [\"00:00\", \"00:01\"]\njitter = \"0\"\ndaily_cap = 5\nstarting_deadline = \"7d\"\n\
         [notify]\nurl = \"{}\"\nsecret_env = \"NOTIFY_SECRET\"\n",
        cms.url("/publish"),
        cms.url("/notify"),
    );
    let s = Stack::builder(Bins::beside(PathBuf::from(env!("CARGO_BIN_EXE_worker"))))
        .tag("notify")
        .env("NOTIFY_SECRET", SECRET)
        .build(&config)
        .await;
    sqlx::query(
        "INSERT INTO draft (kind, title, ready_at)
         SELECT k, k || ' ' || i, now() - interval '9 days'
           FROM UNNEST(ARRAY['web', 'late', 'rec']) k, generate_series(1, 6) i",
    )
    .execute(&s.db().pool)
    .await
    .unwrap();
    (s, zone)
}

async fn notices(pool: &sqlx::PgPool) -> Vec<(String, String, String)> {
    sqlx::query_as("SELECT msg_id, event, state FROM notice ORDER BY id")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_missed_and_dead_lettered_slots_are_told_once_signed_and_published_ones_never() {
    let cms = Cms::start().await;
    cms.script("/publish", [Reply::Status(400)]);
    let (s, zone) = stack(&cms).await;
    let pool = s.db().pool.clone();
    let yesterday = zone.day(Utc::now()) - chrono::Duration::days(1);
    s.planner(&["plan", "--day", &yesterday.to_string()]);
    let _w = s.worker("w1", &[], &[]);
    let ready = slotgate::queue::KeySpace::new(s.redis.prefix.as_str()).ready();
    s.redis.deliver(&ready, "not-a-slot-key", "test").await;
    wait_for("three notices sent", Duration::from_secs(60), || async {
        let n = notices(&pool).await;
        (n.len() == 3 && n.iter().all(|(_, _, st)| st == "sent")).then_some(n)
    })
    .await;
    // Every slot has its outcome: the published ones told nothing.
    let outcomes: Vec<(String, String, Option<String>)> =
        sqlx::query_as("SELECT kind, state, reason FROM publish_slot ORDER BY kind, slot")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        outcomes,
        vec![
            (
                "late".into(),
                "skipped".into(),
                Some("missed_deadline".into())
            ),
            ("rec".into(), "published".into(), None),
            ("rec".into(), "published".into(), None),
            ("web".into(), "failed".into(), Some("publish_error".into())),
        ]
    );
    let got = verified_sends(&cms);
    assert_eq!(got.len(), 3, "each event sent once: {got:?}");
    let ids: BTreeSet<&str> = got.iter().map(|(id, _)| id.as_str()).collect();
    let stored: BTreeSet<String> = notices(&pool)
        .await
        .into_iter()
        .map(|(id, _, _)| id)
        .collect();
    assert_eq!(ids.len(), 3, "one id per event");
    assert_eq!(ids, stored.iter().map(String::as_str).collect());
    let by_type = |t: &str| -> Value {
        got.iter()
            .find(|(_, b)| b["type"] == t)
            .unwrap_or_else(|| panic!("no {t} among {got:?}"))
            .1
            .clone()
    };
    let failed = by_type("slot.failed");
    assert_eq!(failed["data"]["slot_key"], format!("web:{yesterday}:1"));
    assert_eq!(failed["data"]["kind"], "web");
    assert_eq!(failed["data"]["day"], yesterday.to_string());
    assert_eq!(failed["data"]["outcome"], "failed");
    assert_eq!(failed["data"]["reason"], "publish_error");
    assert!(failed["timestamp"].as_str().unwrap().ends_with('Z'));
    let missed = by_type("slot.missed");
    assert_eq!(missed["data"]["slot_key"], format!("late:{yesterday}:1"));
    assert_eq!(missed["data"]["reason"], "missed_deadline");
    let dead = by_type("slot.dead_lettered");
    assert_eq!(dead["data"]["slot_key"], "not-a-slot-key");
    assert_eq!(dead["data"]["reason"], "bad_message");
    assert!(
        !got.iter().any(|(_, b)| b["data"]["kind"] == "rec"),
        "a published slot is never told"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_receiver_delays_no_outcome_and_a_killed_leaders_notice_keeps_its_id() {
    let cms = Cms::start().await;
    cms.script("/publish", [Reply::Status(400)]);
    let release = Arc::new(tokio::sync::Notify::new());
    cms.script("/notify", [Reply::Hold(release.clone(), 200)]);
    let (s, zone) = stack(&cms).await;
    let pool = s.db().pool.clone();
    let today = zone.day(Utc::now());
    let yesterday = today - chrono::Duration::days(1);
    s.planner(&["plan", "--day", &yesterday.to_string(), "--kind", "web"]);
    let mut w1 = s.worker("w1", &[], &[]);
    // The notice arrived and is the one request open (an in-flight count
    // alone was met by the publish call before its 400 was written, and
    // the outcome read below was still `publishing`).
    wait_for(
        "the notice held at the receiver",
        Duration::from_secs(60),
        || async { (cms.calls_to("/notify").len() == 1 && cms.in_flight() == 1).then_some(()) },
    )
    .await;
    // The outcome it reports was recorded before the send, and stays.
    let web = "SELECT state || '/' || coalesce(reason, '') FROM publish_slot WHERE kind = 'web'";
    let state: String = sqlx::query_scalar(web).fetch_one(&pool).await.unwrap();
    assert_eq!(state, "failed/publish_error");
    // While the receiver hangs, other slots go through: two days of `rec`
    // planned now are recorded with the notice still held.
    let before = yesterday - chrono::Duration::days(1);
    s.planner(&["plan", "--day", &before.to_string(), "--kind", "rec"]);
    wait_for("rec's slots published", Duration::from_secs(60), || async {
        let n = testkit::count(
            &pool,
            "SELECT count(*) FROM publish_slot WHERE kind = 'rec' AND state = 'published'",
        )
        .await;
        (n == 2).then_some(())
    })
    .await;
    assert_eq!(
        cms.in_flight(),
        1,
        "still held while rec's slots were recorded"
    );
    assert_eq!(cms.calls_to("/notify").len(), 1);
    // The leader dies mid-send; the next one sends the same event again.
    w1.kill_9().expect("w1 was running");
    let _w2 = s.worker("w2", &[], &[]);
    wait_for(
        "the notice sent by the next leader",
        Duration::from_secs(60),
        || async {
            let n = notices(&pool).await;
            (n.len() == 1 && n[0].2 == "sent").then_some(())
        },
    )
    .await;
    release.notify_one();
    let sends = verified_sends(&cms);
    assert_eq!(sends.len(), 2, "sent, cut off, sent again: {sends:?}");
    let stored = notices(&pool).await;
    assert_eq!(sends[0].0, sends[1].0, "one webhook-id across the resend");
    assert_eq!(sends[0].0, stored[0].0);
    assert_eq!(sends[0].1, sends[1].1, "the same body");
    assert_eq!(sends[0].1["type"], "slot.failed");
    let state: String = sqlx::query_scalar(web).fetch_one(&pool).await.unwrap();
    assert_eq!(state, "failed/publish_error", "no outcome changed");
    assert_eq!(
        testkit::count(&pool, "SELECT count(*) FROM execution WHERE kind = 'web'").await,
        1,
        "the failed slot ran once"
    );
}

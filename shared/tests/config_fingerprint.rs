//! A planner and workers on different configs disagree on which slots
//! exist: each worker stores its config fingerprint with its clock, and
//! `planner status` (and the console, through the same `Status`) flags a
//! worker whose fingerprint is not the reader's.

use crate::common;

use crate::common::{kind_toml, Env};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_flags_a_worker_on_another_config() {
    let env = Env::new(&kind_toml("article", &["09:00", "12:00"], 5, "")).await;
    let ours = env.config.fingerprint();
    let old = slotgate::config::Config::parse(
        std::path::Path::new("old.toml"),
        &kind_toml("article", &["09:00"], 5, ""),
    )
    .unwrap()
    .fingerprint();
    assert_ne!(ours, old);
    slotgate::store::record_worker_clock(&env.db.pool, "same", 0, 1, &ours)
        .await
        .unwrap();
    slotgate::store::record_worker_clock(&env.db.pool, "stale", 0, 1, &old)
        .await
        .unwrap();
    let mut s = slotgate::report::full_status(&env.queue, &env.db.pool, &env.clock)
        .await
        .unwrap();
    s.compare_config(ours.clone());
    assert_eq!(s.config_mismatches(), ["stale"]);
    let text = s.render();
    let line = text
        .lines()
        .find(|l| l.contains("stale") && l.contains("config"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("WARN") && line.contains(&old) && line.contains(&ours),
        "{line}"
    );
    assert!(
        !text
            .lines()
            .any(|l| l.contains("same") && l.contains("WARN")),
        "{text}"
    );
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["clocks"]["stale"]["config_differs"], true, "{json}");
    assert_eq!(json["clocks"]["same"]["config_differs"], false, "{json}");
    assert_eq!(json["config"], ours.as_str());
}

/// A running worker stores the fingerprint of the config it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stores_its_config_fingerprint() {
    let env = Env::new(&kind_toml("article", &["09:00"], 5, "")).await;
    let w = env.start_workers(1, |_| {});
    let stored: String = testkit::wait_for("the worker's fingerprint", common::T, || async {
        sqlx::query_scalar::<_, Option<String>>(
            "SELECT config FROM worker_clock WHERE worker_id = 'w0'",
        )
        .fetch_optional(&env.db.pool)
        .await
        .unwrap()
        .flatten()
    })
    .await;
    w.stop().await;
    assert_eq!(stored, env.config.fingerprint());
}

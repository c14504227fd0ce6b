//! `slotgate-bench wordpress`: what a WordPress publish costs per slot
//! against the webhook path, with the WordPress calls alone as the
//! baseline, all in the same run against testkit's throwaway WordPress.
//!
//! Three rows per run, each `slots` slots already due, one worker with the
//! same `--concurrency`:
//!
//! - **webhook**: a `publish_url` kind against the stand-in CMS (answers at
//!   once): slotgate's own cost per slot;
//! - **wordpress**: a kind whose drafts are WordPress posts in `pending`:
//!   slotgate plus one status read and one write per slot (and one listing
//!   of the kind's ready posts per `refresh_every`);
//! - **calls alone**: the same read and write (`GET posts/<id>?context=edit`,
//!   `POST posts/<id>` `{"status": "publish"}`) sent by the bench itself,
//!   as many in flight as the worker may have, on posts no kind takes.
//!
//! The overhead of WordPress is `wordpress − webhook` per slot; set against
//! `calls alone` it says how much of it is WordPress's own time.

use crate::figures::{emit, median};
use crate::stack::Stack;
use anyhow::{bail, ensure, Context, Result};
use chrono::Utc;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testkit::cms::Cms;
use testkit::process::Proc;
use testkit::server::OwnedWordPress;

/// The variable the worker reads the application password from.
const PASSWORD_ENV: &str = "BENCH_WP_PASSWORD";

/// Milliseconds per slot, first start to last finish, of `slots` due slots
/// of the stack's one kind `k0`, through one worker.
async fn through_worker(stack: &Stack, slots: usize, concurrency: usize) -> Result<f64> {
    let n = stack.plan(Utc::now().date_naive()).await? as i64;
    ensure!(n == slots as i64, "planned {n} slots, wanted {slots}");
    let conc = concurrency.to_string();
    let mut procs: Vec<Proc> =
        vec![stack.worker("wp0", &["--concurrency", &conc, "--lease-ttl", "3s"])];
    let done = stack
        .wait_count(
            "SELECT count(*) FROM execution",
            n,
            Duration::from_secs(600),
        )
        .await;
    crate::stack::stop_all(&mut procs);
    done?;
    let published = stack
        .count("SELECT count(*) FROM execution WHERE outcome = 'published'")
        .await;
    if published != n {
        bail!(
            "{published} of {n} slots published (see {})",
            stack.dir.display()
        );
    }
    let secs: f64 = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at))::float8 FROM execution",
    )
    .fetch_one(&stack.db.pool)
    .await?;
    Ok(secs * 1000.0 / n as f64)
}

fn one_kind(slots: usize, extra: &str) -> String {
    crate::stack::kinds_toml(1, slots, &|_| "00:00:00".into(), "0", slots, extra)
}

/// The webhook row.
async fn webhook(cms: &Cms, slots: usize, concurrency: usize) -> Result<f64> {
    let stack = Stack::new(&one_kind(
        slots,
        &format!("publish_url = \"{}\"", cms.url("/publish")),
    ))
    .await?;
    stack.drafts("k0", slots).await?;
    through_worker(&stack, slots, concurrency).await
}

/// The WordPress row: `slots` new posts in `pending`, published in place.
async fn wordpress(wp: &OwnedWordPress, slots: usize, concurrency: usize) -> Result<f64> {
    for i in 0..slots {
        wp.create_post(&format!("bench post {i}"), "pending", None)
            .await;
    }
    let user = wp.admin().0;
    let extra = format!(
        "[kinds.wordpress]\nurl = \"{}\"\nuser = \"{user}\"\napp_password_env = \"{PASSWORD_ENV}\"\ndrafts = \"pending\"",
        wp.url()
    );
    let stack = Stack::new(&one_kind(slots, &extra)).await?;
    through_worker(&stack, slots, concurrency).await
}

/// The calls alone: `slots` posts in `draft` (no kind takes that status),
/// each read and then published by the bench, `concurrency` at a time.
async fn calls_alone(wp: &OwnedWordPress, slots: usize, concurrency: usize) -> Result<f64> {
    let mut ids = Vec::new();
    for i in 0..slots {
        ids.push(
            wp.create_post(&format!("bench call {i}"), "draft", None)
                .await,
        );
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let (user, password) = wp.admin();
    let (user, password) = (Arc::new(user.to_owned()), Arc::new(password.to_owned()));
    let api = format!("{}/wp-json/wp/v2", wp.url());
    let queue = Arc::new(std::sync::Mutex::new(ids));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (http, user, password, api, queue) = (
            http.clone(),
            user.clone(),
            password.clone(),
            api.clone(),
            queue.clone(),
        );
        tasks.spawn(async move {
            loop {
                let Some(id) = queue.lock().unwrap().pop() else {
                    return Ok::<(), anyhow::Error>(());
                };
                let read = http
                    .get(format!("{api}/posts/{id}?context=edit&_fields=id,status,link"))
                    .basic_auth(user.as_str(), Some(password.as_str()))
                    .send()
                    .await?;
                ensure!(read.status().is_success(), "read post {id}: {}", read.status());
                let write = http
                    .post(format!("{api}/posts/{id}?_fields=id,status,link"))
                    .basic_auth(user.as_str(), Some(password.as_str()))
                    .json(&json!({"status": "publish", "date_gmt": Utc::now().format("%Y-%m-%dT%H:%M:%S").to_string()}))
                    .send()
                    .await?;
                ensure!(write.status().is_success(), "publish post {id}: {}", write.status());
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.context("a call task")??;
    }
    Ok(started.elapsed().as_secs_f64() * 1000.0 / slots as f64)
}

pub async fn run(slots: usize, concurrency: usize, runs: usize) -> Result<serde_json::Value> {
    let wp = tokio::task::spawn_blocking(OwnedWordPress::launch)
        .await?
        .context(
            "starting the test WordPress (Debian's wordpress, mariadb-server, php-cli, php-mysql)",
        )?;
    // The config (loaded here and by the worker) names the variable; the
    // worker inherits it. Set before any task runs.
    std::env::set_var(PASSWORD_ENV, wp.admin().1);
    let cms = Cms::start().await;
    let (mut hook, mut press, mut alone) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        // Alternate the order, so neither row always runs on a warmer site.
        if run % 2 == 0 {
            hook.push(webhook(&cms, slots, concurrency).await?);
            press.push(wordpress(&wp, slots, concurrency).await?);
        } else {
            press.push(wordpress(&wp, slots, concurrency).await?);
            hook.push(webhook(&cms, slots, concurrency).await?);
        }
        alone.push(calls_alone(&wp, slots, concurrency).await?);
        eprintln!(
            "run {}: webhook {:.2} ms/slot, wordpress {:.2}, calls alone {:.2}",
            run + 1,
            hook[run],
            press[run],
            alone[run]
        );
    }
    let (h, p, a) = (median(&mut hook), median(&mut press), median(&mut alone));
    let overhead = p - h;
    println!(
        "\n## WordPress publish: {slots} due slots, 1 worker, --concurrency {concurrency}; median of {runs} runs\n"
    );
    println!("| path | ms per slot |\n|---|---|");
    println!("| webhook (stand-in CMS, answers at once) | {h:.2} |");
    println!("| WordPress, drafts in WordPress (read + write per slot) | {p:.2} |");
    println!("| the same read + write alone, {concurrency} in flight | {a:.2} |");
    println!(
        "\noverhead of WordPress per slot: {overhead:.2} ms ({:.2}x the calls alone)",
        overhead / a
    );
    let v = json!({
        "slots": slots, "concurrency": concurrency, "runs": runs,
        "webhook_ms_per_slot": h, "wordpress_ms_per_slot": p, "calls_alone_ms_per_slot": a,
        "overhead_ms_per_slot": overhead, "overhead_over_calls": overhead / a,
    });
    emit("wordpress", v.clone());
    Ok(v)
}

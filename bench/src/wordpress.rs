//! `slotgate-bench wordpress`: what a WordPress publish costs per slot
//! against the webhook path, with the WordPress calls alone as the
//! baselines, all in the same run against testkit's throwaway WordPress.
//!
//! Six rows per run, each `slots` slots, as many in flight as one worker
//! with the same `--concurrency` may have:
//!
//! - **webhook**: a `publish_url` kind against the stand-in CMS (answers at
//!   once): slotgate's own cost per slot;
//! - **wordpress, drafts in WordPress**: a kind whose drafts are WordPress
//!   posts in `pending`: slotgate plus one status read and one write per
//!   slot (and one listing of the kind's ready posts per `refresh_every`);
//! - **wordpress, drafts in slotgate**: a kind without `drafts`, its drafts
//!   in slotgate's table: slotgate plus stage, look-up, publish per slot
//!   (`attempt_marker` in `shared/src/receiver/wordpress.rs`, issue 38);
//! - **calls alone**: the read and write of drafts in WordPress
//!   (`GET posts/<id>?context=edit`, `POST posts/<id>`
//!   `{"status": "publish"}`) sent by the bench itself on posts no kind
//!   takes;
//! - **old sequence alone**: what drafts in slotgate cost before issue 38,
//!   sent by the bench: `GET posts?slug=<m>,<m>__trashed&status=…`, then
//!   `POST posts` `{"status": "publish", "slug": <m>, …}`;
//! - **new sequence alone**: what they cost now, sent by the bench:
//!   `POST posts` `{"status": "draft", "slug": <m>, …}`,
//!   `GET posts?slug=<m>,…&author=<me>&status=…`, `POST posts/<id>`
//!   `{"status": "publish", "slug": <m>}`.
//!
//! The overhead of WordPress is `wordpress − webhook` per slot; set against
//! the calls alone it says how much of it is WordPress's own time. `new
//! sequence − old sequence` is what the extra request of stage-then-publish
//! costs per slot.

use crate::figures::{emit, median};
use crate::stack::Stack;
use anyhow::{bail, ensure, Context, Result};
use chrono::Utc;
use serde_json::{json, Value};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testkit::cms::Cms;
use testkit::process::Proc;
use testkit::server::OwnedWordPress;

/// The variable the worker reads the application password from.
const PASSWORD_ENV: &str = "BENCH_WP_PASSWORD";

/// What the receiver asks for, copied from `shared/src/receiver/wordpress.rs`
/// (private there) so the bench's sequences send the worker's requests:
/// every status a post can have,
const ALL_STATUSES: &str = "publish,future,draft,pending,private,trash";
/// the fields of a post the new sequence reads,
const POST_FIELDS: &str = "id,status,link,slug,author,date_gmt,modified_gmt";
/// and the highest `-N` suffix a marker is looked up under.
const SUFFIXES: u32 = 4;

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
            &mut procs,
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
            stack.kit.dir.display()
        );
    }
    let secs: f64 = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM max(finished_at) - min(started_at))::float8 FROM execution",
    )
    .fetch_one(&stack.db().pool)
    .await?;
    Ok(secs * 1000.0 / n as f64)
}

fn one_kind(slots: usize, extra: &str) -> String {
    crate::stack::kinds_toml(1, slots, &|_| "00:00:00".into(), "0", slots, extra)
}

/// The `[kinds.wordpress]` table of the bench's site, plus `more`.
fn wordpress_toml(wp: &OwnedWordPress, more: &str) -> String {
    format!(
        "[kinds.wordpress]\nurl = \"{}\"\nuser = \"{}\"\napp_password_env = \"{PASSWORD_ENV}\"\n{more}",
        wp.url(),
        wp.admin().0
    )
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

/// The row of drafts in WordPress: `slots` new posts in `pending`,
/// published in place.
async fn wordpress(wp: &OwnedWordPress, slots: usize, concurrency: usize) -> Result<f64> {
    for i in 0..slots {
        wp.create_post(&format!("bench post {i}"), "pending", None)
            .await;
    }
    // The mirror reads at most `sync_limit` (100 by default) ready posts:
    // raised for more slots, or the rest would find no draft.
    let mut drafts = "drafts = \"pending\"".to_owned();
    if slots > 100 {
        ensure!(
            slots <= 1000,
            "--slots above 1000 (WordPress's sync_limit at most)"
        );
        drafts.push_str(&format!("\nsync_limit = {slots}"));
    }
    let stack = Stack::new(&one_kind(slots, &wordpress_toml(wp, &drafts))).await?;
    through_worker(&stack, slots, concurrency).await
}

/// The row of drafts in slotgate: no `drafts` key, `slots` drafts in
/// slotgate's table, each slot's post staged, found and published by the
/// worker. Every stack has the same kind `k0` and `jitter_seed`, so the
/// slug template carries `tag` (the run's own): a marker of an earlier
/// run's post would be found published and nothing sent. Checks that each
/// slot made exactly one public post.
async fn in_slotgate(
    wp: &OwnedWordPress,
    slots: usize,
    concurrency: usize,
    tag: &str,
) -> Result<f64> {
    let slug = format!("slug = \"{tag}-{{kind}}-{{day}}-{{slot}}\"");
    let stack = Stack::new(&one_kind(slots, &wordpress_toml(wp, &slug))).await?;
    stack.drafts("k0", slots).await?;
    let ms = through_worker(&stack, slots, concurrency).await?;
    let public = wp
        .posts()
        .await
        .into_iter()
        .filter(|p| p.status == "publish" && p.slug.starts_with(&format!("{tag}-k0-")))
        .count();
    ensure!(
        public == slots,
        "drafts in slotgate: {public} public posts for {slots} slots"
    );
    Ok(ms)
}

/// The bench's own REST client for the calls alone: the administrator's
/// Application Password, every answer checked for a 2xx and read as JSON.
#[derive(Clone)]
struct Rest {
    http: reqwest::Client,
    api: Arc<str>,
    user: Arc<str>,
    password: Arc<str>,
}

impl Rest {
    fn new(wp: &OwnedWordPress) -> Result<Rest> {
        let (user, password) = wp.admin();
        Ok(Rest {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()?,
            api: format!("{}/wp-json/wp/v2", wp.url()).into(),
            user: user.into(),
            password: password.into(),
        })
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}/{path}", self.api))
            .basic_auth(&*self.user, Some(&*self.password));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let answer = req
            .send()
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = answer.status();
        let text = answer.text().await?;
        ensure!(status.is_success(), "{method} {path}: {status} {text}");
        serde_json::from_str(&text).with_context(|| format!("{method} {path}: {text}"))
    }

    async fn get(&self, path: &str) -> Result<Value> {
        self.call(reqwest::Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value> {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }
}

/// `date_gmt` as the receiver sends it.
fn now_gmt() -> String {
    Utc::now().format("%Y-%m-%dT%H:%M:%S").to_string()
}

/// Runs `each` on every item, `concurrency` at a time → milliseconds per
/// item, from the first call to the last answer.
async fn alone<T, F, Fut>(items: Vec<T>, concurrency: usize, rest: &Rest, each: F) -> Result<f64>
where
    T: Send + 'static,
    F: Fn(Rest, T) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<()>> + Send,
{
    let n = items.len();
    let queue = Arc::new(Mutex::new(items));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (rest, queue, each) = (rest.clone(), queue.clone(), each.clone());
        tasks.spawn(async move {
            loop {
                let Some(item) = queue.lock().unwrap().pop() else {
                    return Ok::<(), anyhow::Error>(());
                };
                each(rest.clone(), item).await?;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.context("a call task")??;
    }
    Ok(started.elapsed().as_secs_f64() * 1000.0 / n as f64)
}

/// The calls alone of drafts in WordPress: `slots` posts in `draft` (no
/// kind takes that status), each read and then published by the bench.
async fn calls_alone(
    wp: &OwnedWordPress,
    rest: &Rest,
    slots: usize,
    concurrency: usize,
) -> Result<f64> {
    let mut ids = Vec::new();
    for i in 0..slots {
        ids.push(
            wp.create_post(&format!("bench call {i}"), "draft", None)
                .await,
        );
    }
    alone(ids, concurrency, rest, |rest, id| async move {
        rest.get(&format!("posts/{id}?context=edit&_fields=id,status,link"))
            .await?;
        rest.post(
            &format!("posts/{id}?_fields=id,status,link"),
            json!({"status": "publish", "date_gmt": now_gmt()}),
        )
        .await?;
        Ok(())
    })
    .await
}

/// The markers of one sequence's slots: `<tag>-<i>`, the run's own.
fn markers(tag: &str, slots: usize) -> Vec<String> {
    (0..slots).map(|i| format!("{tag}-{i}")).collect()
}

/// Checks that a create or status change left the post public.
fn published(p: &Value, what: &str) -> Result<()> {
    ensure!(p["status"] == "publish", "{what}: saved as {}", p["status"]);
    Ok(())
}

/// The old sequence of drafts in slotgate, sent alone: look the marker up,
/// then create the post as `publish` carrying it (the receiver before
/// `901309c`).
async fn old_alone(rest: &Rest, slots: usize, concurrency: usize, tag: &str) -> Result<f64> {
    alone(markers(tag, slots), concurrency, rest, |rest, m| async move {
        let found = rest
            .get(&format!(
                "posts?slug={m},{m}__trashed&status={ALL_STATUSES}&context=edit&_fields=id,status,link,slug&per_page=10"
            ))
            .await?;
        ensure!(
            found.as_array().is_some_and(Vec::is_empty),
            "marker {m} already taken: {found}"
        );
        let p = rest
            .post(
                "posts?_fields=id,status,link",
                json!({"title": format!("bench {m}"), "content": "", "status": "publish", "slug": m, "date_gmt": now_gmt()}),
            )
            .await?;
        published(&p, &m)
    })
    .await
}

/// The new sequence of drafts in slotgate, sent alone: stage the post as a
/// `draft` carrying the marker, find the slot's posts by the marker (this
/// user's, every `-N` and trashed form), publish the staged one by a
/// status change that sets the marker again (`attempt_marker`).
async fn new_alone(
    rest: &Rest,
    me: i64,
    slots: usize,
    concurrency: usize,
    tag: &str,
) -> Result<f64> {
    alone(markers(tag, slots), concurrency, rest, move |rest, m| async move {
        let staged = rest
            .post(
                &format!("posts?_fields={POST_FIELDS}"),
                json!({"title": format!("bench {m}"), "content": "", "status": "draft", "slug": m}),
            )
            .await?;
        let id = staged["id"].as_i64().context("a staged post without an id")?;
        let mut slugs = vec![m.clone()];
        slugs.extend((2..=SUFFIXES).map(|n| format!("{m}-{n}")));
        let trashed: Vec<String> = slugs.iter().map(|s| format!("{s}__trashed")).collect();
        slugs.extend(trashed);
        let found = rest
            .get(&format!(
                "posts?slug={}&author={me}&status={ALL_STATUSES}&context=edit&_fields={POST_FIELDS}&per_page=100&orderby=id&order=asc",
                slugs.join(",")
            ))
            .await?;
        ensure!(
            found
                .as_array()
                .is_some_and(|a| a.len() == 1 && a[0]["id"] == id && a[0]["slug"] == m.as_str()),
            "marker {m}: found {found}, staged {id}"
        );
        let p = rest
            .post(
                &format!("posts/{id}?_fields={POST_FIELDS}"),
                json!({"status": "publish", "date_gmt": now_gmt(), "slug": m}),
            )
            .await?;
        published(&p, &m)
    })
    .await
}

/// The rows of one run, in the order of its first run (and of `ROWS`).
#[derive(Clone, Copy)]
enum Row {
    Webhook,
    InWordPress,
    InSlotgate,
    CallsAlone,
    OldAlone,
    NewAlone,
}

const ROWS: [Row; 6] = [
    Row::Webhook,
    Row::InWordPress,
    Row::InSlotgate,
    Row::CallsAlone,
    Row::OldAlone,
    Row::NewAlone,
];

impl Row {
    fn label(self, concurrency: usize) -> String {
        match self {
            Row::Webhook => "webhook (stand-in CMS, answers at once)".into(),
            Row::InWordPress => "WordPress, drafts in WordPress (read + write per slot)".into(),
            Row::InSlotgate => {
                "WordPress, drafts in slotgate (stage, look up, publish per slot)".into()
            }
            Row::CallsAlone => format!("calls alone: read + write, {concurrency} in flight"),
            Row::OldAlone => {
                format!("old sequence alone: look up + create as publish, {concurrency} in flight")
            }
            Row::NewAlone => {
                format!("new sequence alone: stage + look up + publish, {concurrency} in flight")
            }
        }
    }

    fn key(self) -> &'static str {
        match self {
            Row::Webhook => "webhook",
            Row::InWordPress => "wordpress",
            Row::InSlotgate => "wordpress_in_slotgate",
            Row::CallsAlone => "calls_alone",
            Row::OldAlone => "old_sequence_alone",
            Row::NewAlone => "new_sequence_alone",
        }
    }
}

/// The Application Password's user id (`users/me`), which the new
/// sequence's look-up names as the author.
async fn me(rest: &Rest) -> Result<i64> {
    rest.get("users/me?_fields=id")
        .await?
        .get("id")
        .and_then(Value::as_i64)
        .context("users/me without an id")
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
    let rest = Rest::new(&wp)?;
    let me = me(&rest).await?;
    let mut ms: Vec<Vec<f64>> = vec![Vec::new(); ROWS.len()];
    for run in 0..runs {
        // Alternate the order, so no row always runs on a warmer (or a
        // fuller) site: the rows as listed, then backwards.
        let mut order: Vec<usize> = (0..ROWS.len()).collect();
        if run % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let tag = format!("r{}", run + 1);
            let took = match ROWS[i] {
                Row::Webhook => webhook(&cms, slots, concurrency).await?,
                Row::InWordPress => wordpress(&wp, slots, concurrency).await?,
                Row::InSlotgate => in_slotgate(&wp, slots, concurrency, &tag).await?,
                Row::CallsAlone => calls_alone(&wp, &rest, slots, concurrency).await?,
                Row::OldAlone => {
                    old_alone(&rest, slots, concurrency, &format!("old-{tag}")).await?
                }
                Row::NewAlone => {
                    new_alone(&rest, me, slots, concurrency, &format!("new-{tag}")).await?
                }
            };
            ms[i].push(took);
        }
        let line: Vec<String> = ROWS
            .iter()
            .zip(&ms)
            .map(|(r, v)| format!("{} {:.2}", r.key(), v[run]))
            .collect();
        eprintln!("run {} (ms/slot): {}", run + 1, line.join(", "));
    }
    let per_run = ms.clone();
    let med: Vec<f64> = ms.iter_mut().map(|v| median(v)).collect();
    // `ROWS` lists the rows in declaration order: a row's index is its
    // discriminant.
    let at = |r: Row| med[r as usize];
    let runs_of = |r: Row| &per_run[r as usize];
    let (h, p, s) = (at(Row::Webhook), at(Row::InWordPress), at(Row::InSlotgate));
    let (a, o, n) = (at(Row::CallsAlone), at(Row::OldAlone), at(Row::NewAlone));
    // Ratios of the medians, and the median of the per-run ratios (each
    // within one run).
    let per_run_ratio = |x: Row, y: Row| -> Vec<f64> {
        runs_of(x)
            .iter()
            .zip(runs_of(y))
            .map(|(a, b)| a / b)
            .collect()
    };
    let mut new_over_old = per_run_ratio(Row::NewAlone, Row::OldAlone);
    let mut staged_over_hook = per_run_ratio(Row::InSlotgate, Row::Webhook);
    let (overhead, staged_overhead) = (p - h, s - h);
    println!(
        "\n## WordPress publish: {slots} due slots, 1 worker, --concurrency {concurrency}; median of {runs} runs\n"
    );
    let heads: Vec<String> = (1..=runs).map(|r| format!("run {r}")).collect();
    println!("| path | {} | median ms per slot |", heads.join(" | "));
    println!("|---|{}---|", "---|".repeat(runs));
    for (i, r) in ROWS.iter().enumerate() {
        let cells: Vec<String> = per_run[i].iter().map(|v| format!("{v:.2}")).collect();
        println!(
            "| {} | {} | {:.2} |",
            r.label(concurrency),
            cells.join(" | "),
            med[i]
        );
    }
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.2}"))
            .collect::<Vec<_>>()
            .join(" / ")
    };
    println!(
        "\nnew sequence / old sequence: {:.2}x (per run {}); the extra request costs {:.2} ms per slot",
        n / o,
        fmt(&new_over_old),
        n - o
    );
    println!(
        "drafts in slotgate / webhook: {:.1}x (per run {})",
        s / h,
        fmt(&staged_over_hook)
    );
    println!(
        "overhead of WordPress per slot: drafts in WordPress {overhead:.2} ms ({:.2}x the calls alone), drafts in slotgate {staged_overhead:.2} ms ({:.2}x the new sequence alone)",
        overhead / a,
        staged_overhead / n
    );
    let v = json!({
        "slots": slots, "concurrency": concurrency, "runs": runs,
        "webhook_ms_per_slot": h, "wordpress_ms_per_slot": p, "calls_alone_ms_per_slot": a,
        "overhead_ms_per_slot": overhead, "overhead_over_calls": overhead / a,
        "wordpress_in_slotgate_ms_per_slot": s,
        "old_sequence_alone_ms_per_slot": o, "new_sequence_alone_ms_per_slot": n,
        "new_over_old": n / o, "new_over_old_median_per_run": median(&mut new_over_old),
        "new_minus_old_ms_per_slot": n - o,
        "in_slotgate_over_webhook": s / h,
        "in_slotgate_over_webhook_median_per_run": median(&mut staged_over_hook),
        "in_slotgate_overhead_ms_per_slot": staged_overhead,
        "in_slotgate_overhead_over_new_sequence": staged_overhead / n,
        "per_run_ms_per_slot": ROWS.iter().zip(&per_run).map(|(r, v)| (r.key().to_owned(), json!(v))).collect::<serde_json::Map<_, _>>(),
    });
    emit("wordpress", v.clone());
    Ok(v)
}

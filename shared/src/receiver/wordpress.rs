//! WordPress as a kind's CMS, through its REST API (`<url>/wp-json/wp/v2`)
//! with an Application Password (HTTP Basic).
//!
//! WordPress has no idempotency keys: two `POST`s make two posts. So this
//! receiver never writes without reading first, on every try:
//!
//! - **Drafts in WordPress** (`drafts = "pending" | "draft"`): the post
//!   bound to the slot is read (`GET posts/<id>?context=edit`). Already
//!   `publish` → recorded `published` with its `link`, nothing written (an
//!   earlier try applied it and its answer was lost). Still in the ready
//!   status → one write, `POST posts/<id>` `{"status": "publish",
//!   "date_gmt": <now>}`, so it appears at the top. Anything else (pulled
//!   back, trashed — a REST update of a trashed post would restore it —,
//!   deleted: `404`) → [`Effect::Withdrawn`], nothing written.
//! - **Drafts in slotgate** (no `drafts` key): each publish creates a post
//!   whose slug is the slot's marker ([`crate::config::SlugTemplate`]). The
//!   marker is looked up first (`GET posts?slug=<m>,<m>__trashed&status=…`,
//!   every status, trash included): found → recorded `published` with that
//!   post's link and the status seen, no second post. Not found → one
//!   create, `POST posts` with the title, the body, `status: publish` and
//!   the slug.
//!
//! A try that times out, breaks, or meets a 5xx/408/429 is followed by
//! backoff and the same read again, never by a blind write. `401`/`403`
//! fail at once as `publish_error` with WordPress's `code` and `message`.
//! Each read-then-write is one attempt of the kind's `http_attempts`.
//!
//! [`WordPress::sync`] mirrors a kind's ready posts into the draft table
//! (`planner drafts sync`, and [`WordPress::refresh`] before a gate);
//! [`WordPress::check`] is `planner check`'s and the worker's start-up
//! look at the site. The password is sent as Basic auth only and never
//! logged, stored or shown.

use super::webhook::{
    attempt_metric, plain_error, send, send_with, Answer, CallFailure, CallReport,
};
use super::{back_off, Call, Effect, Published, Receiver, RefreshError};
use crate::config::{WordPressConfig, WpDraftStatus, WpDrafts};
use crate::untrusted;
use chrono::{DateTime, NaiveDateTime, Utc};
use futures_util::future::BoxFuture;
use rand::rngs::StdRng;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The statuses a slug look-up asks for: every status a post can have.
const ALL_STATUSES: &str = "publish,future,draft,pending,private,trash";

/// Posts per page when listing drafts: small enough that a page of long
/// titles stays inside the answer limit.
const LIST_PAGE: u32 = 50;

/// The longest title kept of a mirrored post (characters).
pub const TITLE_LIMIT: usize = 1000;

/// A kind's WordPress site.
#[derive(Debug, Clone)]
pub struct WordPress {
    /// The kind whose drafts this site holds (the mirror's `draft.kind`).
    kind: String,
    config: WordPressConfig,
    client: reqwest::Client,
    /// The kind's `http_timeout`: the limit of each request.
    timeout: Duration,
    /// When this process last refreshed the kind's drafts; held across a
    /// refresh, so concurrent deliveries wait for it instead of gating on
    /// the table before it.
    refreshed: Arc<tokio::sync::Mutex<Option<Instant>>>,
}

/// A post as a look-up sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Post {
    /// WordPress's post id.
    pub id: i64,
    /// `publish`, `pending`, `draft`, `trash`, …
    pub status: String,
    /// The post's URL (its permalink once published).
    pub link: String,
}

/// A ready post, for the draft mirror.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadyPost {
    /// WordPress's post id.
    pub id: i64,
    /// `date_gmt`: "oldest" means this, then the id.
    pub date_gmt: DateTime<Utc>,
    /// The raw title, cut at [`TITLE_LIMIT`] characters.
    pub title: String,
}

/// The oldest ready posts, and whether that is all of them.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadyPosts {
    /// Oldest first (by `date_gmt`, then id).
    pub posts: Vec<ReadyPost>,
    /// Every ready post is in `posts` (the site had no more than the
    /// limit): a mirrored post missing from it is no longer ready.
    pub complete: bool,
}

/// Where a publish lands: the mirrored post, or the slug of a post to
/// create. Fixed for the whole publish, so every attempt looks up and
/// writes the same thing.
enum Target {
    /// A post in WordPress that should be in `ready` status.
    Post(i64, WpDraftStatus),
    /// A post to create with this slug (the slot's marker).
    Slug(String),
}

/// `HTTP <status>: <code>: <message>` of a WordPress error answer (its
/// whole body), else the plain description.
fn wp_error(status: u16, body: &[u8]) -> String {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) if v.get("code").is_some() => format!(
            "HTTP {status}: {}: {}",
            v["code"].as_str().unwrap_or(""),
            untrusted::truncate(v["message"].as_str().unwrap_or(""))
        ),
        _ => plain_error(status, body),
    }
}

fn post_of(v: &Value) -> Option<Post> {
    Some(Post {
        id: v.get("id")?.as_i64()?,
        status: v.get("status")?.as_str()?.to_owned(),
        link: v
            .get("link")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
    })
}

/// The whole answer as JSON: an answer cut at the limit, or not JSON, is a
/// failure.
fn json_of(a: Answer) -> Result<Value, CallFailure> {
    if a.cut {
        return Err(CallFailure::transport(
            Some(a.status),
            "WordPress's answer was longer than the answer limit".into(),
        ));
    }
    if a.json.is_null() {
        return Err(CallFailure {
            status: Some(a.status),
            error: format!(
                "WordPress answered with something that is not JSON: {}",
                untrusted::truncate(&a.text)
            ),
            retryable: false,
            location: None,
        });
    }
    Ok(a.json)
}

/// The post an answer describes.
fn post_in(a: Answer) -> Result<Post, CallFailure> {
    let status = a.status;
    post_of(&json_of(a)?).ok_or_else(|| CallFailure {
        status: Some(status),
        error: "WordPress's answer has no post id and status".into(),
        retryable: false,
        location: None,
    })
}

/// `YYYY-MM-DDTHH:MM:SS`, as WordPress takes and gives `date_gmt`.
fn wp_date(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%S").to_string()
}

impl WordPress {
    /// The site of `kind`, called through `client` (the kind's CA), each
    /// request under `timeout` (the kind's `http_timeout`).
    pub fn new(
        kind: &str,
        config: WordPressConfig,
        client: reqwest::Client,
        timeout: Duration,
    ) -> Self {
        Self {
            kind: kind.to_owned(),
            config,
            client,
            timeout,
            refreshed: Arc::default(),
        }
    }

    /// Mirrors the site's ready posts into the kind's drafts
    /// ([`crate::store::sync_cms_drafts`]): at most `sync_limit` of the
    /// oldest, in pages of 50. `Ok(None)` for a site whose drafts live in
    /// slotgate.
    pub async fn sync(
        &self,
        pool: &sqlx::PgPool,
    ) -> Result<Option<crate::store::Synced>, RefreshError> {
        let WpDrafts::InWordPress(status) = self.config.drafts else {
            return Ok(None);
        };
        let ready = self
            .list_ready(status, self.config.sync_limit)
            .await
            .map_err(RefreshError::Cms)?;
        let posts: Vec<(i64, String, DateTime<Utc>)> = ready
            .posts
            .into_iter()
            .map(|p| (p.id, p.title, p.date_gmt))
            .collect();
        Ok(Some(
            crate::store::sync_cms_drafts(pool, &self.kind, &posts, ready.complete).await?,
        ))
    }

    /// [`WordPress::sync`] before a gate, at most once per `refresh_every`
    /// per process (also after a failure, so a site that is down is not
    /// asked once per delivery). Concurrent callers wait for a refresh in
    /// progress. A failure is logged, not returned: the gate still runs on
    /// the mirror as it is, which holds only posts that were ready, and the
    /// read before the write catches any that no longer are.
    pub async fn refresh(&self, pool: &sqlx::PgPool) {
        if !matches!(self.config.drafts, WpDrafts::InWordPress(_)) {
            return;
        }
        let mut last = self.refreshed.lock().await;
        if last.is_some_and(|t| t.elapsed() < self.config.refresh_every) {
            return;
        }
        *last = Some(Instant::now());
        let kind = self.kind.as_str();
        match self.sync(pool).await {
            Ok(Some(s)) => tracing::debug!(
                kind,
                added = s.added,
                updated = s.updated,
                unreadied = s.unreadied,
                "WordPress drafts refreshed"
            ),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(kind, error = %e, "refreshing the WordPress drafts failed; the gate picks from the drafts as last synced")
            }
        }
    }

    fn api(&self, path: &str) -> String {
        format!("{}/wp-json/wp/v2/{path}", self.config.url)
    }

    fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, url)
            .timeout(self.timeout)
            .basic_auth(&self.config.user, Some(self.config.app_password.expose()))
    }

    async fn get(&self, url: &str) -> Result<Answer, CallFailure> {
        let r = send_with(self.request(reqwest::Method::GET, url), wp_error).await;
        attempt_metric("wordpress_read", &r);
        r
    }

    async fn post(&self, url: &str, body: &Value) -> Result<Answer, CallFailure> {
        let r = send_with(
            self.request(reqwest::Method::POST, url)
                .header("Content-Type", "application/json")
                .body(body.to_string()),
            wp_error,
        )
        .await;
        attempt_metric("wordpress_write", &r);
        r
    }

    /// The post `id` as an editor sees it; `None` when WordPress says it
    /// does not exist (deleted).
    pub async fn read_post(&self, id: i64) -> Result<Option<Post>, CallFailure> {
        let url = self.api(&format!("posts/{id}?context=edit&_fields=id,status,link"));
        match self.get(&url).await {
            Ok(a) => post_in(a).map(Some),
            Err(f) if f.status == Some(404) || f.status == Some(410) => Ok(None),
            Err(f) => Err(f),
        }
    }

    /// The post carrying `slug` (or its trashed form), in any status.
    pub async fn find_slug(&self, slug: &str) -> Result<Option<Post>, CallFailure> {
        let url = self.api(&format!(
            "posts?slug={slug},{slug}__trashed&status={ALL_STATUSES}&context=edit&_fields=id,status,link,slug&per_page=10"
        ));
        let v = json_of(self.get(&url).await?)?;
        Ok(v.as_array().and_then(|a| a.iter().find_map(post_of)))
    }

    /// Where `call` publishes; `None` for a mirrored draft without a post
    /// id (which cannot be published).
    fn target(&self, call: &Call<'_>) -> Option<Target> {
        Some(match &self.config.drafts {
            WpDrafts::InWordPress(ready) => Target::Post(call.draft.cms_id?, *ready),
            WpDrafts::InSlotgate { slug } => Target::Slug(slug.fill(
                &call.slot.kind,
                call.slot.day,
                call.slot.slot_no,
                call.draft.id,
            )),
        })
    }

    /// The look before a write: `Some` when it decides the publish (found
    /// applied, or withdrawn), `None` when the write may go.
    async fn look(&self, target: &Target) -> Result<Option<Step>, CallFailure> {
        Ok(match target {
            Target::Post(id, ready) => match self.read_post(*id).await? {
                None => Some(Step::Withdrawn(json!({"post": id, "seen": "deleted"}))),
                Some(p) if p.status == "publish" => Some(Step::Done(p, true)),
                Some(p) if p.status == ready.as_str() => None,
                Some(p) => Some(Step::Withdrawn(json!({"post": id, "seen": p.status}))),
            },
            Target::Slug(slug) => self.find_slug(slug).await?.map(|p| Step::Done(p, true)),
        })
    }

    async fn write(&self, call: &Call<'_>, target: &Target) -> Result<Post, CallFailure> {
        let (url, body) = match target {
            Target::Post(id, _) => (
                self.api(&format!("posts/{id}?_fields=id,status,link")),
                json!({"status": "publish", "date_gmt": wp_date(call.now)}),
            ),
            Target::Slug(slug) => (
                self.api("posts?_fields=id,status,link"),
                json!({
                    "title": call.draft.title,
                    "content": call.draft.body,
                    "status": "publish",
                    "slug": slug,
                    "date_gmt": wp_date(call.now),
                }),
            ),
        };
        let a = self.post(&url, &body).await?;
        let status = a.status;
        let p = post_in(a)?;
        if p.status != "publish" {
            // `future`: WordPress's clock is more than a minute behind ours.
            return Err(CallFailure {
                status: Some(status),
                error: format!(
                    "WordPress saved post {} as {:?}, not publish (is the site's clock behind?)",
                    p.id, p.status
                ),
                retryable: false,
                location: None,
            });
        }
        Ok(p)
    }

    /// One attempt: the look-up, then the write if the look-up allows it.
    async fn attempt(&self, call: &Call<'_>, target: &Target) -> Result<Step, CallFailure> {
        if let Some(step) = self.look(target).await? {
            return Ok(step);
        }
        match self.write(call, target).await {
            Ok(p) => Ok(Step::Done(p, false)),
            // Deleted between the read and the write.
            Err(f) if f.status == Some(404) && matches!(target, Target::Post(..)) => Ok(
                Step::Withdrawn(json!({"post": call.draft.cms_id, "seen": "deleted"})),
            ),
            Err(f) => Err(f),
        }
    }

    fn published(p: Post, attempts: u32, found: bool) -> Effect {
        let response = json!({"url": p.link, "wordpress": {"post": p.id, "status": p.status}});
        Effect::Published(Published {
            url: p.link,
            response,
            attempts,
            found,
        })
    }

    /// The oldest posts in `status` (at most `limit`), for the draft mirror.
    pub async fn list_ready(
        &self,
        status: WpDraftStatus,
        limit: u32,
    ) -> Result<ReadyPosts, CallFailure> {
        let mut posts = Vec::new();
        let mut page = 1;
        let complete = loop {
            let per_page = LIST_PAGE.min(limit - posts.len() as u32);
            let url = self.api(&format!(
                "posts?status={}&context=edit&orderby=date&order=asc&per_page={per_page}&page={page}&_fields=id,date_gmt,title",
                status.as_str()
            ));
            let items = match json_of(self.get(&url).await?)? {
                Value::Array(items) => items,
                _ => Vec::new(),
            };
            let n = items.len() as u32;
            posts.extend(items.iter().filter_map(ready_post));
            if n < per_page {
                break true;
            }
            if posts.len() as u32 >= limit {
                // Full: there may be more than the limit.
                break false;
            }
            page += 1;
        };
        posts.sort_by_key(|p| (p.date_gmt, p.id));
        Ok(ReadyPosts { posts, complete })
    }

    /// Does `<url>/wp-json/` answer as WordPress, and may the user publish?
    /// `Err` names what is wrong, for `planner check` and the worker's start.
    pub async fn check(&self) -> Result<(), String> {
        // Only the namespaces: the whole index is larger than the answer limit.
        let root = format!("{}/wp-json/?_fields=namespaces", self.config.url);
        let site = crate::secret::redact_url(&self.config.url);
        let a = send(self.client.get(&root).timeout(self.timeout))
            .await
            .map_err(|f| format!("{site}/wp-json/ does not answer as WordPress: {}", f.error))?;
        let wp = a
            .json
            .get("namespaces")
            .and_then(Value::as_array)
            .is_some_and(|n| n.iter().any(|x| x == "wp/v2"));
        if !wp {
            return Err(format!(
                "{site}/wp-json/ does not answer as WordPress (no \"wp/v2\" in its namespaces)"
            ));
        }
        let me = self
            .get(&self.api("users/me?context=edit&_fields=id,capabilities"))
            .await
            .map_err(|f| {
                let hint = if f.status == Some(401) {
                    " (WordPress did not accept the user and Application Password)"
                } else {
                    ""
                };
                format!("{site}: user {:?}: {}{hint}", self.config.user, f.error)
            })?;
        let v = json_of(me).map_err(|f| f.error)?;
        let can = v
            .pointer("/capabilities/publish_posts")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if !can {
            return Err(format!(
                "{site}: user {:?} lacks the publish_posts capability (make it an Author, Editor or Administrator)",
                self.config.user
            ));
        }
        Ok(())
    }
}

/// One listed post as the mirror keeps it; `None` without an id.
fn ready_post(item: &Value) -> Option<ReadyPost> {
    let id = item.get("id").and_then(Value::as_i64)?;
    let date_gmt = item
        .get("date_gmt")
        .and_then(Value::as_str)
        .and_then(|d| NaiveDateTime::parse_from_str(d, "%Y-%m-%dT%H:%M:%S").ok())
        .map(|d| d.and_utc())
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    let title = item
        .pointer("/title/raw")
        .or_else(|| item.pointer("/title/rendered"))
        .and_then(Value::as_str)
        .unwrap_or("");
    Some(ReadyPost {
        id,
        date_gmt,
        title: title.chars().take(TITLE_LIMIT).collect(),
    })
}

/// What one read-then-write came to, short of a failure.
enum Step {
    /// Published: by this write (`false`) or found applied (`true`).
    Done(Post, bool),
    /// The post is no longer ready: what was seen.
    Withdrawn(Value),
}

impl Receiver for WordPress {
    fn refresh_drafts<'a>(&'a self, pool: &'a sqlx::PgPool) -> BoxFuture<'a, ()> {
        Box::pin(self.refresh(pool))
    }

    fn sync_drafts<'a>(
        &'a self,
        pool: &'a sqlx::PgPool,
    ) -> BoxFuture<'a, Result<Option<crate::store::Synced>, RefreshError>> {
        Box::pin(self.sync(pool))
    }

    fn check(&self) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(WordPress::check(self))
    }

    fn publish<'a>(&'a self, call: &'a Call<'a>, rng: &'a mut StdRng) -> BoxFuture<'a, Effect> {
        Box::pin(async move {
            let Some(target) = self.target(call) else {
                return Effect::Withdrawn(json!({"error": "the draft has no WordPress post id"}));
            };
            let policy = call.policy;
            let mut attempts = 0;
            loop {
                attempts += 1;
                match self.attempt(call, &target).await {
                    Ok(Step::Done(p, found)) => {
                        if found {
                            tracing::info!(slot = %call.slot, post = p.id, status = %p.status, "WordPress already shows this slot's publish (an earlier try applied it); nothing written");
                        }
                        return Self::published(p, attempts, found);
                    }
                    Ok(Step::Withdrawn(w)) => {
                        tracing::warn!(slot = %call.slot, draft = call.draft.id, seen = %w, "the WordPress post is no longer ready; nothing published");
                        return Effect::Withdrawn(w);
                    }
                    Err(f) if f.retryable && attempts < policy.max_attempts => {
                        tracing::info!(slot = %call.slot, attempt = attempts, error = %f.error, "WordPress call failed; reading again before any write");
                        back_off(policy, rng, attempts).await;
                    }
                    Err(f) => {
                        return Effect::Failed(CallReport {
                            attempts,
                            result: Err(f),
                        })
                    }
                }
            }
        })
    }
}

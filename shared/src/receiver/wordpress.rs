//! WordPress as a kind's CMS, through its REST API (`<url>/wp-json/wp/v2`)
//! with an Application Password (HTTP Basic).
//!
//! WordPress has no idempotency keys: two `POST`s make two posts, and a
//! request it has *accepted but not yet saved* (queued behind busy PHP
//! workers, past the client's timeout) is invisible to any read. So the
//! write that can repeat must be one nobody sees, and publication must be
//! a state change on one known post (**stage, then publish**):
//!
//! - **Drafts in slotgate** (no `drafts` key): each try *stages* the slot's
//!   post as a `draft` whose slug is the slot's marker
//!   ([`WordPress::marker`]: the slug template filled in, plus a tag of the
//!   installation and kind), so every staged copy — even one a queued
//!   request saves minutes later — carries it, or a `-N` form WordPress
//!   gives a copy while another post holds the marker. The marker is then
//!   looked up (every status, only posts of the Application Password's user
//!   whose slug is exactly the marker or one of its `-N` forms):
//!   a copy that went out (`publish`, or published and then trashed) →
//!   recorded `published`, nothing written; else the *lowest id* of the
//!   staged copies is the slot's post (every worker resolves the same one:
//!   ids grow, so a copy saved later never undercuts it), the other copies
//!   are trashed, and the one post is published by a status change that
//!   sets the marker again (`POST posts/<id>` `{"status": "publish",
//!   "slug": <marker>}`). A repeated or queued
//!   create can only add another invisible draft; a repeated status change
//!   on a published post changes nothing.
//! - **Drafts in WordPress** (`drafts = "pending" | "draft"`): the post
//!   bound to the slot is read (`GET posts/<id>?context=edit`). Published
//!   since the slot fell due (its `date_gmt` is ours) → recorded `published`
//!   with its `link`, nothing written (an earlier try applied it and its
//!   answer was lost); published and then trashed → the same, the trash
//!   noted. Still in the ready status → one write, `POST posts/<id>`
//!   `{"status": "publish", "date_gmt": <now>}`, so it appears at the top.
//!   Anything else (pulled back, trashed, published by someone before the
//!   slot, deleted — only WordPress's own `rest_post_invalid_id` says so)
//!   → [`Effect::Withdrawn`], nothing written.
//!
//! A try that times out, breaks, or meets a 5xx/408/429 (or a `404` that is
//! not WordPress's) is followed by backoff and the same steps again, never
//! by a blind publish. `401`/`403` fail at once as `publish_error` with
//! WordPress's `code` and `message`. Each try is one attempt of the kind's
//! `http_attempts`.
//!
//! [`WordPress::list_drafts`] lists a kind's ready posts, which
//! [`crate::worker::drafts::sync`] mirrors into the draft table
//! (`planner drafts sync`, and the worker's background refresh); [`WordPress::check`] is `planner check`'s and the
//! worker's start-up look at the site. The password is sent as Basic auth
//! only and never logged, stored or shown.

use super::webhook::{
    attempt_metric, plain_error, send, send_with, Answer, CallFailure, CallReport,
};
use super::{back_off, Call, CmsDrafts, Effect, Published, Receiver};
use crate::config::{WordPressConfig, WpDraftStatus, WpDrafts};
use crate::untrusted;
use chrono::{DateTime, NaiveDateTime, Timelike, Utc};
use futures_util::future::BoxFuture;
use rand::rngs::StdRng;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;

/// The statuses a marker look-up asks for: every status a post can have.
const ALL_STATUSES: &str = "publish,future,draft,pending,private,trash";

/// Posts per page when listing drafts; a page whose answer is too long is
/// asked again smaller, down to one post.
const LIST_PAGE: u32 = 50;

/// The longest title kept of a mirrored post (characters).
pub const TITLE_LIMIT: usize = 1000;

/// How far before a slot's due time a post's `date_gmt` may lie and still
/// be this slot's publish: the clocks of WordPress and the worker differ,
/// and a delivery may run up to a minute early.
const OUR_PUBLISH_SLACK: chrono::Duration = chrono::Duration::minutes(5);

/// The highest `-N` suffix a marker is looked up under: WordPress gives a
/// published post `<slug>-2` when another post holds `<slug>` (a staged
/// copy saved in the moment between the trash of the copies and the
/// publish, or a stranger's post).
const SUFFIXES: u32 = 4;

/// A kind's WordPress site.
#[derive(Debug, Clone)]
pub struct WordPress {
    /// The kind whose drafts this site holds (the mirror's `draft.kind`).
    kind: String,
    config: WordPressConfig,
    client: reqwest::Client,
    /// The kind's `http_timeout`: the limit of each request.
    timeout: Duration,
    /// What makes this installation's and kind's markers their own
    /// ([`marker_tag`]).
    tag: String,
    /// The Application Password's user id, read once: only its posts can
    /// be a slot's.
    me: Arc<tokio::sync::OnceCell<i64>>,
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
    /// Its slug (`<marker>__trashed` in the trash).
    pub slug: String,
    /// Its author's user id (0 when not given).
    pub author: i64,
    /// Its date, as WordPress gives it (set by a publish).
    pub date_gmt: Option<NaiveDateTime>,
    /// Its last change.
    pub modified_gmt: Option<NaiveDateTime>,
}

impl Post {
    /// Published (by this slot: dated no earlier than `since`) and then
    /// trashed. A publish dates the post, so its trash changes it later;
    /// a draft trashed without ever being published takes its date from the
    /// trash itself. Within one second the two look alike, so a post dated
    /// exactly as this publish's own status change (`sent`) counts too.
    fn trashed_after_publish(&self, since: NaiveDateTime, sent: Option<NaiveDateTime>) -> bool {
        self.status == "trash"
            && match (self.date_gmt, self.modified_gmt) {
                (Some(d), Some(m)) => d >= since && (d < m || Some(d) == sent),
                _ => false,
            }
    }

    /// Went out to readers at some point: public now, or published and then
    /// hidden (private, trashed).
    fn went_out(&self, since: NaiveDateTime, sent: Option<NaiveDateTime>) -> bool {
        matches!(self.status.as_str(), "publish" | "future" | "private")
            || self.trashed_after_publish(since, sent)
    }

    /// A copy nobody sees yet: a staged draft.
    fn staged(&self) -> bool {
        matches!(self.status.as_str(), "draft" | "pending")
    }
}

/// A ready post, for the draft mirror.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadyPost {
    /// WordPress's post id.
    pub id: i64,
    /// Its date (GMT), by which the oldest goes first.
    pub date_gmt: DateTime<Utc>,
    /// Its title, as shown in the mirror.
    pub title: String,
}

/// The oldest ready posts of a site, as one sync read them.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadyPosts {
    /// Oldest first (by `date_gmt`, then id), each id once.
    pub posts: Vec<ReadyPost>,
    /// Every ready post is in `posts` (the site had no more than the
    /// limit): a mirrored post missing from it is no longer ready.
    pub complete: bool,
}

/// Where a publish lands: the mirrored post, or the marker of the post to
/// stage. Fixed for the whole publish, so every attempt looks up and
/// writes the same thing.
enum Target {
    /// A post in WordPress that should be in `ready` status.
    Post(i64, WpDraftStatus),
    /// A post to stage and publish, found by this marker.
    Marker(String),
}

/// What one publish has done so far, across its attempts.
#[derive(Default)]
struct Progress {
    /// The staged copy this publish created (its answer came back): later
    /// attempts do not stage again.
    staged: Option<i64>,
    /// The post this publish's own status change published.
    published: Option<i64>,
    /// The date this publish's status change gave the post (sent, answered
    /// or not).
    sent: Option<NaiveDateTime>,
    /// Extra staged copies moved to the trash.
    trashed: u32,
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

/// WordPress itself says the post does not exist: its REST API's own
/// error code, not any `404` (a proxy's, a cache's, a moved site's).
fn no_such_post(f: &CallFailure) -> bool {
    matches!(f.status, Some(404) | Some(410)) && f.error.contains(": rest_post_invalid_id: ")
}

fn wp_time(v: &Value, key: &str) -> Option<NaiveDateTime> {
    v.get(key)
        .and_then(Value::as_str)
        .and_then(|d| NaiveDateTime::parse_from_str(d, "%Y-%m-%dT%H:%M:%S").ok())
}

fn post_of(v: &Value) -> Option<Post> {
    let text = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    Some(Post {
        id: v.get("id")?.as_i64()?,
        status: v.get("status")?.as_str()?.to_owned(),
        link: text("link"),
        slug: text("slug"),
        author: v.get("author").and_then(Value::as_i64).unwrap_or(0),
        date_gmt: wp_time(v, "date_gmt"),
        modified_gmt: wp_time(v, "modified_gmt"),
    })
}

/// The fields every post read asks for.
const POST_FIELDS: &str = "id,status,link,slug,author,date_gmt,modified_gmt";

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

/// What makes one installation's and one kind's markers their own: eight
/// hex digits of SHA-256 over the installation's `jitter_seed` and the
/// kind's exact name. Without it, kinds `news_a` and `news-a` (one slug
/// after WordPress's reduction) or two installations on one site would
/// share markers, and one would take the other's post for its own.
pub fn marker_tag(jitter_seed: &str, kind: &str) -> String {
    let mut h = Sha256::new();
    h.update(jitter_seed.as_bytes());
    h.update([0]);
    h.update(kind.as_bytes());
    h.finalize()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The earliest date a post published by this slot can carry: the slot's
/// due time, less [`OUR_PUBLISH_SLACK`].
fn since(call: &Call<'_>) -> NaiveDateTime {
    (call.planned.due_at - OUR_PUBLISH_SLACK).naive_utc()
}

/// A failure that names what WordPress did to a post, not retried.
fn refused(status: u16, error: String) -> CallFailure {
    CallFailure {
        status: Some(status),
        error,
        retryable: false,
        location: None,
    }
}

impl WordPress {
    /// The site of `kind`, called through `client` (the kind's CA), each
    /// request under `timeout` (the kind's `http_timeout`); `jitter_seed`
    /// is the installation's (see [`marker_tag`]).
    pub fn new(
        kind: &str,
        config: WordPressConfig,
        client: reqwest::Client,
        timeout: Duration,
        jitter_seed: &str,
    ) -> Self {
        Self {
            kind: kind.to_owned(),
            config,
            client,
            timeout,
            tag: marker_tag(jitter_seed, kind),
            me: Arc::default(),
        }
    }

    /// The marker (slug) of a slot's post, for drafts kept in slotgate: the
    /// kind's slug template filled in, then `-<tag>`.
    pub fn marker(&self, day: chrono::NaiveDate, slot_no: u32, draft: i64) -> Option<String> {
        match &self.config.drafts {
            WpDrafts::InSlotgate { slug } => Some(format!(
                "{}-{}",
                slug.fill(&self.kind, day, slot_no, draft),
                self.tag
            )),
            WpDrafts::InWordPress(_) => None,
        }
    }

    /// The site's ready posts, at most `sync_limit` of the oldest, for
    /// the worker's drafts step to mirror
    /// ([`crate::worker::drafts::sync`]). `Ok(None)` for a site whose
    /// drafts live in slotgate.
    pub async fn list_drafts(&self) -> Result<Option<CmsDrafts>, CallFailure> {
        let WpDrafts::InWordPress(status) = self.config.drafts else {
            return Ok(None);
        };
        let ready = self.list_ready(status, self.config.sync_limit).await?;
        let posts = ready
            .posts
            .into_iter()
            .map(|p| (p.id, p.title, p.date_gmt))
            .collect();
        Ok(Some(CmsDrafts {
            posts,
            complete: ready.complete,
        }))
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

    /// The Application Password's user id, read once per process.
    async fn me(&self) -> Result<i64, CallFailure> {
        self.me
            .get_or_try_init(|| async {
                let a = self.get(&self.api("users/me?_fields=id")).await?;
                let status = a.status;
                json_of(a)?
                    .get("id")
                    .and_then(Value::as_i64)
                    .ok_or_else(|| refused(status, "WordPress's users/me has no id".into()))
            })
            .await
            .copied()
    }

    /// The post `id` as an editor sees it; `None` when WordPress says it
    /// does not exist (`rest_post_invalid_id`). Any other 404 — a proxy's
    /// page, a cache, a site moved — is unknown and retried.
    pub async fn read_post(&self, id: i64) -> Result<Option<Post>, CallFailure> {
        let url = self.api(&format!("posts/{id}?context=edit&_fields={POST_FIELDS}"));
        match self.get(&url).await {
            Ok(a) => post_in(a).map(Some),
            Err(f) if no_such_post(&f) => Ok(None),
            Err(f) if f.status == Some(404) => Err(CallFailure {
                error: format!("{} (not WordPress's own rest_post_invalid_id: the post is not taken as deleted)", f.error),
                retryable: true,
                ..f
            }),
            Err(f) => Err(f),
        }
    }

    /// This user's posts carrying `marker` (or a `-N` form WordPress gave
    /// it, or either one's trashed form), in any status, lowest id first.
    /// Only exact slugs of this user count: a cache that ignores `?slug=`,
    /// or a stranger's post with the marker, is never taken for ours.
    pub async fn find_marker(&self, marker: &str) -> Result<Vec<Post>, CallFailure> {
        let me = self.me().await?;
        let mut slugs = vec![marker.to_owned()];
        slugs.extend((2..=SUFFIXES).map(|n| format!("{marker}-{n}")));
        let trashed: Vec<String> = slugs.iter().map(|s| format!("{s}__trashed")).collect();
        slugs.extend(trashed);
        let url = self.api(&format!(
            "posts?slug={}&author={me}&status={ALL_STATUSES}&context=edit&_fields={POST_FIELDS}&per_page=100&orderby=id&order=asc",
            slugs.join(",")
        ));
        let v = json_of(self.get(&url).await?)?;
        let mut posts: Vec<Post> = v
            .as_array()
            .map(|a| a.iter().filter_map(post_of).collect())
            .unwrap_or_default();
        posts.retain(|p| p.author == me && slugs.contains(&p.slug));
        posts.sort_by_key(|p| p.id);
        Ok(posts)
    }

    /// Where `call` publishes; `None` for a mirrored draft without a post
    /// id (which cannot be published).
    fn target(&self, call: &Call<'_>) -> Option<Target> {
        Some(match &self.config.drafts {
            WpDrafts::InWordPress(ready) => Target::Post(call.draft.cms_id?, *ready),
            WpDrafts::InSlotgate { .. } => {
                Target::Marker(self.marker(call.slot.day, call.slot.slot_no, call.draft.id)?)
            }
        })
    }

    /// One attempt at a post that lives in WordPress: the read, then the
    /// status change if the read allows it.
    async fn attempt_post(
        &self,
        call: &Call<'_>,
        id: i64,
        ready: WpDraftStatus,
        progress: &mut Progress,
    ) -> Result<Step, CallFailure> {
        let withdrawn = |seen: &str| Step::Withdrawn(json!({"post": id, "seen": seen}));
        let Some(p) = self.read_post(id).await? else {
            return Ok(withdrawn("deleted"));
        };
        let since = since(call);
        if p.status == "publish" {
            // Our publish dates the post; one dated before the slot fell
            // due was published by someone else.
            return Ok(if p.date_gmt.is_some_and(|d| d >= since) {
                Step::Done(p, true)
            } else {
                withdrawn("publish before the slot (not by slotgate)")
            });
        }
        if p.trashed_after_publish(since, progress.sent) {
            return Ok(Step::Done(p, true));
        }
        if p.status != ready.as_str() {
            return Ok(withdrawn(&p.status));
        }
        match self.set_published(call, id, None, progress).await {
            Ok(p) => Ok(Step::Done(p, false)),
            Err(f) if no_such_post(&f) => Ok(withdrawn("deleted")),
            Err(f) => Err(f),
        }
    }

    /// One attempt at a post slotgate stages: stage a copy (unless this
    /// publish already has one), resolve the slot's one post by the marker,
    /// then publish it by a status change.
    async fn attempt_marker(
        &self,
        call: &Call<'_>,
        marker: &str,
        progress: &mut Progress,
    ) -> Result<Step, CallFailure> {
        if progress.staged.is_none() {
            progress.staged = Some(self.stage(call, marker).await?.id);
        }
        let posts = self.find_marker(marker).await?;
        let (since, sent) = (since(call), progress.sent);
        let out = posts.iter().find(|p| p.went_out(since, sent)).cloned();
        let chosen = match &out {
            Some(p) => p.id,
            // Lowest id of every staged copy, whatever `-N` WordPress gave it.
            None => match posts.iter().find(|p| p.staged()) {
                Some(p) => p.id,
                // Our own copy was saved (its answer came back), so only a
                // lagging read (a replica, a cache) hides it.
                None => {
                    return Err(CallFailure::transport(
                        None,
                        format!("the staged post of marker {marker:?} is not visible yet"),
                    ))
                }
            },
        };
        for extra in posts.iter().filter(|p| p.staged() && p.id != chosen) {
            progress.trashed += u32::from(self.trash(extra.id).await);
        }
        if let Some(p) = out {
            let found = progress.published != Some(p.id);
            return Ok(Step::Done(p, found));
        }
        let p = self
            .set_published(call, chosen, Some(marker), progress)
            .await?;
        progress.published = Some(p.id);
        Ok(Step::Done(p, false))
    }

    /// Creates the slot's post as an unpublished `draft` carrying the
    /// marker: the one write that may repeat, invisible to readers.
    async fn stage(&self, call: &Call<'_>, marker: &str) -> Result<Post, CallFailure> {
        let body = json!({
            "title": call.draft.title,
            "content": call.draft.body,
            "status": "draft",
            "slug": marker,
        });
        let a = self
            .post(&self.api(&format!("posts?_fields={POST_FIELDS}")), &body)
            .await?;
        post_in(a)
    }

    /// Publishes post `id` by a status change, dated now so it appears at
    /// the top; with `slug`, the marker is set again (a copy WordPress saved
    /// as `<m>-2` while another copy held the marker takes it back, the
    /// others being in the trash by then).
    async fn set_published(
        &self,
        call: &Call<'_>,
        id: i64,
        slug: Option<&str>,
        progress: &mut Progress,
    ) -> Result<Post, CallFailure> {
        progress.sent = Some(call.now.naive_utc().with_nanosecond(0).unwrap_or_default());
        let mut body = json!({"status": "publish", "date_gmt": wp_date(call.now)});
        if let Some(slug) = slug {
            body["slug"] = slug.into();
        }
        let a = self
            .post(
                &self.api(&format!("posts/{id}?_fields={POST_FIELDS}")),
                &body,
            )
            .await?;
        let status = a.status;
        let p = post_in(a)?;
        if p.status != "publish" {
            // `future`: WordPress's clock is more than a minute behind ours.
            return Err(refused(
                status,
                format!(
                    "WordPress saved post {} as {:?}, not publish (is the site's clock behind?)",
                    p.id, p.status
                ),
            ));
        }
        Ok(p)
    }

    /// Moves an extra staged copy to the trash; whether it went. A copy
    /// left behind is a draft nobody sees, so a failure is only logged.
    async fn trash(&self, id: i64) -> bool {
        let r = send_with(
            self.request(
                reqwest::Method::DELETE,
                &self.api(&format!("posts/{id}?_fields=id")),
            ),
            wp_error,
        )
        .await;
        attempt_metric("wordpress_write", &r);
        match r {
            Ok(_) => true,
            Err(f) => {
                tracing::info!(kind = %self.kind, post = id, error = %f.error, "could not trash an extra staged copy; it stays an unpublished draft");
                false
            }
        }
    }

    fn published(p: Post, attempts: u32, found: bool, trashed: u32) -> Effect {
        let mut noted = serde_json::Map::new();
        if trashed > 0 {
            noted.insert("staged_copies_trashed".into(), trashed.into());
        }
        if p.status == "trash" {
            noted.insert("trashed_after_publish".into(), true.into());
        }
        let response = json!({"url": p.link, "wordpress": {"post": p.id, "status": p.status}});
        Effect::Published(Published {
            url: p.link,
            response,
            attempts,
            found,
            noted: (!noted.is_empty()).then_some(Value::Object(noted)),
        })
    }

    /// The oldest posts in `status` (at most `limit`), for the draft
    /// mirror. Listing quirks never fail a sync: an id listed twice (a page
    /// boundary that moved) is kept once, and a page whose answer passes
    /// the limit is asked again smaller, down to one post, whose title is
    /// then left out if it alone is too long.
    pub async fn list_ready(
        &self,
        status: WpDraftStatus,
        limit: u32,
    ) -> Result<ReadyPosts, CallFailure> {
        let mut posts: Vec<ReadyPost> = Vec::new();
        let mut offset = 0u32;
        let complete = loop {
            let asked = LIST_PAGE.min(limit - offset);
            let (items, titled, per_page) = self.list_page(status, offset, asked).await?;
            let n = items.len() as u32;
            for mut p in items.iter().filter_map(ready_post) {
                if !titled {
                    p.title = String::new();
                }
                if !posts.iter().any(|q| q.id == p.id) {
                    posts.push(p);
                }
            }
            offset += n;
            if n < per_page {
                break true;
            }
            if offset >= limit {
                // Full: there may be more than the limit.
                break false;
            }
        };
        posts.sort_by_key(|p| (p.date_gmt, p.id));
        Ok(ReadyPosts { posts, complete })
    }

    /// One page of the listing, from `offset`: its items, whether they
    /// carry titles, and how many were asked for. A page too long for the
    /// answer limit is asked again with half as many posts; a single post
    /// still too long, without its title.
    async fn list_page(
        &self,
        status: WpDraftStatus,
        offset: u32,
        mut per_page: u32,
    ) -> Result<(Vec<Value>, bool, u32), CallFailure> {
        loop {
            let titled = per_page > 0;
            let fields = if titled {
                "id,date_gmt,title"
            } else {
                "id,date_gmt"
            };
            let url = self.api(&format!(
                "posts?status={}&context=edit&orderby=date&order=asc&per_page={}&offset={offset}&_fields={fields}",
                status.as_str(),
                per_page.max(1),
            ));
            let a = self.get(&url).await?;
            if a.cut && titled {
                tracing::info!(kind = %self.kind, per_page, "a page of the WordPress listing is longer than the answer limit; asking for fewer posts");
                per_page /= 2;
                continue;
            }
            let items = match json_of(a)? {
                Value::Array(items) => items,
                _ => Vec::new(),
            };
            return Ok((items, titled, per_page.max(1)));
        }
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

/// One listed post as the mirror keeps it; `None` without an id. A title
/// longer than [`TITLE_LIMIT`] is cut there.
fn ready_post(item: &Value) -> Option<ReadyPost> {
    let id = item.get("id").and_then(Value::as_i64)?;
    let date_gmt = wp_time(item, "date_gmt")
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

/// What one attempt came to, short of a failure.
enum Step {
    /// Published: by this publish (`false`) or found so (`true`).
    Done(Post, bool),
    /// The post is no longer ready: what was seen.
    Withdrawn(Value),
}

impl Receiver for WordPress {
    fn list_drafts(&self) -> BoxFuture<'_, Result<Option<CmsDrafts>, CallFailure>> {
        Box::pin(WordPress::list_drafts(self))
    }

    fn mirrors_drafts(&self) -> Option<Duration> {
        matches!(self.config.drafts, WpDrafts::InWordPress(_)).then_some(self.config.refresh_every)
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
            let mut progress = Progress::default();
            loop {
                attempts += 1;
                let step = match &target {
                    Target::Post(id, ready) => {
                        self.attempt_post(call, *id, *ready, &mut progress).await
                    }
                    Target::Marker(m) => self.attempt_marker(call, m, &mut progress).await,
                };
                match step {
                    Ok(Step::Done(p, found)) => {
                        if found {
                            tracing::info!(slot = %call.slot, post = p.id, status = %p.status, "WordPress already shows this slot's publish (an earlier try applied it); nothing written");
                        }
                        if progress.trashed > 0 {
                            tracing::info!(slot = %call.slot, post = p.id, trashed = progress.trashed, "extra staged copies of the slot's post (writes that repeated) moved to the trash");
                        }
                        return Self::published(p, attempts, found, progress.trashed);
                    }
                    Ok(Step::Withdrawn(w)) => {
                        tracing::warn!(slot = %call.slot, draft = call.draft.id, seen = %w, "the WordPress post is no longer ready; nothing published");
                        return Effect::Withdrawn(w);
                    }
                    Err(f) if f.retryable && attempts < policy.max_attempts => {
                        tracing::info!(slot = %call.slot, attempt = attempts, error = %f.error, "WordPress call failed; looking again before any publish");
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

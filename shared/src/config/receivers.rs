//! The receiver sections of a kind: `[kinds.wordpress]` (publish to a
//! WordPress site) and `[kinds.indexnow]` (push published URLs with the
//! IndexNow protocol). The webhook receiver's keys (`publish_url`,
//! `probe_url`, `index_url`, `auth`, …) are plain keys of the kind, read by
//! [`super::webhook`].
//!
//! Each section is validated completely here, like every other part of the
//! file: an unknown key, a bad URL or a missing environment variable is an
//! error naming `wordpress.<key>` / `indexnow.<key>`. Passwords and keys are
//! read from the environment variable named in the file, never from the file.

use super::keys::{FieldError, Keys};
use crate::secret::Secret;
use std::time::Duration;

/// Which WordPress posts are a kind's drafts (`[kinds.wordpress] drafts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WpDraftStatus {
    /// Posts in status `pending` ("Pending Review"): the editor marks a post
    /// ready by submitting it for review.
    Pending,
    /// Posts in status `draft`: every draft is ready.
    Draft,
}

impl WpDraftStatus {
    /// WordPress's own spelling of the status.
    pub fn as_str(self) -> &'static str {
        match self {
            WpDraftStatus::Pending => "pending",
            WpDraftStatus::Draft => "draft",
        }
    }
}

/// Where a WordPress kind's drafts live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WpDrafts {
    /// In WordPress, in this status: slotgate mirrors them into its draft
    /// table (`planner drafts sync`, and the worker before each gate) and
    /// publishes one by changing its status to `publish`.
    InWordPress(WpDraftStatus),
    /// In slotgate (`planner drafts add/import`): each publish creates a new
    /// post whose slug is this template filled in for the slot (the marker a
    /// retry looks up before it creates anything).
    InSlotgate {
        /// The marker template of the posts it creates.
        slug: SlugTemplate,
    },
}

/// The slug of a post slotgate creates: the marker by which a retry finds a
/// post an earlier, unanswered try created. Only parts that never change
/// for a slot may go in (`{kind}`, `{day}`, `{slot}`, `{draft}`), and all
/// of `{kind}`, `{day}` and `{slot}` must, so two slots never share a slug.
/// The result is reduced to `[a-z0-9-]` here, so WordPress stores it
/// unchanged (its `sanitize_title` leaves such a slug as it is) and the
/// look-up by `?slug=` matches exactly.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlugTemplate(String);

/// The template when `slug` is not set.
pub const DEFAULT_SLUG: &str = "{kind}-{day}-{slot}";

/// WordPress cuts slugs at 200 bytes; a filled template must stay below.
const SLUG_MAX: usize = 190;

impl SlugTemplate {
    /// Validates a template: only the known placeholders, and `{kind}`,
    /// `{day}` and `{slot}` each present.
    pub fn parse(s: &str) -> Result<SlugTemplate, String> {
        let mut rest = s;
        while let Some(open) = rest.find('{') {
            let close = rest[open..]
                .find('}')
                .ok_or_else(|| format!("unclosed `{{` in slug template {s:?}"))?;
            let name = &rest[open + 1..open + close];
            if !matches!(name, "kind" | "day" | "slot" | "draft") {
                return Err(format!(
                    "unknown placeholder {{{name}}} in slug template {s:?} (known: {{kind}}, {{day}}, {{slot}}, {{draft}}; a title can change between tries, so it cannot be part of the marker)"
                ));
            }
            rest = &rest[open + close + 1..];
        }
        for needed in ["{kind}", "{day}", "{slot}"] {
            if !s.contains(needed) {
                return Err(format!(
                    "slug template {s:?} lacks {needed}: every slot needs a slug of its own"
                ));
            }
        }
        // Filled in, a kind adds at most 64 bytes, a day 10, numbers 20 each.
        if s.len() > 64 {
            return Err(format!(
                "slug template {s:?} is too long (filled in it must stay under {SLUG_MAX} bytes)"
            ));
        }
        Ok(SlugTemplate(s.to_owned()))
    }

    /// The slug of one slot's post: the template filled in, lowercased, and
    /// every run of characters outside `[a-z0-9]` made one `-`.
    pub fn fill(&self, kind: &str, day: chrono::NaiveDate, slot_no: u32, draft: i64) -> String {
        let filled = self
            .0
            .replace("{kind}", kind)
            .replace("{day}", &day.to_string())
            .replace("{slot}", &slot_no.to_string())
            .replace("{draft}", &draft.to_string())
            .to_ascii_lowercase();
        let mut out = String::with_capacity(filled.len());
        for c in filled.chars() {
            if c.is_ascii_alphanumeric() {
                out.push(c);
            } else if !out.ends_with('-') {
                out.push('-');
            }
        }
        let out = out.trim_matches('-');
        out[..out.len().min(SLUG_MAX)].to_owned()
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// How long a worker's background refresh of a WordPress kind's drafts
/// waits after the end of the last one, when `refresh_every` is not set.
pub const DEFAULT_WP_REFRESH: Duration = Duration::from_secs(5);

/// The most posts one sync reads (the oldest ones), when `sync_limit` is
/// not set: one page of WordPress's REST API.
pub const DEFAULT_WP_SYNC_LIMIT: u32 = 100;

/// `[kinds.wordpress]`.
#[derive(Debug, Clone)]
pub struct WordPressConfig {
    /// The site's URL without a trailing `/`; the REST API is `<url>/wp-json/`.
    pub url: String,
    /// The user whose Application Password authenticates every call.
    pub user: String,
    /// The Application Password (from `app_password_env`); shown as `***`.
    pub app_password: Secret,
    /// Drafts in WordPress (`drafts = "pending" | "draft"`) or in slotgate.
    pub drafts: WpDrafts,
    /// The pause of each worker's background refresh of the drafts after
    /// the end of the last one (`refresh_every`, default 5s; 0 = 1 s, the
    /// shortest pause).
    pub refresh_every: Duration,
    /// At most this many posts (the oldest) per sync (`sync_limit`, 1..=1000).
    pub sync_limit: u32,
}

impl WordPressConfig {
    /// The site as one place, whatever way its URL is written: the scheme
    /// and host lowercased, a default port dropped, `.`/`..` segments and
    /// a trailing `/` removed (`http://Blog.Example:80/./` and
    /// `http://blog.example` are one site). Two kinds mirroring one site's
    /// posts are refused by this, not by the raw strings.
    pub fn site(&self) -> String {
        match reqwest::Url::parse(&self.url) {
            Ok(u) => format!(
                "{}://{}{}{}",
                u.scheme(),
                u.host_str().unwrap_or("").trim_end_matches('.'),
                u.port().map(|p| format!(":{p}")).unwrap_or_default(),
                u.path().trim_end_matches('/')
            ),
            Err(_) => self.url.to_ascii_lowercase(),
        }
    }
}

/// `[kinds.indexnow]`.
#[derive(Debug, Clone)]
pub struct IndexNowConfig {
    /// Where the `POST` goes, e.g. `https://api.indexnow.org/indexnow`.
    pub endpoint: String,
    /// The site's IndexNow key (from `key_env`).
    pub key: Secret,
    /// The `host` of the published URLs, as IndexNow expects it.
    pub host: String,
    /// `keyLocation`, when the key file is not at `https://<host>/<key>.txt`.
    pub key_location: Option<String>,
}

/// The secret in the environment variable `key` names; `key` must be set.
fn required_secret(keys: &Keys<'_>, key: &str) -> Result<Secret, FieldError> {
    keys.secret(key)?
        .ok_or_else(|| (key.to_owned(), "missing".to_owned()))
}

/// Parses `[kinds.wordpress]`.
pub(super) fn wordpress(keys: &Keys<'_>) -> Result<WordPressConfig, FieldError> {
    keys.known(&[
        "url",
        "user",
        "app_password_env",
        "drafts",
        "slug",
        "refresh_every",
        "sync_limit",
    ])?;
    let url = keys
        .url("url")?
        .ok_or_else(|| ("url".to_owned(), "missing".to_owned()))?;
    let url = url.trim_end_matches('/').to_owned();
    let user = keys.required("user")?;
    if user.is_empty() {
        return Err(("user".into(), "must not be empty".into()));
    }
    let app_password = required_secret(keys, "app_password_env")?;
    let drafts = match keys.string("drafts")?.as_deref() {
        Some("pending") => WpDrafts::InWordPress(WpDraftStatus::Pending),
        Some("draft") => WpDrafts::InWordPress(WpDraftStatus::Draft),
        Some(other) => {
            return Err((
                "drafts".into(),
                format!("unknown status {other:?} (expected \"pending\" or \"draft\"; leave it out to keep drafts in slotgate)"),
            ))
        }
        None => WpDrafts::InSlotgate {
            slug: SlugTemplate::parse(keys.string("slug")?.as_deref().unwrap_or(DEFAULT_SLUG))
                .map_err(|m| ("slug".to_owned(), m))?,
        },
    };
    if matches!(drafts, WpDrafts::InWordPress(_)) && keys.has("slug") {
        return Err((
            "slug".into(),
            "only for drafts kept in slotgate: a post that lives in WordPress keeps its own slug"
                .into(),
        ));
    }
    let refresh_every = keys.duration(
        "refresh_every",
        Some(DEFAULT_WP_REFRESH),
        super::bound::WP_REFRESH,
    )?;
    let sync_limit = keys.count("sync_limit", DEFAULT_WP_SYNC_LIMIT, 1, 1000)?;
    Ok(WordPressConfig {
        url,
        user,
        app_password,
        drafts,
        refresh_every,
        sync_limit,
    })
}

/// Parses `[kinds.indexnow]`.
pub(super) fn indexnow(keys: &Keys<'_>) -> Result<IndexNowConfig, FieldError> {
    keys.known(&["endpoint", "key_env", "host", "key_location"])?;
    let endpoint = keys
        .url("endpoint")?
        .ok_or_else(|| ("endpoint".to_owned(), "missing".to_owned()))?;
    let key = required_secret(keys, "key_env")?;
    // IndexNow keys: 8 to 128 of [a-zA-Z0-9-].
    let k = key.expose();
    if !(8..=128).contains(&k.len()) || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err((
            "key_env".into(),
            "the key must be 8 to 128 characters of a-z, A-Z, 0-9 and '-' (IndexNow's rule)".into(),
        ));
    }
    let host = keys.required("host")?;
    if host.is_empty() || host.contains(['/', ':', '@', ' ']) {
        return Err((
            "host".into(),
            format!("{host:?} is not a bare host name (e.g. \"blog.example.com\")"),
        ));
    }
    Ok(IndexNowConfig {
        endpoint,
        key,
        host,
        key_location: keys.url("key_location")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slug_is_filled_and_reduced_to_what_wordpress_keeps() {
        let t = SlugTemplate::parse("Post {kind}_{day}/{slot}").unwrap();
        let day = chrono::NaiveDate::from_ymd_opt(2026, 12, 3).unwrap();
        assert_eq!(t.fill("my_kind", day, 2, 7), "post-my-kind-2026-12-03-2");
        let d = SlugTemplate::parse(DEFAULT_SLUG).unwrap();
        assert_eq!(d.fill("article", day, 1, 7), "article-2026-12-03-1");
    }

    #[test]
    fn a_slug_template_must_name_the_slot_and_only_stable_parts() {
        assert!(SlugTemplate::parse("{kind}-{day}")
            .unwrap_err()
            .contains("{slot}"));
        assert!(SlugTemplate::parse("{title}-{kind}-{day}-{slot}")
            .unwrap_err()
            .contains("{title}"));
        assert!(SlugTemplate::parse("{kind-{day}-{slot}").is_err());
    }
}

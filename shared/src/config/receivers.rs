//! The receiver sections of a kind: `[kinds.wordpress]` (publish to a
//! WordPress site) and `[kinds.indexnow]` (push published URLs with the
//! IndexNow protocol). The webhook receiver's keys (`publish_url`,
//! `probe_url`, `index_url`, `auth`, …) are plain keys of the kind and are
//! read with the rest of it in [`super`].
//!
//! Each section is validated completely here, like every other part of the
//! file: an unknown key, a bad URL or a missing environment variable is an
//! error naming `wordpress.<key>` / `indexnow.<key>`. Passwords and keys are
//! read from the environment variable named in the file, never from the file.

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

/// How often at most a worker re-reads a WordPress kind's drafts before its
/// gate, when `refresh_every` is not set.
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
    /// At most one refresh of the drafts per this long per worker and kind
    /// (`refresh_every`, default 5s, 0 = before every gate).
    pub refresh_every: Duration,
    /// At most this many posts (the oldest) per sync (`sync_limit`, 1..=1000).
    pub sync_limit: u32,
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

/// What a section parser reports: the key (relative to the section) and
/// the message.
pub(super) type SectionError = (String, String);

/// The environment the section parsers read secrets from (the file's
/// own, so tests can give one).
pub(super) struct Helpers<'a> {
    pub env: &'a dyn Fn(&str) -> Option<String>,
}

impl Helpers<'_> {
    fn string(&self, t: &toml::Table, key: &str) -> Result<Option<String>, SectionError> {
        match t.get(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err((key.into(), "expected a string".into())),
        }
    }

    fn required(&self, t: &toml::Table, key: &str) -> Result<String, SectionError> {
        self.string(t, key)?
            .ok_or_else(|| (key.into(), "missing".into()))
    }

    fn url(&self, t: &toml::Table, key: &str) -> Result<Option<String>, SectionError> {
        let u = self.string(t, key)?;
        if let Some(u) = &u {
            super::check_url(u).map_err(|m| (key.to_owned(), m))?;
        }
        Ok(u)
    }

    fn secret(&self, t: &toml::Table, key: &str) -> Result<Secret, SectionError> {
        let var = self.required(t, key)?;
        super::env_secret(self.env, &var).map_err(|m| (key.to_owned(), m))
    }
}

fn known_keys(t: &toml::Table, known: &[&str]) -> Result<(), SectionError> {
    match t.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err((k.clone(), "unknown field".into())),
        None => Ok(()),
    }
}

/// Parses `[kinds.wordpress]`.
pub(super) fn wordpress(t: &toml::Table, h: &Helpers<'_>) -> Result<WordPressConfig, SectionError> {
    known_keys(
        t,
        &[
            "url",
            "user",
            "app_password_env",
            "drafts",
            "slug",
            "refresh_every",
            "sync_limit",
        ],
    )?;
    let url = h
        .url(t, "url")?
        .ok_or_else(|| ("url".to_owned(), "missing".to_owned()))?;
    let url = url.trim_end_matches('/').to_owned();
    let user = h.required(t, "user")?;
    if user.is_empty() {
        return Err(("user".into(), "must not be empty".into()));
    }
    let app_password = h.secret(t, "app_password_env")?;
    let drafts = match h.string(t, "drafts")?.as_deref() {
        Some("pending") => WpDrafts::InWordPress(WpDraftStatus::Pending),
        Some("draft") => WpDrafts::InWordPress(WpDraftStatus::Draft),
        Some(other) => {
            return Err((
                "drafts".into(),
                format!("unknown status {other:?} (expected \"pending\" or \"draft\"; leave it out to keep drafts in slotgate)"),
            ))
        }
        None => WpDrafts::InSlotgate {
            slug: SlugTemplate::parse(h.string(t, "slug")?.as_deref().unwrap_or(DEFAULT_SLUG))
                .map_err(|m| ("slug".to_owned(), m))?,
        },
    };
    if matches!(drafts, WpDrafts::InWordPress(_)) && t.contains_key("slug") {
        return Err((
            "slug".into(),
            "only for drafts kept in slotgate: a post that lives in WordPress keeps its own slug"
                .into(),
        ));
    }
    let refresh_every = match h.string(t, "refresh_every")? {
        None => DEFAULT_WP_REFRESH,
        Some(v) => super::WP_REFRESH
            .parse(&v)
            .map_err(|m| ("refresh_every".to_owned(), m))?,
    };
    let sync_limit = match t.get("sync_limit") {
        None => DEFAULT_WP_SYNC_LIMIT,
        Some(toml::Value::Integer(n)) if (1..=1000).contains(n) => *n as u32,
        Some(_) => {
            return Err((
                "sync_limit".into(),
                "expected an integer in 1..=1000".into(),
            ))
        }
    };
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
pub(super) fn indexnow(t: &toml::Table, h: &Helpers<'_>) -> Result<IndexNowConfig, SectionError> {
    known_keys(t, &["endpoint", "key_env", "host", "key_location"])?;
    let endpoint = h
        .url(t, "endpoint")?
        .ok_or_else(|| ("endpoint".to_owned(), "missing".to_owned()))?;
    let key = h.secret(t, "key_env")?;
    // IndexNow keys: 8 to 128 of [a-zA-Z0-9-].
    let k = key.expose();
    if !(8..=128).contains(&k.len()) || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        return Err((
            "key_env".into(),
            "the key must be 8 to 128 characters of a-z, A-Z, 0-9 and '-' (IndexNow's rule)".into(),
        ));
    }
    let host = h.required(t, "host")?;
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
        key_location: h.url(t, "key_location")?,
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

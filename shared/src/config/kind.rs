//! One `[[kinds]]` table: a kind's name, zone, slots, cap and deadlines,
//! and the limits of its webhook calls. Its receiver keys are read by
//! [`super::webhook`] (the plain webhook keys) and [`super::receivers`]
//! (the `[kinds.wordpress]` and `[kinds.indexnow]` sections), in the order
//! the kind's checks always ran, so a file with several mistakes reports
//! the same one first.

use super::bound::{HTTP_TIMEOUT, JITTER, RETRY_BASE, RETRY_CAP, STARTING_DEADLINE};
use super::calendar::{self, Calendar, Day};
use super::keys::{FieldError, Keys};
use super::receivers::{self, IndexNowConfig, WordPressConfig, WpDraftStatus, WpDrafts};
use super::webhook::{self, WebhookAuth};
use chrono::NaiveTime;
use chrono_tz::Tz;
use std::path::Path;
use std::time::Duration;

/// One kind of scheduled work.
#[derive(Debug, Clone)]
pub struct KindConfig {
    /// `[a-z0-9_-]{1,64}`, unique in the file. Part of every slot key, so a
    /// renamed kind's slots are new slots: the old gate rows do not guard
    /// them.
    pub name: String,
    /// The IANA zone the `slots` and the daily cap's "day" are local to.
    pub timezone: Tz,
    /// Local times, in the file's order: the `slots` list, then the
    /// times only `[[kinds.on]]` lists name; or a `cron` expression's
    /// times, ascending. Which of them run on a given day is the
    /// calendar's say ([`KindConfig::calendar`]).
    pub slots: Vec<NaiveTime>,
    /// The slot number of each of `slots` (same order). Parsing gives the
    /// 1-based positions; a process with Postgres replaces them with the
    /// numbers kept in `slot_number` ([`crate::store::number_kinds`]), so a
    /// schedule edit re-keys no slot (DESIGN 4.18).
    pub slot_numbers: Vec<u32>,
    /// Numbers once given to times no longer in `slots` (with the time),
    /// ascending: their planned slots that have not run are cancelled.
    pub retired_slots: Vec<(u32, NaiveTime)>,
    /// Due time = nominal time + an offset in `[0, jitter)`, fixed per slot;
    /// zero (the default) means due exactly at the nominal time.
    pub jitter: Duration,
    /// Most publishes of this kind per local day; further slots are
    /// `skipped/quota_full`. Zero publishes nothing. A `[[kinds.on]]` list
    /// may set its own: ask [`KindConfig::day`].
    pub daily_cap: u32,
    /// `rotate_by = "category"`: the gate picks the category published
    /// least recently first (then priority, age, id within it), so one
    /// section cannot fill a day.
    pub rotate_by_category: bool,
    /// Which days run which of `slots`, their caps, and the blackout
    /// dates (`weekdays`, `[[kinds.on]]`, `cron`, `blackout`).
    pub calendar: Calendar,
    /// A delivery that starts later than due + this is
    /// `skipped/missed_deadline` (callers `manual` and `backfill` excepted).
    pub starting_deadline: Duration,
    /// Where drafts are published; `None` is record-only (no HTTP call).
    pub publish_url: Option<String>,
    /// Where a webhook publish that may have been applied is looked up
    /// before it is sent again (`GET`, same `Idempotency-Key`: `200
    /// {"url"}` applied, `404` not applied). `None`: a re-send relies on the
    /// CMS honouring the key.
    pub probe_url: Option<String>,
    /// Where a publish is pushed for indexing after it succeeded; `None`
    /// skips the push.
    pub index_url: Option<String>,
    /// `[kinds.wordpress]`: publish to a WordPress site instead of
    /// `publish_url`.
    pub wordpress: Option<WordPressConfig>,
    /// `[kinds.indexnow]`: push each published URL with IndexNow.
    pub indexnow: Option<IndexNowConfig>,
    /// Limit of one webhook try (default 30s), not of the whole call with
    /// its retries.
    pub http_timeout: Duration,
    /// Attempts per webhook call, including the first (default 5).
    pub http_attempts: u32,
    /// Backoff base for webhook retries (default 500ms).
    pub retry_base: Duration,
    /// Backoff cap for webhook retries (default 30s).
    pub retry_cap: Duration,
    /// How the webhook calls of this kind authenticate and whom they trust.
    pub auth: WebhookAuth,
}

impl KindConfig {
    /// No receiver: the publish is recorded in Postgres only, inside the
    /// gate transaction.
    pub fn record_only(&self) -> bool {
        self.publish_url.is_none() && self.wordpress.is_none()
    }

    /// The CMS this kind publishes to, as one server: the origin (scheme,
    /// host, port) of its `publish_url` or of its WordPress site; `None`
    /// for a record-only kind. Kinds that name one CMS hang together when
    /// it hangs, so a worker keeps its last call permits per CMS, not per
    /// kind (`worker/calls.rs`).
    pub fn cms(&self) -> Option<String> {
        let url = match (&self.wordpress, &self.publish_url) {
            (Some(wp), _) => &wp.url,
            (None, Some(url)) => url,
            (None, None) => return None,
        };
        Some(match reqwest::Url::parse(url) {
            Ok(u) => u.origin().ascii_serialization(),
            Err(_) => url.to_ascii_lowercase(),
        })
    }

    /// Every spelling of the kind's secrets (bearer token, signing secret,
    /// IndexNow key, WordPress Application Password with and without its
    /// spaces) that an answer echoing a request could carry back: what is
    /// hidden ([`crate::untrusted::scrub`]) from every detail the executor
    /// stores, whichever receiver produced it.
    pub fn secret_spellings(&self) -> Vec<String> {
        let mut secrets = self.auth.secret_spellings();
        if let Some(ix) = &self.indexnow {
            secrets.extend(crate::untrusted::secret_spellings(ix.key.expose()));
        }
        if let Some(wp) = &self.wordpress {
            let password = wp.app_password.expose();
            secrets.extend(crate::untrusted::secret_spellings(password));
            // WordPress takes an Application Password with or without the
            // spaces it shows it with.
            let bare: String = password.chars().filter(|c| *c != ' ').collect();
            secrets.extend(crate::untrusted::secret_spellings(&bare));
        }
        secrets.sort();
        secrets.dedup();
        secrets
    }

    /// What the calendar says of local `day`: which slots run, the day's
    /// cap, whether it is blacked out.
    pub fn day(&self, day: chrono::NaiveDate) -> Day<'_> {
        self.calendar.day(day, self.daily_cap)
    }

    /// A WordPress kind whose drafts live in WordPress (mirrored into the
    /// draft table before the gate picks one).
    pub fn drafts_in_wordpress(&self) -> Option<(&WordPressConfig, WpDraftStatus)> {
        let wp = self.wordpress.as_ref()?;
        match wp.drafts {
            WpDrafts::InWordPress(s) => Some((wp, s)),
            WpDrafts::InSlotgate { .. } => None,
        }
    }
}

/// `http_timeout` when a kind does not set it.
pub const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(30);
/// `http_attempts` when a kind does not set it (first try included).
pub const DEFAULT_HTTP_ATTEMPTS: u32 = 5;
/// `retry_base` when a kind does not set it.
pub const DEFAULT_RETRY_BASE: Duration = Duration::from_millis(500);
/// `retry_cap` when a kind does not set it.
pub const DEFAULT_RETRY_CAP: Duration = Duration::from_secs(30);

const KIND_FIELDS: &[&str] = &[
    "name",
    "timezone",
    "slots",
    "weekdays",
    "on",
    "cron",
    "blackout",
    "rotate_by",
    "jitter",
    "daily_cap",
    "starting_deadline",
    "publish_url",
    "probe_url",
    "index_url",
    "wordpress",
    "indexnow",
    "http_timeout",
    "http_attempts",
    "retry_base",
    "retry_cap",
    "auth",
    "token_env",
    "signing_secret_env",
    "ca_file",
    "allow_insecure_http",
];

/// Reads the `[[kinds]]` table of the kind called `name` (already checked:
/// valid and unique); `config_path` resolves a relative `ca_file`.
pub(super) fn parse(
    name: String,
    keys: &Keys<'_>,
    config_path: &Path,
) -> Result<KindConfig, FieldError> {
    keys.known(KIND_FIELDS)?;
    let tz_s = keys.required("timezone")?;
    let timezone: Tz = tz_s.parse().map_err(|_| {
        (
            "timezone".to_owned(),
            format!("unknown time zone {tz_s:?} (expected an IANA name such as \"Europe/Berlin\")"),
        )
    })?;
    let base = if keys.has("slots") || !keys.has("cron") {
        Some(slots(keys)?)
    } else {
        None
    };
    let daily_cap = daily_cap(keys)?;
    let (slots, calendar) = calendar::parse(keys, base, daily_cap)?;
    let rotate_by_category = match keys.string("rotate_by")?.as_deref() {
        None => false,
        Some("category") => true,
        Some(other) => {
            return Err((
                "rotate_by".into(),
                format!("unknown value {other:?} (expected \"category\")"),
            ))
        }
    };
    let http_attempts = keys.count("http_attempts", DEFAULT_HTTP_ATTEMPTS, 1, 100)?;
    let http_timeout = keys.duration("http_timeout", Some(DEFAULT_HTTP_TIMEOUT), HTTP_TIMEOUT)?;
    let auth = webhook::auth(keys, config_path)?;
    let in_section =
        |key: &'static str| move |(field, m): FieldError| (format!("{key}.{field}"), m);
    let wordpress = match keys.section("wordpress")? {
        None => None,
        Some(s) => Some(receivers::wordpress(&s).map_err(in_section("wordpress"))?),
    };
    let indexnow = match keys.section("indexnow")? {
        None => None,
        Some(s) => Some(receivers::indexnow(&s).map_err(in_section("indexnow"))?),
    };
    // Drafts kept in WordPress are mirrored without a category (see
    // docs/configuration.md, "Which draft goes next": WordPress's
    // categories and sticky flag do not say what slotgate's do), so
    // rotating them would be a silent no-op.
    if rotate_by_category
        && wordpress
            .as_ref()
            .is_some_and(|wp| matches!(wp.drafts, super::receivers::WpDrafts::InWordPress(_)))
    {
        return Err((
            "rotate_by".into(),
            "not available for a kind whose drafts live in WordPress ([kinds.wordpress] drafts): its mirrored drafts carry no category".into(),
        ));
    }
    let urls = webhook::urls(keys)?;
    webhook::check(keys, &urls, &auth, wordpress.as_ref())?;
    Ok(KindConfig {
        jitter: keys.duration("jitter", Some(Duration::ZERO), JITTER)?,
        starting_deadline: keys.duration("starting_deadline", None, STARTING_DEADLINE)?,
        publish_url: urls.publish,
        probe_url: urls.probe,
        index_url: urls.index,
        wordpress,
        indexnow,
        http_timeout,
        http_attempts,
        retry_base: keys.duration("retry_base", Some(DEFAULT_RETRY_BASE), RETRY_BASE)?,
        retry_cap: keys.duration("retry_cap", Some(DEFAULT_RETRY_CAP), RETRY_CAP)?,
        auth,
        name,
        timezone,
        slot_numbers: (1..=slots.len() as u32).collect(),
        retired_slots: Vec::new(),
        slots,
        daily_cap,
        calendar,
        rotate_by_category,
    })
}

/// `daily_cap`: a required non-negative integer.
pub(super) fn daily_cap(keys: &Keys<'_>) -> Result<u32, FieldError> {
    match keys.get("daily_cap") {
        None => Err(("daily_cap".into(), "missing".into())),
        Some(toml::Value::Integer(n)) if *n >= 0 && *n <= i64::from(u32::MAX) => Ok(*n as u32),
        Some(toml::Value::Integer(n)) => Err((
            "daily_cap".into(),
            format!("must be a non-negative integer, got {n}"),
        )),
        Some(_) => Err(("daily_cap".into(), "expected an integer".into())),
    }
}

/// `slots`: at least one `"HH:MM[:SS]"`; a bad one is named `slots[i]`.
pub(super) fn slots(keys: &Keys<'_>) -> Result<Vec<NaiveTime>, FieldError> {
    let slots_v = keys
        .get("slots")
        .ok_or_else(|| ("slots".to_owned(), "missing".to_owned()))?;
    let slots_a = slots_v.as_array().ok_or_else(|| {
        (
            "slots".to_owned(),
            "expected an array of \"HH:MM[:SS]\" strings".to_owned(),
        )
    })?;
    if slots_a.is_empty() {
        return Err(("slots".into(), "at least one slot is required".into()));
    }
    let mut slots = Vec::with_capacity(slots_a.len());
    for (j, s) in slots_a.iter().enumerate() {
        let field = format!("slots[{j}]");
        let s = s
            .as_str()
            .ok_or_else(|| (field.clone(), "expected a \"HH:MM[:SS]\" string".to_owned()))?;
        slots.push(parse_time(s).ok_or_else(|| {
            (
                field.clone(),
                format!("bad time {s:?} (expected HH:MM or HH:MM:SS)"),
            )
        })?);
    }
    Ok(slots)
}

/// Kind names are part of slot keys and Redis members: `[a-z0-9_-]{1,64}`.
pub fn valid_kind_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// `HH:MM` or `HH:MM:SS`, 24-hour.
pub fn parse_time(s: &str) -> Option<NaiveTime> {
    let parts: Vec<&str> = s.split(':').collect();
    if !(2..=3).contains(&parts.len())
        || parts
            .iter()
            .any(|p| p.len() != 2 || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    let n = |i: usize| parts.get(i).map_or(Some(0), |p| p.parse::<u32>().ok());
    NaiveTime::from_hms_opt(n(0)?, n(1)?, n(2)?)
}

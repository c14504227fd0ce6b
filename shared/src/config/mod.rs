//! `slotgate.toml`: the kinds, their schedules and their limits.
//!
//! The file is validated completely at start: a scheduler that discovers a
//! bad time zone at 02:00 on the day of a DST change has already failed. Every
//! error names the file, the kind and the field, and the binaries exit with
//! status 2 on any of them.
//!
//! Every value is bounded, so nothing a config file says can make a delivery
//! panic or hang: each duration has a documented range ([`Bound`]), URLs may
//! not carry credentials (they would end up in logs and error messages), and
//! a TOML syntax error says where it is.
//!
//! Webhook secrets are never written in the file: `token_env` and
//! `signing_secret_env` name environment variables that are read once, here,
//! at start, into [`Secret`]s (which print as `***`). A missing or empty
//! variable is a config error naming the variable, never a value. A kind's
//! `ca_file` is read and parsed here too, so a bad CA fails the start, not
//! the first publish.

mod receivers;

pub use receivers::{
    IndexNowConfig, SlugTemplate, WordPressConfig, WpDraftStatus, WpDrafts, DEFAULT_SLUG,
    DEFAULT_WP_REFRESH, DEFAULT_WP_SYNC_LIMIT,
};

use crate::secret::Secret;
use chrono::NaiveTime;
use chrono_tz::Tz;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was read from (for messages).
    pub path: PathBuf,
    /// Per-installation seed mixed into every slot's jitter, so two
    /// installations do not jitter in lockstep. Top-level `jitter_seed`.
    pub jitter_seed: String,
    /// How many partitions the Redis queue is spread over (top-level
    /// `redis_partitions`, 1 to 64, default 1: the layout and key names
    /// slotgate always used). More than one spreads a Redis Cluster's load
    /// over its shards (see `queue::KeySpace`). Every process of an
    /// installation must use the same number.
    pub redis_partitions: u16,
    /// The `[[kinds]]` tables in file order; at least one, names unique.
    pub kinds: Vec<KindConfig>,
}

/// One kind of scheduled work.
#[derive(Debug, Clone)]
pub struct KindConfig {
    /// `[a-z0-9_-]{1,64}`, unique in the file. Part of every slot key, so a
    /// renamed kind's slots are new slots: the old gate rows do not guard
    /// them.
    pub name: String,
    /// The IANA zone the `slots` and the daily cap's "day" are local to.
    pub timezone: Tz,
    /// Local times, in the file's order.
    pub slots: Vec<NaiveTime>,
    /// The slot number of each of `slots` (same order). Parsing gives the
    /// 1-based positions; a process with Postgres replaces them with the
    /// numbers kept in `slot_number` ([`Config::number_slots`]), so a
    /// schedule edit re-keys no slot (DESIGN 4.18).
    pub slot_numbers: Vec<u32>,
    /// Numbers once given to times no longer in `slots` (with the time),
    /// ascending: their planned slots that have not run are cancelled.
    pub retired_slots: Vec<(u32, NaiveTime)>,
    /// Due time = nominal time + an offset in `[0, jitter)`, fixed per slot;
    /// zero (the default) means due exactly at the nominal time.
    pub jitter: Duration,
    /// Most publishes of this kind per local day; further slots are
    /// `skipped/quota_full`. Zero publishes nothing.
    pub daily_cap: u32,
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

/// A kind's webhook credentials and extra trust (`auth`, `token_env`,
/// `signing_secret_env`, `ca_file`). `Debug` shows `***` for the secrets.
#[derive(Debug, Clone, Default)]
pub struct WebhookAuth {
    /// `auth = "bearer"`: sent as `Authorization: Bearer <token>`.
    pub bearer: Option<Secret>,
    /// Key of the `Slotgate-Signature` HMAC of every request.
    pub signing_secret: Option<Secret>,
    /// A CA trusted in addition to the system roots.
    pub ca: Option<CaFile>,
}

/// A PEM file of one or more CA certificates, read and parsed at start.
#[derive(Debug, Clone)]
pub struct CaFile {
    /// Where the bundle was read from (resolved against the config file's
    /// directory), for messages.
    pub path: PathBuf,
    /// Every certificate in the file; never empty.
    pub certs: Vec<reqwest::Certificate>,
}

impl CaFile {
    /// Reads `path` and parses every certificate in it; at least one is
    /// required (a file of something else would otherwise trust nothing
    /// extra, silently).
    pub fn load(path: &Path) -> Result<CaFile, String> {
        let pem =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("{} is not a PEM certificate bundle: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            ));
        }
        Ok(CaFile {
            path: path.to_owned(),
            certs,
        })
    }
}

/// A configuration error, naming the file, the kind and the field.
#[derive(Debug, thiserror::Error)]
#[error("{}: {}{}{}", path.display(), kind.as_ref().map(|k| format!("kind \"{k}\": ")).unwrap_or_default(), field.as_ref().map(|f| format!("field `{f}`: ")).unwrap_or_default(), message)]
pub struct ConfigError {
    /// The config file the error is in.
    pub path: PathBuf,
    /// The kind's name, `#N` before its name is known, or `None` for a
    /// top-level error.
    pub kind: Option<String>,
    /// The offending field (`slots[1]`, `token_env`, …); `None` when the
    /// error is about the file or table as a whole.
    pub field: Option<String>,
    /// What is wrong, in words; never a secret's value.
    pub message: String,
}

/// `http_timeout` when a kind does not set it.
pub const DEFAULT_HTTP_TIMEOUT: Duration = Duration::from_secs(30);
/// `http_attempts` when a kind does not set it (first try included).
pub const DEFAULT_HTTP_ATTEMPTS: u32 = 5;
/// `retry_base` when a kind does not set it.
pub const DEFAULT_RETRY_BASE: Duration = Duration::from_millis(500);
/// `retry_cap` when a kind does not set it.
pub const DEFAULT_RETRY_CAP: Duration = Duration::from_secs(30);
/// `jitter_seed` when the file does not set it; installations that keep it
/// jitter alike.
pub const DEFAULT_JITTER_SEED: &str = "slotgate";

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(24 * 3600);

/// The accepted range of one duration setting. The upper limits keep every
/// sum of a setting and an instant far inside chrono's and Postgres's
/// ranges, and catch typos (`"2000h"` for `"20h"`) at start instead of at
/// 02:00.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The smallest accepted value (inclusive).
    pub min: Duration,
    /// The largest accepted value, inclusive unless `max_excluded`.
    pub max: Duration,
    /// `max` itself is out of range (jitter: *less than* a day).
    pub max_excluded: bool,
}

impl Bound {
    const fn between(min: Duration, max: Duration) -> Bound {
        Bound {
            min,
            max,
            max_excluded: false,
        }
    }

    const fn up_to(max: Duration) -> Bound {
        Bound::between(Duration::ZERO, max)
    }

    /// `Ok(d)` when `d` is in range, else a message stating the range.
    pub fn check(&self, d: Duration) -> Result<Duration, String> {
        let over = if self.max_excluded {
            d >= self.max
        } else {
            d > self.max
        };
        if d < self.min || over {
            return Err(format!("{} is out of range: {}", show(d), self.describe()));
        }
        Ok(d)
    }

    /// Parses a humane duration and checks it.
    pub fn parse(&self, s: &str) -> Result<Duration, String> {
        self.check(parse_duration(s)?)
    }

    /// `at least 100ms and at most 1h`, `less than 1day`, …
    pub fn describe(&self) -> String {
        let max = if self.max_excluded {
            format!("less than {}", show(self.max))
        } else {
            format!("at most {}", show(self.max))
        };
        if self.min.is_zero() {
            format!("must be {max}")
        } else {
            format!("must be at least {} and {max}", show(self.min))
        }
    }
}

fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// `jitter`: less than a day, so a slot's due time stays on its day's side
/// of the next day's slots.
pub const JITTER: Bound = Bound {
    min: Duration::ZERO,
    max: DAY,
    max_excluded: true,
};
/// `starting_deadline`: at most 7 days.
pub const STARTING_DEADLINE: Bound = Bound::up_to(Duration::from_secs(7 * 24 * 3600));
/// `http_timeout`: more than zero, at most 10 minutes.
pub const HTTP_TIMEOUT: Bound = Bound::between(Duration::from_millis(1), Duration::from_secs(600));
/// `retry_base`: at most 10 minutes.
pub const RETRY_BASE: Bound = Bound::up_to(Duration::from_secs(600));
/// `retry_cap`: at most an hour.
pub const RETRY_CAP: Bound = Bound::up_to(HOUR);

/// The worker's `--visibility` (claim and delivery lifetime without a
/// heartbeat): 100ms to 1h.
pub const VISIBILITY: Bound = Bound::between(Duration::from_millis(100), HOUR);
/// The worker's `--lease-ttl`: 100ms to 10 minutes.
pub const LEASE_TTL: Bound = Bound::between(Duration::from_millis(100), Duration::from_secs(600));
/// The worker's `--shutdown-grace` and `--reconcile-every`: 100ms to 1h.
pub const WORKER_PERIOD: Bound = Bound::between(Duration::from_millis(100), HOUR);
/// `planner run --every`: 1s to 12h (it plans today and tomorrow each
/// round, so a round must come at least once a day).
pub const PLAN_EVERY: Bound =
    Bound::between(Duration::from_secs(1), Duration::from_secs(12 * 3600));

/// The worker's `--forget-after` (gone consumers and heartbeats): 1 minute
/// to 30 days.
pub const FORGET_AFTER: Bound =
    Bound::between(Duration::from_secs(60), Duration::from_secs(30 * 24 * 3600));
/// `--redis-connect-timeout`: 100ms to 10 minutes.
pub const REDIS_CONNECT_TIMEOUT: Bound =
    Bound::between(Duration::from_millis(100), Duration::from_secs(600));
/// `[kinds.wordpress] refresh_every`: at most 10 minutes.
pub const WP_REFRESH: Bound = Bound::up_to(Duration::from_secs(600));
/// `planner trigger --wait-timeout`: 1s to 1 day.
pub const WAIT_TIMEOUT: Bound = Bound::between(Duration::from_secs(1), DAY);

const KIND_FIELDS: &[&str] = &[
    "name",
    "timezone",
    "slots",
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

impl Config {
    /// Reads and validates a file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            path: path.to_owned(),
            kind: None,
            field: None,
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(path, &text)
    }

    /// Validates configuration text; `path` is used in messages and to
    /// resolve a relative `ca_file`. Secrets come from the process's
    /// environment.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        Self::parse_with_env(path, text, &|name| std::env::var(name).ok())
    }

    /// [`Config::parse`] with the environment given as a lookup.
    pub fn parse_with_env(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let err = |kind: Option<&str>, field: Option<&str>, message: String| ConfigError {
            path: path.to_owned(),
            kind: kind.map(str::to_owned),
            field: field.map(str::to_owned),
            message,
        };
        let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            let at = e
                .span()
                .map(|span| {
                    let (line, column) = line_column(text, span.start);
                    format!(" at line {line}, column {column}")
                })
                .unwrap_or_default();
            err(
                None,
                None,
                format!("not valid TOML{at}: {}", e.message().trim()),
            )
        })?;
        for key in table.keys() {
            if key != "kinds" && key != "jitter_seed" && key != "redis_partitions" {
                return Err(err(None, Some(key), "unknown field".into()));
            }
        }
        let jitter_seed = match table.get("jitter_seed") {
            None => DEFAULT_JITTER_SEED.to_owned(),
            Some(toml::Value::String(s)) => s.clone(),
            Some(_) => return Err(err(None, Some("jitter_seed"), "expected a string".into())),
        };
        let redis_partitions = match table.get("redis_partitions") {
            None => 1,
            Some(toml::Value::Integer(n))
                if (1..=i64::from(crate::queue::MAX_PARTITIONS)).contains(n) =>
            {
                *n as u16
            }
            Some(v) => {
                return Err(err(
                    None,
                    Some("redis_partitions"),
                    format!(
                        "expected a whole number from 1 to {}, got {}",
                        crate::queue::MAX_PARTITIONS,
                        crate::untrusted::truncate(&format!("{v:?}"))
                    ),
                ))
            }
        };
        let kinds_v = table.get("kinds").ok_or_else(|| {
            err(
                None,
                Some("kinds"),
                "missing: at least one [[kinds]] table is required".into(),
            )
        })?;
        let kinds_arr = kinds_v.as_array().ok_or_else(|| {
            err(
                None,
                Some("kinds"),
                "expected an array of tables ([[kinds]])".into(),
            )
        })?;
        if kinds_arr.is_empty() {
            return Err(err(
                None,
                Some("kinds"),
                "at least one kind is required".into(),
            ));
        }
        let mut kinds: Vec<KindConfig> = Vec::with_capacity(kinds_arr.len());
        for (i, v) in kinds_arr.iter().enumerate() {
            let label = format!("#{}", i + 1);
            let t = v
                .as_table()
                .ok_or_else(|| err(Some(&label), None, "expected a table".into()))?;
            let name = match t.get("name") {
                Some(toml::Value::String(s)) => s.clone(),
                Some(_) => return Err(err(Some(&label), Some("name"), "expected a string".into())),
                None => return Err(err(Some(&label), Some("name"), "missing".into())),
            };
            if !valid_kind_name(&name) {
                return Err(err(
                    Some(&name),
                    Some("name"),
                    format!("bad kind name {name:?}: must match [a-z0-9_-]{{1,64}}"),
                ));
            }
            if kinds.iter().any(|k| k.name == name) {
                return Err(err(Some(&name), Some("name"), "duplicate kind name".into()));
            }
            let k = Some(name.as_str());
            for key in t.keys() {
                if !KIND_FIELDS.contains(&key.as_str()) {
                    return Err(err(k, Some(key), "unknown field".into()));
                }
            }
            let string = |field: &str| -> Result<Option<String>, ConfigError> {
                match t.get(field) {
                    None => Ok(None),
                    Some(toml::Value::String(s)) => Ok(Some(s.clone())),
                    Some(_) => Err(err(k, Some(field), "expected a string".into())),
                }
            };
            let duration = |field: &str,
                            default: Option<Duration>,
                            bound: Bound|
             -> Result<Duration, ConfigError> {
                match string(field)? {
                    None => default.ok_or_else(|| err(k, Some(field), "missing".into())),
                    Some(s) => bound.parse(&s).map_err(|m| err(k, Some(field), m)),
                }
            };
            let tz_s =
                string("timezone")?.ok_or_else(|| err(k, Some("timezone"), "missing".into()))?;
            let timezone: Tz = tz_s
                .parse()
                .map_err(|_| err(k, Some("timezone"), format!("unknown time zone {tz_s:?} (expected an IANA name such as \"Europe/Berlin\")")))?;
            let slots_v = t
                .get("slots")
                .ok_or_else(|| err(k, Some("slots"), "missing".into()))?;
            let slots_a = slots_v.as_array().ok_or_else(|| {
                err(
                    k,
                    Some("slots"),
                    "expected an array of \"HH:MM[:SS]\" strings".into(),
                )
            })?;
            if slots_a.is_empty() {
                return Err(err(
                    k,
                    Some("slots"),
                    "at least one slot is required".into(),
                ));
            }
            let mut slots = Vec::with_capacity(slots_a.len());
            for (j, s) in slots_a.iter().enumerate() {
                let field = format!("slots[{j}]");
                let s = s.as_str().ok_or_else(|| {
                    err(k, Some(&field), "expected a \"HH:MM[:SS]\" string".into())
                })?;
                slots.push(parse_time(s).ok_or_else(|| {
                    err(
                        k,
                        Some(&field),
                        format!("bad time {s:?} (expected HH:MM or HH:MM:SS)"),
                    )
                })?);
            }
            let daily_cap = match t.get("daily_cap") {
                None => return Err(err(k, Some("daily_cap"), "missing".into())),
                Some(toml::Value::Integer(n)) if *n >= 0 && *n <= i64::from(u32::MAX) => *n as u32,
                Some(toml::Value::Integer(n)) => {
                    return Err(err(
                        k,
                        Some("daily_cap"),
                        format!("must be a non-negative integer, got {n}"),
                    ))
                }
                Some(_) => return Err(err(k, Some("daily_cap"), "expected an integer".into())),
            };
            let http_attempts = match t.get("http_attempts") {
                None => DEFAULT_HTTP_ATTEMPTS,
                Some(toml::Value::Integer(n)) if (1..=100).contains(n) => *n as u32,
                Some(_) => {
                    return Err(err(
                        k,
                        Some("http_attempts"),
                        "expected an integer in 1..=100".into(),
                    ))
                }
            };
            let url = |field: &str| -> Result<Option<String>, ConfigError> {
                let u = string(field)?;
                if let Some(u) = &u {
                    check_url(u).map_err(|m| err(k, Some(field), m))?;
                }
                Ok(u)
            };
            let http_timeout = duration("http_timeout", Some(DEFAULT_HTTP_TIMEOUT), HTTP_TIMEOUT)?;
            let secret = |field: &str| -> Result<Option<Secret>, ConfigError> {
                let Some(var) = string(field)? else {
                    return Ok(None);
                };
                env_secret(env, &var)
                    .map(Some)
                    .map_err(|m| err(k, Some(field), m))
            };
            let bearer = match string("auth")?.as_deref() {
                None | Some("none") => {
                    if t.contains_key("token_env") {
                        return Err(err(k, Some("token_env"), "needs auth = \"bearer\"".into()));
                    }
                    None
                }
                Some("bearer") => Some(secret("token_env")?.ok_or_else(|| {
                    err(k, Some("token_env"), "missing: auth = \"bearer\" reads its token from the environment variable named here".into())
                })?),
                Some(other) => {
                    return Err(err(k, Some("auth"), format!("unknown auth {other:?} (expected \"none\" or \"bearer\")")))
                }
            };
            let ca = match string("ca_file")? {
                None => None,
                Some(f) => {
                    let f = PathBuf::from(f);
                    let f = match path.parent() {
                        Some(dir) if f.is_relative() => dir.join(f),
                        _ => f,
                    };
                    Some(CaFile::load(&f).map_err(|m| err(k, Some("ca_file"), m))?)
                }
            };
            let auth = WebhookAuth {
                bearer,
                signing_secret: secret("signing_secret_env")?,
                ca,
            };
            let helpers = receivers::Helpers { env };
            let section = |key: &str| -> Result<Option<&toml::Table>, ConfigError> {
                match t.get(key) {
                    None => Ok(None),
                    Some(toml::Value::Table(s)) => Ok(Some(s)),
                    Some(_) => Err(err(
                        k,
                        Some(key),
                        format!("expected a table ([kinds.{key}])"),
                    )),
                }
            };
            let in_section = |key: &'static str| {
                move |(field, m): receivers::SectionError| {
                    err(k, Some(&format!("{key}.{field}")), m)
                }
            };
            let wordpress = match section("wordpress")? {
                None => None,
                Some(s) => {
                    Some(receivers::wordpress(s, &helpers).map_err(in_section("wordpress"))?)
                }
            };
            let indexnow = match section("indexnow")? {
                None => None,
                Some(s) => Some(receivers::indexnow(s, &helpers).map_err(in_section("indexnow"))?),
            };
            let publish_url = url("publish_url")?;
            let probe_url = url("probe_url")?;
            let index_url = url("index_url")?;
            let allow_insecure_http = match t.get("allow_insecure_http") {
                None => false,
                Some(toml::Value::Boolean(b)) => *b,
                Some(_) => {
                    return Err(err(
                        k,
                        Some("allow_insecure_http"),
                        "expected true or false".into(),
                    ))
                }
            };
            if !allow_insecure_http {
                let carried = if auth.bearer.is_some() {
                    Some("the bearer token (auth = \"bearer\")")
                } else if auth.signing_secret.is_some() {
                    Some("signed requests (signing_secret_env), which anyone on the path could read and replay,")
                } else {
                    None
                };
                let urls = [
                    ("publish_url", publish_url.as_deref(), carried),
                    ("probe_url", probe_url.as_deref(), carried),
                    ("index_url", index_url.as_deref(), carried),
                    (
                        "wordpress.url",
                        wordpress.as_ref().map(|w| w.url.as_str()),
                        Some("the Application Password"),
                    ),
                ];
                for (field, u, what) in urls {
                    if let (Some(u), Some(what)) = (u, what) {
                        if cleartext_to_remote(u) {
                            return Err(err(k, Some(field), format!("{} is http:// to a host that is not loopback: it would send {what} in clear text; use https://, or set allow_insecure_http = true on the kind if the network is yours", without_userinfo(u))));
                        }
                    }
                }
            }
            if wordpress.is_some() {
                for clash in [
                    "publish_url",
                    "probe_url",
                    "auth",
                    "token_env",
                    "signing_secret_env",
                ] {
                    if t.contains_key(clash) {
                        return Err(err(k, Some(clash), "not with [kinds.wordpress]: the kind publishes to WordPress, which authenticates with its Application Password".into()));
                    }
                }
            }
            if probe_url.is_some() && publish_url.is_none() {
                return Err(err(
                    k,
                    Some("probe_url"),
                    "needs publish_url: it looks up what publish_url may have applied".into(),
                ));
            }
            kinds.push(KindConfig {
                jitter: duration("jitter", Some(Duration::ZERO), JITTER)?,
                starting_deadline: duration("starting_deadline", None, STARTING_DEADLINE)?,
                publish_url,
                probe_url,
                index_url,
                wordpress,
                indexnow,
                http_timeout,
                http_attempts,
                retry_base: duration("retry_base", Some(DEFAULT_RETRY_BASE), RETRY_BASE)?,
                retry_cap: duration("retry_cap", Some(DEFAULT_RETRY_CAP), RETRY_CAP)?,
                auth,
                name,
                timezone,
                slot_numbers: (1..=slots.len() as u32).collect(),
                retired_slots: Vec::new(),
                slots,
                daily_cap,
            });
        }
        // Two kinds mirroring the same posts would each publish them.
        for (i, a) in kinds.iter().enumerate() {
            for b in &kinds[..i] {
                if let (Some((wa, sa)), Some((wb, sb))) =
                    (a.drafts_in_wordpress(), b.drafts_in_wordpress())
                {
                    if wa.url == wb.url && sa == sb {
                        return Err(err(Some(&a.name), Some("wordpress.drafts"), format!("kind {:?} already takes the {:?} posts of {}: each post would be published once per kind", b.name, sa.as_str(), without_userinfo(&wa.url))));
                    }
                }
            }
        }
        Ok(Config {
            path: path.to_owned(),
            jitter_seed,
            redis_partitions,
            kinds,
        })
    }

    /// Replaces each kind's parsed slot numbers (positions) with those kept
    /// in Postgres, numbering new times (DESIGN 4.18). Every process that
    /// plans or runs slots calls this once, before it does either.
    pub async fn number_slots(&mut self, pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
        let kinds: Vec<(&str, &[NaiveTime])> = self
            .kinds
            .iter()
            .map(|k| (k.name.as_str(), k.slots.as_slice()))
            .collect();
        let mut numbered = crate::store::number_slots(pool, &kinds).await?;
        for k in &mut self.kinds {
            let n = numbered.remove(&k.name).expect("every kind is numbered");
            if !n.added.is_empty() && n.added.len() < k.slots.len() {
                tracing::info!(kind = %k.name, added = n.added.len(), numbers = ?n.active, "new slot times numbered; the others keep their numbers");
            }
            k.slot_numbers = n.active;
            k.retired_slots = n.retired;
        }
        Ok(())
    }

    /// The kind called `name`, if configured.
    pub fn kind(&self, name: &str) -> Option<&KindConfig> {
        self.kinds.iter().find(|k| k.name == name)
    }
}

/// 1-based line and column (in characters) of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = &text[..end];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (line, before[line_start..].chars().count() + 1)
}

/// The secret in environment variable `var`: set and not empty, or a
/// message naming the variable (never a value).
fn env_secret(env: &dyn Fn(&str) -> Option<String>, var: &str) -> Result<Secret, String> {
    match env(var) {
        Some(v) if !v.is_empty() => Ok(Secret::new(v)),
        Some(_) => Err(format!("environment variable {var} is empty")),
        None => Err(format!("environment variable {var} is not set")),
    }
}

/// `u` is plain `http://` to a host other than the loopback interface
/// (`localhost`, 127.0.0.0/8, `::1`): what it carries crosses a network in
/// clear text.
fn cleartext_to_remote(u: &str) -> bool {
    let Ok(p) = reqwest::Url::parse(u) else {
        return false;
    };
    if p.scheme() != "http" {
        return false;
    }
    let Some(host) = p.host_str() else {
        return true;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => !ip.is_loopback(),
        Err(_) => !host.eq_ignore_ascii_case("localhost"),
    }
}

/// A webhook URL: `http` or `https`, with a host, without credentials.
/// Credentials in a URL would be copied into every error message and log
/// line that names the URL; the message shows the URL with its password
/// replaced by `***`.
fn check_url(u: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(u);
    // What stands before the path; an `@` there is userinfo, whether or not
    // the rest parses as a URL.
    let authority = u.split_once("://").map_or(u, |(_, rest)| rest);
    let authority = authority.split(['/', '?', '#']).next().unwrap_or("");
    let userinfo = authority.contains('@')
        || parsed
            .as_ref()
            .is_ok_and(|p| !p.username().is_empty() || p.password().is_some());
    if userinfo {
        return Err(format!(
            "URL {:?} carries credentials (user:password@): not allowed, they would be logged",
            without_userinfo(u)
        ));
    }
    match parsed {
        Ok(p) if matches!(p.scheme(), "http" | "https") && p.host().is_some() => Ok(()),
        _ => Err(format!(
            "bad URL {:?} (expected http:// or https:// and a host)",
            without_userinfo(u)
        )),
    }
}

/// `u` fit for a message: redacted ([`crate::secret::redact_url`]) and
/// truncated.
fn without_userinfo(u: &str) -> String {
    crate::untrusted::truncate(&crate::secret::redact_url(u))
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

/// Humane durations: `90s`, `15m`, `2h`, `1h 30m`, `250ms`, or `0`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t == "0" {
        return Ok(Duration::ZERO);
    }
    if t.starts_with('-') {
        return Err(format!("bad duration {s:?}: must not be negative"));
    }
    humantime::parse_duration(t)
        .map_err(|e| format!("bad duration {s:?} ({e}; expected e.g. \"90s\", \"15m\", \"2h\")"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_values_plan_and_meet_chrono_without_panicking() {
        let text = "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"23:59:59\"]\ndaily_cap = 1\nstarting_deadline = \"7d\"\njitter = \"23h 59m 59s 999ms\"\n";
        let c = Config::parse(Path::new("t.toml"), text).unwrap();
        let k = &c.kinds[0];
        assert_eq!(k.starting_deadline, STARTING_DEADLINE.max);
        for day in [
            chrono::NaiveDate::from_ymd_opt(9999, 12, 31).unwrap(),
            chrono::NaiveDate::from_ymd_opt(0, 1, 1).unwrap(),
        ] {
            let p = crate::slot::planned_slot(k, day, 1, "seed").unwrap();
            assert!(p.due_at >= p.nominal_at);
            assert!(crate::clock::later(p.due_at, k.starting_deadline) > p.due_at);
            assert!(crate::clock::later(p.due_at, VISIBILITY.max) > p.due_at);
        }
    }

    #[test]
    fn line_column_counts_characters() {
        assert_eq!(line_column("ab\ncd", 0), (1, 1));
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_column("é = \nx", 5), (1, 5));
        assert_eq!(line_column("x", 99), (1, 2));
    }

    #[test]
    fn bounds_describe_themselves() {
        assert_eq!(JITTER.describe(), "must be less than 1day");
        assert_eq!(
            VISIBILITY.describe(),
            "must be at least 100ms and at most 1h"
        );
        assert_eq!(
            VISIBILITY.parse("2h").unwrap_err(),
            "2h is out of range: must be at least 100ms and at most 1h"
        );
        assert!(PLAN_EVERY.parse("0").is_err());
        assert_eq!(PLAN_EVERY.parse("10m"), Ok(Duration::from_secs(600)));
    }

    const KIND: &str = "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"09:00\"]\ndaily_cap = 1\nstarting_deadline = \"1h\"\n";

    fn with_env(extra: &str, vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::parse_with_env(Path::new("t.toml"), &format!("{KIND}{extra}"), &|n| {
            vars.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn credentials_never_go_in_clear_text_to_another_host() {
        let vars = [("TOK", "t"), ("SIG", "s"), ("WP", "w")];
        let wp = |url: &str| {
            format!("[kinds.wordpress]\nurl = \"{url}\"\nuser = \"u\"\napp_password_env = \"WP\"\n")
        };
        for (extra, field) in [
            (
                "publish_url = \"http://cms.example/p\"\nauth = \"bearer\"\ntoken_env = \"TOK\"\n".to_owned(),
                "publish_url",
            ),
            (
                "publish_url = \"https://cms.example/p\"\nindex_url = \"http://10.0.0.5/i\"\nsigning_secret_env = \"SIG\"\n".to_owned(),
                "index_url",
            ),
            (
                "publish_url = \"https://cms.example/p\"\nprobe_url = \"http://cms.example/q\"\nauth = \"bearer\"\ntoken_env = \"TOK\"\n".to_owned(),
                "probe_url",
            ),
            (wp("http://blog.example"), "wordpress.url"),
            (wp("http://192.168.1.4:8080"), "wordpress.url"),
        ] {
            let e = with_env(&extra, &vars).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{extra}: {e}");
            assert!(e.message.contains("clear text"), "{e}");
        }
        for extra in [
            "publish_url = \"https://cms.example/p\"\nauth = \"bearer\"\ntoken_env = \"TOK\"\n".to_owned(),
            "publish_url = \"http://127.0.0.1:8080/p\"\nauth = \"bearer\"\ntoken_env = \"TOK\"\n".to_owned(),
            "publish_url = \"http://localhost/p\"\nsigning_secret_env = \"SIG\"\n".to_owned(),
            "publish_url = \"http://[::1]:9/p\"\nsigning_secret_env = \"SIG\"\n".to_owned(),
            // No credentials: nothing to leak.
            "publish_url = \"http://cms.example/p\"\n".to_owned(),
            "allow_insecure_http = true\npublish_url = \"http://cms.example/p\"\nauth = \"bearer\"\ntoken_env = \"TOK\"\n".to_owned(),
            wp("https://blog.example"),
            wp("http://127.0.0.1:8080"),
            format!("allow_insecure_http = true\n{}", wp("http://blog.example")),
        ] {
            assert!(with_env(&extra, &vars).is_ok(), "{extra}: {:?}", with_env(&extra, &vars).err());
        }
        let e = with_env("allow_insecure_http = \"yes\"\n", &vars).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("allow_insecure_http"));
    }

    #[test]
    fn webhook_secrets_come_from_the_environment_and_never_print() {
        let c = with_env(
            "auth = \"bearer\"\ntoken_env = \"TOK\"\nsigning_secret_env = \"SIG\"\n",
            &[("TOK", "tok-value-1"), ("SIG", "sig-value-2")],
        )
        .unwrap();
        let auth = &c.kinds[0].auth;
        assert_eq!(auth.bearer.as_ref().unwrap().expose(), "tok-value-1");
        assert_eq!(
            auth.signing_secret.as_ref().unwrap().expose(),
            "sig-value-2"
        );
        let dump = format!("{c:?}");
        assert!(
            !dump.contains("tok-value-1") && !dump.contains("sig-value-2"),
            "{dump}"
        );
        assert!(with_env("", &[]).unwrap().kinds[0].auth.bearer.is_none());
    }

    #[test]
    fn a_bad_auth_setting_names_its_field_or_variable() {
        for (extra, vars, field, words) in [
            (
                "auth = \"bearer\"\ntoken_env = \"TOK\"\n",
                &[][..],
                "token_env",
                "TOK is not set",
            ),
            (
                "auth = \"bearer\"\ntoken_env = \"TOK\"\n",
                &[("TOK", "")][..],
                "token_env",
                "TOK is empty",
            ),
            ("auth = \"bearer\"\n", &[][..], "token_env", "missing"),
            (
                "token_env = \"TOK\"\n",
                &[("TOK", "x")][..],
                "token_env",
                "needs auth",
            ),
            ("auth = \"basic\"\n", &[][..], "auth", "unknown auth"),
            (
                "signing_secret_env = \"SIG\"\n",
                &[][..],
                "signing_secret_env",
                "SIG is not set",
            ),
            (
                "ca_file = \"/nonexistent.pem\"\n",
                &[][..],
                "ca_file",
                "cannot read",
            ),
        ] {
            let e = with_env(extra, vars).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{extra}: {e}");
            assert!(e.to_string().contains(words), "{extra}: {e}");
        }
    }
}

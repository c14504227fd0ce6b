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
//! at start, into [`Secret`](crate::secret::Secret)s (which print as `***`).
//! A missing or empty variable is a config error naming the variable, never
//! a value. A kind's `ca_file` is read and parsed here too, so a bad CA
//! fails the start, not the first publish.
//!
//! A module per part of the file: `kind` (a `[[kinds]]` table), `webhook`
//! (a kind's webhook keys), `receivers` (its `[kinds.wordpress]` and
//! `[kinds.indexnow]` sections), `bound` (the range of every duration) and
//! `keys` (reading one table's keys as the types expected, naming the key
//! in every error), `notify` (the top-level `[notify]` section). This file
//! reads the top level (`jitter_seed`, `redis_partitions`, the `[[kinds]]`
//! array) and checks what spans kinds.

mod bound;
mod calendar;
pub use calendar::{Calendar, Day, DayList, MAX_CRON_SLOTS_PER_DAY};
mod keys;
mod kind;
mod notify;
pub use notify::{NotifyConfig, DEFAULT_RUNWAY_DAYS};
mod receivers;
mod webhook;

pub use bound::{
    parse_duration, Bound, FORGET_AFTER, HTTP_TIMEOUT, JITTER, LEASE_TTL, PLAN_EVERY,
    REDIS_CONNECT_TIMEOUT, RETRY_BASE, RETRY_CAP, STARTING_DEADLINE, VISIBILITY, WAIT_TIMEOUT,
    WORKER_PERIOD, WP_REFRESH,
};
pub use kind::{
    parse_time, valid_kind_name, KindConfig, DEFAULT_HTTP_ATTEMPTS, DEFAULT_HTTP_TIMEOUT,
    DEFAULT_RETRY_BASE, DEFAULT_RETRY_CAP,
};
pub use receivers::{
    IndexNowConfig, SlugTemplate, WordPressConfig, WpDraftStatus, WpDrafts, DEFAULT_SLUG,
    DEFAULT_WP_REFRESH, DEFAULT_WP_SYNC_LIMIT,
};
pub use webhook::{CaFile, WebhookAuth};

use keys::{without_userinfo, Keys};
use std::path::{Path, PathBuf};

/// Largest `redis_partitions`: each worker reads every partition and the
/// leader promotes every one, so each costs a round trip per idle read.
/// Defined here, where the file is checked; the queue's key space clamps
/// to it.
pub const MAX_PARTITIONS: u16 = 64;

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
    /// The `[notify]` section: where the leader sends notices; `None`
    /// sends none (they are still recorded).
    pub notify: Option<NotifyConfig>,
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

/// `jitter_seed` when the file does not set it; installations that keep it
/// jitter alike.
pub const DEFAULT_JITTER_SEED: &str = "slotgate";

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
        let top = Keys::new(&table, env);
        let at_top = |(field, m): keys::FieldError| err(None, Some(&field), m);
        top.known(&["kinds", "jitter_seed", "redis_partitions", "notify"])
            .map_err(at_top)?;
        let notify = match table.get("notify") {
            None => None,
            Some(toml::Value::Table(t)) => Some(
                notify::parse(&Keys::new(t, env))
                    .map_err(|(f, m)| err(None, Some(&format!("notify.{f}")), m))?,
            ),
            Some(_) => {
                return Err(err(
                    None,
                    Some("notify"),
                    "expected a table ([notify])".into(),
                ))
            }
        };
        let jitter_seed = top
            .string("jitter_seed")
            .map_err(at_top)?
            .unwrap_or_else(|| DEFAULT_JITTER_SEED.to_owned());
        let redis_partitions = match table.get("redis_partitions") {
            None => 1,
            Some(toml::Value::Integer(n)) if (1..=i64::from(MAX_PARTITIONS)).contains(n) => {
                *n as u16
            }
            Some(v) => {
                return Err(err(
                    None,
                    Some("redis_partitions"),
                    format!(
                        "expected a whole number from 1 to {}, got {}",
                        MAX_PARTITIONS,
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
            let keys = Keys::new(t, env);
            let name = keys
                .required("name")
                .map_err(|(field, m)| err(Some(&label), Some(&field), m))?;
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
            let kind = kind::parse(name.clone(), &keys, path)
                .map_err(|(field, m)| err(Some(&name), Some(&field), m))?;
            kinds.push(kind);
        }
        // Two kinds mirroring the same posts would each publish them.
        for (i, a) in kinds.iter().enumerate() {
            for b in &kinds[..i] {
                if let (Some((wa, sa)), Some((wb, sb))) =
                    (a.drafts_in_wordpress(), b.drafts_in_wordpress())
                {
                    if wa.site() == wb.site() && sa == sb {
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
            notify,
        })
    }

    /// What a planner and its workers must agree on, as 12 hex digits of
    /// SHA-256: `jitter_seed`, `redis_partitions`, and each kind's name,
    /// time zone, jitter and numbered slots — what decides which slots
    /// exist, when they are due and where they are delivered. Two processes
    /// with different fingerprints disagree on slots (a worker on an old
    /// config dead-letters the new slots the planner plans; a mixed
    /// `redis_partitions` fleet reads partitions nobody promotes to);
    /// `planner status` and the console flag it. Other keys (timeouts,
    /// receivers) may differ during a rollout without harm and are left out.
    /// Compare only numbered configs (the binaries number at start).
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        h.update(format!(
            "jitter_seed={:?}\nredis_partitions={}\n",
            self.jitter_seed, self.redis_partitions
        ));
        let mut kinds: Vec<&KindConfig> = self.kinds.iter().collect();
        kinds.sort_by(|a, b| a.name.cmp(&b.name));
        for k in kinds {
            let mut slots: Vec<(u32, chrono::NaiveTime)> = k
                .slot_numbers
                .iter()
                .copied()
                .zip(k.slots.iter().copied())
                .collect();
            slots.sort();
            h.update(format!(
                "kind={:?} tz={} jitter_ms={} slots={slots:?}\n",
                k.name,
                k.timezone,
                k.jitter.as_millis()
            ));
        }
        h.finalize()[..6]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    /// A runway shorter than this many days is told (`runway.low`):
    /// `[notify] runway_days`, or its default without `[notify]` (the
    /// notice is recorded either way).
    pub fn runway_days(&self) -> u32 {
        self.notify
            .as_ref()
            .map_or(DEFAULT_RUNWAY_DAYS, |n| n.runway_days)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
    fn notify_reads_a_whsec_key_and_names_every_bad_field() {
        const KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let ok = with_env(
            "[notify]\nurl = \"https://ops.example/hook\"\nsecret_env = \"NOTIFY\"\nevents = [\"slot.failed\"]\n",
            &[("NOTIFY", KEY)],
        )
        .unwrap();
        let n = ok.notify.expect("[notify] read");
        assert_eq!(n.events, vec![crate::notice::Event::SlotFailed]);
        assert_eq!(n.runway_days, DEFAULT_RUNWAY_DAYS);
        assert!(with_env("", &[]).unwrap().notify.is_none());
        let url = "url = \"https://ops.example/hook\"\n";
        for (extra, vars, field, says) in [
            (
                format!("[notify]\n{url}"),
                vec![],
                "notify.secret_env",
                "missing",
            ),
            (
                format!("[notify]\n{url}secret_env = \"N\"\n"),
                vec![],
                "notify.secret_env",
                "not set",
            ),
            (
                format!("[notify]\n{url}secret_env = \"N\"\n"),
                vec![("N", "hunter2hunter2hunter2hunter2")],
                "notify.secret_env",
                "whsec_",
            ),
            (
                format!("[notify]\n{url}secret_env = \"N\"\nevents = [\"slot.published\"]\n"),
                vec![("N", KEY)],
                "notify.events[0]",
                "expected one of",
            ),
            (
                format!("[notify]\n{url}secret_env = \"N\"\nrunway_days = 0\n"),
                vec![("N", KEY)],
                "notify.runway_days",
                "1..=366",
            ),
            (
                format!("[notify]\n{url}secret_env = \"N\"\nretries = 3\n"),
                vec![("N", KEY)],
                "notify.retries",
                "unknown field",
            ),
            (
                "[notify]\nurl = \"https://u:p@ops.example/\"\nsecret_env = \"N\"\n".to_owned(),
                vec![("N", KEY)],
                "notify.url",
                "credentials",
            ),
        ] {
            let e = with_env(&extra, &vars).unwrap_err();
            assert_eq!(e.field.as_deref(), Some(field), "{extra}: {e}");
            assert!(e.kind.is_none(), "{e}");
            assert!(e.message.contains(says), "{extra}: {e}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn the_fingerprint_follows_the_schedule_not_the_timeouts() {
        let base = "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"09:00\", \"12:00\"]\ndaily_cap = 1\nstarting_deadline = \"1h\"\n";
        let fp = |text: &str| {
            Config::parse_with_env(Path::new("t.toml"), text, &|_| None)
                .unwrap()
                .fingerprint()
        };
        let a = fp(base);
        assert_eq!(a.len(), 12);
        assert_eq!(a, fp(base), "stable");
        assert_eq!(
            a,
            fp(&format!("{base}http_timeout = \"3s\"\n")),
            "timeouts may differ"
        );
        for changed in [
            base.replace("\"12:00\"", "\"13:00\""),
            base.replace("UTC", "Europe/Berlin"),
            format!("redis_partitions = 2\n{base}"),
            format!("jitter_seed = \"x\"\n{base}"),
            format!("{base}jitter = \"5m\"\n"),
            format!("{base}[[kinds]]\nname = \"b\"\ntimezone = \"UTC\"\nslots = [\"09:00\"]\ndaily_cap = 1\nstarting_deadline = \"1h\"\n"),
        ] {
            assert_ne!(a, fp(&changed), "{changed}");
        }
    }

    #[test]
    fn rotate_by_takes_category_only_and_not_for_drafts_kept_in_wordpress() {
        let base = "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"09:00\"]\ndaily_cap = 1\nstarting_deadline = \"1h\"\n";
        let parse = |text: &str| {
            Config::parse_with_env(Path::new("t.toml"), text, &|n| {
                (n == "WP").then(|| "w".to_owned())
            })
        };
        let ok = parse(&format!("{base}rotate_by = \"category\"\n")).unwrap();
        assert!(ok.kinds[0].rotate_by_category);
        assert!(!parse(base).unwrap().kinds[0].rotate_by_category);
        let e = parse(&format!("{base}rotate_by = \"author\"\n")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("rotate_by"), "{e}");
        assert!(e.to_string().contains("\"author\""), "{e}");
        let wp = "[kinds.wordpress]\nurl = \"https://blog.example\"\nuser = \"u\"\napp_password_env = \"WP\"\ndrafts = \"pending\"\n";
        let e = parse(&format!("{base}rotate_by = \"category\"\n{wp}")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("rotate_by"), "{e}");
        assert!(e.to_string().contains("live in WordPress"), "{e}");
    }

    #[test]
    fn two_kinds_may_not_mirror_one_sites_posts_however_its_url_is_written() {
        let vars = [("WP", "w")];
        let kind = |name: &str, url: &str| {
            format!("[[kinds]]\nname = \"{name}\"\ntimezone = \"UTC\"\nslots = [\"09:00\"]\ndaily_cap = 1\nstarting_deadline = \"1h\"\n[kinds.wordpress]\nurl = \"{url}\"\nuser = \"u\"\napp_password_env = \"WP\"\ndrafts = \"pending\"\n")
        };
        let parse = |a: &str, b: &str| {
            let text = format!("{}{}", kind("one", a), kind("two", b));
            Config::parse_with_env(Path::new("t.toml"), &text, &|n| {
                vars.iter()
                    .find(|(k, _)| *k == n)
                    .map(|(_, v)| v.to_string())
            })
        };
        for (a, b) in [
            ("https://blog.example", "https://blog.example/"),
            ("https://blog.example", "https://blog.example/."),
            ("https://blog.example", "https://Blog.Example:443"),
            ("https://blog.example/news", "https://blog.example/news/./"),
        ] {
            let e = parse(a, b).unwrap_err();
            assert_eq!(e.field.as_deref(), Some("wordpress.drafts"), "{a} {b}: {e}");
        }
        for (a, b) in [
            ("https://blog.example", "https://other.example"),
            ("https://blog.example/news", "https://blog.example/sport"),
            ("https://blog.example", "https://blog.example:8443"),
        ] {
            assert!(parse(a, b).is_ok(), "{a} {b}: {:?}", parse(a, b).err());
        }
    }

    /// A kind's CMS is the server it calls, however the URL is written:
    /// the footholds of the worker's call permits are kept per CMS.
    #[test]
    fn a_kinds_cms_is_the_origin_it_publishes_to() {
        let kind = |name: &str, extra: &str| {
            format!("[[kinds]]\nname = \"{name}\"\ntimezone = \"UTC\"\nslots = [\"09:00\"]\ndaily_cap = 1\nstarting_deadline = \"1h\"\n{extra}\n")
        };
        let text = [
            kind("a", "publish_url = \"https://CMS.example:443/hooks/a\""),
            kind("b", "publish_url = \"https://cms.example/hooks/b\""),
            kind("c", "publish_url = \"https://cms.example:8443/hooks/c\""),
            kind("w", "[kinds.wordpress]\nurl = \"https://Blog.example/news/\"\nuser = \"u\"\napp_password_env = \"WP\"\ndrafts = \"pending\""),
            kind("r", ""),
        ]
        .concat();
        let c = Config::parse_with_env(Path::new("t.toml"), &text, &|n| {
            (n == "WP").then(|| "w".to_owned())
        })
        .unwrap();
        let cms: Vec<Option<String>> = c.kinds.iter().map(KindConfig::cms).collect();
        let s = |o: &str| Some(o.to_owned());
        assert_eq!(
            cms,
            [
                s("https://cms.example"),
                s("https://cms.example"),
                s("https://cms.example:8443"),
                s("https://blog.example"),
                None
            ]
        );
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

//! slotgate configs: validated by [`::slotgate::config::Config::parse`], then
//! checked for `slotgate-shared-second`, `slotgate-deadline-below-jitter`,
//! `slotgate-cap-above-slots` and `slotgate-calendar-dark`.
//!
//! slotgate runs each configured slot once per local day whatever DST does,
//! and jitters by design, so `dst-window` and `thundering-herd` do not apply
//! to its kinds.

use crate::finding::{AuditError, Finding, Rule};
use crate::scheduled::AuditOptions;
use ::slotgate::config::{Config, ConfigError};
use ::slotgate::slot::{day_schedule, local_today, resolve_local};
use chrono::{DateTime, Duration, Utc};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// How many local days, from today in each kind's zone, a calendar must
/// give a slot that may publish in (`slotgate-calendar-dark`): two weeks,
/// the forecast's default horizon.
const DARK_DAYS: i64 = 14;

/// How many local days, from today in each kind's zone, are compared for
/// shared nominal seconds (a year, so every DST regime of every zone is
/// seen).
const SHARED_SECOND_DAYS: i64 = 366;

/// Lines of the `[[kinds]]` tables of a slotgate config.
#[derive(Debug, Default)]
struct Sections {
    /// Lines of top-level keys (before the first table).
    top: HashMap<String, usize>,
    kinds: Vec<Section>,
}

#[derive(Debug)]
struct Section {
    header: usize,
    name: Option<String>,
    keys: HashMap<String, usize>,
}

impl Sections {
    fn index(text: &str) -> Sections {
        let mut s = Sections::default();
        let mut current: Option<usize> = None;
        let mut in_top = true;
        for (i, raw) in text.lines().enumerate() {
            let line = i + 1;
            let t = raw.trim();
            if t.starts_with('[') {
                in_top = false;
                let inner: String = t.chars().filter(|c| !c.is_whitespace()).collect();
                if inner.starts_with("[[kinds]]") {
                    s.kinds.push(Section {
                        header: line,
                        name: None,
                        keys: HashMap::new(),
                    });
                    current = Some(s.kinds.len() - 1);
                } else {
                    current = None;
                }
                continue;
            }
            let Some((k, v)) = t.split_once('=') else {
                continue;
            };
            if t.starts_with('#') {
                continue;
            }
            let key = k.trim().trim_matches(|c| c == '"' || c == '\'').to_owned();
            match current {
                Some(c) => {
                    let sec = &mut s.kinds[c];
                    if key == "name" && sec.name.is_none() {
                        let v = v.split('#').next().unwrap_or("").trim();
                        sec.name = Some(v.trim_matches(|c| c == '"' || c == '\'').to_owned());
                    }
                    sec.keys.entry(key).or_insert(line);
                }
                None if in_top => {
                    s.top.entry(key).or_insert(line);
                }
                None => {}
            }
        }
        s
    }

    /// The line of a field of a kind (by 0-based position), else of the
    /// kind's header.
    fn line(&self, kind: usize, field: &str) -> usize {
        self.kinds
            .get(kind)
            .map_or(1, |k| k.keys.get(field).copied().unwrap_or(k.header))
    }

    /// The line a [`ConfigError`] is about.
    fn error_line(&self, e: &ConfigError) -> usize {
        let field = e.field.as_deref().map(|f| f.split('[').next().unwrap_or(f));
        let kind = e.kind.as_deref().and_then(|k| match k.strip_prefix('#') {
            Some(n) => n.parse::<usize>().ok().and_then(|n| n.checked_sub(1)),
            None => self.kinds.iter().position(|s| s.name.as_deref() == Some(k)),
        });
        match (kind, field) {
            (Some(k), Some(f)) => self.line(k, f),
            (Some(k), None) => self.line(k, ""),
            (None, Some(f)) => self
                .top
                .get(f)
                .copied()
                .or_else(|| self.kinds.first().map(|k| k.header))
                .unwrap_or(1),
            (None, None) => 1,
        }
    }
}

fn human(d: std::time::Duration) -> String {
    if d.is_zero() {
        "0".to_owned()
    } else {
        humantime::format_duration(d).to_string()
    }
}

/// Validates and audits a slotgate config.
pub(crate) fn audit(
    file: &str,
    text: &str,
    opts: &AuditOptions,
) -> Result<Vec<Finding>, AuditError> {
    if let Err(e) = text.parse::<toml::Table>() {
        let line = e.span().map_or(1, |s| {
            1 + text.as_bytes()[..s.start.min(text.len())]
                .iter()
                .filter(|&&b| b == b'\n')
                .count()
        });
        return Err(AuditError::parse(
            file,
            line,
            format!("not valid TOML: {}", e.message().trim()),
        ));
    }
    let sections = Sections::index(text);
    let config = Config::parse(Path::new(file), text).map_err(|e| {
        let mut m = String::new();
        if let Some(k) = &e.kind {
            m.push_str(&format!("kind \"{k}\": "));
        }
        if let Some(f) = &e.field {
            m.push_str(&format!("field `{f}`: "));
        }
        m.push_str(&e.message);
        AuditError::parse(file, sections.error_line(&e), m)
    })?;
    let mut out = Vec::new();

    // Kinds with jitter 0 whose nominal instants coincide.
    let mut at: BTreeMap<DateTime<Utc>, BTreeSet<usize>> = BTreeMap::new();
    for (i, k) in config.kinds.iter().enumerate() {
        if !k.jitter.is_zero() {
            continue;
        }
        let today = local_today(k.timezone, opts.now);
        for d in 0..SHARED_SECOND_DAYS {
            let day = today + Duration::days(d);
            for p in day_schedule(k, day, &config.jitter_seed) {
                at.entry(p.nominal_at).or_default().insert(i);
            }
        }
    }
    let mut shared: BTreeMap<usize, (DateTime<Utc>, BTreeSet<usize>)> = BTreeMap::new();
    for (t, kinds) in at.iter().filter(|(_, k)| k.len() > 1) {
        for &i in kinds {
            let e = shared.entry(i).or_insert((*t, BTreeSet::new()));
            e.1.extend(kinds.iter().copied().filter(|&j| j != i));
        }
    }
    for (i, (first, others)) in shared {
        let k = &config.kinds[i];
        let names: Vec<&str> = others
            .iter()
            .map(|&j| config.kinds[j].name.as_str())
            .collect();
        let local = first.with_timezone(&k.timezone);
        out.push(Finding::new(
            Rule::SlotgateSharedSecond,
            file,
            sections.line(i, "jitter"),
            &k.name,
            format!(
                "Kind {} has jitter 0 and shares its nominal second {} ({} {}) with {} (also jitter 0), so their deliveries hit the gate, the quota and the endpoints in the same second.",
                k.name,
                first.format("%Y-%m-%dT%H:%M:%SZ"),
                local.format("%H:%M:%S"),
                k.timezone.name(),
                names.join(", ")
            ),
            "Give these kinds a jitter window (e.g. `jitter = \"5m\"`) or move their slots apart.",
        ));
    }

    for (i, k) in config.kinds.iter().enumerate() {
        if k.starting_deadline < k.jitter {
            out.push(Finding::new(
                Rule::SlotgateDeadlineBelowJitter,
                file,
                sections.line(i, "starting_deadline"),
                &k.name,
                format!(
                    "starting_deadline ({}) is shorter than jitter ({}), so a delivery held up by less than the spread this kind already accepts (a worker restart, a Redis failover) is skipped as missed_deadline.",
                    human(k.starting_deadline),
                    human(k.jitter)
                ),
                format!("Make starting_deadline at least as long as jitter (e.g. `starting_deadline = \"{}\"`).", human(k.jitter)),
            ));
        }
        let today = local_today(k.timezone, opts.now);
        let lit = (0..DARK_DAYS)
            .map(|d| today + Duration::days(d))
            .any(|day| {
                let rule = k.day(day);
                !rule.blackout && rule.daily_cap > 0 && !day_schedule(k, day, "").is_empty()
            });
        if !lit && k.daily_cap > 0 {
            let line = ["blackout", "cron", "weekdays", "slots"]
                .into_iter()
                .map(|f| sections.line(i, f))
                .find(|l| *l != sections.line(i, ""))
                .unwrap_or_else(|| sections.line(i, "slots"));
            out.push(Finding::new(
                Rule::SlotgateCalendarDark,
                file,
                line,
                &k.name,
                format!(
                    "Kind {} has no slot that may publish in the {DARK_DAYS} days from {today}: its weekdays, day lists or cron give no slot on the days its blackout leaves, so every slot is skipped/blackout or none is planned.",
                    k.name
                ),
                "Check the blackout ranges and weekdays; to stop a kind on purpose, set daily_cap = 0 or pause it (`planner pause`).",
            ));
        }
        let n = k.slots.len();
        if k.daily_cap as usize > n {
            out.push(Finding::new(
                Rule::SlotgateCapAboveSlots,
                file,
                sections.line(i, "daily_cap"),
                &k.name,
                format!(
                    "daily_cap {} is larger than the {n} slot(s) a day and each slot publishes at most once, so the cap never limits anything and is probably not the limit intended.",
                    k.daily_cap
                ),
                format!("Lower daily_cap to at most {n}, or add slots if more posts a day are wanted."),
            ));
        }
    }
    if let Some(source) = &opts.history {
        out.extend(moved_run_slots(
            file,
            &sections,
            &config,
            &(source.0)(&config),
            opts.now,
        ));
    }
    Ok(out)
}

/// [`Rule::SlotgateMovesRunSlot`]: per kind, a time that is no longer
/// configured whose slot of today already ran, while a time not numbered
/// before (new) would still run today (its nominal time plus the
/// starting deadline not past): today would get both.
fn moved_run_slots(
    file: &str,
    sections: &Sections,
    config: &Config,
    history: &crate::scheduled::Histories,
    now: DateTime<Utc>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for (i, k) in config.kinds.iter().enumerate() {
        let Some(h) = history.get(&k.name) else {
            continue;
        };
        let listed = ::slotgate::store::listings(&k.slots);
        let mut gone: Vec<(u32, chrono::NaiveTime, &str)> = h
            .numbered
            .iter()
            .filter(|(l, _)| !listed.contains(l))
            .filter_map(|((t, _), no)| h.ran_today.get(no).map(|st| (*no, *t, st.as_str())))
            .collect();
        gone.sort();
        let today = local_today(k.timezone, now);
        let deadline = chrono::Duration::from_std(k.starting_deadline).unwrap_or_default();
        let new: Vec<String> = listed
            .iter()
            .filter(|l| !h.numbered.contains_key(l))
            .filter(|(t, _)| resolve_local(k.timezone, today.and_time(*t)) + deadline >= now)
            .map(|(t, _)| t.format("%H:%M:%S").to_string())
            .collect();
        if gone.is_empty() || new.is_empty() {
            continue;
        }
        let ran: Vec<String> = gone
            .iter()
            .map(|(no, t, st)| format!("slot {no} ({}, {st})", t.format("%H:%M:%S")))
            .collect();
        out.push(Finding::new(
            Rule::SlotgateMovesRunSlot,
            file,
            sections.line(i, "slots"),
            &k.name,
            format!(
                "Kind {} already ran {} today ({today}), whose time is no longer in `slots`, and the new time(s) {} would run today too, so today gets both (within daily_cap {}).",
                k.name,
                ran.join(", "),
                new.join(", "),
                k.daily_cap
            ),
            "Make the edit after today's last slot, or `planner skip` today's new slot(s) after `planner plan --dry-run` shows them.",
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn opts() -> AuditOptions {
        AuditOptions {
            now: Utc.with_ymd_and_hms(2026, 1, 15, 12, 0, 0).unwrap(),
            local_zone: chrono_tz::Tz::UTC,
            history: None,
        }
    }

    #[test]
    fn shared_second_across_zones() {
        // 09:00 Berlin is 08:00 UTC in winter and 07:00 UTC in summer, so a
        // UTC kind at 08:00 shares a second with it only in winter.
        let text = "\
[[kinds]]
name = \"de\"
timezone = \"Europe/Berlin\"
slots = [\"09:00\"]
daily_cap = 1
starting_deadline = \"1h\"

[[kinds]]
name = \"utc\"
timezone = \"UTC\"
slots = [\"08:00\", \"12:00\"]
daily_cap = 2
starting_deadline = \"1h\"
";
        let f = audit("s.toml", text, &opts()).unwrap();
        let got: Vec<(&str, usize, &str)> = f
            .iter()
            .map(|f| (f.rule.id(), f.line, f.object.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("slotgate-shared-second", 1, "de"),
                ("slotgate-shared-second", 8, "utc")
            ]
        );
        assert!(
            f[0].message.contains("2026-01-15T08:00:00Z"),
            "{}",
            f[0].message
        );
    }

    #[test]
    fn config_errors_point_at_the_field() {
        let text = "[[kinds]]\nname = \"a\"\ntimezone = \"Nowhere/City\"\nslots = [\"09:00\"]\ndaily_cap = 1\nstarting_deadline = \"1h\"\n";
        let e = audit("s.toml", text, &opts()).unwrap_err();
        assert_eq!(e.line(), Some(3));
        assert!(
            e.to_string()
                .starts_with("s.toml:3: kind \"a\": field `timezone`:"),
            "{e}"
        );
        let text =
            "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\n\nslots = [\"09:00\", \"25:00\"]\n";
        let e = audit("s.toml", text, &opts()).unwrap_err();
        assert_eq!(e.line(), Some(5));
        assert!(e.to_string().contains("field `slots[1]`"), "{e}");
        let e = audit("s.toml", "[[kinds]]\nname = \"a\nx = 1\n", &opts()).unwrap_err();
        assert_eq!(e.line(), Some(2));
        assert!(e.to_string().contains("not valid TOML"), "{e}");
    }

    #[test]
    fn a_removed_time_that_ran_today_and_a_new_one_still_ahead_is_a_move() {
        let text = "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"18:00\", \"09:00\"]\ndaily_cap = 2\nstarting_deadline = \"1h\"\n";
        let t = |s: &str| chrono::NaiveTime::parse_from_str(s, "%H:%M").unwrap();
        // 12:00 was slot 1 and ran today; 09:00 is slot 2 and stays.
        let history = |ran: &[u32]| {
            HashMap::from([(
                "a".to_owned(),
                crate::scheduled::KindHistory {
                    numbered: HashMap::from([((t("12:00"), 1), 1), ((t("09:00"), 1), 2)]),
                    ran_today: ran.iter().map(|n| (*n, "published".to_owned())).collect(),
                },
            )])
        };
        let config = Config::parse(Path::new("a.toml"), text).unwrap();
        let sections = Sections::index(text);
        let found = moved_run_slots("a.toml", &sections, &config, &history(&[1]), opts().now);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].line, 4);
        assert!(found[0].message.contains("slot 1 (12:00:00, published)"));
        assert!(found[0].message.contains("18:00:00"));
        // Nothing ran, or only the kept time ran: no move.
        assert!(
            moved_run_slots("a.toml", &sections, &config, &history(&[]), opts().now).is_empty()
        );
        assert!(
            moved_run_slots("a.toml", &sections, &config, &history(&[2]), opts().now).is_empty()
        );
        // The new time's deadline passed today (12:00 + 1h < 20:00): it no
        // longer runs today.
        let late = Utc.with_ymd_and_hms(2026, 1, 15, 20, 0, 0).unwrap();
        assert!(moved_run_slots("a.toml", &sections, &config, &history(&[1]), late).is_empty());
    }
}

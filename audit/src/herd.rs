//! Rules that look across files: `shared-entry-point` and
//! `thundering-herd`.

use crate::finding::{Finding, Rule};
use crate::scheduled::{AuditOptions, Scheduled};
use chrono::{Duration, NaiveDateTime};
use chrono_tz::Tz;
use std::collections::{BTreeMap, HashMap};

/// "Many" of DESIGN: three or more starts in one minute of one zone.
pub(crate) const HERD_MIN: usize = 3;
/// How many local days, from the date of `now`, are searched for herds.
pub(crate) const HERD_DAYS: i64 = 31;

/// `a`, `a and b`, `a, b and c`; past five names, `… and N more`.
pub(crate) fn list(names: &[&str]) -> String {
    const MAX: usize = 5;
    match names {
        [] => String::new(),
        [one] => (*one).to_owned(),
        _ if names.len() > MAX => {
            format!("{} and {} more", names[..MAX].join(", "), names.len() - MAX)
        }
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// `shared-entry-point`: each schedule whose entry point (see
/// [`crate::scheduled::EntryPoint::same_as`]) is also run by another CronJob or crontab
/// line, reported at the schedule's command line. `@reboot` lines count as
/// callers too.
pub(crate) fn shared_entry_points(scheduled: &[Scheduled]) -> Vec<(usize, Finding)> {
    let mut out = Vec::new();
    for (i, s) in scheduled.iter().enumerate() {
        let Some(e) = &s.entry else { continue };
        let others: Vec<&str> = scheduled
            .iter()
            .enumerate()
            .filter(|(j, o)| {
                *j != i
                    && o.entry
                        .as_ref()
                        .is_some_and(|oe| e.same_as(s.origin, oe, o.origin))
            })
            .map(|(_, o)| o.object.as_str())
            .collect();
        if others.is_empty() {
            continue;
        }
        out.push((
            s.file_idx,
            Finding::new(
                Rule::SharedEntryPoint,
                &s.file,
                s.entry_line,
                &s.object,
                format!(
                    "The same entry point ({}) is also run by {}, and no concurrency policy or lock spans separate schedules, so their runs can overlap and repeat each other's effects.",
                    e.describe(),
                    list(&others)
                ),
                "Keep one schedule per entry point, or key the effect by a name every caller shares (the planned slot) under a unique constraint.",
            ),
        ));
    }
    out
}

/// Zones that are UTC under another name share one wall clock.
fn is_utc(tz: Tz) -> bool {
    let n = tz.name();
    let n = n.strip_prefix("Etc/").unwrap_or(n);
    matches!(
        n,
        "UTC" | "UCT" | "Universal" | "Zulu" | "GMT" | "GMT0" | "GMT+0" | "GMT-0" | "Greenwich"
    )
}

/// `thundering-herd`: in each zone (UTC and its aliases as one), the starts of every wall-clock schedule
/// over the [`HERD_DAYS`] local days from the date of `opts.now` are counted
/// per minute; each schedule taking part in a minute with [`HERD_MIN`] or
/// more starts is reported once, with its busiest minute (earliest on ties).
/// CronJobs without `timeZone` count in UTC; crontabs in their
/// `CRON_TZ`/`TZ` or the machine's zone.
pub(crate) fn thundering_herd(
    scheduled: &[Scheduled],
    opts: &AuditOptions,
) -> Vec<(usize, Finding)> {
    let mut by_zone: BTreeMap<&str, (Tz, Vec<usize>)> = BTreeMap::new();
    for (i, s) in scheduled.iter().enumerate() {
        if s.schedule.cron().is_some() {
            let zone = if is_utc(s.zone) { Tz::UTC } else { s.zone };
            by_zone
                .entry(zone.name())
                .or_insert((zone, Vec::new()))
                .1
                .push(i);
        }
    }
    // Per schedule: (count, minute) of its busiest herd minute.
    let mut best: HashMap<usize, (usize, NaiveDateTime, Tz, Vec<usize>)> = HashMap::new();
    for (tz, members) in by_zone.values() {
        if members.len() < HERD_MIN {
            continue;
        }
        let from = opts
            .now
            .with_timezone(tz)
            .date_naive()
            .and_hms_opt(0, 0, 0)
            .expect("midnight");
        let to = from + Duration::days(HERD_DAYS);
        let mut minutes: HashMap<NaiveDateTime, Vec<usize>> = HashMap::new();
        for &i in members {
            let mut times = scheduled[i].schedule.fire_times(from, to);
            times.dedup();
            for t in times {
                minutes.entry(t).or_default().push(i);
            }
        }
        for (t, who) in minutes {
            if who.len() < HERD_MIN {
                continue;
            }
            for &i in &who {
                let better = match best.get(&i) {
                    None => true,
                    Some((n, bt, _, _)) => who.len() > *n || (who.len() == *n && t < *bt),
                };
                if better {
                    best.insert(i, (who.len(), t, *tz, who.clone()));
                }
            }
        }
    }
    let mut out = Vec::new();
    for (i, (n, t, tz, who)) in best {
        let s = &scheduled[i];
        let others: Vec<&str> = who
            .iter()
            .filter(|&&j| j != i)
            .map(|&j| scheduled[j].object.as_str())
            .collect();
        out.push((
            s.file_idx,
            Finding::new(
                Rule::ThunderingHerd,
                &s.file,
                s.line,
                &s.object,
                format!(
                    "{n} schedules start at {} {} on {} (this one and {}), so they hit the same nodes, locks and APIs in the same minute.",
                    t.format("%H:%M"),
                    tz.name(),
                    t.date(),
                    list(&others)
                ),
                "Spread the start minutes, or add a jitter window before the work (a random sleep of up to a few minutes, or slotgate's `jitter`).",
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_read_as_prose() {
        assert_eq!(list(&["a"]), "a");
        assert_eq!(list(&["a", "b"]), "a and b");
        assert_eq!(list(&["a", "b", "c"]), "a, b and c");
        assert_eq!(
            list(&["a", "b", "c", "d", "e", "f", "g"]),
            "a, b, c, d, e and 2 more"
        );
    }

    #[test]
    fn utc_aliases_share_a_clock() {
        assert!(is_utc(Tz::UTC));
        assert!(is_utc(chrono_tz::Etc::UTC));
        assert!(is_utc(chrono_tz::Etc::GMT));
        assert!(!is_utc(chrono_tz::Europe::London));
    }
}

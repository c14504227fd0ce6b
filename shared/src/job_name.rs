//! Kubernetes CronJob Job names as slot addresses (`planner trigger
//! --from-job-name`).
//!
//! The CronJob controller names each Job `<cronjob name>-<scheduled time in
//! Unix minutes>` and labels its pods with that name
//! (`batch.kubernetes.io/job-name`), which the downward API hands to the
//! container. The suffix is the one fact every run of one scheduled time
//! shares — a retried pod, a Job re-created after a controller restart, a
//! catch-up run hours late — and that no run of another time has. Mapping it
//! to the slot whose nominal time falls in that minute gives all those runs
//! the slot's usual key, so the gate lets exactly one of them through. "Now"
//! is never consulted: a run that starts late still names its own slot.

use crate::config::KindConfig;
use crate::slot::{schedule_around, PlannedSlot};
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use std::fmt;
use std::str::FromStr;

/// How many slots on each side of the minute a mismatch lists.
const NEARBY_EACH_SIDE: usize = 2;

/// Suffixes from here on are refused: the schedule of years past 9999 has
/// no `YYYY-MM-DD` slot key (253402300800 s is 10000-01-01T00:00:00Z; a day
/// of margin keeps the neighbouring days of a schedule in range).
const LAST_MINUTE: i64 = 253_402_300_800 / 60 - 2 * 24 * 60;

/// A Job name with a valid scheduled-minute suffix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobName {
    /// The whole name as given, suffix included (shown in messages).
    pub name: String,
    /// The scheduled time, in minutes since the Unix epoch.
    pub minute: i64,
}

/// Why a string is not a CronJob's Job name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobNameError {
    /// No `-<digits>` at the end: a Job made by hand or not by a CronJob.
    #[error("{0:?} does not end in -<Unix minutes> (a CronJob names its Jobs <cronjob>-<scheduled minute>; a Job made by hand is not one; use --day and --slot for it)")]
    NoSuffix(String),
    /// The suffix is digits but no minute slotgate can key (year 10000 or
    /// later, or too many digits for an `i64`).
    #[error("{0:?}: the suffix is not a minute between 1970 and 9999")]
    OutOfRange(String),
}

impl FromStr for JobName {
    type Err = JobNameError;
    fn from_str(s: &str) -> Result<Self, JobNameError> {
        let no_suffix = || JobNameError::NoSuffix(crate::untrusted::truncate(s));
        let (prefix, digits) = s.rsplit_once('-').ok_or_else(no_suffix)?;
        if prefix.is_empty() || digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(no_suffix());
        }
        let out_of_range = || JobNameError::OutOfRange(crate::untrusted::truncate(s));
        let minute: i64 = digits.parse().map_err(|_| out_of_range())?;
        if minute >= LAST_MINUTE {
            return Err(out_of_range());
        }
        Ok(JobName {
            name: s.to_owned(),
            minute,
        })
    }
}

impl JobName {
    /// The start of the scheduled minute.
    pub fn scheduled_at(&self) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(self.minute * 60, 0).expect("range checked when parsed")
    }
}

/// The Job name suffix a CronJob gives a run scheduled at `at`.
pub fn minute_of(at: DateTime<Utc>) -> i64 {
    at.timestamp().div_euclid(60)
}

/// Why a Job name's minute names no single slot of the kind. Its text lists
/// the kind's slots around that minute, each with the suffix a Job for it
/// would carry, so the operator can see how far off the CronJob's schedule is.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MinuteError {
    /// The CronJob's schedule does not match any configured slot time.
    #[error("kind {kind:?} has no slot whose nominal time falls in minute {minute} ({} in {zone}); slots near it: {}", local(*at, *zone), list(nearby, *zone))]
    NoSlot {
        /// The kind asked for.
        kind: String,
        /// The Job's suffix, in Unix minutes.
        minute: i64,
        /// The start of that minute.
        at: DateTime<Utc>,
        /// The kind's time zone, for showing `at` and the slots locally.
        zone: Tz,
        /// Up to two slots on each side of the minute, in time order.
        nearby: Vec<PlannedSlot>,
    },
    /// Two or more configured times fall in the same minute (a repeated
    /// time, or `09:00:00` and `09:00:30`), so the name cannot choose one.
    #[error("minute {minute} ({} in {zone}) is the nominal minute of several slots of kind {kind:?}: {}; trigger one with --day and --slot", local(*at, *zone), list(slots, *zone))]
    Several {
        /// The kind asked for.
        kind: String,
        /// The Job's suffix, in Unix minutes.
        minute: i64,
        /// The start of that minute.
        at: DateTime<Utc>,
        /// The kind's time zone, for showing `at` and the slots locally.
        zone: Tz,
        /// Every slot whose nominal time falls in the minute.
        slots: Vec<PlannedSlot>,
    },
}

fn local(at: DateTime<Utc>, zone: Tz) -> String {
    format!(
        "{} = {}",
        at.with_timezone(&zone).format("%Y-%m-%d %H:%M:%S %Z"),
        at.format("%H:%M:%SZ")
    )
}

fn list(slots: &[PlannedSlot], zone: Tz) -> String {
    if slots.is_empty() {
        return "none".into();
    }
    slots
        .iter()
        .map(|s| {
            format!(
                "{} at {} (Job suffix -{})",
                s.key,
                local(s.nominal_at, zone),
                minute_of(s.nominal_at)
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The slot of `kind` whose nominal time falls in the Job's scheduled
/// minute, by the same schedule (zone, DST rules) the planner lays out.
pub fn slot_of(kind: &KindConfig, job: &JobName, seed: &str) -> Result<PlannedSlot, MinuteError> {
    let (minute, at) = (job.minute, job.scheduled_at());
    let around = schedule_around(kind, at, seed);
    let mut hits: Vec<PlannedSlot> = around
        .iter()
        .filter(|s| minute_of(s.nominal_at) == minute)
        .cloned()
        .collect();
    match hits.len() {
        1 => Ok(hits.remove(0)),
        0 => {
            let split = around.partition_point(|s| s.nominal_at < at);
            let from = split.saturating_sub(NEARBY_EACH_SIDE);
            let to = (split + NEARBY_EACH_SIDE).min(around.len());
            Err(MinuteError::NoSlot {
                kind: kind.name.clone(),
                minute,
                at,
                zone: kind.timezone,
                nearby: around[from..to].to_vec(),
            })
        }
        _ => Err(MinuteError::Several {
            kind: kind.name.clone(),
            minute,
            at,
            zone: kind.timezone,
            slots: hits,
        }),
    }
}

impl fmt::Display for JobName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn kind(slots: &str) -> KindConfig {
        let text = format!("[[kinds]]\nname = \"k\"\ntimezone = \"Europe/Berlin\"\nslots = [{slots}]\njitter = \"5m\"\ndaily_cap = 1\nstarting_deadline = \"1h\"\n");
        Config::parse(std::path::Path::new("t.toml"), &text)
            .unwrap()
            .kinds
            .remove(0)
    }

    #[test]
    fn a_minute_shared_by_two_slots_names_neither() {
        // On 2026-03-29 02:30 does not exist in Berlin and runs at 03:00
        // CEST (01:00Z), the nominal time of the 03:00 slot too.
        let k = kind("\"02:30\", \"03:00\"");
        let job: JobName = "x-29579100".parse().unwrap();
        match slot_of(&k, &job, "") {
            Err(MinuteError::Several { slots, .. }) => {
                let keys: Vec<String> = slots.iter().map(|s| s.key.to_string()).collect();
                assert_eq!(keys, ["k:2026-03-29:1", "k:2026-03-29:2"]);
            }
            other => panic!("{other:?}"),
        }
        // The day after, each has its own minute (03:00 CEST = 01:00Z).
        let next: JobName = format!("x-{}", 29_579_100 + 24 * 60).parse().unwrap();
        assert_eq!(
            slot_of(&k, &next, "").unwrap().key.to_string(),
            "k:2026-03-30:2"
        );
    }

    #[test]
    fn suffix_is_the_scheduled_minute() {
        let j: JobName = "publish-news-29579100".parse().unwrap();
        assert_eq!(j.minute, 29_579_100);
        assert_eq!(j.scheduled_at().to_rfc3339(), "2026-03-29T01:00:00+00:00");
        assert_eq!(minute_of(j.scheduled_at()), j.minute);
        for bad in [
            "",
            "29581200",
            "-29581200",
            "publish",
            "publish-",
            "publish-news-abc",
            "publish-news-12a",
            "publish-news-+12",
            "publish-news-١٢",
        ] {
            assert!(
                matches!(bad.parse::<JobName>(), Err(JobNameError::NoSuffix(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            "x-99999999999999999999".parse::<JobName>(),
            Err(JobNameError::OutOfRange(_))
        ));
        assert!(matches!(
            "x-999999999999999".parse::<JobName>(),
            Err(JobNameError::OutOfRange(_))
        ));
        assert!(matches!(
            format!("x-{LAST_MINUTE}").parse::<JobName>(),
            Err(JobNameError::OutOfRange(_))
        ));
        let last = format!("x-{}", LAST_MINUTE - 1).parse::<JobName>().unwrap();
        assert_eq!(
            last.scheduled_at().to_rfc3339(),
            "9999-12-29T23:59:00+00:00"
        );
    }
}

//! The `dst-window` rule: a schedule that fires at a local time which, on a
//! transition day of its zone in the next 12 months, does not exist (clocks
//! jump forward: the run is skipped or moved) or exists twice (clocks fall
//! back: the run can happen twice).
//!
//! Transitions are found by sampling the zone's UTC offset hourly and
//! bisecting each change to the second. Schedules that fire in every hour of
//! the day keep their cadence across a transition and are not flagged.

use crate::finding::{Finding, Rule};
use crate::scheduled::{AuditOptions, Scheduled};
use chrono::{DateTime, Duration, Months, NaiveDateTime, Offset, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use std::collections::HashMap;

/// A change of a zone's UTC offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transition {
    /// The first instant with the new offset.
    pub at: DateTime<Utc>,
    /// Offsets before and after, in seconds east of UTC.
    pub before: i32,
    pub after: i32,
}

impl Transition {
    /// Clocks jump forward: the local window is skipped.
    pub(crate) fn is_gap(&self) -> bool {
        self.after > self.before
    }

    /// The local wall-clock times `[start, end)` that are skipped (a gap) or
    /// occur twice (an overlap).
    pub(crate) fn local_window(&self) -> (NaiveDateTime, NaiveDateTime) {
        let utc = self.at.naive_utc();
        let a = utc + Duration::seconds(i64::from(self.before));
        let b = utc + Duration::seconds(i64::from(self.after));
        (a.min(b), a.max(b))
    }
}

fn offset(tz: Tz, t: DateTime<Utc>) -> i32 {
    tz.offset_from_utc_datetime(&t.naive_utc())
        .fix()
        .local_minus_utc()
}

/// The offset changes of `tz` in `[from, to)`.
pub(crate) fn transitions(tz: Tz, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<Transition> {
    let mut out = Vec::new();
    let step = Duration::hours(1);
    let mut t = from;
    let mut off = offset(tz, t);
    while t < to {
        let next = t + step;
        let next_off = offset(tz, next);
        if next_off != off {
            // Invariant: offset(lo) == off, offset(hi) != off.
            let (mut lo, mut hi) = (t.timestamp(), next.timestamp());
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if offset(tz, DateTime::from_timestamp(mid, 0).expect("in range")) == off {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            let at = DateTime::from_timestamp(hi, 0).expect("in range");
            if at >= from && at < to {
                out.push(Transition {
                    at,
                    before: off,
                    after: offset(tz, at),
                });
            }
        }
        off = next_off;
        t = next;
    }
    out
}

/// The first minute of a window at which a schedule fires.
fn first_hit(s: &Scheduled, (start, end): (NaiveDateTime, NaiveDateTime)) -> Option<NaiveDateTime> {
    let mut m = start
        .with_second(0)
        .expect("valid")
        .with_nanosecond(0)
        .expect("valid");
    if m < start {
        m += Duration::minutes(1);
    }
    while m < end {
        if s.schedule.fires_at(m) {
            return Some(m);
        }
        m += Duration::minutes(1);
    }
    None
}

/// `dst-window` findings for the schedules, over the 12 months from
/// `opts.now`.
pub(crate) fn dst_windows(scheduled: &[Scheduled], opts: &AuditOptions) -> Vec<(usize, Finding)> {
    let to = opts
        .now
        .checked_add_months(Months::new(12))
        .expect("in range");
    let mut cache: HashMap<Tz, Vec<Transition>> = HashMap::new();
    let mut out = Vec::new();
    for s in scheduled {
        if s.schedule.cron().is_none() || s.schedule.fires_every_hour() {
            continue;
        }
        let trs = cache
            .entry(s.zone)
            .or_insert_with(|| transitions(s.zone, opts.now, to));
        let mut gap = None;
        let mut overlap = None;
        for tr in trs.iter() {
            let slot = if tr.is_gap() { &mut gap } else { &mut overlap };
            if slot.is_none() {
                if let Some(m) = first_hit(s, tr.local_window()) {
                    *slot = Some((m, *tr));
                }
            }
        }
        let hm = |t: NaiveDateTime| t.format("%H:%M").to_string();
        let mut parts = Vec::new();
        if let Some((m, tr)) = gap {
            let (a, b) = tr.local_window();
            parts.push((m, format!(
                "at {} on {}, which does not exist that day (clocks jump from {} to {}), so the run is skipped or moved",
                hm(m),
                m.date(),
                hm(a),
                hm(b)
            )));
        }
        if let Some((m, tr)) = overlap {
            let (a, b) = tr.local_window();
            parts.push((m, format!(
                "at {} on {}, which occurs twice that day (clocks fall back from {} to {}), so the run can happen twice",
                hm(m),
                m.date(),
                hm(b),
                hm(a)
            )));
        }
        if parts.is_empty() {
            continue;
        }
        parts.sort();
        let parts: Vec<String> = parts.into_iter().map(|(_, p)| p).collect();
        out.push((
            s.file_idx,
            Finding::new(
                Rule::DstWindow,
                &s.file,
                s.line,
                &s.object,
                format!("`{}` in {} fires {}.", s.schedule.expr(), s.zone.name(), parts.join(", and ")),
                "Move the schedule out of the transition hours (e.g. after 03:00 local), or schedule in a zone without DST (`Etc/UTC`), and key each run by its scheduled time so a repeat is a no-op.",
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

    fn utc(y: i32, m: u32, d: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(y, m, d, 0, 0, 0).unwrap()
    }

    fn local(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> NaiveDateTime {
        NaiveDate::from_ymd_opt(y, mo, d)
            .unwrap()
            .and_hms_opt(h, mi, 0)
            .unwrap()
    }

    #[test]
    fn berlin_transitions_in_a_year() {
        let t = transitions(chrono_tz::Europe::Berlin, utc(2026, 1, 1), utc(2027, 1, 1));
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].at, Utc.with_ymd_and_hms(2026, 3, 29, 1, 0, 0).unwrap());
        assert!(t[0].is_gap());
        assert_eq!(
            t[0].local_window(),
            (local(2026, 3, 29, 2, 0), local(2026, 3, 29, 3, 0))
        );
        assert_eq!(
            t[1].at,
            Utc.with_ymd_and_hms(2026, 10, 25, 1, 0, 0).unwrap()
        );
        assert!(!t[1].is_gap());
        assert_eq!(
            t[1].local_window(),
            (local(2026, 10, 25, 2, 0), local(2026, 10, 25, 3, 0))
        );
    }

    #[test]
    fn zones_without_dst_have_none() {
        assert!(transitions(Tz::UTC, utc(2026, 1, 1), utc(2027, 1, 1)).is_empty());
        assert!(
            transitions(chrono_tz::Asia::Shanghai, utc(2026, 1, 1), utc(2027, 1, 1)).is_empty()
        );
    }

    #[test]
    fn half_hour_shifts_are_found() {
        // Lord Howe Island moves by 30 minutes.
        let t = transitions(
            chrono_tz::Australia::Lord_Howe,
            utc(2026, 1, 1),
            utc(2027, 1, 1),
        );
        assert_eq!(t.len(), 2);
        assert!(t.iter().all(|t| (t.after - t.before).abs() == 1800));
    }
}

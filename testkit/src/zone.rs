//! Zones far from midnight. Tests and chaos runs plan compressed days a few
//! seconds from now; near a local midnight their slot times would wrap to
//! the next day. Planning in a whole-hour `Etc/GMT±h` zone where the window
//! is centred on local noon makes them independent of the time of day the
//! suite runs at. A test's "today" and its zone come from one instant,
//! [`process_start`], so a test running across midnight UTC (or an hour's
//! turn) names one day and one zone throughout.

use chrono::Timelike;
use chrono::{DateTime, FixedOffset, NaiveDate, Utc};
use std::time::Duration;

/// A whole-hour zone, as slotgate's config names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Zone {
    /// Hours east of UTC, -11..=12.
    pub hours_east: i32,
}

impl Zone {
    /// The IANA name (`Etc/GMT-2` is two hours *east* of UTC).
    pub fn name(&self) -> String {
        match self.hours_east {
            0 => "UTC".to_owned(),
            h if h > 0 => format!("Etc/GMT-{h}"),
            h => format!("Etc/GMT+{}", -h),
        }
    }

    /// The zone's fixed offset from UTC.
    pub fn offset(&self) -> FixedOffset {
        FixedOffset::east_opt(self.hours_east * 3600).expect("offset within a day")
    }

    /// The local day of `t`.
    pub fn day(&self, t: DateTime<Utc>) -> NaiveDate {
        t.with_timezone(&self.offset()).date_naive()
    }

    /// The local wall time of `t`, `HH:MM:SS`.
    pub fn hms(&self, t: DateTime<Utc>) -> String {
        t.with_timezone(&self.offset())
            .format("%H:%M:%S")
            .to_string()
    }
}

/// The first time this process asked: a test's "today", "yesterday" and
/// zone are derived from it (nextest runs each test in a process of its
/// own), never from a second reading of the clock.
pub fn process_start() -> DateTime<Utc> {
    static AT: std::sync::OnceLock<DateTime<Utc>> = std::sync::OnceLock::new();
    *AT.get_or_init(Utc::now)
}

/// The zone in which a window of `length` starting at `start` is centred on
/// local noon (so it lies between 06:00 and 18:59 local for up to 12 h).
pub fn around_noon(start: DateTime<Utc>, length: Duration) -> Zone {
    let start_hour = 12 - (length.as_secs() / 7200) as i32;
    let mut h = (start_hour - start.hour() as i32).rem_euclid(24);
    if h > 12 {
        h -= 24;
    }
    Zone { hours_east: h }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_time_of_day_gets_a_zone_with_the_window_around_noon() {
        let day = NaiveDate::from_ymd_opt(2026, 3, 29).unwrap();
        for minute in (0..24 * 60).step_by(7) {
            let start = day
                .and_hms_opt(minute / 60, minute % 60, 59)
                .unwrap()
                .and_utc();
            for secs in [10, 30, 3600, 12 * 3600] {
                let z = around_noon(start, Duration::from_secs(secs));
                assert!((-11..=12).contains(&z.hours_east));
                let end = start + chrono::Duration::seconds(secs as i64 + 30);
                assert_eq!(z.day(start), z.day(end), "{start} {secs}");
                let local = start.with_timezone(&z.offset());
                assert!(local.hour() >= 6, "{start}: starts at {local}");
            }
        }
        assert_eq!(Zone { hours_east: 3 }.name(), "Etc/GMT-3");
        assert_eq!(Zone { hours_east: -5 }.name(), "Etc/GMT+5");
        assert_eq!(Zone { hours_east: 0 }.name(), "UTC");
    }
}

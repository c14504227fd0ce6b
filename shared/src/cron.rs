//! Cron expressions, parsed with `croner` and evaluated in local wall-clock
//! time (`NaiveDateTime`): DST is handled by the callers, which know the zone.
//!
//! One parser for the whole house: `planner audit` reads the schedules of
//! CronJobs and crontabs with it, and a kind's `cron` calendar
//! ([`crate::config`]) is read by the same code, so both agree on what an
//! expression means.

use chrono::{NaiveDateTime, Timelike};
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

/// A parsed schedule.
#[derive(Debug, Clone)]
pub enum Schedule {
    /// Five cron fields (macros such as `@daily` expanded). `expr` is the
    /// text as written.
    Cron {
        /// The expression as written.
        expr: String,
        /// The parsed pattern.
        cron: Box<Cron>,
    },
    /// `@every DURATION` (Kubernetes only): an interval, not a wall-clock
    /// time, so neither DST nor herd rules apply.
    Every(String),
    /// `@reboot` (crontabs only): not a schedule, but still a caller of its
    /// entry point.
    Reboot,
}

/// The five-field form of a macro.
fn macro_fields(m: &str) -> Option<&'static str> {
    Some(match m.to_ascii_lowercase().as_str() {
        "@yearly" | "@annually" => "0 0 1 1 *",
        "@monthly" => "0 0 1 * *",
        "@weekly" => "0 0 * * 0",
        "@daily" | "@midnight" => "0 0 * * *",
        "@hourly" => "0 * * * *",
        _ => return None,
    })
}

impl Schedule {
    /// Parses a schedule: five fields, or a macro. `@reboot` is accepted when
    /// `allow_reboot` (crontabs), `@every D` when `allow_every` (CronJobs).
    pub fn parse(expr: &str, allow_reboot: bool, allow_every: bool) -> Result<Schedule, String> {
        let expr = expr.trim();
        if expr.starts_with('@') {
            let mut words = expr.split_whitespace();
            let head = words.next().unwrap_or("");
            let rest: Vec<&str> = words.collect();
            if head.eq_ignore_ascii_case("@reboot") && allow_reboot && rest.is_empty() {
                return Ok(Schedule::Reboot);
            }
            if head.eq_ignore_ascii_case("@every") && allow_every && rest.len() == 1 {
                return Ok(Schedule::Every(rest[0].to_owned()));
            }
            let fields = macro_fields(head)
                .filter(|_| rest.is_empty())
                .ok_or_else(|| format!("bad schedule {expr:?}: unknown macro (expected @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly)"))?;
            return Ok(Schedule::Cron {
                expr: expr.to_owned(),
                cron: Box::new(parse_fields(fields).expect("macro expansions are valid")),
            });
        }
        let n = expr.split_whitespace().count();
        if n != 5 {
            return Err(format!(
                "bad schedule {expr:?}: expected 5 fields (minute hour day-of-month month day-of-week), found {n}"
            ));
        }
        let cron = parse_fields(expr).map_err(|e| format!("bad schedule {expr:?}: {e}"))?;
        Ok(Schedule::Cron {
            expr: expr.to_owned(),
            cron: Box::new(cron),
        })
    }

    /// The expression as written (`@reboot` and `@every D` included).
    pub fn expr(&self) -> String {
        match self {
            Schedule::Cron { expr, .. } => expr.clone(),
            Schedule::Every(d) => format!("@every {d}"),
            Schedule::Reboot => "@reboot".to_owned(),
        }
    }

    /// The five fields of a wall-clock schedule (a macro expanded); empty
    /// for `@every` and `@reboot`.
    pub fn fields(&self) -> String {
        match self {
            Schedule::Cron { expr, .. } => {
                macro_fields(expr.split_whitespace().next().unwrap_or(""))
                    .map_or_else(|| expr.clone(), str::to_owned)
            }
            _ => String::new(),
        }
    }

    /// The cron pattern, for wall-clock schedules.
    pub fn cron(&self) -> Option<&Cron> {
        match self {
            Schedule::Cron { cron, .. } => Some(cron),
            _ => None,
        }
    }

    /// Whether the schedule fires at the minute of local time `t`.
    pub fn fires_at(&self, t: NaiveDateTime) -> bool {
        let Some(cron) = self.cron() else {
            return false;
        };
        let t = t
            .with_second(0)
            .and_then(|t| t.with_nanosecond(0))
            .unwrap_or(t);
        cron.is_time_matching(&t).unwrap_or(false)
    }

    /// Whether the schedule fires in every hour of the day (hour field `*` or
    /// covering 0–23). Such schedules keep their cadence across a DST
    /// transition (cron implementations treat them as "wildcard" jobs), so
    /// the DST rule does not apply to them.
    pub fn fires_every_hour(&self) -> bool {
        match self.cron() {
            Some(cron) => (0..24).all(|h| cron.pattern.hour_match(h).unwrap_or(false)),
            None => false,
        }
    }

    /// The local times in `[from, to)` the schedule fires at.
    pub fn fire_times(&self, from: NaiveDateTime, to: NaiveDateTime) -> Vec<NaiveDateTime> {
        let Some(cron) = self.cron() else {
            return Vec::new();
        };
        cron.iter_from(from, croner::Direction::Forward)
            .take_while(|t| *t < to)
            .collect()
    }
}

fn parse_fields(fields: &str) -> Result<Cron, croner::errors::CronError> {
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(fields)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::NaiveDate;

    fn at(y: i32, m: u32, d: u32, h: u32, min: u32) -> NaiveDateTime {
        NaiveDate::from_ymd_opt(y, m, d)
            .unwrap()
            .and_hms_opt(h, min, 0)
            .unwrap()
    }

    #[test]
    fn five_fields_and_macros_parse() {
        let s = Schedule::parse("30 2 * * *", false, false).unwrap();
        assert!(s.fires_at(at(2026, 3, 29, 2, 30)));
        assert!(!s.fires_at(at(2026, 3, 29, 2, 31)));
        assert!(!s.fires_every_hour());
        let d = Schedule::parse("@daily", false, false).unwrap();
        assert!(d.fires_at(at(2026, 1, 1, 0, 0)));
        assert_eq!(d.expr(), "@daily");
        let m = Schedule::parse("@midnight", false, false).unwrap();
        assert!(m.fires_at(at(2026, 5, 7, 0, 0)));
        let h = Schedule::parse("@hourly", false, false).unwrap();
        assert!(h.fires_every_hour());
        let w = Schedule::parse("0 9 * * MON-FRI", false, false).unwrap();
        assert!(w.fires_at(at(2026, 11, 30, 9, 0))); // a Monday
        assert!(!w.fires_at(at(2026, 11, 29, 9, 0))); // a Sunday
    }

    #[test]
    fn day_of_month_and_week_are_ored_like_vixie_cron() {
        let s = Schedule::parse("0 0 1 * 1", false, false).unwrap();
        assert!(s.fires_at(at(2026, 12, 1, 0, 0))); // the 1st, a Tuesday
        assert!(s.fires_at(at(2026, 12, 7, 0, 0))); // a Monday
        assert!(!s.fires_at(at(2026, 12, 8, 0, 0)));
    }

    #[test]
    fn reboot_and_every_only_where_allowed() {
        assert!(matches!(
            Schedule::parse("@reboot", true, false),
            Ok(Schedule::Reboot)
        ));
        assert!(Schedule::parse("@reboot", false, true).is_err());
        assert!(matches!(
            Schedule::parse("@every 1h30m", false, true),
            Ok(Schedule::Every(_))
        ));
        assert!(Schedule::parse("@every 1h", true, false).is_err());
    }

    #[test]
    fn malformed_expressions_are_rejected() {
        for bad in [
            "61 * * * *",
            "* * * *",
            "* * * * * *",
            "0 25 * * *",
            "@fortnightly",
            "a b c d e",
            "*/0 * * * *",
        ] {
            assert!(
                Schedule::parse(bad, true, true).is_err(),
                "{bad} was accepted"
            );
        }
    }

    #[test]
    fn fire_times_are_listed_in_a_range() {
        let s = Schedule::parse("*/20 9 * * *", false, false).unwrap();
        let t = s.fire_times(at(2026, 1, 1, 0, 0), at(2026, 1, 2, 0, 0));
        assert_eq!(
            t,
            vec![
                at(2026, 1, 1, 9, 0),
                at(2026, 1, 1, 9, 20),
                at(2026, 1, 1, 9, 40)
            ]
        );
        assert!(Schedule::Reboot
            .fire_times(at(2026, 1, 1, 0, 0), at(2026, 1, 2, 0, 0))
            .is_empty());
    }
}

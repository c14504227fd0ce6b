//! A kind's calendar: which local days have slots, which of the kind's
//! times each of them runs, each day's cap, and the days blacked out.
//!
//! The kind keeps one list of times (`KindConfig::slots`), numbered once
//! and kept across edits (DESIGN 4.18). The calendar only says which of
//! those times a given weekday runs: a time listed for several days (the
//! base `slots` and a `[[kinds.on]]` list, or a `cron` firing on several
//! weekdays) is one listing with one number, so a slot key means the same
//! time whichever day list names it, and moving a time between day lists
//! re-keys nothing.
//!
//! Three ways to say it, refused in combination where they would
//! contradict each other:
//! - `slots` (+ optional `weekdays`, default every day) and optional
//!   `[[kinds.on]]` tables (`days`, their own `slots`, optional
//!   `daily_cap`) for weekdays that differ;
//! - `cron = "m h * * dow"` instead of `slots` + `weekdays` + `on`: its
//!   minutes and hours give the times, its day-of-week field the days (a
//!   day-of-month or month field other than `*` is refused: a calendar
//!   here is weekly);
//! - `blackout`: local dates and inclusive ranges whose slots are planned
//!   and recorded `skipped/blackout`, so a report shows the day's fate
//!   instead of a gap.

use super::keys::{FieldError, Keys};
use crate::cron::Schedule;
use chrono::{Datelike, NaiveDate, NaiveTime, Weekday};

/// A cron expression may fire at most this many times a local day
/// (every 5 minutes): each firing is a slot with its own gate row, outcome
/// and stream entry, and a pattern such as `* * * * *` (1,440 a day) is far
/// more likely a mistake than a publishing calendar.
pub const MAX_CRON_SLOTS_PER_DAY: usize = 288;

/// The weekday names a calendar accepts, Monday first (ISO order).
const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// One weekday's list: which of the kind's times run, and the day's cap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DayList {
    /// Positions in `KindConfig::slots` (and `slot_numbers`), ascending.
    pub positions: Vec<usize>,
    /// Most publishes on such a day.
    pub daily_cap: u32,
}

/// A kind's calendar; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Calendar {
    /// Per ISO weekday (Monday = 0): the day's list, `None` for a day
    /// without slots. Empty (the default) means every day runs every time
    /// with the kind's cap.
    weekly: Vec<Option<DayList>>,
    /// Inclusive local date ranges, as written.
    blackout: Vec<(NaiveDate, NaiveDate)>,
    /// The `cron` expression the calendar came from, if any (for messages
    /// and the audit).
    pub cron: Option<String>,
}

/// What the calendar says of one local day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Day<'a> {
    /// Positions in `KindConfig::slots` that run that day; `None` = all.
    pub positions: Option<&'a [usize]>,
    /// The day's cap.
    pub daily_cap: u32,
    /// The day is blacked out: its slots are planned and recorded
    /// `skipped/blackout`.
    pub blackout: bool,
}

impl Calendar {
    /// What the calendar says of `day`, for a kind whose base cap is
    /// `daily_cap`.
    pub fn day(&self, day: NaiveDate, daily_cap: u32) -> Day<'_> {
        let blackout = self.blacked_out(day);
        if self.weekly.is_empty() {
            return Day {
                positions: None,
                daily_cap,
                blackout,
            };
        }
        match &self.weekly[day.weekday().num_days_from_monday() as usize] {
            Some(l) => Day {
                positions: Some(&l.positions),
                daily_cap: l.daily_cap,
                blackout,
            },
            None => Day {
                positions: Some(&[]),
                daily_cap: 0,
                blackout,
            },
        }
    }

    /// Whether `day` is in a blackout date or range.
    pub fn blacked_out(&self, day: NaiveDate) -> bool {
        self.blackout.iter().any(|(a, b)| *a <= day && day <= *b)
    }

    /// The blackout dates and ranges, as written.
    pub fn blackouts(&self) -> &[(NaiveDate, NaiveDate)] {
        &self.blackout
    }

    /// The weekdays with at least one slot, Monday first.
    pub fn running_weekdays(&self) -> Vec<Weekday> {
        (0..7u8)
            .filter(|d| {
                self.weekly.is_empty()
                    || self.weekly[*d as usize]
                        .as_ref()
                        .is_some_and(|l| !l.positions.is_empty())
            })
            .map(|d| Weekday::try_from(d).expect("0..7 is a weekday"))
            .collect()
    }
}

/// Reads a kind's `slots`/`weekdays`/`on`/`cron`/`blackout`: the kind's
/// list of times and its calendar. `base` is the parsed `slots` (`None`
/// when absent); `daily_cap` the kind's.
pub(super) fn parse(
    keys: &Keys<'_>,
    base: Option<Vec<NaiveTime>>,
    daily_cap: u32,
) -> Result<(Vec<NaiveTime>, Calendar), FieldError> {
    let blackout = blackouts(keys)?;
    let (times, weekly, cron) = match (keys.get("cron"), base) {
        (Some(_), Some(_)) => {
            return Err((
                "cron".into(),
                "a kind takes either cron or slots (with weekdays and [[kinds.on]]), not both"
                    .into(),
            ))
        }
        (Some(c), None) => {
            for other in ["weekdays", "on"] {
                if keys.has(other) {
                    return Err((
                        other.into(),
                        "not allowed with cron (its day-of-week field says the days)".to_owned(),
                    ));
                }
            }
            let expr = c
                .as_str()
                .ok_or_else(|| ("cron".to_owned(), "expected a string".to_owned()))?;
            let (times, weekly) = from_cron(expr, daily_cap).map_err(|m| ("cron".to_owned(), m))?;
            (times, weekly, Some(expr.to_owned()))
        }
        (None, None) => return Err(("slots".into(), "missing (or set cron)".into())),
        (None, Some(base)) => {
            let (times, weekly) = from_lists(keys, base, daily_cap)?;
            (times, weekly, None)
        }
    };
    Ok((
        times,
        Calendar {
            weekly,
            blackout,
            cron,
        },
    ))
}

/// `slots` + `weekdays` + `[[kinds.on]]`.
fn from_lists(
    keys: &Keys<'_>,
    base: Vec<NaiveTime>,
    daily_cap: u32,
) -> Result<(Vec<NaiveTime>, Vec<Option<DayList>>), FieldError> {
    let weekdays = match keys.get("weekdays") {
        None => None,
        Some(v) => Some(days(v, "weekdays")?),
    };
    let on = keys.tables("on")?;
    if weekdays.is_none() && on.is_empty() {
        return Ok((base, Vec::new()));
    }
    // The union of every list's listings (a time listed twice in one list
    // is two listings), base first: positions index it.
    let mut times = base.clone();
    let base_positions: Vec<usize> = (0..base.len()).collect();
    let mut weekly: Vec<Option<DayList>> = vec![None; 7];
    for d in weekdays.unwrap_or_else(|| (0..7).collect()) {
        weekly[d] = Some(DayList {
            positions: base_positions.clone(),
            daily_cap,
        });
    }
    let mut named: Vec<Option<String>> = vec![None; 7];
    if let Some(w) = keys.get("weekdays") {
        for d in days(w, "weekdays")? {
            named[d] = Some("weekdays".into());
        }
    }
    for (i, t) in on.iter().enumerate() {
        let at = |f: &str| format!("on[{i}].{f}");
        t.known(&["days", "slots", "daily_cap"])
            .map_err(|(f, m)| (at(&f), m))?;
        let list_days = days(
            t.get("days")
                .ok_or_else(|| (at("days"), "missing".to_owned()))?,
            &at("days"),
        )?;
        let list = super::kind::slots(t).map_err(|(f, m)| (at(&f), m))?;
        let cap = match t.get("daily_cap") {
            None => daily_cap,
            Some(_) => super::kind::daily_cap(t).map_err(|(f, m)| (at(&f), m))?,
        };
        let positions = place(&mut times, &list);
        for d in list_days {
            if let Some(first) = &named[d] {
                return Err((
                    at("days"),
                    format!("{} is named twice (also in {first})", DAY_NAMES[d]),
                ));
            }
            named[d] = Some(at("days"));
            weekly[d] = Some(DayList {
                positions: positions.clone(),
                daily_cap: cap,
            });
        }
    }
    Ok((times, weekly))
}

/// The positions of `list`'s listings in `times`, appending the listings
/// `times` lacks: the n-th "09:00" of a list is the n-th "09:00" of the
/// union, so one time keeps one number across day lists.
fn place(times: &mut Vec<NaiveTime>, list: &[NaiveTime]) -> Vec<usize> {
    let mut positions = Vec::with_capacity(list.len());
    for (j, t) in list.iter().enumerate() {
        let nth = list[..j].iter().filter(|u| *u == t).count();
        let found = times
            .iter()
            .enumerate()
            .filter(|(_, u)| *u == t)
            .nth(nth)
            .map(|(p, _)| p);
        positions.push(found.unwrap_or_else(|| {
            times.push(*t);
            times.len() - 1
        }));
    }
    positions.sort_unstable();
    positions
}

/// A non-empty array of distinct weekday names, as ISO indexes.
fn days(v: &toml::Value, field: &str) -> Result<Vec<usize>, FieldError> {
    let a = v.as_array().ok_or_else(|| {
        (
            field.to_owned(),
            "expected an array of day names (\"mon\" … \"sun\")".to_owned(),
        )
    })?;
    if a.is_empty() {
        return Err((
            field.to_owned(),
            "at least one day (to publish nothing, set daily_cap = 0)".to_owned(),
        ));
    }
    let mut out = Vec::with_capacity(a.len());
    for (j, d) in a.iter().enumerate() {
        let name = d.as_str().unwrap_or("");
        let i = DAY_NAMES
            .iter()
            .position(|n| name.eq_ignore_ascii_case(n))
            .ok_or_else(|| {
                (
                    format!("{field}[{j}]"),
                    format!(
                        "unknown day {} (expected one of {})",
                        shown(d),
                        DAY_NAMES.join(", ")
                    ),
                )
            })?;
        if out.contains(&i) {
            return Err((
                format!("{field}[{j}]"),
                format!("{} is named twice", DAY_NAMES[i]),
            ));
        }
        out.push(i);
    }
    Ok(out)
}

/// A value as a message shows it: a string quoted, anything else by type.
fn shown(v: &toml::Value) -> String {
    match v.as_str() {
        Some(s) => format!("{s:?}"),
        None => format!("(a {})", v.type_str()),
    }
}

/// `blackout`: `"YYYY-MM-DD"` or `"YYYY-MM-DD..YYYY-MM-DD"` (inclusive,
/// first ≤ last).
fn blackouts(keys: &Keys<'_>) -> Result<Vec<(NaiveDate, NaiveDate)>, FieldError> {
    let Some(v) = keys.get("blackout") else {
        return Ok(Vec::new());
    };
    let a = v.as_array().ok_or_else(|| {
        (
            "blackout".to_owned(),
            "expected an array of \"YYYY-MM-DD\" or \"YYYY-MM-DD..YYYY-MM-DD\" strings".to_owned(),
        )
    })?;
    let date = |s: &str| NaiveDate::parse_from_str(s.trim(), "%Y-%m-%d").ok();
    let mut out = Vec::with_capacity(a.len());
    for (j, e) in a.iter().enumerate() {
        let field = format!("blackout[{j}]");
        let s = e.as_str().unwrap_or("");
        let (first, last) = match s.split_once("..") {
            Some((x, y)) => (date(x), date(y)),
            None => (date(s), date(s)),
        };
        match (first, last) {
            (Some(x), Some(y)) if x <= y => out.push((x, y)),
            (Some(_), Some(_)) => {
                return Err((field, format!("range {s:?} ends before it starts")))
            }
            _ => {
                return Err((
                    field,
                    format!(
                        "bad date {} (expected \"YYYY-MM-DD\" or \"YYYY-MM-DD..YYYY-MM-DD\")",
                        shown(e)
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// A weekly cron expression's times and days. Each weekday's times are the
/// minutes the expression fires on a date of that weekday; every time is
/// one listing of the kind.
fn from_cron(expr: &str, daily_cap: u32) -> Result<(Vec<NaiveTime>, Vec<Option<DayList>>), String> {
    let schedule = Schedule::parse(expr, false, false)?;
    let fields: Vec<String> = schedule
        .fields()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    if fields.len() != 5 || fields[2] != "*" || fields[3] != "*" {
        return Err(format!(
            "{expr:?}: day-of-month and month must be * (a kind's calendar is weekly; use blackout for dates)"
        ));
    }
    // 2024-01-01 is a Monday: a week of dates, Monday first.
    let monday = NaiveDate::from_ymd_opt(2024, 1, 1).expect("a date");
    let mut per_day: Vec<Vec<NaiveTime>> = Vec::with_capacity(7);
    for d in 0..7 {
        let date = monday + chrono::Duration::days(d);
        let from = date.and_time(NaiveTime::MIN);
        let to = from + chrono::Duration::days(1);
        let fires: Vec<NaiveTime> = schedule
            .fire_times(from, to)
            .into_iter()
            .map(|t| t.time())
            .collect();
        if fires.len() > MAX_CRON_SLOTS_PER_DAY {
            return Err(format!(
                "{expr:?} fires {} times on a {}; at most {MAX_CRON_SLOTS_PER_DAY} a day (every 5 minutes) are allowed",
                fires.len(),
                DAY_NAMES[d as usize]
            ));
        }
        per_day.push(fires);
    }
    let mut times: Vec<NaiveTime> = per_day.iter().flatten().copied().collect();
    times.sort_unstable();
    times.dedup();
    if times.is_empty() {
        return Err(format!("{expr:?} never fires"));
    }
    let weekly = per_day
        .iter()
        .map(|fires| {
            (!fires.is_empty()).then(|| DayList {
                positions: fires
                    .iter()
                    .map(|t| times.binary_search(t).expect("in the union"))
                    .collect(),
                daily_cap,
            })
        })
        .collect();
    Ok((times, weekly))
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::slot::day_schedule;
    use chrono::{NaiveDate, NaiveTime};
    use std::path::Path;

    fn kind(body: &str) -> Result<crate::config::KindConfig, String> {
        let text = format!(
            "[[kinds]]\nname = \"article\"\ntimezone = \"Europe/Berlin\"\ndaily_cap = 2\nstarting_deadline = \"1h\"\n{body}"
        );
        Config::parse(Path::new("cal.toml"), &text)
            .map(|c| c.kinds[0].clone())
            .map_err(|e| e.to_string())
    }

    fn date(d: &str) -> NaiveDate {
        NaiveDate::parse_from_str(d, "%Y-%m-%d").unwrap()
    }

    /// The local times of `day`'s slots, and the slot numbers.
    fn day(k: &crate::config::KindConfig, d: &str) -> Vec<(String, u32)> {
        day_schedule(k, date(d), "seed")
            .into_iter()
            .map(|p| {
                let t = k.slot_time(p.key.slot_no).unwrap();
                (t.format("%H:%M").to_string(), p.key.slot_no)
            })
            .collect()
    }

    fn hm(s: &str) -> (String, u32) {
        let (t, n) = s.split_once('#').unwrap();
        (t.to_owned(), n.parse().unwrap())
    }

    // 2026-12-07 is a Monday.
    const CAL: &str = r#"slots = ["09:00", "15:00"]
weekdays = ["mon", "tue", "wed", "thu", "fri"]
blackout = ["2026-12-25", "2026-12-31..2027-01-01"]
[[kinds.on]]
days = ["sat"]
slots = ["10:30", "15:00"]
daily_cap = 1
"#;

    #[test]
    fn weekdays_an_on_list_and_an_empty_day() {
        let k = kind(CAL).unwrap();
        assert_eq!(
            k.slots.len(),
            3,
            "09:00, 15:00 and 10:30: 15:00 is one listing"
        );
        for d in ["2026-12-07", "2026-12-11"] {
            assert_eq!(day(&k, d), vec![hm("09:00#1"), hm("15:00#2")], "{d}");
            assert_eq!(k.day(date(d)).daily_cap, 2);
        }
        // Saturday: its own list; 15:00 keeps the number it has on weekdays.
        assert_eq!(day(&k, "2026-12-12"), vec![hm("15:00#2"), hm("10:30#3")]);
        assert_eq!(k.day(date("2026-12-12")).daily_cap, 1);
        assert!(day(&k, "2026-12-13").is_empty(), "no Sunday slots");
        assert!(k.slot_time_on(date("2026-12-13"), 1).is_none());
        assert!(k.slot_time_on(date("2026-12-12"), 1).is_none());
        assert_eq!(
            k.slot_time_on(date("2026-12-12"), 3),
            NaiveTime::from_hms_opt(10, 30, 0)
        );
    }

    #[test]
    fn blackout_days_keep_their_slots_and_say_so() {
        let k = kind(CAL).unwrap();
        for d in ["2026-12-25", "2026-12-31", "2027-01-01"] {
            assert!(k.day(date(d)).blackout, "{d}");
            assert_eq!(
                day(&k, d).len(),
                2,
                "{d}: planned, to be recorded skipped/blackout"
            );
        }
        for d in ["2026-12-24", "2026-12-30", "2027-01-04"] {
            assert!(!k.day(date(d)).blackout, "{d}");
        }
    }

    #[test]
    fn a_kind_without_a_calendar_runs_every_time_every_day() {
        let k = kind("slots = [\"09:00\", \"09:00\"]").unwrap();
        for d in ["2026-12-12", "2026-12-13"] {
            assert_eq!(day(&k, d), vec![hm("09:00#1"), hm("09:00#2")]);
            assert_eq!(k.day(date(d)).positions, None);
        }
    }

    #[test]
    fn cron_gives_the_times_and_the_days() {
        let k = kind("cron = \"0 9,15 * * 1-5\"").unwrap();
        assert_eq!(day(&k, "2026-12-07"), vec![hm("09:00#1"), hm("15:00#2")]);
        assert!(day(&k, "2026-12-12").is_empty());
        let k = kind("cron = \"30 10 * * 6\"\n[[kinds.on]]\ndays = [\"sun\"]\nslots = [\"11:00\"]");
        assert!(
            k.unwrap_err().contains("on"),
            "cron and on refused together"
        );
    }

    #[test]
    fn bad_calendars_are_refused_naming_the_field() {
        for (body, field, says) in [
            ("slots = [\"09:00\"]\nweekdays = [\"mon\", \"funday\"]", "weekdays[1]", "unknown day \"funday\""),
            ("slots = [\"09:00\"]\nweekdays = [\"mon\", \"MON\"]", "weekdays[1]", "named twice"),
            ("slots = [\"09:00\"]\nweekdays = []", "weekdays", "at least one day"),
            ("slots = [\"09:00\"]\nweekdays = [\"sat\"]\n[[kinds.on]]\ndays = [\"sat\"]\nslots = [\"10:00\"]", "on[0].days", "sat is named twice"),
            ("slots = [\"09:00\"]\n[[kinds.on]]\ndays = [\"sat\"]\nslots = [\"10:00\"]\n[[kinds.on]]\ndays = [\"sat\"]\nslots = [\"11:00\"]", "on[1].days", "sat is named twice"),
            ("slots = [\"09:00\"]\n[[kinds.on]]\ndays = [\"sat\"]\nslots = [\"25:00\"]", "on[0].slots[0]", "bad time"),
            ("slots = [\"09:00\"]\n[[kinds.on]]\ndays = [\"sat\"]\nslots = [\"10:00\"]\nsize = 3", "on[0].size", "unknown"),
            ("slots = [\"09:00\"]\n[[kinds.on]]\nslots = [\"10:00\"]", "on[0].days", "missing"),
            ("slots = [\"09:00\"]\nblackout = [\"2026-13-01\"]", "blackout[0]", "bad date \"2026-13-01\""),
            ("slots = [\"09:00\"]\nblackout = [\"2027-01-02..2027-01-01\"]", "blackout[0]", "ends before it starts"),
            ("slots = [\"09:00\"]\ncron = \"0 9 * * *\"", "cron", "either cron or slots"),
            ("cron = \"0 9 * * *\"\nweekdays = [\"mon\"]", "weekdays", "not allowed with cron"),
            ("cron = \"0 9 1 * *\"", "cron", "day-of-month and month must be *"),
            ("cron = \"*/4 * * * *\"", "cron", "at most 288"),
            ("cron = \"0 9 * *\"", "cron", "expected 5 fields"),
            ("weekdays = [\"mon\"]", "slots", "missing"),
        ] {
            let e = kind(body).expect_err(body);
            assert!(e.contains(field) && e.contains(says), "{body}\n→ {e}");
        }
    }
}

//! Slot keys and the daily schedule.
//!
//! A slot is `(kind, day, slot_no)`: `day` is the local date in the kind's
//! time zone and `slot_no` the number its configured time carries
//! (`KindConfig::slot_numbers`: the list position when the kind was first
//! numbered, then kept across schedule edits; DESIGN 4.18). Its key
//! `<kind>:<YYYY-MM-DD>:<slot_no>` is the idempotency key of every effect
//! the slot has, so it must be computable from the plan alone — never from
//! "now".

use crate::config::{valid_kind_name, KindConfig};
use chrono::{
    DateTime, Duration as ChronoDuration, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, Offset,
    TimeZone, Utc,
};
use chrono_tz::Tz;
use std::fmt;
use std::str::FromStr;

/// The identity of a planned slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotKey {
    /// The configured kind's name (`[a-z0-9_-]{1,64}`).
    pub kind: String,
    /// The local date in the kind's time zone, not the UTC date.
    pub day: NaiveDate,
    /// The number of the slot's configured time (see the module docs).
    pub slot_no: u32,
}

impl SlotKey {
    /// A key from its parts, unchecked: a kind or `slot_no` that is not
    /// configured is refused later, where the config is at hand.
    pub fn new(kind: impl Into<String>, day: NaiveDate, slot_no: u32) -> Self {
        Self {
            kind: kind.into(),
            day,
            slot_no,
        }
    }
}

impl fmt::Display for SlotKey {
    /// `<kind>:<YYYY-MM-DD>:<slot_no>`. The day goes through `NaiveDate`'s
    /// own `Display` (the same ISO text as `format("%Y-%m-%d")`, see the
    /// test `display_matches_the_strftime_form`): `format` parses its
    /// pattern on every call, and keys are written for every slot of every
    /// batch (about 4 % of a worker's CPU in a 100,000-slot crowd).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.kind, self.day, self.slot_no)
    }
}

/// Why a string is not a slot key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// Fewer than three `:`-separated parts.
    #[error("expected <kind>:<YYYY-MM-DD>:<slot_no>")]
    Shape,
    /// The kind part is not a valid kind name (whether configured is not
    /// checked here).
    #[error("bad kind name (must match [a-z0-9_-]{{1,64}})")]
    Kind,
    /// The day part is not a real `YYYY-MM-DD` date.
    #[error("bad date (expected YYYY-MM-DD)")]
    Day,
    /// The slot part is not an integer from 1 to 999999999.
    #[error("bad slot number (expected a positive integer)")]
    SlotNo,
}

impl FromStr for SlotKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        let mut parts = s.splitn(3, ':');
        let (Some(kind), Some(day), Some(no)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(KeyError::Shape);
        };
        if !valid_kind_name(kind) {
            return Err(KeyError::Kind);
        }
        let day = canonical_day(day).ok_or(KeyError::Day)?;
        if no.is_empty() || !no.bytes().all(|b| b.is_ascii_digit()) || no.len() > 9 {
            return Err(KeyError::SlotNo);
        }
        let slot_no: u32 = no.parse().map_err(|_| KeyError::SlotNo)?;
        if slot_no == 0 {
            return Err(KeyError::SlotNo);
        }
        Ok(SlotKey {
            kind: kind.to_owned(),
            day,
            slot_no,
        })
    }
}

/// The day of a key in exactly the form the key is written in
/// (`YYYY-MM-DD`, four-digit year, two-digit month and day).
///
/// Why not chrono's `%Y-%m-%d`: it also takes other spellings of a date
/// (`2026-01- 5`, ` 2026-1-15`, `+026-01-15`), so two different strings
/// could name one slot; and every delivery's key is parsed several times on the hot path,
/// where a format string interpreted per call was a visible share of a
/// worker's CPU in a burst.
fn canonical_day(day: &str) -> Option<NaiveDate> {
    let b = day.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let number = |r: std::ops::Range<usize>| {
        b[r].iter().try_fold(0u32, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    let year = i32::try_from(number(0..4)?).ok()?;
    NaiveDate::from_ymd_opt(year, number(5..7)?, number(8..10)?)
}

/// One slot as the planner lays it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedSlot {
    /// The slot's identity and idempotency key.
    pub key: SlotKey,
    /// The configured local time on its day, resolved through DST: what a
    /// CronJob's schedule and the operator think of as "the slot's time".
    pub nominal_at: DateTime<Utc>,
    /// When it may run: `nominal_at + jitter_ms`. Once stored, the stored
    /// value is what counts.
    pub due_at: DateTime<Utc>,
    /// The slot's offset in `[0, jitter)`, in milliseconds.
    pub jitter_ms: i64,
}

impl KindConfig {
    /// The configured local time of slot number `slot_no`, if it is one.
    ///
    /// Asked for every delivery: a time still at the position its number
    /// names (every time of a kind never edited, and most of one that was)
    /// is found at once; only a moved number is searched for.
    pub fn slot_time(&self, slot_no: u32) -> Option<NaiveTime> {
        let at = (slot_no as usize).checked_sub(1)?;
        let i = if self.slot_numbers.get(at) == Some(&slot_no) {
            at
        } else {
            self.slot_numbers.iter().position(|n| *n == slot_no)?
        };
        self.slots.get(i).copied()
    }

    /// The local time of slot number `slot_no` on `day`, if the kind's
    /// calendar runs it that day.
    pub fn slot_time_on(&self, day: NaiveDate, slot_no: u32) -> Option<NaiveTime> {
        let time = self.slot_time(slot_no)?;
        match self.day(day).positions {
            None => Some(time),
            Some(p) => {
                let i = self.slot_numbers.iter().position(|n| *n == slot_no)?;
                p.binary_search(&i).is_ok().then_some(time)
            }
        }
    }

    /// The configured slot numbers, ascending, for messages
    /// ("slots 1, 3, 4").
    pub fn slot_numbers_sorted(&self) -> Vec<u32> {
        let mut v = self.slot_numbers.clone();
        v.sort_unstable();
        v
    }
}

/// The slots of one kind on one local day, in the config's order: the
/// times its calendar runs that day (every time, for a kind without a
/// calendar; none on a weekday it does not list). A blacked-out day's
/// slots are among them: they are planned and recorded
/// `skipped/blackout`.
pub fn day_schedule(kind: &KindConfig, day: NaiveDate, seed: &str) -> Vec<PlannedSlot> {
    let runs = kind.day(day).positions;
    kind.slot_numbers
        .iter()
        .zip(&kind.slots)
        .enumerate()
        .filter(|(i, _)| runs.is_none_or(|p| p.binary_search(i).is_ok()))
        .map(|(_, (no, t))| at_time(kind, day, *no, *t, seed))
        .collect()
}

/// Slot `slot_no` of `kind` on `day`, or `None` when `slot_no` is not
/// configured or the calendar does not run it that day.
pub fn planned_slot(
    kind: &KindConfig,
    day: NaiveDate,
    slot_no: u32,
    seed: &str,
) -> Option<PlannedSlot> {
    Some(at_time(
        kind,
        day,
        slot_no,
        kind.slot_time_on(day, slot_no)?,
        seed,
    ))
}

/// Slot `slot_no`, configured at local `time`, of `kind` on `day`.
fn at_time(
    kind: &KindConfig,
    day: NaiveDate,
    slot_no: u32,
    time: NaiveTime,
    seed: &str,
) -> PlannedSlot {
    let key = SlotKey::new(kind.name.clone(), day, slot_no);
    let nominal_at = resolve_local(kind.timezone, day.and_time(time));
    let jitter_ms = jitter_ms(&key, seed, kind.jitter);
    PlannedSlot {
        due_at: nominal_at + ChronoDuration::milliseconds(jitter_ms),
        nominal_at,
        jitter_ms,
        key,
    }
}

/// The slots of the local days before, of and after the local date of `at`
/// in the kind's zone, in nominal-time order: every slot whose nominal time
/// is within a day of `at` is among them, whatever the zone and its DST.
/// Used to find the slot a given instant belongs to.
pub fn schedule_around(kind: &KindConfig, at: DateTime<Utc>, seed: &str) -> Vec<PlannedSlot> {
    let day = local_today(kind.timezone, at);
    let mut slots: Vec<PlannedSlot> = [day.pred_opt(), Some(day), day.succ_opt()]
        .into_iter()
        .flatten()
        .flat_map(|d| day_schedule(kind, d, seed))
        .collect();
    slots.sort_by(|a, b| (a.nominal_at, &a.key).cmp(&(b.nominal_at, &b.key)));
    slots
}

/// Maps a local wall-clock time to the instant it runs, by the DST rules of
/// DESIGN: a time inside a spring-forward gap runs at the first instant after
/// the gap; a time that occurs twice runs once, at its first occurrence.
pub fn resolve_local(tz: Tz, local: NaiveDateTime) -> DateTime<Utc> {
    match tz.from_local_datetime(&local) {
        LocalResult::Single(t) => t.with_timezone(&Utc),
        LocalResult::Ambiguous(a, b) => a.min(b).with_timezone(&Utc),
        LocalResult::None => {
            // The offsets a day either side of the gap bracket it. Search the
            // UTC instants between them for the first whose local time is past
            // `local`: that is the transition, the first instant after the gap.
            let off = |naive: NaiveDateTime| {
                i64::from(tz.offset_from_utc_datetime(&naive).fix().local_minus_utc())
            };
            let before = off(local - ChronoDuration::days(1));
            let after = off(local + ChronoDuration::days(1));
            let local_utc = local.and_utc().timestamp();
            let (mut lo, mut hi) = (local_utc - before.max(after), local_utc - before.min(after));
            let local_at = |ts: i64| {
                let utc = DateTime::<Utc>::from_timestamp(ts, 0)
                    .expect("in range")
                    .naive_utc();
                utc + ChronoDuration::seconds(off(utc))
            };
            // Invariant: local_at(lo) < local <= local_at(hi).
            while hi - lo > 1 {
                let mid = lo + (hi - lo) / 2;
                if local_at(mid) >= local {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            DateTime::<Utc>::from_timestamp(hi, 0).expect("in range")
        }
    }
}

/// The slot's jitter in `[0, jitter)`, drawn deterministically from the key
/// and the installation seed so every replica, re-plan and re-delivery sees
/// the same due time. FNV-1a over the bytes, finished with SplitMix64: both
/// are fixed algorithms, unlike std's hasher, so the value is stable across
/// Rust releases.
pub fn jitter_ms(key: &SlotKey, seed: &str, jitter: std::time::Duration) -> i64 {
    let range = jitter.as_millis() as u64;
    if range == 0 {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seed.bytes().chain([0u8]).chain(key.to_string().bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (splitmix64(h) % range) as i64
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Today's local date in a kind's time zone.
pub fn local_today(tz: Tz, now: DateTime<Utc>) -> NaiveDate {
    now.with_timezone(&tz).date_naive()
}

/// How far ahead of its time a slot may be delivered and still run. A
/// minute absorbs clock differences between the planner, Redis and the
/// workers; a delivery earlier than that (a day that has not come, injected
/// with `redis-cli` or by a confused caller) is recorded `not_due` and runs
/// nothing.
pub const EARLY_TOLERANCE: std::time::Duration = std::time::Duration::from_secs(60);

/// The stream field (`early=1`, with caller `manual`) by which `planner
/// trigger --early` asks to run a slot before its time (granted only with
/// its request row, see `executor::Exemption`).
pub const EARLY_FIELD: &str = "early";

/// How long before `runs_at` the instant `now` is, when that is more than
/// [`EARLY_TOLERANCE`]: a slot must not run yet. The one statement of the
/// rule "a slot never runs before its time"; both delivery paths and
/// `planner trigger` ask it.
pub fn ahead_of_time(runs_at: DateTime<Utc>, now: DateTime<Utc>) -> Option<chrono::Duration> {
    let ahead = runs_at.signed_duration_since(now);
    (ahead.to_std().is_ok_and(|a| a > EARLY_TOLERANCE)).then_some(ahead)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_matches_the_strftime_form() {
        for (y, m, d) in [
            (1, 1, 1),
            (999, 12, 31),
            (2026, 9, 5),
            (9999, 12, 31),
            (10000, 1, 1),
        ] {
            let day = NaiveDate::from_ymd_opt(y, m, d).unwrap();
            let k = SlotKey::new("news", day, 7);
            assert_eq!(k.to_string(), format!("news:{}:7", day.format("%Y-%m-%d")));
        }
    }

    #[test]
    fn key_round_trips_and_rejects_garbage() {
        let k: SlotKey = "article:2026-09-25:2".parse().unwrap();
        assert_eq!(k.to_string(), "article:2026-09-25:2");
        assert_eq!("x".parse::<SlotKey>(), Err(KeyError::Shape));
        assert_eq!("Bad:2026-09-25:1".parse::<SlotKey>(), Err(KeyError::Kind));
        assert_eq!("a:2026-13-01:1".parse::<SlotKey>(), Err(KeyError::Day));
        assert_eq!("a:2026-02-30:1".parse::<SlotKey>(), Err(KeyError::Day));
        // Other spellings of a real date are not the key's form: one slot,
        // one string (chrono's `%Y-%m-%d` took each of these).
        for other in [
            "02026-1-15",
            "2026-1-015",
            "+026-01-15",
            "2026-01-1 ",
            "2026/01/15",
        ] {
            assert_eq!(
                format!("a:{other}:1").parse::<SlotKey>(),
                Err(KeyError::Day),
                "{other:?}"
            );
        }
        let early: SlotKey = "a:0999-01-02:1".parse().unwrap();
        assert_eq!(early.to_string(), "a:0999-01-02:1");
        assert_eq!("a:2026-01-01:0".parse::<SlotKey>(), Err(KeyError::SlotNo));
        assert_eq!("a:2026-01-01:-1".parse::<SlotKey>(), Err(KeyError::SlotNo));
        assert_eq!("a:2026-01-01:1:2".parse::<SlotKey>(), Err(KeyError::SlotNo));
    }

    #[test]
    fn jitter_is_stable_and_in_range() {
        let k = SlotKey::new("a", NaiveDate::from_ymd_opt(2026, 1, 1).unwrap(), 1);
        let j = std::time::Duration::from_secs(900);
        let first = jitter_ms(&k, "seed", j);
        for _ in 0..10 {
            assert_eq!(jitter_ms(&k, "seed", j), first);
        }
        assert!((0..900_000).contains(&first));
        assert_eq!(jitter_ms(&k, "seed", std::time::Duration::ZERO), 0);
    }
}

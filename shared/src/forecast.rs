//! `planner forecast`: the runway — for each kind and local day ahead, how
//! many of the calendar's slots would publish and why the others would
//! not, and the first day a slot would find no ready draft.
//!
//! Why a simulation and not a count: "drafts left ÷ slots a day" is wrong
//! as soon as anything the real pick weighs is in play. A draft ready only
//! next Tuesday cannot fill Monday's slot; a blacked-out or paused day
//! spends no draft; a `[[kinds.on]]` day with a cap of one leaves drafts
//! for later; a rotating kind takes one of each category before a second
//! of any. So [`simulate`] walks the slots in the order they fall due and
//! decides each one by the executor's own rules, in the executor's order
//! (`executor/gate.rs`): blackout, then pause, then the starting deadline,
//! then the day's cap, then the draft pick — `priority DESC, ready_at, id`
//! among the drafts ready at the slot's time, or the rotating pick of
//! `store/gate.rs` (`rotating_pick!`) for `rotate_by = "category"` kinds.
//!
//! Slots come from [`day_schedule`], the planner's own calendar code, so
//! there is no second calendar to drift from the first. Slots that already
//! have a gate row count as they were recorded, and a day's cap already
//! spent (`daily_quota`) is spent here too.
//!
//! It is pure: Postgres's clock and every row it needs come in as
//! [`Inputs`] (read by `store::forecast_read`), so the rules are tested
//! without a database and the command only reads. What it cannot know —
//! drafts added later, a CMS mirror's staleness, publishes that will fail —
//! docs/operations.md ("Forecast") lists.

use crate::config::KindConfig;
use crate::outcome::{Reason, SkipReason, SlotState};
use crate::slot::{day_schedule, local_today};
use crate::terminal::printable;
use chrono::{DateTime, NaiveDate, Utc};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;

/// The longest forecast `planner forecast --days` (and the console's
/// `/api/forecast?days=`) accepts: a year, leap day included.
pub const MAX_DAYS: u32 = 366;

/// How far a forecast looks without `--days`: two weeks, also the horizon
/// of `planner run`'s runway gauge.
pub const DEFAULT_DAYS: u32 = 14;

/// A ready draft, as the pick weighs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draft {
    /// Its id, the pick's last tie-breaker.
    pub id: i64,
    /// Higher goes first.
    pub priority: i32,
    /// It may be picked from then on.
    pub ready_at: DateTime<Utc>,
    /// Its section, for a rotating kind.
    pub category: Option<String>,
}

/// A slot with a gate row already: it counts as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gated {
    /// The slot's local day.
    pub day: NaiveDate,
    /// The slot's number.
    pub slot_no: u32,
    /// The gate row's state; `claimed`/`publishing` count as publishing.
    pub state: SlotState,
    /// The recorded reason of a skipped or failed slot.
    pub reason: Option<Reason>,
}

/// What Postgres holds of one kind, read in one snapshot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KindState {
    /// Its ready drafts (any order).
    pub drafts: Vec<Draft>,
    /// Gate rows of the forecast's days (rows of other days are ignored).
    pub gated: Vec<Gated>,
    /// Units of the daily cap already taken, per local day.
    pub used: Vec<(NaiveDate, i64)>,
    /// When each category last published (`None`: drafts without one),
    /// for the rotating pick.
    pub last_out: Vec<(Option<String>, DateTime<Utc>)>,
    /// A pause in force: `Some(None)` until `planner resume`,
    /// `Some(Some(t))` until `t`.
    pub paused: Option<Option<DateTime<Utc>>>,
}

/// One kind to forecast: its config and its rows.
#[derive(Debug, Clone)]
pub struct KindInputs<'a> {
    /// The kind, its slots numbered as the planner numbers them.
    pub config: &'a KindConfig,
    /// Its rows.
    pub state: KindState,
}

/// Everything [`simulate`] needs.
#[derive(Debug, Clone)]
pub struct Inputs<'a> {
    /// Postgres's clock, read once: every time rule two processes agree on
    /// is judged by it.
    pub now: DateTime<Utc>,
    /// Local days per kind, today first.
    pub days: u32,
    /// The config's `jitter_seed`, for the slots' due times.
    pub seed: &'a str,
    /// The kinds, in the order the answer lists them.
    pub kinds: Vec<KindInputs<'a>>,
}

/// `planner forecast --json` (docs/DESIGN.md section 4.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Forecast {
    /// One entry per kind.
    pub kinds: Vec<KindForecast>,
}

/// One kind's runway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KindForecast {
    /// The kind's name.
    pub kind: String,
    /// The first day with a slot that finds no ready draft (predicted, or
    /// recorded today); `None` when the drafts last the whole forecast.
    pub runs_dry_on: Option<NaiveDate>,
    /// Each local day, today first.
    pub days: Vec<DayForecast>,
}

/// One kind's local day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DayForecast {
    /// The local day.
    pub day: NaiveDate,
    /// The slots the calendar gives that day (a blacked-out day's
    /// included: they are planned and recorded `skipped/blackout`).
    pub slots: u32,
    /// Slots that would publish (or did, or are publishing).
    pub publish: u32,
    /// The other slots by reason: predicted ones `blackout`, `paused`,
    /// `missed_deadline`, `quota_full` or `no_ready_draft`; recorded ones
    /// by their recorded reason. Reasons at zero are left out.
    pub skipped: BTreeMap<String, u32>,
}

/// What one slot comes to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    Publish,
    Skip(String),
}

/// The runway of every kind of `inputs`; see the module docs.
pub fn simulate(inputs: &Inputs<'_>) -> Forecast {
    Forecast {
        kinds: inputs
            .kinds
            .iter()
            .map(|k| simulate_kind(inputs, k))
            .collect(),
    }
}

fn simulate_kind(inputs: &Inputs<'_>, k: &KindInputs<'_>) -> KindForecast {
    let cfg = k.config;
    let state = &k.state;
    let now = inputs.now;
    let today = local_today(cfg.timezone, now);
    let gated: HashMap<(NaiveDate, u32), &Gated> = state
        .gated
        .iter()
        .map(|g| ((g.day, g.slot_no), g))
        .collect();
    let mut used: HashMap<NaiveDate, i64> = state.used.iter().copied().collect();
    let mut pick = Pick::new(&state.drafts, cfg.rotate_by_category, &state.last_out);
    let mut days = Vec::with_capacity(inputs.days as usize);
    for day in today.iter_days().take(inputs.days as usize) {
        let cal = cfg.day(day);
        let mut slots = day_schedule(cfg, day, inputs.seed);
        // Deliveries come in the order the slots fall due.
        slots.sort_by_key(|p| (p.due_at, p.key.slot_no));
        let mut out = DayForecast {
            day,
            slots: slots.len() as u32,
            publish: 0,
            skipped: BTreeMap::new(),
        };
        for p in &slots {
            let fate = match gated.get(&(day, p.key.slot_no)) {
                Some(g) => recorded(g),
                None => {
                    // A slot already due but not yet gated runs when a
                    // worker takes it up: now, as far as anyone knows.
                    let at = p.due_at.max(now);
                    let late = now > crate::clock::later(p.due_at, cfg.starting_deadline);
                    let spent = used.entry(day).or_insert(0);
                    if cal.blackout {
                        Fate::Skip(SkipReason::Blackout.as_str().into())
                    } else if state.paused.is_some_and(|u| u.is_none_or(|u| at < u)) {
                        Fate::Skip(SkipReason::Paused.as_str().into())
                    } else if late {
                        Fate::Skip(SkipReason::MissedDeadline.as_str().into())
                    } else if *spent >= i64::from(cal.daily_cap) {
                        // Full whether or not a draft is ready: the gate
                        // picks none then (or gives the pick back).
                        Fate::Skip(SkipReason::QuotaFull.as_str().into())
                    } else if pick.take(at).is_some() {
                        *spent += 1;
                        Fate::Publish
                    } else {
                        Fate::Skip(SkipReason::NoReadyDraft.as_str().into())
                    }
                }
            };
            match fate {
                Fate::Publish => out.publish += 1,
                Fate::Skip(r) => *out.skipped.entry(r).or_insert(0) += 1,
            }
        }
        days.push(out);
    }
    let dry = SkipReason::NoReadyDraft.as_str();
    KindForecast {
        kind: cfg.name.clone(),
        runs_dry_on: days
            .iter()
            .find(|d| d.skipped.contains_key(dry))
            .map(|d| d.day),
        days,
    }
}

/// A gated slot as it was recorded: a live claim is a publish under way.
fn recorded(g: &Gated) -> Fate {
    match g.state {
        SlotState::Published | SlotState::Publishing | SlotState::Claimed => Fate::Publish,
        SlotState::Skipped | SlotState::Failed => Fate::Skip(
            g.reason
                .as_ref()
                .map_or_else(|| g.state.as_str().to_owned(), |r| r.as_str().to_owned()),
        ),
    }
}

/// The pick's order within a kind (plain) or a category (rotating):
/// `priority DESC, ready_at, id`.
type Rank = (Reverse<i32>, DateTime<Utc>, i64);

/// The drafts a simulated gate picks from. Slots are taken in due order,
/// so a draft once ready stays ready: drafts join as their `ready_at`
/// passes and leave when picked.
struct Pick {
    /// Not yet ready at the last slot's time, latest first (popped from
    /// the end).
    waiting: Vec<(DateTime<Utc>, Option<String>, Rank)>,
    /// Ready and unpicked, per category (one set under `None` for a kind
    /// without rotation).
    ready: BTreeMap<Option<String>, BTreeSet<Rank>>,
    /// `rotate_by = "category"`.
    rotate: bool,
    /// When each category last published, simulated publishes included.
    last_out: HashMap<Option<String>, DateTime<Utc>>,
}

impl Pick {
    fn new(drafts: &[Draft], rotate: bool, last_out: &[(Option<String>, DateTime<Utc>)]) -> Pick {
        let mut waiting: Vec<_> = drafts
            .iter()
            .map(|d| {
                let group = if rotate { d.category.clone() } else { None };
                (d.ready_at, group, (Reverse(d.priority), d.ready_at, d.id))
            })
            .collect();
        waiting.sort_by(|a, b| (b.0, &b.2).cmp(&(a.0, &a.2)));
        Pick {
            waiting,
            ready: BTreeMap::new(),
            rotate,
            last_out: last_out.iter().cloned().collect(),
        }
    }

    /// Picks a draft for a slot taken up at `at`, its id; `None` when none
    /// is ready then.
    ///
    /// Rotating: `rotating_pick!` ranks the ready drafts by their turn in
    /// their category, then by when the category last published (never
    /// first), then by the category's name (none first), then priority,
    /// age and id. For one slot the first of that order is always a turn-1
    /// draft, i.e. the best draft of the category that published least
    /// recently; once it publishes, its category is the most recent. A
    /// batch of n slots takes the same drafts as n such picks in a row
    /// (one round through the categories keeps their order). Category
    /// names are compared bytewise here, by the database's collation there.
    fn take(&mut self, at: DateTime<Utc>) -> Option<i64> {
        while self.waiting.last().is_some_and(|w| w.0 <= at) {
            let (_, group, rank) = self.waiting.pop().expect("just seen");
            self.ready.entry(group).or_default().insert(rank);
        }
        let group = if self.rotate {
            let last_out = &self.last_out;
            self.ready
                .iter()
                .filter(|(_, s)| !s.is_empty())
                .map(|(c, _)| c)
                .min_by_key(|c| (last_out.get(*c).copied(), (*c).clone()))
                .cloned()
        } else {
            Some(None)
        };
        let group = group?;
        let (_, _, id) = self.ready.get_mut(&group)?.pop_first()?;
        if self.rotate {
            self.last_out.insert(group, at);
        }
        Some(id)
    }
}

impl Forecast {
    /// A table per kind, for people. Reasons read back from gate rows are
    /// made printable (DESIGN.md section 4.15).
    pub fn render(&self) -> String {
        let mut s = String::new();
        for k in &self.kinds {
            match k.runs_dry_on {
                Some(d) => writeln!(s, "{}: runs dry on {d}", k.kind).ok(),
                None => writeln!(s, "{}: drafts last the whole forecast", k.kind).ok(),
            };
            writeln!(
                s,
                "  {:<10} {:>5} {:>7}  SKIPPED",
                "DAY", "SLOTS", "PUBLISH"
            )
            .ok();
            for d in &k.days {
                let skipped = if d.skipped.is_empty() {
                    "-".to_owned()
                } else {
                    d.skipped
                        .iter()
                        .map(|(r, n)| format!("{}={n}", printable(r)))
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                writeln!(
                    s,
                    "  {:<10} {:>5} {:>7}  {skipped}",
                    d.day.format("%Y-%m-%d"),
                    d.slots,
                    d.publish
                )
                .ok();
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use chrono::{Duration, TimeZone};
    use std::path::Path;

    // 2026-12-07 is a Monday; "now" is 06:00 UTC on it, before any slot.
    fn now() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 7, 6, 0, 0).unwrap()
    }

    fn date(d: &str) -> NaiveDate {
        NaiveDate::parse_from_str(d, "%Y-%m-%d").unwrap()
    }

    /// Kind `k` in UTC, without jitter, with a cap of `cap` a day.
    fn config(cap: u32, body: &str) -> Config {
        let text = format!(
            "[[kinds]]\nname = \"k\"\ntimezone = \"UTC\"\njitter = \"0\"\ndaily_cap = {cap}\nstarting_deadline = \"1h\"\n{body}"
        );
        Config::parse(Path::new("forecast.toml"), &text).unwrap()
    }

    fn draft(id: i64, priority: i32, ready_at: DateTime<Utc>, category: Option<&str>) -> Draft {
        Draft {
            id,
            priority,
            ready_at,
            category: category.map(str::to_owned),
        }
    }

    fn run(cfg: &Config, days: u32, state: KindState) -> KindForecast {
        let inputs = Inputs {
            now: now(),
            days,
            seed: &cfg.jitter_seed,
            kinds: vec![KindInputs {
                config: &cfg.kinds[0],
                state,
            }],
        };
        simulate(&inputs).kinds.remove(0)
    }

    fn skipped(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(r, n)| ((*r).to_owned(), *n)).collect()
    }

    /// The drafts the simulated pick takes for one slot a minute, all of
    /// them ready.
    fn picked(drafts: Vec<Draft>, rotate: bool, last_out: &[(Option<&str>, i64)]) -> Vec<i64> {
        let last_out: Vec<_> = last_out
            .iter()
            .map(|(c, h)| (c.map(str::to_owned), now() - Duration::hours(*h)))
            .collect();
        let mut pick = Pick::new(&drafts, rotate, &last_out);
        (0..drafts.len() as i64 + 1)
            .map_while(|i| pick.take(now() + Duration::minutes(i)))
            .collect()
    }

    #[test]
    fn the_pick_goes_by_priority_then_age_then_id() {
        let t = now() - Duration::hours(5);
        let got = picked(
            vec![
                draft(1, 0, t, None),
                draft(2, 5, t + Duration::minutes(2), None),
                draft(3, 0, t - Duration::minutes(1), None),
                draft(4, 5, t + Duration::minutes(1), None),
                draft(5, 0, t, None),
                draft(6, -1, t - Duration::hours(1), None),
            ],
            false,
            &[],
        );
        assert_eq!(got, [4, 2, 3, 1, 5, 6]);
    }

    #[test]
    fn a_rotating_kind_takes_the_category_published_least_recently_first() {
        let t = now() - Duration::hours(5);
        // sport published an hour ago, arts two hours ago, news never;
        // sport has three drafts, arts two, news one, and one without.
        let got = picked(
            vec![
                draft(1, 0, t, Some("sport")),
                draft(2, 0, t + Duration::seconds(1), Some("sport")),
                draft(3, 9, t + Duration::seconds(2), Some("sport")),
                draft(4, 0, t, Some("arts")),
                draft(5, 0, t + Duration::seconds(1), Some("arts")),
                draft(6, 0, t, Some("news")),
                draft(7, 0, t, None),
            ],
            true,
            &[(Some("sport"), 1), (Some("arts"), 2)],
        );
        // Never published first (none before news: NULLS FIRST), then
        // arts (older), then sport (its priority-9 draft first); then
        // round again in that order.
        assert_eq!(got, [7, 6, 4, 3, 5, 1, 2]);
    }

    #[test]
    fn a_draft_ready_later_fills_only_the_slots_after_its_ready_at() {
        let cfg = config(5, "slots = [\"09:00\", \"15:00\"]");
        let at = |h| Utc.with_ymd_and_hms(2026, 12, 7, h, 0, 0).unwrap();
        // One draft ready now, a higher-priority one ready at noon, one
        // ready the day after tomorrow.
        let f = run(
            &cfg,
            4,
            KindState {
                drafts: vec![
                    draft(1, 0, at(5), None),
                    draft(2, 9, at(12), None),
                    draft(3, 0, at(12) + Duration::days(2), None),
                ],
                ..KindState::default()
            },
        );
        let per_day: Vec<(u32, BTreeMap<String, u32>)> = f
            .days
            .iter()
            .map(|d| (d.publish, d.skipped.clone()))
            .collect();
        assert_eq!(
            per_day,
            [
                (2, skipped(&[])),
                (0, skipped(&[("no_ready_draft", 2)])),
                (1, skipped(&[("no_ready_draft", 1)])),
                (0, skipped(&[("no_ready_draft", 2)])),
            ]
        );
        assert_eq!(f.runs_dry_on, Some(date("2026-12-08")));
    }

    const CALENDAR: &str = r#"slots = ["09:00", "15:00"]
weekdays = ["mon", "tue", "wed", "thu", "fri"]
blackout = ["2026-12-09"]
[[kinds.on]]
days = ["sat"]
slots = ["10:00", "11:00", "12:00"]
daily_cap = 1
"#;

    fn drafts(n: i64) -> Vec<Draft> {
        (1..=n)
            .map(|i| draft(i, 0, now() - Duration::hours(1), None))
            .collect()
    }

    #[test]
    fn the_calendar_gives_the_slots_blackout_and_caps() {
        let cfg = config(5, CALENDAR);
        let f = run(
            &cfg,
            7,
            KindState {
                drafts: drafts(100),
                ..KindState::default()
            },
        );
        let got: Vec<(String, u32, u32, BTreeMap<String, u32>)> = f
            .days
            .iter()
            .map(|d| (d.day.to_string(), d.slots, d.publish, d.skipped.clone()))
            .collect();
        let day = |d: &str, slots, publish, sk: &[(&str, u32)]| {
            (d.to_owned(), slots, publish, skipped(sk))
        };
        assert_eq!(
            got,
            [
                day("2026-12-07", 2, 2, &[]),
                day("2026-12-08", 2, 2, &[]),
                // Blacked out: planned, recorded skipped, no draft spent.
                day("2026-12-09", 2, 0, &[("blackout", 2)]),
                day("2026-12-10", 2, 2, &[]),
                day("2026-12-11", 2, 2, &[]),
                // Saturday's own list and cap of one.
                day("2026-12-12", 3, 1, &[("quota_full", 2)]),
                // No Sunday slots.
                day("2026-12-13", 0, 0, &[]),
            ]
        );
        assert_eq!(f.runs_dry_on, None);
    }

    #[test]
    fn the_day_runs_dry_and_the_cap_comes_before_the_draft() {
        let cfg = config(3, "slots = [\"09:00\", \"10:00\", \"11:00\", \"12:00\"]");
        // Three drafts: today's cap of 3 takes them, the fourth slot is
        // quota_full (not no_ready_draft); tomorrow has none.
        let f = run(
            &cfg,
            2,
            KindState {
                drafts: drafts(3),
                ..KindState::default()
            },
        );
        assert_eq!(f.days[0].publish, 3);
        assert_eq!(f.days[0].skipped, skipped(&[("quota_full", 1)]));
        assert_eq!(f.days[1].skipped, skipped(&[("no_ready_draft", 4)]));
        assert_eq!(f.runs_dry_on, Some(date("2026-12-08")));
    }

    #[test]
    fn todays_gate_rows_count_as_recorded_and_their_cap_is_spent() {
        let cfg = config(2, "slots = [\"05:00\", \"05:30\", \"09:00\", \"10:00\"]");
        let today = date("2026-12-07");
        let gated = |slot_no, state, reason: Option<&str>| Gated {
            day: today,
            slot_no,
            state,
            reason: reason.map(|r| Reason::from(r.to_owned())),
        };
        let f = run(
            &cfg,
            1,
            KindState {
                drafts: drafts(5),
                gated: vec![
                    gated(1, SlotState::Published, None),
                    gated(2, SlotState::Skipped, Some("operator")),
                ],
                used: vec![(today, 1)],
                ..KindState::default()
            },
        );
        // 09:00 takes the cap's second unit; 10:00 finds it full.
        assert_eq!(f.days[0].publish, 2);
        assert_eq!(
            f.days[0].skipped,
            skipped(&[("operator", 1), ("quota_full", 1)])
        );
    }

    #[test]
    fn a_pause_covers_the_slots_until_it_ends() {
        let cfg = config(5, "slots = [\"09:00\", \"15:00\"]");
        let until = Utc.with_ymd_and_hms(2026, 12, 8, 12, 0, 0).unwrap();
        let f = run(
            &cfg,
            3,
            KindState {
                drafts: drafts(10),
                paused: Some(Some(until)),
                ..KindState::default()
            },
        );
        let paused: Vec<(u32, Option<u32>)> = f
            .days
            .iter()
            .map(|d| (d.publish, d.skipped.get("paused").copied()))
            .collect();
        assert_eq!(paused, [(0, Some(2)), (1, Some(1)), (2, None)]);
        let f = run(
            &cfg,
            2,
            KindState {
                drafts: drafts(10),
                paused: Some(None),
                ..KindState::default()
            },
        );
        assert!(f.days.iter().all(|d| d.publish == 0));
        assert_eq!(f.runs_dry_on, None, "a paused kind spends no draft");
    }

    #[test]
    fn a_slot_past_its_starting_deadline_without_a_gate_row_is_missed() {
        // 04:00 is two hours before "now", past its 1 h deadline.
        let cfg = config(5, "slots = [\"04:00\", \"09:00\"]");
        let f = run(
            &cfg,
            1,
            KindState {
                drafts: drafts(5),
                ..KindState::default()
            },
        );
        assert_eq!(f.days[0].publish, 1);
        assert_eq!(f.days[0].skipped, skipped(&[("missed_deadline", 1)]));
    }

    #[test]
    fn the_json_has_the_contracts_shape() {
        let cfg = config(5, "slots = [\"09:00\"]");
        let f = simulate(&Inputs {
            now: now(),
            days: 2,
            seed: &cfg.jitter_seed,
            kinds: vec![KindInputs {
                config: &cfg.kinds[0],
                state: KindState {
                    drafts: drafts(1),
                    ..KindState::default()
                },
            }],
        });
        assert_eq!(
            serde_json::to_value(&f).unwrap(),
            serde_json::json!({"kinds": [{"kind": "k", "runs_dry_on": "2026-12-08", "days": [
                {"day": "2026-12-07", "slots": 1, "publish": 1, "skipped": {}},
                {"day": "2026-12-08", "slots": 1, "publish": 0, "skipped": {"no_ready_draft": 1}},
            ]}]})
        );
        assert!(f.render().contains("k: runs dry on 2026-12-08"));
    }
}

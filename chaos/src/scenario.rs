//! The seeded scenario: kinds, slots, caps, drafts and the fault schedule.
//! Everything here is a pure function of the seed and the command line, so
//! the same seed replays the same schedule (wall-clock timing still varies).

use crate::model::Fault;
use crate::topology::{Stores, CLUSTER_PARTITIONS};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::time::Duration;

/// The fault kinds a run injects (`--faults`): `default`, `all`, `none`, or
/// comma-separated names, which may be combined (`default,poison-entry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultSet(pub BTreeSet<Fault>);

impl FaultSet {
    /// Every fault kind a standalone Redis and a single Postgres can
    /// take: hostile input and stuck infrastructure included (`default`).
    #[cfg(test)]
    pub fn default_set() -> FaultSet {
        Self::default_for(Stores::default())
    }
    /// Every fault kind that applies to `stores` (each failover needs the
    /// topology it fails over in): the default of `--redis`/`--postgres`.
    /// A fault only a `probe_url` CMS can take is added by `--cms probe`;
    /// the WordPress scenario's are its own.
    pub fn default_for(stores: Stores) -> FaultSet {
        FaultSet(
            Fault::ALL
                .into_iter()
                .filter(|f| stores.applies(*f) && !f.needs_probe_cms() && !f.needs_wordpress())
                .collect(),
        )
    }
    pub fn has(&self, f: Fault) -> bool {
        self.0.contains(&f)
    }
    pub fn names(&self) -> String {
        let v: Vec<&str> = self.0.iter().map(|f| f.name()).collect();
        if v.is_empty() {
            "none".into()
        } else {
            v.join(",")
        }
    }
}

impl std::str::FromStr for FaultSet {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let mut set = BTreeSet::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "none" => {}
                // Every kind: the run keeps those its `--redis` and
                // `--postgres` can take (`Stores::applies`), so `default`
                // means the same as no `--faults` on every topology.
                "default" => set.extend(Fault::ALL),
                "all" => set.extend(Fault::ALL),
                name => match Fault::ALL.into_iter().find(|f| f.name() == name) {
                    Some(f) => {
                        set.insert(f);
                    }
                    None => {
                        let names: Vec<&str> = Fault::ALL.iter().map(|f| f.name()).collect();
                        return Err(format!(
                            "unknown fault {name:?} (expected default, all, none or some of {})",
                            names.join(", ")
                        ));
                    }
                },
            }
        }
        Ok(FaultSet(set))
    }
}

/// A planned slot, by kind index and slot number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Target {
    pub kind: usize,
    pub slot_no: u32,
}

/// The malformed deliveries, with the reason the worker must dead-letter them with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    MissingSlot,
    BadKey,
    UnknownKind,
    SlotOutOfRange,
}

impl Malformed {
    pub const ALL: [Malformed; 4] = [
        Malformed::MissingSlot,
        Malformed::BadKey,
        Malformed::UnknownKind,
        Malformed::SlotOutOfRange,
    ];
    pub fn reason(self) -> &'static str {
        match self {
            Malformed::MissingSlot | Malformed::BadKey => "bad_message",
            Malformed::UnknownKind => "unknown_kind",
            Malformed::SlotOutOfRange => "unknown_slot",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Malformed::MissingSlot => "missing slot field",
            Malformed::BadKey => "unparsable slot key",
            Malformed::UnknownKind => "unknown kind",
            Malformed::SlotOutOfRange => "slot_no out of range",
        }
    }
}

/// Stream entries nothing well-formed looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poison {
    /// A `slot` field that is not UTF-8.
    NonUtf8,
    /// A 512 KiB `slot` field.
    Oversized,
    /// An entry with the explicit ID at the top of the ID space: every
    /// later `XADD *` fails until the stream is repaired.
    TopId,
}

impl Poison {
    pub const ALL: [Poison; 3] = [Poison::NonUtf8, Poison::Oversized, Poison::TopId];
    pub fn name(self) -> &'static str {
        match self {
            Poison::NonUtf8 => "non-UTF-8 slot field",
            Poison::Oversized => "512 KiB slot field",
            Poison::TopId => "explicit top-of-space stream ID",
        }
    }
}

/// One scheduled fault.
#[derive(Debug, Clone)]
pub enum Ev {
    /// `copies` identical deliveries of a slot added at once (one pipeline),
    /// at the slot's due time + `offset_ms`.
    ConcurrentDup {
        target: Target,
        copies: u32,
        offset_ms: i64,
    },
    /// `copies` deliveries, one after another, `delay_ms` after the slot finished.
    SerialDup {
        target: Target,
        delay_ms: u64,
        copies: u32,
    },
    /// `planner trigger` of a finished slot, `delay_ms` after it finished.
    Trigger { target: Target, delay_ms: u64 },
    /// `redis-cli XADD` of a finished slot, `delay_ms` after it finished.
    Xadd { target: Target, delay_ms: u64 },
    /// `planner backfill` of a kind's day.
    Backfill { at_ms: u64, kind: usize },
    /// `kill -9` of a worker; restarted after `restart_ms`, with its old id
    /// (a StatefulSet pod) or a new one.
    Kill {
        at_ms: u64,
        victim: usize,
        restart_ms: u64,
        reuse_id: bool,
    },
    /// `kill -9` of the worker whose publish call the CMS is holding open.
    KillMidWebhook {
        at_ms: u64,
        hold_ms: u64,
        restart_ms: u64,
        reuse_id: bool,
    },
    /// `SIGSTOP` of the leader for `pause_ms` (past its lease TTL), then `SIGCONT`.
    LeaderStop { at_ms: u64, pause_ms: u64 },
    /// Every key of the Redis prefix deleted.
    RedisWipe { at_ms: u64 },
    /// `pg_terminate_backend` of every slotgate connection to the database.
    PgTerminate { at_ms: u64 },
    /// One malformed delivery.
    Malformed { at_ms: u64, what: Malformed },
    /// One poison stream entry.
    Poison { at_ms: u64, what: Poison },
    /// Another session holds `kind`'s quota row locked for `hold_ms`.
    QuotaHeld {
        at_ms: u64,
        kind: usize,
        hold_ms: u64,
    },
    /// The next `calls` publish calls are answered 301 to another path.
    Redirect { at_ms: u64, calls: u32 },
    /// A delivery of `kind`'s first slot of tomorrow (a day that has not come).
    FutureDelivery { at_ms: u64, kind: usize },
    /// The first worker runs with its clock 40 s ahead (libfaketime) from
    /// the start; checked at `at_ms`.
    ClockAhead { at_ms: u64 },
    /// The next `calls` publish calls are answered just past the HTTP timeout.
    CmsLate { at_ms: u64, calls: u32 },
    /// One stream entry with a 64 MiB `slot` field: dead-lettered, and no
    /// worker's memory grows by it.
    Oversize { at_ms: u64 },
    /// Another session holds `kind`'s quota row while `copies` deliveries
    /// of its slots are added: more than a worker may hold back.
    StallBurst {
        at_ms: u64,
        kind: usize,
        hold_ms: u64,
        copies: u32,
    },
    /// The operator edits `kind`'s schedule mid-run: a new time
    /// `added_s` is inserted at the front of its `slots` and slot
    /// `removed` (not yet due, no other fault's target) is taken out; the
    /// harness runs `planner plan` and restarts the workers with the new
    /// config, one by one. Every other slot keeps its key, the removed one
    /// is cancelled, the new one runs once.
    ScheduleEdit {
        at_ms: u64,
        kind: usize,
        removed: u32,
        added_s: u64,
    },
    /// `kill -9` of the Cluster master serving `partition`'s keys;
    /// verified when a replica took over, then started again on its port
    /// (it rejoins as a replica).
    RedisMasterFailover { at_ms: u64, partition: u16 },
    /// `kill -9` of the primary the Sentinels name; verified when they
    /// elected the replica, it answers `ROLE` master and the workers wrote
    /// to it; then the killed node is started again on its port (the
    /// Sentinels make it a replica), so the fault can recur.
    SentinelFailover { at_ms: u64 },
    /// `kill -9` of the Postgres primary, the synchronous standby promoted
    /// and the proxy address moved to it; verified when it left recovery
    /// and a worker committed an execution on it. Once a run: the old
    /// primary is not rebuilt.
    PgFailover { at_ms: u64 },
    /// `--cms probe`: the next publish call is recorded on receipt and
    /// applied only `hold_ms` later (past the HTTP timeout): its worker's
    /// try times out and its probes are answered `409` until then. With
    /// `takeover`, that worker is killed while the call is held
    /// (restarted after `restart_ms`, with its old id or a new one), so
    /// another claim's probes meet the write still being applied.
    /// Verified by the CMS's record: the call received, applied later
    /// than the timeout, a probe of its key answered `409` while it was
    /// held (after the kill, with `takeover`).
    HeldBeforeApply {
        at_ms: u64,
        hold_ms: u64,
        takeover: bool,
        restart_ms: u64,
        reuse_id: bool,
    },
    /// `--cms wordpress`: one of its faults ([`wordpress::SCHEDULE`]),
    /// injected by `run/wordpress.rs`.
    WordPress { at_ms: u64, fault: Fault },
}

impl Ev {
    /// When the event is due, in ms after the start of the window; `None`
    /// for the duplicates, which are due relative to their slot.
    pub fn at_ms(&self) -> Option<u64> {
        match self {
            Ev::ConcurrentDup { .. }
            | Ev::SerialDup { .. }
            | Ev::Trigger { .. }
            | Ev::Xadd { .. } => None,
            Ev::Backfill { at_ms, .. }
            | Ev::Kill { at_ms, .. }
            | Ev::KillMidWebhook { at_ms, .. }
            | Ev::LeaderStop { at_ms, .. }
            | Ev::RedisWipe { at_ms }
            | Ev::PgTerminate { at_ms }
            | Ev::Malformed { at_ms, .. }
            | Ev::Poison { at_ms, .. }
            | Ev::QuotaHeld { at_ms, .. }
            | Ev::Redirect { at_ms, .. }
            | Ev::FutureDelivery { at_ms, .. }
            | Ev::ClockAhead { at_ms }
            | Ev::CmsLate { at_ms, .. }
            | Ev::Oversize { at_ms }
            | Ev::StallBurst { at_ms, .. }
            | Ev::ScheduleEdit { at_ms, .. }
            | Ev::RedisMasterFailover { at_ms, .. }
            | Ev::SentinelFailover { at_ms }
            | Ev::PgFailover { at_ms }
            | Ev::HeldBeforeApply { at_ms, .. }
            | Ev::WordPress { at_ms, .. } => Some(*at_ms),
        }
    }

    pub fn fault(&self) -> Fault {
        match self {
            Ev::ConcurrentDup { .. } => Fault::ConcurrentDup,
            Ev::SerialDup { .. } => Fault::SerialDup,
            Ev::Trigger { .. } => Fault::TriggerDup,
            Ev::Xadd { .. } => Fault::XaddDup,
            Ev::Backfill { .. } => Fault::BackfillDup,
            Ev::Kill { .. } => Fault::Kill9,
            Ev::KillMidWebhook { .. } => Fault::Kill9MidWebhook,
            Ev::LeaderStop { .. } => Fault::LeaderStop,
            Ev::RedisWipe { .. } => Fault::RedisWipe,
            Ev::PgTerminate { .. } => Fault::PgTerminate,
            Ev::Malformed { .. } => Fault::Malformed,
            Ev::Poison { .. } => Fault::PoisonEntry,
            Ev::QuotaHeld { .. } => Fault::QuotaHeld,
            Ev::Redirect { .. } => Fault::Redirect,
            Ev::FutureDelivery { .. } => Fault::FutureDelivery,
            Ev::ClockAhead { .. } => Fault::ClockAhead,
            Ev::CmsLate { .. } => Fault::CmsLate,
            Ev::Oversize { .. } => Fault::OversizeEntry,
            Ev::StallBurst { .. } => Fault::StallBurst,
            Ev::ScheduleEdit { .. } => Fault::ScheduleEdit,
            Ev::RedisMasterFailover { .. } => Fault::RedisMasterFailover,
            Ev::SentinelFailover { .. } => Fault::SentinelFailover,
            Ev::PgFailover { .. } => Fault::PgFailover,
            Ev::HeldBeforeApply { .. } => Fault::WebhookHeldBeforeApply,
            Ev::WordPress { fault, .. } => *fault,
        }
    }
}

/// One kind of the compressed day.
#[derive(Debug, Clone)]
pub struct KindSpec {
    pub name: String,
    /// Seconds after the start of the day's window, one per slot, ascending
    /// (`slot_no` = position + 1; seconds may repeat).
    pub offsets: Vec<u64>,
    pub daily_cap: u32,
    pub drafts: u32,
    /// Whether the kind pushes to the index endpoint too.
    pub index: bool,
    /// No webhook: the slot is settled inside Postgres (judged from the
    /// harness's ledger, not the CMS).
    pub record_only: bool,
    /// The second at which a quarter of its slots fall due at once (a
    /// backlog the workers take in batches).
    pub burst_at: u64,
    /// Why it is shaped like this (for the printout).
    pub profile: &'static str,
    /// A kind of the WordPress scenario: published to a real WordPress and
    /// judged by WordPress's own records ([`crate::judge`]'s `wordpress`
    /// witness), not by the CMS log or the kind checks.
    pub wordpress: Option<WpDrafts>,
}

/// Where a WordPress kind's drafts live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WpDrafts {
    /// Posts in WordPress (`pending`), published in place by a status change.
    InWordPress,
    /// slotgate's own: each try stages the slot's post, then publishes it.
    InSlotgate,
}

impl KindSpec {
    /// Effects a correct system produces: every draft is ready from the
    /// start, so exactly min(slots, cap, drafts) slots publish.
    pub fn expected_effects(&self) -> u32 {
        (self.offsets.len() as u32)
            .min(self.daily_cap)
            .min(self.drafts)
    }
}

/// Random webhook faults: per-call probabilities, and at most
/// `max_failures_per_key` failing answers (503, timeout, reset) per
/// idempotency key, fewer than `http_attempts`, so every call can succeed.
#[derive(Debug, Clone, Copy, Default)]
pub struct WebhookRates {
    pub p503: f64,
    pub timeout: f64,
    pub slow: f64,
    pub reset: f64,
    pub max_failures_per_key: u32,
}

/// The worker and webhook settings every run uses.
pub const LEASE_TTL: &str = "3s";
pub const VISIBILITY: &str = "3s";
pub const RECONCILE_EVERY: &str = "1s";
pub const HTTP_TIMEOUT_MS: u64 = 1000;
pub const HTTP_ATTEMPTS: u32 = 6;
pub const LEASE_TTL_MS: u64 = 3000;
/// `cms-late` answers this long past the client's HTTP timeout.
pub const CMS_LATE_BY_MS: u64 = 150;
/// `--cms probe`: how long the CMS takes to apply any publish it received
/// (a probe meanwhile answers `409`).
pub const PROBE_APPLY_AFTER_MS: u64 = 20;
/// `--cms probe`: the webhook kinds' `http_attempts`. Every probe counts as
/// an attempt (docs/receivers.md: give a CMS that can be slow enough of
/// them to outlast its slowest write): with `retry_cap` 1 s, a probe
/// answered `409` waits at least 0.5 s before the next, so 20 wait at least
/// 10 s, longer than the longest `webhook-held-before-apply` hold (9 s from
/// receipt, and a takeover probes first no sooner than `VISIBILITY` after
/// the kill).
pub const PROBE_HTTP_ATTEMPTS: u32 = 20;
/// `webhook-held-before-apply` with a takeover: how long the held publish
/// waits before it is applied, longer than a killed worker's claim takes
/// to be taken over (its claim and stream entry expire after `VISIBILITY`).
pub const HELD_TAKEOVER_MS: u64 = 9_000;

#[derive(Debug, Clone)]
pub struct Scenario {
    pub seed: u64,
    pub duration: Duration,
    pub kinds: Vec<KindSpec>,
    /// Sorted by the time they happen (approximately, for the after-done ones).
    pub events: Vec<Ev>,
    pub webhook: WebhookRates,
    /// `--cms probe`: the webhook kinds have a `probe_url`, and the CMS
    /// follows the probe contract and does not dedupe publishes.
    pub probe: bool,
    /// `--cms-breaks-probe-contract` (with `probe`): the CMS answers a
    /// probe `404` while the key's publish is still being applied (the
    /// judge's self-test: the run must fail with `applied_twice`).
    pub probe_contract_broken: bool,
    /// The events run one after another, each finished before the next
    /// (the WordPress scenario's: a hold is one WordPress-wide switch, and
    /// the backfill restarts the workers the kill before it stopped);
    /// otherwise each runs at its own time, concurrently.
    pub in_order: bool,
}

const PROFILES: [&str; 4] = [
    "cap binds",
    "drafts run out",
    "cap binds early",
    "nothing binds",
];
const DEFAULT_NAMES: [&str; 8] = [
    "article", "news", "promo", "digest", "video", "podcast", "recap", "alert",
];

/// Which kinds: a number (default names) or explicit names.
#[derive(Debug, Clone)]
pub enum Kinds {
    Count(usize),
    Names(Vec<String>),
}

impl std::str::FromStr for Kinds {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Ok(n) = s.parse::<usize>() {
            if n == 0 || n > 32 {
                return Err("between 1 and 32 kinds".into());
            }
            return Ok(Kinds::Count(n));
        }
        let names: Vec<String> = s.split(',').map(|n| n.trim().to_owned()).collect();
        for n in &names {
            let ok = !n.is_empty()
                && n.len() <= 40
                && n.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                });
            if !ok {
                return Err(format!("bad kind name {n:?} (expected [a-z0-9_-]{{1,40}})"));
            }
        }
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        if sorted.len() != names.len() {
            return Err("duplicate kind name".into());
        }
        Ok(Kinds::Names(names))
    }
}

/// The kinds of a run: names, slot offsets (a quarter of each kind's
/// slots in one burst), cap, drafts and profile, by weight of
/// `total_slots`.
fn kind_specs(
    rng: &mut StdRng,
    kinds: &Kinds,
    duration: Duration,
    total_slots: u32,
) -> Vec<KindSpec> {
    let names: Vec<String> = match kinds {
        Kinds::Count(n) => (0..*n)
            .map(|i| match DEFAULT_NAMES.get(i) {
                Some(n) => (*n).to_owned(),
                None => format!("kind{i}"),
            })
            .collect(),
        Kinds::Names(v) => v.clone(),
    };
    let secs = duration.as_secs().max(1);
    let weights: Vec<f64> = names.iter().map(|_| rng.gen_range(0.7..1.3)).collect();
    let wsum: f64 = weights.iter().sum();
    let mut specs = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let n = ((total_slots as f64) * weights[i] / wsum).round().max(4.0) as u32;
        let burst_at = rng.gen_range(secs * 3 / 10..=secs * 6 / 10);
        let mut offsets: Vec<u64> = (0..n)
            .map(|j| {
                if j < n / 4 {
                    burst_at
                } else {
                    rng.gen_range(0..secs)
                }
            })
            .collect();
        offsets.sort_unstable();
        let nf = n as f64;
        let profile = i % PROFILES.len();
        let (cap, drafts) = match profile {
            0 => (
                (nf * rng.gen_range(0.5..0.7)).round() as u32,
                (nf * rng.gen_range(0.75..0.9)).round() as u32,
            ),
            1 => (
                (nf * rng.gen_range(0.6..0.8)).round() as u32,
                (nf * rng.gen_range(0.3..0.5)).round() as u32,
            ),
            2 => ((nf * rng.gen_range(0.2..0.35)).round() as u32, n + 3),
            _ => (n, n + 2),
        };
        specs.push(KindSpec {
            name: name.clone(),
            offsets,
            daily_cap: cap.max(1),
            drafts: drafts.max(1),
            // Webhook kinds: one whose cap binds halfway and one that
            // publishes all day (so webhook faults find calls until the
            // end); record-only: the other two.
            index: profile == 0,
            record_only: profile == 1 || profile == 2,
            burst_at,
            profile: PROFILES[profile],
            wordpress: None,
        });
    }
    specs
}

/// The `i`th event of a rung of the [`LADDER`], drawn from the seed's RNG;
/// `None` when the scenario leaves no room for it (a schedule edit with no
/// slot to remove).
type Generator = fn(&mut Draw, u32) -> Option<Ev>;

/// One of each variant: [`Malformed::ALL`], [`Poison::ALL`].
const MALFORMED: u32 = Malformed::ALL.len() as u32;
const POISON: u32 = Poison::ALL.len() as u32;

/// The fault ladder: each kind the scenario schedules, how many a minute
/// (scaled to the window), at least how many (with none a minute: exactly
/// that many, whatever the window), and its generator, in draw order. The
/// order is the seed's replay (every rung draws from one RNG), so a new
/// kind goes at the bottom; the failovers and the probe-only kind are last
/// so that a seed's other faults are the same on every topology and with
/// any CMS. The random webhook faults are per-call rates, not events (see
/// [`Scenario::generate`]).
const LADDER: [(Fault, f64, u32, Generator); 24] = [
    // Second deliveries of a slot: concurrent copies, later copies, a
    // `planner trigger`, a raw XADD, a backfill.
    (Fault::ConcurrentDup, 6.0, 2, concurrent_dup),
    (Fault::SerialDup, 10.0, 3, serial_dup),
    (Fault::TriggerDup, 4.0, 1, trigger),
    (Fault::XaddDup, 4.0, 1, xadd),
    (Fault::BackfillDup, 2.0, 1, backfill),
    // Processes and stores going away: `kill -9` (also in the middle of a
    // webhook call), a stopped leader, a wiped Redis, terminated Postgres
    // sessions.
    (Fault::Kill9, 4.0, 2, kill),
    (Fault::Kill9MidWebhook, 3.0, 1, kill_mid_webhook),
    (Fault::LeaderStop, 2.0, 1, leader_stop),
    (Fault::RedisWipe, 1.5, 1, redis_wipe),
    (Fault::PgTerminate, 4.0, 2, pg_terminate),
    // Entries a stranger writes: malformed, poison, oversize.
    (Fault::Malformed, 0.0, MALFORMED, malformed),
    (Fault::PoisonEntry, 0.0, POISON, poison),
    (Fault::OversizeEntry, 0.0, 1, oversize),
    // Rows held at a kind's burst, so its slots are open while they wait:
    // a stall with a thousand copies held back, a held quota row.
    (Fault::StallBurst, 0.0, 1, stall_burst),
    (Fault::QuotaHeld, 0.0, 1, quota_held),
    // The CMS and the clocks: redirects, a delivery for the future, a
    // worker's clock ahead, a CMS that answers late.
    (Fault::Redirect, 0.0, 1, redirect),
    (Fault::FutureDelivery, 0.0, 1, future_delivery),
    (Fault::ClockAhead, 0.0, 1, clock_ahead),
    (Fault::CmsLate, 0.0, 1, cms_late),
    // After the families above, so the other faults of a seed stay as
    // they were.
    (Fault::ScheduleEdit, 0.0, 1, schedule_edit),
    // The store topologies' failovers: after every other draw, so a seed's
    // other faults are the same on any topology. About one Cluster
    // master's failover every 40 s of the window, each taking a few
    // seconds (the node timeout is 1 s); a Sentinel failover as often (each
    // holds the next until the killed node is back as a replica, a few
    // seconds more); a Postgres failover once (the pair has one standby,
    // and the killed primary is not rebuilt as the new one's).
    (Fault::RedisMasterFailover, 1.5, 1, redis_master_failover),
    (Fault::SentinelFailover, 1.5, 1, sentinel_failover),
    (Fault::PgFailover, 0.0, 1, pg_failover),
    // `--cms probe` only: after every other draw, so a seed's other faults
    // are the same with or without it.
    (Fault::WebhookHeldBeforeApply, 3.0, 2, held_before_apply),
];

/// The fault schedule being drawn: the seed's RNG, the window, the kinds,
/// every slot a duplicate may target, and the events so far.
struct Draw<'a> {
    rng: &'a mut StdRng,
    /// The window, in ms.
    d_ms: u64,
    /// The window in minutes: counts scale with it.
    per_min: f64,
    specs: &'a [KindSpec],
    targets: Vec<Target>,
    events: Vec<Ev>,
}

impl<'a> Draw<'a> {
    fn new(rng: &'a mut StdRng, duration: Duration, specs: &'a [KindSpec]) -> Draw<'a> {
        let targets: Vec<Target> = specs
            .iter()
            .enumerate()
            .flat_map(|(k, s)| {
                (1..=s.offsets.len() as u32).map(move |slot_no| Target { kind: k, slot_no })
            })
            .collect();
        Draw {
            rng,
            d_ms: duration.as_millis() as u64,
            per_min: duration.as_secs().max(1) as f64 / 60.0,
            specs,
            targets,
            events: Vec::new(),
        }
    }

    /// Every rung of the [`LADDER`] whose fault is in `faults`, in order.
    fn ladder(&mut self, faults: &FaultSet) {
        for (fault, per_minute, min, generator) in LADDER {
            if !faults.has(fault) {
                continue;
            }
            let n = scaled(per_minute * self.per_min, min);
            for i in 0..n {
                if let Some(e) = generator(self, i) {
                    self.events.push(e);
                }
            }
        }
    }

    /// A slot of any kind.
    fn pick(&mut self) -> Target {
        self.targets[self.rng.gen_range(0..self.targets.len())]
    }

    /// A kind.
    fn kind(&mut self) -> usize {
        self.rng.gen_range(0..self.specs.len())
    }

    /// A time between the fractions `from` and `to` of the window, in ms.
    fn at(&mut self, from: f64, to: f64) -> u64 {
        self.rng
            .gen_range((self.d_ms as f64 * from) as u64..=(self.d_ms as f64 * to) as u64)
    }

    /// Just before `kind`'s burst, in ms.
    fn before_burst(&self, kind: usize) -> u64 {
        (self.specs[kind].burst_at * 1000).saturating_sub(300)
    }
}

fn concurrent_dup(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::ConcurrentDup {
        target: d.pick(),
        copies: d.rng.gen_range(2..=5),
        offset_ms: d.rng.gen_range(-300..=300),
    })
}

fn serial_dup(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::SerialDup {
        target: d.pick(),
        delay_ms: d.rng.gen_range(100..=6000),
        copies: d.rng.gen_range(1..=2),
    })
}

fn trigger(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::Trigger {
        target: d.pick(),
        delay_ms: d.rng.gen_range(0..=4000),
    })
}

fn xadd(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::Xadd {
        target: d.pick(),
        delay_ms: d.rng.gen_range(0..=4000),
    })
}

/// While slots still come due: a backfill finding nothing due and open
/// would inject nothing.
fn backfill(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::Backfill {
        at_ms: d.at(0.2, 0.7),
        kind: d.kind(),
    })
}

fn kill(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::Kill {
        at_ms: d.at(0.05, 0.95),
        victim: d.rng.gen_range(0..64),
        restart_ms: d.rng.gen_range(300..=3000),
        reuse_id: d.rng.gen_bool(0.5),
    })
}

fn kill_mid_webhook(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::KillMidWebhook {
        at_ms: d.at(0.05, 0.75),
        hold_ms: 900,
        restart_ms: d.rng.gen_range(300..=3000),
        reuse_id: d.rng.gen_bool(0.5),
    })
}

fn leader_stop(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::LeaderStop {
        at_ms: d.at(0.1, 0.8),
        pause_ms: LEASE_TTL_MS + d.rng.gen_range(500..=2500),
    })
}

fn redis_wipe(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::RedisWipe {
        at_ms: d.at(0.2, 0.8),
    })
}

fn pg_terminate(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::PgTerminate {
        at_ms: d.at(0.05, 0.95),
    })
}

/// One of each [`Malformed`].
fn malformed(d: &mut Draw, i: u32) -> Option<Ev> {
    Some(Ev::Malformed {
        at_ms: d.at(0.1, 0.9),
        what: Malformed::ALL[i as usize],
    })
}

/// One of each [`Poison`].
fn poison(d: &mut Draw, i: u32) -> Option<Ev> {
    Some(Ev::Poison {
        at_ms: d.at(0.1, 0.8),
        what: Poison::ALL[i as usize],
    })
}

fn oversize(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::Oversize {
        at_ms: d.at(0.1, 0.8),
    })
}

/// A thousand copies are held back across the workers; a worker's own
/// bound (2,000) is reached in its own test (worker/tests/postgres.rs,
/// 20,001 deliveries).
fn stall_burst(d: &mut Draw, _: u32) -> Option<Ev> {
    let kind = d.kind();
    Some(Ev::StallBurst {
        at_ms: d.before_burst(kind),
        kind,
        hold_ms: 3_000,
        copies: 1_000,
    })
}

fn quota_held(d: &mut Draw, _: u32) -> Option<Ev> {
    let kind = d.kind();
    Some(Ev::QuotaHeld {
        at_ms: d.before_burst(kind),
        kind,
        hold_ms: 4000,
    })
}

fn redirect(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::Redirect {
        at_ms: d.at(0.1, 0.6),
        calls: 2,
    })
}

fn future_delivery(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::FutureDelivery {
        at_ms: d.at(0.1, 0.8),
        kind: d.kind(),
    })
}

fn clock_ahead(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::ClockAhead {
        at_ms: d.at(0.0, 0.2),
    })
}

fn cms_late(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::CmsLate {
        at_ms: d.at(0.1, 0.6),
        calls: 2,
    })
}

/// A schedule edit: one slot time of one kind removed, one added. The
/// kind: none a quota or stall fault holds. The removed slot: due at least
/// 8 s after the edit and no other event's target (a copy delivered after
/// its cancellation would be failed/unknown_slot, by design, and muddle the
/// judge). The new time: at least 15 s after the edit, so every worker runs
/// the new config before it is due.
fn schedule_edit(d: &mut Draw, _: u32) -> Option<Ev> {
    let held: Vec<usize> = d
        .events
        .iter()
        .filter_map(|e| match e {
            Ev::QuotaHeld { kind, .. } | Ev::StallBurst { kind, .. } => Some(*kind),
            _ => None,
        })
        .collect();
    let targeted: Vec<Target> = d
        .events
        .iter()
        .filter_map(|e| match e {
            Ev::ConcurrentDup { target, .. }
            | Ev::SerialDup { target, .. }
            | Ev::Trigger { target, .. }
            | Ev::Xadd { target, .. } => Some(*target),
            _ => None,
        })
        .collect();
    let at_ms = d.at(0.15, 0.35);
    let specs = d.specs;
    let kinds: Vec<usize> = (0..specs.len()).filter(|k| !held.contains(k)).collect();
    let end_s = d.d_ms / 1000;
    if kinds.is_empty() || end_s <= at_ms / 1000 + 17 {
        return None;
    }
    let kind = kinds[d.rng.gen_range(0..kinds.len())];
    let offsets = &specs[kind].offsets;
    let removable: Vec<u32> = (1..=offsets.len() as u32)
        .filter(|no| offsets[*no as usize - 1] * 1000 >= at_ms + 8_000)
        .filter(|no| !targeted.contains(&Target { kind, slot_no: *no }))
        // A second slot at the same second would make "which
        // one was removed" a matter of listing order.
        .filter(|no| {
            let o = offsets[*no as usize - 1];
            offsets.iter().filter(|x| **x == o).count() == 1
        })
        .collect();
    if removable.is_empty() {
        return None;
    }
    Some(Ev::ScheduleEdit {
        at_ms,
        kind,
        removed: removable[d.rng.gen_range(0..removable.len())],
        added_s: d.rng.gen_range(at_ms / 1000 + 15..end_s - 1),
    })
}

fn redis_master_failover(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::RedisMasterFailover {
        at_ms: d.at(0.1, 0.8),
        partition: d.rng.gen_range(0..CLUSTER_PARTITIONS),
    })
}

fn sentinel_failover(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::SentinelFailover {
        at_ms: d.at(0.1, 0.8),
    })
}

/// Early enough that most of the window runs on the promoted server.
fn pg_failover(d: &mut Draw, _: u32) -> Option<Ev> {
    Some(Ev::PgFailover {
        at_ms: d.at(0.2, 0.5),
    })
}

/// Alternately without and with a takeover, at least one of each.
fn held_before_apply(d: &mut Draw, i: u32) -> Option<Ev> {
    let at_ms = d.at(0.1, 0.7);
    let takeover = i % 2 == 1;
    let hold_ms = if takeover {
        HELD_TAKEOVER_MS
    } else {
        HTTP_TIMEOUT_MS + d.rng.gen_range(800..=1500)
    };
    Some(Ev::HeldBeforeApply {
        at_ms,
        hold_ms,
        takeover,
        restart_ms: d.rng.gen_range(300..=3000),
        reuse_id: d.rng.gen_bool(0.5),
    })
}

fn scaled(rng_free_count: f64, min: u32) -> u32 {
    (rng_free_count.round() as u32).max(min)
}

impl Scenario {
    /// The scenario of `seed`: the kinds, then the events of each rung of
    /// the [`LADDER`] in its order (the RNG's draws, and so a seed's
    /// replay, depend on it: a new kind is drawn after the others), sorted
    /// by time.
    pub fn generate(
        seed: u64,
        duration: Duration,
        kinds: &Kinds,
        total_slots: u32,
        faults: &FaultSet,
    ) -> Scenario {
        let mut rng = StdRng::seed_from_u64(seed);
        let specs = kind_specs(&mut rng, kinds, duration, total_slots);
        let mut d = Draw::new(&mut rng, duration, &specs);
        d.ladder(faults);
        let events = d.events;
        let rate = |f: Fault, p: f64| if faults.has(f) { p } else { 0.0 };
        let mut sc = Scenario {
            seed,
            duration,
            kinds: specs,
            events,
            webhook: WebhookRates {
                p503: rate(Fault::Webhook503, 0.06),
                timeout: rate(Fault::WebhookTimeout, 0.03),
                slow: rate(Fault::WebhookSlow, 0.06),
                reset: rate(Fault::WebhookReset, 0.03),
                max_failures_per_key: 3,
            },
            probe: false,
            probe_contract_broken: false,
            in_order: false,
        };
        let mut keyed: Vec<(u64, Ev)> = sc
            .events
            .drain(..)
            .map(|e| (sc_time(&e, &sc.kinds), e))
            .collect();
        keyed.sort_by_key(|(t, _)| *t);
        sc.events = keyed.into_iter().map(|(_, e)| e).collect();
        sc
    }

    pub fn slots(&self) -> usize {
        self.kinds.iter().map(|k| k.offsets.len()).sum()
    }

    pub fn target_key(&self, t: Target, day: &str) -> String {
        format!("{}:{day}:{}", self.kinds[t.kind].name, t.slot_no)
    }

    fn target_label(&self, t: Target) -> String {
        format!("{}:{}", self.kinds[t.kind].name, t.slot_no)
    }

    /// The schedule, one line per fault, in (approximate) time order.
    pub fn render_schedule(&self) -> String {
        let mut out = String::new();
        for e in &self.events {
            let t = sc_time(e, &self.kinds) as f64 / 1000.0;
            let what = match e {
                Ev::ConcurrentDup {
                    target,
                    copies,
                    offset_ms,
                } => format!(
                    "{} x{copies} at once, at its due time {offset_ms:+} ms",
                    self.target_label(*target)
                ),
                Ev::SerialDup {
                    target,
                    delay_ms,
                    copies,
                } => format!(
                    "{} x{copies}, {delay_ms} ms after it finished",
                    self.target_label(*target)
                ),
                Ev::Trigger { target, delay_ms } => format!(
                    "planner trigger {}, {delay_ms} ms after it finished",
                    self.target_label(*target)
                ),
                Ev::Xadd { target, delay_ms } => format!(
                    "redis-cli XADD {}, {delay_ms} ms after it finished",
                    self.target_label(*target)
                ),
                Ev::Backfill { kind, .. } => {
                    format!("planner backfill --kind {} (today)", self.kinds[*kind].name)
                }
                Ev::Kill {
                    victim,
                    restart_ms,
                    reuse_id,
                    ..
                } => format!(
                    "worker #{victim} (mod workers), restart after {restart_ms} ms with {} id",
                    if *reuse_id { "its old" } else { "a new" }
                ),
                Ev::KillMidWebhook {
                    hold_ms,
                    restart_ms,
                    reuse_id,
                    ..
                } => format!(
                    "the worker of the next publish call (held {hold_ms} ms), restart after {restart_ms} ms with {} id",
                    if *reuse_id { "its old" } else { "a new" }
                ),
                Ev::LeaderStop { pause_ms, .. } => {
                    format!("SIGSTOP the leader for {pause_ms} ms (TTL {LEASE_TTL}), then SIGCONT")
                }
                Ev::RedisWipe { .. } => "delete every key of the prefix".into(),
                Ev::PgTerminate { .. } => {
                    "pg_terminate_backend of every slotgate connection".into()
                }
                Ev::Malformed { what, .. } => {
                    format!("{} (expect dead letter {})", what.name(), what.reason())
                }
                Ev::Poison { what, .. } => what.name().to_owned(),
                Ev::Oversize { .. } => {
                    "one 64 MiB entry (expect dead letter bad_message, workers' memory unchanged)".into()
                }
                Ev::StallBurst {
                    kind,
                    hold_ms,
                    copies,
                    ..
                } => format!(
                    "another session holds the quota row of {} for {hold_ms} ms while {copies} copies of its slots are added",
                    self.kinds[*kind].name
                ),
                Ev::ScheduleEdit {
                    kind,
                    removed,
                    added_s,
                    ..
                } => format!(
                    "{}'s schedule edited: a time at +{added_s}s inserted in front, slot {removed} removed (expect it cancelled, the new one run once, every other key kept)",
                    self.kinds[*kind].name
                ),
                Ev::RedisMasterFailover { partition, .. } => format!(
                    "kill -9 the Cluster master of partition {partition} (expect a replica to take over), then start it again as a replica"
                ),
                Ev::SentinelFailover { .. } => "kill -9 the primary the Sentinels name (expect the replica elected and written to), then start it again as a replica".to_owned(),
                Ev::PgFailover { .. } => "kill -9 the Postgres primary, promote the synchronous standby, move the proxy address to it (expect a worker to commit there)".to_owned(),
                Ev::HeldBeforeApply {
                    hold_ms,
                    takeover,
                    restart_ms,
                    reuse_id,
                    ..
                } => format!(
                    "the next publish call received, applied only after {hold_ms} ms (timeout {HTTP_TIMEOUT_MS} ms; probes answered {} meanwhile){}",
                    if self.probe_contract_broken { 404 } else { 409 },
                    if *takeover {
                        format!(
                            "; its worker killed while it is held, restart after {restart_ms} ms with {} id",
                            if *reuse_id { "its old" } else { "a new" }
                        )
                    } else {
                        String::new()
                    }
                ),
                Ev::QuotaHeld { kind, hold_ms, .. } => format!(
                    "another session holds the quota row of {} for {hold_ms} ms (at its burst)",
                    self.kinds[*kind].name
                ),
                Ev::Redirect { calls, .. } => {
                    format!("the next {calls} publish call(s) answered 301 to another path")
                }
                Ev::FutureDelivery { kind, .. } => format!(
                    "a delivery of {}'s first slot of tomorrow",
                    self.kinds[*kind].name
                ),
                Ev::ClockAhead { .. } => {
                    "worker #1 runs with its clock 40 s ahead (libfaketime)".to_owned()
                }
                Ev::CmsLate { calls, .. } => format!(
                    "the next {calls} publish call(s) answered {} ms past the HTTP timeout",
                    CMS_LATE_BY_MS
                ),
                Ev::WordPress { fault, .. } => wordpress::SCHEDULE
                    .iter()
                    .find(|s| s.0 == *fault)
                    .map_or("", |s| s.2)
                    .to_owned(),
            };
            let approx = matches!(
                e,
                Ev::ConcurrentDup { .. }
                    | Ev::SerialDup { .. }
                    | Ev::Trigger { .. }
                    | Ev::Xadd { .. }
            );
            let _ = writeln!(
                out,
                "  {}{:>8.3}s  {:<20} {what}",
                if approx { "~" } else { " " },
                t,
                e.fault().name()
            );
        }
        if self.in_order {
            return out;
        }
        let w = self.webhook;
        let _ = writeln!(
            out,
            "  throughout  webhook faults per call: 503 {:.0}%, timeout {:.0}%, slow {:.0}%, reset {:.0}%; at most {} failing answers per key (http_attempts {}){}",
            w.p503 * 100.0,
            w.timeout * 100.0,
            w.slow * 100.0,
            w.reset * 100.0,
            w.max_failures_per_key,
            if self.probe {
                PROBE_HTTP_ATTEMPTS
            } else {
                HTTP_ATTEMPTS
            },
            if self.probe {
                "; probes are not faulted"
            } else {
                ""
            }
        );
        out
    }
}

/// When an event happens, in ms after the start of the window (nominal
/// times, without jitter, for the slot-relative ones).
fn sc_time(e: &Ev, kinds: &[KindSpec]) -> u64 {
    let nominal = |t: &Target| kinds[t.kind].offsets[t.slot_no as usize - 1] * 1000;
    match e {
        Ev::ConcurrentDup {
            target, offset_ms, ..
        } => (nominal(target) as i64 + offset_ms).max(0) as u64,
        Ev::SerialDup {
            target, delay_ms, ..
        }
        | Ev::Trigger { target, delay_ms }
        | Ev::Xadd { target, delay_ms } => nominal(target) + delay_ms,
        _ => e.at_ms().unwrap_or_default(),
    }
}

/// The WordPress scenario (`--cms wordpress`): its two kinds sharing one
/// real WordPress, and its fault schedule. Fixed but for the seed and the
/// window: the flags that shape the webhook scenario do not apply.
pub mod wordpress {
    use super::{Ev, KindSpec, Scenario, WebhookRates, WpDrafts};
    use crate::model::Fault;
    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::{Rng, SeedableRng};
    use std::time::Duration;

    /// The in-place kind (drafts are WordPress posts in `pending`).
    pub const ARTICLE: &str = "wp-article";
    /// The creating kind (drafts in slotgate, each publish creates a post).
    pub const NEWS: &str = "wp-news";
    /// Ready posts of [`ARTICLE`] at the start.
    pub const READY: usize = 10;
    /// Plain `draft` posts of [`ARTICLE`]: never ready, never published.
    pub const NOT_READY: usize = 2;
    /// Pull-backs by the editor (one of each kind).
    const WITHDRAWALS: usize = 3;
    /// [`ARTICLE`]'s slots and cap: enough slots that every ready post that
    /// is not pulled back is published, even if each pull-back costs a slot.
    const ARTICLE_SLOTS: usize = 13;
    pub const ARTICLE_CAP: usize = READY - WITHDRAWALS;
    /// [`NEWS`]'s drafts, slots and cap.
    pub const NEWS_DRAFTS: usize = 6;
    pub const NEWS_SLOTS: usize = 8;
    pub const NEWS_CAP: usize = 6;

    /// How many of each fault a run has, and what it does (see
    /// `run/wordpress.rs`). Its order is the order the times are drawn in:
    /// a new fault goes last, so a recorded seed keeps the times of the
    /// faults it had.
    pub const SCHEDULE: [(Fault, usize, &str); 10] = [
        (
            Fault::WpAppliedLost,
            3,
            "the next REST write held after its save, past the timeout",
        ),
        (
            Fault::WpKillMidWrite,
            1,
            "the same, then every worker killed with SIGKILL",
        ),
        (
            Fault::EditorDraft,
            1,
            "an editor pulls a ready post back to draft",
        ),
        (
            Fault::EditorTrash,
            1,
            "an editor moves a ready post to the trash",
        ),
        (Fault::EditorDelete, 1, "an editor deletes a ready post"),
        (Fault::TriggerDup, 1, "planner trigger of a finished slot"),
        (
            Fault::BackfillDup,
            1,
            "planner backfill while the workers are down; restarts them",
        ),
        (Fault::XaddDup, 1, "redis-cli XADD of a finished slot"),
        (
            Fault::ConcurrentDup,
            1,
            "two XADDs of a due slot at once, manual and planner",
        ),
        (
            Fault::WpHeldBeforeSave,
            1,
            "the next REST creates held before their save",
        ),
    ];

    /// The scenario of `seed`, and the order of the ready posts' dates
    /// (days of January, shuffled so that WordPress's "oldest first"
    /// differs from id order). One RNG draws, in order: the dates, the
    /// slots' times, the faults' times.
    pub fn generate(seed: u64, duration: Duration) -> (Scenario, Vec<u32>) {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x77_70_63_68_61_6f_73);
        let mut days: Vec<u32> = (1..=READY as u32).collect();
        days.shuffle(&mut rng);
        let secs = duration.as_secs();
        let kind = |rng: &mut StdRng, name: &str, slots: usize, cap: usize, drafts, wp| {
            let hi = secs.max(slots as u64 + 4) - 2;
            KindSpec {
                name: name.into(),
                offsets: offsets(rng, slots, 2, hi),
                daily_cap: cap as u32,
                drafts: drafts as u32,
                index: false,
                record_only: false,
                burst_at: 0,
                profile: match wp {
                    WpDrafts::InWordPress => "WordPress posts",
                    WpDrafts::InSlotgate => "staged, published",
                },
                wordpress: Some(wp),
            }
        };
        let kinds = vec![
            kind(
                &mut rng,
                ARTICLE,
                ARTICLE_SLOTS,
                ARTICLE_CAP,
                0,
                WpDrafts::InWordPress,
            ),
            kind(
                &mut rng,
                NEWS,
                NEWS_SLOTS,
                NEWS_CAP,
                NEWS_DRAFTS,
                WpDrafts::InSlotgate,
            ),
        ];
        let events = schedule(&mut rng, secs);
        let sc = Scenario {
            seed,
            duration,
            kinds,
            events,
            webhook: WebhookRates::default(),
            probe: false,
            probe_contract_broken: false,
            in_order: true,
        };
        (sc, days)
    }

    /// `n` distinct whole-second offsets in `[lo, hi)`, sorted.
    fn offsets(rng: &mut StdRng, n: usize, lo: u64, hi: u64) -> Vec<u64> {
        let mut all: Vec<u64> = (lo..hi).collect();
        all.shuffle(rng);
        let mut v: Vec<u64> = all.into_iter().take(n).collect();
        v.sort_unstable();
        v
    }

    /// The faults' times ([`SCHEDULE`]), in the order they run.
    fn schedule(rng: &mut StdRng, secs: u64) -> Vec<Ev> {
        let mut events: Vec<(u64, Fault)> = Vec::new();
        for (fault, n, _) in SCHEDULE {
            for _ in 0..n {
                // Every fault that needs a publish still to come (a held
                // write, a pull-back of a post that could still be picked,
                // an open slot for backfill) in the first two fifths, while
                // the caps leave publishes to make (they fill about halfway
                // through); the duplicates of finished slots anywhere in
                // three quarters.
                let end = match fault {
                    Fault::TriggerDup | Fault::XaddDup => secs * 1000 * 3 / 4,
                    _ => secs * 1000 * 2 / 5,
                };
                events.push((rng.gen_range(500..end), fault));
            }
        }
        // The backfill right after the kill, while the fleet is down.
        let kill = events
            .iter()
            .find(|e| e.1 == Fault::WpKillMidWrite)
            .map(|e| e.0);
        for e in events.iter_mut().filter(|e| e.1 == Fault::BackfillDup) {
            e.0 = kill.map_or(e.0, |k| k + 1);
        }
        events.sort_by_key(|e| e.0);
        events
            .into_iter()
            .map(|(at_ms, fault)| Ev::WordPress { at_ms, fault })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{PgChoice, RedisChoice};

    #[test]
    fn the_same_seed_gives_the_same_schedule() {
        let of = |seed| {
            let d = Duration::from_secs(60);
            Scenario::generate(seed, d, &Kinds::Count(4), 300, &FaultSet::default_set())
        };
        let (a, b, c) = (of(7), of(7), of(8));
        assert_eq!(a.render_schedule(), b.render_schedule());
        assert_ne!(a.render_schedule(), c.render_schedule());
        assert_eq!(format!("{:?}", a.kinds), format!("{:?}", b.kinds));
    }

    #[test]
    fn the_probe_fault_is_drawn_last_so_a_seed_keeps_its_other_faults() {
        let mut with = FaultSet::default_set();
        with.0.insert(Fault::WebhookHeldBeforeApply);
        for seed in [1, 20261129] {
            let d = Duration::from_secs(60);
            let a = Scenario::generate(seed, d, &Kinds::Count(4), 300, &FaultSet::default_set());
            let b = Scenario::generate(seed, d, &Kinds::Count(4), 300, &with);
            let held: Vec<&Ev> = b
                .events
                .iter()
                .filter(|e| e.fault() == Fault::WebhookHeldBeforeApply)
                .collect();
            // 3 a minute: without, with, without a takeover.
            assert_eq!(held.len(), 3);
            assert!(held.iter().any(
                |e| matches!(e, Ev::HeldBeforeApply { takeover: true, hold_ms, .. } if *hold_ms == HELD_TAKEOVER_MS)
            ));
            assert!(held.iter().any(
                |e| matches!(e, Ev::HeldBeforeApply { takeover: false, hold_ms, .. } if *hold_ms > HTTP_TIMEOUT_MS)
            ));
            let others = |s: &Scenario| -> Vec<String> {
                s.render_schedule()
                    .lines()
                    .filter(|l| !l.contains("webhook-held-before-apply"))
                    .map(str::to_owned)
                    .collect()
            };
            assert_eq!(others(&a), others(&b), "seed {seed}");
        }
    }

    /// The ladder's order is every seed's replay: a rung moved, or a draw
    /// added in the middle, changes the schedule of a seed printed in an
    /// old report. Pinned: how many events, and the sum of their times.
    #[test]
    fn a_seed_replays_the_schedule_of_earlier_versions() {
        let all: FaultSet = "all".parse().unwrap();
        for (seed, events, sum_ms) in [(1, 64, 1774032), (20261129, 64, 1739359)] {
            let s = Scenario::generate(seed, Duration::from_secs(60), &Kinds::Count(4), 300, &all);
            let sum: u64 = s.events.iter().map(|e| sc_time(e, &s.kinds)).sum();
            assert_eq!((s.events.len(), sum), (events, sum_ms), "seed {seed}");
        }
    }

    #[test]
    fn caps_and_drafts_bind() {
        let s = Scenario::generate(
            1,
            Duration::from_secs(60),
            &Kinds::Count(4),
            300,
            &FaultSet::default_set(),
        );
        assert!((280..=320).contains(&s.slots()));
        let k = &s.kinds;
        assert!(k[0].daily_cap < k[0].offsets.len() as u32 && k[0].daily_cap < k[0].drafts);
        assert!(k[1].drafts < k[1].daily_cap);
        assert!(k[2].daily_cap < k[2].offsets.len() as u32);
        assert_eq!(k[3].expected_effects(), k[3].offsets.len() as u32);
        assert!(
            !k[0].record_only && k[1].record_only,
            "kinds mix record-only and webhooks"
        );
        assert!(
            k[0].offsets.iter().filter(|o| **o == k[0].burst_at).count() >= k[0].offsets.len() / 4
        );
    }

    #[test]
    fn fault_sets_parse_and_the_default_is_every_kind() {
        let d = FaultSet::default_set();
        assert!(d.has(Fault::Kill9) && d.has(Fault::CmsLate));
        assert!(d.has(Fault::PoisonEntry) && d.has(Fault::ClockAhead) && d.has(Fault::Redirect));
        // Every kind but the failovers (each topology adds its own), the
        // one `--cms probe` adds and the WordPress scenario's six.
        assert_eq!(d.0.len(), Fault::ALL.len() - 10);
        assert!(!d.has(Fault::WebhookHeldBeforeApply));
        assert!(!d.has(Fault::RedisMasterFailover));
        assert!(!d.has(Fault::SentinelFailover) && !d.has(Fault::PgFailover));
        for (redis, postgres, added) in [
            (
                RedisChoice::Cluster,
                PgChoice::Single,
                &[Fault::RedisMasterFailover][..],
            ),
            (
                RedisChoice::Sentinel,
                PgChoice::Single,
                &[Fault::SentinelFailover],
            ),
            (
                RedisChoice::Standalone,
                PgChoice::Pair,
                &[Fault::PgFailover],
            ),
            (
                RedisChoice::Sentinel,
                PgChoice::Pair,
                &[Fault::SentinelFailover, Fault::PgFailover],
            ),
        ] {
            let set = FaultSet::default_for(Stores { redis, postgres });
            assert_eq!(
                set.0.len(),
                d.0.len() + added.len(),
                "{redis:?} {postgres:?}"
            );
            assert!(added.iter().all(|f| set.has(*f)), "{redis:?} {postgres:?}");
        }
        let x: FaultSet = "kill-9,poison-entry".parse().unwrap();
        assert!(x.has(Fault::PoisonEntry) && x.has(Fault::Kill9) && !x.has(Fault::Redirect));
        assert_eq!("none".parse::<FaultSet>().unwrap().0.len(), 0);
        assert_eq!("all".parse::<FaultSet>().unwrap().0.len(), Fault::ALL.len());
        assert!("kill-9,nope".parse::<FaultSet>().is_err());
        let none = Scenario::generate(
            3,
            Duration::from_secs(30),
            &Kinds::Count(4),
            150,
            &FaultSet(BTreeSet::new()),
        );
        assert!(none.events.is_empty());
        assert_eq!(none.webhook.p503, 0.0);
    }
}

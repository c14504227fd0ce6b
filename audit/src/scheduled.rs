//! What is audited, once read: the [`AuditOptions`] of a run (with what
//! Postgres knows of each slotgate kind), and each schedule found in a
//! manifest or crontab ([`Scheduled`]) with what it runs ([`EntryPoint`]),
//! for the rules that look across files.

use crate::command;
use ::slotgate::cron::Schedule;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;

/// What the audit needs besides its inputs.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// The reference instant: DST transitions are looked for in the 12
    /// months from here, and thundering herds in the 31 local days from its
    /// date.
    pub now: DateTime<Utc>,
    /// The zone of crontabs that set neither `CRON_TZ` nor `TZ` (the zone of
    /// the machine the crontab runs on; see [`crate::machine_zone`]).
    pub local_zone: Tz,
    /// What Postgres knows of each slotgate config's kinds, for the rule
    /// `slotgate-moves-run-slot`; `None` (no database given) skips it.
    pub history: Option<HistorySource>,
}

/// What Postgres knows of one kind's schedule (DESIGN 4.18).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KindHistory {
    /// Every (local time, listing) the kind's slots were ever numbered
    /// for, with the number.
    pub numbered: std::collections::HashMap<(chrono::NaiveTime, u32), u32>,
    /// Slots of the kind's local day (at the audit's `now`) that have a
    /// gate row other than `skipped`: slot number → state.
    pub ran_today: std::collections::HashMap<u32, String>,
}

/// The [`KindHistory`] of each kind of a config, by kind name.
pub type Histories = std::collections::HashMap<String, KindHistory>;

/// Looks up the [`KindHistory`] of a slotgate config's kinds (the planner
/// reads Postgres); kinds it does not know are left out.
#[derive(Clone)]
pub struct HistorySource(
    pub std::sync::Arc<dyn Fn(&::slotgate::config::Config) -> Histories + Send + Sync>,
);

impl std::fmt::Debug for HistorySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HistorySource(..)")
    }
}

/// Where an entry point (what a schedule runs) came from: it decides how two
/// entry points are compared (see [`EntryPoint`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Origin {
    CronJob,
    Crontab,
}

/// What a schedule runs, normalized by [`command::normalize_argv`]: wrappers
/// (`flock`, `timeout`, `nice`, `env`, a shell's `-c`, an interpreter),
/// redirections and `cd DIR &&` prefixes removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EntryPoint {
    /// The image without tag or digest (CronJobs only).
    pub image: Option<String>,
    pub argv: Vec<String>,
    /// The literal `env` values (`name=value`, sorted) of a CronJob's
    /// container: jobs that share an image and command but are parameterized
    /// differently (`REPORT=sales`, `REPORT=traffic`) are different entry
    /// points.
    pub env: Vec<String>,
}

impl EntryPoint {
    /// Whether two schedules run the same thing. Two CronJobs: the same image,
    /// command, arguments and literal env values. Two crontab lines: the same
    /// command and arguments. A CronJob and a crontab line (a job being moved
    /// from a VM to the cluster, the old line still active): the same program
    /// base name and arguments.
    pub(crate) fn same_as(&self, a: Origin, other: &EntryPoint, b: Origin) -> bool {
        match (a, b) {
            (Origin::CronJob, Origin::CronJob) => {
                self.image == other.image && self.argv == other.argv && self.env == other.env
            }
            (Origin::Crontab, Origin::Crontab) => !self.argv.is_empty() && self.argv == other.argv,
            _ => {
                !self.argv.is_empty()
                    && !other.argv.is_empty()
                    && command::base_argv(&self.argv) == command::base_argv(&other.argv)
            }
        }
    }

    pub(crate) fn describe(&self) -> String {
        let cmd = self.argv.join(" ");
        match (&self.image, cmd.is_empty()) {
            (Some(i), true) => format!("image {i} with its default command"),
            (Some(i), false) => format!("`{cmd}` in image {i}"),
            (None, _) => format!("`{cmd}`"),
        }
    }
}

/// A schedule found in a manifest or crontab, for the rules that look across
/// files (shared entry points, thundering herds, DST windows).
#[derive(Debug, Clone)]
pub(crate) struct Scheduled {
    pub file_idx: usize,
    pub file: String,
    pub object: String,
    pub origin: Origin,
    /// The line of the schedule (the `schedule:` key or the crontab line).
    pub line: usize,
    pub schedule: Schedule,
    pub zone: Tz,
    pub entry: Option<EntryPoint>,
    /// The line to report a shared entry point on (`command:`, else `args:`,
    /// else `image:` of a CronJob; the crontab line).
    pub entry_line: usize,
}

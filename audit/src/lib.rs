//! `planner audit`: reviews schedules for the ways a scheduled job runs twice
//! or never.
//!
//! Inputs are Kubernetes manifests (multi-document YAML; `CronJob` objects of
//! `batch/*`, also inside `kind: List`), crontabs (the user form and the
//! system form with a user column) and slotgate configs. Each input is parsed
//! with a maintained parser (`serde_yaml_ng` for YAML, `croner` for cron
//! expressions, `toml` via [`::slotgate::config::Config::parse`] for slotgate
//! configs) and checked against the rules of DESIGN.md, section "Audit".
//!
//! Findings carry a severity, a rule id, the file (as given on the command
//! line, or the directory as given joined with the file's relative path), a
//! 1-based line, the object (`namespace/name` for a CronJob, `FILE:LINE` for
//! a crontab entry, the kind name for a slotgate config), a one-sentence
//! message and a fix.
//!
//! Lines: for a field that is present, the line of its key; for a field that
//! is absent, the line of the mapping it belongs in (`spec:` of the CronJob
//! for `concurrencyPolicy`, `startingDeadlineSeconds` and `timeZone`;
//! `spec:` of the job template for a defaulted `backoffLimit`).
//!
//! File types are detected by extension first (`.yaml`/`.yml` → Kubernetes,
//! `.toml` → slotgate config, `.cron`/`.crontab`, a file named `crontab` or a
//! file in a `cron.d` directory → crontab), then by content (`apiVersion:` and
//! `kind:` at the start of a line → Kubernetes; a `[[kinds]]` table → slotgate
//! config; lines that look like cron entries → crontab). A file named
//! explicitly that matches nothing is read as a crontab, so its first bad line
//! is reported. Inside a directory (walked recursively, sorted by name, hidden
//! entries and symlinked directories skipped) files that match nothing, or
//! are not UTF-8, are skipped.

#![warn(missing_docs, unreachable_pub)]

mod command;
mod cronjob;
mod crontab;
mod dst;
mod herd;
mod render;
mod schedule;
mod slotgate;
mod yamlpos;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde::{Serialize, Serializer};
use std::path::{Path, PathBuf};

use schedule::Schedule;

/// What the audit needs besides its inputs.
#[derive(Debug, Clone)]
pub struct AuditOptions {
    /// The reference instant: DST transitions are looked for in the 12
    /// months from here, and thundering herds in the 31 local days from its
    /// date.
    pub now: DateTime<Utc>,
    /// The zone of crontabs that set neither `CRON_TZ` nor `TZ` (the zone of
    /// the machine the crontab runs on; see [`machine_zone`]).
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

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Worth knowing; does not change the exit status.
    Low,
    /// A run can repeat or be lost; does not change the exit status.
    Medium,
    /// Makes `planner audit` exit 1.
    High,
}

impl Severity {
    /// The severity's name in the JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Low => "low",
            Severity::Medium => "medium",
            Severity::High => "high",
        }
    }
}

/// The rules of DESIGN.md, in the order of its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rule {
    /// `concurrencyPolicy: Allow` (or unset): overlapping runs of one CronJob.
    ConcurrencyAllow,
    /// Several CronJobs or crontab lines run the same command; no policy spans them.
    SharedEntryPoint,
    /// A fire time skipped or repeated on a DST transition day in the next 12 months.
    DstWindow,
    /// `startingDeadlineSeconds` under 10.
    ShortDeadline,
    /// `Forbid`/`Replace` or a lock is the only guard: it stops overlap, not a later second run.
    SerialDuplicates,
    /// Three or more schedules start in the same minute of one zone.
    ThunderingHerd,
    /// No `startingDeadlineSeconds`: missed runs start late or not at all.
    MissingDeadline,
    /// `backoffLimit` > 0 or `restartPolicy: OnFailure` on an unguarded job.
    RetriesRepeatEffects,
    /// No `timeZone`: the schedule follows the controller's zone.
    MissingTimezone,
    /// slotgate config: two kinds with jitter 0 share a nominal second.
    SlotgateSharedSecond,
    /// slotgate config: `starting_deadline` shorter than `jitter`.
    SlotgateDeadlineBelowJitter,
    /// slotgate config: `daily_cap` larger than the number of slots.
    SlotgateCapAboveSlots,
    /// slotgate config against Postgres: a removed time's slot already ran
    /// today and a new time would run today too.
    SlotgateMovesRunSlot,
}

impl Rule {
    /// Every rule, in DESIGN order.
    pub const ALL: [Rule; 13] = [
        Rule::ConcurrencyAllow,
        Rule::SharedEntryPoint,
        Rule::DstWindow,
        Rule::ShortDeadline,
        Rule::SerialDuplicates,
        Rule::ThunderingHerd,
        Rule::MissingDeadline,
        Rule::RetriesRepeatEffects,
        Rule::MissingTimezone,
        Rule::SlotgateSharedSecond,
        Rule::SlotgateDeadlineBelowJitter,
        Rule::SlotgateCapAboveSlots,
        Rule::SlotgateMovesRunSlot,
    ];

    /// The rule id of the JSON output.
    pub fn id(self) -> &'static str {
        match self {
            Rule::ConcurrencyAllow => "concurrency-allow",
            Rule::SharedEntryPoint => "shared-entry-point",
            Rule::DstWindow => "dst-window",
            Rule::ShortDeadline => "short-deadline",
            Rule::SerialDuplicates => "serial-duplicates",
            Rule::ThunderingHerd => "thundering-herd",
            Rule::MissingDeadline => "missing-deadline",
            Rule::RetriesRepeatEffects => "retries-repeat-effects",
            Rule::MissingTimezone => "missing-timezone",
            Rule::SlotgateSharedSecond => "slotgate-shared-second",
            Rule::SlotgateDeadlineBelowJitter => "slotgate-deadline-below-jitter",
            Rule::SlotgateCapAboveSlots => "slotgate-cap-above-slots",
            Rule::SlotgateMovesRunSlot => "slotgate-moves-run-slot",
        }
    }

    /// The rule's fixed severity.
    pub fn severity(self) -> Severity {
        match self {
            Rule::ConcurrencyAllow
            | Rule::SharedEntryPoint
            | Rule::DstWindow
            | Rule::ShortDeadline => Severity::High,
            Rule::SerialDuplicates
            | Rule::ThunderingHerd
            | Rule::MissingDeadline
            | Rule::RetriesRepeatEffects
            | Rule::SlotgateSharedSecond
            | Rule::SlotgateDeadlineBelowJitter
            | Rule::SlotgateMovesRunSlot => Severity::Medium,
            Rule::MissingTimezone | Rule::SlotgateCapAboveSlots => Severity::Low,
        }
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.id())
    }
}

impl Serialize for Rule {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.id())
    }
}

/// One finding. Field order is the JSON order of DESIGN.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// How bad it is (from the rule).
    pub severity: Severity,
    /// Which rule found it.
    pub rule: Rule,
    /// The file as given, or the directory as given joined with its path.
    pub file: String,
    /// 1-based line of the field, or of the mapping it belongs in.
    pub line: usize,
    /// `namespace/name`, `FILE:LINE` of a crontab entry, or the kind name.
    pub object: String,
    /// One sentence: what goes wrong.
    pub message: String,
    /// What to change.
    pub fix: String,
}

impl Finding {
    pub(crate) fn new(
        rule: Rule,
        file: &str,
        line: usize,
        object: impl Into<String>,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Finding {
            severity: rule.severity(),
            rule,
            file: file.to_owned(),
            line,
            object: object.into(),
            message: message.into(),
            fix: fix.into(),
        }
    }
}

/// Counts by severity.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Findings of severity high.
    pub high: usize,
    /// Findings of severity medium.
    pub medium: usize,
    /// Findings of severity low.
    pub low: usize,
}

/// The result of an audit: `{"findings": [...], "summary": {...}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditReport {
    /// Every finding, in input order.
    pub findings: Vec<Finding>,
    /// Counts by severity.
    pub summary: Summary,
}

impl AuditReport {
    fn from_findings(findings: Vec<Finding>) -> Self {
        let mut summary = Summary::default();
        for f in &findings {
            match f.severity {
                Severity::High => summary.high += 1,
                Severity::Medium => summary.medium += 1,
                Severity::Low => summary.low += 1,
            }
        }
        AuditReport { findings, summary }
    }

    /// 1 when anything high was found, else 0. (Status 2, unreadable input,
    /// is the caller's to return on [`AuditError`].)
    pub fn exit_code(&self) -> i32 {
        i32::from(self.summary.high > 0)
    }

    /// The report for people: one block per finding and a summary line.
    pub fn render_table(&self) -> String {
        render::table(self)
    }

    /// The report for tools, in the shape of DESIGN.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serializes")
    }
}

/// An input that cannot be read or parsed. `planner audit` exits with
/// status 2 on it. The message names the file, and the line when there is one.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The file (or directory) cannot be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The path as given.
        file: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML, TOML or crontab.
    #[error("{file}:{line}: {message}")]
    Parse {
        /// The path as given.
        file: String,
        /// 1-based line of the error.
        line: usize,
        /// The parser's message.
        message: String,
    },
}

impl AuditError {
    pub(crate) fn parse(file: &str, line: usize, message: impl Into<String>) -> Self {
        AuditError::Parse {
            file: file.to_owned(),
            line: line.max(1),
            message: message.into(),
        }
    }

    /// The file the error is about, as given.
    pub fn file(&self) -> &str {
        match self {
            AuditError::Read { file, .. } | AuditError::Parse { file, .. } => file,
        }
    }

    /// The 1-based line, when the error has one.
    pub fn line(&self) -> Option<usize> {
        match self {
            AuditError::Read { .. } => None,
            AuditError::Parse { line, .. } => Some(*line),
        }
    }
}

/// What a file is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileType {
    Kubernetes,
    Crontab,
    Slotgate,
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
    fn same_as(&self, a: Origin, other: &EntryPoint, b: Origin) -> bool {
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

    fn describe(&self) -> String {
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

/// Audits files and directories.
///
/// Returns every finding (sorted by input order, then line, then rule) or the
/// first input that cannot be read or parsed.
pub fn audit_paths(paths: &[PathBuf], opts: &AuditOptions) -> Result<AuditReport, AuditError> {
    let mut files: Vec<(String, FileType, String)> = Vec::new();
    for p in paths {
        collect(p, &p.display().to_string(), true, &mut files)?;
    }
    // A file given twice (directly and through its directory) is one input.
    let mut seen = std::collections::HashSet::new();
    files.retain(|(name, _, _)| {
        seen.insert(std::path::absolute(name).unwrap_or_else(|_| PathBuf::from(name)))
    });
    let mut findings: Vec<(usize, Finding)> = Vec::new();
    let mut scheduled: Vec<Scheduled> = Vec::new();
    for (idx, (name, ty, text)) in files.iter().enumerate() {
        match ty {
            FileType::Kubernetes => {
                let (f, s) = cronjob::audit_manifests(idx, name, text)?;
                findings.extend(f.into_iter().map(|f| (idx, f)));
                scheduled.extend(s);
            }
            FileType::Crontab => {
                let system = crontab::is_system_crontab(Path::new(name), text);
                let entries = crontab::parse(name, text, system, opts.local_zone)?;
                scheduled.extend(entries.into_iter().map(|e| e.into_scheduled(idx, name)));
            }
            FileType::Slotgate => {
                findings.extend(
                    slotgate::audit(name, text, opts)?
                        .into_iter()
                        .map(|f| (idx, f)),
                );
            }
        }
    }
    findings.extend(herd::shared_entry_points(&scheduled));
    findings.extend(herd::thundering_herd(&scheduled, opts));
    findings.extend(dst::dst_windows(&scheduled, opts));
    findings.sort_by(|(ia, a), (ib, b)| {
        (ia, a.line, a.rule, &a.object, &a.message)
            .cmp(&(ib, b.line, b.rule, &b.object, &b.message))
    });
    findings.dedup_by(|(_, a), (_, b)| a == b);
    Ok(AuditReport::from_findings(
        findings.into_iter().map(|(_, f)| f).collect(),
    ))
}

/// Adds `path` (a file, or a directory walked recursively) to `out` as
/// `(display name, type, text)`.
fn collect(
    path: &Path,
    display: &str,
    explicit: bool,
    out: &mut Vec<(String, FileType, String)>,
) -> Result<(), AuditError> {
    let read_err = |source| AuditError::Read {
        file: display.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read_err)?;
    if meta.is_dir() {
        let mut entries: Vec<(String, PathBuf)> = std::fs::read_dir(path)
            .map_err(read_err)?
            .map(|e| e.map(|e| (e.file_name().to_string_lossy().into_owned(), e.path())))
            .collect::<Result<_, _>>()
            .map_err(read_err)?;
        entries.sort();
        for (name, p) in entries {
            if name.starts_with('.') {
                continue;
            }
            let is_symlinked_dir = std::fs::symlink_metadata(&p)
                .is_ok_and(|m| m.file_type().is_symlink())
                && p.is_dir();
            if is_symlinked_dir {
                continue;
            }
            let child = Path::new(display).join(&name).display().to_string();
            collect(&p, &child, false, out)?;
        }
        return Ok(());
    }
    let bytes = std::fs::read(path).map_err(read_err)?;
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(_) if !explicit => return Ok(()),
        Err(e) => {
            let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            let line = 1 + valid.iter().filter(|&&b| b == b'\n').count();
            return Err(AuditError::parse(display, line, "not UTF-8 text"));
        }
    };
    match detect(path, &text) {
        Some(ty) => out.push((display.to_owned(), ty, text)),
        None if explicit => out.push((display.to_owned(), FileType::Crontab, text)),
        None => {}
    }
    Ok(())
}

/// The file's type by extension or name, else by content (see the module
/// documentation).
pub(crate) fn detect(path: &Path, text: &str) -> Option<FileType> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    match ext.as_deref() {
        Some("yaml" | "yml") => return Some(FileType::Kubernetes),
        Some("toml") => return Some(FileType::Slotgate),
        Some("cron" | "crontab") => return Some(FileType::Crontab),
        _ => {}
    }
    let in_cron_d = path
        .parent()
        .and_then(|p| p.file_name())
        .is_some_and(|n| n == "cron.d");
    if name == "crontab" || in_cron_d {
        return Some(FileType::Crontab);
    }
    let starts = |prefix: &str| text.lines().any(|l| l.starts_with(prefix));
    if starts("apiVersion:") && starts("kind:") {
        return Some(FileType::Kubernetes);
    }
    if text.lines().any(|l| {
        let t: String = l.chars().filter(|c| !c.is_whitespace()).collect();
        t == "[[kinds]]"
    }) {
        return Some(FileType::Slotgate);
    }
    if crontab::looks_like_crontab(text) {
        return Some(FileType::Crontab);
    }
    None
}

/// The machine's time zone: `TZ` (an IANA name, optionally prefixed with `:`
/// or given as a path under `zoneinfo/`), else `/etc/timezone`, else the
/// target of the `/etc/localtime` symlink, else UTC. Unknown names fall
/// through to the next source.
pub fn machine_zone() -> Tz {
    let from_env = std::env::var("TZ").ok();
    let from_file = || std::fs::read_to_string("/etc/timezone").ok();
    let from_link = || {
        std::fs::read_link("/etc/localtime")
            .ok()
            .map(|p| p.display().to_string())
    };
    from_env
        .and_then(|s| zone_from_name(&s))
        .or_else(|| from_file().and_then(|s| zone_from_name(&s)))
        .or_else(|| from_link().and_then(|s| zone_from_name(&s)))
        .unwrap_or(Tz::UTC)
}

/// An IANA zone from `Europe/Berlin`, `:Europe/Berlin` or
/// `/usr/share/zoneinfo/Europe/Berlin`.
pub(crate) fn zone_from_name(s: &str) -> Option<Tz> {
    let s = s.trim().trim_start_matches(':');
    let s = match s.rfind("zoneinfo/") {
        Some(i) => &s[i + "zoneinfo/".len()..],
        None => s,
    };
    if s.is_empty() {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_ids_and_severities_match_design() {
        let table: Vec<(&str, Severity)> =
            Rule::ALL.iter().map(|r| (r.id(), r.severity())).collect();
        assert_eq!(
            table,
            vec![
                ("concurrency-allow", Severity::High),
                ("shared-entry-point", Severity::High),
                ("dst-window", Severity::High),
                ("short-deadline", Severity::High),
                ("serial-duplicates", Severity::Medium),
                ("thundering-herd", Severity::Medium),
                ("missing-deadline", Severity::Medium),
                ("retries-repeat-effects", Severity::Medium),
                ("missing-timezone", Severity::Low),
                ("slotgate-shared-second", Severity::Medium),
                ("slotgate-deadline-below-jitter", Severity::Medium),
                ("slotgate-cap-above-slots", Severity::Low),
                ("slotgate-moves-run-slot", Severity::Medium),
            ]
        );
        assert_eq!(
            serde_json::to_string(&Rule::DstWindow).unwrap(),
            "\"dst-window\""
        );
        assert_eq!(
            serde_json::to_string(&Severity::Medium).unwrap(),
            "\"medium\""
        );
    }

    #[test]
    fn zone_names_are_read_in_all_their_spellings() {
        assert_eq!(
            zone_from_name("Europe/Berlin\n"),
            Some(chrono_tz::Europe::Berlin)
        );
        assert_eq!(
            zone_from_name(":America/New_York"),
            Some(chrono_tz::America::New_York)
        );
        assert_eq!(
            zone_from_name("/usr/share/zoneinfo/Asia/Shanghai"),
            Some(chrono_tz::Asia::Shanghai)
        );
        assert_eq!(zone_from_name("../zoneinfo/UTC"), Some(Tz::UTC));
        assert_eq!(zone_from_name("Not/AZone"), None);
        assert_eq!(zone_from_name(""), None);
    }

    #[test]
    fn detection_prefers_extension_then_content() {
        let p = Path::new;
        assert_eq!(detect(p("a.yml"), ""), Some(FileType::Kubernetes));
        assert_eq!(detect(p("a.toml"), ""), Some(FileType::Slotgate));
        assert_eq!(detect(p("etc/crontab"), ""), Some(FileType::Crontab));
        assert_eq!(detect(p("etc/cron.d/backup"), ""), Some(FileType::Crontab));
        assert_eq!(
            detect(p("manifest"), "apiVersion: batch/v1\nkind: CronJob\n"),
            Some(FileType::Kubernetes)
        );
        assert_eq!(
            detect(p("conf"), "[[kinds]]\nname = \"a\"\n"),
            Some(FileType::Slotgate)
        );
        assert_eq!(
            detect(p("jobs"), "MAILTO=ops\n*/5 * * * * /bin/true\n"),
            Some(FileType::Crontab)
        );
        assert_eq!(detect(p("README.md"), "# Title\n\nSome prose.\n"), None);
    }

    #[test]
    fn exit_code_follows_high_findings() {
        let low = Finding::new(Rule::MissingTimezone, "f", 1, "o", "m", "x");
        let high = Finding::new(Rule::DstWindow, "f", 2, "o", "m", "x");
        assert_eq!(AuditReport::from_findings(vec![low.clone()]).exit_code(), 0);
        let r = AuditReport::from_findings(vec![low, high]);
        assert_eq!(r.exit_code(), 1);
        assert_eq!(
            r.summary,
            Summary {
                high: 1,
                medium: 0,
                low: 1
            }
        );
    }
}

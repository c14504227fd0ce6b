//! What an audit says: the rules and their severities, one [`Finding`] per
//! broken rule, the [`AuditReport`] they add up to, and the [`AuditError`]
//! of an input that cannot be read. Every checker writes these and the
//! renderer reads them, so they live apart from both.

use serde::{Serialize, Serializer};

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
    /// slotgate config: the kind's calendar (weekdays, day lists, cron,
    /// blackout) gives no slot that may publish in the next 14 days.
    SlotgateCalendarDark,
}

impl Rule {
    /// Every rule, in DESIGN order.
    pub const ALL: [Rule; 14] = [
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
        Rule::SlotgateCalendarDark,
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
            Rule::SlotgateCalendarDark => "slotgate-calendar-dark",
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
            | Rule::SlotgateMovesRunSlot
            | Rule::SlotgateCalendarDark => Severity::Medium,
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
    pub(crate) fn from_findings(findings: Vec<Finding>) -> Self {
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

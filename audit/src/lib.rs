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
mod finding;
mod herd;
mod render;
mod scheduled;
mod slotgate;
mod yamlpos;
mod zone;

use std::path::{Path, PathBuf};

pub use finding::{AuditError, AuditReport, Finding, Rule, Severity, Summary};
pub use scheduled::{AuditOptions, Histories, HistorySource, KindHistory};
pub use zone::machine_zone;

use scheduled::Scheduled;

/// What a file is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileType {
    Kubernetes,
    Crontab,
    Slotgate,
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
                ("slotgate-calendar-dark", Severity::Medium),
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

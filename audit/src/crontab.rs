//! Crontabs: the user form (`m h dom mon dow command`) and the system form
//! with a user column (`m h dom mon dow user command`, as in `/etc/crontab`
//! and `/etc/cron.d/*`).
//!
//! Lines are blank, comments (`#`), environment assignments (`NAME=value`,
//! `NAME = "value"`) or entries. `CRON_TZ=` and `TZ=` set the zone of the
//! entries that follow them (cronie reads the schedule in it); entries before
//! any such line, and files without one, use the machine's zone. In the
//! command, an unescaped `%` ends the command (the rest is stdin) and `\%` is
//! a literal `%`.

use crate::command::{normalize_argv, shell_words};
use crate::finding::AuditError;
use crate::scheduled::{EntryPoint, Origin, Scheduled};
use crate::zone::zone_from_name;
use ::slotgate::cron::Schedule;
use chrono_tz::Tz;
use std::path::Path;

/// One entry of a crontab.
#[derive(Debug, Clone)]
pub(crate) struct CrontabEntry {
    pub line: usize,
    pub schedule: Schedule,
    pub command: String,
    pub zone: Tz,
}

impl CrontabEntry {
    pub(crate) fn into_scheduled(self, file_idx: usize, file: &str) -> Scheduled {
        let argv = normalize_argv(&shell_words(&self.command));
        Scheduled {
            file_idx,
            file: file.to_owned(),
            object: format!("{file}:{}", self.line),
            origin: Origin::Crontab,
            line: self.line,
            schedule: self.schedule,
            zone: self.zone,
            entry: (!argv.is_empty()).then_some(EntryPoint {
                image: None,
                argv,
                env: Vec::new(),
            }),
            entry_line: self.line,
        }
    }
}

/// Users common in system crontabs; a file whose every entry has one of these
/// as its sixth word is read in the system form.
const SYSTEM_USERS: &[&str] = &[
    "root", "nobody", "daemon", "www-data", "www", "nginx", "apache", "postgres", "mysql", "redis",
    "backup", "deploy", "app", "ubuntu", "ec2-user", "admin", "operator", "mail", "news", "sync",
];

fn is_env_line(t: &str) -> Option<(String, String)> {
    let eq = t.find('=')?;
    let name = t[..eq].trim();
    if name.is_empty()
        || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        || name.as_bytes()[0].is_ascii_digit()
    {
        return None;
    }
    let mut value = t[eq + 1..].trim();
    for q in ['"', '\''] {
        if value.len() >= 2 && value.starts_with(q) && value.ends_with(q) {
            value = &value[1..value.len() - 1];
        }
    }
    Some((name.to_owned(), value.to_owned()))
}

/// Words with their byte offsets.
fn words_with_offsets(t: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in t.char_indices() {
        match (c.is_whitespace(), start) {
            (true, Some(s)) => {
                out.push((s, &t[s..i]));
                start = None;
            }
            (false, None) => start = Some(i),
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, &t[s..]));
    }
    out
}

/// Whether the file is a system crontab: `/etc/crontab`, a file in a
/// `cron.d` directory, a file whose comments carry the column header
/// `m h dom mon dow user command`, or one whose every entry names a common
/// system user (`root`, `www-data`, …) in the user column.
pub(crate) fn is_system_crontab(path: &Path, text: &str) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let parent = path
        .parent()
        .and_then(|p| p.file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("");
    if (name == "crontab" && parent == "etc") || parent == "cron.d" {
        return true;
    }
    let mut entries = 0;
    let mut with_user = 0;
    for l in text.lines() {
        let t = l.trim();
        if let Some(c) = t.strip_prefix('#') {
            let w: Vec<&str> = c.split_whitespace().collect();
            if w.windows(3).any(|x| x == ["dow", "user", "command"]) {
                return true;
            }
            continue;
        }
        if t.is_empty() || is_env_line(t).is_some() {
            continue;
        }
        let w: Vec<&str> = t.split_whitespace().collect();
        let user_at = if t.starts_with('@') { 1 } else { 5 };
        entries += 1;
        if w.len() > user_at + 1 && SYSTEM_USERS.contains(&w[user_at]) {
            with_user += 1;
        }
    }
    entries > 0 && entries == with_user
}

/// Whether text looks like a crontab: at least one entry, and every line
/// blank, a comment, an assignment or an entry whose first word is a macro or
/// a minute field (digits, `*`, `,`, `-`, `/`).
pub(crate) fn looks_like_crontab(text: &str) -> bool {
    let mut entries = 0;
    for l in text.lines() {
        let t = l.trim();
        if t.is_empty() || t.starts_with('#') || is_env_line(t).is_some() {
            continue;
        }
        let w: Vec<&str> = t.split_whitespace().collect();
        let first = w[0];
        let is_macro = first.starts_with('@')
            && first.len() > 1
            && first[1..].bytes().all(|b| b.is_ascii_alphabetic());
        let is_minute = first
            .bytes()
            .all(|b| b.is_ascii_digit() || b"*,-/".contains(&b))
            && w.len() >= 6;
        if !(is_macro && w.len() >= 2 || is_minute) {
            return false;
        }
        entries += 1;
    }
    entries > 0
}

/// The command as cron runs it: up to the first unescaped `%`, with `\%`
/// unescaped.
fn command_text(raw: &str) -> String {
    let mut out = String::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'%') => {
                out.push('%');
                chars.next();
            }
            '%' => break,
            c => out.push(c),
        }
    }
    out.trim().to_owned()
}

/// Parses a crontab. `system` selects the form with a user column. Errors
/// name the file and line.
pub(crate) fn parse(
    file: &str,
    text: &str,
    system: bool,
    default_zone: Tz,
) -> Result<Vec<CrontabEntry>, AuditError> {
    let mut zone = default_zone;
    let mut entries = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let t = raw.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if let Some((name, value)) = is_env_line(t) {
            if name == "CRON_TZ" || name == "TZ" {
                zone = zone_from_name(&value).ok_or_else(|| {
                    AuditError::parse(
                        file,
                        line,
                        format!("{name}={value:?} is not a known IANA time zone"),
                    )
                })?;
            }
            continue;
        }
        let words = words_with_offsets(t);
        let n_sched = if t.starts_with('@') { 1 } else { 5 };
        let n_user = usize::from(system);
        let form = if system {
            "minute hour day-of-month month day-of-week user command"
        } else {
            "minute hour day-of-month month day-of-week command"
        };
        if words.len() < n_sched + n_user + 1 {
            return Err(AuditError::parse(
                file,
                line,
                format!(
                    "bad crontab entry {t:?}: expected {form} (or @macro{} command)",
                    if system { " user" } else { "" }
                ),
            ));
        }
        let sched_text = &t[..words[n_sched - 1].0 + words[n_sched - 1].1.len()];
        let schedule = Schedule::parse(sched_text, true, false)
            .map_err(|e| AuditError::parse(file, line, format!("bad crontab entry: {e}")))?;
        let command = command_text(&t[words[n_sched + n_user].0..]);
        entries.push(CrontabEntry {
            line,
            schedule,
            command,
            zone,
        });
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono_tz::Europe::Berlin;

    #[test]
    fn user_form_with_zone_macros_and_percent() {
        let text = "\
# m h dom mon dow command
MAILTO=ops@example.com
0 6 * * * /opt/a.sh >> /var/log/a.log 2>&1
CRON_TZ=America/New_York
@daily /opt/b.sh
30 2 * * 1-5 /usr/bin/mail -s report ops%body text\\%
@reboot /opt/c.sh
";
        let e = parse("u.cron", text, false, Berlin).unwrap();
        assert_eq!(e.len(), 4);
        assert_eq!((e[0].line, e[0].zone), (3, Berlin));
        assert_eq!(e[0].command, "/opt/a.sh >> /var/log/a.log 2>&1");
        assert_eq!((e[1].line, e[1].zone), (5, chrono_tz::America::New_York));
        assert_eq!(e[1].schedule.expr(), "@daily");
        assert_eq!(e[2].command, "/usr/bin/mail -s report ops");
        assert_eq!(e[2].schedule.expr(), "30 2 * * 1-5");
        assert!(matches!(e[3].schedule, Schedule::Reboot));
    }

    #[test]
    fn system_form_has_a_user_column() {
        let text = "SHELL=/bin/sh\n17 * * * * root cd / && run-parts --report /etc/cron.hourly\n@weekly www-data /opt/w.sh\n";
        assert!(is_system_crontab(Path::new("anything"), text));
        let e = parse("etc/crontab", text, true, Berlin).unwrap();
        assert_eq!(e[0].command, "cd / && run-parts --report /etc/cron.hourly");
        assert_eq!(e[1].command, "/opt/w.sh");
        assert!(is_system_crontab(
            Path::new("/etc/cron.d/backup"),
            "0 1 * * * /opt/x.sh"
        ));
        assert!(!is_system_crontab(
            Path::new("u"),
            "0 1 * * * /opt/x.sh arg\n"
        ));
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let err = parse(
            "bad.cron",
            "# ok\n0 6 * * * /bin/true\n61 6 * * * /bin/true\n",
            false,
            Berlin,
        )
        .unwrap_err();
        assert_eq!(err.line(), Some(3));
        assert!(
            err.to_string().starts_with("bad.cron:3: bad crontab entry"),
            "{err}"
        );
        let err = parse("bad.cron", "0 6 * *\n", false, Berlin).unwrap_err();
        assert_eq!(err.line(), Some(1));
        let err = parse("bad.cron", "CRON_TZ=Mars/Olympus\n", false, Berlin).unwrap_err();
        assert!(err.to_string().contains("Mars/Olympus"), "{err}");
        let err = parse("sys", "0 6 * * * root\n", true, Berlin).unwrap_err();
        assert!(err.to_string().contains("user command"), "{err}");
    }

    #[test]
    fn crontab_detection_by_content() {
        assert!(looks_like_crontab(
            "# x\nPATH=/bin\n*/5 * * * * /bin/true\n@hourly /bin/true\n"
        ));
        assert!(!looks_like_crontab("# only comments\n"));
        assert!(!looks_like_crontab("hello world\n0 1 * * * x\n"));
    }
}

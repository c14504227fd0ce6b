//! What a schedule runs: commands reduced to a comparable entry point, and
//! the heuristics for "guarded" and "locked".
//!
//! Shell text is split into words with `shlex`; nothing is executed or
//! expanded.

/// Programs that only prepare the real command (`cd /srv && ./run.sh`).
const PREAMBLE: &[&str] = &[
    "cd", "sleep", "source", ".", "export", "set", "umask", "test", "[", "true", ":",
];
const SHELLS: &[&str] = &["sh", "bash", "dash", "zsh", "ksh", "ash"];

fn basename(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

fn is_assignment(w: &str) -> bool {
    match w.find('=') {
        Some(i) if i > 0 => {
            w[..i]
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !w.as_bytes()[0].is_ascii_digit()
        }
        _ => false,
    }
}

fn is_interpreter(p: &str) -> bool {
    let p = basename(p);
    let stem = p.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    matches!(
        stem,
        "python" | "node" | "ruby" | "perl" | "php" | "Rscript" | "deno" | "bun"
    )
}

/// Whether a word is a redirection operator; `Some(true)` when its target is
/// the next word (`>`, `2>>`), `Some(false)` when attached (`>/dev/null`,
/// `2>&1`).
fn redirection(w: &str) -> Option<bool> {
    let rest = w.trim_start_matches(|c: char| c.is_ascii_digit());
    let rest = rest.strip_prefix('&').unwrap_or(rest);
    let op_len = if rest.starts_with(">>") || rest.starts_with("<<") {
        2
    } else if rest.starts_with('>') || rest.starts_with('<') {
        1
    } else {
        return None;
    };
    Some(rest.len() == op_len)
}

/// Splits shell text into words; unbalanced quotes fall back to whitespace.
pub(crate) fn shell_words(text: &str) -> Vec<String> {
    shlex::split(text).unwrap_or_else(|| text.split_whitespace().map(str::to_owned).collect())
}

/// Reduces a command (an argv, e.g. a container's `command` + `args`, or the
/// words of a crontab line) to its entry point:
///
/// - redirections (`>> log 2>&1`) are dropped;
/// - of `a && b; c | d` the first command that is not a preamble (`cd`,
///   `sleep`, `export`, …) is kept, and a relative program after `cd DIR` is
///   resolved against `DIR`;
/// - leading `VAR=value` words and wrappers (`env`, `exec`, `nice`, `ionice`,
///   `nohup`, `timeout`, `flock LOCKFILE`, `chronic`, `time`, `setsid`,
///   `sudo -u U`, `stdbuf`) are dropped;
/// - `sh -c TEXT` is replaced by the entry point of TEXT, and a shell or an
///   interpreter (`python3`, `node`, …) running a script by the script
///   (`python -m mod` by `-m mod`).
pub(crate) fn normalize_argv(argv: &[String]) -> Vec<String> {
    normalize_depth(argv, 0)
}

fn normalize_depth(argv: &[String], depth: usize) -> Vec<String> {
    // Split into simple commands at control operators (also when glued to
    // the end of a word, `cd /x;`).
    let mut segments: Vec<Vec<String>> = vec![Vec::new()];
    for w in argv {
        // Subshells and groups (`( cd / && x )`, `{ x; }`) only group.
        let opens = w.len() > 1 && w.starts_with('(');
        let trimmed = w.trim_start_matches('(');
        let (word, sep) = match trimmed {
            "&&" | "||" | ";" | "|" | "&" | "(" | ")" | "{" | "}" | "" => (None, true),
            s if s.len() > 1 && (s.ends_with(';') || s.ends_with(')')) => {
                (Some(s.trim_end_matches([';', ')']).to_owned()), true)
            }
            s => (Some(s.to_owned()), false),
        };
        if opens {
            segments.push(Vec::new());
        }
        if let Some(word) = word {
            segments.last_mut().expect("never empty").push(word);
        }
        if sep {
            segments.push(Vec::new());
        }
    }
    let mut cwd: Option<String> = None;
    for seg in segments {
        let seg = strip_redirections(&seg);
        let seg = strip_wrappers(&seg);
        let Some(prog) = seg.first() else { continue };
        let name = basename(prog);
        if name == "cd" {
            cwd = seg.get(1).cloned();
            continue;
        }
        if PREAMBLE.contains(&name) {
            continue;
        }
        if SHELLS.contains(&name) || is_interpreter(name) {
            let shell = SHELLS.contains(&name);
            let mut i = 1;
            while let Some(w) = seg.get(i) {
                if shell && w.starts_with('-') && !w.starts_with("--") && w.contains('c') {
                    if depth < 4 {
                        if let Some(text) = seg.get(i + 1) {
                            return normalize_depth(&shell_words(text), depth + 1);
                        }
                    }
                    return Vec::new();
                }
                if !shell && w == "-m" {
                    return seg[i..].to_vec();
                }
                if !shell && w == "-c" {
                    return seg[i..].to_vec();
                }
                if !w.starts_with('-') {
                    break;
                }
                i += 1;
            }
            if i >= seg.len() {
                return vec![prog.clone()];
            }
            let mut out = seg[i..].to_vec();
            out[0] = resolve(&out[0], cwd.as_deref());
            return out;
        }
        let mut out = seg.clone();
        out[0] = resolve(&out[0], cwd.as_deref());
        return out;
    }
    Vec::new()
}

fn resolve(prog: &str, cwd: Option<&str>) -> String {
    match cwd {
        Some(dir) if !prog.starts_with('/') && (prog.contains('/') || prog.contains('.')) => {
            let rel = prog.trim_start_matches("./");
            format!("{}/{}", dir.trim_end_matches('/'), rel)
        }
        _ => prog.to_owned(),
    }
}

fn strip_redirections(seg: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut skip_next = false;
    for w in seg {
        if skip_next {
            skip_next = false;
            continue;
        }
        match redirection(w) {
            Some(target_follows) => skip_next = target_follows,
            None => out.push(w.clone()),
        }
    }
    out
}

/// Options taking a value, per wrapper.
fn option_takes_value(wrapper: &str, opt: &str) -> bool {
    match wrapper {
        "nice" => matches!(opt, "-n"),
        "ionice" => matches!(opt, "-c" | "-n" | "-p"),
        "timeout" => matches!(opt, "-s" | "-k" | "--signal" | "--kill-after"),
        "flock" => matches!(
            opt,
            "-w" | "-E" | "--timeout" | "--wait" | "--conflict-exit-code"
        ),
        "sudo" => matches!(
            opt,
            "-u" | "-g" | "-C" | "-D" | "-h" | "-p" | "-r" | "-t" | "-U"
        ),
        "stdbuf" => matches!(opt, "-i" | "-o" | "-e"),
        "env" => matches!(opt, "-u" | "-C" | "-S"),
        _ => false,
    }
}

fn strip_wrappers(seg: &[String]) -> Vec<String> {
    let mut i = 0;
    loop {
        while seg.get(i).is_some_and(|w| is_assignment(w)) {
            i += 1;
        }
        let Some(prog) = seg.get(i) else {
            return Vec::new();
        };
        let name = basename(prog);
        let positional = match name {
            "env" | "exec" | "nice" | "ionice" | "nohup" | "chronic" | "time" | "setsid"
            | "sudo" | "stdbuf" | "unbuffer" | "run-one" => 0,
            "timeout" => 1,
            "flock" | "setlock" => 1,
            _ => return seg[i..].to_vec(),
        };
        i += 1;
        while let Some(w) = seg.get(i) {
            if w == "--" {
                i += 1;
                break;
            }
            if !w.starts_with('-') || w == "-" {
                break;
            }
            if name == "flock" && (w == "-c" || w == "--command") {
                // flock [opts] FILE -c CMD is handled below; an option
                // before FILE is unusual but harmless.
                break;
            }
            i += if option_takes_value(name, w) { 2 } else { 1 };
        }
        if name == "env" {
            continue;
        }
        i += positional;
        if name == "flock" {
            while seg
                .get(i)
                .is_some_and(|w| w.starts_with('-') && w != "-c" && w != "--command")
            {
                i += if option_takes_value(name, &seg[i]) {
                    2
                } else {
                    1
                };
            }
            if seg.get(i).is_some_and(|w| w == "-c" || w == "--command") {
                // Hand the text to the shell branch of `normalize_depth`.
                return match seg.get(i + 1) {
                    Some(text) => vec!["sh".to_owned(), "-c".to_owned(), text.clone()],
                    None => Vec::new(),
                };
            }
        }
    }
}

/// The argv with its program reduced to a base name, for comparing a
/// CronJob's command with a crontab line's.
pub(crate) fn base_argv(argv: &[String]) -> Vec<String> {
    let mut out = argv.to_vec();
    if let Some(p) = out.first_mut() {
        *p = basename(p).to_owned();
    }
    out
}

/// The image without tag or digest: `ghcr.io/acme/blog:1.4@sha256:…` →
/// `ghcr.io/acme/blog`.
pub(crate) fn image_repo(image: &str) -> String {
    let no_digest = image.split('@').next().unwrap_or(image);
    match no_digest.rfind(':') {
        Some(i) if !no_digest[i..].contains('/') => no_digest[..i].to_owned(),
        _ => no_digest.to_owned(),
    }
}

/// Evidence that a job keys its effects by the scheduled time (it is
/// "guarded"), or only by a lock.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GuardSignals {
    /// What makes the job guarded, if anything.
    pub key: Option<String>,
    /// A downward-API reference to `cronjob-scheduled-timestamp` on the Pod,
    /// which is empty: the annotation is set on the Job only.
    pub pod_annotation_ref: bool,
    /// A lock or leader election in the command or environment.
    pub lock: Option<String>,
}

/// Words that mean an idempotency key: a job mentioning one of these in its
/// command, arguments or environment is taken to key its effects.
const KEY_WORDS: &[&str] = &["idempoten", "dedup", "slotgate"];

/// Whether `text` mentions a lock as a word part (`flock`, `--lock-file`,
/// `pg_advisory_lock`, `LOCK_KEY`, `leader`, `mutex`, `singleton`), not
/// inside another word (`block`, `clock`).
fn lock_word(text: &str) -> Option<String> {
    let lower = text.to_ascii_lowercase();
    for w in [
        "flock",
        "leader",
        "mutex",
        "singleton",
        "single-instance",
        "redlock",
    ] {
        if lower.contains(w) {
            return Some(w.to_owned());
        }
    }
    let b = lower.as_bytes();
    let mut from = 0;
    while let Some(i) = lower[from..].find("lock") {
        let at = from + i;
        let before_ok = at == 0 || !b[at - 1].is_ascii_alphabetic();
        let after = lower[at + 4..].chars().next();
        let after_ok = !after.is_some_and(|c| c.is_ascii_alphabetic())
            || lower[at + 4..].starts_with("file")
            || lower[at + 4..].starts_with("ing");
        if before_ok && after_ok {
            return Some("lock".to_owned());
        }
        from = at + 4;
    }
    None
}

impl GuardSignals {
    /// Reads the signals from the texts of a pod template: every command and
    /// argument word and env `name`/`value` (`texts`), and every env
    /// `valueFrom.fieldRef.fieldPath` (`field_paths`).
    ///
    /// Guarded means any of:
    /// - a text mentions `cronjob-scheduled-timestamp` (the program reads the
    ///   annotation from its Job through the API);
    /// - a field path reads the Job name label (`batch.kubernetes.io/job-name`
    ///   or `job-name`): the CronJob controller names each Job after its
    ///   scheduled minute, so the name is a key derived from the scheduled
    ///   time;
    /// - a text mentions an idempotency key (`idempoten…`, `dedup`) or runs
    ///   slotgate, which keys every effect by its planned slot.
    ///
    /// A field path reading `cronjob-scheduled-timestamp` from the Pod's own
    /// annotations does not count (the Pod does not carry it).
    pub(crate) fn read(texts: &[String], field_paths: &[String]) -> GuardSignals {
        let mut g = GuardSignals::default();
        for t in texts {
            let lower = t.to_ascii_lowercase();
            if g.key.is_none() {
                if lower.contains("cronjob-scheduled-timestamp") {
                    g.key = Some("reads batch.kubernetes.io/cronjob-scheduled-timestamp".into());
                } else if let Some(w) = KEY_WORDS.iter().find(|w| lower.contains(*w)) {
                    g.key = Some(format!("mentions `{w}` in {t:?}"));
                }
            }
            if g.lock.is_none() {
                g.lock = lock_word(t).map(|_| format!("`{t}`"));
            }
        }
        for p in field_paths {
            if p.contains("cronjob-scheduled-timestamp") {
                g.pod_annotation_ref = true;
            } else if g.key.is_none()
                && (p.contains("'batch.kubernetes.io/job-name'") || p.contains("'job-name'"))
            {
                g.key = Some("derives the key from the Job name label".into());
            }
        }
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        shell_words(s)
    }

    fn norm(s: &str) -> Vec<String> {
        normalize_argv(&words(s))
    }

    #[test]
    fn wrappers_redirections_and_shells_are_removed() {
        assert_eq!(
            norm("/opt/blog/publish.sh --all >> /var/log/p.log 2>&1"),
            ["/opt/blog/publish.sh", "--all"]
        );
        assert_eq!(
            norm("flock -n /tmp/p.lock /opt/blog/publish.sh --all"),
            ["/opt/blog/publish.sh", "--all"]
        );
        assert_eq!(
            norm("flock -w 10 /tmp/p.lock -c '/opt/blog/publish.sh --all'"),
            ["/opt/blog/publish.sh", "--all"]
        );
        assert_eq!(
            norm("cd /srv/blog && python3 manage.py publish"),
            ["/srv/blog/manage.py", "publish"]
        );
        assert_eq!(
            norm("sleep 30; TZ=UTC nice -n 10 timeout 5m ./run.sh x"),
            ["./run.sh", "x"]
        );
        assert_eq!(
            norm("/bin/sh -c 'exec python -u manage.py publish > /dev/null'"),
            ["manage.py", "publish"]
        );
        assert_eq!(
            norm("bash -lc \"cd /app; ./bin/sync --full\""),
            ["/app/bin/sync", "--full"]
        );
        assert_eq!(
            norm("python -m blog.publish --kind article"),
            ["-m", "blog.publish", "--kind", "article"]
        );
        assert_eq!(
            norm("env -i PATH=/bin /usr/local/bin/report"),
            ["/usr/local/bin/report"]
        );
        assert_eq!(
            norm("sudo -u www-data /usr/bin/php /var/www/artisan schedule:run"),
            ["/var/www/artisan", "schedule:run"]
        );
        assert!(norm("cd /tmp").is_empty());
        assert_eq!(
            norm("test -x /usr/sbin/anacron || ( cd / && run-parts --report /etc/cron.daily )"),
            ["run-parts", "--report", "/etc/cron.daily"]
        );
        assert_eq!(norm("(cd /srv && ./x.sh a)"), ["/srv/x.sh", "a"]);
    }

    #[test]
    fn base_argv_and_image_repo_compare_loosely() {
        assert_eq!(
            base_argv(&words("/srv/blog/manage.py publish")),
            ["manage.py", "publish"]
        );
        assert_eq!(image_repo("ghcr.io/acme/blog:1.4"), "ghcr.io/acme/blog");
        assert_eq!(
            image_repo("registry:5000/acme/blog@sha256:abc"),
            "registry:5000/acme/blog"
        );
        assert_eq!(
            image_repo("registry:5000/acme/blog"),
            "registry:5000/acme/blog"
        );
        assert_eq!(image_repo("busybox"), "busybox");
    }

    #[test]
    fn guard_signals() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let g = GuardSignals::read(
            &s(&[
                "publish",
                "--key-from=batch.kubernetes.io/cronjob-scheduled-timestamp",
            ]),
            &[],
        );
        assert!(g.key.is_some());
        let g = GuardSignals::read(&s(&["IDEMPOTENCY_KEY"]), &[]);
        assert!(g.key.is_some());
        let g = GuardSignals::read(
            &[],
            &s(&["metadata.labels['batch.kubernetes.io/job-name']"]),
        );
        assert!(g.key.is_some());
        let g = GuardSignals::read(
            &s(&["SCHEDULED_AT"]),
            &s(&["metadata.annotations['batch.kubernetes.io/cronjob-scheduled-timestamp']"]),
        );
        assert_eq!(g.key, None);
        assert!(g.pod_annotation_ref);
        let g = GuardSignals::read(&s(&["flock", "-n", "/tmp/x", "run"]), &[]);
        assert_eq!(g.key, None);
        assert!(g.lock.is_some());
        assert!(GuardSignals::read(&s(&["--lock-file=/tmp/x"]), &[])
            .lock
            .is_some());
        assert!(GuardSignals::read(&s(&["PG_ADVISORY_LOCK"]), &[])
            .lock
            .is_some());
        assert_eq!(
            GuardSignals::read(&s(&["--blocklist", "clock", "unlocked"]), &[]),
            GuardSignals::default()
        );
    }
}

//! `planner audit` against the fixtures in `tests/fixtures/audit/`:
//! `bad/` covers every rule, `good/` produces nothing, `malformed/` fails
//! with the file and line, and `example/` is the README's worked example.
//!
//! Cargo runs integration tests in the package directory, so the paths
//! below are relative to `shared/` and appear as given in the findings.

use chrono::{TimeZone, Utc};
use slotgate_audit::{
    audit_paths, machine_zone, AuditError, AuditOptions, AuditReport, Rule, Severity,
};
use std::collections::BTreeSet;
use std::path::PathBuf;

const FIXTURES: &str = "tests/fixtures/audit";

/// A fixed `now` (a Monday) and zone, so DST and herd results never move.
fn opts() -> AuditOptions {
    AuditOptions {
        now: Utc.with_ymd_and_hms(2026, 6, 1, 0, 0, 0).unwrap(),
        local_zone: chrono_tz::Europe::Berlin,
        history: None,
    }
}

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(format!("{FIXTURES}/{rel}"))
}

fn audit(rels: &[&str]) -> AuditReport {
    let paths: Vec<PathBuf> = rels.iter().map(|r| fixture(r)).collect();
    audit_paths(&paths, &opts()).unwrap_or_else(|e| panic!("audit failed: {e}"))
}

fn audit_err(rel: &str) -> AuditError {
    match audit_paths(&[fixture(rel)], &opts()) {
        Ok(r) => panic!("{rel} was accepted: {:?}", r.findings),
        Err(e) => e,
    }
}

/// `(rule, severity, file, line, object)` with the fixture prefix removed.
fn rows(report: &AuditReport, prefix: &str) -> Vec<(String, String, String, usize, String)> {
    let strip = |s: &str| s.strip_prefix(prefix).unwrap_or(s).to_owned();
    report
        .findings
        .iter()
        .map(|f| {
            (
                f.rule.id().to_owned(),
                f.severity.as_str().to_owned(),
                strip(&f.file),
                f.line,
                strip(&f.object),
            )
        })
        .collect()
}

fn find<'a>(
    report: &'a AuditReport,
    rule: &str,
    object_suffix: &str,
) -> &'a slotgate_audit::Finding {
    report
        .findings
        .iter()
        .find(|f| f.rule.id() == rule && f.object.ends_with(object_suffix))
        .unwrap_or_else(|| panic!("no {rule} finding for {object_suffix}"))
}

#[test]
fn bad_fixtures_produce_exactly_these_findings() {
    let report = audit(&["bad"]);
    let expected: Vec<(&str, &str, &str, usize, &str)> = vec![
        ("dst-window", "high", "cron.d/feeds", 3, "cron.d/feeds:3"),
        (
            "shared-entry-point",
            "high",
            "crontab/blog.crontab",
            6,
            "crontab/blog.crontab:6",
        ),
        (
            "dst-window",
            "high",
            "crontab/blog.crontab",
            6,
            "crontab/blog.crontab:6",
        ),
        (
            "shared-entry-point",
            "high",
            "crontab/blog.crontab",
            7,
            "crontab/blog.crontab:7",
        ),
        (
            "shared-entry-point",
            "high",
            "crontab/blog.crontab",
            8,
            "crontab/blog.crontab:8",
        ),
        (
            "shared-entry-point",
            "high",
            "crontab/blog.crontab",
            11,
            "crontab/blog.crontab:11",
        ),
        (
            "thundering-herd",
            "medium",
            "crontab/blog.crontab",
            14,
            "crontab/blog.crontab:14",
        ),
        (
            "thundering-herd",
            "medium",
            "crontab/blog.crontab",
            15,
            "crontab/blog.crontab:15",
        ),
        (
            "thundering-herd",
            "medium",
            "crontab/blog.crontab",
            16,
            "crontab/blog.crontab:16",
        ),
        (
            "thundering-herd",
            "medium",
            "crontab/blog.crontab",
            17,
            "crontab/blog.crontab:17",
        ),
        (
            "thundering-herd",
            "medium",
            "k8s/cleanup.yaml",
            7,
            "ops/cleanup",
        ),
        (
            "concurrency-allow",
            "high",
            "k8s/cleanup.yaml",
            9,
            "ops/cleanup",
        ),
        (
            "serial-duplicates",
            "medium",
            "k8s/cleanup.yaml",
            9,
            "ops/cleanup",
        ),
        (
            "concurrency-allow",
            "high",
            "k8s/publish.yaml",
            15,
            "blog/publish-articles",
        ),
        (
            "missing-deadline",
            "medium",
            "k8s/publish.yaml",
            15,
            "blog/publish-articles",
        ),
        (
            "missing-timezone",
            "low",
            "k8s/publish.yaml",
            15,
            "blog/publish-articles",
        ),
        (
            "retries-repeat-effects",
            "medium",
            "k8s/publish.yaml",
            18,
            "blog/publish-articles",
        ),
        (
            "shared-entry-point",
            "high",
            "k8s/publish.yaml",
            25,
            "blog/publish-articles",
        ),
        (
            "dst-window",
            "high",
            "k8s/publish.yaml",
            37,
            "blog/publish-articles-eu",
        ),
        (
            "serial-duplicates",
            "medium",
            "k8s/publish.yaml",
            39,
            "blog/publish-articles-eu",
        ),
        (
            "short-deadline",
            "high",
            "k8s/publish.yaml",
            40,
            "blog/publish-articles-eu",
        ),
        (
            "retries-repeat-effects",
            "medium",
            "k8s/publish.yaml",
            46,
            "blog/publish-articles-eu",
        ),
        (
            "shared-entry-point",
            "high",
            "k8s/publish.yaml",
            50,
            "blog/publish-articles-eu",
        ),
        (
            "thundering-herd",
            "medium",
            "k8s/reports.yaml",
            11,
            "analytics/report-sales",
        ),
        (
            "thundering-herd",
            "medium",
            "k8s/reports.yaml",
            36,
            "analytics/report-traffic",
        ),
        (
            "thundering-herd",
            "medium",
            "k8s/reports.yaml",
            61,
            "analytics/report-billing",
        ),
        (
            "slotgate-shared-second",
            "medium",
            "slotgate.toml",
            7,
            "article",
        ),
        (
            "slotgate-shared-second",
            "medium",
            "slotgate.toml",
            11,
            "video",
        ),
        (
            "slotgate-cap-above-slots",
            "low",
            "slotgate.toml",
            23,
            "newsletter",
        ),
        (
            "slotgate-deadline-below-jitter",
            "medium",
            "slotgate.toml",
            24,
            "newsletter",
        ),
        (
            "slotgate-calendar-dark",
            "medium",
            "slotgate.toml",
            31,
            "holiday",
        ),
    ];
    let expected: Vec<(String, String, String, usize, String)> = expected
        .into_iter()
        .map(|(r, s, f, l, o)| (r.into(), s.into(), f.into(), l, o.into()))
        .collect();
    assert_eq!(rows(&report, &format!("{FIXTURES}/bad/")), expected);
    assert_eq!(
        (
            report.summary.high,
            report.summary.medium,
            report.summary.low
        ),
        (12, 17, 2)
    );
    assert_eq!(report.exit_code(), 1);
}

#[test]
fn every_rule_is_covered_by_the_bad_fixtures() {
    let report = audit(&["bad"]);
    let found: BTreeSet<Rule> = report.findings.iter().map(|f| f.rule).collect();
    // `slotgate-moves-run-slot` compares with Postgres, which fixtures do
    // not have: planner/tests/cli.rs and the unit test in slotgate.rs.
    let all: BTreeSet<Rule> = Rule::ALL
        .into_iter()
        .filter(|r| *r != Rule::SlotgateMovesRunSlot)
        .collect();
    assert_eq!(found, all);
    for f in &report.findings {
        assert_eq!(f.severity, f.rule.severity(), "{f:?}");
        assert!(f.message.ends_with('.') && f.fix.ends_with('.'), "{f:?}");
        assert!(!f.message.is_empty() && !f.fix.is_empty());
    }
}

#[test]
fn good_fixtures_produce_no_findings() {
    let report = audit(&["good"]);
    assert!(report.findings.is_empty(), "{:#?}", report.findings);
    assert_eq!(report.exit_code(), 0);
    assert_eq!(report.render_table(), "no findings\n");
    // Also file by file, in any order.
    let report = audit(&[
        "good/slotgate.toml",
        "good/etc/crontab",
        "good/k8s/jobs.yaml",
        "good/crontab/ops.crontab",
    ]);
    assert_eq!(
        report.summary.high + report.summary.medium + report.summary.low,
        0
    );
}

#[test]
fn a_file_named_twice_counts_once() {
    // Directly and through its directory: otherwise it would share every
    // entry point with itself.
    let once = audit(&["bad/crontab/blog.crontab"]);
    let twice = audit(&["bad/crontab", "bad/crontab/blog.crontab"]);
    assert_eq!(once.findings.len(), 8, "{:#?}", once.findings);
    assert_eq!(twice, once);
}

#[test]
fn findings_name_what_goes_wrong() {
    let report = audit(&["bad"]);
    let m = |rule, obj| find(&report, rule, obj).message.clone();

    let feeds = m("dst-window", "cron.d/feeds:3");
    assert!(
        feeds.contains("America/New_York")
            && feeds.contains("01:30 on 2026-11-01")
            && feeds.contains("occurs twice"),
        "{feeds}"
    );
    assert!(!feeds.contains("does not exist"), "{feeds}");

    let eu = m("dst-window", "blog/publish-articles-eu");
    assert!(eu.contains("Europe/Berlin"), "{eu}");
    assert!(
        eu.contains("02:30 on 2026-10-25, which occurs twice"),
        "{eu}"
    );
    assert!(
        eu.contains("02:30 on 2027-03-28, which does not exist"),
        "{eu}"
    );

    let serial = m("serial-duplicates", "blog/publish-articles-eu");
    assert!(serial.contains("concurrencyPolicy: Forbid"), "{serial}");
    assert!(
        serial.contains("only the Job carries that annotation"),
        "{serial}"
    );
    let lock = m("serial-duplicates", "ops/cleanup");
    assert!(lock.contains("a lock (`--redis-lock=cleanup`)"), "{lock}");
    assert!(find(&report, "serial-duplicates", "ops/cleanup")
        .fix
        .contains("cronjob-scheduled-timestamp"));

    assert!(m("retries-repeat-effects", "blog/publish-articles")
        .contains("backoffLimit (absent, so 6)"));
    assert!(m("retries-repeat-effects", "blog/publish-articles-eu")
        .starts_with("restartPolicy: OnFailure"));
    assert!(m("short-deadline", "blog/publish-articles-eu").contains("startingDeadlineSeconds: 5"));
    assert!(
        m("concurrency-allow", "blog/publish-articles").contains("absent (it defaults to Allow)")
    );
    assert!(m("concurrency-allow", "ops/cleanup").contains("concurrencyPolicy is Allow"));

    let old = m("shared-entry-point", "crontab/blog.crontab:11");
    assert!(
        old.contains("/srv/blog/manage.py publish --kind article"),
        "{old}"
    );
    assert!(
        old.contains("blog/publish-articles and blog/publish-articles-eu"),
        "{old}"
    );
    let k8s = m("shared-entry-point", "blog/publish-articles");
    assert!(k8s.contains("in image ghcr.io/acme/blog"), "{k8s}");
    let reboot = m("shared-entry-point", "crontab/blog.crontab:8");
    assert!(
        reboot.contains("blog.crontab:6 and") && reboot.contains("blog.crontab:7"),
        "{reboot}"
    );

    let herd = m("thundering-herd", "crontab/blog.crontab:14");
    assert!(
        herd.starts_with("4 schedules start at 08:00 Europe/Berlin on 2026-06-01"),
        "{herd}"
    );
    let reports = m("thundering-herd", "analytics/report-sales");
    assert!(
        reports.starts_with("4 schedules start at 06:00 UTC on 2026-06-01"),
        "{reports}"
    );
    assert!(reports.contains("ops/cleanup"), "{reports}");

    let shared = m("slotgate-shared-second", "video");
    assert!(
        shared.contains("2026-06-01T04:00:00Z (12:00:00 Asia/Shanghai) with article"),
        "{shared}"
    );
    assert!(m("slotgate-deadline-below-jitter", "newsletter")
        .contains("starting_deadline (5m) is shorter than jitter (15m)"));
    assert!(m("slotgate-cap-above-slots", "newsletter")
        .contains("daily_cap 5 is larger than the 2 slot(s)"));
    assert!(m("slotgate-calendar-dark", "holiday")
        .contains("no slot that may publish in the 14 days from 2026-06-01"));
}

#[test]
fn json_has_the_shape_of_design() {
    let report = audit(&["bad/k8s/publish.yaml"]);
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    let top: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(top, ["findings", "summary"]);
    let summary = json["summary"].as_object().unwrap();
    let keys: BTreeSet<&str> = summary.keys().map(String::as_str).collect();
    assert_eq!(keys, BTreeSet::from(["high", "medium", "low"]));
    assert_eq!(json["summary"]["high"], 5);
    assert_eq!(json["summary"]["medium"], 4);
    assert_eq!(json["summary"]["low"], 1);
    let findings = json["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 10);
    for f in findings {
        let keys: BTreeSet<&str> = f.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            BTreeSet::from(["severity", "rule", "file", "line", "object", "message", "fix"])
        );
        assert!(["high", "medium", "low"].contains(&f["severity"].as_str().unwrap()));
        assert!(f["line"].as_u64().unwrap() >= 1);
        assert_eq!(f["file"], "tests/fixtures/audit/bad/k8s/publish.yaml");
    }
    // Field order as in DESIGN.
    let first = serde_json::to_string(&report.findings[0]).unwrap();
    let pos = |k: &str| first.find(&format!("\"{k}\":")).unwrap();
    let order = [
        "severity", "rule", "file", "line", "object", "message", "fix",
    ]
    .map(pos);
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{first}");
    assert_eq!(findings[0]["rule"], "concurrency-allow");
    assert_eq!(findings[0]["object"], "blog/publish-articles");
    assert_eq!(findings[0]["line"], 15);
}

#[test]
fn malformed_inputs_name_file_and_line() {
    let cases: [(&str, usize, &str); 5] = [
        ("malformed/broken-indent.yaml", 10, "invalid YAML"),
        (
            "malformed/bad-schedule.yaml",
            7,
            "bad schedule \"0 25 * * *\"",
        ),
        (
            "malformed/broken.crontab",
            3,
            "bad crontab entry \"0 9 * * /usr/local/bin/missing-a-field\"",
        ),
        (
            "malformed/bad-zone.crontab",
            2,
            "not a known IANA time zone",
        ),
        ("malformed/bad-config.toml", 4, "field `slots[1]`"),
    ];
    for (rel, line, text) in cases {
        let e = audit_err(rel);
        let file = format!("{FIXTURES}/{rel}");
        assert_eq!(e.file(), file);
        assert_eq!(e.line(), Some(line), "{e}");
        let shown = e.to_string();
        assert!(shown.starts_with(&format!("{file}:{line}: ")), "{shown}");
        assert!(shown.contains(text), "{shown}");
    }
    // A directory stops at its first malformed file.
    let e = audit_paths(&[fixture("malformed")], &opts()).unwrap_err();
    assert_eq!(e.file(), format!("{FIXTURES}/malformed/bad-config.toml"));
}

#[test]
fn unreadable_inputs_are_errors() {
    let e = audit_paths(&[fixture("does-not-exist.yaml")], &opts()).unwrap_err();
    assert!(matches!(e, AuditError::Read { .. }));
    assert_eq!(e.line(), None);
    assert!(
        e.to_string()
            .starts_with(&format!("{FIXTURES}/does-not-exist.yaml: cannot read")),
        "{e}"
    );

    let dir = std::env::temp_dir().join(format!("slotgate-audit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("blob");
    std::fs::write(&bin, b"0 1 * * * /bin/true\n\xff\xfe\n").unwrap();
    let e = audit_paths(std::slice::from_ref(&bin), &opts()).unwrap_err();
    assert_eq!(e.line(), Some(2));
    assert!(e.to_string().contains("not UTF-8"), "{e}");
    // Inside a directory, non-text files are skipped.
    let r = audit_paths(std::slice::from_ref(&dir), &opts()).unwrap();
    assert!(r.findings.is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_named_file_of_unknown_type_is_read_as_a_crontab() {
    // In a directory scan README.md is skipped (see the bad fixtures); named
    // explicitly it is parsed, and its first line is not a cron entry.
    let e = audit_err("bad/README.md");
    assert_eq!(e.line(), Some(1));
    assert!(e.to_string().contains("bad crontab entry"), "{e}");
}

#[test]
fn crontabs_without_a_zone_use_the_machine_zone() {
    let path = [fixture("bad/crontab/blog.crontab")];
    let berlin = audit_paths(&path, &opts()).unwrap();
    assert!(berlin.findings.iter().any(|f| f.rule == Rule::DstWindow));
    let utc = audit_paths(
        &path,
        &AuditOptions {
            local_zone: chrono_tz::Tz::UTC,
            ..opts()
        },
    )
    .unwrap();
    assert!(!utc.findings.iter().any(|f| f.rule == Rule::DstWindow));
    // The herd is counted in the zone too, and is there either way.
    assert_eq!(
        utc.findings
            .iter()
            .filter(|f| f.rule == Rule::ThunderingHerd)
            .count(),
        4
    );
}

#[test]
fn dst_transitions_are_looked_for_in_the_next_twelve_months_only() {
    let path = [fixture("bad/cron.d/feeds")];
    // 2026-11-02: New York's fall-back day has just passed and the next one
    // (2027-11-07) is more than 12 months away; 01:30 is not in the spring gap.
    let after = AuditOptions {
        now: Utc.with_ymd_and_hms(2026, 11, 2, 0, 0, 0).unwrap(),
        ..opts()
    };
    assert!(audit_paths(&path, &after).unwrap().findings.is_empty());
    let before = AuditOptions {
        now: Utc.with_ymd_and_hms(2026, 10, 31, 0, 0, 0).unwrap(),
        ..opts()
    };
    let r = audit_paths(&path, &before).unwrap();
    assert_eq!(r.findings.len(), 1);
    assert_eq!(r.findings[0].rule, Rule::DstWindow);
    assert_eq!(r.findings[0].severity, Severity::High);
}

#[test]
fn a_herd_needs_three_starts_in_one_minute() {
    let dir = std::env::temp_dir().join(format!("slotgate-audit-herd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let two = dir.join("two.crontab");
    std::fs::write(
        &two,
        "CRON_TZ=Etc/UTC\n0 5 * * * /a\n0 5 * * * /b\n0 6 * * * /c\n",
    )
    .unwrap();
    let r = audit_paths(std::slice::from_ref(&two), &opts()).unwrap();
    assert!(r.findings.is_empty(), "{:?}", r.findings);
    // Monthly on the 1st joins two daily jobs on the 1st only.
    let three = dir.join("three.crontab");
    std::fs::write(
        &three,
        "CRON_TZ=Etc/UTC\n0 5 * * * /a\n0 5 * * * /b\n0 5 1 * * /c\n",
    )
    .unwrap();
    let r = audit_paths(std::slice::from_ref(&three), &opts()).unwrap();
    let lines: Vec<usize> = r.findings.iter().map(|f| f.line).collect();
    assert_eq!(lines, [2, 3, 4]);
    assert!(r.findings.iter().all(|f| f.rule == Rule::ThunderingHerd));
    assert!(
        r.findings[0]
            .message
            .starts_with("3 schedules start at 05:00 UTC on 2026-06-01"),
        "{}",
        r.findings[0].message
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn readme_example_output_is_current() {
    let opts = AuditOptions {
        now: Utc.with_ymd_and_hms(2026, 9, 25, 0, 0, 0).unwrap(),
        local_zone: chrono_tz::Europe::Berlin,
        history: None,
    };
    let report = audit_paths(&[fixture("example/send-digest.yaml")], &opts).unwrap();
    let table = std::fs::read_to_string(fixture("example/send-digest.expected.txt")).unwrap();
    let json = std::fs::read_to_string(fixture("example/send-digest.expected.json")).unwrap();
    assert_eq!(report.render_table(), table);
    assert_eq!(report.to_json(), json.trim_end());
    let rules: Vec<&str> = report.findings.iter().map(|f| f.rule.id()).collect();
    assert_eq!(
        rules,
        [
            "missing-deadline",
            "dst-window",
            "serial-duplicates",
            "retries-repeat-effects"
        ]
    );
    assert_eq!(report.exit_code(), 1);
}

#[test]
fn machine_zone_reads_tz() {
    // The only test that touches TZ; nothing else in this binary reads it.
    let saved = std::env::var_os("TZ");
    std::env::set_var("TZ", "America/Chicago");
    assert_eq!(machine_zone(), chrono_tz::America::Chicago);
    std::env::set_var("TZ", ":Asia/Tokyo");
    assert_eq!(machine_zone(), chrono_tz::Asia::Tokyo);
    match saved {
        Some(v) => std::env::set_var("TZ", v),
        None => std::env::remove_var("TZ"),
    }
}

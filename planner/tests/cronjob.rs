//! `planner trigger --from-job-name`: a Kubernetes CronJob's Job name
//! (`<cronjob>-<scheduled Unix minute>`) names its slot, in the kind's zone
//! and across DST; the gate lets one run of a minute through; `--wait` makes
//! the process's exit status the slot's outcome; the example manifest in
//! `deploy/k8s/` passes `planner audit`.
//!
//! The real `planner` binary against real Postgres and Redis; deliveries are
//! handled by an in-process worker (the library's runtime, the one the
//! `worker` binary runs). Every slot is on an explicit past day, or in the
//! current minute computed once, so nothing depends on the time of day.

use crate::common;
use chrono::{DateTime, NaiveDate, TimeZone, Utc};
use serde_json::Value;
use std::path::Path;
use std::process::Output;
use testkit::cms::{Cms, Reply};
use testkit::count;
use testkit::stack::{Bins, Stack};
use tokio_util::sync::CancellationToken;

const PLANNER: &str = env!("CARGO_BIN_EXE_planner");

/// Kinds on explicit days. `starting_deadline` of 7 days (the most a config
/// accepts): tests that must see the gate rather than the deadline use
/// yesterday's 09:00 UTC slot ([`yesterday_0900`]), 15 to 39 hours ago at any
/// time of day.
const KINDS: &str = r#"
[[kinds]]
name = "utc"
timezone = "UTC"
slots = ["09:00", "17:30"]
jitter = "0"
daily_cap = 10
starting_deadline = "7d"

[[kinds]]
name = "berlin"
timezone = "Europe/Berlin"
slots = ["02:30", "09:00"]
jitter = "0"
daily_cap = 10
starting_deadline = "7d"

[[kinds]]
name = "tokyo"
timezone = "Asia/Tokyo"
slots = ["08:00"]
jitter = "20m"
daily_cap = 10
starting_deadline = "7d"
"#;

/// The shared stack of the planner's tests.
struct Cron(Stack);

impl std::ops::Deref for Cron {
    type Target = Stack;
    fn deref(&self) -> &Stack {
        &self.0
    }
}

impl Cron {
    async fn new(config: &str) -> Cron {
        Cron(
            Stack::builder(Bins::beside(PLANNER))
                .tag("cronjob")
                .build(config)
                .await,
        )
    }

    /// `planner trigger --kind K --from-job-name NAME --json [extra]`: exit
    /// status and the printed object.
    async fn trigger_job(&self, kind: &str, name: &str, extra: &[&str]) -> (i32, Value) {
        let args = [
            &["trigger", "--kind", kind, "--from-job-name", name, "--json"][..],
            extra,
        ]
        .concat();
        json_of(self.planner_output(&args, &[]).await)
    }

    async fn add_drafts(&self, kind: &str, n: usize) {
        for i in 0..n {
            let out = self
                .planner_output(
                    &["drafts", "add", "--kind", kind, "--title", &format!("d{i}")],
                    &[],
                )
                .await;
            assert!(out.status.success(), "{}", stderr(&out));
        }
    }

    /// `(caller, outcome, reason)` of every execution of `slot`, in order.
    async fn executions(&self, slot: &str) -> Vec<(String, String, Option<String>)> {
        sqlx::query_as(
            "SELECT caller, outcome, reason FROM execution WHERE slot_key = $1 ORDER BY id",
        )
        .bind(slot)
        .fetch_all(&self.db().pool)
        .await
        .unwrap()
    }

    /// `(slot, caller)` of every entry in the ready stream.
    async fn stream(&self) -> Vec<(String, String)> {
        let mut c = self.redis.conn().await;
        let entries: Vec<(String, Vec<String>)> = redis::cmd("XRANGE")
            .arg(
                slotgate::queue::KeySpace::new(self.redis.prefix.as_str())
                    .part(0)
                    .ready(),
            )
            .arg("-")
            .arg("+")
            .query_async(&mut c)
            .await
            .unwrap();
        entries
            .into_iter()
            .map(|(_, fields)| {
                let get = |k: &str| {
                    fields
                        .chunks(2)
                        .find(|f| f[0] == k)
                        .map(|f| f[1].clone())
                        .unwrap_or_default()
                };
                (get("slot"), get("caller"))
            })
            .collect()
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json_of(out: Output) -> (i32, Value) {
    let code = out.status.code().expect("exited");
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "exit {code}: stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        )
    });
    (code, v)
}

/// The Job name the CronJob controller gives a run scheduled at `at`.
fn job(cronjob: &str, at: DateTime<Utc>) -> String {
    assert_eq!(at.timestamp() % 60, 0, "a scheduled time is a whole minute");
    format!("{cronjob}-{}", at.timestamp() / 60)
}

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_names_name_their_slots_in_utc_across_dst_and_now() {
    // The current minute, computed once: a kind whose one slot is this
    // minute (in UTC), so the "present" case holds at any time of day.
    let now = DateTime::<Utc>::from_timestamp(Utc::now().timestamp() / 60 * 60, 0).unwrap();
    let present = format!(
        "{KINDS}\n[[kinds]]\nname = \"present\"\ntimezone = \"UTC\"\nslots = [\"{}\"]\njitter = \"0\"\ndaily_cap = 1\nstarting_deadline = \"1h\"\n",
        now.format("%H:%M")
    );
    let s = Cron::new(&present).await;
    // The instants are worked out by hand from each zone's rules, not by the
    // code under test.
    let present_key = format!("present:{}:1", now.date_naive());
    let cases: Vec<(&str, DateTime<Utc>, &str)> = vec![
        ("utc", utc(2026, 1, 15, 9, 0), "utc:2026-01-15:1"),
        ("utc", utc(2026, 1, 15, 17, 30), "utc:2026-01-15:2"),
        // Berlin, spring forward on 2026-03-29 (02:00 CET -> 03:00 CEST):
        // 09:00 is 08:00Z the day before and 07:00Z the day after; 02:30 does
        // not exist that day and runs at 03:00 CEST = 01:00Z.
        ("berlin", utc(2026, 3, 28, 8, 0), "berlin:2026-03-28:2"),
        ("berlin", utc(2026, 3, 29, 1, 0), "berlin:2026-03-29:1"),
        ("berlin", utc(2026, 3, 30, 7, 0), "berlin:2026-03-30:2"),
        // Fall back on 2026-10-25 (03:00 CEST -> 02:00 CET): 02:30 occurs
        // twice and runs at its first occurrence, 02:30 CEST = 00:30Z.
        ("berlin", utc(2026, 10, 24, 7, 0), "berlin:2026-10-24:2"),
        ("berlin", utc(2026, 10, 25, 0, 30), "berlin:2026-10-25:1"),
        ("berlin", utc(2026, 10, 26, 8, 0), "berlin:2026-10-26:2"),
        // 08:00 in Tokyo is 23:00Z the previous UTC day; jitter does not
        // move the nominal minute.
        ("tokyo", utc(2026, 9, 24, 23, 0), "tokyo:2026-09-25:1"),
        ("present", now, present_key.as_str()),
    ];
    for (kind, at, want) in &cases {
        let name = job(&format!("publish-{kind}"), *at);
        let (code, v) = s.trigger_job(kind, &name, &[]).await;
        assert_eq!(code, 0, "{name}: {v}");
        assert_eq!(v["slot"], *want, "{name}");
        assert_eq!(v["caller"], "cronjob", "{name}");
        assert_eq!(v["job_name"], name.as_str());
        assert!(
            v["entry_id"].as_str().is_some_and(|e| e.contains('-')),
            "{v}"
        );
    }
    // The environment variable the downward API sets works like the flag.
    let name = job("publish-utc", utc(2026, 1, 16, 17, 30));
    let out = s
        .planner_output(
            &["trigger", "--kind", "utc", "--json"],
            &[("SLOTGATE_JOB_NAME", name.as_str())],
        )
        .await;
    let (code, v) = json_of(out);
    assert_eq!((code, v["slot"].as_str()), (0, Some("utc:2026-01-16:2")));

    // Each was planned (under its usual key) and delivered once, as cronjob.
    let mut want: Vec<(String, String)> = cases
        .iter()
        .map(|(_, _, k)| (k.to_string(), "cronjob".to_owned()))
        .chain([("utc:2026-01-16:2".to_owned(), "cronjob".to_owned())])
        .collect();
    let mut got = s.stream().await;
    want.sort();
    got.sort();
    assert_eq!(got, want);
    assert_eq!(
        count(&s.db().pool, "SELECT count(*) FROM planned_slot").await,
        want.len() as i64
    );
    let nominal: DateTime<Utc> = sqlx::query_scalar(
        "SELECT nominal_at FROM planned_slot WHERE kind = 'berlin' AND day = '2026-03-29' AND slot = 1",
    )
    .fetch_one(&s.db().pool)
    .await
    .unwrap();
    assert_eq!(
        nominal,
        utc(2026, 3, 29, 1, 0),
        "planned as the planner plans it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_match_no_slot_exit_2_naming_the_slots_near_them() {
    let s = Cron::new(KINDS).await;
    // One minute after the 03:00 CEST run of the spring-forward day.
    let off = job("publish-berlin", utc(2026, 3, 29, 1, 1));
    let out = s
        .planner_output(
            &["trigger", "--kind", "berlin", "--from-job-name", &off],
            &[],
        )
        .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for needle in [
        off.as_str(),
        "no slot",
        "2026-03-29 03:01:00 CEST",
        "berlin:2026-03-29:1 at 2026-03-29 03:00:00 CEST",
        "Job suffix -29579100",
        "berlin:2026-03-29:2 at 2026-03-29 09:00:00 CEST",
        "berlin:2026-03-28:2",
    ] {
        assert!(err.contains(needle), "stderr names {needle:?}: {err}");
    }
    // The second 02:30 of the fall-back day (02:30 CET = 01:30Z) is not the
    // slot's time: it runs at the first.
    let second = job("publish-berlin", utc(2026, 10, 25, 1, 30));
    let out = s
        .planner_output(
            &["trigger", "--kind", "berlin", "--from-job-name", &second],
            &[],
        )
        .await;
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("berlin:2026-10-25:1 at 2026-10-25 02:30:00 CEST")
            && err.contains("Job suffix -29881470"),
        "{err}"
    );
    // Names that are not a CronJob's, an unknown kind, and both addresses.
    for (args, needle) in [
        (
            vec![
                "--kind",
                "utc",
                "--from-job-name",
                "publish-utc-manual-x7k2q",
            ],
            "does not end in -<Unix minutes>",
        ),
        (
            vec!["--kind", "utc", "--from-job-name", "29462940"],
            "does not end in -<Unix minutes>",
        ),
        (
            vec!["--kind", "utc", "--from-job-name", "x-99999999999999"],
            "not a minute between 1970 and 9999",
        ),
        (
            vec!["--kind", "nope", "--from-job-name", "publish-utc-29462940"],
            "unknown kind \"nope\"",
        ),
        (
            vec![
                "--kind",
                "utc",
                "--from-job-name",
                "publish-utc-29462940",
                "--day",
                "2026-01-15",
                "--slot",
                "1",
            ],
            "cannot be used with",
        ),
        (vec!["--kind", "utc"], "required"),
    ] {
        let out = s
            .planner_output(&[&["trigger"][..], &args].concat(), &[])
            .await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
    assert!(s.stream().await.is_empty(), "nothing was delivered");
    assert_eq!(
        count(&s.db().pool, "SELECT count(*) FROM planned_slot").await,
        0
    );
}

/// Yesterday's 09:00 UTC (of [`testkit::zone::process_start`]'s day):
/// always past, never past a 7-day deadline.
fn yesterday_0900() -> DateTime<Utc> {
    let d = testkit::zone::process_start().date_naive() - chrono::Days::new(1);
    d.and_hms_opt(9, 0, 0).unwrap().and_utc()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_job_name_twice_publishes_once() {
    let s = Cron::new(KINDS).await;
    s.add_drafts("utc", 2).await;
    let cancel = CancellationToken::new();
    let worker = common::start_worker(&s, &cancel);
    let name = job("publish-utc", yesterday_0900());
    let (code, first) = s.trigger_job("utc", &name, &["--wait"]).await;
    assert_eq!(code, 0, "{first}");
    assert_eq!(first["outcome"]["wait"], "settled", "{first}");
    assert_eq!(first["outcome"]["slot"]["state"], "published");
    assert_eq!(first["outcome"]["delivery"]["outcome"], "published");
    // A second Job for the same minute (a retried pod, `kubectl create job
    // --from`): the gate blocks it; the slot's outcome is still published.
    let (code, second) = s.trigger_job("utc", &name, &["--wait"]).await;
    assert_eq!(code, 0, "{second}");
    assert_eq!(second["slot"], first["slot"]);
    assert_ne!(second["entry_id"], first["entry_id"]);
    assert_eq!(second["outcome"]["slot"]["state"], "published");
    assert_eq!(second["outcome"]["delivery"]["outcome"], "skipped");
    assert_eq!(second["outcome"]["delivery"]["reason"], "slot_taken");
    cancel.cancel();
    worker.await.unwrap();
    assert_eq!(
        s.executions(&format!("utc:{}:1", yesterday_0900().date_naive()))
            .await,
        vec![
            ("cronjob".into(), "published".into(), None),
            (
                "cronjob".into(),
                "skipped".into(),
                Some("slot_taken".into())
            ),
        ]
    );
    assert_eq!(
        count(
            &s.db().pool,
            "SELECT count(*) FROM draft WHERE status = 'published'"
        )
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_cronjob_run_misses_its_deadline_a_manual_run_does_not() {
    let s = Cron::new(
        r#"
[[kinds]]
name = "late"
timezone = "UTC"
slots = ["09:00", "10:00"]
jitter = "0"
daily_cap = 10
starting_deadline = "1h"
"#,
    )
    .await;
    s.add_drafts("late", 2).await;
    let cancel = CancellationToken::new();
    let worker = common::start_worker(&s, &cancel);
    // A CronJob run of a day long past: the kind's deadline applies.
    let (code, v) = s
        .trigger_job(
            "late",
            &job("publish-late", utc(2026, 1, 15, 9, 0)),
            &["--wait"],
        )
        .await;
    assert_eq!(code, 0, "skipped is not a failure: {v}");
    assert_eq!(v["outcome"]["slot"]["state"], "skipped", "{v}");
    assert_eq!(v["outcome"]["slot"]["reason"], "missed_deadline", "{v}");
    // The operator's run of the other slot of that day is exempt.
    let out = s
        .planner_output(
            &[
                "trigger",
                "--kind",
                "late",
                "--day",
                "2026-01-15",
                "--slot",
                "2",
                "--wait",
                "--json",
            ],
            &[],
        )
        .await;
    let (code, v) = json_of(out);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["caller"], "manual");
    assert_eq!(v["outcome"]["slot"]["state"], "published", "{v}");
    cancel.cancel();
    worker.await.unwrap();
    assert_eq!(
        s.executions("late:2026-01-15:1").await,
        vec![(
            "cronjob".into(),
            "skipped".into(),
            Some("missed_deadline".into())
        )]
    );
    assert_eq!(
        s.executions("late:2026-01-15:2").await,
        vec![("manual".into(), "published".into(), None)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_exits_1_when_the_cms_refuses_and_3_without_an_outcome() {
    let cms = Cms::start().await;
    let s = Cron::new(&format!(
        r#"
[[kinds]]
name = "cms"
timezone = "UTC"
slots = ["09:00"]
jitter = "0"
daily_cap = 10
starting_deadline = "7d"
publish_url = "{}"
http_attempts = 1

[[kinds]]
name = "quiet"
timezone = "UTC"
slots = ["09:00"]
jitter = "0"
daily_cap = 10
starting_deadline = "7d"
"#,
        cms.url("/publish")
    ))
    .await;
    s.add_drafts("cms", 1).await;
    // No worker yet: nobody handles the delivery, so there is no outcome.
    let (code, v) = s
        .trigger_job(
            "quiet",
            &job("publish-quiet", yesterday_0900()),
            &["--wait", "--wait-timeout", "1s"],
        )
        .await;
    assert_eq!(code, 3, "{v}");
    assert_eq!(v["outcome"]["wait"], "timed_out", "{v}");

    cms.script("/publish", [Reply::Status(422)]);
    let cancel = CancellationToken::new();
    let worker = common::start_worker(&s, &cancel);
    let (code, v) = s
        .trigger_job("cms", &job("publish-cms", yesterday_0900()), &["--wait"])
        .await;
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["outcome"]["slot"]["state"], "failed", "{v}");
    assert_eq!(v["outcome"]["slot"]["reason"], "publish_error", "{v}");
    assert_eq!(
        cms.calls_to("/publish").len(),
        1,
        "the CMS was called and refused"
    );
    // Plain text says the same, with the same exit status, for the other run.
    let out = s
        .planner_output(
            &[
                "trigger",
                "--kind",
                "cms",
                "--from-job-name",
                &job("publish-cms", yesterday_0900()),
                "--wait",
            ],
            &[],
        )
        .await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!(
            "cms:{}:1: slot failed/publish_error; this delivery skipped/slot_taken",
            yesterday_0900().date_naive()
        )),
        "{text}"
    );
    cancel.cancel();
    worker.await.unwrap();
}

/// The example CronJob in `deploy/k8s/`: the audit finds nothing, every flag
/// it passes exists, the label it reads is the Job name, and the kind in its
/// comment has a slot at its fire time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_cronjob_passes_the_audit_and_names_its_slot() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/k8s/cronjob-trigger.yaml");
    let out = std::process::Command::new(PLANNER)
        .args(["audit", "--json", "--now", "2026-09-25T00:00:00Z"])
        .arg(&manifest)
        .output()
        .unwrap();
    let (code, report) = json_of(out);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["findings"], serde_json::json!([]), "{report}");

    let text = std::fs::read_to_string(&manifest).unwrap();
    let cj: Value = serde_yaml_ng::from_str(&text).unwrap();
    let spec = &cj["spec"];
    assert_eq!(spec["concurrencyPolicy"], "Forbid");
    assert!(spec["startingDeadlineSeconds"]
        .as_u64()
        .is_some_and(|s| s >= 10));
    assert_eq!(spec["timeZone"], "Europe/Berlin");
    let job_spec = &spec["jobTemplate"]["spec"];
    assert_eq!(job_spec["backoffLimit"], 0);
    let pod = &job_spec["template"]["spec"];
    assert_eq!(pod["restartPolicy"], "Never");
    let c = &pod["containers"][0];
    let command: Vec<&str> = c["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(command[..2], ["planner", "trigger"]);
    let help = std::process::Command::new(PLANNER)
        .args(["trigger", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in command.iter().filter(|a| a.starts_with("--")) {
        assert!(
            help.split_whitespace().any(|t| t == *flag),
            "{flag} is a trigger flag"
        );
    }
    let wait = command.iter().position(|a| *a == "--wait-timeout").unwrap();
    let wait = humantime::parse_duration(command[wait + 1]).unwrap();
    assert!(
        job_spec["activeDeadlineSeconds"].as_u64().unwrap() > wait.as_secs(),
        "the Job outlives --wait-timeout"
    );
    let env = c["env"].as_array().unwrap();
    let job_env = env
        .iter()
        .find(|e| e["name"] == "SLOTGATE_JOB_NAME")
        .unwrap();
    assert_eq!(
        job_env["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.labels['batch.kubernetes.io/job-name']"
    );
    assert!(help.contains("env: SLOTGATE_JOB_NAME"));

    // The kind in the manifest's comment, with the CronJob's 09:00 Berlin
    // run of an explicit day (CEST, so 07:00Z) as the controller names it.
    let toml: String = text
        .lines()
        .skip_while(|l| !l.starts_with("#   [[kinds]]"))
        .take_while(|l| l.starts_with("#   "))
        .map(|l| format!("{}\n", &l[4..]))
        .collect();
    let s = Cron::new(&toml).await;
    let kind = &command[command.iter().position(|a| *a == "--kind").unwrap() + 1];
    let name = job(
        cj["metadata"]["name"].as_str().unwrap(),
        utc(2026, 9, 25, 7, 0),
    );
    let (code, v) = s.trigger_job(kind, &name, &[]).await;
    assert_eq!(code, 0, "{v}");
    assert_eq!(
        v["slot"],
        format!("{kind}:{}:1", NaiveDate::from_ymd_opt(2026, 9, 25).unwrap())
    );
}

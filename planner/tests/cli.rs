//! The `planner` binary as an operator runs it: bad configs exit 2 naming
//! the file, kind and field; the JSON contracts of `plan` and `report`.

use std::path::Path;
use std::process::{Command, Output};
use testkit::{TestDb, TestRedis};

const GOOD: &str = r#"
[[kinds]]
name = "article"
timezone = "Asia/Shanghai"
slots = ["08:00", "12:00", "18:30:15"]
jitter = "15m"
daily_cap = 2
starting_deadline = "2h"
"#;

fn planner(args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_planner"))
        .args(args)
        .env_remove("SLOTGATE_CONFIG")
        .envs(envs.iter().copied())
        .output()
        .expect("run planner")
}

/// The environment that points the planner at a test's own database,
/// Redis prefix and config file.
fn stack_env<'a>(
    db: &'a TestDb,
    redis: &'a TestRedis,
    cfg: &'a str,
) -> [(&'static str, &'a str); 4] {
    [
        ("DATABASE_URL", db.url.as_str()),
        ("REDIS_URL", redis.url.as_str()),
        ("SLOTGATE_PREFIX", redis.prefix.as_str()),
        ("SLOTGATE_CONFIG", cfg),
    ]
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

#[test]
fn bad_configs_exit_2_naming_file_kind_and_field() {
    let dir = tempdir();
    let cases: &[(&str, String, &[&str])] = &[
        (
            "bad_time.toml",
            GOOD.replace("\"12:00\"", "\"25:00\""),
            &["kind \"article\"", "slots[1]", "25:00"],
        ),
        (
            "bad_zone.toml",
            GOOD.replace("Asia/Shanghai", "Mars/Olympus"),
            &["kind \"article\"", "timezone", "Mars/Olympus"],
        ),
        (
            "neg_cap.toml",
            GOOD.replace("daily_cap = 2", "daily_cap = -1"),
            &["kind \"article\"", "daily_cap", "-1"],
        ),
        (
            "bad_dur.toml",
            GOOD.replace("\"15m\"", "\"fifteen\""),
            &["kind \"article\"", "jitter", "fifteen"],
        ),
        (
            "bad_name.toml",
            GOOD.replace("\"article\"", "\"Article!\""),
            &["name", "Article!"],
        ),
        (
            "not_toml.toml",
            "[[kinds]\nname = ".to_owned(),
            &["not valid TOML"],
        ),
        (
            "no_deadline.toml",
            GOOD.replace("starting_deadline = \"2h\"\n", ""),
            &["starting_deadline", "missing"],
        ),
        (
            "bad_url.toml",
            format!("{GOOD}publish_url = \"ftp://x\"\n"),
            &["publish_url", "ftp://x"],
        ),
        (
            "unknown_field.toml",
            format!("{GOOD}colour = \"blue\"\n"),
            &["colour", "unknown field"],
        ),
        // Calendars (issue 41): each bad part names its field.
        (
            "bad_weekday.toml",
            format!("{GOOD}weekdays = [\"mon\", \"funday\"]\n"),
            &["kind \"article\"", "weekdays", "funday"],
        ),
        (
            "bad_blackout.toml",
            format!("{GOOD}blackout = [\"2026-02-30\"]\n"),
            &["kind \"article\"", "blackout", "2026-02-30"],
        ),
        (
            "cron_and_slots.toml",
            format!("{GOOD}cron = \"0 9 * * 1-5\"\n"),
            &["kind \"article\"", "cron"],
        ),
        (
            "day_twice.toml",
            format!(
                "{GOOD}weekdays = [\"sat\"]\n[[kinds.on]]\ndays = [\"sat\"]\nslots = [\"10:30\"]\n"
            ),
            &["kind \"article\"", "sat"],
        ),
        (
            "bad_rotate.toml",
            format!("{GOOD}rotate_by = \"author\"\n"),
            &["kind \"article\"", "rotate_by", "author"],
        ),
    ];
    for (name, text, needles) in cases {
        let path = write(&dir, name, text);
        let out = planner(&["--config", &path, "plan", "--dry-run"], &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(name), "{name}: message names the file: {err}");
        for n in *needles {
            assert!(err.contains(n), "{name}: message contains {n:?}: {err}");
        }
    }
    let missing = dir.join("absent.toml");
    let out = planner(&["--config", missing.to_str().unwrap(), "plan"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("absent.toml"));
}

#[test]
fn every_command_has_help_and_bad_flags_fail() {
    for cmd in [
        vec!["--help"],
        vec!["migrate", "--help"],
        vec!["plan", "--help"],
        vec!["run", "--help"],
        vec!["trigger", "--help"],
        vec!["backfill", "--help"],
        vec!["drafts", "add", "--help"],
        vec!["drafts", "import", "--help"],
        vec!["drafts", "list", "--help"],
        vec!["report", "--help"],
        vec!["forecast", "--help"],
        vec!["retry", "--help"],
        vec!["abandon", "--help"],
        vec!["status", "--help"],
        vec!["pause", "--help"],
        vec!["resume", "--help"],
        vec!["skip", "--help"],
        vec!["dead", "list", "--help"],
        vec!["dead", "replay", "--help"],
        vec!["dead", "purge", "--help"],
        vec!["completions", "--help"],
        vec!["serve", "--help"],
    ] {
        let out = planner(&cmd, &[]);
        assert!(out.status.success(), "{cmd:?}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Usage"),
            "{cmd:?}"
        );
    }
    let out = planner(&["plan", "--day", "2026-02-30"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("2026-02-30"));
    let out = planner(&["retry", "--slot", "nonsense"], &[]);
    assert_eq!(out.status.code(), Some(2));
    for bad in [
        vec!["skip", "--slot", "nonsense"],
        vec!["pause", "--kind", "a", "--until", "tomorrow"],
        vec!["dead", "purge", "--older-than", "soon"],
        vec!["completions", "tcsh"],
        vec!["serve", "--http", "localhost"],
    ] {
        let out = planner(&bad, &[]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plan_and_report_json_follow_the_contract() {
    let db = TestDb::new().await;
    let redis = TestRedis::new();
    let dir = tempdir();
    let cfg = write(&dir, "slotgate.toml", GOOD);
    let envs = stack_env(&db, &redis, &cfg);
    let out = planner(&["plan", "--day", "2026-09-25", "--json"], &envs);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let slots = v["slots"].as_array().unwrap();
    assert_eq!(slots.len(), 3);
    for field in [
        "slot",
        "kind",
        "day",
        "slot_no",
        "nominal_at",
        "due_at",
        "jitter_ms",
        "new",
    ] {
        assert!(slots[0].get(field).is_some(), "plan --json has {field}");
    }
    assert_eq!(slots[1]["slot"], "article:2026-09-25:2");
    assert_eq!(
        slots[0]["nominal_at"], "2026-09-25T00:00:00Z",
        "08:00 Shanghai"
    );
    assert_eq!(slots[0]["new"], true);
    let again = planner(&["plan", "--day", "2026-09-25", "--json"], &envs);
    let v2: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert!(v2["slots"]
        .as_array()
        .unwrap()
        .iter()
        .all(|s| s["new"] == false));
    assert_eq!(
        v2["slots"][2]["due_at"], slots[2]["due_at"],
        "due times never move"
    );

    let out = planner(&["report", "--day", "2026-09-25", "--json"], &envs);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["day"], "2026-09-25");
    assert_eq!(r["slots"].as_array().unwrap().len(), 3);
    assert_eq!(r["slots"][0]["state"], "planned");
    for field in [
        "slot",
        "kind",
        "slot_no",
        "nominal_at",
        "due_at",
        "state",
        "reason",
        "draft_id",
        "url",
        "started_at",
        "lag_ms",
        "deliveries",
        "duplicates_blocked",
    ] {
        assert!(
            r["slots"][0].get(field).is_some(),
            "report slot has {field}"
        );
    }
    assert_eq!(r["totals"]["published"], 0);
    assert_eq!(r["totals"]["skipped"]["slot_taken"], 0);

    // Drafts: add, import (all or nothing), list.
    let body = write(&dir, "body.txt", "hello");
    let out = planner(
        &[
            "drafts",
            "add",
            "--kind",
            "article",
            "--title",
            "First",
            "--body-file",
            &body,
        ],
        &envs,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bad = write(
        &dir,
        "bad.jsonl",
        "{\"kind\":\"article\",\"title\":\"ok\"}\n{\"kind\":\"nope\",\"title\":\"x\"}\n",
    );
    let out = planner(&["drafts", "import", &bad], &envs);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("bad.jsonl:2"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let good = write(&dir, "good.jsonl", "{\"kind\":\"article\",\"title\":\"a\",\"body\":\"b\"}\n{\"kind\":\"article\",\"title\":\"c\",\"ready_at\":\"2030-01-01T00:00:00Z\"}\n");
    assert!(planner(&["drafts", "import", &good], &envs)
        .status
        .success());
    let out = planner(&["drafts", "list", "--json"], &envs);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let titles: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["title"].as_str().unwrap())
        .collect();
    assert_eq!(
        titles,
        vec!["First", "a", "c"],
        "the bad import added nothing"
    );
    assert_eq!(list[0]["body"], "hello");
    let out = planner(&["drafts", "list", "--status", "ready", "--json"], &envs);
    let ready: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ready.as_array().unwrap().len(), 3, "{ready}");
    // A status nobody has is refused, naming the word and the allowed ones.
    let out = planner(&["drafts", "list", "--status", "redy"], &envs);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("redy") && err.contains("one of: draft, ready"),
        "{err}"
    );

    // Unknown slot for trigger names the problem.
    let out = planner(
        &[
            "trigger",
            "--kind",
            "article",
            "--day",
            "2026-09-25",
            "--slot",
            "7",
        ],
        &envs,
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("slot 7 does not exist"));
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!(
        "slotgate-cli-{}-{}",
        std::process::id(),
        uuid_like()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn uuid_like() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[test]
fn audit_exit_statuses_and_json_shape() {
    // The audit crate's fixtures, beside this crate in the workspace.
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let fixtures = workspace.join("audit").join("tests/fixtures/audit");
    let fixtures = fixtures.to_str().expect("UTF-8 path");
    let now = ["--now", "2026-11-29T00:00:00Z", "--zone", "UTC"];
    let out = planner(
        &[
            &["audit", "--json"][..],
            &now,
            &[&format!("{fixtures}/example/send-digest.yaml")],
        ]
        .concat(),
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "something high was found");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["summary"]["high"], 1);
    let f = &v["findings"][0];
    for field in [
        "severity", "rule", "file", "line", "object", "message", "fix",
    ] {
        assert!(f.get(field).is_some(), "finding has {field}");
    }
    let good = planner(
        &[&["audit"][..], &now, &[&format!("{fixtures}/good")]].concat(),
        &[],
    );
    assert_eq!(
        good.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&good.stdout)
    );
    let bad = planner(
        &["audit", &format!("{fixtures}/malformed/broken-indent.yaml")],
        &[],
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("broken-indent.yaml:"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}

#[test]
fn out_of_range_values_syntax_errors_and_credentials_exit_2() {
    let dir = tempdir();
    let cases: &[(&str, String, &[&str])] = &[
        (
            "huge_deadline.toml",
            GOOD.replace("\"2h\"", "\"100000000d\""),
            &[
                "kind \"article\"",
                "starting_deadline",
                "out of range",
                "at most 7days",
            ],
        ),
        (
            "day_jitter.toml",
            GOOD.replace("\"15m\"", "\"24h\""),
            &["jitter", "less than 1day"],
        ),
        (
            "syntax.toml",
            GOOD.replace("daily_cap = 2", "daily_cap = = 2"),
            &["not valid TOML at line 7, column 13"],
        ),
    ];
    for (name, text, needles) in cases {
        let path = write(&dir, name, text);
        let out = planner(&["--config", &path, "plan", "--dry-run"], &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        for n in *needles {
            assert!(err.contains(n), "{name}: message contains {n:?}: {err}");
        }
    }
    let path = write(
        &dir,
        "creds.toml",
        &format!("{GOOD}publish_url = \"https://editor:hunter2-secret@cms.example/api\"\n"),
    );
    let out = planner(&["--config", &path, "plan", "--dry-run"], &[]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("publish_url") && text.contains("credentials"),
        "{text}"
    );
    assert!(
        !text.contains("hunter2"),
        "the password is never printed: {text}"
    );
    let out = planner(&["run", "--every", "0"], &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--every"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trigger_refuses_a_future_slot_unless_early() {
    let db = TestDb::new().await;
    let redis = TestRedis::new();
    let dir = tempdir();
    let cfg = write(&dir, "slotgate.toml", GOOD);
    let envs = stack_env(&db, &redis, &cfg);
    let day = (chrono::Utc::now().date_naive() + chrono::Duration::days(30)).to_string();
    let day = day.as_str();
    let args = ["trigger", "--kind", "article", "--day", day, "--slot", "1"];
    let out = planner(&args, &envs);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--early") && err.contains(&format!("article:{day}:1")),
        "{err}"
    );
    let ready = slotgate::queue::KeySpace::new(redis.prefix.as_str())
        .part(0)
        .ready();
    let mut c = redis.conn().await;
    let n: i64 = redis::cmd("XLEN")
        .arg(&ready)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(n, 0, "nothing delivered");
    let out = planner(&[&args[..], &["--early"]].concat(), &envs);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("early"), "{stdout}");
    let entries: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(&ready)
        .arg("-")
        .arg("+")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(entries.len(), 1);
    let fields: std::collections::HashMap<_, _> = entries[0].1.iter().cloned().collect();
    assert_eq!(
        fields.get("slot").map(String::as_str),
        Some(format!("article:{day}:1").as_str())
    );
    assert_eq!(fields.get("caller").map(String::as_str), Some("manual"));
    assert_eq!(fields.get("early").map(String::as_str), Some("1"));
}

#[test]
fn store_urls_are_printed_without_their_passwords() {
    let dir = tempdir();
    let cfg = write(&dir, "slotgate.toml", GOOD);
    // Nothing listens on port 1: the connection fails and the URL is named.
    let out = planner(
        &["--config", &cfg, "status"],
        &[
            (
                "DATABASE_URL",
                "postgres://app:hunter1@127.0.0.1:1/x?sslmode=disable&password=hunter2&sslpassword=hunter3",
            ),
            ("REDIS_URL", testkit::DEFAULT_REDIS_URL),
            ("SLOTGATE_PREFIX", "redaction-test-never-written"),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    // `status` reports what it could not read and goes on.
    assert!(
        err.contains("postgres://app:***@127.0.0.1:1/x?sslmode=disable&password=***"),
        "{err}"
    );
    assert!(!err.contains("hunter"), "{err}");
    // A Redis URL the client refuses is named redacted too.
    let out = planner(
        &["--config", &cfg, "status"],
        &[
            ("DATABASE_URL", testkit::DEFAULT_DATABASE_URL),
            ("REDIS_URL", "rediss://:hunter4@127.0.0.1:1/#insecure"),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("#insecure turns off certificate verification"),
        "{err}"
    );
    assert!(!err.contains("hunter"), "{err}");
    // Generated passwords hold `/` and `?` unencoded; neither ends what is
    // hidden (both were printed in full before).
    for (db, redis) in [
        (
            "postgres://root:abc/topsecret@127.0.0.1:1/x",
            testkit::DEFAULT_REDIS_URL,
        ),
        (
            testkit::DEFAULT_DATABASE_URL,
            "redis://:abc?topsecret@127.0.0.1:1/",
        ),
    ] {
        let out = planner(
            &["--config", &cfg, "status"],
            &[
                ("DATABASE_URL", db),
                ("REDIS_URL", redis),
                ("SLOTGATE_PREFIX", "redaction-test-never-written"),
            ],
        );
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            all.contains("127.0.0.1:1"),
            "the failing server is named: {all}"
        );
        assert!(!all.contains("topsecret"), "{all}");
    }
}

/// What strangers wrote, as a terminal would act on it: an OSC title
/// change, a screen clear, an OSC 52 clipboard write, an 8-bit CSI (C1)
/// and a right-to-left override.
const EVIL: &str = "\x1b]0;pwned\x07\x1b[2J\x1b]52;c;cHduZWQ=\x07\u{9b}1m\u{202e}gpj.exe";

/// `EVIL` as the tables show it.
const EVIL_SHOWN: &str =
    "\\x1b]0;pwned\\x07\\x1b[2J\\x1b]52;c;cHduZWQ=\\x07\\u{9b}1m\\u{202e}gpj.exe";

/// The planner's stdout holds no ESC, BEL, C1 control or bidi override,
/// and does show `EVIL` escaped.
fn assert_inert(what: &str, out: &Output) {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.stdout.contains(&0x1b), "{what}: ESC printed: {text:?}");
    assert!(!out.stdout.contains(&0x07), "{what}: BEL printed: {text:?}");
    assert!(
        !text
            .chars()
            .any(|c| ('\u{80}'..='\u{9f}').contains(&c) || c == '\u{202e}'),
        "{what}: C1 or bidi printed: {text:?}"
    );
    assert!(text.contains(EVIL_SHOWN), "{what}: shown escaped: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strangers_strings_reach_the_terminal_escaped() {
    use slotgate::queue::{KeySpace, Queue};
    let db = TestDb::new().await;
    let redis = TestRedis::new();
    let dir = tempdir();
    let cfg = write(&dir, "slotgate.toml", GOOD);
    let envs = stack_env(&db, &redis, &cfg);

    // A draft title (as a CMS export could carry it).
    let out = planner(
        &["drafts", "add", "--kind", "article", "--title", EVIL],
        &envs,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_inert("drafts list", &planner(&["drafts", "list"], &envs));
    // --json is left to JSON's own escaping.
    let out = planner(&["drafts", "list", "--json"], &envs);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["title"], EVIL);

    // A pause note, and a worker id in the heartbeat hash.
    let out = planner(&["pause", "--kind", "article", "--note", EVIL], &envs);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut c = redis.conn().await;
    let now_ms = chrono::Utc::now().timestamp_millis();
    let _: i64 = redis::cmd("HSET")
        .arg(slotgate::queue::KeySpace::new(redis.prefix.as_str()).workers())
        .arg(format!("w-{EVIL}"))
        .arg(now_ms)
        .query_async(&mut c)
        .await
        .unwrap();
    let status = planner(&["status"], &envs);
    assert_inert("status", &status);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains(&format!("w-{EVIL_SHOWN}")), "{text}");
    assert!(text.contains("paused        article"), "{text}");

    // A delivery whose slot and caller are escapes: a worker records it
    // and dead-letters it with both fields as received.
    let ready = slotgate::queue::KeySpace::new(redis.prefix.as_str()).ready();
    redis.deliver(&ready, EVIL, EVIL).await;
    let config = std::sync::Arc::new(
        slotgate::config::Config::parse(Path::new(&cfg), GOOD).expect("config"),
    );
    let queue = || {
        Queue::new(
            slotgate::queue::pool(&redis.url, 4).unwrap(),
            KeySpace::new(redis.prefix.clone()),
        )
    };
    let worker = slotgate::worker::Worker {
        opts: slotgate::worker::WorkerOptions::new("w-cli"),
        config,
        pool: slotgate::store::connect_lazy(&db.url, 4, &Default::default()).unwrap(),
        queue: queue(),
        clock: std::sync::Arc::new(slotgate::clock::SystemClock),
        entropy: std::sync::Arc::new(slotgate::retry::SeededEntropy::new(1)),
    };
    let cancel = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn(worker.run(cancel.clone()));
    let q = queue();
    testkit::wait_for(
        "the dead letter",
        std::time::Duration::from_secs(20),
        || async { (!q.dead_letters(10).await.unwrap().is_empty()).then_some(()) },
    )
    .await;
    cancel.cancel();
    running.await.unwrap();
    let dead = planner(&["dead", "list"], &envs);
    assert_inert("dead list", &dead);
    let text = String::from_utf8_lossy(&dead.stdout);
    assert_eq!(
        text.matches(EVIL_SHOWN).count(),
        2,
        "slot and caller: {text}"
    );

    // A stored reason in the report (a row written straight to Postgres).
    let out = planner(&["plan", "--day", "2026-09-25"], &envs);
    assert!(out.status.success());
    sqlx::query(
        "INSERT INTO publish_slot (day, slot, kind, state, claimed_by, reason) \
         VALUES ('2026-09-25', 1, 'article', 'skipped', 'test', $1)",
    )
    .bind(EVIL)
    .execute(&db.pool)
    .await
    .unwrap();
    assert_inert(
        "report",
        &planner(&["report", "--day", "2026-09-25"], &envs),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drafts_over_a_size_limit_are_refused_and_nothing_is_written() {
    use slotgate::import::{MAX_BODY_BYTES, MAX_LINE_BYTES, MAX_TITLE_CHARS};
    let db = TestDb::new().await;
    let redis = TestRedis::new();
    let dir = tempdir();
    let cfg = write(&dir, "slotgate.toml", GOOD);
    let envs = stack_env(&db, &redis, &cfg);
    let count = || async { testkit::count(&db.pool, "SELECT count(*) FROM draft").await };

    // Characters, not bytes: "é" is two bytes.
    let at_limit = "é".repeat(MAX_TITLE_CHARS);
    let over = "é".repeat(MAX_TITLE_CHARS + 1);
    let add = |title: &str| {
        planner(
            &["drafts", "add", "--kind", "article", "--title", title],
            &envs,
        )
    };
    let out = add(&over);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("title is 1001 characters, over the limit of 1000"),
        "{err}"
    );
    assert_eq!(count().await, 0);
    let out = add(&at_limit);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(count().await, 1);
    // A body file over 1 MiB.
    let big = write(&dir, "big.txt", &"b".repeat(MAX_BODY_BYTES + 1));
    let out = planner(
        &[
            "drafts",
            "add",
            "--kind",
            "article",
            "--title",
            "t",
            "--body-file",
            &big,
        ],
        &envs,
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("big.txt") && err.contains("1048576 bytes"),
        "{err}"
    );
    assert_eq!(count().await, 1);

    // Import: line 3 too long (as a line, and as a title); nothing lands.
    let good = "{\"kind\":\"article\",\"title\":\"ok\"}\n";
    let long_line = format!(
        "{{\"kind\":\"article\",\"title\":\"x\",\"body\":\"{}\"}}\n",
        "a".repeat(MAX_LINE_BYTES)
    );
    let long_title = format!(
        "{}\n",
        serde_json::json!({"kind": "article", "title": over})
    );
    for (name, line3, needle) in [
        (
            "line.jsonl",
            long_line,
            format!("line.jsonl:3: line is over the limit of {MAX_LINE_BYTES} bytes"),
        ),
        (
            "title.jsonl",
            long_title,
            "title.jsonl:3: title is 1001 characters, over the limit of 1000".to_owned(),
        ),
    ] {
        let file = write(&dir, name, &format!("{good}{good}{line3}{good}"));
        let out = planner(&["drafts", "import", &file], &envs);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(&needle), "{name}: {err}");
        assert_eq!(count().await, 1, "{name}: nothing imported");
    }
    // A title at the limit imports.
    let file = write(
        &dir,
        "ok.jsonl",
        &format!(
            "{good}{}\n",
            serde_json::json!({"kind": "article", "title": at_limit})
        ),
    );
    let out = planner(&["drafts", "import", &file], &envs);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(count().await, 3);
}

/// `planner audit --with-history` compares a config with Postgres: an edit
/// that removes a time whose slot already ran today and adds a time that
/// would still run today is `slotgate-moves-run-slot`; without the flag,
/// or when the edit only adds, nothing is said.
#[tokio::test]
async fn audit_with_history_warns_about_moving_a_slot_that_already_ran() {
    let dir = tempdir();
    let db = TestDb::new().await;
    let redis = TestRedis::new();
    let kind = |slots: &str| {
        format!("[[kinds]]\nname = \"article\"\ntimezone = \"UTC\"\nslots = [{slots}]\ndaily_cap = 3\nstarting_deadline = \"1h\"\n")
    };
    let before = write(&dir, "before.toml", &kind("\"12:00\""));
    let envs = stack_env(&db, &redis, &before);
    // Planning numbers the times; then slot 1 of the day runs (its gate row).
    let out = planner(&["plan", "--day", "2030-03-01"], &envs);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    sqlx::query(
        "INSERT INTO publish_slot (day, slot, kind, state, claimed_by) VALUES ('2030-03-01', 1, 'article', 'published', 'w')",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let now = "2030-03-01T13:00:00Z";
    let audit = |file: &str, history: bool| {
        let mut args = vec!["audit", "--json", "--now", now, file];
        if history {
            args.push("--with-history");
        }
        let out = planner(&args, &envs);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["rule"] == "slotgate-moves-run-slot")
            .cloned()
            .collect::<Vec<_>>()
    };
    let moved = write(&dir, "moved.toml", &kind("\"18:00\""));
    let found = audit(&moved, true);
    assert_eq!(found.len(), 1, "{found:?}");
    let msg = found[0]["message"].as_str().unwrap();
    assert!(
        msg.contains("slot 1 (12:00:00, published)") && msg.contains("18:00:00"),
        "{msg}"
    );
    assert_eq!(found[0]["severity"], "medium");
    assert!(audit(&moved, false).is_empty(), "no database, no history");
    let added = write(&dir, "added.toml", &kind("\"12:00\", \"18:00\""));
    assert!(
        audit(&added, true).is_empty(),
        "adding a time moves nothing"
    );
    // The audit numbered nothing: the new time is still unknown to Postgres.
    assert_eq!(
        testkit::count(&db.pool, "SELECT count(*) FROM slot_number").await,
        1
    );
}

/// Issue 38: `planner check` probes a kind's `probe_url` with a random key
/// and requires `404`. A probe URL answering 200 to anything (a soft-404
/// page) would mark every slot published with nothing sent; one answering
/// 409 for a key never sent would fail every unknown outcome. The message
/// names the probe URL with its secrets redacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_requires_the_probe_url_to_answer_404_for_a_random_key() {
    use testkit::cms::{Cms, Reply};
    let dir = tempdir();
    let check = |cms: &Cms, name: &str| {
        let text = format!(
            "{GOOD}publish_url = \"{}\"\nprobe_url = \"{}\"\nhttp_timeout = \"5s\"\n",
            cms.url("/publish"),
            cms.url("/probe?token=sekrit-probe-token")
        );
        let path = write(&dir, name, &text);
        let out = tokio::task::block_in_place(|| {
            Command::new(env!("CARGO_BIN_EXE_planner"))
                .args(["--config", &path, "check"])
                .env_remove("SLOTGATE_CONFIG")
                .env_remove("DATABASE_URL")
                .output()
                .expect("run planner check")
        });
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The stand-in answers a probe of a key it never received 404.
    let cms = Cms::start().await;
    let (code, err) = check(&cms, "probe_ok.toml");
    assert_eq!(code, Some(0), "{err}");
    let probes = cms.calls_to("/probe?token=sekrit-probe-token");
    assert_eq!(probes.len(), 1);
    let key = probes[0].key.clone().unwrap_or_default();
    assert!(key.starts_with("slotgate-check-"), "{key}");
    // Two checks, two keys: it is random.
    check(&cms, "probe_ok.toml");
    assert_ne!(
        cms.calls_to("/probe?token=sekrit-probe-token")[1]
            .key
            .as_deref(),
        Some(key.as_str())
    );
    for (name, reply, says) in [
        (
            "soft404.toml",
            Reply::Body(200, "text/html".into(), "<html>Not found</html>".into()),
            "HTTP 200",
        ),
        (
            "empty_json.toml",
            Reply::Body(200, "application/json".into(), "{}".into()),
            "HTTP 200",
        ),
        ("conflict.toml", Reply::Status(409), "HTTP 409"),
    ] {
        let cms = Cms::start().await;
        cms.set_chooser(Some(std::sync::Arc::new(
            move |_: &str, _: Option<&str>, _: &_| Some(reply.clone()),
        )));
        let (code, err) = check(&cms, name);
        assert_eq!(code, Some(1), "{name}: {err}");
        assert!(err.contains("kind \"article\""), "{name}: {err}");
        assert!(err.contains(says), "{name}: {err}");
        assert!(
            err.contains(&format!("probe_url {}", cms.url("/probe?token=***"))),
            "{name}: the probe URL, redacted: {err}"
        );
        assert!(!err.contains("sekrit"), "{name}: {err}");
        assert!(err.contains("must answer 404"), "{name}: {err}");
    }
}

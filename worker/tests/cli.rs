//! The `worker` binary's flags and start-up validation.

use std::process::Command;

fn worker(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_worker"))
        .args(args)
        .env_remove("SLOTGATE_CONFIG")
        .output()
        .expect("run worker")
}

#[test]
fn help_lists_the_contract_flags() {
    let out = worker(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--id",
        "--concurrency",
        "--batch",
        "--lease-ttl",
        "--visibility",
        "--config",
        "--prefix",
    ] {
        assert!(text.contains(flag), "{flag} in --help");
    }
}

/// The shipped worker cannot be told to break a rule: the chaos self-test's
/// sabotage lives in its own binary (`chaos-worker`), not behind a hidden
/// flag here.
#[test]
fn the_shipped_worker_has_no_sabotage_flag() {
    let out = worker(&[
        "--sabotage",
        "phantom",
        "--database-url",
        "postgres://127.0.0.1:1/none",
        "--redis-url",
        "redis://127.0.0.1:1",
    ]);
    assert_eq!(out.status.code(), Some(2), "a flag it does not know");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unexpected argument '--sabotage'"), "{err}");
}

/// Starts the worker with config `text` written to `name` (and services
/// that are not there): a bad config must stop it before it connects.
fn worker_with_config(name: &str, text: &str) -> std::process::Output {
    let dir = std::env::temp_dir().join(format!("slotgate-worker-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    worker(&[
        "--config",
        path.to_str().unwrap(),
        "--database-url",
        "postgres://x@127.0.0.1:1/x",
        "--redis-url",
        "redis://127.0.0.1:1/",
    ])
}

#[test]
fn a_bad_config_exits_2_naming_the_field() {
    let out = worker_with_config("bad.toml", "[[kinds]]\nname = \"a\"\ntimezone = \"Nowhere/City\"\nslots = [\"08:00\"]\ndaily_cap = 1\nstarting_deadline = \"1h\"\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("bad.toml") && err.contains("kind \"a\"") && err.contains("timezone"),
        "{err}"
    );
}

#[test]
fn bad_flags_are_rejected() {
    let out = worker(&[
        "--concurrency",
        "0",
        "--database-url",
        "x",
        "--redis-url",
        "y",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let out = worker(&[
        "--lease-ttl",
        "soon",
        "--database-url",
        "x",
        "--redis-url",
        "y",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("soon"));
    let out = worker(&["--batch", "0", "--database-url", "x", "--redis-url", "y"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--batch"));
}

#[test]
fn out_of_range_durations_exit_2_naming_the_flag_or_field() {
    for (flag, value) in [
        ("--visibility", "2h"),
        ("--lease-ttl", "11m"),
        ("--shutdown-grace", "100000000d"),
        ("--reconcile-every", "2h"),
    ] {
        let out = worker(&[flag, value, "--database-url", "x", "--redis-url", "y"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(flag) && err.contains("out of range"), "{err}");
    }
    let out = worker_with_config("huge.toml", "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"08:00\"]\ndaily_cap = 1\nstarting_deadline = \"100000000000d\"\n");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("starting_deadline") && err.contains("at most 7days"),
        "{err}"
    );
}

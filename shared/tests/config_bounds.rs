//! Configuration is bounded: every duration has an upper limit, a TOML
//! syntax error says where it is, and URLs may not carry credentials. Each
//! error names its field (the binaries exit 2 on it: see the CLI tests).

use slotgate::config::{Config, ConfigError};
use std::path::Path;

const KIND: &str = "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"08:00\"]\ndaily_cap = 1\nstarting_deadline = \"1h\"\n";

fn parse(extra: &str) -> Result<Config, ConfigError> {
    Config::parse(Path::new("t.toml"), &format!("{KIND}{extra}"))
}

/// The config with `field = "value"` in place of the default.
fn with(field: &str, value: &str) -> Result<Config, ConfigError> {
    let text = if field == "starting_deadline" {
        KIND.replace("\"1h\"", &format!("\"{value}\""))
    } else {
        format!("{KIND}{field} = \"{value}\"\n")
    };
    Config::parse(Path::new("t.toml"), &text)
}

fn rejected(field: &str, value: &str) -> String {
    let e = with(field, value).expect_err(&format!("{field} = {value:?} is out of range"));
    assert_eq!(e.field.as_deref(), Some(field), "{e}");
    e.to_string()
}

#[test]
fn each_duration_has_an_upper_limit() {
    // (field, largest accepted, smallest refused)
    let cases = [
        ("jitter", "23h 59m 59s", "24h"),
        ("starting_deadline", "7d", "7d 1s"),
        ("http_timeout", "10m", "10m 1s"),
        ("retry_base", "10m", "11m"),
        ("retry_cap", "1h", "61m"),
    ];
    for (field, ok, bad) in cases {
        assert!(
            with(field, ok).is_ok(),
            "{field} = {ok:?}: {:?}",
            with(field, ok).err()
        );
        let m = rejected(field, bad);
        assert!(m.contains("out of range") && m.contains("must be"), "{m}");
    }
    assert!(rejected("http_timeout", "0").contains("at least 1ms"));
}

#[test]
fn durations_too_large_for_chrono_are_refused() {
    for field in [
        "jitter",
        "starting_deadline",
        "http_timeout",
        "retry_base",
        "retry_cap",
    ] {
        rejected(field, "100000000000d");
    }
}

#[test]
fn a_toml_syntax_error_says_line_and_column() {
    let text = "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"08:00\",, ]\n";
    let m = Config::parse(Path::new("t.toml"), text)
        .unwrap_err()
        .to_string();
    assert!(m.contains("not valid TOML at line 4, column 18"), "{m}");
    let m = Config::parse(Path::new("t.toml"), "[[kinds]\nname = ")
        .unwrap_err()
        .to_string();
    assert!(m.contains("at line 1, column"), "{m}");
}

#[test]
fn urls_with_credentials_are_refused_without_showing_them() {
    for (field, url) in [
        ("publish_url", "https://editor:s3cr3t-pass@cms.example/api"),
        ("index_url", "http://s3cr3t-pass@cms.example/api"),
        ("publish_url", "https://:s3cr3t-pass@cms.example/"),
        ("publish_url", "editor:s3cr3t-pass@cms.example/api"),
    ] {
        let e = parse(&format!("{field} = \"{url}\"\n")).unwrap_err();
        let m = e.to_string();
        assert_eq!(e.field.as_deref(), Some(field), "{m}");
        assert!(m.contains("credentials"), "{m}");
        assert!(!m.contains("s3cr3t"), "the password is never shown: {m}");
    }
    assert!(
        parse("publish_url = \"https://cms.example/a@b\"\n").is_ok(),
        "an @ in the path is no credential"
    );
    let e = parse("publish_url = \"http://\"\n").unwrap_err();
    assert!(e.to_string().contains("bad URL"), "{e}");
}

#[test]
fn redis_partitions_is_a_whole_number_from_1_to_64() {
    let top = |v: &str| {
        Config::parse(
            Path::new("t.toml"),
            &format!("redis_partitions = {v}\n{KIND}"),
        )
    };
    assert_eq!(
        Config::parse(Path::new("t.toml"), KIND)
            .unwrap()
            .redis_partitions,
        1
    );
    assert_eq!(top("3").unwrap().redis_partitions, 3);
    assert_eq!(top("64").unwrap().redis_partitions, 64);
    for bad in ["0", "65", "-1", "\"3\"", "2.5", "99999999999"] {
        let e = top(bad).expect_err(bad);
        assert_eq!(e.field.as_deref(), Some("redis_partitions"), "{bad}: {e}");
        assert!(e.to_string().contains("from 1 to 64"), "{bad}: {e}");
    }
}

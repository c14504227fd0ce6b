//! `planner drafts import` through `import::DraftRows`: every draft of a
//! file lands exactly as written, and a bad line or a refused row leaves the
//! table as it was.

use crate::common::{kind_toml, Env};
use chrono::{DateTime, Utc};
use slotgate::import::{DraftRows, ImportError};

fn config() -> String {
    kind_toml("article", &["08:00"], 1, "") + &kind_toml("news", &["09:00"], 1, "")
}

async fn drafts(env: &Env) -> Vec<(String, String, String, String, DateTime<Utc>)> {
    sqlx::query_as("SELECT kind, title, body, status, ready_at FROM draft ORDER BY id")
        .fetch_all(&env.db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_draft_of_the_file_is_imported_as_written() {
    let env = Env::new(&config()).await;
    let now: DateTime<Utc> = "2026-11-30T10:00:00.123456Z".parse().unwrap();
    let later: DateTime<Utc> = "2030-01-01T00:00:00Z".parse().unwrap();
    let n = 5000;
    let mut text = String::new();
    let mut want = Vec::new();
    for i in 0..n {
        let kind = if i % 3 == 0 { "news" } else { "article" };
        // Characters the COPY text format must escape, and some it must not.
        let title = format!("t{i} \\ tab\there\nline\r\\N ü ✓");
        let body = if i % 2 == 0 {
            format!("body {i}")
        } else {
            String::new()
        };
        let mut line = serde_json::json!({"kind": kind, "title": title});
        if !body.is_empty() {
            line["body"] = body.clone().into();
        }
        let ready = if i % 5 == 0 {
            line["ready_at"] = "2030-01-01T01:00:00+01:00".into();
            later
        } else {
            now
        };
        text.push_str(&line.to_string());
        text.push('\n');
        if i % 1000 == 0 {
            text.push_str("  \n");
        }
        want.push((kind.to_owned(), title, body, "ready".to_owned(), ready));
    }
    let rows = DraftRows::parse(text.as_bytes(), "many.jsonl", &env.config, now).unwrap();
    assert_eq!(rows.len(), n);
    assert_eq!(rows.copy_into(&env.db.pool).await.unwrap(), n as u64);
    assert_eq!(
        drafts(&env).await,
        want,
        "every draft, in file order, as written"
    );
    let created: i64 =
        testkit::count(&env.db.pool, "SELECT count(DISTINCT created_at) FROM draft").await;
    assert_eq!(created, 1, "one import, one created_at");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_line_names_itself_and_imports_nothing() {
    let env = Env::new(&config()).await;
    let good = "{\"kind\":\"article\",\"title\":\"ok\"}\n";
    let cases = [
        (
            "{\"kind\":\"nope\",\"title\":\"x\"}",
            "bad.jsonl:3: unknown kind \"nope\"",
        ),
        ("{\"kind\":\"article\"}", "bad.jsonl:3: not a draft line"),
        (
            "{\"kind\":\"article\",\"title\":\"x\",\"extra\":1}",
            "bad.jsonl:3: not a draft line",
        ),
        (
            "{\"kind\":\"article\",\"title\":\"x\",\"ready_at\":\"tomorrow\"}",
            "bad.jsonl:3: not a draft line",
        ),
        (
            "{\"kind\":\"article\",\"title\":\"a\\u0000b\"}",
            "bad.jsonl:3: title contains a NUL character",
        ),
    ];
    for (bad, message) in cases {
        let text = format!("{good}{good}{bad}\n{good}");
        let e =
            DraftRows::parse(text.as_bytes(), "bad.jsonl", &env.config, Utc::now()).expect_err(bad);
        assert!(e.to_string().starts_with(message), "{bad}: {e}");
    }
    assert!(drafts(&env).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_postgres_refuses_rolls_the_whole_copy_back() {
    let env = Env::new(&config()).await;
    // A constraint only this test's database has: the 3,000th row breaks it
    // after thousands were sent.
    sqlx::query("ALTER TABLE draft ADD CONSTRAINT no_poison CHECK (title <> 'poison')")
        .execute(&env.db.pool)
        .await
        .unwrap();
    let text: String = (0..5000)
        .map(|i| {
            let title = if i == 3000 {
                "poison".into()
            } else {
                format!("t{i}")
            };
            format!("{}\n", serde_json::json!({"kind": "news", "title": title}))
        })
        .collect();
    let rows = DraftRows::parse(text.as_bytes(), "poison.jsonl", &env.config, Utc::now()).unwrap();
    let e = rows.copy_into(&env.db.pool).await.expect_err("refused");
    assert!(matches!(e, ImportError::Store(_)), "{e:?}");
    assert!(drafts(&env).await.is_empty(), "nothing of the file stays");
    // The pool's connection is usable again: a good file imports.
    let ok = DraftRows::parse(
        "{\"kind\":\"news\",\"title\":\"fine\"}\n".as_bytes(),
        "ok.jsonl",
        &env.config,
        Utc::now(),
    )
    .unwrap();
    assert_eq!(ok.copy_into(&env.db.pool).await.unwrap(), 1);
}

/// Counts the bytes read through it.
struct Counted<R> {
    inner: R,
    read: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl<R: std::io::Read> std::io::Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_line_is_refused_without_being_loaded() {
    use slotgate::import::{TooLong, MAX_LINE_BYTES};
    use std::io::Read;
    let env = Env::new(&config()).await;
    let good = "{\"kind\":\"article\",\"title\":\"ok\"}\n";
    // Two good lines, then 100 MiB without a newline.
    let read = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let endless = Counted {
        inner: std::io::Cursor::new(good.repeat(2)).chain(std::io::repeat(b'x').take(100 << 20)),
        read: read.clone(),
    };
    let e = DraftRows::parse(
        std::io::BufReader::new(endless),
        "endless.jsonl",
        &env.config,
        Utc::now(),
    )
    .expect_err("refused");
    assert!(
        matches!(
            &e,
            ImportError::TooLong {
                line: 3,
                what: TooLong::Line,
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!("endless.jsonl:3: line is over the limit of {MAX_LINE_BYTES} bytes")
    );
    let read = read.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        read <= 2 * good.len() + MAX_LINE_BYTES + 1 + 8 * 1024,
        "read {read} bytes: the line was loaded"
    );
    assert!(drafts(&env).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn titles_and_bodies_are_bounded_at_their_limits() {
    use slotgate::import::{MAX_BODY_BYTES, MAX_TITLE_CHARS};
    let env = Env::new(&config()).await;
    let line = |title: &str, body: &str| {
        format!(
            "{}\n",
            serde_json::json!({"kind": "news", "title": title, "body": body})
        )
    };
    let title = "✓".repeat(MAX_TITLE_CHARS);
    let body = "b".repeat(MAX_BODY_BYTES);
    let ok = line(&title, &body);
    let rows = DraftRows::parse(ok.as_bytes(), "ok.jsonl", &env.config, Utc::now()).unwrap();
    assert_eq!(rows.copy_into(&env.db.pool).await.unwrap(), 1);
    for (bad, message) in [
        (
            line(&format!("{title}✓"), ""),
            "over.jsonl:2: title is 1001 characters, over the limit of 1000",
        ),
        (
            line("t", &format!("{body}b")),
            "over.jsonl:2: body is over the limit of 1048576 bytes (1 MiB)",
        ),
    ] {
        let text = format!("{ok}{bad}");
        let e = DraftRows::parse(text.as_bytes(), "over.jsonl", &env.config, Utc::now())
            .expect_err(message);
        assert_eq!(e.to_string(), message);
    }
    assert_eq!(drafts(&env).await.len(), 1);
}

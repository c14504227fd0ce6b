//! The migrations keep the checksums of the text as first released, so a
//! database migrated by an earlier release still migrates (sqlx refuses a
//! changed checksum), and only comments ever changed in released files.

use sha2::{Digest, Sha384};
use slotgate::migrations::HISTORIC;

/// The comment line the first release carried, hex-encoded: it named a
/// design file outside the repository, and this file must not point there
/// itself.
const RELEASED_LINE_2_HEX: &str =
    "2d2d20436f6e7472616374733a202e2e2f7368617265642f44455349474e2e6d642022506f737467726573222e";

#[test]
fn restoring_the_released_comment_gives_back_the_released_checksum() {
    let now = include_str!("../../migrations/20261129000001_init.sql");
    let mut lines: Vec<&str> = now.split('\n').collect();
    assert!(
        lines[1].starts_with("-- "),
        "line 2 is still a comment: {:?}",
        lines[1]
    );
    let today = hex::encode(Sha384::digest(now.as_bytes()));
    let released_line = String::from_utf8(hex::decode(RELEASED_LINE_2_HEX).unwrap()).unwrap();
    lines[1] = &released_line;
    let released = hex::encode(Sha384::digest(lines.join("\n").as_bytes()));
    let (version, recorded) = HISTORIC[0];
    assert_eq!(version, 20261129000001);
    assert_eq!(released, recorded, "only the comment on line 2 may differ");
    assert_ne!(
        today, recorded,
        "the text did change, so the override is needed"
    );
}

#[tokio::test]
async fn a_database_migrated_by_the_first_release_migrates_again() {
    let db = testkit::TestDb::new().await;
    // TestDb migrated with the released checksums; that is what a database
    // of the first release holds for its first migration.
    let stored: Vec<u8> =
        sqlx::query_scalar("SELECT checksum FROM _sqlx_migrations WHERE version = 20261129000001")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(hex::encode(stored), HISTORIC[0].1);
    // The library's migrator (what `planner migrate` runs) accepts it.
    slotgate::MIGRATOR
        .run(&db.pool)
        .await
        .expect("re-running the migrations over the released checksum");
}

/// Released migrations that build an index on a table that may already
/// hold rows, inside sqlx's transaction and without `CONCURRENTLY`: on a
/// large table, writers wait for the build. They stay as released (sqlx
/// refuses a changed checksum); an operator upgrading past them runs
/// `planner migrate` before starting the workers, or in a quiet hour.
const BLOCKING_AS_RELEASED: [&str; 3] = [
    "20261130000003_reconcile_window.sql",
    "20261130000007_retention.sql",
    "20261203000001_cms_drafts.sql",
];

/// The index builds in `sql` that would block writers to a table the file
/// did not create: every `CREATE [UNIQUE] INDEX` on such a table unless it
/// is `CONCURRENTLY` in a file that starts with sqlx's `-- no-transaction`
/// (a concurrent build cannot run in a transaction, and a file of several
/// statements runs as one: so it must be the file's only statement).
fn blocking_index_builds(sql: &str) -> Vec<String> {
    let statements: Vec<String> = sql
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
        .split(';')
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|s| !s.is_empty())
        .collect();
    let created: Vec<String> = statements
        .iter()
        .filter_map(|s| {
            let rest = s.to_lowercase();
            let rest = rest.strip_prefix("create table ")?;
            let rest = rest.strip_prefix("if not exists ").unwrap_or(rest);
            Some(rest.split([' ', '(']).next()?.to_owned())
        })
        .collect();
    let no_tx = sql.starts_with("-- no-transaction");
    statements
        .iter()
        .filter(|s| {
            let l = s.to_lowercase();
            if !(l.starts_with("create index ") || l.starts_with("create unique index ")) {
                return false;
            }
            let table = l
                .split(" on ")
                .nth(1)
                .and_then(|t| t.split([' ', '(']).next())
                .unwrap_or("");
            if created.iter().any(|c| c == table) {
                return false;
            }
            !(l.contains(" concurrently ") && no_tx && statements.len() == 1)
        })
        .cloned()
        .collect()
}

#[test]
fn index_builds_on_existing_tables_do_not_block_writers() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../migrations");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with(".sql") || BLOCKING_AS_RELEASED.contains(&name.as_str()) {
            continue;
        }
        let sql = std::fs::read_to_string(&path).unwrap();
        let blocking = blocking_index_builds(&sql);
        assert!(
            blocking.is_empty(),
            "{name}: {blocking:?} would make writers wait for the build; use CREATE INDEX CONCURRENTLY as the only statement of a file that starts with `-- no-transaction`"
        );
        checked += 1;
    }
    assert!(
        checked >= 7,
        "only {checked} migrations read from {}",
        dir.display()
    );
}

#[test]
fn the_index_rule_tells_a_blocking_build_from_a_safe_one() {
    let on_existing = "-- x\nCREATE INDEX a ON execution (started_at);";
    assert_eq!(blocking_index_builds(on_existing).len(), 1);
    let unique = "ALTER TABLE draft ADD COLUMN c int;\nCREATE UNIQUE INDEX u ON draft (c);";
    assert_eq!(blocking_index_builds(unique).len(), 1);
    let concurrent_in_tx = "CREATE INDEX CONCURRENTLY a ON execution (started_at);";
    assert_eq!(blocking_index_builds(concurrent_in_tx).len(), 1);
    let safe = "-- no-transaction\n-- why\nCREATE INDEX CONCURRENTLY a ON execution (started_at);";
    assert!(blocking_index_builds(safe).is_empty());
    let new_table = "CREATE TABLE t (id int);\nCREATE INDEX t_id ON t (id);";
    assert!(blocking_index_builds(new_table).is_empty());
    for released in BLOCKING_AS_RELEASED {
        let sql = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../migrations")
                .join(released),
        )
        .unwrap();
        assert!(
            !blocking_index_builds(&sql).is_empty(),
            "{released} no longer blocks: take it off the list"
        );
    }
}

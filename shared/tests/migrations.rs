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

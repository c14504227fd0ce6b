//! The embedded schema migrations, and the one checksum history they keep.
//!
//! sqlx refuses to migrate a database when a migration it applied earlier
//! has changed on disk: it stores each migration's SHA-384 and compares.
//! The first migration's text once carried a comment pointing at a file
//! outside the repository; the comment was dropped on 2026-11-30 without
//! touching a statement. Databases migrated before then hold the checksum
//! of the text as first released, so the migrator states that checksum for
//! that version ([`HISTORIC`]) instead of hashing today's text. A test
//! (`shared/tests/migrations.rs`) restores the comment and checks that the
//! hash comes back, so only a comment ever changed.
//!
//! It lives beside the migrations (sqlx reads only `*.sql` there) and is
//! compiled into both `slotgate` and `testkit` (by `#[path]`), so test
//! databases and `planner migrate` agree on every checksum; it depends on
//! nothing but sqlx and std for that reason.

use sqlx::migrate::Migrator;
use std::borrow::Cow;

/// `(version, SHA-384 in hex of the text as first released)` for every
/// migration whose text changed after release (comments only).
pub const HISTORIC: &[(i64, &str)] = &[(
    20261129000001,
    "b0d9bac274045e31ff49e36dad6b41ee9faa152265f1399a68deae57acf15a5c143284374529f95baa1c47190d20c77d",
)];

/// The embedded migrations with the released checksums of [`HISTORIC`].
pub fn migrator() -> Migrator {
    let mut m = sqlx::migrate!("../migrations");
    let migrations: Vec<_> = m
        .migrations
        .iter()
        .cloned()
        .map(|mut mig| {
            if let Some((_, hex)) = HISTORIC.iter().find(|(v, _)| *v == mig.version) {
                mig.checksum = Cow::Owned(unhex(hex));
            }
            mig
        })
        .collect();
    m.migrations = Cow::Owned(migrations);
    m
}

/// Decodes a constant hex string (a programming error if malformed, caught
/// by every test that migrates).
fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("HISTORIC holds hex"))
        .collect()
}

//! A short Postgres outage under load, with the real worker binary: every
//! gate statement fails as a full disk makes it fail (SQLSTATE 53100, a
//! statement trigger on `publish_slot`) until the test ends the outage.
//! The review's run of this (20 s out of disk at 15 slots/s) gave 1,740
//! WARN lines and recovered one delivery at a time. Judged by Postgres's
//! own counts and the worker's log.

use chrono::Utc;
use std::path::PathBuf;
use std::time::Duration;
use testkit::stack::{Bins, Stack};
use testkit::wait_for;

/// Slots of one record-only kind, all of yesterday (in a zone where the
/// test runs around noon, so "yesterday" is a whole day ago whatever the
/// hour), each with a draft.
const N: i64 = 150;

/// Every insert statement into `publish_slot` fails while `outage.on_`,
/// counted in `outage_hits` (a sequence: not rolled back with the failing
/// statement); every one that goes through is counted in `gate_statements`.
const OUTAGE: &str = "
CREATE SEQUENCE outage_hits;
CREATE SEQUENCE gate_statements;
CREATE TABLE outage (on_ boolean NOT NULL);
INSERT INTO outage VALUES (true);
CREATE FUNCTION outage() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF (SELECT on_ FROM outage) THEN
    PERFORM nextval('outage_hits');
    RAISE EXCEPTION 'could not extend file: No space left on device (simulated)'
      USING ERRCODE = '53100';
  END IF;
  RETURN NULL;
END $$;
CREATE FUNCTION gate_statement() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM nextval('gate_statements');
  RETURN NULL;
END $$;
CREATE TRIGGER outage BEFORE INSERT ON publish_slot
  FOR EACH STATEMENT EXECUTE FUNCTION outage();
CREATE TRIGGER gate_statement AFTER INSERT ON publish_slot
  FOR EACH STATEMENT EXECUTE FUNCTION gate_statement();
";

async fn seq(pool: &sqlx::PgPool, name: &str) -> i64 {
    sqlx::query_scalar(&format!(
        "SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {name}"
    ))
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The lines of `log` that report a failed delivery or batch.
fn failure_lines(log: &str) -> Vec<&str> {
    log.lines()
        .filter(|l| l.contains("failed on infrastructure") || l.contains("batch failed"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_error_burst_is_retried_in_batches_and_summarised_in_the_log() {
    let zone = testkit::zone::around_noon(Utc::now(), Duration::from_secs(6 * 3600));
    let times: Vec<String> = (0..N).map(|_| "\"00:00\"".to_owned()).collect();
    let config = format!(
        "[[kinds]]\nname = \"burst\"\ntimezone = {:?}\nslots = [{}]\njitter = \"0\"\ndaily_cap = {N}\nstarting_deadline = \"7d\"\n",
        zone.name(),
        times.join(", ")
    );
    let s = Stack::builder(Bins::beside(PathBuf::from(env!("CARGO_BIN_EXE_worker"))))
        .tag("outage")
        .build(&config)
        .await;
    let pool = s.db().pool.clone();
    // (Stack::build has migrated the database.)
    sqlx::query(
        "INSERT INTO draft (kind, title, ready_at)
         SELECT 'burst', 'burst ' || i, now() - interval '2 days' FROM generate_series(1, $1) i",
    )
    .bind(N as i32)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::raw_sql(OUTAGE).execute(&pool).await.unwrap();
    // Planned as the planner plans (the batch path takes planned slots);
    // all due, so the leader promotes them at once.
    let yesterday = zone.day(Utc::now()) - chrono::Duration::days(1);
    s.planner(&["plan", "--day", &yesterday.to_string()]);
    let w = s.worker("w", &[], &[]);
    // The outage lasts until the worker has met it a few times (a batch
    // retried together is one statement per round, and rounds back off:
    // waiting for many would take minutes).
    wait_for(
        "gate statements failing",
        Duration::from_secs(60),
        || async { (seq(&pool, "outage_hits").await >= 4).then_some(()) },
    )
    .await;
    let failed_during = seq(&pool, "outage_hits").await;
    sqlx::query("UPDATE outage SET on_ = false")
        .execute(&pool)
        .await
        .unwrap();
    wait_for("every slot published", Duration::from_secs(120), || async {
        let n = testkit::count(
            &pool,
            "SELECT count(*) FROM execution WHERE outcome = 'published'",
        )
        .await;
        (n >= N).then_some(())
    })
    .await;
    let published = testkit::count(
        &pool,
        "SELECT count(DISTINCT slot_key) FROM execution WHERE outcome = 'published'",
    )
    .await;
    assert_eq!(published, N, "every slot once");
    assert_eq!(
        testkit::count(&pool, "SELECT count(*) FROM execution").await,
        N,
        "one outcome per slot, none failed"
    );
    // The recovery's line comes after the acknowledgement, which comes
    // after the rows counted above are committed.
    wait_for(
        "the recovery's line in the log",
        Duration::from_secs(30),
        || async {
            w.log_text()
                .contains("deliveries go through again")
                .then_some(())
        },
    )
    .await;
    let log = w.log_text();
    let lines = failure_lines(&log);
    assert!(
        failed_during >= 4,
        "the outage happened: {failed_during} statements refused"
    );
    // One line per 5 s of outage (and the first), not one per failure.
    assert!(
        lines.len() <= 12,
        "{} failure lines for a {failed_during}-statement outage:\n{}",
        lines.len(),
        lines.join("\n")
    );
    assert!(
        log.contains("deliveries go through again"),
        "the recovery says how many failures went unlogged:\n{}",
        lines.join("\n")
    );
    // The retries came back through the gate in batches: far fewer gate
    // statements than slots.
    let statements = seq(&pool, "gate_statements").await;
    assert!(
        statements <= N / 3,
        "{statements} gate statements for {N} retried slots"
    );
    drop(w);
}

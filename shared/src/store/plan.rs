//! `planned_slot`: the plan, written once per slot (due times never move)
//! and read by the gate, the reconciler and the report.

use super::StoreError;
use crate::slot::{PlannedSlot, SlotKey};
use chrono::{DateTime, NaiveDate, Utc};
use sqlx::postgres::PgPool;
use sqlx::{PgConnection, Row};

/// A `(kind, day, slot)` row as a key.
pub(super) fn key_row(r: &sqlx::postgres::PgRow) -> Result<SlotKey, StoreError> {
    Ok(SlotKey::new(
        r.try_get::<String, _>(0)?,
        r.try_get(1)?,
        r.try_get::<i32, _>(2)? as u32,
    ))
}

/// Keys as the three arrays an `UNNEST($1::text[], $2::date[], $3::int[])` takes.
pub(crate) fn key_columns<'a>(
    keys: impl IntoIterator<Item = &'a SlotKey>,
) -> (Vec<&'a str>, Vec<NaiveDate>, Vec<i32>) {
    let (mut kinds, mut days, mut nos) = (Vec::new(), Vec::new(), Vec::new());
    for k in keys {
        kinds.push(k.kind.as_str());
        days.push(k.day);
        nos.push(k.slot_no as i32);
    }
    (kinds, days, nos)
}

// ---------------------------------------------------------------- planning

/// Inserts planned slots; returns the keys that were new. Existing rows are
/// untouched, so due times never move and concurrent planners create each
/// slot once.
pub async fn insert_planned(
    conn: &mut PgConnection,
    slots: &[PlannedSlot],
    source: &str,
) -> Result<Vec<SlotKey>, StoreError> {
    if slots.is_empty() {
        return Ok(Vec::new());
    }
    let kinds: Vec<&str> = slots.iter().map(|s| s.key.kind.as_str()).collect();
    let days: Vec<NaiveDate> = slots.iter().map(|s| s.key.day).collect();
    let nos: Vec<i32> = slots.iter().map(|s| s.key.slot_no as i32).collect();
    let nominal: Vec<DateTime<Utc>> = slots.iter().map(|s| s.nominal_at).collect();
    let due: Vec<DateTime<Utc>> = slots.iter().map(|s| s.due_at).collect();
    let jitter: Vec<i64> = slots.iter().map(|s| s.jitter_ms).collect();
    let rows = sqlx::query(
        "INSERT INTO planned_slot (kind, day, slot, nominal_at, due_at, jitter_ms, source)
         SELECT k, d, s, n, du, j, $7
           FROM UNNEST($1::text[], $2::date[], $3::int[], $4::timestamptz[], $5::timestamptz[], $6::bigint[])
                AS t(k, d, s, n, du, j)
         ON CONFLICT (kind, day, slot) DO NOTHING
         RETURNING kind, day, slot",
    )
    .bind(&kinds)
    .bind(&days)
    .bind(&nos)
    .bind(&nominal)
    .bind(&due)
    .bind(&jitter)
    .bind(source)
    .fetch_all(conn)
    .await?;
    rows.iter().map(key_row).collect()
}

pub(crate) fn planned_row(r: &sqlx::postgres::PgRow) -> Result<PlannedSlot, StoreError> {
    Ok(PlannedSlot {
        key: SlotKey::new(
            r.try_get::<String, _>("kind")?,
            r.try_get("day")?,
            r.try_get::<i32, _>("slot")? as u32,
        ),
        nominal_at: r.try_get("nominal_at")?,
        due_at: r.try_get("due_at")?,
        jitter_ms: r.try_get("jitter_ms")?,
    })
}

/// The stored plan of one slot, with Postgres's clock at the time of reading:
/// the delivery's starting deadline is judged against the latter.
pub async fn get_planned_at(
    conn: &mut PgConnection,
    key: &SlotKey,
) -> Result<Option<(PlannedSlot, DateTime<Utc>)>, StoreError> {
    sqlx::query("SELECT kind, day, slot, nominal_at, due_at, jitter_ms, clock_timestamp() AS db_now FROM planned_slot WHERE kind = $1 AND day = $2 AND slot = $3")
        .bind(&key.kind)
        .bind(key.day)
        .bind(key.slot_no as i32)
        .fetch_optional(conn)
        .await?
        .as_ref()
        .map(|r| Ok((planned_row(r)?, r.try_get("db_now")?)))
        .transpose()
}

/// The `FROM` of every read of stored plans by key: the plans of the keys
/// bound as `$1` (kinds), `$2` (days) and `$3` (slot numbers), in the
/// columns of [`key_columns`], as `p`.
///
/// Each plan is looked up on its primary key (the `LATERAL … OFFSET 0`):
/// as a join, Postgres hashed the whole of `planned_slot` for every read
/// (a table filled during the day still carries the statistics of an
/// empty one; `auto_explain`: a Seq Scan of 20,000 rows for 224 keys), a
/// cost that grows with every day planned.
pub(crate) const PLANS_BY_KEY: &str = "FROM UNNEST($1::text[], $2::date[], $3::int[]) AS t(k, d, s)
           CROSS JOIN LATERAL (
                SELECT * FROM planned_slot p
                 WHERE p.kind = t.k AND p.day = t.d AND p.slot = t.s
                OFFSET 0) p";

/// The stored plan of several slots, keyed like the input.
pub async fn get_planned_many(
    pool: &PgPool,
    keys: &[SlotKey],
) -> Result<Vec<PlannedSlot>, StoreError> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT p.kind, p.day, p.slot, p.nominal_at, p.due_at, p.jitter_ms
               {PLANS_BY_KEY}
              ORDER BY p.kind, p.day, p.slot"
        )
    });
    let (kinds, days, nos) = key_columns(keys);
    let rows = sqlx::query(SQL.as_str())
        .bind(&kinds)
        .bind(&days)
        .bind(&nos)
        .fetch_all(pool)
        .await?;
    rows.iter().map(planned_row).collect()
}

/// The planned slots of `kind` on `days` whose numbers are among
/// `numbers` (a kind's retired numbers), each with its gate row's state if
/// it has one, by day and number. Looked up on the primary key: a handful
/// of rows, whatever the size of the days.
pub async fn planned_with_numbers(
    pool: &PgPool,
    kind: &str,
    days: &[NaiveDate],
    numbers: &[i32],
) -> Result<Vec<(PlannedSlot, Option<crate::outcome::SlotState>)>, StoreError> {
    let rows = sqlx::query(
        "SELECT p.kind, p.day, p.slot, p.nominal_at, p.due_at, p.jitter_ms, g.state
           FROM planned_slot p
           LEFT JOIN publish_slot g ON g.day = p.day AND g.slot = p.slot AND g.kind = p.kind
          WHERE p.kind = $1 AND p.day = ANY($2) AND p.slot = ANY($3)
          ORDER BY p.day, p.slot",
    )
    .bind(kind)
    .bind(days)
    .bind(numbers)
    .fetch_all(pool)
    .await?;
    rows.iter()
        .map(|r| Ok((planned_row(r)?, r.try_get("state")?)))
        .collect()
}

/// [`unstarted_due`]'s statement: per kind, its window's due slots in due
/// order, each probed for a gate row (`store::no_gate_row!`).
const UNSTARTED_DUE: &str = concat!(
    "SELECT p.kind, p.day, p.slot, p.nominal_at, p.due_at, p.jitter_ms
       FROM UNNEST($1::text[], $2::timestamptz[]) AS w(kind, since)
       CROSS JOIN LATERAL (
            SELECT q.* FROM planned_slot q
             WHERE q.kind = w.kind AND q.due_at > w.since AND q.due_at <= $3
               AND ",
    no_gate_row!("q"),
    "
             ORDER BY q.due_at
             LIMIT $4) p
      ORDER BY p.due_at
      LIMIT $4"
);

/// Planned slots that have no gate row yet and are due in their kind's
/// window `(since, now]`, oldest first. `windows` is (kind, since) per
/// kind: only those ranges are read (index `planned_slot_kind_due`), so the
/// cost is the slots due in the windows, not all history.
pub async fn unstarted_due(
    pool: &PgPool,
    windows: &[(String, DateTime<Utc>)],
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<PlannedSlot>, StoreError> {
    let (kinds, since): (Vec<&str>, Vec<DateTime<Utc>>) =
        windows.iter().map(|(k, t)| (k.as_str(), *t)).unzip();
    let rows = sqlx::query(UNSTARTED_DUE)
        .bind(&kinds)
        .bind(&since)
        .bind(now)
        .bind(limit)
        .fetch_all(pool)
        .await?;
    rows.iter().map(planned_row).collect()
}

/// [`without_gate`]'s statement.
const WITHOUT_GATE: &str = concat!(
    "SELECT t.kind, t.day, t.slot FROM UNNEST($1::text[], $2::date[], $3::int[]) AS t(kind, day, slot)
      WHERE ",
    no_gate_row!("t")
);

/// Of `keys`, those that still have no gate row.
pub async fn without_gate(pool: &PgPool, keys: &[SlotKey]) -> Result<Vec<SlotKey>, StoreError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let (kinds, days, nos) = key_columns(keys);
    let rows = sqlx::query(WITHOUT_GATE)
        .bind(&kinds)
        .bind(&days)
        .bind(&nos)
        .fetch_all(pool)
        .await?;
    rows.iter().map(key_row).collect()
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The day [`a_burst_under_way`] fills.
    pub(crate) fn burst_day() -> NaiveDate {
        NaiveDate::from_ymd_opt(2030, 1, 15).unwrap()
    }

    /// A burst's tables, as the reconciler meets them: 40,000 planned slots
    /// due on [`burst_day`], 36,000 of them with gate rows, neither table
    /// analyzed yet (and autovacuum kept off them, so it cannot analyze
    /// them meanwhile).
    pub(crate) async fn a_burst_under_way() -> testkit::TestDb {
        let db = testkit::TestDb::new().await;
        for sql in [
            "ALTER TABLE planned_slot SET (autovacuum_enabled = false)",
            "ALTER TABLE publish_slot SET (autovacuum_enabled = false)",
            "INSERT INTO planned_slot (kind, day, slot, nominal_at, due_at, jitter_ms, source)
             SELECT 'k' || k, $1, s, now() - interval '1 min',
                    now() - interval '1 min' + s * interval '1 ms', 0, 'plan'
               FROM generate_series(0, 9) k, generate_series(1, 4000) s",
            "INSERT INTO publish_slot (day, slot, kind, state, claimed_by)
             SELECT $1, s, 'k' || k, 'published', 'w'
               FROM generate_series(0, 9) k, generate_series(1, 3600) s",
        ] {
            sqlx::query(sql)
                .bind(burst_day())
                .execute(&db.pool)
                .await
                .unwrap();
        }
        db
    }

    /// The gate-row probe of an `EXPLAIN` goes through the unique index,
    /// and nothing reads `publish_slot` another way.
    pub(crate) fn probes_the_unique_index(plan: &[String]) {
        testkit::query_plan::assert_reads_by_index(
            &testkit::query_plan::text(plan),
            "publish_slot",
            "publish_slot_day_slot_kind_key",
            &["publish_slot_kind_day"],
        );
    }

    fn kinds() -> Vec<String> {
        (0..10).map(|k| format!("k{k}")).collect()
    }

    /// The reconciler probes each due slot for its gate row on the unique
    /// index. Through `publish_slot_kind_day`, the plan Postgres chose on
    /// these statistics, every probe read all gate rows of its kind and day
    /// (5.5 s for this read, against 0.13 s; see `store::no_gate_row!`).
    #[tokio::test]
    async fn the_reconciler_probes_each_due_slot_on_the_unique_index_in_a_burst() {
        let db = a_burst_under_way().await;
        let now = Utc::now();
        let since = vec![now - chrono::Duration::days(2); 10];
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {UNSTARTED_DUE}"))
            .bind(kinds())
            .bind(&since)
            .bind(now)
            .bind(1000i64)
            .fetch_all(&db.pool)
            .await
            .unwrap();
        probes_the_unique_index(&plan);
        // And it reads what it should: the slots without a gate row (3601
        // to 4000 of each kind), oldest first.
        let windows: Vec<(String, DateTime<Utc>)> =
            kinds().into_iter().zip(since.iter().copied()).collect();
        let due = unstarted_due(&db.pool, &windows, now, 1000).await.unwrap();
        assert_eq!(due.len(), 1000);
        assert!(due.iter().all(|p| p.key.slot_no > 3600), "{due:?}");
        assert!(due.windows(2).all(|w| w[0].due_at <= w[1].due_at));
    }

    /// The reconciler's second look (which of these still have no gate
    /// row) probes the same index the same way.
    #[tokio::test]
    async fn the_second_look_probes_the_unique_index_in_a_burst() {
        let db = a_burst_under_way().await;
        let keys: Vec<SlotKey> = (3001..=4000)
            .map(|s| SlotKey::new("k3", burst_day(), s))
            .collect();
        let (kinds, days, nos) = key_columns(&keys);
        let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN {WITHOUT_GATE}"))
            .bind(&kinds)
            .bind(&days)
            .bind(&nos)
            .fetch_all(&db.pool)
            .await
            .unwrap();
        probes_the_unique_index(&plan);
        let still = without_gate(&db.pool, &keys).await.unwrap();
        assert_eq!(still.len(), 400);
        assert!(still.iter().all(|k| k.slot_no > 3600));
    }
}

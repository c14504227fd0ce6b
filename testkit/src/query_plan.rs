//! Assertions on the shape of a Postgres query plan (`EXPLAIN`'s rows):
//! the store's statements are tested not only for what they return but
//! for how Postgres reads the hot tables, since a plan that reads a whole
//! table works on a test's few rows and stalls in production.

/// `EXPLAIN`'s rows as one text, for assertions and their messages.
pub fn text(rows: &[String]) -> String {
    rows.join("\n")
}

/// Panics unless `plan` reads `table` through `index`, never whole
/// (`Seq Scan on <table>`), and through none of the `avoided` indexes.
pub fn assert_reads_by_index(plan: &str, table: &str, index: &str, avoided: &[&str]) {
    assert!(
        plan.contains(index),
        "{table} is not read through {index}:\n{plan}"
    );
    for other in avoided {
        assert!(
            !plan.contains(other),
            "{table} is read through {other}:\n{plan}"
        );
    }
    assert!(
        !plan.contains(&format!("Seq Scan on {table}")),
        "{table} is read whole:\n{plan}"
    );
}

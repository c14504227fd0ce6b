//! `slotgate-bench import`: `planner drafts import` (the release binary,
//! file to exit) next to two baselines measured in the same run on the same
//! rows: the ceiling, a bare `COPY` of the imported rows into a scratch copy
//! of `draft`, and the row-by-row path the import used before (one
//! `INSERT` per draft in one transaction, `store::insert_draft`).

use crate::figures::{emit, median};
use crate::stack::Stack;
use anyhow::{ensure, Result};
use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use std::time::Instant;

/// Kinds the drafts are spread over.
const KINDS: usize = 4;

/// One generated draft: what the file says and the legacy path inserts.
struct Draft {
    kind: String,
    title: String,
    body: String,
    ready_at: Option<DateTime<Utc>>,
}

/// `n` drafts with bodies of a few hundred bytes; every tenth one carries a
/// `ready_at`, some titles hold characters `COPY` must escape.
fn drafts(n: usize) -> Vec<Draft> {
    let base = DateTime::parse_from_rfc3339("2026-11-30T00:00:00Z")
        .expect("date")
        .with_timezone(&Utc);
    (0..n)
        .map(|i| Draft {
            kind: format!("k{}", i % KINDS),
            title: if i % 7 == 0 {
                format!("draft {i}\twith a tab, a \\ and\na newline")
            } else {
                format!("draft {i}")
            },
            body: format!("<p>body of draft {i}</p>").repeat(12),
            ready_at: (i % 10 == 0).then(|| base + chrono::Duration::seconds(i as i64)),
        })
        .collect()
}

fn jsonl(drafts: &[Draft]) -> String {
    let mut out = String::new();
    for d in drafts {
        let mut line = json!({"kind": d.kind, "title": d.title, "body": d.body});
        if let Some(t) = d.ready_at {
            line["ready_at"] = json!(t.to_rfc3339());
        }
        out.push_str(&line.to_string());
        out.push('\n');
    }
    out
}

/// One run on a fresh stack → (import s, COPY ceiling s, row-by-row s).
async fn once(rows: &[Draft], file_text: &str) -> Result<(f64, f64, f64)> {
    let stack = Stack::new(&crate::stack::kinds_toml(
        KINDS,
        1,
        &|_| "12:00".into(),
        "0s",
        1,
        "",
    ))
    .await?;
    let file = stack.kit.dir.join("drafts.jsonl");
    std::fs::write(&file, file_text)?;
    let import = stack
        .planner(&["drafts", "import", file.to_str().expect("utf-8 path")])?
        .as_secs_f64();
    let n = rows.len() as i64;
    ensure!(
        stack.count("SELECT count(*) FROM draft").await == n,
        "import left a count other than {n}"
    );
    let ceiling = stack.copy_ceiling("draft").await?;
    sqlx::query("DELETE FROM draft")
        .execute(&stack.db().pool)
        .await?;
    let started = Instant::now();
    let now = Utc::now();
    let mut tx = stack.db().pool.begin().await?;
    for d in rows {
        slotgate::store::insert_draft(
            &mut tx,
            &slotgate::store::NewDraft {
                kind: &d.kind,
                title: &d.title,
                body: &d.body,
                ready_at: d.ready_at.unwrap_or(now),
                priority: 0,
                category: None,
            },
            now,
        )
        .await?;
    }
    tx.commit().await?;
    let legacy = started.elapsed().as_secs_f64();
    ensure!(stack.count("SELECT count(*) FROM draft").await == n);
    Ok((import, ceiling, legacy))
}

/// `runs` runs of importing `n` drafts → medians and ratios.
pub async fn run(n: usize, runs: usize) -> Result<Value> {
    let rows = drafts(n);
    let text = jsonl(&rows);
    println!(
        "\n## Import: {n} drafts ({:.1} MB of JSON Lines); median of {runs} runs",
        text.len() as f64 / 1e6
    );
    let (mut import, mut ceiling, mut legacy) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        let (i, c, l) = once(&rows, &text).await?;
        import.push(i);
        ceiling.push(c);
        legacy.push(l);
    }
    let all = json!({"import_s": import, "copy_ceiling_s": ceiling, "row_by_row_s": legacy});
    let (i, c, l) = (
        median(&mut import),
        median(&mut ceiling),
        median(&mut legacy),
    );
    let rate = |s: f64| n as f64 / s;
    println!("{:<44} {:>9} {:>12}", "", "seconds", "drafts/s");
    println!(
        "{:<44} {:>9.2} {:>12.0}",
        "planner drafts import (COPY, whole CLI)",
        i,
        rate(i)
    );
    println!(
        "{:<44} {:>9.2} {:>12.0}",
        "ceiling: bare COPY of the rows",
        c,
        rate(c)
    );
    println!(
        "{:<44} {:>9.2} {:>12.0}",
        "before: row-by-row INSERT, one transaction",
        l,
        rate(l)
    );
    println!(
        "ratio to the ceiling {:.2}; speed-up over row-by-row {:.1}x",
        c / i,
        l / i
    );
    let v = json!({
        "drafts": n, "runs": runs,
        "import_per_s": rate(i), "copy_ceiling_per_s": rate(c), "row_by_row_per_s": rate(l),
        "ratio_to_ceiling": c / i, "speedup_over_row_by_row": l / i, "all": all,
    });
    emit("import", v.clone());
    Ok(v)
}

//! How a benchmark's figures are summarised and handed on: medians and
//! percentiles of repeated runs, and the one `BENCH {json}` line per
//! benchmark that tools read.

use chrono::Utc;
use serde_json::{json, Value};

pub(crate) fn emit(name: &str, v: Value) {
    println!(
        "BENCH {}",
        json!({"bench": name, "at": Utc::now().to_rfc3339(), "result": v})
    );
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

//! `slotgate-bench crowd`: record-only slots of many kinds all due at
//! once → first start to last finish and worker RSS, next to the
//! batched-write ceiling.

use crate::burst::{burst_once, Spec};
use crate::figures::{emit, median};
use anyhow::Result;
use serde_json::{json, Value};
use testkit::cms::Cms;

/// `slots` record-only slots of `kinds` kinds all due in the same second,
/// `workers` workers: first start to last finish and peak worker RSS,
/// next to the time the batched-write ceiling (measured on the same
/// database right after) would take for as many slots. Medians of `runs`.
pub(crate) async fn run(
    slots: usize,
    kinds: usize,
    workers: usize,
    runs: usize,
    batch: usize,
    shape: &str,
) -> Result<Value> {
    let cms = Cms::start().await;
    println!("\n## Crowd: {slots} record-only slots of {kinds} kinds all due at once ({shape}), {workers} workers; median of {runs} runs");
    println!(
        "{:>10} {:>10} {:>16} {:>12}",
        "seconds", "slots/s", "ceiling seconds", "peak RSS MiB"
    );
    let (mut secs, mut rates, mut ceil_secs, mut rsss) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs.max(1) {
        let spec = Spec {
            shape,
            mode: "record-only",
            workers,
            slots,
            kinds,
            concurrency: 8,
            batch,
            body_bytes: 0,
        };
        let r = burst_once(&cms, &spec).await?;
        secs.push(r.secs);
        rates.push(r.rate);
        ceil_secs.push(slots as f64 / r.ceiling);
        rsss.push(r.rss);
    }
    let rss = rsss.iter().copied().fold(0.0, f64::max);
    let (s, r, c) = (
        median(&mut secs.clone()),
        median(&mut rates.clone()),
        median(&mut ceil_secs.clone()),
    );
    println!("{s:>10.2} {r:>10.0} {c:>16.2} {rss:>12.1}");
    let v = json!({"slots": slots, "kinds": kinds, "workers": workers, "shape": shape, "seconds": s, "slots_per_s": r,
                   "ceiling_seconds": c, "peak_rss_mib": rss,
                   "runs": {"seconds": secs, "slots_per_s": rates, "ceiling_seconds": ceil_secs, "peak_rss_mib": rsss}});
    emit("crowd", v.clone());
    Ok(v)
}

//! `slotgate-bench backoff`: a seeded simulation of clients contending
//! on one optimistic-concurrency row, per retry strategy.

use crate::figures::{emit, median};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use slotgate::retry::Backoff;
use std::collections::BinaryHeap;
use std::time::Duration;

/// One run of the AWS experiment: `clients` each want one successful
/// conditional write to a single row. A write carries the version the client
/// last saw and succeeds only if nobody wrote since; every answer tells the
/// client the current version. Network delay per hop |N(10 ms, 2 ms)|.
/// Returns (total calls, completion time in ms).
pub(crate) fn simulate(strategy: Backoff, clients: usize, rng: &mut StdRng) -> (u64, f64) {
    #[derive(PartialEq)]
    struct Ev(f64, usize, bool); // time ms, client, arrives at server (else: answer back)
    impl Eq for Ev {}
    // Reversed, so the heap pops the earliest event first. PartialOrd must
    // agree with Ord: BinaryHeap compares with `<=`.
    impl PartialOrd for Ev {
        fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(o))
        }
    }
    impl Ord for Ev {
        fn cmp(&self, o: &Self) -> std::cmp::Ordering {
            o.0.total_cmp(&self.0).then(o.1.cmp(&self.1))
        }
    }
    let hop = |rng: &mut StdRng| {
        // Box-Muller.
        let (u1, u2): (f64, f64) = (rng.gen_range(f64::EPSILON..1.0), rng.gen());
        (10.0 + 2.0 * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()).abs()
    };
    let (base, cap) = (Duration::from_millis(5), Duration::from_secs(2));
    let mut version = 0u64;
    let mut seen = vec![0u64; clients];
    let mut attempts = vec![0u32; clients];
    let mut prev = vec![base; clients];
    let mut ok = vec![false; clients];
    let mut heap = BinaryHeap::new();
    for c in 0..clients {
        heap.push(Ev(hop(rng), c, true));
    }
    let (mut calls, mut done, mut last) = (clients as u64, 0usize, 0.0f64);
    while let Some(Ev(t, c, at_server)) = heap.pop() {
        if at_server {
            if seen[c] == version {
                version += 1;
                ok[c] = true;
            }
            seen[c] = version;
            heap.push(Ev(t + hop(rng), c, false));
        } else if ok[c] {
            done += 1;
            last = t;
            if done == clients {
                break;
            }
        } else {
            let d = strategy.delay(rng, base, cap, attempts[c], prev[c]);
            prev[c] = d.max(base);
            attempts[c] += 1;
            calls += 1;
            heap.push(Ev(t + d.as_secs_f64() * 1000.0 + hop(rng), c, true));
        }
    }
    (calls, last)
}

pub(crate) fn run(clients: &[usize], seed: u64, runs: usize) -> Value {
    println!("\n## Backoff strategies: clients contending on one row (seed {seed}, median of {runs} runs; base 5 ms, cap 2 s)");
    println!(
        "{:>8} {:<13} {:>12} {:>14} {:>20}",
        "clients", "strategy", "calls", "completion ms", "calls ÷ exponential"
    );
    let mut rows = Vec::new();
    let mut rng = StdRng::seed_from_u64(seed);
    for &n in clients {
        let mut exp_calls = f64::NAN;
        for s in Backoff::ALL {
            let (mut calls, mut ms): (Vec<f64>, Vec<f64>) = (0..runs)
                .map(|_| simulate(s, n, &mut rng))
                .map(|(c, t)| (c as f64, t))
                .unzip();
            let (c, t) = (median(&mut calls), median(&mut ms));
            if s == Backoff::Exponential {
                exp_calls = c;
            }
            rows.push(json!({"clients": n, "strategy": s.name(), "calls": c, "completion_ms": t}));
            println!(
                "{:>8} {:<13} {:>12.0} {:>14.0} {:>20}",
                n,
                s.name(),
                c,
                t,
                if exp_calls.is_nan() {
                    "-".into()
                } else {
                    format!("{:.2}", c / exp_calls)
                }
            );
        }
    }
    let v = json!({"seed": seed, "runs": runs, "rows": rows});
    emit("backoff", v.clone());
    v
}

//! The bounded CI run of the chaos suite: the real `chaos` binary, with two
//! fixed seeds and a short compressed day each, against the Postgres and
//! Redis of `DATABASE_URL` / `REDIS_URL` (a database and a key prefix of
//! each run's own). Every run must exit 0 and its table must show 0 lost
//! and 0 doubled effects.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

const SEEDS: [u64; 2] = [1, 20261129];
const DURATION: &str = "30s";

fn chaos_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_chaos"))
}

/// The `all` row of the summary table: (lost, doubled).
fn totals(stdout: &str) -> Option<(u64, u64)> {
    let line = stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some("all"))?;
    let cols: Vec<&str> = line.split_whitespace().collect();
    // all | injected | deliveries | dup-blocked | effects | lost | doubled | unexpected
    Some((cols.get(5)?.parse().ok()?, cols.get(6)?.parse().ok()?))
}

#[test]
fn seeded_chaos_runs_lose_and_double_nothing() {
    let chaos = chaos_bin();
    let planner = testkit::process::sibling(&chaos, "planner");
    let worker = testkit::process::sibling(&chaos, "worker");
    for b in [&planner, &worker] {
        assert!(
            b.is_file(),
            "{} is missing: build the workspace's binaries first (cargo build -p planner -p worker; \
             `cargo nextest run --workspace` builds them)",
            b.display()
        );
    }
    for seed in SEEDS {
        let started = Instant::now();
        let out = Command::new(&chaos)
            .args(["--seed", &seed.to_string(), "--duration", DURATION])
            .args(["--settle", "60s"])
            .arg("--planner")
            .arg(&planner)
            .arg("--worker")
            .arg(&worker)
            .output()
            .expect("run chaos");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!(
            "chaos --seed {seed}: {:?} in {:.1}s\n{stdout}{stderr}",
            out.status,
            started.elapsed().as_secs_f64()
        );
        assert!(
            out.status.success(),
            "chaos --seed {seed} failed ({:?}); see the output above",
            out.status
        );
        let (lost, doubled) =
            totals(&stdout).unwrap_or_else(|| panic!("no `all` row in the table of seed {seed}"));
        assert_eq!((lost, doubled), (0, 0), "seed {seed}: lost, doubled");
        assert!(stdout.contains(&format!("chaos: PASS seed={seed} lost=0 doubled=0")));
    }
}

#[test]
fn the_table_parser_reads_the_all_row() {
    let sample = "fault  injected\nall  47  172  19  80  0  0  0\n";
    assert_eq!(totals(sample), Some((0, 0)));
    assert_eq!(totals("all 1 2 3 4 5 6 7"), Some((5, 6)));
    assert_eq!(totals("nothing here"), None);
}

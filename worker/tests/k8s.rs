//! `deploy/k8s/` cannot be applied here (no cluster), so what it relies on
//! is checked against the real binaries: every manifest parses and is listed
//! in the kustomization; every container runs a real command with flags the
//! binaries accept; probes and scrape annotations point at the port the
//! process serves `/healthz`, `/readyz` and `/metrics` on — and the worker
//! and `planner run`, started with the manifests' own arguments, answer
//! there; grace periods outlast the drain; `planner audit deploy/k8s` finds
//! nothing high. Like `shared/tests/compose.rs` for compose.yaml.

use serde::Deserialize;
use serde_yaml_ng::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;
use testkit::process::Proc;
use testkit::{http_get, wait_for, TestDb, TestRedis};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/k8s")
}

fn worker_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_worker"))
}

fn planner_bin() -> PathBuf {
    testkit::process::sibling(&worker_bin(), "planner")
}

/// Every document of every `.yaml` file, with its file name.
fn documents() -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    let mut docs = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        for d in serde_yaml_ng::Deserializer::from_str(&text) {
            let v = Value::deserialize(d).unwrap_or_else(|e| panic!("{name}: {e}"));
            docs.push((name.clone(), v));
        }
    }
    docs
}

fn strs(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .map(|x| x.as_str().expect("a string").to_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The pod spec of a workload.
fn pod_spec(doc: &Value) -> Option<&Value> {
    match doc["kind"].as_str()? {
        "Deployment" | "Job" => Some(&doc["spec"]["template"]["spec"]),
        "CronJob" => Some(&doc["spec"]["jobTemplate"]["spec"]["template"]["spec"]),
        _ => None,
    }
}

/// The value after `flag` in `command`.
fn flag<'a>(command: &'a [String], flag: &str) -> Option<&'a str> {
    let i = command.iter().position(|a| a == flag)?;
    command.get(i + 1).map(String::as_str)
}

fn help(command: &[String]) -> String {
    let (bin, sub): (PathBuf, Vec<&str>) = match command[0].as_str() {
        "worker" => (worker_bin(), vec![]),
        "planner" => (planner_bin(), vec![command[1].as_str()]),
        other => panic!("unknown program {other}"),
    };
    let out = std::process::Command::new(&bin)
        .args(&sub)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (build the planner and worker first)",
                bin.display()
            )
        });
    assert!(out.status.success(), "{command:?} --help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn every_manifest_is_listed_and_the_config_is_valid() {
    let text = std::fs::read_to_string(dir().join("kustomization.yaml")).unwrap();
    let k: Value = serde_yaml_ng::from_str(&text).unwrap();
    let listed: BTreeSet<String> = strs(&k["resources"]).into_iter().collect();
    let files: BTreeSet<String> = documents()
        .into_iter()
        .map(|(f, _)| f)
        .filter(|f| f != "kustomization.yaml" && f != "secret.example.yaml")
        .collect();
    assert_eq!(listed, files, "kustomization.yaml lists every manifest");
    let generated = &k["configMapGenerator"][0];
    assert_eq!(generated["name"], "slotgate-config");
    for f in strs(&generated["files"]) {
        let config =
            slotgate::config::Config::load(&dir().join(&f)).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert!(!config.kinds.is_empty());
    }
    assert_eq!(k["images"][0]["name"], "slotgate");
}

#[test]
fn containers_run_real_flags_and_probe_the_port_they_serve() {
    let docs = documents();
    let secret = docs
        .iter()
        .find(|(f, _)| f == "secret.example.yaml")
        .map(|(_, d)| d.clone())
        .unwrap();
    let config = slotgate::config::Config::load(&dir().join("slotgate.toml")).unwrap();
    let mut seen = BTreeSet::new();
    let mut prefixes = BTreeSet::new();
    for (file, doc) in &docs {
        let Some(pod) = pod_spec(doc) else { continue };
        let what = format!("{file}: {}", doc["metadata"]["name"].as_str().unwrap());
        assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{what}");
        assert!(
            pod["securityContext"]["runAsUser"].as_u64().unwrap() > 0,
            "{what}"
        );
        for c in pod["containers"].as_sequence().unwrap() {
            assert!(
                c["image"].as_str().unwrap().starts_with("slotgate:"),
                "{what}"
            );
            assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
            let command = strs(&c["command"]);
            let help = help(&command);
            for f in command.iter().filter(|a| a.starts_with("--")) {
                assert!(
                    help.split_whitespace().any(|t| t == f.as_str()),
                    "{what}: {f} is a real flag"
                );
            }
            seen.insert(format!(
                "{} {}",
                command[0],
                command
                    .get(1)
                    .filter(|a| !a.starts_with('-'))
                    .map(String::as_str)
                    .unwrap_or("")
            ));
            let env = c["env"].as_sequence().unwrap();
            let var = |n: &str| env.iter().find(|e| e["name"] == n);
            if var("REDIS_URL").is_some() {
                // Everything that talks to Redis uses one key prefix, or a
                // trigger would deliver to a stream no worker reads.
                prefixes.insert(
                    var("SLOTGATE_PREFIX")
                        .and_then(|e| e["value"].as_str())
                        .unwrap_or_else(|| panic!("{what}: SLOTGATE_PREFIX"))
                        .to_owned(),
                );
            }
            for e in env {
                if let Some(r) = e["valueFrom"].get("secretKeyRef") {
                    assert_eq!(r["name"], "slotgate", "{what}");
                    let key = r["key"].as_str().unwrap();
                    assert!(
                        secret["stringData"].get(key).is_some(),
                        "{what}: the Secret's key {key} is documented"
                    );
                }
            }
            if let Some(kind) = flag(&command, "--kind") {
                assert!(
                    config.kind(kind).is_some(),
                    "{what}: kind {kind} is configured"
                );
            }
            for k in command
                .iter()
                .enumerate()
                .filter(|(_, a)| *a == "--skip-kind")
                .map(|(i, _)| &command[i + 1])
            {
                assert!(
                    config.kind(k).is_some(),
                    "{what}: --skip-kind {k} is configured"
                );
            }
            // Probes and scraping point at the port --metrics-addr serves.
            let Some(addr) = flag(&command, "--metrics-addr") else {
                assert!(
                    c.get("livenessProbe").is_none(),
                    "{what}: no endpoint to probe"
                );
                continue;
            };
            let port: u64 = addr.rsplit(':').next().unwrap().parse().unwrap();
            let ports = c["ports"].as_sequence().unwrap();
            let named = ports
                .iter()
                .find(|p| p["containerPort"].as_u64() == Some(port))
                .unwrap_or_else(|| panic!("{what}: port {port} declared"));
            for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
                let get = &c[probe]["httpGet"];
                assert_eq!(get["path"], path, "{what}: {probe}");
                assert!(
                    get["port"] == named["name"] || get["port"].as_u64() == Some(port),
                    "{what}: {probe} on the metrics port"
                );
            }
            let ann = &doc["spec"]["template"]["metadata"]["annotations"];
            assert_eq!(ann["prometheus.io/scrape"], "true", "{what}");
            assert_eq!(
                ann["prometheus.io/port"],
                port.to_string().as_str(),
                "{what}"
            );
            assert_eq!(ann["prometheus.io/path"], "/metrics", "{what}");
            if let Some(grace) = flag(&command, "--shutdown-grace") {
                let grace = humantime::parse_duration(grace).unwrap().as_secs();
                let term = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
                assert!(
                    term > grace,
                    "{what}: SIGKILL only after the drain ({term} > {grace})"
                );
            }
        }
    }
    assert_eq!(
        seen,
        [
            "planner migrate",
            "planner run",
            "planner trigger",
            "worker "
        ]
        .into_iter()
        .map(String::from)
        .collect(),
        "migration Job, planner, CronJob trigger and workers"
    );
    assert_eq!(prefixes.len(), 1, "one Redis key prefix: {prefixes:?}");
    let workers = docs
        .iter()
        .find(|(_, d)| d["kind"] == "Deployment" && d["metadata"]["name"] == "slotgate-worker")
        .map(|(_, d)| d)
        .unwrap();
    assert_eq!(workers["spec"]["replicas"], 3);
    let pdb = docs
        .iter()
        .find(|(_, d)| d["kind"] == "PodDisruptionBudget")
        .map(|(_, d)| d)
        .unwrap();
    assert_eq!(
        pdb["spec"]["selector"]["matchLabels"], workers["spec"]["template"]["metadata"]["labels"],
        "the budget covers the worker pods"
    );
    // One clock per kind: the CronJob's kind is not also planned.
    let cron_kind = docs
        .iter()
        .filter(|(_, d)| d["kind"] == "CronJob")
        .map(|(_, d)| pod_spec(d).unwrap())
        .map(|p| {
            flag(&strs(&p["containers"][0]["command"]), "--kind")
                .unwrap()
                .to_owned()
        })
        .collect::<Vec<_>>();
    let planner = docs
        .iter()
        .find(|(_, d)| d["metadata"]["name"] == "slotgate-planner")
        .map(|(_, d)| strs(&pod_spec(d).unwrap()["containers"][0]["command"]))
        .unwrap();
    for k in cron_kind {
        assert!(
            planner
                .windows(2)
                .any(|w| w[0] == "--skip-kind" && w[1] == k),
            "planner run skips {k}"
        );
    }
}

#[test]
fn the_audit_finds_nothing_in_deploy() {
    let out = std::process::Command::new(planner_bin())
        .args(["audit", "--json", "--now", "2026-09-25T00:00:00Z"])
        .arg(dir())
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["summary"]["high"], 0, "{report}");
    assert_eq!(report["summary"]["medium"], 0, "{report}");
}

/// The worker and `planner run`, started with the manifests' arguments
/// (the listen address moved to a free loopback port), answer their probes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deployments_commands_serve_their_probes() {
    let db = TestDb::new().await;
    let redis = TestRedis::new();
    let tmp = std::env::temp_dir().join(format!("slotgate-k8s-{}", redis.prefix));
    std::fs::create_dir_all(&tmp).unwrap();
    let config = dir().join("slotgate.toml");
    let envs = [
        ("DATABASE_URL", db.url.as_str()),
        ("REDIS_URL", redis.url.as_str()),
        ("SLOTGATE_PREFIX", redis.prefix.as_str()),
        ("SLOTGATE_CONFIG", config.to_str().unwrap()),
    ];
    let docs = documents();
    let mut procs = Vec::new();
    for name in ["slotgate-worker", "slotgate-planner"] {
        let doc = &docs
            .iter()
            .find(|(_, d)| d["metadata"]["name"] == name && d["kind"] == "Deployment")
            .unwrap()
            .1;
        let c = &pod_spec(doc).unwrap()["containers"][0];
        let mut command = strs(&c["command"]);
        let addr = format!("127.0.0.1:{}", testkit::server::pick_port());
        let i = command.iter().position(|a| a == "--metrics-addr").unwrap();
        command[i + 1] = addr.clone();
        let bin = if command[0] == "worker" {
            worker_bin()
        } else {
            planner_bin()
        };
        let args: Vec<&str> = command[1..].iter().map(String::as_str).collect();
        let p = Proc::spawn(name, &bin, &args, &envs, &tmp);
        for path in ["/healthz", "/readyz"] {
            let (status, body) =
                wait_for(&format!("{name} {path}"), Duration::from_secs(30), || {
                    let addr = addr.clone();
                    async move { http_get(&addr, path).await.ok() }
                })
                .await;
            assert_eq!(status, 200, "{name} {path}: {body}\n{}", p.log_text());
        }
        procs.push((name, addr, p));
    }
    // The planner's first round planned `article` (not `news`, whose clock is
    // the CronJob), and its /metrics says so.
    let (_, addr, planner) = &procs[1];
    let body = wait_for("the planner's first round", Duration::from_secs(30), || {
        let addr = addr.clone();
        async move {
            let (_, body) = http_get(&addr, "/metrics").await.ok()?;
            body.contains(r#"slotgate_plan_rounds_total{kind="article",result="ok"}"#)
                .then_some(body)
        }
    })
    .await;
    assert!(
        !body.contains(r#"kind="news""#),
        "{body}\n{}",
        planner.log_text()
    );
    assert!(body.contains("slotgate_queue_delayed"), "{body}");
    let planned: Vec<String> = sqlx::query_scalar("SELECT DISTINCT kind FROM planned_slot")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(planned, ["article"]);
    let (status, body) = http_get(&procs[0].1, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("slotgate_queue_ready"), "{body}");
    // Both stop cleanly on SIGTERM, as Kubernetes stops them.
    for (name, _, mut p) in procs {
        p.signal("TERM");
        let status = p.wait_timeout(Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| s.success()),
            "{name} exits 0 on SIGTERM: {status:?}\n{}",
            p.log_text()
        );
    }
}

//! compose.yaml cannot run here (no Docker engine), so its shape is checked:
//! the services, their order of start, the three worker replicas, and that
//! every command it runs is one the binaries accept.

use serde_yaml_ng::Value;

fn compose() -> Value {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../compose.yaml"))
        .expect("compose.yaml");
    serde_yaml_ng::from_str(&text).expect("compose.yaml is valid YAML")
}

#[test]
fn compose_runs_postgres_redis_migrate_planner_and_three_workers() {
    let c = compose();
    let s = &c["services"];
    for name in ["postgres", "redis", "migrate", "planner", "worker"] {
        assert!(s.get(name).is_some(), "service {name}");
    }
    assert_eq!(s["worker"]["deploy"]["replicas"].as_u64(), Some(3));
    assert_eq!(s["migrate"]["command"][1].as_str(), Some("migrate"));
    assert_eq!(
        s["migrate"]["depends_on"]["postgres"]["condition"].as_str(),
        Some("service_healthy")
    );
    for svc in ["planner", "worker"] {
        assert_eq!(
            s[svc]["depends_on"]["migrate"]["condition"].as_str(),
            Some("service_completed_successfully"),
            "{svc} waits for migrations"
        );
        assert_eq!(
            s[svc]["depends_on"]["redis"]["condition"].as_str(),
            Some("service_healthy")
        );
        assert_eq!(s[svc]["build"].as_str(), Some("."));
    }
    // Every slotgate container gets the connections from the environment.
    for svc in ["migrate", "planner", "worker"] {
        let env = &s[svc]["environment"];
        for var in [
            "DATABASE_URL",
            "REDIS_URL",
            "SLOTGATE_PREFIX",
            "SLOTGATE_CONFIG",
        ] {
            assert!(
                env.get(var).and_then(Value::as_str).is_some(),
                "{svc} has {var}"
            );
        }
        assert!(env["DATABASE_URL"]
            .as_str()
            .unwrap()
            .contains("@postgres:5432/"));
        assert!(env["REDIS_URL"].as_str().unwrap().contains("redis:6379"));
    }
    // The worker's grace period fits in compose's stop timeout.
    assert!(s["worker"]["stop_grace_period"].as_str().is_some());
    let dockerfile =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Dockerfile")).unwrap();
    assert!(dockerfile.contains("-p planner -p worker"));
    // Dependencies are built in a layer of their own, before the sources.
    let fetch = dockerfile
        .find("cargo fetch --locked")
        .expect("cargo fetch");
    let sources = dockerfile.find("COPY . .").expect("COPY . .");
    assert!(
        fetch < sources,
        "dependencies are cached before the sources are copied"
    );
    let ignore =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../.dockerignore")).unwrap();
    assert!(
        ignore.lines().any(|l| l.trim() == "target/"),
        "the build context skips target/"
    );
    assert!(dockerfile.contains("examples/slotgate.toml"));
    let example = std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/slotgate.toml"
    ));
    slotgate::config::Config::load(example).expect("the example config the image ships is valid");
}

#[test]
fn compose_commands_use_real_flags() {
    let c = compose();
    let worker: Vec<String> = c["services"]["worker"]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(worker[0], "worker");
    for flag in worker.iter().filter(|a| a.starts_with("--")) {
        assert!(
            [
                "--concurrency",
                "--lease-ttl",
                "--visibility",
                "--id",
                "--shutdown-grace",
                "--metrics-addr"
            ]
            .contains(&flag.as_str()),
            "unknown worker flag {flag}"
        );
    }
    let planner: Vec<&str> = c["services"]["planner"]["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(&planner[..2], ["planner", "run"]);
    // Both serve /metrics, /healthz and /readyz on the port they publish.
    for (svc, command, port) in [
        (
            "worker",
            worker.iter().map(String::as_str).collect(),
            "9100",
        ),
        ("planner", planner.clone(), "9101"),
    ] {
        let i = command
            .iter()
            .position(|a| *a == "--metrics-addr")
            .unwrap_or_else(|| panic!("{svc} serves metrics"));
        assert_eq!(command[i + 1], format!("0.0.0.0:{port}"), "{svc}");
        let ports = strs(&c["services"][svc]["ports"]);
        assert!(
            ports
                .iter()
                .any(|p| p == port || p.ends_with(&format!(":{port}"))),
            "{svc} publishes {port}: {ports:?}"
        );
    }
}

fn strs(v: &Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| s.iter().map(|x| x.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

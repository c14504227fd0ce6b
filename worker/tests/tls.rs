//! TLS everywhere, verified, and webhook authentication: the real `worker`
//! binary against a Postgres of the test's own with `ssl=on`, a TLS-only
//! `redis-server` and an HTTPS stand-in CMS, all with certificates of a CA
//! the test makes. A wrong CA fails each of the three with an error naming
//! the certificate; `sslmode=require` against a server without TLS fails.

use slotgate::config::{CaFile, WebhookAuth};
use slotgate::receiver::{Endpoint, Http};
use slotgate::secret::Secret;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use testkit::cms::{Cms, Reply};
use testkit::process::Proc;
use testkit::server::OwnedPostgres;
use testkit::server::TlsRedis;
use testkit::tls::TestCa;
use testkit::wait_for;

const TOKEN: &str = "tok-7f3a9c-bearer";
const SIGNING: &str = "whsec-51d2e8-signing";

fn tempdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "slotgate-tls-{tag}-{}-{}",
        std::process::id(),
        testkit::server::pick_port()
    ));
    std::fs::create_dir_all(&d).unwrap();
    let _ = Command::new("chmod").arg("755").arg(&d).status();
    d
}

/// A Postgres with `ssl=on` and `ca`'s server certificate.
fn tls_postgres(ca: &TestCa) -> OwnedPostgres {
    ca.hand_to_postgres();
    OwnedPostgres::start_with(&[
        ("ssl", "on"),
        ("ssl_cert_file", ca.server_cert.to_str().unwrap()),
        ("ssl_key_file", ca.server_key.to_str().unwrap()),
    ])
}

/// `postgres://postgres@127.0.0.1:<port>/postgres?sslmode=…&sslrootcert=…`.
fn pg_url(pg: &OwnedPostgres, mode: &str, root: &Path) -> String {
    format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode={mode}&sslrootcert={}",
        pg.port,
        root.display()
    )
}

/// HMAC-SHA256 of `text` under `key`, hex, by the openssl CLI (not by the
/// code under test).
fn openssl_hmac(key: &str, text: &[u8]) -> String {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args(["dgst", "-sha256", "-hmac", key])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl");
    child.stdin.take().unwrap().write_all(text).unwrap();
    let out = child.wait_with_output().unwrap();
    let s = String::from_utf8_lossy(&out.stdout);
    s.rsplit("= ").next().unwrap().trim().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verified_tls_everywhere_publishes_and_authenticates_each_call() {
    let dir = tempdir("e2e");
    let ca = TestCa::new(&dir, "good");
    let pg = tls_postgres(&ca);
    let redis = TlsRedis::start(&ca, &dir);
    let cms = Cms::start_tls(&ca.server_cert, &ca.server_key).await;
    // Kind b's CMS refuses the call: its stored error must not carry secrets.
    cms.script("/b/publish", [Reply::Status(403)]);

    let db_url = pg_url(&pg, "verify-full", &ca.ca);
    let admin = sqlx::PgPool::connect(&db_url).await.expect("verify-full");
    testkit::MIGRATOR.run(&admin).await.unwrap();
    sqlx::query("INSERT INTO draft (kind, title) VALUES ('a', 'one'), ('b', 'two')")
        .execute(&admin)
        .await
        .unwrap();

    let kind = |name: &str| {
        format!(
            "[[kinds]]\nname = \"{name}\"\ntimezone = \"UTC\"\nslots = [\"00:00\"]\ndaily_cap = 1\nstarting_deadline = \"48h\"\npublish_url = \"{}\"\nindex_url = \"{}\"\nhttp_attempts = 1\nca_file = \"{}\"\nauth = \"bearer\"\ntoken_env = \"TEST_CMS_TOKEN\"\nsigning_secret_env = \"TEST_CMS_SIGNING\"\n",
            cms.url(&format!("/{name}/publish")),
            cms.url(&format!("/{name}/index")),
            ca.ca.display()
        )
    };
    let cfg = dir.join("slotgate.toml");
    std::fs::write(&cfg, format!("{}\n{}", kind("a"), kind("b"))).unwrap();

    let prefix = "tls";
    let day = chrono::Utc::now().date_naive();
    let client = redis::Client::build_with_tls(
        redis.url(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(&ca.ca).unwrap()),
        },
    )
    .unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    for k in ["a", "b"] {
        let _: String = redis::cmd("XADD")
            .arg(slotgate::queue::KeySpace::new(prefix).part(0).ready())
            .arg("*")
            .arg("slot")
            .arg(format!("{k}:{day}:1"))
            .arg("caller")
            .arg("test")
            .query_async(&mut c)
            .await
            .unwrap();
    }
    let redis_url = redis.url();
    let envs = [
        ("DATABASE_URL", db_url.as_str()),
        ("REDIS_URL", redis_url.as_str()),
        ("SLOTGATE_REDIS_CA", ca.ca.to_str().unwrap()),
        ("SLOTGATE_PREFIX", prefix),
        ("SLOTGATE_CONFIG", cfg.to_str().unwrap()),
        ("TEST_CMS_TOKEN", TOKEN),
        ("TEST_CMS_SIGNING", SIGNING),
        ("RUST_LOG", "debug,sqlx=warn,hyper=info,rustls=info"),
    ];
    let w = Proc::spawn(
        "w",
        &PathBuf::from(env!("CARGO_BIN_EXE_worker")),
        &["--id", "w", "--lease-ttl", "3s"],
        &envs,
        &dir,
    );
    let outcomes: Vec<(String, String)> =
        wait_for("both slots executed", Duration::from_secs(30), || async {
            let rows: Vec<(String, String)> =
                sqlx::query_as("SELECT slot_key, outcome FROM execution ORDER BY slot_key")
                    .fetch_all(&admin)
                    .await
                    .unwrap();
            (rows.len() == 2).then_some(rows)
        })
        .await;
    assert_eq!(
        outcomes,
        vec![
            (format!("a:{day}:1"), "published".to_owned()),
            (format!("b:{day}:1"), "failed".to_owned())
        ],
        "{}",
        w.log_text()
    );
    // The worker's own sessions were encrypted.
    let (sessions, encrypted): (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = 'slotgate'",
    )
    .fetch_one(&admin)
    .await
    .unwrap();
    assert!(
        sessions > 0 && sessions == encrypted,
        "{encrypted} of {sessions} worker sessions use TLS"
    );

    // Publish and index of a, publish of b: each carries the token and a
    // signature over exactly the bytes received.
    let requests = cms.requests();
    let paths: Vec<&str> = requests.iter().map(|r| r.path.as_str()).collect();
    for p in ["/a/publish", "/a/index", "/b/publish"] {
        assert!(paths.contains(&p), "{p} called: {paths:?}");
    }
    let now = chrono::Utc::now().timestamp();
    for r in &requests {
        assert_eq!(
            r.header("authorization"),
            Some(format!("Bearer {TOKEN}").as_str()),
            "{}",
            r.path
        );
        let sig = r.header("slotgate-signature").expect("signed");
        let (t, v1) = sig
            .strip_prefix("t=")
            .and_then(|s| s.split_once(",v1="))
            .unwrap_or_else(|| panic!("signature format: {sig}"));
        let t: i64 = t.parse().unwrap();
        assert!((now - t).abs() < 300, "timestamp {t} is now-ish ({now})");
        let mut signed = format!("{t}.").into_bytes();
        signed.extend_from_slice(&r.raw);
        assert_eq!(v1, openssl_hmac(SIGNING, &signed), "{}", r.path);
        // A receiver with another secret would reject it.
        assert_ne!(v1, openssl_hmac("other", &signed));
    }

    // Secrets are nowhere: not in rows, not in the log.
    let rows: Vec<String> = sqlx::query_scalar(
        "SELECT row_to_json(e)::text FROM execution e UNION ALL SELECT row_to_json(p)::text FROM publish_slot p",
    )
    .fetch_all(&admin)
    .await
    .unwrap();
    let failed = rows
        .iter()
        .find(|r| r.contains("403"))
        .unwrap_or_else(|| panic!("b's failure is recorded with its status: {rows:?}"));
    for secret in [TOKEN, SIGNING] {
        assert!(!failed.contains(secret));
        assert!(rows.iter().all(|r| !r.contains(secret)), "{rows:?}");
    }
    w.signal("TERM");
    let log = w.log_text();
    assert!(log.contains("403"), "the failure is logged: {log}");
    for secret in [TOKEN, SIGNING] {
        assert!(!log.contains(secret), "{secret} in the log");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_fails_each_connection_naming_the_certificate() {
    let dir = tempdir("wrong");
    let ca = TestCa::new(&dir, "good");
    let other = TestCa::new(&dir, "other");
    let pg = tls_postgres(&ca);
    let redis = TlsRedis::start(&ca, &dir);
    let cms = Cms::start_tls(&ca.server_cert, &ca.server_key).await;
    // rustls's words for a chain that ends at a CA nobody trusts.
    let certificate = |e: &str| e.contains("invalid peer certificate: UnknownIssuer");

    // Postgres: verify-full with the other CA.
    let err = slotgate::store::connect(
        &pg_url(&pg, "verify-full", &other.ca),
        1,
        &Default::default(),
    )
    .await
    .expect_err("a certificate of another CA is refused");
    eprintln!("postgres, other CA: {err}");
    assert!(certificate(&format!("{err:#} {err:?}")), "{err:?}");
    // The right CA works (the failure above is the CA's, not the server's).
    slotgate::store::connect(&pg_url(&pg, "verify-full", &ca.ca), 1, &Default::default())
        .await
        .expect("the right CA is accepted");

    // Redis: SLOTGATE_REDIS_CA of the other CA.
    let opts = |ca: &Path| slotgate::queue::RedisOptions {
        ca: Some(ca.to_owned()),
        ..Default::default()
    };
    let q = |ca: &Path| {
        slotgate::queue::Queue::new(
            slotgate::queue::pool_with(&redis.url(), 1, &opts(ca)).unwrap(),
            slotgate::queue::KeySpace::new("tls"),
        )
    };
    let err = q(&other.ca).ping().await.expect_err("other CA");
    let text = format!("{err} {err:?}");
    eprintln!("redis, other CA: {err}");
    assert!(certificate(&text), "{text}");
    q(&ca.ca).ping().await.expect("the right CA is accepted");
    // Without a CA the system roots do not know the test CA either.
    let plain = slotgate::queue::Queue::new(
        slotgate::queue::pool(&redis.url(), 1).unwrap(),
        slotgate::queue::KeySpace::new("tls"),
    );
    assert!(plain.ping().await.is_err());

    // The webhook: a kind's ca_file of the other CA, and none at all.
    let call = |ca: Option<&Path>| {
        let auth = WebhookAuth {
            ca: ca.map(|p| CaFile::load(p).unwrap()),
            bearer: Some(Secret::new(TOKEN)),
            signing_secret: None,
        };
        let url = cms.url("/publish");
        async move {
            Http::new()
                .call_once(
                    &Endpoint {
                        name: "publish",
                        url: &url,
                        key: "k",
                        auth: &auth,
                        timeout: Duration::from_secs(5),
                    },
                    (&b"{}"[..]).into(),
                )
                .await
        }
    };
    for ca_file in [Some(other.ca.as_path()), None] {
        let f = call(ca_file).await.expect_err("untrusted certificate");
        eprintln!("webhook, ca_file {ca_file:?}: {}", f.error);
        assert!(certificate(&f.error), "{}", f.error);
        assert!(!f.error.contains(TOKEN), "{}", f.error);
    }
    assert!(cms.calls().is_empty(), "no request got past the handshake");
    let ok = call(Some(ca.ca.as_path())).await.expect("the right CA");
    assert_eq!(ok.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_require_refuses_a_server_without_tls() {
    let pg = OwnedPostgres::start();
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port);
    // The same server accepts plaintext, so the refusal below is TLS's.
    slotgate::store::connect(&url, 1, &Default::default())
        .await
        .expect("plaintext works");
    let err = slotgate::store::connect(&format!("{url}?sslmode=require"), 1, &Default::default())
        .await
        .expect_err("require needs TLS");
    eprintln!("postgres, sslmode=require without TLS: {err}");
    assert!(
        err.to_string().contains("server does not support TLS"),
        "{err}"
    );
}

#[test]
fn a_missing_token_or_bad_ca_exits_2_naming_the_field_not_the_value() {
    let dir = tempdir("cfg");
    let base = "[[kinds]]\nname = \"a\"\ntimezone = \"UTC\"\nslots = [\"00:00\"]\ndaily_cap = 1\nstarting_deadline = \"48h\"\npublish_url = \"https://cms.example/p\"\n";
    let not_pem = dir.join("not.pem");
    std::fs::write(&not_pem, "hello").unwrap();
    for (extra, env, expect) in [
        (
            "auth = \"bearer\"\ntoken_env = \"TEST_TLS_NO_SUCH_TOKEN\"\n",
            vec![],
            "TEST_TLS_NO_SUCH_TOKEN is not set",
        ),
        (
            "auth = \"bearer\"\ntoken_env = \"TEST_TLS_EMPTY\"\n",
            vec![("TEST_TLS_EMPTY", "")],
            "TEST_TLS_EMPTY is empty",
        ),
        (
            "signing_secret_env = \"TEST_TLS_NO_SUCH_SECRET\"\n",
            vec![],
            "field `signing_secret_env`",
        ),
        (
            &format!("ca_file = \"{}\"\n", not_pem.display()),
            vec![],
            "field `ca_file`",
        ),
        (
            "ca_file = \"/nonexistent/ca.pem\"\n",
            vec![],
            "field `ca_file`: cannot read",
        ),
    ] {
        let cfg = dir.join("slotgate.toml");
        std::fs::write(&cfg, format!("{base}{extra}")).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_worker"))
            .env("SLOTGATE_CONFIG", &cfg)
            .env("DATABASE_URL", "postgres://u:hunter2@127.0.0.1:1/x")
            .env("REDIS_URL", "redis://127.0.0.1:1/")
            .env_remove("TEST_TLS_NO_SUCH_TOKEN")
            .env_remove("TEST_TLS_NO_SUCH_SECRET")
            .envs(env)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{extra}: {err}");
        assert!(err.contains(expect), "{extra}: {err}");
    }
    // A set token is never echoed, even in a config error of another field.
    let cfg = dir.join("slotgate.toml");
    std::fs::write(
        &cfg,
        format!(
            "{base}auth = \"bearer\"\ntoken_env = \"TEST_TLS_TOKEN\"\nca_file = \"/nonexistent\"\n"
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_worker"))
        .env("SLOTGATE_CONFIG", &cfg)
        .env("DATABASE_URL", "postgres://127.0.0.1:1/x")
        .env("REDIS_URL", "redis://127.0.0.1:1/")
        .env("TEST_TLS_TOKEN", TOKEN)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(TOKEN));
}

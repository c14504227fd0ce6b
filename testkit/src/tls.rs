//! Certificates for TLS tests, made with the `openssl` CLI: a CA of the
//! test's own and a server certificate it signed for `127.0.0.1` and
//! `localhost`. The servers that use them (a TLS-only Redis, Sentinel with
//! TLS) are in [`crate::server`].

use std::path::{Path, PathBuf};
use std::process::Command;

/// A CA and one server certificate it signed, as PEM files in `dir`.
pub struct TestCa {
    /// Where the CA, certificates and keys are written.
    pub dir: PathBuf,
    /// The CA certificate (what a client trusts).
    pub ca: PathBuf,
    /// A server certificate for 127.0.0.1 and localhost, signed by the CA.
    pub server_cert: PathBuf,
    /// Its private key.
    pub server_key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl CLI (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl TestCa {
    /// Makes a CA named `name` and a server certificate under `dir/name`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).expect("ca dir");
        let subj = format!("/CN=slotgate test CA {name}");
        openssl(
            &dir,
            &[
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
                "ca.pem", "-days", "2", "-subj", &subj,
            ],
        );
        openssl(
            &dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ],
        );
        std::fs::write(
            dir.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n",
        )
        .expect("ext.cnf");
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.pem",
                "-days",
                "2",
                "-extfile",
                "ext.cnf",
            ],
        );
        TestCa {
            ca: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
            dir,
        }
    }

    /// Lets the `postgres` user read the files (Postgres refuses a key
    /// others can read, and runs as `postgres` when the tests run as root).
    pub fn hand_to_postgres(&self) {
        for (f, mode) in [
            (&self.server_cert, "644"),
            (&self.server_key, "600"),
            (&self.ca, "644"),
        ] {
            let _ = Command::new("chown")
                .arg("postgres:postgres")
                .arg(f)
                .status();
            let _ = Command::new("chmod").arg(mode).arg(f).status();
        }
        let _ = Command::new("chmod").arg("755").arg(&self.dir).status();
    }
}

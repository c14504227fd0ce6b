//! `wordpress` — a throwaway real WordPress (`testkit::server::OwnedWordPress`)
//! for demos: prints where it is and how to log in, then runs until told to
//! stop, and takes its MariaDB and files with it.

use std::io::{IsTerminal, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::process::ExitCode;
use std::time::Instant;
use testkit::server::OwnedWordPress;
use tokio::signal::unix::{signal, SignalKind};

const USAGE: &str = "\
usage: wordpress

Starts a throwaway WordPress (Debian's wordpress, mariadb-server, php-cli,
php-mysql; installed with apt-get when missing and root) on a free port of
127.0.0.1 and prints, on stdout:

  WORDPRESS_URL=http://127.0.0.1:<port>
  WORDPRESS_USER=<administrator>
  WORDPRESS_APP_PASSWORD=<its application password>
  WORDPRESS_CONTRIBUTOR_USER=<a contributor: may not publish>
  WORDPRESS_CONTRIBUTOR_APP_PASSWORD=<its application password>

Use the passwords with HTTP Basic auth on the REST API (/wp-json/wp/v2/...).
Runs until SIGTERM or SIGINT, or until stdin reaches end of file (unless
stdin is /dev/null, as for a script's background job); then stops WordPress
and its database and removes their files.";

/// Is stdin /dev/null (whose end of file says nothing)?
fn stdin_is_dev_null() -> bool {
    let (Ok(stdin), Ok(null)) = (
        std::fs::metadata("/dev/stdin"),
        std::fs::metadata("/dev/null"),
    ) else {
        return false;
    };
    stdin.file_type().is_char_device() && stdin.rdev() == null.rdev()
}

/// Resolves once stdin reaches end of file; never if it is /dev/null. Read
/// on a thread of its own, which does not keep the process alive (tokio's
/// stdin would hold up the runtime's shutdown until a line is read).
fn stdin_closed() -> tokio::sync::oneshot::Receiver<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if stdin_is_dev_null() {
        std::mem::forget(tx);
        return rx;
    }
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = tx.send(());
    });
    rx
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        None => {}
        Some("-h" | "--help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some(other) => {
            eprintln!("wordpress: unknown argument {other}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    // Handlers first: a signal during the start waits for it, then stops it,
    // rather than killing us and leaving the servers behind.
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("wordpress: cannot handle signals");
        return ExitCode::from(1);
    };
    let started = Instant::now();
    let wp = match tokio::task::spawn_blocking(OwnedWordPress::launch).await {
        Ok(Ok(wp)) => wp,
        Ok(Err(e)) => {
            eprintln!("wordpress: error: {e}");
            return ExitCode::from(1);
        }
        Err(e) => {
            eprintln!("wordpress: error: {e}");
            return ExitCode::from(1);
        }
    };
    let (user, password) = wp.admin();
    let (c_user, c_password) = wp.contributor();
    let mut out = std::io::stdout().lock();
    let printed = writeln!(
        out,
        "WORDPRESS_URL={}\nWORDPRESS_USER={user}\nWORDPRESS_APP_PASSWORD={password}\n\
         WORDPRESS_CONTRIBUTOR_USER={c_user}\nWORDPRESS_CONTRIBUTOR_APP_PASSWORD={c_password}",
        wp.url()
    )
    .and_then(|()| out.flush());
    drop(out);
    if let Err(e) = printed {
        eprintln!("wordpress: stdout: {e}");
        return ExitCode::from(1);
    }
    let how = if std::io::stdin().is_terminal() {
        "Ctrl-C or Ctrl-D"
    } else {
        "SIGTERM"
    };
    eprintln!(
        "wordpress: up at {} in {:.1}s; {how} stops it",
        wp.url(),
        started.elapsed().as_secs_f64()
    );
    let why = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = stdin_closed() => "end of stdin",
    };
    eprintln!("wordpress: {why}: stopping");
    drop(wp);
    ExitCode::SUCCESS
}

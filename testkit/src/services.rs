//! `scripts/with-services`: a command run with `DATABASE_URL` and
//! `REDIS_URL` pointing at servers that answer — the ones given, or
//! throwaway ones from [`crate::server`] (the same code the fault tests
//! use), stopped again when the command ends. A fresh machine needs nothing
//! running for the README's commands.

use crate::server::{OwnedPostgres, OwnedRedis, ServerError};
use std::process::ExitCode;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

/// How long a given server has to answer before a throwaway one is started.
const REACH_WITHIN: Duration = Duration::from_secs(5);

/// Why the command could not be run.
#[derive(Debug, thiserror::Error)]
pub enum ServicesError {
    #[error(transparent)]
    /// A throwaway server could not be provisioned.
    Server(#[from] ServerError),
    /// The command could not be started.
    #[error("running {cmd}: {source}")]
    Command {
        /// The command.
        cmd: String,
        /// Why it could not start.
        source: std::io::Error,
    },
}

/// The servers the command runs against; throwaway ones stop on drop.
pub struct Services {
    /// `DATABASE_URL` for the command.
    pub database_url: String,
    /// `REDIS_URL` for the command.
    pub redis_url: String,
    _postgres: Option<OwnedPostgres>,
    _redis: Option<OwnedRedis>,
}

/// A URL with its password hidden, for notes. Everything up to the last
/// `@` counts as the userinfo, since a password may hold `@`, `,` or `:`;
/// for a list of URLs (a Cluster's seed nodes) that hides every URL but the
/// last one's host, which is more than needed but never a password.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let Some((creds, host)) = rest.rsplit_once('@') else {
        return url.to_owned();
    };
    match creds.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => format!("{scheme}://***@{host}"),
    }
}

fn note(what: &str) {
    eprintln!("services: {what}");
}

async fn postgres_answers(url: &str) -> Result<(), String> {
    let ask = async {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(REACH_WITHIN)
            .connect(url)
            .await?;
        sqlx::query("SELECT 1").execute(&pool).await?;
        pool.close().await;
        Ok::<_, sqlx::Error>(())
    };
    match tokio::time::timeout(REACH_WITHIN, ask).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("no answer".into()),
    }
}

async fn redis_answers(url: &str) -> Result<(), String> {
    let ask = async {
        let client = redis::Client::open(url)?;
        let mut c = client.get_multiplexed_async_connection().await?;
        redis::cmd("PING").query_async::<String>(&mut c).await?;
        Ok::<_, redis::RedisError>(())
    };
    match tokio::time::timeout(REACH_WITHIN, ask).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("no answer".into()),
    }
}

/// The given URL in `var` if its server answers (`check`); `None` (and a
/// note why) if it is unset or does not answer.
async fn given<F, Fut>(var: &str, what: &str, check: F) -> Option<String>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let url = std::env::var(var).ok().filter(|u| !u.is_empty())?;
    match check(url.clone()).await {
        Ok(()) => {
            note(&format!("{what} from {var} ({})", redact(&url)));
            Some(url)
        }
        Err(e) => {
            note(&format!(
                "{var}={} does not answer ({e}); starting a throwaway {what}",
                redact(&url)
            ));
            None
        }
    }
}

impl Services {
    /// The given servers that answer, throwaway ones for the others.
    pub async fn provide() -> Result<Services, ServicesError> {
        let (pg_given, redis_given) = tokio::join!(
            given("DATABASE_URL", "postgres", |u| async move {
                postgres_answers(&u).await
            }),
            given(
                "REDIS_URL",
                "redis",
                |u| async move { redis_answers(&u).await }
            ),
        );
        let (database_url, postgres) = match pg_given {
            Some(u) => (u, None),
            None => {
                let pg = tokio::task::spawn_blocking(|| {
                    OwnedPostgres::launch(&[("shared_buffers", "128MB")])
                })
                .await
                .expect("the Postgres start panicked")?;
                note(&format!(
                    "postgres throwaway on 127.0.0.1:{} (in {})",
                    pg.port,
                    pg.dir().display()
                ));
                (pg.url("postgres"), Some(pg))
            }
        };
        let (redis_url, redis) = match redis_given {
            Some(u) => (u, None),
            None => {
                let r = tokio::task::spawn_blocking(OwnedRedis::launch)
                    .await
                    .expect("the Redis start panicked")?;
                note(&format!("redis throwaway on 127.0.0.1:{}", r.port));
                (r.url(), Some(r))
            }
        };
        Ok(Services {
            database_url,
            redis_url,
            _postgres: postgres,
            _redis: redis,
        })
    }
}

/// Runs `cmd` against [`Services::provide`] and returns its exit code; the
/// throwaway servers stop afterwards, also when the command is interrupted.
/// SIGTERM and SIGHUP are passed on to the command and its end awaited.
/// SIGINT is only awaited: Ctrl-C at a terminal reaches the command's whole
/// process group already, and a second one would cut its own clean-up short.
pub async fn run(cmd: &[String]) -> Result<ExitCode, ServicesError> {
    let (program, args) = cmd.split_first().expect("a command");
    let failed = |source| ServicesError::Command {
        cmd: program.clone(),
        source,
    };
    let mut int = signal(SignalKind::interrupt()).map_err(failed)?;
    let mut term = signal(SignalKind::terminate()).map_err(failed)?;
    let mut hup = signal(SignalKind::hangup()).map_err(failed)?;
    // A signal while the servers start waits for the start to end, so that
    // what was started is stopped again rather than left behind.
    let mut provide = std::pin::pin!(Services::provide());
    let mut interrupted = None;
    let services = loop {
        tokio::select! {
            s = &mut provide => break s?,
            _ = int.recv() => interrupted = Some(130),
            _ = term.recv() => interrupted = Some(143),
            _ = hup.recv() => interrupted = Some(129),
        }
    };
    if let Some(code) = interrupted {
        drop(services);
        return Ok(ExitCode::from(code));
    }
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("DATABASE_URL", &services.database_url)
        .env("REDIS_URL", &services.redis_url)
        .env("SLOTGATE_SERVICES", "1")
        .spawn()
        .map_err(failed)?;
    let pid = child.id().map(|p| nix::unistd::Pid::from_raw(p as i32));
    let status = loop {
        let sig = tokio::select! {
            st = child.wait() => break st.map_err(failed)?,
            _ = int.recv() => None,
            _ = term.recv() => Some(nix::sys::signal::Signal::SIGTERM),
            _ = hup.recv() => Some(nix::sys::signal::Signal::SIGHUP),
        };
        if let (Some(pid), Some(sig)) = (pid, sig) {
            let _ = nix::sys::signal::kill(pid, sig);
        }
    };
    drop(services);
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    Ok(ExitCode::from(code.clamp(0, 255) as u8))
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(
            redact("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact("redis://127.0.0.1:6379/"), "redis://127.0.0.1:6379/");
        assert_eq!(redact("redis://:pw@h/"), "redis://:***@h/");
        // Issue 39: a password with `@` or `,`, a list, a lone token.
        for (url, want) in [
            ("redis://:p@ss,w@h:6379/", "redis://:***@h:6379/"),
            ("redis://:a@h1,redis://:b@h2/", "redis://:***@h2/"),
            ("redis://token@h/", "redis://***@h/"),
        ] {
            assert_eq!(redact(url), want, "{url}");
        }
    }
}

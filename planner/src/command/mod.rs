//! Runs a parsed command: `dispatch` hands each subcommand to its verb
//! family's module, which parses nothing and prints the result of a
//! library operation (DESIGN.md section 4.3 for what each does). One module
//! per family, so that a verb is read, changed and reviewed on its own:
//! - [`setup`]: `migrate`, `check`.
//! - [`plan`]: `plan`, `run`.
//! - [`delivery`]: `trigger`, `backfill`.
//! - [`slot`]: `retry`, `abandon`, `skip`.
//! - [`pause`]: `pause`, `resume`.
//! - [`dead`]: `dead list|replay|purge`.
//! - [`drafts`]: `drafts add|import|sync|list`.
//! - [`report`]: `report`, `status`.
//! - [`forecast`]: `forecast`, the runway ahead.
//! - [`prune`] and [`audit`]: the verbs of their names.
//! - [`serve`]: `serve`, the console.
//!
//! `completions` is the flags' own business (`cli::print_completions`).

pub mod audit;
pub mod dead;
pub mod delivery;
pub mod drafts;
pub mod forecast;
pub mod pause;
pub mod plan;
pub mod prune;
pub mod report;
pub mod serve;
pub mod setup;
pub mod slot;

use crate::cli::{Cli, Cmd, TriggerArgs};
use crate::env::Env;
use crate::exit::failure_code;
use anyhow::Result;
use slotgate::clock::SystemClock;
use std::process::ExitCode;
use std::sync::Arc;

/// Runs one command to its exit status: checks the session flags (exit 2),
/// then runs the command on a multi-threaded runtime.
pub fn run(cli: Cli) -> ExitCode {
    if let Err(e) = cli.conn.pg.validate() {
        eprintln!("planner: error: {e}");
        return ExitCode::from(2);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let deadline = one_shot_deadline(&cli);
    let verb = verb_name(&cli.cmd);
    let run = async move {
        match deadline {
            None => dispatch(cli).await,
            Some(d) => tokio::time::timeout(d, dispatch(cli)).await.unwrap_or_else(|_| {
                Err(anyhow::anyhow!(
                    "planner {verb}: no answer within --deadline {} (Postgres or Redis went silent); stopped. Running it again is safe",
                    humantime::format_duration(d)
                ))
            }),
        }
    };
    let code = rt.block_on(run);
    // A command stopped at its deadline may leave a task blocked on a
    // silent socket: do not wait for it.
    rt.shutdown_timeout(std::time::Duration::from_millis(100));
    match code {
        Ok(code) => code,
        Err(e) => {
            eprintln!("planner: error: {e:#}");
            failure_code(&e)
        }
    }
}

/// The client-side deadline of a one-shot command: `--deadline`, plus
/// `--wait-timeout` for `trigger --wait`; `None` for the long-running
/// `run` and `serve` (rounds and requests have deadlines of their own).
fn one_shot_deadline(cli: &Cli) -> Option<std::time::Duration> {
    match &cli.cmd {
        Cmd::Run { .. } | Cmd::Serve { .. } => None,
        Cmd::Trigger(TriggerArgs {
            wait: true,
            wait_timeout,
            ..
        }) => Some(cli.deadline + *wait_timeout),
        _ => Some(cli.deadline),
    }
}

/// The subcommand's name, for messages.
fn verb_name(cmd: &Cmd) -> String {
    format!("{cmd:?}")
        .split([' ', '(', '{'])
        .next()
        .unwrap_or("")
        .to_lowercase()
}

/// Runs the parsed subcommand: one arm per verb, each its family's
/// function.
async fn dispatch(cli: Cli) -> Result<ExitCode> {
    let env = Env {
        clock: Arc::new(SystemClock),
        conn: cli.conn,
        config: cli.config,
    };
    match cli.cmd {
        Cmd::Migrate => setup::migrate(&env).await,
        Cmd::Check => setup::check(&env).await,
        Cmd::Plan {
            day,
            kinds,
            dry_run,
            json,
        } => plan::plan(&env, day, &kinds, dry_run, json).await,
        Cmd::Run {
            every,
            skip_kinds,
            round_deadline,
            metrics_addr,
        } => plan::run(&env, every, &skip_kinds, round_deadline, metrics_addr).await,
        Cmd::Trigger(args) => delivery::trigger(&env, args).await,
        Cmd::Backfill { kind, from, to } => delivery::backfill(&env, &kind, from, to).await,
        Cmd::Drafts(d) => {
            drafts::run(d, &env, &env.config).await?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Report { day, kinds, json } => report::report(&env, day, &kinds, json).await,
        Cmd::Forecast { kinds, days, json } => forecast::forecast(&env, &kinds, days, json).await,
        Cmd::Retry { slot } => slot::retry(&env, &slot).await,
        Cmd::Abandon {
            slot,
            requeue_draft,
        } => slot::abandon(&env, &slot, requeue_draft).await,
        Cmd::Audit {
            paths,
            json,
            now,
            zone,
            with_history,
        } => audit::audit(&env, &paths, json, now, zone, with_history).await,
        Cmd::Prune {
            older_than,
            dry_run,
            json,
        } => prune::prune(&env, older_than, dry_run, json).await,
        Cmd::Pause { kind, until, note } => pause::pause(&env, &kind, until, &note).await,
        Cmd::Resume { kind } => pause::resume(&env, &kind).await,
        Cmd::Skip { slot, note } => slot::skip(&env, &slot, &note).await,
        Cmd::Dead(d) => dead::run(d, &env).await,
        Cmd::Completions { shell } => {
            crate::cli::print_completions(shell);
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Serve {
            http,
            allow_actions,
            allow_hosts,
            max_connections,
            max_event_streams,
        } => {
            let exposure = crate::console::Exposure {
                allow_hosts,
                max_connections: max_connections as usize,
                max_event_streams: max_event_streams as usize,
            };
            serve::serve(&env, http, allow_actions, exposure).await
        }
        Cmd::Status { json } => report::status(&env, json).await,
    }
}

//! Runs a parsed command: each arm parses nothing and prints the result of a
//! library operation (DESIGN.md section 4.3 for what each does).

use crate::cli::{Cli, Cmd, DeadCmd};
use crate::env::{load_config, numbered, Env};
use crate::exit::{failure_code, wait_exit_code, BadInput};
use anyhow::{bail, Context, Result};
use slotgate::clock::SystemClock;
use slotgate::plan::Fate;
use slotgate::plan::Planner;
use slotgate::slot::SlotKey;
use slotgate::terminal::printable;
use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

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

/// `planner check`'s look at Postgres, when `DATABASE_URL` is set: a
/// server that takes no writes (a standby) is a problem (`Some(false)`);
/// a primary whose commits do not wait for a synchronous standby is a
/// warning, since its failover can lose committed gate rows (README,
/// "Postgres high availability"), but it is how most installations run
/// (`Some(true)`). `None`: no `DATABASE_URL`, nothing checked.
async fn check_postgres(env: &Env) -> Result<Option<bool>> {
    if env.conn.database_url.is_none() {
        eprintln!("planner check: DATABASE_URL is not set; Postgres not checked");
        return Ok(None);
    }
    let pool = env.pool().await?;
    let role = slotgate::store::server_role(&pool)
        .await
        .context("asking Postgres whether it takes writes and waits for a standby")?;
    let durability = role.durability();
    match durability.warning() {
        Some(w) if !durability.writable() => eprintln!("planner check: postgres: {w}"),
        Some(w) => eprintln!("planner check: warning: postgres: {w}"),
        None => eprintln!(
            "planner check: postgres: commits wait for a synchronous standby (synchronous_commit = {})",
            role.synchronous_commit
        ),
    }
    Ok(Some(durability.writable()))
}

/// The client-side deadline of a one-shot command: `--deadline`, plus
/// `--wait-timeout` for `trigger --wait`; `None` for the long-running
/// `run` and `serve` (rounds and requests have deadlines of their own).
fn one_shot_deadline(cli: &Cli) -> Option<std::time::Duration> {
    match &cli.cmd {
        Cmd::Run { .. } | Cmd::Serve { .. } => None,
        Cmd::Trigger {
            wait: true,
            wait_timeout,
            ..
        } => Some(cli.deadline + *wait_timeout),
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

/// Runs the parsed subcommand.
async fn dispatch(cli: Cli) -> Result<ExitCode> {
    let env = Env {
        clock: Arc::new(SystemClock),
        conn: cli.conn,
        config: cli.config.clone(),
    };
    let planner = || async {
        let config = load_config(&cli.config)?;
        let pool = env.pool().await?;
        Ok::<_, anyhow::Error>(Planner {
            config: numbered(config, &pool).await?,
            pool,
            queue: env.queue()?,
            clock: env.clock.clone(),
        })
    };
    match cli.cmd {
        Cmd::Migrate => {
            let pool = env.pool().await?;
            slotgate::MIGRATOR
                .run(&pool)
                .await
                .context("applying migrations")?;
            eprintln!("migrations applied");
        }
        Cmd::Check => {
            let config = load_config(&cli.config)?;
            let problems = slotgate::receiver::Receivers::for_config(&config, env.clock.clone())
                .check()
                .await;
            for (kind, p) in &problems {
                eprintln!("planner: kind {kind:?}: {p}");
            }
            let postgres = check_postgres(&env).await?;
            if !problems.is_empty() || postgres == Some(false) {
                return Ok(ExitCode::from(1));
            }
            println!(
                "{}: {} kinds, every CMS answered",
                cli.config.display(),
                config.kinds.len()
            );
        }
        Cmd::Plan {
            day,
            kinds,
            dry_run,
            json,
        } => {
            let p = planner().await?;
            let plan = p.plan_day(day, &kinds, dry_run).await.context("planning")?;
            if json {
                println!("{}", serde_json::to_string(&plan)?);
            } else {
                // Buffered: a plan of a million slots is a million lines.
                let mut out = std::io::BufWriter::new(std::io::stdout().lock());
                for s in &plan.slots {
                    writeln!(
                        out,
                        "{:<32} nominal {}  due {}  jitter {:>8} ms  {}",
                        s.slot,
                        s.nominal_at,
                        s.due_at,
                        s.jitter_ms,
                        if s.new { "new" } else { "existing" }
                    )?;
                }
                for u in &plan.unscheduled {
                    let fate = match u.fate {
                        Fate::Cancelled => "cancelled (skipped/unscheduled)".to_owned(),
                        Fate::WouldBeCancelled => "would be cancelled".to_owned(),
                        Fate::AlreadyGated { state } => format!("kept: already {}", state.as_str()),
                    };
                    writeln!(
                        out,
                        "{:<32} removed time {}  due {}  {fate}",
                        u.slot, u.local_time, u.due_at
                    )?;
                }
                out.flush()?;
                for w in &plan.warnings {
                    eprintln!("planner plan: warning: {w}");
                }
                let new = plan.slots.iter().filter(|s| s.new).count();
                let dry = if dry_run {
                    " (dry run: nothing changed)"
                } else {
                    ""
                };
                if plan.unscheduled.is_empty() {
                    eprintln!("{} slots, {new} new{dry}", plan.slots.len());
                } else {
                    eprintln!(
                        "{} slots, {new} new, {} of removed times{dry}",
                        plan.slots.len(),
                        plan.unscheduled.len()
                    );
                }
            }
        }
        Cmd::Run {
            every,
            skip_kinds,
            round_deadline,
            metrics_addr,
        } => {
            let p = planner().await?;
            for k in &skip_kinds {
                if p.config.kind(k).is_none() {
                    return Err(BadInput(format!(
                        "--skip-kind {k:?}: unknown kind (not in {})",
                        cli.config.display()
                    ))
                    .into());
                }
            }
            let cancel = CancellationToken::new();
            slotgate_process::shutdown::on_signals(cancel.clone());
            let metrics = CancellationToken::new();
            let live = crate::console::liveness::Liveness::new(every, round_deadline);
            if let Some(addr) = metrics_addr {
                let probe = slotgate_process::health::Probe {
                    pool: p.pool.clone(),
                    queue: p.queue.clone(),
                    clock: p.clock.clone(),
                };
                crate::console::liveness::serve(addr, probe, live.clone(), metrics.clone())
                    .await
                    .with_context(|| format!("serving metrics on {addr}"))?;
            }
            crate::console::liveness::run_rounds(
                &p,
                &skip_kinds,
                every,
                round_deadline,
                &live,
                &cancel,
            )
            .await;
            metrics.cancel();
            eprintln!("planner run: stopped");
        }
        Cmd::Trigger {
            kind,
            day,
            slot_no,
            from_job_name,
            json,
            wait,
            wait_timeout,
            early,
        } => {
            let p = planner().await?;
            let (key, caller) = match (from_job_name.as_ref(), day, slot_no) {
                (Some(job), _, _) => {
                    let k = p.config.kind(&kind).ok_or_else(|| {
                        BadInput(format!(
                            "unknown kind {kind:?} (not in {})",
                            cli.config.display()
                        ))
                    })?;
                    let s = slotgate::job_name::slot_of(k, job, &p.config.jitter_seed)
                        .map_err(|e| BadInput(format!("Job name {:?}: {e}", job.name)))?;
                    (s.key, "cronjob")
                }
                (None, Some(day), Some(slot_no)) => (SlotKey::new(kind, day, slot_no), "manual"),
                _ => unreachable!("clap requires --day and --slot without --from-job-name"),
            };
            let entry_id = if early {
                p.trigger_early(&key.kind, key.day, key.slot_no).await?
            } else {
                p.trigger(&key.kind, key.day, key.slot_no, caller).await?
            };
            let mut out = serde_json::json!({
                "slot": key.to_string(),
                "caller": caller,
                "entry_id": entry_id,
                "job_name": from_job_name.as_ref().map(|j| j.name.as_str()),
            });
            if !json {
                println!(
                    "delivered {key} (entry {entry_id}, caller {caller}{})",
                    if early { ", early" } else { "" }
                );
            }
            if !wait {
                if json {
                    println!("{out}");
                }
                return Ok(ExitCode::SUCCESS);
            }
            let cancel = CancellationToken::new();
            slotgate_process::shutdown::on_signals(cancel.clone());
            let watched =
                slotgate::watch::until_settled(&p.pool, &key, &entry_id, wait_timeout, &cancel)
                    .await;
            let code = wait_exit_code(&watched);
            if json {
                out["outcome"] = serde_json::to_value(&watched)?;
                println!("{out}");
            } else {
                // Reasons and errors are stored text: shown printable.
                println!("{key}: {}", printable(&watched.to_string()));
            }
            return Ok(ExitCode::from(code));
        }
        Cmd::Backfill { kind, from, to } => {
            let p = planner().await?;
            let b = p.backfill(&kind, from, to).await?;
            println!("{}", serde_json::to_string(&b)?);
        }
        Cmd::Drafts(d) => crate::drafts::run(d, &env, &cli.config).await?,
        Cmd::Report { day, kinds, json } => {
            let config = load_config(&cli.config)?;
            for k in &kinds {
                if config.kind(k).is_none() {
                    bail!("unknown kind {k:?} (not in {})", cli.config.display());
                }
            }
            let r = slotgate::report::build(&env.pool().await?, &config, &env.clock, day, &kinds)
                .await?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                print!("{}", r.render());
            }
        }
        Cmd::Retry { slot } => {
            let p = planner().await?;
            let id = p.retry(&slot).await?;
            println!("retrying {slot} (entry {id}, caller manual)");
        }
        Cmd::Abandon {
            slot,
            requeue_draft,
        } => {
            let p = planner().await?;
            let draft = p.abandon(&slot, requeue_draft).await?;
            let what = match (draft, requeue_draft) {
                (Some(d), true) => format!("draft {d} is ready again"),
                (Some(d), false) => format!("draft {d} stays failed"),
                (None, _) => "no draft was bound".into(),
            };
            println!("abandoned {slot}; {what}");
        }
        Cmd::Audit {
            paths,
            json,
            now,
            zone,
            with_history,
        } => {
            let now = now.unwrap_or_else(|| env.clock.now());
            let history = if with_history {
                Some(crate::history::source(env.pool().await?, now))
            } else {
                None
            };
            let opts = slotgate_audit::AuditOptions {
                now,
                local_zone: zone.unwrap_or_else(slotgate_audit::machine_zone),
                history,
            };
            return match slotgate_audit::audit_paths(&paths, &opts) {
                Ok(report) => {
                    if json {
                        println!("{}", report.to_json());
                    } else {
                        print!("{}", report.render_table());
                    }
                    Ok(ExitCode::from(report.exit_code() as u8))
                }
                Err(e) => {
                    eprintln!("planner audit: {e}");
                    Ok(ExitCode::from(2))
                }
            };
        }
        Cmd::Prune {
            older_than,
            dry_run,
            json,
        } => {
            let config = load_config(&cli.config)?;
            let pool = env.pool().await?;
            let config = numbered(config, &pool).await?;
            let pruned = match slotgate::retention::prune(
                &pool,
                &config,
                env.clock.now(),
                older_than,
                dry_run,
            )
            .await
            {
                Err(e @ slotgate::retention::RetentionError::OutOfRange { .. }) => {
                    eprintln!("planner prune: {e}");
                    return Ok(ExitCode::from(2));
                }
                r => r.context("pruning")?,
            };
            if json {
                println!("{}", serde_json::to_string(&pruned)?);
            } else {
                println!(
                    "{}executions started before {}: {}; stored answers: {}; planned rows: {}; slots sealed: {}; operators' requests: {}",
                    if dry_run { "dry run (nothing changed): " } else { "pruned " },
                    pruned.executions_before,
                    pruned.executions,
                    pruned.responses,
                    pruned.planned,
                    pruned.sealed,
                    pruned.requests
                );
            }
        }
        Cmd::Pause { kind, until, note } => {
            let p = planner().await?;
            p.pause(&kind, until, &note).await?;
            match until {
                Some(u) => println!("paused {kind} until {}", u.to_rfc3339()),
                None => println!("paused {kind} until `planner resume --kind {kind}`"),
            }
        }
        Cmd::Resume { kind } => {
            let p = planner().await?;
            if p.resume(&kind).await? {
                println!("resumed {kind}");
            } else {
                println!("{kind} was not paused");
            }
        }
        Cmd::Skip { slot, note } => {
            let p = planner().await?;
            p.skip(&slot, &note).await?;
            println!("skipped {slot} (skipped/operator, caller manual)");
        }
        Cmd::Dead(d) => {
            let p = planner().await?;
            match d {
                DeadCmd::List { limit, json } => {
                    let v = p.dead_letters(limit).await?;
                    if json {
                        println!("{}", serde_json::to_string(&v)?);
                    } else {
                        println!(
                            "{:<16} {:<16} {:<24} {:<10} {:<16} SLOT",
                            "ID", "ENTRY", "AT (UTC)", "CALLER", "REASON"
                        );
                        // Every field but the time is as received: shown
                        // printable, never as the escapes a stranger wrote.
                        for e in v {
                            let field = |f: &Option<String>| {
                                printable(f.as_deref().unwrap_or("-")).into_owned()
                            };
                            println!(
                                "{:<16} {:<16} {:<24} {:<10} {:<16} {}",
                                printable(&e.id),
                                field(&e.entry_id),
                                e.at.map(|a| a.format("%Y-%m-%d %H:%M:%S").to_string())
                                    .unwrap_or_else(|| "-".to_owned()),
                                field(&e.caller),
                                field(&e.reason),
                                field(&e.slot)
                            );
                        }
                    }
                }
                DeadCmd::Replay { entry_id } => {
                    let (dead, entry) = p.replay_dead(&entry_id).await?;
                    println!(
                        "replayed dead letter {} as entry {entry} (slot {}, caller manual)",
                        printable(&dead.id),
                        printable(dead.slot.as_deref().unwrap_or_default())
                    );
                }
                DeadCmd::Purge { older_than, json } => {
                    let n = p.purge_dead(older_than).await?;
                    if json {
                        println!("{}", serde_json::json!({ "purged": n }));
                    } else {
                        println!("purged {n} dead letters");
                    }
                }
            }
        }
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "planner", &mut std::io::stdout());
        }
        Cmd::Serve {
            http,
            allow_actions,
            allow_hosts,
            max_connections,
            max_event_streams,
        } => {
            let token = if allow_actions {
                let t = std::env::var("SLOTGATE_CONSOLE_TOKEN").unwrap_or_default();
                if t.chars().count() < crate::console::MIN_TOKEN_CHARS {
                    eprintln!(
                        "planner serve: --allow-actions needs SLOTGATE_CONSOLE_TOKEN set to at least {} characters",
                        crate::console::MIN_TOKEN_CHARS
                    );
                    return Ok(ExitCode::from(2));
                }
                Some(t)
            } else {
                None
            };
            let p = planner().await?;
            let listener = tokio::net::TcpListener::bind(http)
                .await
                .with_context(|| format!("listening on {http}"))?;
            let cancel = CancellationToken::new();
            slotgate_process::shutdown::on_signals(cancel.clone());
            eprintln!(
                "planner serve: console on http://{} (actions {})",
                listener.local_addr()?,
                if token.is_some() { "on" } else { "off" }
            );
            let exposure = crate::console::Exposure {
                allow_hosts,
                max_connections: max_connections as usize,
                max_event_streams: max_event_streams as usize,
            };
            crate::console::serve(
                crate::console::Console::new(p, token),
                listener,
                exposure,
                cancel,
            )
            .await
            .context("serving the console")?;
            eprintln!("planner serve: stopped");
        }
        Cmd::Status { json } => {
            // Pauses and workers' clocks live in Postgres: shown when it is
            // configured and answers (status stays a Redis view while it is
            // down).
            let full = async {
                let pool = env.pool().await?;
                slotgate::report::full_status(&env.queue()?, &pool, &env.clock)
                    .await
                    .map_err(anyhow::Error::from)
            };
            let s = match env.conn.database_url.is_some() {
                true => match full.await {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("planner status: pauses and workers' clocks not shown: {e:#}");
                        slotgate::report::status(&env.queue()?, &env.clock)
                            .await
                            .context("reading Redis")?
                    }
                },
                false => slotgate::report::status(&env.queue()?, &env.clock)
                    .await
                    .context("reading Redis")?,
            };
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                print!("{}", s.render());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

//! `planner drafts`: the drafts a kind publishes from (add, import, sync,
//! list).

use crate::cli::DraftsCmd;
use crate::env::{load_config, Env};
use anyhow::{bail, Context, Result};
use slotgate::store;

/// `planner drafts …`: add, import, list.
pub async fn run(cmd: DraftsCmd, env: &Env, config_path: &std::path::Path) -> Result<()> {
    match cmd {
        DraftsCmd::Add {
            kind,
            title,
            body_file,
            ready_at,
        } => {
            let config = load_config(config_path)?;
            if config.kind(&kind).is_none() {
                bail!("unknown kind {kind:?} (not in {})", config_path.display());
            }
            let body = match body_file {
                Some(f) => std::fs::read_to_string(&f)
                    .with_context(|| format!("reading {}", f.display()))?,
                None => String::new(),
            };
            let now = env.clock.now();
            let pool = env.pool().await?;
            let mut conn = pool.acquire().await?;
            let id = store::insert_draft(
                &mut conn,
                &kind,
                &title,
                &body,
                ready_at.unwrap_or(now),
                now,
            )
            .await?;
            println!("{id}");
        }
        DraftsCmd::Import { file } => {
            let config = load_config(config_path)?;
            let f = std::fs::File::open(&file)
                .with_context(|| format!("opening {}", file.display()))?;
            // All or nothing: every line is checked before Postgres is
            // touched, and the one COPY runs in one transaction.
            let rows = slotgate::import::DraftRows::parse(
                std::io::BufReader::new(f),
                &file.display().to_string(),
                &config,
                env.clock.now(),
            )?;
            rows.copy_into(&env.pool().await?).await?;
            println!("imported {} drafts", rows.len());
        }
        DraftsCmd::Sync { kind } => {
            let config = load_config(config_path)?;
            if let Some(k) = &kind {
                let Some(kc) = config.kind(k) else {
                    bail!("unknown kind {k:?} (not in {})", config_path.display());
                };
                if kc.drafts_in_wordpress().is_none() {
                    bail!("kind {k:?} has no drafts in WordPress ([kinds.wordpress] drafts = \"pending\" or \"draft\")");
                }
            }
            let pool = env.pool().await?;
            let receivers = slotgate::receiver::Receivers::for_config(&config, env.clock.clone());
            let mut synced_any = false;
            for kc in &config.kinds {
                if kind.as_ref().is_some_and(|k| *k != kc.name) {
                    continue;
                }
                let (Some((wp, _)), Some(route)) =
                    (kc.drafts_in_wordpress(), receivers.route(&kc.name))
                else {
                    continue;
                };
                let s = route
                    .receiver
                    .sync_drafts(&pool)
                    .await
                    .with_context(|| {
                        format!(
                            "kind {:?}: syncing drafts from {}",
                            kc.name,
                            slotgate::secret::redact_url(&wp.url)
                        )
                    })?
                    .unwrap_or_default();
                println!(
                    "{}: {} added, {} updated, {} no longer ready",
                    kc.name, s.added, s.updated, s.unreadied
                );
                synced_any = true;
            }
            if !synced_any {
                bail!("no kind has its drafts in WordPress ([kinds.wordpress] drafts = \"pending\" or \"draft\")");
            }
        }
        DraftsCmd::List { kind, status, json } => {
            let pool = env.pool().await?;
            let v = store::list_drafts(&pool, kind.as_deref(), status).await?;
            if json {
                println!("{}", serde_json::to_string(&v)?);
            } else {
                println!(
                    "{:>6} {:<12} {:<11} {:<26} {:<28} TITLE",
                    "ID", "KIND", "STATUS", "READY_AT", "SLOT"
                );
                for d in v {
                    println!(
                        "{:>6} {:<12} {:<11} {:<26} {:<28} {}",
                        d.id,
                        d.kind,
                        d.status,
                        d.ready_at.format("%Y-%m-%dT%H:%M:%SZ"),
                        d.slot_key.as_deref().unwrap_or("-"),
                        d.title
                    );
                }
            }
        }
    }
    Ok(())
}

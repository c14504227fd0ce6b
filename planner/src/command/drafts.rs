//! `planner drafts`: the drafts a kind publishes from (add, import, sync,
//! list).
//!
//! Titles and bodies come from CMS exports and scripts: `add` and `import`
//! refuse one over the size limits of [`slotgate::import`] (exit 2, nothing
//! written), and `list` prints titles [`printable`] so none reaches the
//! terminal as an escape sequence.

use crate::cli::DraftsCmd;
use crate::env::{load_config, Env};
use crate::exit::BadInput;
use anyhow::{bail, Context, Result};
use slotgate::import::{check_draft, ImportError, MAX_BODY_BYTES};
use slotgate::store;
use slotgate::terminal::printable;
use std::io::Read;

/// `planner drafts …`: add, import, list.
pub async fn run(cmd: DraftsCmd, env: &Env, config_path: &std::path::Path) -> Result<()> {
    match cmd {
        DraftsCmd::Add {
            kind,
            title,
            body_file,
            ready_at,
            priority,
            category,
        } => {
            let config = load_config(config_path)?;
            if config.kind(&kind).is_none() {
                bail!("unknown kind {kind:?} (not in {})", config_path.display());
            }
            let body = match body_file {
                Some(f) => read_body(&f)?,
                None => String::new(),
            };
            check_draft(&title, &body).map_err(|e| BadInput(format!("drafts add: {e}")))?;
            let now = env.clock.now();
            let pool = env.pool().await?;
            let mut conn = pool.acquire().await?;
            let id = store::insert_draft(
                &mut conn,
                &store::NewDraft {
                    kind: &kind,
                    title: &title,
                    body: &body,
                    ready_at: ready_at.unwrap_or(now),
                    priority,
                    category: category.as_deref(),
                },
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
            // A line over a size limit is bad input (exit 2), like any
            // other bound; the other refusals keep exit 1.
            let rows = match slotgate::import::DraftRows::parse(
                std::io::BufReader::new(f),
                &file.display().to_string(),
                &config,
                env.clock.now(),
            ) {
                Err(e @ ImportError::TooLong { .. }) => return Err(BadInput(e.to_string()).into()),
                r => r?,
            };
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
                let s = slotgate::worker::drafts::sync(&*route.receiver, &kc.name, &pool)
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
                        printable(&d.kind),
                        d.status,
                        d.ready_at.format("%Y-%m-%dT%H:%M:%SZ"),
                        printable(d.slot_key.as_deref().unwrap_or("-")),
                        printable(&d.title)
                    );
                }
            }
        }
    }
    Ok(())
}

/// Reads `--body-file`, at most [`MAX_BODY_BYTES`] + 1 bytes of it: a
/// longer file is refused (exit 2) without being loaded whole.
fn read_body(path: &std::path::Path) -> Result<String> {
    let reading = || format!("reading {}", path.display());
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .with_context(reading)?
        .take(MAX_BODY_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .with_context(reading)?;
    if bytes.len() > MAX_BODY_BYTES {
        let e = slotgate::import::TooLong::Body;
        return Err(BadInput(format!("drafts add: {}: {e}", path.display())).into());
    }
    String::from_utf8(bytes).with_context(reading)
}

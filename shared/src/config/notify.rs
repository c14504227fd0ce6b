//! The top-level `[notify]` section: where notices go and how they are
//! signed (`url`, `secret_env`, optional `events` and `runway_days`).
//!
//! The secret is a Standard Webhooks `whsec_<base64>` key read from the
//! environment variable `secret_env` names, checked here so a bad key fails
//! the start, not the first failed slot at 02:00; it never appears in a
//! message. What the section does is `crate::notice`'s and the leader's.

use super::keys::{FieldError, Keys};
use crate::notice::{Event, Signer};

/// `runway_days` when not set: warn three days before the drafts run out.
pub const DEFAULT_RUNWAY_DAYS: u32 = 3;

/// Where notices go.
#[derive(Debug, Clone)]
pub struct NotifyConfig {
    /// The receiver (`http` or `https`, no credentials in it).
    pub url: String,
    /// Signs every send with the `whsec_` key of `secret_env`.
    pub signer: Signer,
    /// The events sent (default: all); others are marked `filtered` and
    /// never sent.
    pub events: Vec<Event>,
    /// A runway shorter than this many days is told (`runway.low`).
    pub runway_days: u32,
}

impl NotifyConfig {
    /// Whether `e` is sent.
    pub fn sends(&self, e: Event) -> bool {
        self.events.contains(&e)
    }
}

/// Reads `[notify]`.
pub(super) fn parse(keys: &Keys<'_>) -> Result<NotifyConfig, FieldError> {
    keys.known(&["url", "secret_env", "events", "runway_days"])?;
    let url = keys
        .url("url")?
        .ok_or_else(|| ("url".to_owned(), "missing".to_owned()))?;
    let secret = keys
        .secret("secret_env")?
        .ok_or_else(|| ("secret_env".to_owned(), "missing".to_owned()))?;
    let var = keys.string("secret_env")?.unwrap_or_default();
    let signer = Signer::new(&secret).map_err(|e| {
        (
            "secret_env".to_owned(),
            format!("environment variable {var}: {e}"),
        )
    })?;
    let events = match keys.get("events") {
        None => Event::ALL.to_vec(),
        Some(toml::Value::Array(a)) => {
            let mut out = Vec::with_capacity(a.len());
            for (i, v) in a.iter().enumerate() {
                let e = v.as_str().and_then(Event::parse).ok_or_else(|| {
                    (
                        format!("events[{i}]"),
                        format!(
                            "expected one of {}",
                            Event::ALL.map(Event::as_str).join(", ")
                        ),
                    )
                })?;
                if out.contains(&e) {
                    return Err((
                        format!("events[{i}]"),
                        format!("{} named twice", e.as_str()),
                    ));
                }
                out.push(e);
            }
            out
        }
        Some(_) => {
            return Err((
                "events".to_owned(),
                "expected an array of event names".to_owned(),
            ))
        }
    };
    let runway_days = keys.count("runway_days", DEFAULT_RUNWAY_DAYS, 1, 366)?;
    Ok(NotifyConfig {
        url,
        signer,
        events,
        runway_days,
    })
}

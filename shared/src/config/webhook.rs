//! The webhook receiver's keys of a kind: `publish_url`, `probe_url` and
//! `index_url`, and how its calls authenticate and whom they trust (`auth`,
//! `token_env`, `signing_secret_env`, `ca_file`, `allow_insecure_http`).
//! They are plain keys of the `[[kinds]]` table; the other receivers have
//! sections of their own ([`super::receivers`]).
//!
//! Webhook secrets are never written in the file: `token_env` and
//! `signing_secret_env` name environment variables that are read once, here,
//! at start, into [`Secret`]s (which print as `***`). A kind's `ca_file` is
//! read and parsed here too, so a bad CA fails the start, not the first
//! publish. A credential is never sent in clear text to another host.

use super::keys::{without_userinfo, FieldError, Keys};
use super::receivers::WordPressConfig;
use crate::secret::Secret;
use std::path::{Path, PathBuf};

/// A kind's webhook credentials and extra trust (`auth`, `token_env`,
/// `signing_secret_env`, `ca_file`). `Debug` shows `***` for the secrets.
#[derive(Debug, Clone, Default)]
pub struct WebhookAuth {
    /// `auth = "bearer"`: sent as `Authorization: Bearer <token>`.
    pub bearer: Option<Secret>,
    /// Key of the `Slotgate-Signature` HMAC of every request.
    pub signing_secret: Option<Secret>,
    /// A CA trusted in addition to the system roots.
    pub ca: Option<CaFile>,
}

impl WebhookAuth {
    /// Every spelling of the bearer token and the signing secret an answer
    /// echoing a request could carry ([`crate::untrusted::secret_spellings`]).
    pub fn secret_spellings(&self) -> Vec<String> {
        [&self.bearer, &self.signing_secret]
            .into_iter()
            .flatten()
            .flat_map(|s| crate::untrusted::secret_spellings(s.expose()))
            .collect()
    }
}

/// A PEM file of one or more CA certificates, read and parsed at start.
#[derive(Debug, Clone)]
pub struct CaFile {
    /// Where the bundle was read from (resolved against the config file's
    /// directory), for messages.
    pub path: PathBuf,
    /// Every certificate in the file; never empty.
    pub certs: Vec<reqwest::Certificate>,
}

impl CaFile {
    /// Reads `path` and parses every certificate in it; at least one is
    /// required (a file of something else would otherwise trust nothing
    /// extra, silently).
    pub fn load(path: &Path) -> Result<CaFile, String> {
        let pem =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("{} is not a PEM certificate bundle: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
                path.display()
            ));
        }
        Ok(CaFile {
            path: path.to_owned(),
            certs,
        })
    }
}

/// Where a kind's webhook calls go: `publish_url` (`None`: record-only),
/// `probe_url` and `index_url`.
pub(super) struct Urls {
    pub(super) publish: Option<String>,
    pub(super) probe: Option<String>,
    pub(super) index: Option<String>,
}

/// Reads `auth` with `token_env`, `ca_file` (relative to the config file's
/// directory) and `signing_secret_env`.
pub(super) fn auth(keys: &Keys<'_>, config_path: &Path) -> Result<WebhookAuth, FieldError> {
    let bearer = match keys.string("auth")?.as_deref() {
        None | Some("none") => {
            if keys.has("token_env") {
                return Err(("token_env".into(), "needs auth = \"bearer\"".into()));
            }
            None
        }
        Some("bearer") => Some(keys.secret("token_env")?.ok_or_else(|| {
            ("token_env".to_owned(), "missing: auth = \"bearer\" reads its token from the environment variable named here".to_owned())
        })?),
        Some(other) => {
            return Err(("auth".into(), format!("unknown auth {other:?} (expected \"none\" or \"bearer\")")))
        }
    };
    let ca = match keys.string("ca_file")? {
        None => None,
        Some(f) => {
            let f = PathBuf::from(f);
            let f = match config_path.parent() {
                Some(dir) if f.is_relative() => dir.join(f),
                _ => f,
            };
            Some(CaFile::load(&f).map_err(|m| ("ca_file".to_owned(), m))?)
        }
    };
    Ok(WebhookAuth {
        bearer,
        signing_secret: keys.secret("signing_secret_env")?,
        ca,
    })
}

/// Reads `publish_url`, `probe_url` and `index_url`.
pub(super) fn urls(keys: &Keys<'_>) -> Result<Urls, FieldError> {
    Ok(Urls {
        publish: keys.url("publish_url")?,
        probe: keys.url("probe_url")?,
        index: keys.url("index_url")?,
    })
}

/// The checks across the webhook keys and a `[kinds.wordpress]` section:
/// no credential in clear text to another host (unless
/// `allow_insecure_http`), no webhook keys beside WordPress, and no
/// `probe_url` without the `publish_url` it looks up.
pub(super) fn check(
    keys: &Keys<'_>,
    urls: &Urls,
    auth: &WebhookAuth,
    wordpress: Option<&WordPressConfig>,
) -> Result<(), FieldError> {
    if !keys.flag("allow_insecure_http")? {
        let carried = if auth.bearer.is_some() {
            Some("the bearer token (auth = \"bearer\")")
        } else if auth.signing_secret.is_some() {
            Some("signed requests (signing_secret_env), which anyone on the path could read and replay,")
        } else {
            None
        };
        let urls = [
            ("publish_url", urls.publish.as_deref(), carried),
            ("probe_url", urls.probe.as_deref(), carried),
            ("index_url", urls.index.as_deref(), carried),
            (
                "wordpress.url",
                wordpress.map(|w| w.url.as_str()),
                Some("the Application Password"),
            ),
        ];
        for (field, u, what) in urls {
            if let (Some(u), Some(what)) = (u, what) {
                if cleartext_to_remote(u) {
                    return Err((field.into(), format!("{} is http:// to a host that is not loopback: it would send {what} in clear text; use https://, or set allow_insecure_http = true on the kind if the network is yours", without_userinfo(u))));
                }
            }
        }
    }
    if wordpress.is_some() {
        for clash in [
            "publish_url",
            "probe_url",
            "auth",
            "token_env",
            "signing_secret_env",
        ] {
            if keys.has(clash) {
                return Err((clash.into(), "not with [kinds.wordpress]: the kind publishes to WordPress, which authenticates with its Application Password".into()));
            }
        }
    }
    if urls.probe.is_some() && urls.publish.is_none() {
        return Err((
            "probe_url".into(),
            "needs publish_url: it looks up what publish_url may have applied".into(),
        ));
    }
    Ok(())
}

/// `u` is plain `http://` to a host other than the loopback interface
/// (`localhost`, 127.0.0.0/8, `::1`): what it carries crosses a network in
/// clear text.
fn cleartext_to_remote(u: &str) -> bool {
    let Ok(p) = reqwest::Url::parse(u) else {
        return false;
    };
    if p.scheme() != "http" {
        return false;
    }
    let Some(host) = p.host_str() else {
        return true;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => !ip.is_loopback(),
        Err(_) => !host.eq_ignore_ascii_case("localhost"),
    }
}

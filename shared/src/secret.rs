//! Secrets: values that must never reach a log line, an error message, a
//! stored row, a metric or `planner status`.
//!
//! - [`Secret`] holds a token or signing key read from the environment; its
//!   `Display` prints `***` and `Debug` `Secret(***)`, so a config dumped with `{:?}` or an
//!   error that formats a kind cannot leak it. The value is reachable only
//!   through [`Secret::expose`], which the webhook client calls when it
//!   builds a request.
//! - [`redact_url`] is the one place a URL is made printable: the password
//!   of `user:password@`, a lone `token@`, and the value of every query
//!   parameter that names a secret (`password`, `sslpassword`, `token`, …)
//!   become `***`. Every message that shows a `DATABASE_URL`, `REDIS_URL` or
//!   webhook URL goes through it.

use std::fmt;

/// A secret value; prints as `***` (`Secret(***)` with `{:?}`).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value read from the environment; from here on it prints as
    /// `***`.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

/// Query parameters whose values are secrets (compared case-insensitively;
/// a parameter *containing* one of these words counts too, so
/// `sslpassword`, `auth_token` and `api_key` are caught).
const SECRET_PARAMS: &[&str] = &["password", "pass", "pwd", "secret", "token", "key", "auth"];

/// `url` fit to print: `scheme://user:***@host/path?password=***`. A URL
/// that does not parse is still redacted by position (everything between
/// `://` and the last `@` of the authority, and secret query values), so a
/// malformed URL with a password in it is never echoed verbatim.
pub fn redact_url(url: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let mut out = String::with_capacity(url.len());
    let auth_start = head.find("://").map_or(0, |i| i + 3);
    let authority_end = head[auth_start..]
        .find('/')
        .map_or(head.len(), |i| auth_start + i);
    match head[auth_start..authority_end].rfind('@') {
        Some(at) => {
            let userinfo = &head[auth_start..auth_start + at];
            out.push_str(&head[..auth_start]);
            match userinfo.split_once(':') {
                Some((user, _)) => {
                    out.push_str(user);
                    out.push_str(":***");
                }
                // A lone userinfo may be a user name, but it is also how
                // tokens are put in URLs (`https://<token>@host`): hide it.
                None if !userinfo.is_empty() => out.push_str("***"),
                None => {}
            }
            out.push_str(&head[auth_start + at..]);
        }
        None => out.push_str(head),
    }
    if let Some(q) = query {
        out.push('?');
        let parts: Vec<String> = q
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if is_secret_param(name) => format!("{name}=***"),
                _ => pair.to_owned(),
            })
            .collect();
        out.push_str(&parts.join("&"));
    }
    out
}

fn is_secret_param(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    SECRET_PARAMS.iter().any(|s| n.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_in_userinfo_and_query_are_hidden() {
        for (url, want) in [
            (
                "postgres://app:hunter2@db:5432/slotgate",
                "postgres://app:***@db:5432/slotgate",
            ),
            (
                "postgres://app@db/slotgate?sslmode=verify-full&password=hunter2",
                "postgres://***@db/slotgate?sslmode=verify-full&password=***",
            ),
            (
                "postgres://db/x?sslpassword=hunter2&sslrootcert=/ca.pem",
                "postgres://db/x?sslpassword=***&sslrootcert=/ca.pem",
            ),
            (
                "rediss://:hunter2@cache:6380/0",
                "rediss://:***@cache:6380/0",
            ),
            ("redis://app@cache/", "redis://***@cache/"),
            ("https://ghp_token@cms/", "https://***@cms/"),
            (
                "redis://default:p@ss:w@rd@cache/",
                "redis://default:***@cache/",
            ),
            ("redis://cache:6379/", "redis://cache:6379/"),
            ("not a url:hunter2@", "not a url:***@"),
            ("x://u:hunter2@", "x://u:***@"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
        assert!(!redact_url("postgres://u:hunter2@h/d?password=hunter2").contains("hunter2"));
    }

    #[test]
    fn a_secret_never_formats_its_value() {
        let s = Secret::new("tok-123");
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{s:?}"), "Secret(***)");
        assert_eq!(s.expose(), "tok-123");
    }
}

//! Secrets: values that must never reach a log line, an error message, a
//! stored row, a metric or `planner status`.
//!
//! - [`Secret`] holds a token or signing key read from the environment; its
//!   `Display` prints `***` and `Debug` `Secret(***)`, so a config dumped with `{:?}` or an
//!   error that formats a kind cannot leak it. The value is reachable only
//!   through [`Secret::expose`], which the webhook client calls when it
//!   builds a request.
//! - [`redact_url`] is the one place a URL is made printable: the password
//!   of `user:password@` (whatever characters it holds), a lone `token@`,
//!   and the value of a query parameter that names a secret (`password`,
//!   `sslpassword`, `token`, …) with everything after it become `***`. Every message that shows a `DATABASE_URL`, `REDIS_URL` or
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

/// `url` fit to print: `scheme://user:***@host/path?password=***`.
///
/// Passwords are generated with any printable character, and a URL tool
/// does not always encode them, so nothing after `://` can be trusted to
/// end the userinfo: a `/`, `?` or `#` may be part of the password
/// (`postgres://app:ab/cd?ef@db/x`). The userinfo is therefore everything
/// up to the **last** `@` of the URL: a password is always hidden, at the
/// price of hiding more than the userinfo when a path or query holds an
/// `@` (`https://cms/p?owner=ops@example.com` prints as
/// `https://***@example.com`). The user name (before the first `:`, which
/// a user name cannot hold) stays readable. In the query that follows,
/// the value of a parameter that names a secret and everything after it
/// become `***` (an unencoded `&` in the value would otherwise end it
/// early). A URL that does not parse is redacted the same way, so a
/// malformed one is never echoed verbatim; and an authority without `@`
/// whose port is not a number (`redis://:Pr1vate`, a userinfo cut short)
/// is hidden whole.
///
/// One URL at a time: a list (`REDIS_URL`'s seed nodes) is cut into its
/// URLs first by the rule that also parses it (`queue::connect`), never
/// at every comma, which a password may hold.
pub fn redact_url(url: &str) -> String {
    let auth_start = url.find("://").map_or(0, |i| i + 3);
    let mut out = String::with_capacity(url.len());
    out.push_str(&url[..auth_start]);
    let rest = match url[auth_start..].rfind('@') {
        Some(at) => {
            let userinfo = &url[auth_start..auth_start + at];
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
            &url[auth_start + at..]
        }
        None => {
            // No userinfo, so the authority is `host[:port]`. One whose
            // port is not a number is a fragment of a userinfo (what is
            // left of `redis://:Pr1vate,secret@host` cut at its comma is
            // `redis://:Pr1vate`): hidden whole.
            let rest = &url[auth_start..];
            let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
            let authority = &rest[..end];
            let port_ok = match authority.rsplit_once(':') {
                None => true,
                Some((_, port)) => {
                    authority.ends_with(']') || port.bytes().all(|b| b.is_ascii_digit())
                }
            };
            if !port_ok {
                out.push_str("***");
                &rest[end..]
            } else {
                rest
            }
        }
    };
    let (head, query) = match rest.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (rest, None),
    };
    out.push_str(head);
    if let Some(q) = query {
        out.push('?');
        let mut parts = Vec::new();
        for pair in q.split('&') {
            match pair.split_once('=') {
                Some((name, _)) if is_secret_param(name) => {
                    parts.push(format!("{name}=***"));
                    break;
                }
                _ => parts.push(pair.to_owned()),
            }
        }
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
                // An unencoded `&` may be part of the password: the rest
                // of the query goes too.
                "postgres://db/x?sslpassword=***",
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
            // A userinfo cut short (a list cut at a password's comma):
            // its "port" is no number.
            ("redis://:Pr1vate", "redis://***"),
            ("redis://app:Pr1vate/0", "redis://***/0"),
            // Hosts and ports stay readable.
            ("redis://[::1]:6379/0", "redis://[::1]:6379/0"),
            ("redis://[::1]/0", "redis://[::1]/0"),
            (
                "https://cms.example:8443/p?x=1",
                "https://cms.example:8443/p?x=1",
            ),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
        assert!(!redact_url("postgres://u:hunter2@h/d?password=hunter2").contains("hunter2"));
    }

    /// Generated passwords hold any printable character, unencoded: a `/`,
    /// `?`, `#`, `@` or `&` in one must not end the part that is hidden.
    #[test]
    fn generated_passwords_of_every_printable_character_are_hidden() {
        let printable: Vec<char> = (0x21u8..=0x7e).map(char::from).collect();
        let mut passwords: Vec<String> = printable
            .iter()
            .map(|c| format!("a{c}TOPSECRET{c}z"))
            .collect();
        // And a few with many of them at once, as generators make them.
        for w in printable.chunks(7) {
            let mid: String = w.iter().collect();
            passwords.push(format!("{mid}TOPSECRET{mid}"));
        }
        for pw in &passwords {
            for url in [
                format!("postgres://root:{pw}@db.internal:5432/slotgate?sslmode=require"),
                format!("redis://:{pw}@cache:6379/0"),
                format!("rediss://default:{pw}@cache/"),
                format!("https://{pw}@cms.example/publish"),
                format!("postgres://root@db/x?sslmode=require&password={pw}"),
                format!("postgres://root@db/x?password={pw}&sslmode=require"),
            ] {
                let shown = redact_url(&url);
                assert!(!shown.contains("TOPSECRET"), "{url:?} printed as {shown:?}");
            }
        }
        // What is not secret stays readable.
        assert_eq!(
            redact_url("postgres://root:ab/cd?ef@db:5432/x?sslmode=require"),
            "postgres://root:***@db:5432/x?sslmode=require"
        );
        assert_eq!(
            redact_url("redis://:abc?topsecret@cache:6379/0"),
            "redis://:***@cache:6379/0"
        );
    }

    #[test]
    fn a_secret_never_formats_its_value() {
        let s = Secret::new("tok-123");
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{s:?}"), "Secret(***)");
        assert_eq!(s.expose(), "tok-123");
    }
}

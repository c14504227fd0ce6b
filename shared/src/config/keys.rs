//! Reading one table of the file key by key — the top level, a
//! `[[kinds]]` table or one of its sections — as the types the config
//! expects. Every reader's error names the key; the kind and the file are
//! added by the caller ([`super::ConfigError`]).
//!
//! Why not `serde`'s derive: its errors (`invalid type: integer `5`,
//! expected a string`, `unknown field `x`, expected one of …`) neither name
//! the key in a field of their own nor say what this file's messages say,
//! and operators and tests rely on those. Secrets are read here too, from
//! the environment variable a key names, never from the file.

use super::bound::Bound;
use crate::secret::Secret;
use std::time::Duration;

/// A key of the table (relative to it) and what is wrong with its value.
pub(super) type FieldError = (String, String);

/// One TOML table and the environment its `*_env` keys are read from.
#[derive(Clone, Copy)]
pub(super) struct Keys<'a> {
    table: &'a toml::Table,
    env: &'a dyn Fn(&str) -> Option<String>,
}

fn field_error(key: &str, message: impl Into<String>) -> FieldError {
    (key.to_owned(), message.into())
}

impl<'a> Keys<'a> {
    pub(super) fn new(table: &'a toml::Table, env: &'a dyn Fn(&str) -> Option<String>) -> Self {
        Keys { table, env }
    }

    /// Whether the table sets `key` at all.
    pub(super) fn has(&self, key: &str) -> bool {
        self.table.contains_key(key)
    }

    /// The raw value of `key`, for the few keys with messages of their own.
    pub(super) fn get(&self, key: &str) -> Option<&'a toml::Value> {
        self.table.get(key)
    }

    /// Every key is one of `known`; else the first other one is an
    /// `unknown field`.
    pub(super) fn known(&self, known: &[&str]) -> Result<(), FieldError> {
        match self.table.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(field_error(k, "unknown field")),
            None => Ok(()),
        }
    }

    /// A string, if set.
    pub(super) fn string(&self, key: &str) -> Result<Option<String>, FieldError> {
        match self.table.get(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(field_error(key, "expected a string")),
        }
    }

    /// A string that must be set.
    pub(super) fn required(&self, key: &str) -> Result<String, FieldError> {
        self.string(key)?.ok_or_else(|| field_error(key, "missing"))
    }

    /// A webhook URL ([`check_url`]), if set.
    pub(super) fn url(&self, key: &str) -> Result<Option<String>, FieldError> {
        let u = self.string(key)?;
        if let Some(u) = &u {
            check_url(u).map_err(|m| field_error(key, m))?;
        }
        Ok(u)
    }

    /// The secret in the environment variable `key` names, if it names one.
    pub(super) fn secret(&self, key: &str) -> Result<Option<Secret>, FieldError> {
        let Some(var) = self.string(key)? else {
            return Ok(None);
        };
        env_secret(self.env, &var)
            .map(Some)
            .map_err(|m| field_error(key, m))
    }

    /// A duration within `bound`; `default` when not set (`None`: required).
    pub(super) fn duration(
        &self,
        key: &str,
        default: Option<Duration>,
        bound: Bound,
    ) -> Result<Duration, FieldError> {
        match self.string(key)? {
            None => default.ok_or_else(|| field_error(key, "missing")),
            Some(s) => bound.parse(&s).map_err(|m| field_error(key, m)),
        }
    }

    /// A whole number in `min..=max`; `default` when not set.
    pub(super) fn count(
        &self,
        key: &str,
        default: u32,
        min: u32,
        max: u32,
    ) -> Result<u32, FieldError> {
        match self.table.get(key) {
            None => Ok(default),
            Some(toml::Value::Integer(n)) if (i64::from(min)..=i64::from(max)).contains(n) => {
                Ok(*n as u32)
            }
            Some(_) => Err(field_error(
                key,
                format!("expected an integer in {min}..={max}"),
            )),
        }
    }

    /// `true` or `false`; `false` when not set.
    pub(super) fn flag(&self, key: &str) -> Result<bool, FieldError> {
        match self.table.get(key) {
            None => Ok(false),
            Some(toml::Value::Boolean(b)) => Ok(*b),
            Some(_) => Err(field_error(key, "expected true or false")),
        }
    }

    /// The sub-table `[kinds.<key>]`, if set, read with the same
    /// environment.
    /// An array of tables (`[[kinds.KEY]]`); empty when absent.
    pub(super) fn tables(&self, key: &str) -> Result<Vec<Keys<'a>>, FieldError> {
        match self.table.get(key) {
            None => Ok(Vec::new()),
            Some(toml::Value::Array(a)) => a
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    toml::Value::Table(t) => Ok(Keys::new(t, self.env)),
                    _ => Err(field_error(
                        &format!("{key}[{i}]"),
                        format!("expected a table ([[kinds.{key}]])"),
                    )),
                })
                .collect(),
            Some(_) => Err(field_error(
                key,
                format!("expected an array of tables ([[kinds.{key}]])"),
            )),
        }
    }

    pub(super) fn section(&self, key: &str) -> Result<Option<Keys<'a>>, FieldError> {
        match self.table.get(key) {
            None => Ok(None),
            Some(toml::Value::Table(t)) => Ok(Some(Keys::new(t, self.env))),
            Some(_) => Err(field_error(
                key,
                format!("expected a table ([kinds.{key}])"),
            )),
        }
    }
}

/// The secret in environment variable `var`: set and not empty, or a
/// message naming the variable (never a value).
fn env_secret(env: &dyn Fn(&str) -> Option<String>, var: &str) -> Result<Secret, String> {
    match env(var) {
        Some(v) if !v.is_empty() => Ok(Secret::new(v)),
        Some(_) => Err(format!("environment variable {var} is empty")),
        None => Err(format!("environment variable {var} is not set")),
    }
}

/// A webhook URL: `http` or `https`, with a host, without credentials.
/// Credentials in a URL would be copied into every error message and log
/// line that names the URL; the message shows the URL with its password
/// replaced by `***`.
fn check_url(u: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(u);
    // What stands before the path; an `@` there is userinfo, whether or not
    // the rest parses as a URL.
    let authority = u.split_once("://").map_or(u, |(_, rest)| rest);
    let authority = authority.split(['/', '?', '#']).next().unwrap_or("");
    let userinfo = authority.contains('@')
        || parsed
            .as_ref()
            .is_ok_and(|p| !p.username().is_empty() || p.password().is_some());
    if userinfo {
        return Err(format!(
            "URL {:?} carries credentials (user:password@): not allowed, they would be logged",
            without_userinfo(u)
        ));
    }
    match parsed {
        Ok(p) if matches!(p.scheme(), "http" | "https") && p.host().is_some() => Ok(()),
        _ => Err(format!(
            "bad URL {:?} (expected http:// or https:// and a host)",
            without_userinfo(u)
        )),
    }
}

/// `u` fit for a message: redacted ([`crate::secret::redact_url`]) and
/// truncated.
pub(super) fn without_userinfo(u: &str) -> String {
    crate::untrusted::truncate(&crate::secret::redact_url(u))
}

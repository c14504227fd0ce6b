//! `planner drafts import`: JSON Lines of drafts loaded with one `COPY`.
//!
//! Why a module of its own: an import is two steps with different failure
//! modes. Every line is parsed and checked against the config first, in
//! memory, so a bad line names its file and line and nothing reaches
//! Postgres (all or nothing without a rollback). Only then are the rows
//! streamed into `draft` with `COPY … FROM STDIN` inside one transaction:
//! one statement whatever the count, where a row-by-row `INSERT` paid a
//! round trip per draft (100,000 drafts took about 13 s).

use crate::config::Config;
use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::PgPool;
use std::io::BufRead;

/// How much encoded COPY data is sent to Postgres per message.
const COPY_CHUNK: usize = 1 << 20;

/// The one `COPY` statement; the column order matches [`DraftRows::push`].
const COPY_DRAFTS: &str =
    "COPY draft (kind, title, body, status, ready_at, created_at) FROM STDIN (FORMAT text)";

/// Why an import was refused; the file and line are named where one is at fault.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file could not be read; nothing was imported.
    #[error("reading {file}")]
    Read {
        /// The file named on the command line.
        file: String,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A line is not a JSON draft of the import format.
    #[error("{file}:{line}: not a draft line")]
    NotADraft {
        /// The file being imported.
        file: String,
        /// The 1-based line number.
        line: usize,
        /// What the JSON parser said.
        #[source]
        source: serde_json::Error,
    },
    /// A draft names a kind that is not configured: no slot would ever
    /// pick it.
    #[error("{file}:{line}: unknown kind {kind:?}")]
    UnknownKind {
        /// The file being imported.
        file: String,
        /// The 1-based line number.
        line: usize,
        /// The kind it names.
        kind: String,
    },
    /// Postgres refuses NUL in text; caught here so the line is named.
    #[error("{file}:{line}: {field} contains a NUL character")]
    Nul {
        /// The file being imported.
        file: String,
        /// The 1-based line number.
        line: usize,
        /// The offending field (`title`, `body`, …).
        field: &'static str,
    },
    /// Postgres failed; the import is one transaction, so nothing was kept.
    #[error("postgres")]
    Store(#[from] sqlx::Error),
}

/// One line of the file: the import's public format (docs/DESIGN.md).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    kind: String,
    title: String,
    #[serde(default)]
    body: String,
    ready_at: Option<DateTime<Utc>>,
}

/// Validated drafts, already encoded as `COPY` text rows.
#[derive(Debug, Default)]
pub struct DraftRows {
    copy: Vec<u8>,
    count: usize,
}

impl DraftRows {
    /// Reads and checks every line of `reader` (named `file` in errors).
    /// Blank lines are skipped; a draft without `ready_at` is ready at `now`.
    pub fn parse(
        reader: impl BufRead,
        file: &str,
        config: &Config,
        now: DateTime<Utc>,
    ) -> Result<Self, ImportError> {
        let mut rows = Self::default();
        for (i, line) in reader.lines().enumerate() {
            let line = line.map_err(|source| ImportError::Read {
                file: file.to_owned(),
                source,
            })?;
            if line.trim().is_empty() {
                continue;
            }
            let at = |source| ImportError::NotADraft {
                file: file.to_owned(),
                line: i + 1,
                source,
            };
            let l: Line = serde_json::from_str(&line).map_err(at)?;
            if config.kind(&l.kind).is_none() {
                return Err(ImportError::UnknownKind {
                    file: file.to_owned(),
                    line: i + 1,
                    kind: l.kind,
                });
            }
            for (field, v) in [("title", &l.title), ("body", &l.body)] {
                if v.contains('\0') {
                    return Err(ImportError::Nul {
                        file: file.to_owned(),
                        line: i + 1,
                        field,
                    });
                }
            }
            rows.push(&l.kind, &l.title, &l.body, l.ready_at.unwrap_or(now), now);
        }
        Ok(rows)
    }

    /// How many drafts the file held.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the file held no drafts.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Appends one `ready` draft in `COPY` text format.
    fn push(
        &mut self,
        kind: &str,
        title: &str,
        body: &str,
        ready_at: DateTime<Utc>,
        now: DateTime<Utc>,
    ) {
        for field in [kind, title, body] {
            escape_into(&mut self.copy, field);
            self.copy.push(b'\t');
        }
        self.copy.extend_from_slice(b"ready\t");
        self.copy.extend_from_slice(timestamp(ready_at).as_bytes());
        self.copy.push(b'\t');
        self.copy.extend_from_slice(timestamp(now).as_bytes());
        self.copy.push(b'\n');
        self.count += 1;
    }

    /// Inserts every draft in one transaction with one `COPY`: all of them
    /// or, on any error, none. Returns how many rows Postgres took.
    pub async fn copy_into(&self, pool: &PgPool) -> Result<u64, ImportError> {
        if self.is_empty() {
            return Ok(0);
        }
        let mut tx = pool.begin().await?;
        let mut copy = tx.copy_in_raw(COPY_DRAFTS).await?;
        for chunk in self.copy.chunks(COPY_CHUNK) {
            if let Err(e) = copy.send(chunk).await {
                copy.abort("import failed").await.ok();
                return Err(e.into());
            }
        }
        let n = copy.finish().await?;
        tx.commit().await?;
        Ok(n)
    }
}

/// RFC 3339 in UTC, microseconds kept (Postgres's resolution).
fn timestamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// `COPY` text format: backslash, tab, newline and carriage return escaped.
fn escape_into(out: &mut Vec<u8>, s: &str) {
    for b in s.bytes() {
        match b {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            _ => out.push(b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_copy_specials() {
        let mut out = Vec::new();
        escape_into(&mut out, "a\\b\tc\nd\re");
        assert_eq!(out, b"a\\\\b\\tc\\nd\\re");
    }
}

//! `planner drafts import`: JSON Lines of drafts loaded with one `COPY`.
//!
//! Why a module of its own: an import is two steps with different failure
//! modes. Every line is parsed and checked against the config first, in
//! memory, so a bad line names its file and line and nothing reaches
//! Postgres (all or nothing without a rollback). Only then are the rows
//! streamed into `draft` with `COPY … FROM STDIN` inside one transaction:
//! one statement whatever the count, where a row-by-row `INSERT` paid a
//! round trip per draft (100,000 drafts took about 13 s).
//!
//! The size limits ([`MAX_TITLE_CHARS`], [`MAX_BODY_BYTES`],
//! [`MAX_LINE_BYTES`]) live here too, and `planner drafts add` checks the
//! same ones ([`check_draft`]): a draft file comes from a CMS export or a
//! script, and one runaway line must be refused, not loaded into memory.

use crate::config::Config;
use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::PgPool;
use std::io::{BufRead, Read};

/// The longest title, in characters. Titles are shown in one line of
/// `planner drafts list` and sent to the CMS as a post title; a real
/// headline is under 200 characters, so 1,000 leaves room for any of them
/// and refuses a body pasted into the title by mistake.
pub const MAX_TITLE_CHARS: usize = 1_000;

/// The longest body, in bytes of UTF-8 (1 MiB). A long-form article with
/// its HTML is well under 200 KB; the limit keeps one draft from making a
/// webhook call or a `COPY` row of unbounded size.
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// The longest line of an import file, in bytes before its `\n`
/// (4 MiB + 64 KiB): a body at its limit even when the exporter escaped it
/// to four times its size (Python's default `ensure_ascii` writes a CJK
/// character's 3 bytes as 6 and an emoji's 4 as 12), plus a title at its
/// limit escaped alike and the other fields. A longer line is refused
/// after reading this many bytes plus one, never loaded whole.
pub const MAX_LINE_BYTES: usize = 4 * MAX_BODY_BYTES + (64 << 10);

/// A draft field over its limit; [`check_draft`] says which.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TooLong {
    /// The title has more than [`MAX_TITLE_CHARS`] characters.
    #[error("title is {chars} characters, over the limit of {MAX_TITLE_CHARS}")]
    Title {
        /// How many characters it has.
        chars: usize,
    },
    /// The body has more than [`MAX_BODY_BYTES`] bytes.
    #[error("body is over the limit of {MAX_BODY_BYTES} bytes (1 MiB)")]
    Body,
    /// An import line has more than [`MAX_LINE_BYTES`] bytes; only the
    /// first `MAX_LINE_BYTES + 1` were read.
    #[error("line is over the limit of {MAX_LINE_BYTES} bytes")]
    Line,
}

/// Checks a draft's title and body against [`MAX_TITLE_CHARS`] and
/// [`MAX_BODY_BYTES`], for `drafts add` and each line of an import alike.
pub fn check_draft(title: &str, body: &str) -> Result<(), TooLong> {
    // Bytes bound characters from above: count only when it could matter.
    if title.len() > MAX_TITLE_CHARS {
        let chars = title.chars().count();
        if chars > MAX_TITLE_CHARS {
            return Err(TooLong::Title { chars });
        }
    }
    if body.len() > MAX_BODY_BYTES {
        return Err(TooLong::Body);
    }
    Ok(())
}

/// How much encoded COPY data is sent to Postgres per message.
const COPY_CHUNK: usize = 1 << 20;

/// The one `COPY` statement; the column order matches [`DraftRows::push`].
const COPY_DRAFTS: &str =
    "COPY draft (kind, title, body, status, ready_at, priority, category, created_at) FROM STDIN (FORMAT text)";

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
    /// A line, or a draft's title or body, is over its size limit
    /// ([`MAX_LINE_BYTES`], [`MAX_TITLE_CHARS`], [`MAX_BODY_BYTES`]);
    /// nothing was imported.
    #[error("{file}:{line}: {what}")]
    TooLong {
        /// The file being imported.
        file: String,
        /// The 1-based line number.
        line: usize,
        /// Which limit, and by how much.
        what: TooLong,
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
    #[serde(default)]
    priority: i32,
    category: Option<String>,
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
    /// A line is read through a `take` of [`MAX_LINE_BYTES`] + 1 bytes, so
    /// a longer one is refused without being loaded.
    pub fn parse(
        mut reader: impl BufRead,
        file: &str,
        config: &Config,
        now: DateTime<Utc>,
    ) -> Result<Self, ImportError> {
        let mut rows = Self::default();
        let mut buf = Vec::new();
        let read = |source| ImportError::Read {
            file: file.to_owned(),
            source,
        };
        for i in 0.. {
            let too_long = |what| ImportError::TooLong {
                file: file.to_owned(),
                line: i + 1,
                what,
            };
            buf.clear();
            let n = (&mut reader)
                .take(MAX_LINE_BYTES as u64 + 1)
                .read_until(b'\n', &mut buf)
                .map_err(read)?;
            if n == 0 {
                break;
            }
            // As `BufRead::lines`: the line ends before `\n` or `\r\n`.
            if buf.last() == Some(&b'\n') {
                buf.pop();
                if buf.last() == Some(&b'\r') {
                    buf.pop();
                }
            }
            if buf.len() > MAX_LINE_BYTES {
                return Err(too_long(TooLong::Line));
            }
            let line = std::str::from_utf8(&buf)
                .map_err(|e| read(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?;
            if line.trim().is_empty() {
                continue;
            }
            let at = |source| ImportError::NotADraft {
                file: file.to_owned(),
                line: i + 1,
                source,
            };
            let l: Line = serde_json::from_str(line).map_err(at)?;
            if config.kind(&l.kind).is_none() {
                return Err(ImportError::UnknownKind {
                    file: file.to_owned(),
                    line: i + 1,
                    kind: l.kind,
                });
            }
            check_draft(&l.title, &l.body).map_err(too_long)?;
            let category = l.category.clone().unwrap_or_default();
            for (field, v) in [
                ("title", &l.title),
                ("body", &l.body),
                ("category", &category),
            ] {
                if v.contains('\0') {
                    return Err(ImportError::Nul {
                        file: file.to_owned(),
                        line: i + 1,
                        field,
                    });
                }
            }
            rows.push(&l, l.ready_at.unwrap_or(now), now);
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
    fn push(&mut self, l: &Line, ready_at: DateTime<Utc>, now: DateTime<Utc>) {
        for field in [&l.kind, &l.title, &l.body] {
            escape_into(&mut self.copy, field);
            self.copy.push(b'\t');
        }
        self.copy.extend_from_slice(b"ready\t");
        self.copy.extend_from_slice(timestamp(ready_at).as_bytes());
        self.copy.push(b'\t');
        self.copy
            .extend_from_slice(l.priority.to_string().as_bytes());
        self.copy.push(b'\t');
        match &l.category {
            Some(c) => escape_into(&mut self.copy, c),
            None => self.copy.extend_from_slice(b"\\N"),
        }
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

//! Line numbers for YAML.
//!
//! `serde_yaml_ng` gives the structure of a document but not the lines of
//! its values, so the text is also read here, shallowly: split into documents
//! at `---`/`...` markers, and each document's block-style keys indexed by
//! their path (`spec.jobTemplate.spec.backoffLimit`,
//! `spec.jobTemplate.spec.template.spec.containers.0.image`). Block scalars
//! are skipped; keys inside flow collections (`{…}`, `[…]`) are not indexed
//! and fall back to the nearest indexed ancestor.

use std::collections::HashMap;

/// One YAML document of a stream.
#[derive(Debug, Clone)]
pub(crate) struct Document {
    /// 1-based line of the document's first line (its `---` marker, if any).
    pub first_line: usize,
    /// The document's text, preceded by blank lines so that line numbers in
    /// it (and in parser errors about it) are those of the whole file.
    pub padded: String,
    /// Key paths and their 1-based lines.
    pub keys: KeyLines,
}

fn is_marker(line: &str, m: &str) -> bool {
    line.strip_prefix(m)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
}

/// Splits a stream into documents, skipping those holding only blank lines,
/// comments and directives.
pub(crate) fn split_documents(text: &str) -> Vec<Document> {
    let lines: Vec<&str> = text.lines().collect();
    let mut docs = Vec::new();
    let mut cur: Vec<String> = Vec::new();
    let mut start = 0usize; // 0-based index of cur[0]
    let mut flush = |cur: &mut Vec<String>, start: usize| {
        let has_content = cur.iter().any(|l| {
            let t = l.trim_start();
            !t.is_empty() && !t.starts_with('#')
        });
        if has_content {
            let mut padded = "\n".repeat(start);
            padded.push_str(&cur.join("\n"));
            padded.push('\n');
            let refs: Vec<&str> = cur.iter().map(String::as_str).collect();
            docs.push(Document {
                first_line: start + 1,
                keys: KeyLines::index(&refs, start + 1),
                padded,
            });
        }
        cur.clear();
    };
    for (i, line) in lines.iter().enumerate() {
        if is_marker(line, "---") {
            flush(&mut cur, start);
            start = i;
            cur.push(format!("   {}", &line[3..]));
        } else if is_marker(line, "...") {
            flush(&mut cur, start);
            start = i + 1;
        } else if line.starts_with('%')
            && cur
                .iter()
                .all(|l| l.trim().is_empty() || l.starts_with('%'))
        {
            // A directive: only valid before a `---`, which starts the next
            // document; keep the line count.
            cur.push(String::new());
        } else {
            cur.push((*line).to_owned());
        }
    }
    flush(&mut cur, start);
    docs
}

/// The first line of each key path of a document.
#[derive(Debug, Clone, Default)]
pub(crate) struct KeyLines {
    map: HashMap<String, usize>,
}

#[derive(Debug)]
enum Frame {
    Key { col: usize, name: String },
    Item { col: usize, idx: usize },
}

impl Frame {
    fn col(&self) -> usize {
        match self {
            Frame::Key { col, .. } | Frame::Item { col, .. } => *col,
        }
    }
}

/// A block-style key at the start of `rest`: `name:` followed by a space or
/// the end of the line, the name plain or quoted. Returns the name and what
/// follows the colon.
fn parse_key(rest: &str) -> Option<(String, &str)> {
    let first = rest.chars().next()?;
    if first == '"' || first == '\'' {
        let close = rest[1..].find(first)? + 1;
        let after = rest[close + 1..].trim_start();
        let value = after.strip_prefix(':')?;
        if !(value.is_empty() || value.starts_with([' ', '\t'])) {
            return None;
        }
        return Some((rest[1..close].to_owned(), value));
    }
    if matches!(
        first,
        '{' | '[' | '#' | '&' | '*' | '!' | '|' | '>' | '?' | '%' | '@' | '`'
    ) {
        return None;
    }
    let bytes = rest.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'#' && i > 0 && bytes[i - 1] == b' ' {
            return None;
        }
        if b == b':' && (i + 1 == bytes.len() || bytes[i + 1] == b' ' || bytes[i + 1] == b'\t') {
            let name = rest[..i].trim_end();
            if name.is_empty() {
                return None;
            }
            return Some((name.to_owned(), &rest[i + 1..]));
        }
    }
    None
}

/// Whether a value starts a block scalar (`|`, `>`, with optional
/// indentation and chomping indicators, or after an anchor or tag).
fn starts_block_scalar(value: &str) -> bool {
    let mut v = value.trim();
    if let Some(i) = v.find(" #") {
        v = v[..i].trim_end();
    }
    let last = v.split_whitespace().last().unwrap_or("");
    let mut chars = last.chars();
    matches!(chars.next(), Some('|' | '>'))
        && chars.all(|c| c == '-' || c == '+' || c.is_ascii_digit())
}

impl KeyLines {
    /// Indexes the block-style keys of `lines`, the first of which is line
    /// `first_line` of the file.
    pub(crate) fn index(lines: &[&str], first_line: usize) -> KeyLines {
        let mut map = HashMap::new();
        let mut stack: Vec<Frame> = Vec::new();
        let mut block_scalar_col: Option<usize> = None;
        for (i, raw) in lines.iter().enumerate() {
            let indent = raw.len() - raw.trim_start_matches(' ').len();
            let trimmed = &raw[indent..];
            if let Some(c) = block_scalar_col {
                if trimmed.trim().is_empty() || indent > c {
                    continue;
                }
                block_scalar_col = None;
            }
            if trimmed.trim().is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let mut col = indent;
            let mut rest = trimmed;
            loop {
                if rest == "-" || rest.starts_with("- ") || rest.starts_with("-\t") {
                    while stack.last().is_some_and(|f| f.col() > col) {
                        stack.pop();
                    }
                    let mut idx = 0;
                    if let Some(Frame::Item { col: c, idx: prev }) = stack.last() {
                        if *c == col {
                            idx = prev + 1;
                            stack.pop();
                        }
                    }
                    stack.push(Frame::Item { col, idx });
                    let after = &rest[1..];
                    let skipped = after.len() - after.trim_start().len();
                    col += 1 + skipped;
                    rest = after.trim_start();
                    if rest.is_empty() {
                        break;
                    }
                    if starts_block_scalar(rest) {
                        block_scalar_col = Some(col - 1 - skipped);
                        break;
                    }
                    continue;
                }
                if let Some((name, value)) = parse_key(rest) {
                    while stack.last().is_some_and(|f| f.col() >= col) {
                        stack.pop();
                    }
                    stack.push(Frame::Key { col, name });
                    let path = stack
                        .iter()
                        .map(|f| match f {
                            Frame::Key { name, .. } => name.clone(),
                            Frame::Item { idx, .. } => idx.to_string(),
                        })
                        .collect::<Vec<_>>()
                        .join(".");
                    map.entry(path).or_insert(first_line + i);
                    if starts_block_scalar(value) {
                        block_scalar_col = Some(col);
                    }
                }
                break;
            }
        }
        KeyLines { map }
    }

    /// The line of exactly this path.
    pub(crate) fn get(&self, path: &str) -> Option<usize> {
        self.map.get(path).copied()
    }

    /// The line of `path`, else of its nearest indexed ancestor, else
    /// `fallback`.
    pub(crate) fn nearest(&self, path: &str, fallback: usize) -> usize {
        let mut p = path;
        loop {
            if let Some(l) = self.get(p) {
                return l;
            }
            match p.rfind('.') {
                Some(i) => p = &p[..i],
                None => return fallback,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = "\
# leading comment
---
apiVersion: batch/v1
kind: CronJob
metadata:
  name: a
spec:
  schedule: \"0 3 * * *\"
  jobTemplate:
    spec:
      template:
        spec:
          containers:
          - name: main
            image: app:1
            args:
            - |
              schedule: not a key
            env:
              - name: X
                value: \"1\"
              - name: Y
          restartPolicy: Never
--- # second
kind: ConfigMap
data:
  script: |
    kind: not a key
    spec: neither
  other: 1
...
";

    #[test]
    fn documents_split_at_markers_with_file_lines() {
        let docs = split_documents(STREAM);
        assert_eq!(docs.len(), 2);
        assert_eq!(docs[0].first_line, 2);
        assert_eq!(docs[1].first_line, 24);
        assert_eq!(
            docs[0].padded.lines().nth(7),
            Some("  schedule: \"0 3 * * *\"")
        );
        let v: serde_yaml_ng::Value = serde_yaml_ng::from_str(&docs[1].padded).unwrap();
        assert_eq!(v["kind"].as_str(), Some("ConfigMap"));
    }

    #[test]
    fn keys_are_indexed_by_path_across_sequences_and_block_scalars() {
        let docs = split_documents(STREAM);
        let k = &docs[0].keys;
        assert_eq!(k.get("kind"), Some(4));
        assert_eq!(k.get("spec.schedule"), Some(8));
        let c = "spec.jobTemplate.spec.template.spec.containers.0";
        assert_eq!(k.get(&format!("{c}.image")), Some(15));
        assert_eq!(k.get(&format!("{c}.args")), Some(16));
        assert_eq!(k.get(&format!("{c}.env.0.value")), Some(21));
        assert_eq!(k.get(&format!("{c}.env.1.name")), Some(22));
        assert_eq!(
            k.get("spec.jobTemplate.spec.template.spec.restartPolicy"),
            Some(23)
        );
        assert_eq!(k.get(&format!("{c}.args.0.schedule")), None);
        assert_eq!(k.nearest("spec.jobTemplate.spec.backoffLimit", 1), 10);
        let k2 = &docs[1].keys;
        assert_eq!(k2.get("kind"), Some(25));
        assert_eq!(k2.get("data.other"), Some(30));
        assert_eq!(k2.get("data.script.kind"), None);
        assert_eq!(k2.get("spec"), None);
    }

    #[test]
    fn keys_parse_plain_and_quoted() {
        assert_eq!(parse_key("name: x"), Some(("name".into(), " x")));
        assert_eq!(parse_key("\"a b\": 1"), Some(("a b".into(), " 1")));
        assert_eq!(
            parse_key("batch.kubernetes.io/x: y").map(|k| k.0),
            Some("batch.kubernetes.io/x".into())
        );
        assert_eq!(parse_key("http://x"), None);
        assert_eq!(parse_key("plain words"), None);
        assert_eq!(parse_key("{a: 1}"), None);
        assert!(starts_block_scalar(" |-"));
        assert!(starts_block_scalar(" >2 # folded"));
        assert!(!starts_block_scalar(" a|b"));
    }
}

//! Bounds on copies of untrusted input.
//!
//! Anything a stranger can put on the ready stream (with `redis-cli`), in a
//! CMS answer or in a config file may be arbitrarily long. slotgate copies
//! such strings into logs, `execution.detail` and the dead-letter stream;
//! every such copy goes through [`truncate`], so one 200 KB field cannot
//! multiply into megabytes of logs and rows.
//!
//! An answer may also *echo the request*: a CMS or an IndexNow endpoint
//! answering `400` with the JSON it was sent (the IndexNow key in it), a
//! debugging proxy that prints the `Authorization` header. What is kept
//! of an answer is therefore an [`excerpt`]: the kind's own secrets
//! replaced by `***` wherever they occur ([`scrub`], before the cut, so a
//! secret's first half is not left at the end either), and whatever
//! *looks* like a credential masked too ([`mask_credentials`]: a `Bearer`
//! or `Basic` value, a JSON field, header or parameter named like a key,
//! token, secret or password), then cut to [`MAX_COPY_BYTES`].

/// The most bytes of an untrusted string that is logged or stored.
pub const MAX_COPY_BYTES: usize = 256;

/// `s` cut to at most [`MAX_COPY_BYTES`] bytes on a character boundary,
/// with `…` appended when something was cut.
pub fn truncate(s: &str) -> String {
    truncate_to(s, MAX_COPY_BYTES)
}

/// `s` cut to at most `max` bytes on a character boundary (plus `…` when cut).
pub fn truncate_to(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// Raw bytes as text for a log line or a row: invalid UTF-8 is replaced
/// (U+FFFD) and the result truncated like [`truncate`].
pub fn lossy(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(MAX_COPY_BYTES + 4)];
    truncate(&String::from_utf8_lossy(cut))
}

/// What a hidden value is replaced with.
pub const HIDDEN: &str = "***";

/// The spellings under which `secret` may come back in an answer that
/// echoes a request: as sent, JSON-escaped (`"`, `\`, control
/// characters), and with `/` escaped as `\/` as PHP's `json_encode`
/// writes it. None for an empty secret.
pub fn secret_spellings(secret: &str) -> Vec<String> {
    if secret.is_empty() {
        return Vec::new();
    }
    let json = serde_json::to_string(secret).expect("a string serializes");
    let json = json[1..json.len() - 1].to_owned();
    let php = json.replace('/', "\\/");
    let mut all = vec![secret.to_owned(), json, php];
    all.sort();
    all.dedup();
    all
}

/// `text` with every occurrence of each of `secrets` (spellings, see
/// [`secret_spellings`]) replaced by [`HIDDEN`]. A text that was cut
/// ([`truncate`]'s `…` at its end) and ends with the first 4 or more
/// characters of a secret has that start hidden too.
pub fn scrub(text: &str, secrets: &[String]) -> String {
    let mut secrets: Vec<&String> = secrets.iter().filter(|s| !s.is_empty()).collect();
    if secrets.is_empty() {
        return text.to_owned();
    }
    // Longest first: a secret that contains another is hidden whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut out = text.to_owned();
    for s in &secrets {
        if out.contains(s.as_str()) {
            out = out.replace(s.as_str(), HIDDEN);
        }
    }
    if let Some(body) = out.strip_suffix('…') {
        for s in &secrets {
            let starts = s.char_indices().map(|(i, _)| i).skip(1).chain([s.len()]);
            let longest = starts
                .filter(|&end| s[..end].chars().count() >= 4.min(s.chars().count()))
                .filter(|&end| body.ends_with(&s[..end]))
                .max();
            if let Some(end) = longest {
                return format!("{}{HIDDEN}…", &body[..body.len() - end]);
            }
        }
    }
    out
}

/// Every string in `v` (values, not object keys) [`scrub`]bed.
pub fn scrub_json(v: &mut serde_json::Value, secrets: &[String]) {
    use serde_json::Value;
    if secrets.is_empty() {
        return;
    }
    match v {
        Value::String(s) => {
            let clean = scrub(s, secrets);
            if clean != *s {
                *s = clean;
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| scrub_json(x, secrets)),
        Value::Object(o) => o.values_mut().for_each(|x| scrub_json(x, secrets)),
        _ => {}
    }
}

/// Words that make a field, header or parameter name a credential's
/// (compared lower-cased, as parts of the name: `api_key`, `X-Auth-Token`,
/// `app_password`).
const CREDENTIAL_WORDS: &[&str] = &[
    "key",
    "token",
    "secret",
    "password",
    "passwd",
    "auth",
    "signature",
    "cookie",
    "credential",
];

fn names_credential(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    CREDENTIAL_WORDS.iter().any(|w| n.contains(w))
}

/// `text` with what looks like a credential masked ([`HIDDEN`]), whether
/// or not its value is known: the string value of a JSON field whose name
/// names one (`"key": "…"`, `"authorization": "…"`), the value of such a
/// header line (`X-Api-Key: …`) or parameter (`?token=…`), and the value
/// after `Bearer ` or `Basic `. Applied to the answers of strangers, it
/// may hide more than a credential (an echoed `Idempotency-Key` too);
/// never less than these.
pub fn mask_credentials(text: &str) -> String {
    let text = mask_json_fields(text);
    let text = mask_named_values(&text);
    mask_auth_schemes(&text)
}

/// Replaces `ranges` (sorted, disjoint byte ranges of `text`) by [`HIDDEN`].
fn replace_ranges(text: &str, ranges: &[(usize, usize)]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for &(from, to) in ranges {
        out.push_str(&text[at..from]);
        out.push_str(HIDDEN);
        at = to;
    }
    out.push_str(&text[at..]);
    out
}

/// The byte index just past the JSON string starting with the `"` at
/// `start` (the text's end when it is not closed).
fn json_string_end(b: &[u8], start: usize) -> usize {
    let mut i = start + 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    b.len()
}

fn skip_space(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    i
}

/// `"name": "value"` with a credential's name: the value's text hidden.
fn mask_json_fields(text: &str) -> String {
    let b = text.as_bytes();
    let mut ranges = Vec::new();
    let mut i = 0;
    while let Some(q) = b[i..].iter().position(|&c| c == b'"').map(|p| p + i) {
        let name_end = json_string_end(b, q);
        let name = &text[q + 1..name_end.saturating_sub(1).max(q + 1)];
        i = name_end;
        let colon = skip_space(b, name_end);
        if b.get(colon) != Some(&b':') {
            continue;
        }
        let v = skip_space(b, colon + 1);
        if b.get(v) != Some(&b'"') {
            continue;
        }
        let v_end = json_string_end(b, v);
        let inner_end = if v_end > v + 1 && b[v_end - 1] == b'"' {
            v_end - 1
        } else {
            v_end
        };
        if names_credential(name) && inner_end > v + 1 {
            ranges.push((v + 1, inner_end));
        }
        i = v_end;
    }
    replace_ranges(text, &ranges)
}

/// `name=value` (a query or form parameter) and `Name: value` (a header
/// line) with a credential's name: the value hidden, up to the next
/// `&`, quote, `<` or whitespace (`=`) or the line's end (`:`).
fn mask_named_values(text: &str) -> String {
    let b = text.as_bytes();
    let is_name = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for (sep_at, &sep) in b.iter().enumerate() {
        if sep != b'=' && sep != b':' {
            continue;
        }
        let mut start = sep_at;
        while start > 0 && is_name(b[start - 1]) {
            start -= 1;
        }
        if start == sep_at || !names_credential(&text[start..sep_at]) {
            continue;
        }
        if sep == b':' && start > 0 && !matches!(b[start - 1], b'\n' | b'\r' | b' ' | b'\t') {
            continue;
        }
        let from = if sep == b':' {
            skip_space(b, sep_at + 1)
        } else {
            sep_at + 1
        };
        let mut to = from;
        while to < b.len() {
            let c = b[to];
            let stop = if sep == b'=' {
                c.is_ascii_whitespace()
                    || matches!(c, b'&' | b'"' | b'\'' | b'<' | b'>' | b'#' | b';' | b',')
            } else {
                matches!(c, b'\n' | b'\r' | b'"' | b'<')
            };
            if stop {
                break;
            }
            to += 1;
        }
        if to > from && ranges.last().is_none_or(|&(_, end)| from >= end) {
            ranges.push((from, to));
        }
    }
    replace_ranges(text, &ranges)
}

/// The value after `Bearer ` or `Basic ` (any case) hidden.
fn mask_auth_schemes(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let b = text.as_bytes();
    let mut ranges: Vec<(usize, usize)> = Vec::new();
    for scheme in ["bearer", "basic"] {
        let mut from = 0;
        while let Some(p) = lower[from..].find(scheme).map(|p| p + from) {
            from = p + scheme.len();
            if p > 0 && b[p - 1].is_ascii_alphanumeric() {
                continue;
            }
            if b.get(from) != Some(&b' ') {
                continue;
            }
            let start = skip_space(b, from);
            let mut end = start;
            while end < b.len() {
                let c = b[end];
                let stop = c.is_ascii_whitespace()
                    || matches!(c, b'"' | b'\'' | b'<' | b'>' | b',' | b';')
                    || (c == b'\\' && b.get(end + 1) == Some(&b'"'));
                if stop {
                    break;
                }
                end += 1;
            }
            if end > start && !text[start..end].starts_with(HIDDEN) {
                ranges.push((start, end));
            }
        }
    }
    ranges.sort();
    ranges.dedup_by(|later, earlier| later.0 < earlier.1);
    replace_ranges(text, &ranges)
}

/// What is kept of an answer's body (at most [`crate::receiver::ANSWER_LIMIT`]
/// bytes as read): as text (invalid UTF-8 replaced), `secrets` [`scrub`]bed
/// and credentials masked ([`mask_credentials`]) over the whole body, then
/// cut like [`truncate`].
pub fn excerpt(bytes: &[u8], secrets: &[String]) -> String {
    let text = String::from_utf8_lossy(bytes);
    truncate(&mask_credentials(&scrub(&text, secrets)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_strings_are_kept() {
        assert_eq!(truncate("article:2026-11-30:1"), "article:2026-11-30:1");
    }

    #[test]
    fn long_strings_are_cut_on_a_char_boundary() {
        let s = "é".repeat(300); // 600 bytes
        let t = truncate(&s);
        assert!(t.len() <= MAX_COPY_BYTES + "…".len(), "{}", t.len());
        assert!(t.ends_with('…'));
        assert!(t.trim_end_matches('…').chars().all(|c| c == 'é'));
    }

    #[test]
    fn invalid_utf8_becomes_replacement_characters() {
        let t = lossy(&[b'a', 0xff, b'b']);
        assert_eq!(t, "a\u{fffd}b");
        assert!(lossy(&[0xfe; 100_000]).len() <= MAX_COPY_BYTES + "…".len());
    }

    fn secrets(s: &[&str]) -> Vec<String> {
        s.iter().flat_map(|s| secret_spellings(s)).collect()
    }

    #[test]
    fn a_known_secret_is_hidden_in_every_spelling() {
        let sec = secrets(&["ab/c\"d"]);
        for echoed in ["x ab/c\"d y", r#"{"t": "ab/c\"d"}"#, r#"{"t":"ab\/c\"d"}"#] {
            let out = scrub(echoed, &sec);
            assert!(
                out.contains(HIDDEN) && !out.contains("c\\\"d") && !out.contains("c\"d"),
                "{echoed} -> {out}"
            );
        }
        assert_eq!(scrub("nothing here", &sec), "nothing here");
        assert_eq!(scrub("anything", &[]), "anything");
        assert!(secret_spellings("").is_empty());
    }

    #[test]
    fn a_secret_cut_by_truncate_leaves_no_start_behind() {
        let key = "0123456789abcdef";
        let text = truncate(&format!("{}{key} and more", "x".repeat(MAX_COPY_BYTES - 6)));
        assert!(text.ends_with("012345…"), "{text}");
        let out = scrub(&text, &secrets(&[key]));
        assert!(out.ends_with("x***…") && !out.contains("0123"), "{out}");
        // Three characters are not a secret's start.
        let short = format!("{}012…", "x".repeat(10));
        assert_eq!(scrub(&short, &secrets(&[key])), short);
    }

    #[test]
    fn json_values_headers_parameters_and_auth_schemes_that_look_like_credentials_are_masked() {
        let echoed = r#"{"host":"blog.example","key":"k-123","urlList":["https://blog.example/a"],"headers":{"authorization":"Bearer tok/en","x":"y"}}"#;
        let out = mask_credentials(echoed);
        assert_eq!(
            out,
            r#"{"host":"blog.example","key":"***","urlList":["https://blog.example/a"],"headers":{"authorization":"***","x":"y"}}"#
        );
        let out =
            mask_credentials("Authorization: Basic dXNlcjpwYXNz\nX-Api-Key: abc\nAccept: */*");
        assert_eq!(out, "Authorization: ***\nX-Api-Key: ***\nAccept: */*");
        assert_eq!(
            mask_credentials("GET /x?token=abc&page=2 said Bearer xyz."),
            "GET /x?token=***&page=2 said Bearer ***"
        );
        // Not credentials: left as they are.
        for plain in [
            "HTTP 400: title too long",
            "<p class=\"x\">12:00</p>",
            r#"{"code":"rest_invalid","message":"bad"}"#,
        ] {
            assert_eq!(mask_credentials(plain), plain);
        }
    }

    #[test]
    fn an_excerpt_is_scrubbed_masked_and_cut() {
        let body = format!(r#"{{"echo":"{}","k":"sekrit-value"}}"#, "z".repeat(1000));
        let e = excerpt(body.as_bytes(), &secrets(&["sekrit-value"]));
        assert!(e.len() <= MAX_COPY_BYTES + "…".len(), "{}", e.len());
        let body = r#"{"k":"sekrit-value"}"#;
        assert_eq!(
            excerpt(body.as_bytes(), &secrets(&["sekrit-value"])),
            r#"{"k":"***"}"#
        );
    }

    #[test]
    fn every_string_of_a_json_value_is_scrubbed() {
        let mut v = serde_json::json!({"error": "HTTP 400: sekrit", "n": 1, "a": ["sekrit"]});
        scrub_json(&mut v, &secrets(&["sekrit"]));
        assert_eq!(
            v,
            serde_json::json!({"error": "HTTP 400: ***", "n": 1, "a": ["***"]})
        );
    }
}

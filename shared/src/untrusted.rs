//! Bounds on copies of untrusted input.
//!
//! Anything a stranger can put on the ready stream (with `redis-cli`), in a
//! CMS answer or in a config file may be arbitrarily long. slotgate copies
//! such strings into logs, `execution.detail` and the dead-letter stream;
//! every such copy goes through [`truncate`], so one 200 KB field cannot
//! multiply into megabytes of logs and rows.

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
}

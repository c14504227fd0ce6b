//! Text that strangers control, made safe to print on an operator's
//! terminal.
//!
//! Why: a delivery's `caller`, worker ids, dead-letter fields, draft titles,
//! operators' notes and stored reasons reach `planner`'s tables as they
//! were written, and anyone with Redis write access (or a CMS feeding
//! drafts) chooses them. Printed raw, an escape sequence in one of them is
//! executed by the terminal: it can retitle the window (OSC 0), clear the
//! screen to hide rows (CSI 2J), write the operator's clipboard (OSC 52),
//! or reorder what a line appears to say (Unicode bidi overrides). Every
//! text renderer passes such fields through [`printable`], which shows
//! those characters as visible escapes instead. `--json` output is left
//! alone: JSON already escapes C0 controls and is read by programs. Log
//! lines need nothing from here: `tracing-subscriber` escapes ANSI
//! sequences in logged fields itself.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether `c` is shown as an escape: every C0 control (newline and tab
/// included: one field must stay on its own line and column), DEL, every
/// C1 control (U+0080–U+009F, `char::is_control`'s whole set), and the
/// bidi embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069)
/// that make a terminal draw text in an order other than its bytes'.
fn must_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every character a terminal would act on — the C0 controls
/// (newline and tab included), DEL, the C1 controls and the bidi
/// embeddings, overrides and isolates — replaced by a visible escape:
/// `\t`, `\n`, `\r`; `\x1b` style for the other C0 controls and DEL;
/// `\u{9b}` style for C1 controls and bidi characters. A string without
/// any is returned as it is, without allocating. A backslash is kept as
/// written, so a field may *look* like it held an escape; it can never
/// *be* one.
pub fn printable(s: &str) -> Cow<'_, str> {
    let Some(first) = s.find(must_escape) else {
        return Cow::Borrowed(s);
    };
    let mut out = String::with_capacity(s.len() + 8);
    out.push_str(&s[..first]);
    for c in s[first..].chars() {
        match c {
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if must_escape(c) && (c as u32) < 0x80 => {
                write!(out, "\\x{:02x}", c as u32).ok();
            }
            c if must_escape(c) => {
                write!(out, "\\u{{{:x}}}", c as u32).ok();
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No byte or character a terminal acts on survives.
    fn inert(s: &str) -> bool {
        !s.chars().any(must_escape)
    }

    #[test]
    fn plain_text_is_borrowed_unchanged() {
        for s in ["", "article:2026-11-30:1", "worker-7 ü ✓ 中文 \\x1b \u{a0}"] {
            assert!(matches!(printable(s), Cow::Borrowed(b) if b == s), "{s:?}");
        }
    }

    #[test]
    fn every_c0_control_and_del_is_escaped() {
        for b in (0u8..0x20).chain([0x7f]) {
            let c = char::from(b);
            let s = format!("a{c}b");
            let p = printable(&s);
            assert!(inert(&p), "{b:#04x}: {p:?}");
            let want = match c {
                '\t' => "a\\tb".to_owned(),
                '\n' => "a\\nb".to_owned(),
                '\r' => "a\\rb".to_owned(),
                _ => format!("a\\x{b:02x}b"),
            };
            assert_eq!(p, want);
        }
        assert_eq!(printable("\x1b]0;pwned\x07"), "\\x1b]0;pwned\\x07");
        assert_eq!(printable("\x1b[2J"), "\\x1b[2J");
    }

    #[test]
    fn every_c1_control_is_escaped() {
        for u in 0x80u32..=0x9f {
            let c = char::from_u32(u).unwrap();
            let s = format!("{c}x");
            let p = printable(&s);
            assert!(inert(&p), "{u:#x}: {p:?}");
            assert_eq!(p, format!("\\u{{{u:x}}}x"));
        }
    }

    #[test]
    fn bidi_overrides_and_isolates_are_escaped() {
        for u in (0x202au32..=0x202e).chain(0x2066..=0x2069) {
            let c = char::from_u32(u).unwrap();
            let s = format!("ok{c}txt.exe");
            let p = printable(&s);
            assert!(inert(&p), "{u:#x}: {p:?}");
            assert_eq!(p, format!("ok\\u{{{u:x}}}txt.exe"));
        }
        // Neighbours that only look alike are text.
        for c in ['\u{2029}', '\u{202f}', '\u{2065}', '\u{206a}'] {
            let s = c.to_string();
            assert!(matches!(printable(&s), Cow::Borrowed(_)), "{:#x}", c as u32);
        }
    }

    #[test]
    fn text_around_escapes_is_kept() {
        assert_eq!(printable("é\x1b]52;c;aGk=\x07✓"), "é\\x1b]52;c;aGk=\\x07✓");
    }
}

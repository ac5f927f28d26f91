//! Text a peer chose (a HELLO's client name, a standby's advertised
//! address, a peer node's error message or region name), made safe to log.
//!
//! The text log format writes a field's value as it is, so a newline in a
//! client name would start a line of the client's making (a forged
//! "role change" or "rules loaded"), and an escape sequence could repaint
//! an operator's terminal. [`escape`] writes every control character
//! (C0, DEL, C1, and the Unicode line and paragraph separators) as a
//! `\n`, `\u{1b}`-style escape and doubles backslashes, so the result is
//! one line that reads back unambiguously; everything else, non-ASCII
//! letters included, stays as it is. The JSON format escapes on its own;
//! an escaped value only gains backslashes there. A leaf: no layer.

use std::borrow::Cow;
use std::fmt::Write;

/// `text` with control characters escaped (see the module docs); borrowed
/// when there is nothing to escape, which is the common case.
pub fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                // Writing to a String cannot fail.
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Displays its text [`escape`]d: for a log field or an error message
/// holding a peer's text (`tracing::warn!(message = %Escaped(&m), ..)`,
/// `#[error("{}", Escaped(.message))]`), without a copy when clean.
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a>(pub &'a str);

impl std::fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&escape(self.0))
    }
}

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\\' | '\u{2028}' | '\u{2029}')
}

#[cfg(test)]
mod tests {
    use super::{escape, Escaped};

    #[test]
    fn the_wrapper_displays_the_escaped_text() {
        let peer = "refused\n\u{1b}[2J\nINFO forged";
        assert_eq!(Escaped("plain").to_string(), "plain");
        let shown = format!("peer said: {}", Escaped("no\n\u{1b}[2Jway"));
        assert_eq!(shown, "peer said: no\\n\\u{1b}[2Jway");
        assert!(!Escaped(peer).to_string().contains('\n'));
        assert!(!Escaped("a\nb\u{1b}[31m")
            .to_string()
            .chars()
            .any(char::is_control));
    }

    #[test]
    fn plain_text_is_borrowed_as_it_is() {
        for text in ["gateway-7", "passerelle-été", "", "a b:c/d"] {
            assert!(matches!(escape(text), std::borrow::Cow::Borrowed(t) if t == text));
        }
    }

    #[test]
    fn control_characters_become_visible_escapes_on_one_line() {
        let forged = "gw\n2026-01-01T00:00:00Z  INFO tollgate: role change\r\t\u{1b}[31m\u{7f}\u{85}\u{2028}";
        let escaped = escape(forged);
        assert_eq!(
            escaped,
            "gw\\n2026-01-01T00:00:00Z  INFO tollgate: role change\\r\\t\\u{1b}[31m\\u{7f}\\u{85}\\u{2028}"
        );
        assert!(!escaped.chars().any(char::is_control));
    }

    #[test]
    fn backslashes_double_so_an_escape_cannot_be_faked() {
        // A name that spells an escape reads back differently from a real one.
        assert_eq!(escape("a\\nb"), "a\\\\nb");
        assert_ne!(escape("a\\nb"), escape("a\nb"));
    }
}

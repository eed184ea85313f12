//! The one redaction function: bot tokens never reach a log line, an error
//! message or a reply. Telegram puts the token in every request URL, so any
//! error that quotes a URL would otherwise leak it.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;

/// `<bot id digits>:<secret>`; the secret is 35 characters in practice, but
/// anything of 30 or more is treated as a token (DESIGN §5).
static TOKEN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\d+:[A-Za-z0-9_-]{30,}").expect("token pattern is valid"));

/// What a token is replaced with. The bot id stays visible: it is public and
/// useful when reading logs of several bots.
const MASK: &str = "<redacted>";

/// Returns `text` with every bot token masked as `<bot id>:<redacted>`.
pub fn redact(text: &str) -> Cow<'_, str> {
    TOKEN.replace_all(text, |caps: &regex::Captures<'_>| {
        let whole = &caps[0];
        let id = whole.split(':').next().unwrap_or_default();
        format!("{id}:{MASK}")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_";

    #[test]
    fn masks_tokens_in_urls_and_text() {
        let url = format!(
            "error sending request for url (https://api.telegram.org/bot{TOKEN}/getUpdates)"
        );
        let out = redact(&url);
        assert!(
            !out.contains("AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_"),
            "{out}"
        );
        assert!(out.contains("bot123456789:<redacted>/getUpdates"), "{out}");
    }

    #[test]
    fn masks_every_occurrence() {
        let text = format!("{TOKEN} and {TOKEN}");
        assert_eq!(
            redact(&text),
            "123456789:<redacted> and 123456789:<redacted>"
        );
    }

    #[test]
    fn leaves_ordinary_text_alone() {
        for text in [
            "12:30 meeting",
            "chat -1001234567890",
            "a:b",
            "1:short_secret",
        ] {
            assert!(matches!(redact(text), Cow::Borrowed(_)), "{text}");
        }
    }
}

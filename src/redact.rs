//! The one redaction function: bot tokens never reach a log line, an error
//! message or a reply. Telegram puts the token in every request URL, so any
//! error that quotes a URL would otherwise leak it.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;

/// The fewest characters of a token's secret: Telegram's have 35. Anything
/// of this length or more after `<digits>:` is masked, and
/// [`crate::config::BotToken::parse`] refuses shorter secrets, so every
/// token the relay accepts is one this masks.
pub const MIN_SECRET_CHARS: usize = 30;

/// `<bot id digits>:<secret>` (docs/DESIGN.md, *Telegram*). ASCII only, as
/// tokens are (`\d` would also take digits of other scripts).
static TOKEN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(r"[0-9]+:[A-Za-z0-9_-]{{{MIN_SECRET_CHARS},}}"))
        .expect("token pattern is valid")
});

/// An nkey seed (docs/CLUSTER.md, *Configuration*): `S`, a key type
/// letter, 56 base32 characters. A NATS library error quoting one must not
/// leak it either.
static NKEY_SEED: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?-u:\b)S[A-Z][A-Z2-7]{56}(?-u:\b)").expect("seed pattern is valid")
});

/// What a token is replaced with. The bot id stays visible: it is public and
/// useful when reading logs of several bots.
const MASK: &str = "<redacted>";

/// The mask in Telegram HTML: shown as `<redacted>`, never read as a tag.
const HTML_MASK: &str = "&lt;redacted&gt;";

/// Returns `text` with every bot token masked as `<bot id>:<redacted>`
/// and every nkey seed as `<redacted>`.
pub fn redact(text: &str) -> Cow<'_, str> {
    redact_with(text, MASK)
}

/// [`redact`] for Telegram HTML: the mask is escaped, so the message still
/// parses (`&lt;redacted&gt;`).
pub fn redact_html(text: &str) -> Cow<'_, str> {
    redact_with(text, HTML_MASK)
}

fn redact_with<'a>(text: &'a str, mask: &str) -> Cow<'a, str> {
    let tokens = TOKEN.replace_all(text, |caps: &regex::Captures<'_>| {
        let whole = &caps[0];
        let id = whole.split(':').next().unwrap_or_default();
        format!("{id}:{mask}")
    });
    match NKEY_SEED.replace_all(&tokens, regex::NoExpand(mask)) {
        Cow::Borrowed(_) => tokens,
        Cow::Owned(masked) => Cow::Owned(masked),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_";

    #[test]
    fn every_seed_the_config_accepts_is_masked() {
        let body = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567".repeat(2)[..56].to_string();
        for second in ['U', 'A', '2', '7'] {
            let seed = format!("S{second}{body}");
            let accepted = crate::config::NkeySeed::parse(&seed).is_ok();
            let masked = !redact(&format!("nats: bad seed {seed}")).contains(&seed);
            assert_eq!(
                accepted, masked,
                "{seed}: accepted {accepted}, masked {masked}"
            );
            assert_eq!(accepted, second.is_ascii_uppercase(), "{seed}");
        }
    }

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
    fn masks_nkey_seeds() {
        let seed = "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4";
        let text = format!("nkey {seed} refused");
        assert_eq!(redact(&text), "nkey <redacted> refused");
        assert_eq!(redact("SUNDAY"), "SUNDAY");
    }

    #[test]
    fn the_html_mask_is_escaped() {
        assert_eq!(
            redact_html(&format!("<code>curl .../bot{TOKEN}/getMe</code>")),
            "<code>curl .../bot123456789:&lt;redacted&gt;/getMe</code>"
        );
    }

    #[test]
    fn masks_every_occurrence() {
        let text = format!("{TOKEN} and {TOKEN}");
        assert_eq!(
            redact(&text),
            "123456789:<redacted> and 123456789:<redacted>"
        );
    }

    proptest::proptest! {
        /// Whatever the token's shape, if the configuration accepts it, no
        /// text that contains it keeps its secret.
        #[test]
        fn every_token_the_config_accepts_is_masked(
            id in "[0-9]{1,12}",
            secret in "[A-Za-z0-9_-]{0,60}",
            before in "\\PC{0,8}",
            after in "\\PC{0,8}",
        ) {
            let token = format!("{id}:{secret}");
            if crate::config::BotToken::parse(&token).is_ok() {
                let text = format!("{before}{token}{after}");
                let masked = redact(&text);
                proptest::prop_assert!(!masked.contains(&secret), "{masked}");
            } else {
                proptest::prop_assert!(secret.len() < MIN_SECRET_CHARS);
            }
        }
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

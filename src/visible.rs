//! Text made safe to show a person: every character that reorders text or
//! shows nothing is written out as its code point, `<U+202E>`, instead of
//! being passed on (or silently dropped).
//!
//! What a person approves on the phone must read as the bytes that run.
//! A bidi override can make `rm -rf ~/ #/tmp` read in another order
//! ("Trojan Source"); a zero-width space can make two names read the same;
//! Unicode tags can carry a whole hidden sentence. Shown as `<U+…>`, each is
//! seen, and seen to be odd, rather than either acting or vanishing.
//!
//! Revealed everywhere: the C0 and C1 controls but tab and line feed (and a
//! carriage return that ends a line), the bidi embeddings, overrides,
//! isolates and marks (U+202A–U+202E, U+2066–U+2069, U+200E, U+200F,
//! U+061C), zero-width spaces and the word joiner, the invisible operators,
//! the soft hyphen, the line and paragraph separators, fillers that draw
//! nothing, and the tag characters. Kept where scripts and emoji need them:
//! a zero-width joiner or non-joiner between two non-ASCII characters
//! (`👩‍💻`, Persian words), and one variation selector after a character
//! (`❤️`, `1️⃣`); next to ASCII, or in a run, they are revealed too, since
//! that is where commands and paths are and where hidden data is smuggled.

use std::borrow::Cow;
use std::fmt::Write as _;

/// `text` with every hidden character written as `<U+XXXX>`. Idempotent:
/// what it returns has nothing left to reveal.
pub fn reveal(text: &str) -> Cow<'_, str> {
    reveal_as(text, false)
}

/// [`reveal`] for Telegram HTML: the marks are escaped (`&lt;U+202E&gt;`),
/// so they show as text and never open a tag. Markup is left alone: no tag
/// or entity contains a hidden character.
pub fn reveal_html(text: &str) -> Cow<'_, str> {
    reveal_as(text, true)
}

/// Whether [`reveal`] would leave `text` as it is.
#[cfg(test)]
pub fn is_plain(text: &str) -> bool {
    matches!(reveal(text), Cow::Borrowed(_))
}

/// Revealed text as a person reads it at a glance: the `<U+XXXX>` marks
/// left out (`paypal<U+200B>.com` reads as `paypal.com`). For judging what
/// a text claims to be (a link's text naming a host), never for showing.
pub fn as_read(text: &str) -> Cow<'_, str> {
    if !text.contains("<U+") {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("<U+") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 3..];
        let digits = after.bytes().take_while(u8::is_ascii_hexdigit).count();
        if (4..=6).contains(&digits) && after[digits..].starts_with('>') {
            rest = &after[digits + 1..];
        } else {
            out.push_str("<U+");
            rest = after;
        }
    }
    out.push_str(rest);
    Cow::Owned(out)
}

fn reveal_as(text: &str, html: bool) -> Cow<'_, str> {
    let mut out: Option<String> = None;
    let mut prev = None;
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let next = chars.peek().map(|&(_, next)| next);
        if hidden(prev, c, next) {
            let out = out.get_or_insert_with(|| {
                let mut out = String::with_capacity(text.len() + 16);
                out.push_str(&text[..at]);
                out
            });
            let (open, close) = if html { ("&lt;", "&gt;") } else { ("<", ">") };
            let _ = write!(out, "{open}U+{:04X}{close}", u32::from(c));
        } else if let Some(out) = &mut out {
            out.push(c);
        }
        prev = Some(c);
    }
    out.map_or(Cow::Borrowed(text), Cow::Owned)
}

/// Whether `c`, between `prev` and `next`, is revealed.
fn hidden(prev: Option<char>, c: char, next: Option<char>) -> bool {
    match c {
        '\t' | '\n' => false,
        // A line ending written CRLF stays; a lone return can make a
        // terminal overwrite what came before it.
        '\r' => next != Some('\n'),
        '\u{200C}' | '\u{200D}' => !(joins(prev) && joins(next)),
        c if is_selector(c) => !selects(prev, c),
        c => always_hidden(c),
    }
}

/// A neighbour a joiner may join: a visible non-ASCII character (an emoji,
/// a letter of a script that needs joiners). A variation selector counts,
/// as in `🏳️‍🌈`.
fn joins(side: Option<char>) -> bool {
    side.is_some_and(|s| {
        !s.is_ascii() && !always_hidden(s) && !matches!(s, '\u{200C}' | '\u{200D}')
    })
}

/// Variation selectors (and Mongolian's free ones): they choose how the
/// character before them is drawn.
fn is_selector(c: char) -> bool {
    matches!(
        c,
        '\u{180B}'..='\u{180D}' | '\u{180F}' | '\u{FE00}'..='\u{FE0F}' | '\u{E0100}'..='\u{E01EF}'
    )
}

/// Whether the selector `c` after `prev` does its job: right after a
/// visible character, not in a run; the emoji and text presentation
/// selectors also after ASCII (`1️⃣`, `©︎`), the others only after the
/// scripts and ideographs that have such variants.
fn selects(prev: Option<char>, c: char) -> bool {
    prev.is_some_and(|p| {
        !always_hidden(p)
            && !is_selector(p)
            && !matches!(p, '\u{200C}' | '\u{200D}')
            && !p.is_ascii_control()
            && (matches!(c, '\u{FE0E}' | '\u{FE0F}') || !p.is_ascii())
    })
}

/// Characters that reorder text or show nothing, wherever they are.
fn always_hidden(c: char) -> bool {
    (c.is_ascii_control() && !matches!(c, '\t' | '\n' | '\r'))
        || matches!(
            c,
            '\u{0080}'..='\u{009F}'
                | '\u{00AD}'
                | '\u{034F}'
                | '\u{061C}'
                | '\u{115F}'
                | '\u{1160}'
                | '\u{17B4}'
                | '\u{17B5}'
                | '\u{180E}'
                | '\u{200B}'
                | '\u{200E}'
                | '\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{206F}'
                | '\u{3164}'
                | '\u{FEFF}'
                | '\u{FFA0}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{1BCA0}'..='\u{1BCA3}'
                | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0000}'..='\u{E007F}'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reordering_and_invisible_characters_are_shown_by_their_code_point() {
        for (text, shown) in [
            // Trojan Source: the command reads "rm -rf ~ # /tmp" reversed.
            (
                "rm -rf \u{202E}pmt/ #\u{202C} ~",
                "rm -rf <U+202E>pmt/ #<U+202C> ~",
            ),
            (
                "\u{2066}a\u{2069}\u{2067}b\u{2068}",
                "<U+2066>a<U+2069><U+2067>b<U+2068>",
            ),
            ("a\u{200E}b\u{200F}c\u{061C}", "a<U+200E>b<U+200F>c<U+061C>"),
            ("pay\u{200B}pal.com", "pay<U+200B>pal.com"),
            ("x\u{2060}\u{FEFF}\u{00AD}y", "x<U+2060><U+FEFF><U+00AD>y"),
            ("ok\u{E0041}\u{E0042}", "ok<U+E0041><U+E0042>"),
            (
                "bell\u{7}esc\u{1B}[2J\u{85}",
                "bell<U+0007>esc<U+001B>[2J<U+0085>",
            ),
            ("over\rwrite", "over<U+000D>write"),
            ("line\u{2028}sep", "line<U+2028>sep"),
            // Joiners next to ASCII: where commands and paths are.
            ("r\u{200D}m", "r<U+200D>m"),
            ("\u{200C}x", "<U+200C>x"),
            ("é\u{200D}", "é<U+200D>"),
            // A run of variation selectors carries hidden bytes.
            (
                "😀\u{FE0F}\u{E0101}\u{E0102}",
                "😀\u{FE0F}<U+E0101><U+E0102>",
            ),
            ("a\u{E0100}", "a<U+E0100>"),
        ] {
            assert_eq!(reveal(text), shown, "{text:?}");
        }
        assert_eq!(reveal_html("a\u{202E}b"), "a&lt;U+202E&gt;b");
    }

    #[test]
    fn what_scripts_and_emoji_need_stays() {
        for text in [
            "plain ASCII, tabs\tand\nlines",
            "crlf\r\nlines\r\n",
            "👨\u{200D}👩\u{200D}👧 family",
            "🏳\u{FE0F}\u{200D}🌈",
            "❤\u{FE0F} 1\u{FE0F}\u{20E3} ©\u{FE0E}",
            "می\u{200C}خواهم",
            "葛\u{E0100}",
            "עברית",
        ] {
            assert!(is_plain(text), "{text:?} became {:?}", reveal(text));
        }
    }

    #[test]
    fn text_as_read_leaves_the_marks_out() {
        assert_eq!(as_read(&reveal("pay\u{200B}pal.com")), "paypal.com");
        assert_eq!(as_read("a <U+12> b <U+0041>c <U+"), "a <U+12> b c <U+");
    }

    #[test]
    fn revealing_twice_changes_nothing() {
        let once = reveal("a\u{202E}b\u{200B}\u{200D}c\u{FE0F}\u{FE0F}");
        assert!(is_plain(&once), "{once}");
        assert!(is_plain(&reveal_html("x\u{2066}y")));
    }
}

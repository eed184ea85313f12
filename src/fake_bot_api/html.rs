//! Telegram's HTML parse mode as the fake enforces it: the markup is validated and
//! turned into the plain text and entities Telegram would store.
//!
//! The fake is deliberately strict where Telegram's leniency is undocumented (a
//! bare `&` that starts no known entity is rejected): the relay must escape its
//! text anyway, and a strict fake surfaces escaping bugs that real Telegram might
//! let through on one message and reject on the next.

use serde_json::{Value, json};

/// The text and entities that remain once the markup has been parsed.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Parsed {
    pub text: String,
    pub entities: Vec<Value>,
}

/// Why Telegram would answer `can't parse entities`; the message follows
/// Telegram's wording where it is known.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(super) struct MarkupError(String);

struct OpenTag {
    name: String,
    /// Entity produced on close; `None` for tags that only carry attributes
    /// (an `<a>` without `href`, a `<code>` merged into its `<pre>`).
    kind: Option<&'static str>,
    start_utf16: usize,
    url: Option<String>,
    language: Option<String>,
    custom_emoji_id: Option<String>,
}

/// Length of `text` as Telegram counts it: in UTF-16 code units.
pub(super) fn utf16_len(text: &str) -> usize {
    text.chars().map(char::len_utf16).sum()
}

pub(super) fn parse_html(src: &str) -> Result<Parsed, MarkupError> {
    let mut text = String::with_capacity(src.len());
    let mut utf16 = 0usize;
    let mut stack: Vec<OpenTag> = Vec::new();
    let mut entities = Vec::new();
    let mut i = 0usize;
    while i < src.len() {
        let rest = &src[i..];
        if rest.starts_with('<') {
            let Some(close) = rest.find('>') else {
                return Err(MarkupError(format!(
                    "Can't find end of the tag starting at byte offset {i}"
                )));
            };
            let inner = &rest[1..close];
            if let Some(end_name) = inner.strip_prefix('/') {
                let name = end_name.trim().to_ascii_lowercase();
                let Some(open) = stack.pop() else {
                    return Err(MarkupError(format!(
                        "Unexpected end tag at byte offset {i}"
                    )));
                };
                if open.name != name {
                    return Err(MarkupError(format!(
                        "Can't find end tag corresponding to start tag \"{}\"",
                        open.name
                    )));
                }
                close_tag(open, utf16, &mut stack, &mut entities);
            } else {
                stack.push(open_tag(inner, i, utf16)?);
            }
            i += close + 1;
        } else if rest.starts_with('&') {
            let (c, used) = decode_entity(rest, i)?;
            text.push(c);
            utf16 += c.len_utf16();
            i += used;
        } else {
            let Some(c) = rest.chars().next() else { break };
            text.push(c);
            utf16 += c.len_utf16();
            i += c.len_utf8();
        }
    }
    if let Some(open) = stack.pop() {
        return Err(MarkupError(format!(
            "Can't find end tag corresponding to start tag \"{}\"",
            open.name
        )));
    }
    // Entities are listed by start offset, outer before inner, as Telegram does.
    entities.sort_by_key(|e| {
        (
            e["offset"].as_u64().unwrap_or(0),
            std::cmp::Reverse(e["length"].as_u64().unwrap_or(0)),
        )
    });
    Ok(Parsed { text, entities })
}

fn open_tag(inner: &str, at: usize, utf16: usize) -> Result<OpenTag, MarkupError> {
    let inner = inner.trim_end();
    let name_end = inner
        .find(|c: char| c.is_whitespace() || c == '/')
        .unwrap_or(inner.len());
    let name = inner[..name_end].to_ascii_lowercase();
    let attrs = parse_attributes(&inner[name_end..], at)?;
    let attr = |key: &str| attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    let unsupported = || {
        MarkupError(format!(
            "Unsupported start tag \"{name}\" at byte offset {at}"
        ))
    };
    let mut tag = OpenTag {
        name: name.clone(),
        kind: None,
        start_utf16: utf16,
        url: None,
        language: None,
        custom_emoji_id: None,
    };
    tag.kind = match name.as_str() {
        "b" | "strong" => Some("bold"),
        "i" | "em" => Some("italic"),
        "u" | "ins" => Some("underline"),
        "s" | "strike" | "del" => Some("strikethrough"),
        "tg-spoiler" => Some("spoiler"),
        "span" if attr("class").as_deref() == Some("tg-spoiler") => Some("spoiler"),
        "span" => return Err(unsupported()),
        "code" => {
            tag.language =
                attr("class").and_then(|c| c.strip_prefix("language-").map(str::to_owned));
            Some("code")
        }
        "pre" => Some("pre"),
        "a" => {
            tag.url = attr("href");
            tag.url.as_ref().map(|_| "text_link")
        }
        "blockquote" if attrs.iter().any(|(k, _)| k == "expandable") => {
            Some("expandable_blockquote")
        }
        "blockquote" => Some("blockquote"),
        "tg-emoji" => {
            tag.custom_emoji_id = attr("emoji-id");
            if tag.custom_emoji_id.is_none() {
                return Err(MarkupError(format!(
                    "Custom emoji identifier expected at byte offset {at}"
                )));
            }
            Some("custom_emoji")
        }
        _ => return Err(unsupported()),
    };
    Ok(tag)
}

fn close_tag(open: OpenTag, utf16: usize, stack: &mut [OpenTag], entities: &mut Vec<Value>) {
    // `<pre><code class="language-x">` is one pre entity with a language.
    if open.name == "code"
        && let Some(parent) = stack.last_mut()
        && parent.name == "pre"
        && parent.start_utf16 == open.start_utf16
    {
        if open.language.is_some() {
            parent.language = open.language;
        }
        return;
    }
    let Some(kind) = open.kind else { return };
    let length = utf16 - open.start_utf16;
    if length == 0 {
        return;
    }
    let mut entity = json!({"type": kind, "offset": open.start_utf16, "length": length});
    if let Some(url) = open.url {
        entity["url"] = json!(url);
    }
    if kind == "pre"
        && let Some(language) = open.language
    {
        entity["language"] = json!(language);
    }
    if let Some(id) = open.custom_emoji_id {
        entity["custom_emoji_id"] = json!(id);
    }
    entities.push(entity);
}

fn parse_attributes(mut s: &str, at: usize) -> Result<Vec<(String, String)>, MarkupError> {
    let mut attrs = Vec::new();
    loop {
        s = s.trim_start();
        if s.is_empty() || s == "/" {
            return Ok(attrs);
        }
        let name_end = s
            .find(|c: char| c.is_whitespace() || c == '=')
            .unwrap_or(s.len());
        let name = s[..name_end].to_ascii_lowercase();
        s = s[name_end..].trim_start();
        let Some(after_eq) = s.strip_prefix('=') else {
            attrs.push((name, String::new()));
            continue;
        };
        let after_eq = after_eq.trim_start();
        let (raw, rest) = match after_eq.chars().next() {
            Some(q @ ('"' | '\'')) => {
                let body = &after_eq[1..];
                let Some(end) = body.find(q) else {
                    return Err(MarkupError(format!(
                        "Unclosed attribute value at byte offset {at}"
                    )));
                };
                (&body[..end], &body[end + 1..])
            }
            _ => {
                let end = after_eq.find(char::is_whitespace).unwrap_or(after_eq.len());
                (&after_eq[..end], &after_eq[end..])
            }
        };
        attrs.push((name, decode_text(raw, at)?));
        s = rest;
    }
}

fn decode_text(raw: &str, at: usize) -> Result<String, MarkupError> {
    let mut out = String::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        let rest = &raw[i..];
        if rest.starts_with('&') {
            let (c, used) = decode_entity(rest, at + i)?;
            out.push(c);
            i += used;
        } else if let Some(c) = rest.chars().next() {
            out.push(c);
            i += c.len_utf8();
        } else {
            break;
        }
    }
    Ok(out)
}

/// Decodes the character entity at the start of `rest` (which starts with `&`);
/// returns the character and the bytes consumed.
fn decode_entity(rest: &str, at: usize) -> Result<(char, usize), MarkupError> {
    let bad = || MarkupError(format!("Unsupported HTML entity at byte offset {at}"));
    // No entity Telegram accepts is longer than `&#x10FFFF;`.
    let semi = rest
        .char_indices()
        .take(12)
        .find(|&(_, c)| c == ';')
        .map(|(i, _)| i)
        .ok_or_else(bad)?;
    let body = &rest[1..semi];
    let c = match body {
        "lt" => '<',
        "gt" => '>',
        "amp" => '&',
        "quot" => '"',
        _ => {
            let code =
                if let Some(hex) = body.strip_prefix("#x").or_else(|| body.strip_prefix("#X")) {
                    u32::from_str_radix(hex, 16).ok()
                } else if let Some(dec) = body.strip_prefix('#') {
                    dec.parse().ok()
                } else {
                    None
                };
            code.and_then(char::from_u32).ok_or_else(bad)?
        }
    };
    Ok((c, semi + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_text_and_entities_come_out_of_good_markup() {
        let parsed =
            parse_html("<b>bold</b> &lt;x&gt; <a href=\"https://e.x/?a=1&amp;b=2\">link</a>")
                .expect("valid markup");
        assert_eq!(parsed.text, "bold <x> link");
        assert_eq!(
            parsed.entities[0],
            json!({"type":"bold","offset":0,"length":4})
        );
        assert_eq!(
            parsed.entities[1],
            json!({"type":"text_link","offset":9,"length":4,"url":"https://e.x/?a=1&b=2"})
        );
    }

    #[test]
    fn pre_with_code_language_is_one_entity() {
        let parsed = parse_html("<pre><code class=\"language-rust\">fn x() {}</code></pre>")
            .expect("valid markup");
        assert_eq!(
            parsed.entities,
            vec![json!({"type":"pre","offset":0,"length":9,"language":"rust"})]
        );
    }

    #[test]
    fn offsets_count_utf16_units() {
        let parsed = parse_html("😀<i>é</i>").expect("valid markup");
        assert_eq!(
            parsed.entities,
            vec![json!({"type":"italic","offset":2,"length":1})]
        );
        assert_eq!(utf16_len(&parsed.text), 3);
    }

    #[test]
    fn malformed_markup_is_rejected() {
        for bad in [
            "<b>open",
            "<b><i>x</b></i>",
            "x</b>",
            "<div>x</div>",
            "a & b",
            "&nbsp;",
            "<b",
            "&#xZZ;",
        ] {
            assert!(parse_html(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn numeric_entities_decode() {
        let parsed = parse_html("&#65;&#x42;&quot;").expect("valid markup");
        assert_eq!(parsed.text, "AB\"");
    }
}

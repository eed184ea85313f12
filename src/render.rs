//! An agent's Markdown as Telegram messages: [`render`] turns it into
//! Telegram's HTML subset, [`split`] cuts that into chunks that each fit one
//! message and parse on their own, [`to_plain`] is the fallback for a chunk
//! Telegram still refuses ("can't parse entities"). [`long_block`] finds an
//! answer that reads better as a file (see *Long answers as files*).
//!
//! # Long answers as files
//!
//! An answer that would take more than [`ATTACH_AFTER_MESSAGES`] messages
//! and is mostly one code block (the block holds at least
//! [`ATTACH_SHARE_PERCENT`] % of its characters), or is a bare diff, goes
//! as the prose around the block plus the block as a file (`answer.rs`,
//! `answer.diff`, …): one message and one download on the phone instead of
//! a scroll through ten half-blocks, and the file can be opened, saved or
//! applied as it is.
//!
//! Telegram's HTML knows only a few inline tags and no block structure, so
//! blocks become text: headings bold lines, list items bullets or numbers,
//! tables aligned text in `<pre>`. HTML in the input is shown as text, never
//! passed through: an agent quoting `<div>` must not break the message.
//!
//! # Links
//!
//! An agent's answer can carry text a stranger wrote (a web page, an issue),
//! so a link must not show one thing and open another:
//!
//! * Only `http`, `https` and `mailto` targets become links. Any other
//!   (`tg://login?token=…`, `javascript:`, a relative path) is shown as text
//!   with its target: `text (target)`. So is an `http(s)` target with user
//!   info (`https://bank.com@evil.example`), whose start reads as a host.
//! * A link whose text looks like a URL, an address or a domain
//!   (`https://a.b/x`, `x@a.b`, `a.b`) becomes a link only if that host is
//!   the target's (case and a leading `www.` aside); otherwise the text is
//!   shown plain, followed by the target as a link of its own:
//!   `paypal.com (<a href="https://evil.example">https://evil.example</a>)`.
//!   File names look like domains (`main.rs`), so they get the same
//!   treatment: more to read, never a wrong impression.
//! * Every character that reorders text or shows nothing (bidi controls and
//!   marks, zero-width spaces, tags: see `visible`) is shown as its code
//!   point, `<U+202E>`, in text, code and tables alike, as in approvals and
//!   questions: code or a command that reads differently from what it is
//!   ("Trojan Source") is seen to be odd instead of deceiving. Link text is
//!   judged as it then reads (`paypal<U+200B>.com` names no host), and a
//!   target holding such a character is no link, only shown.

use pulldown_cmark::{CodeBlockKind, Event, LinkType, Options, Parser, Tag, TagEnd};

/// Telegram's message size limit, in UTF-16 code units.
pub const MESSAGE_LIMIT: usize = 4096;

/// [`split`] never cuts finer than this: a chunk must hold the tags it
/// reopens plus some text.
pub const MIN_LIMIT: usize = 64;

/// Link targets that become links (see the module doc). Telegram would
/// refuse the whole message for some others (relative paths), and `tg://`
/// ones act inside the app (`tg://login?token=`).
const LINK_SCHEMES: [&str; 3] = ["http://", "https://", "mailto:"];

/// Longer targets are shown as text: a huge `href` cannot be reopened in
/// every chunk of a split.
const MAX_HREF_BYTES: usize = 512;

/// Longer code-block languages are dropped, for the same reason.
const MAX_LANGUAGE_BYTES: usize = 32;

/// Renders Markdown as Telegram HTML (`parse_mode: "HTML"`).
pub fn render(markdown: &str) -> String {
    let options =
        Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TABLES | Options::ENABLE_TASKLISTS;
    let mut renderer = Renderer::default();
    for event in Parser::new_ext(markdown, options) {
        renderer.event(event);
    }
    let end = renderer.out.trim_end().len();
    renderer.out.truncate(end);
    renderer.out
}

#[derive(Default)]
struct Renderer {
    out: String,
    /// Nothing was written since the last block opened (or ever): the next
    /// block needs no separating newlines.
    fresh: bool,
    /// One entry per open list: the next number of an ordered list.
    lists: Vec<Option<u64>>,
    quote_depth: usize,
    code: Option<CodeBlock>,
    table: Option<Table>,
    /// One entry per open link or image.
    links: Vec<Anchor>,
}

struct CodeBlock {
    language: Option<String>,
    text: String,
}

#[derive(Default)]
struct Table {
    rows: Vec<Vec<String>>,
    row: Vec<String>,
    cell: String,
}

struct Anchor {
    /// The target, hidden characters revealed.
    target: String,
    /// The target may be an `<a href>`: see [`linkable`]; a target with a
    /// hidden character never is.
    linkable: bool,
    /// An image: its target is shown when there is no alt text.
    image: bool,
    /// Inside another link or image: Telegram cannot nest links, so only its
    /// text is shown, judged with the outer one's.
    nested: bool,
    /// `out.len()` when the anchor opened: its text starts there, and so
    /// will its `<a>` once the text has been judged.
    start: usize,
}

impl Renderer {
    fn event(&mut self, event: Event<'_>) {
        if let Some(code) = &mut self.code {
            match event {
                Event::Text(text) => code.text.push_str(&text),
                Event::End(TagEnd::CodeBlock) => self.close_code_block(),
                _ => {}
            }
            return;
        }
        if self.table.is_some() {
            self.table_event(event);
            return;
        }
        match event {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(text) | Event::Html(text) | Event::InlineHtml(text) => self.text(&text),
            Event::Code(code) => {
                self.markup("<code>");
                self.text(&code);
                self.markup("</code>");
            }
            Event::InlineMath(math) | Event::DisplayMath(math) => self.text(&math),
            Event::FootnoteReference(label) => self.text(&format!("[{label}]")),
            Event::SoftBreak | Event::HardBreak => self.text("\n"),
            Event::Rule => {
                self.block();
                self.text("──────────");
            }
            Event::TaskListMarker(done) => self.text(if done { "☑ " } else { "☐ " }),
        }
    }

    fn start(&mut self, tag: Tag<'_>) {
        match tag {
            Tag::Paragraph | Tag::HtmlBlock => self.block(),
            Tag::Heading { .. } => {
                self.block();
                self.markup("<b>");
            }
            Tag::BlockQuote(_) => {
                self.block();
                // Telegram refuses nested blockquotes; inner ones become
                // part of the outer one.
                if self.quote_depth == 0 {
                    self.markup("<blockquote>");
                    self.fresh = true;
                }
                self.quote_depth += 1;
            }
            Tag::CodeBlock(kind) => {
                self.block();
                let language = match kind {
                    CodeBlockKind::Fenced(info) => language(&info),
                    CodeBlockKind::Indented => None,
                };
                self.code = Some(CodeBlock {
                    language,
                    text: String::new(),
                });
            }
            Tag::List(first) => {
                self.block();
                self.lists.push(first);
            }
            Tag::Item => {
                if !self.fresh {
                    self.newlines(1);
                }
                let depth = self.lists.len().saturating_sub(1);
                let marker = match self.lists.last_mut() {
                    Some(Some(number)) => {
                        let marker = format!("{number}. ");
                        *number += 1;
                        marker
                    }
                    _ if depth == 0 => "• ".to_string(),
                    _ => "◦ ".to_string(),
                };
                self.text(&format!("{}{marker}", "  ".repeat(depth)));
                self.fresh = true;
            }
            Tag::Table(_) => {
                self.block();
                self.table = Some(Table::default());
            }
            Tag::Emphasis => self.markup("<i>"),
            Tag::Strong => self.markup("<b>"),
            Tag::Strikethrough => self.markup("<s>"),
            Tag::Link {
                link_type: LinkType::Email,
                dest_url,
                ..
            } => self.open_anchor(&format!("mailto:{dest_url}"), false),
            Tag::Link { dest_url, .. } => self.open_anchor(&dest_url, false),
            Tag::Image { dest_url, .. } => self.open_anchor(&dest_url, true),
            Tag::FootnoteDefinition(_)
            | Tag::DefinitionList
            | Tag::DefinitionListTitle
            | Tag::DefinitionListDefinition
            | Tag::TableHead
            | Tag::TableRow
            | Tag::TableCell
            | Tag::Superscript
            | Tag::Subscript
            | Tag::MetadataBlock(_) => {}
        }
    }

    fn end(&mut self, tag: TagEnd) {
        match tag {
            TagEnd::Heading(_) => self.markup("</b>"),
            TagEnd::BlockQuote(_) => {
                self.quote_depth = self.quote_depth.saturating_sub(1);
                if self.quote_depth == 0 {
                    self.markup("</blockquote>");
                }
            }
            TagEnd::List(_) => {
                self.lists.pop();
            }
            TagEnd::Emphasis => self.markup("</i>"),
            TagEnd::Strong => self.markup("</b>"),
            TagEnd::Strikethrough => self.markup("</s>"),
            TagEnd::Link | TagEnd::Image => self.close_anchor(),
            _ => {}
        }
    }

    /// Telegram cannot nest links, so an image inside a link (a badge)
    /// shows its alt text inside the outer link.
    fn open_anchor(&mut self, target: &str, image: bool) {
        let revealed = crate::visible::reveal(target);
        let linkable = matches!(revealed, std::borrow::Cow::Borrowed(_))
            && !target.chars().any(char::is_control)
            && linkable(target);
        self.links.push(Anchor {
            target: revealed.into_owned(),
            linkable,
            image,
            nested: !self.links.is_empty(),
            start: self.out.len(),
        });
    }

    /// Judges the anchor's text against its target (see the module doc) and
    /// makes it a link, a link with the target shown, or text.
    fn close_anchor(&mut self) {
        let Some(anchor) = self.links.pop() else {
            return;
        };
        let shown = to_plain(&self.out[anchor.start..]);
        if shown.trim().is_empty() && (anchor.image || anchor.linkable) {
            self.text(&anchor.target);
        }
        if anchor.nested {
            return;
        }
        let shown = to_plain(&self.out[anchor.start..]);
        let shown = shown.trim();
        // Judged as shown and as it reads past the marks: both
        // `paypal<U+200B>.com` and `a.b..<U+202E>paypal.com` claim to be
        // paypal.com.
        let read = crate::visible::as_read(shown);
        if !anchor.linkable {
            if shown.is_empty() {
                self.text(&anchor.target);
            } else if shown != anchor.target && !anchor.target.is_empty() {
                self.text(&format!(" ({})", anchor.target));
            }
            return;
        }
        let href = format!("<a href=\"{}\">", escape_attribute(&anchor.target));
        if shows_the_target(shown, &anchor.target) && shows_the_target(&read, &anchor.target) {
            self.out.insert_str(anchor.start, &href);
            self.markup("</a>");
        } else {
            self.text(" (");
            self.markup(&href);
            self.text(&anchor.target);
            self.markup("</a>");
            self.text(")");
        }
    }

    fn close_code_block(&mut self) {
        let Some(code) = self.code.take() else {
            return;
        };
        let text = code.text.trim_end_matches('\n');
        if text.is_empty() {
            return;
        }
        match code.language {
            Some(language) => {
                self.markup(&format!("<pre><code class=\"language-{language}\">"));
                self.text(text);
                self.markup("</code></pre>");
            }
            None => {
                self.markup("<pre>");
                self.text(text);
                self.markup("</pre>");
            }
        }
    }

    /// Inside a table only text counts: Telegram allows no formatting in
    /// `<pre>`, so cells are collected raw and laid out at the end.
    fn table_event(&mut self, event: Event<'_>) {
        let Some(table) = &mut self.table else {
            return;
        };
        match event {
            Event::Text(text)
            | Event::Code(text)
            | Event::Html(text)
            | Event::InlineHtml(text)
            | Event::InlineMath(text)
            | Event::DisplayMath(text) => table.cell.push_str(&crate::visible::reveal(&text)),
            Event::SoftBreak | Event::HardBreak => table.cell.push(' '),
            Event::End(TagEnd::TableCell) => {
                let cell = std::mem::take(&mut table.cell);
                table.row.push(cell.trim().to_string());
            }
            Event::End(TagEnd::TableHead | TagEnd::TableRow) => {
                let row = std::mem::take(&mut table.row);
                table.rows.push(row);
            }
            Event::End(TagEnd::Table) => {
                if let Some(table) = self.table.take() {
                    let text = table.layout();
                    if !text.is_empty() {
                        self.markup("<pre>");
                        self.text(&text);
                        self.markup("</pre>");
                    }
                }
            }
            _ => {}
        }
    }

    /// Separates a block from what came before: a blank line, or a line
    /// break inside lists.
    fn block(&mut self) {
        if !self.fresh {
            self.newlines(if self.lists.is_empty() { 2 } else { 1 });
        }
    }

    fn newlines(&mut self, wanted: usize) {
        if self.out.is_empty() {
            return;
        }
        let present = self.out.len() - self.out.trim_end_matches('\n').len();
        for _ in present..wanted {
            self.out.push('\n');
        }
    }

    fn markup(&mut self, tag: &str) {
        self.out.push_str(tag);
        self.fresh = false;
    }

    /// Writes visible text: escaped, with the characters that could make it
    /// read as something else revealed (see the module doc).
    fn text(&mut self, text: &str) {
        for c in crate::visible::reveal(text).chars() {
            escape_char(&mut self.out, c, false);
        }
        self.fresh = false;
    }
}

/// Whether `target` may be an `<a href>`: an allowed scheme, short enough to
/// be reopened in every chunk, and no user info posing as the host.
fn linkable(target: &str) -> bool {
    let Some(scheme) = LINK_SCHEMES.iter().find(|scheme| {
        target
            .get(..scheme.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
    }) else {
        return false;
    };
    target.len() <= MAX_HREF_BYTES
        && (*scheme == "mailto:" || !authority(&target[scheme.len()..]).contains('@'))
        && host_of(target).is_some()
}

/// The authority of `rest`, what follows `scheme://`.
fn authority(rest: &str) -> &str {
    rest.split(['/', '?', '#']).next().unwrap_or_default()
}

/// The host a URL or an e-mail address names, as compared: lowercase,
/// without a trailing dot, a leading `www.`, user info or port.
fn host_of(target: &str) -> Option<String> {
    let host = if let Some((_, rest)) = target
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("mailto:"))
        .map(|_| target.split_at(7))
    {
        rest.split('?').next()?.rsplit_once('@')?.1
    } else if let Some((_, rest)) = target.split_once("://") {
        let authority = authority(rest);
        let host = authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host);
        match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next()?,
            None => host.split(':').next()?,
        }
    } else if let Some((_, domain)) = target.rsplit_once('@') {
        domain
    } else {
        target.split(['/', '?', '#', ':']).next()?
    };
    let host = normalize_host(host);
    (!host.is_empty()).then_some(host)
}

/// A host as compared: lowercase, without a trailing dot or a leading `www.`.
fn normalize_host(host: &str) -> String {
    let host = host.trim_end_matches('.').to_lowercase();
    host.strip_prefix("www.").unwrap_or(&host).to_string()
}

/// Whether `word` reads as a domain or an IP address: `a.b`, `x.co.uk`,
/// `10.0.0.1`, with a top level of two letters or more.
fn looks_like_host(word: &str) -> bool {
    let labels: Vec<&str> = word.trim_end_matches('.').split('.').collect();
    let Some(top) = labels.last() else {
        return false;
    };
    labels.len() >= 2
        && labels.iter().all(|l| {
            !l.is_empty()
                && l.chars()
                    .all(|c| c.is_alphanumeric() || c == '-' || c == '_')
        })
        && ((top.chars().count() >= 2 && top.chars().all(char::is_alphabetic))
            || (labels.len() == 4 && labels.iter().all(|l| l.parse::<u8>().is_ok())))
}

/// Whether a link's visible text may stand for `target`: every host that a
/// word of it names — `a.b`, `https://a.b/x`, `x@a.b`, and both sides of
/// `a.b@c.d` — is the target's host.
fn shows_the_target(shown: &str, target: &str) -> bool {
    let target_host = host_of(target);
    // Words are runs of what a URL or an address can hold, so that no
    // punctuation glued to a domain (`a.b**c.d`, `(a.b)`) hides it.
    let in_word = |c: char| c.is_alphanumeric() || "._-@:/?#%=&+~".contains(c);
    shown.split(|c: char| !in_word(c)).all(|word| {
        let word = word.trim_matches(|c: char| ".,:;?!".contains(c));
        let (had_scheme, rest) = match word.split_once("://") {
            Some((_, rest)) => (true, rest),
            None => match word.get(..7) {
                Some(s) if s.eq_ignore_ascii_case("mailto:") => (true, &word[7..]),
                _ => (false, word),
            },
        };
        let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
        let pieces: Vec<&str> = authority.split('@').collect();
        pieces.iter().enumerate().all(|(index, piece)| {
            let candidate = piece.split(':').next().unwrap_or_default();
            let is_host = had_scheme && index + 1 == pieces.len();
            if !is_host && !looks_like_host(candidate) {
                return true;
            }
            target_host.as_deref() == Some(normalize_host(candidate).as_str())
        })
    })
}

impl Table {
    /// Columns padded to their widest cell, the header underlined.
    fn layout(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0; columns];
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(cell.chars().count());
            }
        }
        let mut lines = Vec::with_capacity(self.rows.len() + 1);
        for (index, row) in self.rows.iter().enumerate() {
            let cells: Vec<String> = widths
                .iter()
                .enumerate()
                .map(|(column, width)| {
                    let cell = row.get(column).map_or("", String::as_str);
                    format!("{cell:<width$}")
                })
                .collect();
            lines.push(cells.join(" | ").trim_end().to_string());
            if index == 0 {
                let rule: Vec<String> = widths.iter().map(|width| "-".repeat(*width)).collect();
                lines.push(rule.join("-+-"));
            }
        }
        lines.join("\n")
    }
}

/// An answer longer than this many messages may go as a file.
pub const ATTACH_AFTER_MESSAGES: usize = 3;

/// The share of an answer's characters its largest code block must hold.
pub const ATTACH_SHARE_PERCENT: usize = 80;

/// An answer's code block that goes as a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongBlock {
    /// The answer without the block (Markdown), possibly empty.
    pub prose: String,
    /// The block's content, as it is.
    pub code: String,
    /// `answer.<extension>` after the fence's language.
    pub file_name: String,
}

/// The code block `markdown` should send as a file, by the rule in the
/// module doc; `None` when it reads well enough as messages.
pub fn long_block(markdown: &str) -> Option<LongBlock> {
    if split(&render(markdown), MESSAGE_LIMIT).len() <= ATTACH_AFTER_MESSAGES {
        return None;
    }
    let total = markdown.trim().chars().count().max(1);
    let trimmed = markdown.trim_start();
    if trimmed.starts_with("diff --git ")
        || (trimmed.starts_with("--- ") && trimmed.contains("\n+++ "))
    {
        return Some(LongBlock {
            prose: String::new(),
            code: markdown.trim().to_string() + "\n",
            file_name: "answer.diff".into(),
        });
    }
    let mut best: Option<(std::ops::Range<usize>, String, Option<String>)> = None;
    let mut current: Option<(std::ops::Range<usize>, String, Option<String>)> = None;
    for (event, range) in Parser::new(markdown).into_offset_iter() {
        match event {
            Event::Start(Tag::CodeBlock(kind)) => {
                let language = match kind {
                    CodeBlockKind::Fenced(info) => language(&info),
                    CodeBlockKind::Indented => None,
                };
                current = Some((range, String::new(), language));
            }
            Event::Text(text) => {
                if let Some((_, code, _)) = current.as_mut() {
                    code.push_str(&text);
                }
            }
            Event::End(TagEnd::CodeBlock) => {
                if let Some(block) = current.take() {
                    let longer = best
                        .as_ref()
                        .is_none_or(|(_, code, _)| block.1.chars().count() > code.chars().count());
                    if longer {
                        best = Some(block);
                    }
                }
            }
            _ => {}
        }
    }
    let (range, code, language) = best?;
    if code.chars().count() * 100 < total * ATTACH_SHARE_PERCENT {
        return None;
    }
    let prose = format!(
        "{}\n\n{}",
        markdown[..range.start].trim_end(),
        markdown[range.end..].trim_start()
    );
    let extension = language
        .as_deref()
        .map(str::to_ascii_lowercase)
        .map_or("txt", |l| extension_for(&l));
    Some(LongBlock {
        prose: prose.trim().to_string(),
        code,
        file_name: format!("answer.{extension}"),
    })
}

/// A file extension for a fence's language.
fn extension_for(language: &str) -> &'static str {
    match language {
        "diff" | "patch" => "diff",
        "rust" | "rs" => "rs",
        "python" | "py" => "py",
        "javascript" | "js" => "js",
        "typescript" | "ts" => "ts",
        "tsx" => "tsx",
        "json" => "json",
        "toml" => "toml",
        "yaml" | "yml" => "yaml",
        "sh" | "bash" | "shell" | "zsh" | "console" => "sh",
        "go" => "go",
        "c" => "c",
        "cpp" | "c++" | "cc" => "cpp",
        "java" => "java",
        "kotlin" | "kt" => "kt",
        "swift" => "swift",
        "ruby" | "rb" => "rb",
        "html" => "html",
        "css" => "css",
        "sql" => "sql",
        "markdown" | "md" => "md",
        "xml" => "xml",
        _ => "txt",
    }
}

/// The first word of a fence's info string, if it looks like a language.
fn language(info: &str) -> Option<String> {
    let word = info.split([' ', '\t', ',', '{']).next()?;
    let valid = !word.is_empty()
        && word.len() <= MAX_LANGUAGE_BYTES
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '+' | '#' | '.' | '-'));
    valid.then(|| word.to_string())
}

fn escape_char(out: &mut String, c: char, attribute: bool) {
    match c {
        '&' => out.push_str("&amp;"),
        '<' => out.push_str("&lt;"),
        '>' => out.push_str("&gt;"),
        '"' if attribute => out.push_str("&quot;"),
        c => out.push(c),
    }
}

/// `text` as Telegram HTML text content: `&`, `<` and `>` escaped.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        escape_char(&mut out, c, false);
    }
    out
}

fn escape_attribute(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        escape_char(&mut out, c, true);
    }
    out
}

/// One unit of Telegram HTML as [`split`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Piece<'a> {
    Open {
        name: &'a str,
        raw: &'a str,
    },
    Close {
        name: &'a str,
    },
    /// A self-closing tag: atomic and invisible.
    Void {
        raw: &'a str,
    },
    /// One character or one entity: the finest a split may cut.
    Text {
        raw: &'a str,
    },
}

impl Piece<'_> {
    fn units(&self) -> usize {
        match self {
            Piece::Open { raw, .. } | Piece::Void { raw } | Piece::Text { raw } => utf16_len(raw),
            Piece::Close { name } => closing_units(name),
        }
    }

    fn write(&self, out: &mut String) {
        match self {
            Piece::Open { raw, .. } | Piece::Void { raw } | Piece::Text { raw } => {
                out.push_str(raw)
            }
            Piece::Close { name } => {
                out.push_str("</");
                out.push_str(name);
                out.push('>');
            }
        }
    }
}

fn utf16_len(text: &str) -> usize {
    text.chars().map(char::len_utf16).sum()
}

fn closing_units(name: &str) -> usize {
    utf16_len(name) + 3
}

fn tokenize(html: &str) -> Vec<Piece<'_>> {
    let mut pieces = Vec::with_capacity(html.len());
    let mut rest = html;
    while let Some(c) = rest.chars().next() {
        let special = match c {
            '<' => rest
                .find('>')
                .and_then(|end| tag(&rest[..=end]).map(|piece| (piece, end + 1))),
            '&' => entity_len(rest).map(|length| {
                (
                    Piece::Text {
                        raw: &rest[..length],
                    },
                    length,
                )
            }),
            _ => None,
        };
        let (piece, length) = special.unwrap_or_else(|| {
            let length = c.len_utf8();
            (
                Piece::Text {
                    raw: &rest[..length],
                },
                length,
            )
        });
        pieces.push(piece);
        rest = &rest[length..];
    }
    pieces
}

/// Reads `<name …>`, `</name>` or `<name …/>`; `None` when `raw` is not a tag.
fn tag(raw: &str) -> Option<Piece<'_>> {
    let inner = raw.strip_prefix('<')?.strip_suffix('>')?;
    let (closing, inner) = match inner.strip_prefix('/') {
        Some(inner) => (true, inner),
        None => (false, inner),
    };
    let name_end = inner
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .unwrap_or(inner.len());
    let name = &inner[..name_end];
    if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return None;
    }
    Some(if closing {
        Piece::Close { name }
    } else if inner.ends_with('/') {
        Piece::Void { raw }
    } else {
        Piece::Open { name, raw }
    })
}

/// The length of `&name;`, `&#digits;` or `&#xhex;` at the start of `text`.
fn entity_len(text: &str) -> Option<usize> {
    let end = text.bytes().take(12).position(|b| b == b';')?;
    let body = text.get(1..end)?;
    let valid = match body.strip_prefix('#') {
        Some(code) => match code.strip_prefix(['x', 'X']) {
            Some(hex) => !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()),
            None => !code.is_empty() && code.chars().all(|c| c.is_ascii_digit()),
        },
        None => !body.is_empty() && body.chars().all(|c| c.is_ascii_alphanumeric()),
    };
    valid.then_some(end + 1)
}

/// Makes every tag close in order, so chunks can track what is open.
/// Stray closing tags are dropped, unclosed ones closed at the end, and an
/// opening tag too large to be repeated at the start of chunks (a huge
/// `href`) is dropped with its closing tag.
fn balance<'a>(pieces: Vec<Piece<'a>>, limit: usize) -> Vec<Piece<'a>> {
    let mut out = Vec::with_capacity(pieces.len());
    let mut open: Vec<(&str, bool)> = Vec::new();
    for piece in pieces {
        match piece {
            Piece::Open { name, raw } => {
                let kept = utf16_len(raw) + closing_units(name) <= limit / 2;
                open.push((name, kept));
                if kept {
                    out.push(piece);
                }
            }
            Piece::Close { name } => match open.last() {
                Some(&(top, kept)) if top.eq_ignore_ascii_case(name) => {
                    open.pop();
                    if kept {
                        out.push(Piece::Close { name: top });
                    }
                }
                // Stray: closes nothing that is open here.
                _ => {}
            },
            Piece::Void { .. } | Piece::Text { .. } => out.push(piece),
        }
    }
    while let Some((name, kept)) = open.pop() {
        if kept {
            out.push(Piece::Close { name });
        }
    }
    out
}

/// Where a chunk may end, and what is still open there.
#[derive(Clone)]
struct Cut {
    /// Index of the first piece of the next chunk.
    end: usize,
    /// Indices of the opening tags still open at `end`.
    open: Vec<usize>,
    /// Units used up to `end`, without the closing tags.
    used: usize,
}

/// Splits Telegram HTML into chunks of at most `limit` UTF-16 units each
/// (tags included, so the visible text is shorter still), cutting at a
/// blank line if one is in the second half of the chunk, else at a line
/// break there, else at the last space, else anywhere between characters.
/// Tags open at a cut are closed at the end of the chunk and reopened at
/// the start of the next, so each chunk parses on its own. Chunks with no
/// visible text are left out. `limit` below [`MIN_LIMIT`] counts as
/// [`MIN_LIMIT`].
pub fn split(html: &str, limit: usize) -> Vec<String> {
    let limit = limit.max(MIN_LIMIT);
    let pieces = balance(tokenize(html), limit);
    let mut chunks = Vec::new();
    let mut open: Vec<usize> = Vec::new();
    let mut start = 0;
    while start < pieces.len() {
        let (chunk, cut) = match best_cut(&pieces, start, &open, limit) {
            Some(cut) => (Some(assemble(&pieces, &open, start, &cut)), cut),
            None => plain_step(&pieces, start, &open, limit),
        };
        if chunk.as_deref().is_some_and(has_visible_text) {
            chunks.extend(chunk);
        }
        start = cut.end;
        open = cut.open;
    }
    chunks
}

fn best_cut(pieces: &[Piece<'_>], start: usize, open: &[usize], limit: usize) -> Option<Cut> {
    let prefix: usize = open.iter().map(|&index| pieces[index].units()).sum();
    let mut stack = open.to_vec();
    let mut closing: usize = stack.iter().map(|&index| closes(pieces, index)).sum();
    let mut used = prefix;
    let (mut paragraph, mut line, mut word, mut any) = (None, None, None, None);
    let mut after_newline = false;
    for (index, piece) in pieces.iter().enumerate().skip(start) {
        used += piece.units();
        match piece {
            Piece::Open { .. } => {
                stack.push(index);
                closing += closes(pieces, index);
            }
            Piece::Close { .. } => {
                if let Some(top) = stack.pop() {
                    closing -= closes(pieces, top);
                }
            }
            Piece::Void { .. } | Piece::Text { .. } => {}
        }
        if used + closing > limit {
            break;
        }
        let cut = || Cut {
            end: index + 1,
            open: stack.clone(),
            used,
        };
        if index + 1 == pieces.len() {
            return Some(cut());
        }
        match piece {
            // Never end a chunk right after an opening tag: it would close
            // an empty element.
            Piece::Open { .. } => {}
            Piece::Close { .. } | Piece::Void { .. } => any = Some(cut()),
            Piece::Text { raw } => {
                match *raw {
                    "\n" if after_newline => paragraph = Some(cut()),
                    "\n" => line = Some(cut()),
                    " " | "\t" => word = Some(cut()),
                    _ => {}
                }
                after_newline = *raw == "\n";
                any = Some(cut());
            }
        }
    }
    let half = prefix + (limit - prefix.min(limit)) / 2;
    let late = |cut: &Option<Cut>| cut.clone().filter(|cut| cut.used >= half);
    let mut cut = late(&paragraph)
        .or_else(|| late(&line))
        .or_else(|| {
            [paragraph, line, word]
                .into_iter()
                .flatten()
                .max_by_key(|cut| cut.end)
        })
        .or(any)?;
    // Closing tags right after the cut cost nothing (they replace the
    // closing tags the chunk needs anyway) and spare the next chunk an
    // empty element.
    while let Some(Piece::Close { .. }) = pieces.get(cut.end) {
        if cut.open.pop().is_none() {
            break;
        }
        cut.end += 1;
    }
    Some(cut)
}

fn closes(pieces: &[Piece<'_>], open: usize) -> usize {
    match pieces[open] {
        Piece::Open { name, .. } => closing_units(name),
        _ => 0,
    }
}

fn assemble(pieces: &[Piece<'_>], open: &[usize], start: usize, cut: &Cut) -> String {
    let mut chunk = String::new();
    for &index in open {
        pieces[index].write(&mut chunk);
    }
    for piece in &pieces[start..cut.end] {
        piece.write(&mut chunk);
    }
    for &index in cut.open.iter().rev() {
        if let Piece::Open { name, .. } = pieces[index] {
            Piece::Close { name }.write(&mut chunk);
        }
    }
    chunk
}

/// The last resort when the tags open here leave no room for text (only
/// reachable with several long tags nested): the text goes out without
/// formatting until the chunk is full.
fn plain_step(
    pieces: &[Piece<'_>],
    start: usize,
    open: &[usize],
    limit: usize,
) -> (Option<String>, Cut) {
    let mut stack = open.to_vec();
    let mut text = String::new();
    let mut used = 0;
    let mut end = start;
    for piece in &pieces[start..] {
        match piece {
            Piece::Open { .. } => stack.push(end),
            Piece::Close { .. } => {
                stack.pop();
            }
            Piece::Void { .. } => {}
            Piece::Text { raw } => {
                let units = utf16_len(raw);
                if used + units > limit {
                    break;
                }
                text.push_str(raw);
                used += units;
            }
        }
        end += 1;
    }
    let cut = Cut {
        end,
        open: stack,
        used,
    };
    (Some(text).filter(|text| !text.is_empty()), cut)
}

fn has_visible_text(chunk: &str) -> bool {
    !to_plain(chunk).trim().is_empty()
}

/// The text of Telegram HTML without its markup, for sending with no
/// `parse_mode`.
pub fn to_plain(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    for piece in tokenize(html) {
        if let Piece::Text { raw } = piece {
            out.push_str(&unescape(raw));
        }
    }
    out
}

fn unescape(raw: &str) -> std::borrow::Cow<'_, str> {
    let Some(body) = raw.strip_prefix('&').and_then(|r| r.strip_suffix(';')) else {
        return raw.into();
    };
    let decoded = match body {
        "lt" => Some('<'),
        "gt" => Some('>'),
        "amp" => Some('&'),
        "quot" => Some('"'),
        "apos" => Some('\''),
        "nbsp" => Some('\u{a0}'),
        _ => body.strip_prefix('#').and_then(|code| {
            match code.strip_prefix(['x', 'X']) {
                Some(hex) => u32::from_str_radix(hex, 16).ok(),
                None => code.parse().ok(),
            }
            .and_then(char::from_u32)
        }),
    };
    decoded.map_or(raw.into(), |c| c.to_string().into())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_long_answer_that_is_mostly_one_code_block_goes_as_a_file() {
        let code: String = (0..600)
            .map(|i| format!("let value_{i} = compute({i}) + other_{i};\n"))
            .collect();
        let answer =
            format!("Here is the new module:\n\n```rust\n{code}```\n\nRun `cargo test` after.");
        let block = long_block(&answer).expect("mostly one block, many messages");
        assert_eq!(block.file_name, "answer.rs");
        assert_eq!(block.code, code);
        assert_eq!(
            block.prose,
            "Here is the new module:\n\nRun `cargo test` after."
        );

        // Short: messages read fine.
        assert_eq!(long_block("```rust\nfn main() {}\n```"), None);
        // Long, but mostly prose: messages.
        let prose = format!("{}\n\n```\nx\n```", "A sentence of prose. ".repeat(1200));
        assert_eq!(long_block(&prose), None);
        // A bare diff.
        let diff = format!(
            "diff --git a/x b/x\n--- a/x\n+++ b/x\n{}",
            "+added line\n".repeat(2000)
        );
        let block = long_block(&diff).unwrap();
        assert_eq!(
            (block.file_name.as_str(), block.prose.as_str()),
            ("answer.diff", "")
        );
        assert!(block.code.starts_with("diff --git"));
        // An unknown language is a text file.
        let odd = format!("```brainfuck\n{}```", "+-<>[].,\n".repeat(3000));
        assert_eq!(long_block(&odd).unwrap().file_name, "answer.txt");
    }

    #[test]
    fn inline_formatting() {
        assert_eq!(
            render("**b** *i* ~~s~~ `x < y` ***both***"),
            "<b>b</b> <i>i</i> <s>s</s> <code>x &lt; y</code> <i><b>both</b></i>"
        );
    }

    #[test]
    fn html_in_the_input_is_shown_not_passed_through() {
        assert_eq!(
            render("a < b & c > d <div>x</div>"),
            "a &lt; b &amp; c &gt; d &lt;div&gt;x&lt;/div&gt;"
        );
        assert_eq!(
            render("<script>\nalert(1)\n</script>"),
            "&lt;script&gt;\nalert(1)\n&lt;/script&gt;"
        );
    }

    #[test]
    fn code_blocks_keep_their_language_when_it_is_safe() {
        assert_eq!(
            render("```rust\nfn main() {}\n```"),
            "<pre><code class=\"language-rust\">fn main() {}</code></pre>"
        );
        assert_eq!(render("```\na <b>\n```"), "<pre>a &lt;b&gt;</pre>");
        assert_eq!(
            render("```\"><i>x\nbody\n```"),
            "<pre>body</pre>",
            "a hostile info string is dropped"
        );
        assert_eq!(render("    indented\n"), "<pre>indented</pre>");
    }

    #[test]
    fn links_and_images() {
        assert_eq!(
            render("[x](https://e.com/a\"b)"),
            "<a href=\"https://e.com/a&quot;b\">x</a>"
        );
        assert_eq!(render("[notes](docs/notes.md)"), "notes (docs/notes.md)");
        assert_eq!(
            render("[x](javascript:alert(1))"),
            "x (javascript:alert(1))"
        );
        assert_eq!(
            render("![a chart](https://e.com/c.png)"),
            "<a href=\"https://e.com/c.png\">a chart</a>"
        );
        assert_eq!(
            render("![](https://e.com/c.png)"),
            "<a href=\"https://e.com/c.png\">https://e.com/c.png</a>"
        );
        assert_eq!(
            render("[![badge](https://e.com/b.svg)](https://e.com)"),
            "<a href=\"https://e.com\">badge</a>",
            "Telegram cannot nest links"
        );
    }

    #[test]
    fn only_http_https_and_mailto_become_links_others_show_their_target() {
        assert_eq!(
            render("[Log in](tg://login?token=abc)"),
            "Log in (tg://login?token=abc)"
        );
        assert_eq!(
            render("<tg://resolve?domain=x>"),
            "tg://resolve?domain=x",
            "an autolink shows its target once"
        );
        assert_eq!(render("[x](data:text/html,hi)"), "x (data:text/html,hi)");
        assert_eq!(render("[](docs/a.md)"), "docs/a.md");
        assert_eq!(
            render("[mail me](mailto:a@b.example)"),
            "<a href=\"mailto:a@b.example\">mail me</a>"
        );
        assert_eq!(
            render("<a@b.example>"),
            "<a href=\"mailto:a@b.example\">a@b.example</a>"
        );
        assert_eq!(
            render("[empty](https://)"),
            "empty (https://)",
            "no host, no link"
        );
        assert_eq!(
            render("[bank](https://bank.example@evil.example/)"),
            "bank (https://bank.example@evil.example/)",
            "user info posing as the host"
        );
        assert_eq!(
            render("[Tg](TG://login?token=x) [h](HTTPS://e.com)"),
            "Tg (TG://login?token=x) <a href=\"HTTPS://e.com\">h</a>"
        );
    }

    #[test]
    fn link_text_that_names_another_host_shows_the_real_target() {
        let shown =
            |text: &str, target: &str| format!("{text} (<a href=\"{target}\">{target}</a>)");
        for (markdown, text, target) in [
            (
                "[https://good.example/login](https://evil.example/login)",
                "https://good.example/login",
                "https://evil.example/login",
            ),
            (
                "[paypal.com](https://evil.example)",
                "paypal.com",
                "https://evil.example",
            ),
            (
                "[Sign in at accounts.google.com now](https://evil.example/x)",
                "Sign in at accounts.google.com now",
                "https://evil.example/x",
            ),
            (
                "[10.0.0.1](http://10.0.0.2/)",
                "10.0.0.1",
                "http://10.0.0.2/",
            ),
            (
                "[ceo@good.example](mailto:ceo@evil.example)",
                "ceo@good.example",
                "mailto:ceo@evil.example",
            ),
            (
                "[**github.com**](https://github.com.evil.example)",
                "<b>github.com</b>",
                "https://github.com.evil.example",
            ),
            (
                "[main.rs](https://github.com/a/b/main.rs)",
                "main.rs",
                "https://github.com/a/b/main.rs",
            ),
        ] {
            assert_eq!(render(markdown), shown(text, target), "{markdown}");
        }
        // Same host: a link, whatever the case, path or `www.`.
        for (markdown, html) in [
            (
                "[www.GitHub.com/a](https://github.com/b)",
                "<a href=\"https://github.com/b\">www.GitHub.com/a</a>",
            ),
            (
                "[see https://e.com:8080/x.](https://E.com/y)",
                "<a href=\"https://E.com/y\">see https://e.com:8080/x.</a>",
            ),
            (
                "[the docs](https://docs.rs/x)",
                "<a href=\"https://docs.rs/x\">the docs</a>",
            ),
            (
                "[v1.2 notes](https://e.com/n)",
                "<a href=\"https://e.com/n\">v1.2 notes</a>",
            ),
        ] {
            assert_eq!(render(markdown), html, "{markdown}");
        }
    }

    #[test]
    fn hidden_characters_are_shown_everywhere_and_links_judged_as_they_read() {
        // An override that would show `moc.evil` as `live.com`: shown, and
        // the text judged as it then reads.
        assert_eq!(
            render("[\u{202E}moc.live](https://evil.example)"),
            "&lt;U+202E&gt;moc.live (<a href=\"https://evil.example\">https://evil.example</a>)"
        );
        // A zero-width space hiding a domain from the check is seen.
        assert_eq!(
            render("[paypal\u{200B}.com](https://evil.example)"),
            "paypal&lt;U+200B&gt;.com (<a href=\"https://evil.example\">https://evil.example</a>)"
        );
        assert_eq!(
            render("[go\u{200D}ogle\u{2060}.com\u{E0041}](https://google.com)"),
            "<a href=\"https://google.com\">go&lt;U+200D&gt;ogle&lt;U+2060&gt;.com&lt;U+E0041&gt;</a>",
            "it reads as google.com and goes there; the marks show what else it holds"
        );
        // A target with a hidden character is no link: it is shown.
        assert_eq!(
            render("[x](https://exa\u{200B}mple.com/\u{202E}a)"),
            "x (https://exa&lt;U+200B&gt;mple.com/&lt;U+202E&gt;a)"
        );
        // Outside links the same, also in code and tables…
        assert_eq!(
            render("`if admin \u{2067}// check\u{2069}` a\u{202D}b\n\n```\nx\u{202E}y\n```"),
            "<code>if admin &lt;U+2067&gt;// check&lt;U+2069&gt;</code> a&lt;U+202D&gt;b\n\n<pre>x&lt;U+202E&gt;y</pre>"
        );
        assert!(
            render("| a |\n|---|\n| b\u{200F} |").contains("b&lt;U+200F&gt;"),
            "{}",
            render("| a |\n|---|\n| b\u{200F} |")
        );
        // …while the joiners and selectors emoji and scripts need stay.
        assert_eq!(
            render("עברית 👨\u{200D}👩\u{200D}👧 ❤\u{FE0F}"),
            "עברית 👨\u{200D}👩\u{200D}👧 ❤\u{FE0F}"
        );
    }

    #[test]
    fn blocks_become_text() {
        let markdown =
            "# Title\n\ntext\nmore\n\n- a\n- b\n  1. c\n  2. d\n- [x] done\n\n---\n\nafter";
        assert_eq!(
            render(markdown),
            "<b>Title</b>\n\ntext\nmore\n\n• a\n• b\n  1. c\n  2. d\n• ☑ done\n\n──────────\n\nafter"
        );
        assert_eq!(render("3. c\n4. d"), "3. c\n4. d");
    }

    #[test]
    fn blockquotes_do_not_nest() {
        assert_eq!(
            render("> a\n>\n> > b\n\nc"),
            "<blockquote>a\n\nb</blockquote>\n\nc"
        );
    }

    #[test]
    fn tables_become_aligned_preformatted_text() {
        assert_eq!(
            render("| a | **bb** |\n|---|---|\n| ccc | `d` |"),
            "<pre>a   | bb\n----+---\nccc | d</pre>"
        );
    }

    #[test]
    fn to_plain_strips_tags_and_unescapes() {
        assert_eq!(
            to_plain("<b>a &lt; b</b> &amp; <a href=\"x\">c</a>&#33;&#x41;&bogus"),
            "a < b & c!A&bogus"
        );
    }

    #[test]
    fn short_messages_stay_whole() {
        let html = render("**hello** world");
        assert_eq!(split(&html, MESSAGE_LIMIT), vec![html]);
        assert!(split("", MESSAGE_LIMIT).is_empty());
        assert!(split("<b> </b>\n\n", MESSAGE_LIMIT).is_empty());
    }

    #[test]
    fn splits_prefer_paragraph_boundaries() {
        let paragraphs: Vec<String> = (0..12)
            .map(|n| format!("paragraph {n} {}", "w ".repeat(10)))
            .collect();
        let html = render(&paragraphs.join("\n\n"));
        let chunks = split(&html, 100);
        assert!(chunks.len() > 1);
        for chunk in &chunks {
            assert!(utf16_len(chunk) <= 100, "{chunk:?}");
            let text = chunk.trim();
            assert!(
                text.starts_with("paragraph") && text.ends_with('w'),
                "cut inside a paragraph: {chunk:?}"
            );
        }
    }

    #[test]
    fn a_code_block_split_across_chunks_stays_code() {
        let lines: Vec<String> = (0..80).map(|n| format!("let x{n} = {n} < 1;")).collect();
        let html = render(&format!("```rust\n{}\n```", lines.join("\n")));
        let chunks = split(&html, 400);
        assert!(chunks.len() > 2);
        let open = "<pre><code class=\"language-rust\">";
        for chunk in &chunks {
            assert!(
                chunk.starts_with(open) && chunk.ends_with("</code></pre>"),
                "{chunk:?}"
            );
            assert!(utf16_len(chunk) <= 400);
            // Cut at line ends, never inside a line.
            let body = &chunk[open.len()..chunk.len() - "</code></pre>".len()];
            assert!(body.trim_end().ends_with(';'), "{body:?}");
        }
        let plain: String = chunks.iter().map(|c| to_plain(c)).collect();
        assert_eq!(plain, to_plain(&html));
    }

    #[test]
    fn formatting_is_reopened_after_a_cut() {
        let html = format!("<b>{}</b>", "word ".repeat(40));
        let chunks = split(&html, 80);
        assert!(chunks.len() > 1);
        for chunk in &chunks {
            assert!(
                chunk.starts_with("<b>") && chunk.ends_with("</b>"),
                "{chunk:?}"
            );
            assert!(!chunk.contains("<b></b>"), "{chunk:?}");
        }
    }

    #[test]
    fn hard_cuts_respect_characters_and_entities() {
        for (html, limit) in [
            ("x".repeat(300), 100),
            ("😀".repeat(100), 65),
            ("&amp;".repeat(60), 64),
        ] {
            let chunks = split(&html, limit);
            assert!(chunks.len() > 1);
            for chunk in &chunks {
                assert!(utf16_len(chunk) <= limit, "{chunk:?}");
                // An entity is never cut in two.
                assert_eq!(chunk.matches("&amp;").count(), chunk.matches('&').count());
            }
            assert_eq!(chunks.concat(), html);
        }
    }

    #[test]
    fn an_oversized_opening_tag_is_dropped_not_repeated() {
        let href = format!("https://e.com/{}", "p".repeat(3000));
        let html = format!("<a href=\"{href}\">text</a> after");
        assert_eq!(split(&html, MESSAGE_LIMIT), vec!["text after".to_string()]);
    }

    #[test]
    fn tags_too_long_to_reopen_together_fall_back_to_plain_text() {
        let html = format!(
            "<blockquote><a href=\"https://e.co/x\"><tg-spoiler>{}</tg-spoiler></a></blockquote>",
            "word ".repeat(30)
        );
        let chunks = split(&html, MIN_LIMIT);
        assert!(chunks.len() > 1);
        for chunk in &chunks {
            assert!(utf16_len(chunk) <= MIN_LIMIT, "{chunk:?}");
            assert_balanced(chunk);
        }
        assert_eq!(
            without_whitespace(&chunks.concat()),
            without_whitespace(&to_plain(&html))
        );
    }

    #[test]
    fn the_limit_has_a_floor() {
        let chunks = split(&"abc ".repeat(50), 1);
        assert!(chunks.iter().all(|chunk| utf16_len(chunk) <= MIN_LIMIT));
    }

    const TELEGRAM_TAGS: [&str; 9] = [
        "b",
        "i",
        "u",
        "s",
        "code",
        "pre",
        "a",
        "blockquote",
        "tg-spoiler",
    ];

    /// Panics unless every tag is one Telegram knows and they nest properly.
    fn assert_balanced(chunk: &str) {
        let mut open = Vec::new();
        for piece in tokenize(chunk) {
            match piece {
                Piece::Open { name, .. } => {
                    assert!(TELEGRAM_TAGS.contains(&name), "<{name}> in {chunk:?}");
                    open.push(name);
                }
                Piece::Close { name } => assert_eq!(open.pop(), Some(name), "{chunk:?}"),
                Piece::Void { raw } => panic!("{raw} in {chunk:?}"),
                Piece::Text { raw } => assert!(!raw.starts_with('<'), "{chunk:?}"),
            }
        }
        assert!(open.is_empty(), "unclosed {open:?} in {chunk:?}");
    }

    fn without_whitespace(text: &str) -> String {
        text.chars().filter(|c| !c.is_whitespace()).collect()
    }

    fn markdown() -> impl Strategy<Value = String> {
        let token = prop_oneof![
            "[a-z]{1,12}",
            "\\PC{1,3}",
            Just(" ".to_string()),
            Just("\n".to_string()),
            Just("\n\n".to_string()),
            Just("**".to_string()),
            Just("*".to_string()),
            Just("_".to_string()),
            Just("~~".to_string()),
            Just("`".to_string()),
            Just("\n```rust\n".to_string()),
            Just("\n```\n".to_string()),
            Just("\n> ".to_string()),
            Just("\n- ".to_string()),
            Just("\n  1. ".to_string()),
            Just("\n# ".to_string()),
            Just("[link](https://e.com/\"q)".to_string()),
            Just("![img](https://e.com/i.png)".to_string()),
            Just("<b>&amp;</b>".to_string()),
            Just("&".to_string()),
            Just("😀".to_string()),
            Just("\n| a | b |\n|---|---|\n| c | d |\n".to_string()),
        ];
        prop::collection::vec(token, 0..300).prop_map(|tokens| tokens.concat())
    }

    /// Markdown links built from hostile pieces.
    fn hostile_link() -> impl Strategy<Value = String> {
        let part = prop_oneof![
            Just("paypal.com".to_string()),
            Just("https://good.example/x".to_string()),
            Just("good.example".to_string()),
            Just("a@good.example".to_string()),
            Just("click".to_string()),
            Just("\u{202E}".to_string()),
            Just("\u{200B}".to_string()),
            Just("\u{2066}".to_string()),
            Just("\u{FEFF}".to_string()),
            Just(" ".to_string()),
            Just("**".to_string()),
            "[a-z.]{1,8}",
        ];
        let target = prop_oneof![
            Just("https://good.example/x".to_string()),
            Just("https://evil.example".to_string()),
            Just("http://WWW.good.example".to_string()),
            Just("tg://login?token=abc".to_string()),
            Just("mailto:a@good.example".to_string()),
            Just("javascript:alert(1)".to_string()),
            Just("https://good.example@evil.example".to_string()),
            Just("https://go\u{200B}od.example".to_string()),
            Just("docs/x.md".to_string()),
        ];
        (prop::collection::vec(part, 0..6), target, any::<bool>()).prop_map(
            |(parts, target, image)| {
                format!(
                    "{}[{}]({target}) tail",
                    if image { "!" } else { "" },
                    parts.concat()
                )
            },
        )
    }

    /// Every `<a href="T">X</a>` in `html`, as (T, X).
    fn anchors(html: &str) -> Vec<(String, String)> {
        let mut found = Vec::new();
        let mut rest = html;
        while let Some(start) = rest.find("<a href=\"") {
            let after = &rest[start + 9..];
            let Some(quote) = after.find('"') else { break };
            let body = &after[quote + 2..];
            let Some(end) = body.find("</a>") else { break };
            found.push((after[..quote].to_string(), to_plain(&body[..end])));
            rest = &body[end..];
        }
        found
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn hostile_links_never_deceive(markdown in hostile_link()) {
            let html = render(&markdown);
            prop_assert!(crate::visible::is_plain(&html), "{html:?}");
            for (href, text) in anchors(&html) {
                let lower = href.to_ascii_lowercase();
                prop_assert!(
                    lower.starts_with("http://") || lower.starts_with("https://") || lower.starts_with("mailto:"),
                    "{href} in {html:?}"
                );
                prop_assert!(!href.contains('@') || lower.starts_with("mailto:"), "{html:?}");
                prop_assert!(crate::visible::is_plain(&href) && crate::visible::is_plain(&text), "{html:?}");
                // A link whose text names a host as a word of its own goes
                // to that host.
                let lower = text.to_lowercase().replace("www.", "");
                let href_host = href
                    .to_lowercase()
                    .split_once("://")
                    .map(|(_, rest)| rest.split(['/', '?', '#', ':']).next().unwrap_or_default().replace("www.", ""))
                    .or_else(|| href.rsplit_once('@').map(|(_, domain)| domain.to_lowercase()))
                    .unwrap_or_default();
                let part_of_name = |c: char| c.is_alphanumeric() || c == '.' || c == '-' || c == '/';
                for name in ["paypal.com", "good.example", "evil.example"] {
                    for (at, _) in lower.match_indices(name) {
                        let before = lower[..at].chars().next_back();
                        let after = lower[at + name.len()..].chars().next();
                        if !before.is_some_and(part_of_name) && !after.is_some_and(|c| part_of_name(c) && c != '/') {
                            prop_assert_eq!(&href_host, name, "{} → {} in {:?}", text, href, html);
                        }
                    }
                }
            }
        }

        #[test]
        fn chunks_fit_parse_alone_and_keep_every_character(
            markdown in markdown(),
            limit in prop_oneof![MIN_LIMIT..400usize, Just(MESSAGE_LIMIT)],
            repeat in 1usize..4,
        ) {
            let html = render(&markdown.repeat(repeat));
            let chunks = split(&html, limit);
            for chunk in &chunks {
                prop_assert!(utf16_len(chunk) <= limit, "{} > {limit}: {chunk:?}", utf16_len(chunk));
                assert_balanced(chunk);
                prop_assert!(!to_plain(chunk).trim().is_empty());
            }
            let joined: String = chunks.iter().map(|chunk| to_plain(chunk)).collect();
            prop_assert_eq!(without_whitespace(&joined), without_whitespace(&to_plain(&html)));
        }
    }
}

//! What a session sends into its topic: the agent's answers (Markdown →
//! Telegram HTML, split under the message limit), mirrored local prompts,
//! `typing` while the agent works, and one progress message per turn. One
//! task per session keeps the order of messages and never blocks the host.
//!
//! The progress message appears with the turn's first tool call and is
//! edited in place (the current tool and its argument in short, how many
//! ran, the time so far) at most every [`EDIT_EVERY_GROUP`] in a group
//! (every topic of a forum shares its 20 messages a minute) and every
//! [`EDIT_EVERY_PRIVATE`] in a private chat; states in between are
//! superseded, never queued. When the answer comes, the message says how
//! the turn went, and the answer follows as a message of its own, so the
//! phone is notified.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::bus::{Member, MemberError};
use crate::protocol::bus::{
    BusErrorCode, EditText, FileSource, MAX_INLINE_FILE, SendAs, SendFile, SendText, Target,
    TextFormat, TopicOp,
};
use crate::render;

/// Telegram shows `typing` for about 5 s; renew a little before.
const TYPING_EVERY: Duration = Duration::from_secs(4);
/// How long a new topic may take to appear after the old one vanished.
const REPROVISION_WAIT: Duration = Duration::from_secs(30);
/// The progress message is edited at most this often in a group…
const EDIT_EVERY_GROUP: Duration = Duration::from_secs(10);
/// …and this often in a private chat (about one message a second there).
const EDIT_EVERY_PRIVATE: Duration = Duration::from_secs(3);
/// How much of a tool's argument the progress message shows.
const TOOL_ARGUMENT: usize = 80;

#[derive(Debug)]
pub enum Outgoing {
    /// The agent's answer, as Markdown; `cut` when the turn was stopped.
    Answer { markdown: String, cut: bool },
    /// Plain text (status replies, mirrored prompts).
    Plain(String),
    /// The agent started (true) or stopped (false) working.
    Busy(bool),
    /// A tool call started: its name and what it works on, in short.
    Tool { name: String, argument: String },
    /// The agent's own message (a tool such as `reply`), as Markdown, sent
    /// now; `done` hears how many messages went out, or why none did.
    Reply {
        markdown: String,
        done: tokio::sync::oneshot::Sender<Result<u32, String>>,
    },
}

/// The turn's progress message.
struct Progress {
    message_id: Option<i64>,
    started: Instant,
    tools: u32,
    current: String,
    last_shown: Option<Instant>,
    /// Something changed since the message was last edited.
    stale: bool,
}

impl Progress {
    fn new() -> Self {
        Self {
            message_id: None,
            started: Instant::now(),
            tools: 0,
            current: String::new(),
            last_shown: None,
            stale: false,
        }
    }

    fn text(&self) -> String {
        let tools = match self.tools {
            1 => "1 tool".to_string(),
            n => format!("{n} tools"),
        };
        format!(
            "⚙️ Working · {tools} · {}\n▸ {}",
            elapsed(self.started),
            self.current
        )
    }

    fn summary(&self, cut: bool) -> String {
        let tools = match self.tools {
            1 => "1 tool".to_string(),
            n => format!("{n} tools"),
        };
        let how = if cut { "⏹ Stopped" } else { "✓" };
        format!("{how} · {tools} · {}", elapsed(self.started))
    }
}

fn elapsed(since: Instant) -> String {
    let secs = since.elapsed().as_secs();
    format!("{}:{:02}", secs / 60, secs % 60)
}

/// `long_answers_as_file`: an answer that is mostly one long code block
/// goes as a file (`render::long_block`).
pub fn spawn(
    member: Arc<Member>,
    stop: CancellationToken,
    long_answers_as_file: bool,
) -> mpsc::UnboundedSender<Outgoing> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(member, rx, stop, long_answers_as_file));
    tx
}

async fn run(
    member: Arc<Member>,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    stop: CancellationToken,
    long_answers_as_file: bool,
) {
    let mut typing: Option<tokio::time::Interval> = None;
    let mut progress: Option<Progress> = None;
    loop {
        let edit_due = progress.as_ref().and_then(|p| {
            let last = p.last_shown?;
            p.stale.then(|| last + edit_every(&member))
        });
        tokio::select! {
            () = stop.cancelled() => break,
            next = rx.recv() => match next {
                None => break,
                Some(Outgoing::Answer { markdown, cut }) => {
                    if let Some(done) = progress.take() {
                        finish(&member, &done, cut).await;
                        progress = Some(Progress { message_id: None, ..done });
                    }
                    let mut markdown = markdown;
                    if long_answers_as_file
                        && let Some(block) = render::long_block(&markdown)
                        && send_block(&member, &block, cut).await
                    {
                        continue;
                    }
                    if cut {
                        markdown.push_str("\n\n⏹ *Stopped: this answer is cut off.*");
                    }
                    for chunk in render::split(&render::render(&markdown), render::MESSAGE_LIMIT) {
                        send(&member, &chunk, TextFormat::Html).await;
                    }
                }
                Some(Outgoing::Reply { markdown, done }) => {
                    let mut sent = 0;
                    let mut failed = false;
                    for chunk in render::split(&render::render(&markdown), render::MESSAGE_LIMIT) {
                        match send(&member, &chunk, TextFormat::Html).await {
                            Some(_) => sent += 1,
                            None => {
                                failed = true;
                                break;
                            }
                        }
                    }
                    let _ = done.send(if failed {
                        Err(format!("{sent} message(s) sent, then Telegram refused; see the log"))
                    } else {
                        Ok(sent)
                    });
                }
                Some(Outgoing::Plain(text)) => {
                    for chunk in plain_chunks(&text) {
                        send(&member, &chunk, TextFormat::Plain).await;
                    }
                }
                Some(Outgoing::Busy(busy)) => {
                    typing = busy.then(|| tokio::time::interval(TYPING_EVERY));
                    match (busy, progress.take()) {
                        (true, _) => progress = Some(Progress::new()),
                        // The turn ended without an answer: say how it went.
                        (false, Some(done)) if done.message_id.is_some() => {
                            finish(&member, &done, false).await;
                        }
                        (false, _) => {}
                    }
                }
                Some(Outgoing::Tool { name, argument }) => {
                    let p = progress.get_or_insert_with(Progress::new);
                    p.tools += 1;
                    p.current = if argument.is_empty() {
                        name
                    } else {
                        format!("{name}: {}", crate::policy::clip(&argument, TOOL_ARGUMENT))
                    };
                    p.stale = true;
                    if p.message_id.is_none() {
                        show(&member, p).await;
                    }
                }
            },
            () = sleep_until(edit_due), if edit_due.is_some() => {
                if let Some(p) = progress.as_mut() {
                    show(&member, p).await;
                }
            }
            _ = async { typing.as_mut().expect("guarded").tick().await }, if typing.is_some() => {
                if target(&member).is_some()
                    && let Err(e) = member.topic(TopicOp::Typing).await
                {
                    tracing::debug!("typing indicator failed: {e}");
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// How often the progress message may change in this session's chat.
fn edit_every(member: &Member) -> Duration {
    match target(member) {
        Some(t) if t.chat_id > 0 => EDIT_EVERY_PRIVATE,
        _ => EDIT_EVERY_GROUP,
    }
}

/// Posts or edits the progress message with its current state.
async fn show(member: &Member, p: &mut Progress) {
    let text = render::escape(&p.text());
    p.last_shown = Some(Instant::now());
    p.stale = false;
    match p.message_id {
        None => p.message_id = send(member, &text, TextFormat::Html).await,
        Some(message_id) => {
            let edit = TopicOp::EditText(EditText {
                message_id,
                text,
                format: TextFormat::Html,
                buttons: None,
            });
            if let Err(e) = member.topic(edit).await {
                tracing::debug!("cannot update the progress message: {e}");
            }
        }
    }
}

/// Turns the progress message into the turn's summary.
async fn finish(member: &Member, p: &Progress, cut: bool) {
    let Some(message_id) = p.message_id else {
        return;
    };
    let edit = TopicOp::EditText(EditText {
        message_id,
        text: render::escape(&p.summary(cut)),
        format: TextFormat::Html,
        buttons: None,
    });
    if let Err(e) = member.topic(edit).await {
        tracing::debug!("cannot finish the progress message: {e}");
    }
}

fn target(member: &Member) -> Option<Target> {
    member
        .watch()
        .borrow()
        .route
        .as_ref()
        .and_then(|r| r.target)
}

/// Sends an answer as its prose, then its long code block as a file. False
/// when the block is too big to travel inline (nothing was sent then); a
/// file Telegram does not take goes as messages after all.
async fn send_block(member: &Member, block: &render::LongBlock, cut: bool) -> bool {
    if block.code.len() > MAX_INLINE_FILE {
        return false;
    }
    if !block.prose.is_empty() {
        for chunk in render::split(&render::render(&block.prose), render::MESSAGE_LIMIT) {
            send(member, &chunk, TextFormat::Html).await;
        }
    }
    let lines = block.code.lines().count();
    let what = if block.file_name.ends_with(".diff") {
        "diff"
    } else {
        "code"
    };
    let mut caption = format!("📄 The answer's {what}, {lines} lines, as a file.");
    if cut {
        caption.push_str(" ⏹ Stopped: this answer is cut off.");
    }
    let op = TopicOp::SendFile(SendFile {
        source: FileSource::Text {
            name: block.file_name.clone(),
            text: block.code.clone(),
        },
        caption: Some(caption),
        send_as: Some(SendAs::Document),
    });
    if let Err(e) = member.topic_within(op, crate::bus::UPLOAD_TIMEOUT).await {
        tracing::warn!("cannot send the answer's code as a file ({e}); sending messages");
        let fenced = format!("```\n{}\n```", block.code.trim_end());
        for chunk in render::split(&render::render(&fenced), render::MESSAGE_LIMIT) {
            send(member, &chunk, TextFormat::Html).await;
        }
    }
    true
}

/// Plain text split the same way as HTML (escaping first keeps the splitter
/// honest about what Telegram will count).
fn plain_chunks(text: &str) -> Vec<String> {
    render::split(&render::escape(text), render::MESSAGE_LIMIT)
        .iter()
        .map(|chunk| render::to_plain(chunk))
        .collect()
}

/// Sends one chunk into the session's topic; the message's id when it was
/// posted. The leader paces it, falls back to plain text and retries what
/// can be retried; what is left to the session is a topic that is gone: it
/// registers again once for a new one.
async fn send(member: &Member, text: &str, format: TextFormat) -> Option<i64> {
    let op = || {
        TopicOp::SendText(SendText {
            text: text.to_string(),
            format,
            buttons: None,
            reply_to: None,
        })
    };
    let mut result = member.topic(op()).await;
    if result.as_ref().err().and_then(MemberError::code) == Some(BusErrorCode::TopicGone) {
        tracing::info!("the topic is gone; asking for a new one");
        let old = target(member);
        if let Err(e) = member.reregister().await {
            tracing::warn!("cannot register again: {e}");
            return None;
        }
        let mut states = member.watch();
        let fresh = states.wait_for(|s| {
            s.role.is_connected()
                && s.route
                    .as_ref()
                    .and_then(|r| r.target)
                    .is_some_and(|t| Some(t) != old)
        });
        if tokio::time::timeout(REPROVISION_WAIT, fresh).await.is_err() {
            tracing::warn!("no new topic appeared; dropping the message");
            return None;
        }
        result = member.topic(op()).await;
    }
    match result {
        Ok(done) => done.message_id,
        Err(e) => {
            // Ambiguous failures are not replayed: a duplicate answer is
            // worse than a missing one the user can ask for again.
            tracing::warn!("cannot send into the topic: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_chunks_keep_the_text_and_the_limit() {
        let text = "a < b & c\n".repeat(1000);
        let chunks = plain_chunks(&text);
        assert!(chunks.len() > 1);
        for chunk in &chunks {
            assert!(chunk.encode_utf16().count() <= render::MESSAGE_LIMIT);
        }
        let joined: String = chunks.concat();
        assert_eq!(
            joined.split_whitespace().collect::<Vec<_>>(),
            text.split_whitespace().collect::<Vec<_>>()
        );
    }
}

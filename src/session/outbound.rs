//! What a session sends into its topic: the agent's answers (Markdown →
//! Telegram HTML, split under the message limit), mirrored local prompts,
//! `typing` while the agent works, and one progress message per turn. One
//! task per session keeps the order of messages and never blocks the host.
//!
//! Telegram allows a group about 20 messages a minute, shared by every
//! topic, so this task spends the budget well:
//!
//! * **Merged while waiting.** A send may wait at the leader for the chat's
//!   budget; whatever text the agent produces meanwhile queues up here and
//!   goes out together, as few messages as the limit allows, in order.
//! * **Answers first.** Answers are sent at the leader's highest priority;
//!   the progress message and `typing` are background requests that never
//!   wait (a later state supersedes them), and the turn's summary edit runs
//!   on its own after the answer.
//!
//! The progress message appears with the turn's first tool call and is
//! edited in place (the current tool and its argument in short, how many
//! ran, the time so far) at most every [`EDIT_EVERY_GROUP`] in a group and
//! every [`EDIT_EVERY_PRIVATE`] in a private chat; states in between are
//! superseded, never queued. When the answer comes, the message says how
//! the turn went, and the answer follows as a message of its own, so the
//! phone is notified.
//!
//! An answer that is mostly one long code block, or a bare diff, goes as
//! its prose plus the block as a file (`render::long_block`), when
//! `long_answers_as_file` is on.
//!
//! An answer that could not be sent, or whose fate Telegram left open
//! ([`BusErrorCode::CommitUnknown`], never replayed blindly), is handed to
//! the session, which offers it again in the topic (`unsent.rs`).

use std::collections::VecDeque;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Session;
use crate::member::{Member, MemberError};
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
/// What stands between texts that went out as one message.
const MERGED: &str = "\n\n";

/// Text that did not reach the topic, or may not have: what the session
/// keeps and offers again (`unsent.rs`).
#[derive(Debug, Clone)]
pub(super) struct Unsent {
    /// Telegram HTML, as it was to be sent.
    pub html: String,
    /// Telegram may have posted it after all.
    pub maybe_sent: bool,
    /// What went wrong, in the leader's words.
    pub why: String,
}

#[derive(Debug)]
pub enum ToTopic {
    /// The agent's answer, as Markdown; `cut` when the turn was stopped.
    Answer { markdown: String, cut: bool },
    /// Plain text (status replies, mirrored prompts).
    Plain(String),
    /// Telegram HTML offered again (an answer that may be missing).
    Again(String),
    /// The agent started (true) or stopped (false) working.
    Busy(bool),
    /// A tool call started: its name and what it works on, in short.
    Tool { name: String, argument: String },
    /// The agent's own message (a tool such as `reply`), as Markdown, sent
    /// in order but never merged; `done` hears how many messages went out,
    /// or why none did (the agent is told, so it is not offered again).
    Reply {
        markdown: String,
        done: tokio::sync::oneshot::Sender<Result<u32, String>>,
    },
}

impl ToTopic {
    fn is_text(&self) -> bool {
        matches!(
            self,
            ToTopic::Answer { .. } | ToTopic::Plain(_) | ToTopic::Again(_)
        )
    }

    /// The text as Telegram HTML.
    fn html(self) -> String {
        match self {
            ToTopic::Answer { mut markdown, cut } => {
                if cut {
                    markdown.push_str("\n\n⏹ *Stopped: this answer is cut off.*");
                }
                render::render(&markdown)
            }
            ToTopic::Plain(text) => render::escape(&text),
            ToTopic::Again(html) => html,
            ToTopic::Busy(_) | ToTopic::Tool { .. } | ToTopic::Reply { .. } => String::new(),
        }
    }
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
        format!(
            "⚙️ Working · {} · {}\n▸ {}",
            self.tool_count(),
            elapsed(self.started),
            self.current
        )
    }

    fn summary(&self, cut: bool) -> String {
        let how = if cut { "⏹ Stopped" } else { "✓" };
        format!("{how} · {} · {}", self.tool_count(), elapsed(self.started))
    }

    fn tool_count(&self) -> String {
        match self.tools {
            1 => "1 tool".to_string(),
            n => format!("{n} tools"),
        }
    }
}

fn elapsed(since: Instant) -> String {
    let secs = u32::try_from(since.elapsed().as_secs()).unwrap_or(u32::MAX);
    crate::files::describe_duration(secs)
}

/// `long_answers_as_file`: an answer that is mostly one long code block
/// goes as a file (`render::long_block`).
pub fn spawn(
    session: Weak<Session>,
    member: Arc<Member>,
    stop: CancellationToken,
    long_answers_as_file: bool,
) -> (mpsc::UnboundedSender<ToTopic>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let outbound = TopicPoster {
        session,
        member,
        progress: None,
        long_answers_as_file,
    };
    // Dropping `tx` lets the task send what is queued, then end.
    (tx, tokio::spawn(outbound.run(rx, stop)))
}

struct TopicPoster {
    session: Weak<Session>,
    member: Arc<Member>,
    progress: Option<Progress>,
    long_answers_as_file: bool,
}

impl TopicPoster {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<ToTopic>, stop: CancellationToken) {
        let mut typing: Option<tokio::time::Interval> = None;
        let mut queue = VecDeque::new();
        loop {
            let edit_due = self.progress.as_ref().and_then(|p| {
                let last = p.last_shown?;
                p.stale.then(|| last + edit_every(&self.member))
            });
            tokio::select! {
                () = stop.cancelled() => break,
                next = rx.recv() => {
                    let Some(next) = next else { break };
                    queue.push_back(next);
                    // Whatever queued up while the last send waited goes
                    // out with this one.
                    while let Ok(more) = rx.try_recv() {
                        queue.push_back(more);
                    }
                    self.work_off(&mut queue, &mut typing).await;
                }
                () = sleep_until(edit_due), if edit_due.is_some() => {
                    if let Some(mut p) = self.progress.take() {
                        self.show(&mut p).await;
                        self.progress = Some(p);
                    }
                }
                _ = async { typing.as_mut().expect("guarded").tick().await }, if typing.is_some() => {
                    // Superseded by the next one anyway: never waits.
                    if target(&self.member).is_some()
                        && let Err(e) = self.member.topic_background(TopicOp::Typing).await
                    {
                        tracing::debug!("typing indicator not sent: {e}");
                    }
                }
            }
        }
    }

    /// Sends what queued up: its texts merged into as few messages as the
    /// limit allows, the rest in order after them. A reply of the agent's
    /// tools and an answer that goes as a file are not merged: the texts
    /// before them go first.
    async fn work_off(
        &mut self,
        queue: &mut VecDeque<ToTopic>,
        typing: &mut Option<tokio::time::Interval>,
    ) {
        let items: Vec<ToTopic> = queue.drain(..).collect();
        let mut texts = Vec::new();
        let mut rest = Vec::new();
        for item in items {
            match item {
                ToTopic::Reply { markdown, done } => {
                    if !texts.is_empty() {
                        self.send_texts(std::mem::take(&mut texts)).await;
                    }
                    let _ = done.send(self.reply(&markdown).await);
                }
                ToTopic::Answer { markdown, cut } => {
                    let block = self
                        .long_answers_as_file
                        .then(|| render::long_block(&markdown))
                        .flatten()
                        .filter(|block| block.code.len() <= MAX_INLINE_FILE);
                    match block {
                        Some(block) => {
                            if !texts.is_empty() {
                                self.send_texts(std::mem::take(&mut texts)).await;
                            }
                            self.send_block(&block, cut).await;
                            self.finish_turn(cut);
                        }
                        None => texts.push(ToTopic::Answer { markdown, cut }),
                    }
                }
                text if text.is_text() => texts.push(text),
                other => rest.push(other),
            }
        }
        if !texts.is_empty() {
            self.send_texts(texts).await;
        }
        for item in rest {
            match item {
                ToTopic::Busy(busy) => {
                    *typing = busy.then(|| tokio::time::interval(TYPING_EVERY));
                    match (busy, self.progress.take()) {
                        (true, _) => self.progress = Some(Progress::new()),
                        // The turn ended without an answer: say how it went.
                        (false, Some(done)) if done.message_id.is_some() => {
                            self.finish(&done, false);
                        }
                        (false, _) => {}
                    }
                }
                ToTopic::Tool { name, argument } => {
                    let mut p = self.progress.take().unwrap_or_else(Progress::new);
                    p.tools += 1;
                    p.current = if argument.is_empty() {
                        name
                    } else {
                        format!("{name}: {}", crate::policy::clip(&argument, TOOL_ARGUMENT))
                    };
                    p.stale = true;
                    if p.message_id.is_none() {
                        self.show(&mut p).await;
                    }
                    self.progress = Some(p);
                }
                text => unreachable!("texts were sent first: {text:?}"),
            }
        }
    }

    async fn send_texts(&mut self, texts: Vec<ToTopic>) {
        let count = texts.len();
        let cut = texts
            .iter()
            .any(|t| matches!(t, ToTopic::Answer { cut: true, .. }));
        let chunks = match texts.as_slice() {
            // One plain text goes as it is (no markup to refuse).
            [ToTopic::Plain(text)] => plain_chunks(text)
                .into_iter()
                .map(|c| (c, TextFormat::Plain))
                .collect::<Vec<_>>(),
            _ => {
                let html: Vec<String> = texts.into_iter().map(ToTopic::html).collect();
                render::split(&html.join(MERGED), render::MESSAGE_LIMIT)
                    .into_iter()
                    .map(|c| (c, TextFormat::Html))
                    .collect()
            }
        };
        if count > 1 {
            tracing::debug!(
                texts = count,
                messages = chunks.len(),
                "merged what queued up while the chat was paced"
            );
        }
        for (chunk, format) in chunks {
            self.send(&chunk, format).await;
        }
        self.finish_turn(cut);
    }

    /// The answer went first; the turn's summary follows on its own.
    fn finish_turn(&mut self, cut: bool) {
        if let Some(done) = self.progress.take() {
            self.finish(&done, cut);
            self.progress = Some(Progress {
                message_id: None,
                ..done
            });
        }
    }

    /// The agent's own message: sent in order, counted; the first chunk
    /// that fails ends it, and the agent hears why (nothing is held for the
    /// topic to offer again: the agent decides).
    async fn reply(&self, markdown: &str) -> Result<u32, String> {
        let mut sent = 0;
        for chunk in render::split(&render::render(markdown), render::MESSAGE_LIMIT) {
            match self.try_send(&chunk, TextFormat::Html).await {
                Ok(_) => sent += 1,
                Err(e) => {
                    return Err(match sent {
                        0 => format!("Telegram did not take it: {e}"),
                        n => {
                            format!("{n} message(s) sent, then Telegram did not take the rest: {e}")
                        }
                    });
                }
            }
        }
        if let Some(session) = self.session.upgrade() {
            session.topic_reachable();
        }
        Ok(sent)
    }

    /// Sends an answer as its prose, then its long code block as a file; a
    /// file Telegram does not take goes as messages after all.
    async fn send_block(&self, block: &render::LongBlock, cut: bool) {
        if !block.prose.is_empty() {
            for chunk in render::split(&render::render(&block.prose), render::MESSAGE_LIMIT) {
                self.send(&chunk, TextFormat::Html).await;
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
        if let Err(e) = self
            .member
            .topic_within(op, crate::member::UPLOAD_TIMEOUT)
            .await
        {
            tracing::warn!("cannot send the answer's code as a file ({e}); sending messages");
            let fenced = format!("```\n{}\n```", block.code.trim_end());
            for chunk in render::split(&render::render(&fenced), render::MESSAGE_LIMIT) {
                self.send(&chunk, TextFormat::Html).await;
            }
        }
    }

    /// Posts or edits the progress message with its current state. A
    /// background request: when the chat's budget is spent it is not sent,
    /// and the next state is tried after the usual interval.
    async fn show(&self, p: &mut Progress) {
        let text = render::escape(&p.text());
        p.last_shown = Some(Instant::now());
        p.stale = false;
        let op = match p.message_id {
            None => TopicOp::SendText(SendText {
                text,
                format: TextFormat::Html,
                buttons: None,
                reply_to: None,
            }),
            Some(message_id) => TopicOp::EditText(EditText {
                message_id,
                text,
                format: TextFormat::Html,
                buttons: None,
            }),
        };
        match self.member.topic_background(op).await {
            Ok(done) => {
                if p.message_id.is_none() {
                    p.message_id = done.message_id;
                }
            }
            Err(e) => {
                if e.code() == Some(BusErrorCode::Paced) {
                    // Kept for the next round.
                    p.stale = true;
                }
                tracing::debug!("progress not shown: {e}");
            }
        }
    }

    /// Turns the progress message into the turn's summary, on its own: an
    /// edit waits behind the answers for the chat's budget.
    fn finish(&self, p: &Progress, cut: bool) {
        let Some(message_id) = p.message_id else {
            return;
        };
        let edit = TopicOp::EditText(EditText {
            message_id,
            text: render::escape(&p.summary(cut)),
            format: TextFormat::Html,
            buttons: None,
        });
        let member = self.member.clone();
        tokio::spawn(async move {
            if let Err(e) = member.topic(edit).await {
                tracing::debug!("cannot finish the progress message: {e}");
            }
        });
    }

    /// Sends one chunk into the session's topic. The leader paces it, falls
    /// back to plain text and retries what can be retried; a topic that is
    /// gone makes the session register once for a new one. What still
    /// fails goes to the session, which offers it again in the topic.
    async fn send(&self, text: &str, format: TextFormat) {
        let result = self.try_send(text, format).await;
        let Some(session) = self.session.upgrade() else {
            return;
        };
        match result {
            Ok(_) => session.topic_reachable(),
            // No topic to offer it in either; the status line says why.
            Err(e) if e.code() == Some(BusErrorCode::NoTopic) => {
                tracing::info!("not sent: this session has no topic ({e})");
            }
            Err(e) => {
                // Ambiguous failures are not replayed: a duplicate answer is
                // worse than a gap the user is told of and can fill.
                tracing::warn!("cannot send into the topic: {e}");
                let html = match format {
                    TextFormat::Html => text.to_string(),
                    TextFormat::Plain => render::escape(text),
                };
                session.hold_unsent(Unsent {
                    html,
                    maybe_sent: e.code() == Some(BusErrorCode::CommitUnknown),
                    why: e.to_string(),
                });
            }
        }
    }

    /// One chunk into the topic, registering once for a new topic when the
    /// old one is gone; the posted message's id.
    async fn try_send(&self, text: &str, format: TextFormat) -> Result<Option<i64>, MemberError> {
        let op = || {
            TopicOp::SendText(SendText {
                text: text.to_string(),
                format,
                buttons: None,
                reply_to: None,
            })
        };
        let mut result = self.member.topic(op()).await;
        if result.as_ref().err().and_then(MemberError::code) == Some(BusErrorCode::TopicGone) {
            tracing::info!("the topic is gone; asking for a new one");
            let old = target(&self.member);
            if let Err(e) = self.member.reregister().await {
                tracing::warn!("cannot register again: {e}");
            }
            let mut states = self.member.watch();
            let fresh = states.wait_for(|s| {
                s.role.is_connected()
                    && s.route
                        .as_ref()
                        .and_then(|r| r.target)
                        .is_some_and(|t| Some(t) != old)
            });
            if tokio::time::timeout(REPROVISION_WAIT, fresh).await.is_err() {
                tracing::warn!("no new topic appeared");
            }
            result = self.member.topic(op()).await;
        }
        result.map(|done| done.message_id)
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

fn target(member: &Member) -> Option<Target> {
    member
        .watch()
        .borrow()
        .route
        .as_ref()
        .and_then(|r| r.target)
}

/// Plain text split the same way as HTML (escaping first keeps the splitter
/// honest about what Telegram will count).
fn plain_chunks(text: &str) -> Vec<String> {
    render::split(&render::escape(text), render::MESSAGE_LIMIT)
        .iter()
        .map(|chunk| render::to_plain(chunk))
        .collect()
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

    #[test]
    fn a_stopped_answer_says_it_is_cut_off_and_plain_text_is_escaped() {
        let cut = ToTopic::Answer {
            markdown: "half an".into(),
            cut: true,
        }
        .html();
        assert!(cut.starts_with("half an"), "{cut}");
        assert!(
            cut.contains("⏹ <i>Stopped: this answer is cut off.</i>"),
            "{cut}"
        );
        assert_eq!(ToTopic::Plain("a < b".into()).html(), "a &lt; b");
    }
}

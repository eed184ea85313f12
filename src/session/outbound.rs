//! What a session sends into its topic: the agent's answers (Markdown →
//! Telegram HTML, split under the message limit), mirrored local prompts,
//! `typing` while the agent works, and one progress message per turn. One
//! task per session keeps the order of messages and never blocks the host.
//!
//! Answers and everything else the agent or the user wrote are *handed
//! over* to the leader (`post`), which has them on disk before it answers
//! and sends them from there (`leader::courier`): the session never waits
//! for Telegram, and nothing it handed over is lost with its process. The
//! leader paces them with every other topic's, merges answers that wait
//! together into as few messages as the limit allows, and offers again in
//! the topic what did not arrive (`/resend`).
//!
//! In a group, the progress message appears with the turn's first tool
//! call and is edited in place (the current tool and its argument in
//! short, how many ran, the time so far) at most every [`EDIT_EVERY`];
//! these are background
//! requests that never wait (a later state supersedes them). When the
//! answer comes, the message says how the turn went — handed over after
//! the answer, so it follows it — and the answer is a message of its own,
//! so the phone is notified.
//!
//! In a private chat (the default `setup` makes one, with a topic per
//! session) the progress is a *draft* instead (`sendMessageDraft`): it
//! costs no message, changes at most every [`DRAFT_EVERY`] (again every
//! [`DRAFT_REFRESH`] while nothing changes, as Telegram shows a draft for
//! about 30 s), shows the answer as the host writes it (`turn/text`), and
//! offers the draft's stop button, which stops the turn as `/stop` does.
//! A draft is kept by nobody: the answer is the turn's one message, with
//! how the turn went above it (what the agent said on its way included).
//!
//! Messages that wait for the next turn (a host that can steer,
//! `inbound.rs`) are a line of the progress: in a group the progress
//! message carries ⚡ Steer now while any wait, in a draft (which has no
//! buttons) the line names `/steer`. Neither costs a message: the line and
//! the button ride on the edit or the draft the turn shows anyway, and a
//! turn that shows nothing yet gets them with its first.
//!
//! An answer that is mostly one long code block, or a bare diff, goes as
//! its prose plus the block as a file (`render::long_block`), when
//! `long_answers_as_file` is on.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Session;
use crate::member::Member;
use crate::protocol::bus::{
    BusErrorCode, Button, Draft, EditText, Keyboard, MAX_INLINE_FILE, PostItem, SendText, Target,
    TextFormat, TopicOp,
};
use crate::render;

/// Telegram shows `typing` for about 5 s; renew a little before.
const TYPING_EVERY: Duration = Duration::from_secs(4);
/// How long a hand-over waits for the relay while it is between leaders.
const HAND_OVER_PATIENCE: Duration = Duration::from_secs(30);
/// A group's progress message is edited at most this often (a private
/// chat shows a draft instead)…
const EDIT_EVERY: Duration = Duration::from_secs(10);
/// …and a private chat's, on a server without drafts: its budget is a
/// message a second, not twenty a minute for every topic together.
const PRIVATE_EDIT_EVERY: Duration = Duration::from_secs(3);
/// A private chat's draft changes at most this often: a background call
/// that never waits, so the chat's one message a second stays the answer's
/// when it comes.
const DRAFT_EVERY: Duration = Duration::from_millis(1_200);
/// A draft that did not change is shown again after this long, inside the
/// about 30 s Telegram shows one.
const DRAFT_REFRESH: Duration = Duration::from_secs(20);
/// How much of the answer being written a draft shows: its end.
const WRITING_SHOWN: usize = 3_000;
/// How much of a tool's argument the progress message shows.
const TOOL_ARGUMENT: usize = 80;
#[derive(Debug)]
pub enum ToTopic {
    /// The agent's answer, as Markdown; `cut` when the turn was stopped.
    Answer { markdown: String, cut: bool },
    /// The turn failed for good with this error (its model call did):
    /// said once, in the answer's place.
    Failed(String),
    /// Plain text (status replies, mirrored prompts).
    Plain(String),
    /// The agent started (true) or stopped (false) working.
    Busy(bool),
    /// A tool call started: its name, what it works on in short, and the
    /// host's id for it (an approval names the call by it).
    Tool {
        name: String,
        argument: String,
        call_id: Option<String>,
    },
    /// A call waits for a person's approval, or was just decided: the
    /// progress shows it as waiting, then as running or denied.
    Approval(ApprovalStep),
    /// What the agent wrote on its way (the text of a turn that goes on
    /// with tool calls): folded into the progress message, not a message
    /// of its own, so a turn costs two messages whatever the model says.
    Interim(String),
    /// The text the current turn has written so far, as Markdown: shown
    /// in a draft where there is one, dropped elsewhere.
    Writing(String),
    /// The agent's own message (a tool such as `reply`), as Markdown,
    /// handed over in order but never merged; `done` hears how many
    /// messages the leader took, or why it took none (the agent is told).
    Reply {
        markdown: String,
        done: tokio::sync::oneshot::Sender<Result<u32, String>>,
    },
    /// Answered once everything queued before it is the leader's (the
    /// host waits for this before it exits).
    Flush(tokio::sync::oneshot::Sender<()>),
    /// How many messages wait for the next turn (they could be steered in).
    Waiting(usize),
}

impl ToTopic {
    /// The text as Telegram HTML, for an answer or a plain text.
    fn html(&self) -> Option<String> {
        match self {
            ToTopic::Answer { markdown, cut } => {
                let mut markdown = markdown.clone();
                if *cut {
                    markdown.push_str("\n\n⏹ *Stopped: this answer is cut off.*");
                }
                Some(render::render(&markdown))
            }
            ToTopic::Plain(text) => Some(render::escape(text)),
            ToTopic::Failed(error) => Some(render::escape(&format!(
                "⚠️ The turn failed: {}. No answer came of it.",
                crate::policy::clip(error.trim_end_matches('.'), ERROR_SHOWN)
            ))),
            _ => None,
        }
    }
}

/// How a turn ended, as its summary heads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Answered,
    Stopped,
    Failed,
}

impl Ending {
    fn of(cut: bool) -> Self {
        if cut { Self::Stopped } else { Self::Answered }
    }

    fn mark(self) -> &'static str {
        match self {
            Self::Answered => "✓",
            Self::Stopped => "⏹ Stopped",
            Self::Failed => "⚠️ Failed",
        }
    }
}

/// How much of a failed turn's error its message quotes.
const ERROR_SHOWN: usize = 1_000;

/// Where a tool call that needed a person's approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// The approval message asks; nothing runs.
    Waiting,
    /// Allowed: the call runs.
    Allowed,
    /// Denied (by a person, a timeout or nobody to ask): it never runs.
    Denied,
}

/// An approval as the progress shows it. `call_id` and `name` find the
/// step it is about (Claude Code's permission hook names no call, only the
/// tool); `argument` shows the call when no step was shown for it.
#[derive(Debug, Clone)]
pub struct ApprovalStep {
    pub call_id: String,
    pub name: String,
    pub argument: String,
    pub asked: Asked,
}

/// The tool call the progress shows now.
#[derive(Debug, Clone)]
struct Step {
    call_id: Option<String>,
    name: String,
    /// The name and, in short, what it works on.
    line: String,
    asked: Option<Asked>,
    /// Counted among the tools: a call that waits or was denied has not
    /// run, and is not.
    counted: bool,
}

impl Step {
    fn new(name: String, argument: &str, call_id: Option<String>) -> Self {
        let line = if argument.is_empty() {
            name.clone()
        } else {
            format!("{name}: {}", crate::policy::clip(argument, TOOL_ARGUMENT))
        };
        Self {
            call_id,
            name,
            line,
            asked: None,
            counted: false,
        }
    }

    /// Whether `approval` is about this call: by its id where both have
    /// one, else by the tool's name.
    fn is(&self, approval: &ApprovalStep) -> bool {
        match (&self.call_id, approval.call_id.is_empty()) {
            (Some(id), false) => *id == approval.call_id,
            _ => self.name.eq_ignore_ascii_case(&approval.name),
        }
    }

    fn shown(&self) -> String {
        match self.asked {
            Some(Asked::Waiting) => format!("🔐 {} — waits for your approval", self.line),
            Some(Asked::Denied) => format!("🚫 {} — denied, not run", self.line),
            Some(Asked::Allowed) | None => format!("▸ {}", self.line),
        }
    }
}

/// How much of one interim line the progress message shows while the
/// agent works (the summary keeps more of each).
const INTERIM_SHOWN: usize = 200;
/// How much of the interim lines the summary keeps, all told: the oldest
/// give way first, and the summary says so.
const INTERIM_KEPT: usize = 3_000;

/// The turn's progress message (in a private chat, its draft).
struct Progress {
    message_id: Option<i64>,
    /// The draft that shows it in a private chat; never 0.
    draft_id: i64,
    /// What the turn is writing now (a draft shows it).
    writing: String,
    started: Instant,
    /// Tool calls that ran (or run): not those waiting or denied.
    tools: u32,
    /// Tool calls a person (or the approval's timeout) denied.
    denied: u32,
    step: Option<Step>,
    /// What the agent wrote on its way, in order.
    said: Vec<String>,
    /// Messages waiting for the next turn, which ⚡ Steer now gives this one.
    waiting: usize,
    last_shown: Option<Instant>,
    /// Something changed since the message was last edited.
    stale: bool,
    /// The change is one a person acts on (a call began or stopped
    /// waiting for them): shown without waiting for the next edit.
    urgent: bool,
}

impl Progress {
    fn new(draft_id: i64) -> Self {
        Self {
            message_id: None,
            draft_id,
            writing: String::new(),
            started: Instant::now(),
            tools: 0,
            denied: 0,
            step: None,
            said: Vec::new(),
            waiting: 0,
            last_shown: None,
            stale: false,
            urgent: false,
        }
    }

    fn text(&self) -> String {
        let waiting = self
            .step
            .as_ref()
            .is_some_and(|s| s.asked == Some(Asked::Waiting));
        let how = if waiting {
            "⏸ Waiting"
        } else {
            "⚙️ Working"
        };
        let mut text = format!("{how} · {} · {}", self.tool_count(), elapsed(self.started));
        if let Some(said) = self.said.last() {
            text.push_str("\n💬 ");
            text.push_str(&crate::policy::clip(said, INTERIM_SHOWN));
        }
        if let Some(step) = &self.step {
            text.push('\n');
            text.push_str(&step.shown());
        }
        match self.waiting {
            0 => {}
            1 => text.push_str("\n📨 1 message waits for the next turn"),
            n => text.push_str(&format!("\n📨 {n} messages wait for the next turn")),
        }
        text
    }

    /// The group's progress message's button, while messages wait.
    fn buttons(&self) -> Option<Keyboard> {
        (self.waiting > 0).then(|| Keyboard {
            rows: vec![vec![Button {
                text: "⚡ Steer now".into(),
                data: crate::phone::STEER_BUTTON.into(),
            }]],
        })
    }

    /// A tool call started: it runs, unless it is the call an approval
    /// already said waits (a host may ask before it tells of the call).
    fn start(&mut self, step: Step) {
        let waits = self.step.as_ref().is_some_and(|s| {
            s.asked == Some(Asked::Waiting) && s.call_id.is_some() && s.call_id == step.call_id
        });
        if waits {
            self.step = Some(Step {
                asked: Some(Asked::Waiting),
                ..step
            });
            return;
        }
        self.step = Some(Step {
            counted: true,
            ..step
        });
        self.tools += 1;
    }

    /// Where the call an approval is about stands now. A call the
    /// progress never showed (the host told of it only by asking) becomes
    /// its step.
    fn decide(&mut self, approval: ApprovalStep) {
        let mut step = match self.step.take() {
            Some(step) if step.is(&approval) => step,
            other => {
                self.step = other;
                let call_id = (!approval.call_id.is_empty()).then(|| approval.call_id.clone());
                Step::new(approval.name.clone(), &approval.argument, call_id)
            }
        };
        let runs = approval.asked == Asked::Allowed;
        if step.counted && !runs {
            self.tools -= 1;
        } else if !step.counted && runs {
            self.tools += 1;
        }
        step.counted = runs;
        if approval.asked == Asked::Denied {
            self.denied += 1;
        }
        step.asked = Some(approval.asked);
        self.step = Some(step);
        self.stale = true;
        self.urgent = true;
    }

    /// The draft: the progress, then the end of what the turn is writing
    /// (Telegram HTML).
    fn draft_html(&self) -> String {
        let mut html = render::escape(&self.text());
        if self.waiting > 0 {
            // A draft has no buttons: the command, which Telegram makes a
            // link that sends it.
            html.push_str(" · /steer gives it now");
        }
        let writing = self.writing.trim();
        if !writing.is_empty() {
            html.push_str("\n\n");
            html.push_str(&render::render(&tail(writing, WRITING_SHOWN)));
        }
        html
    }

    /// Whether the turn shows anything yet: its draft, or its message.
    fn shown(&self, drafting: bool) -> bool {
        if drafting {
            self.last_shown.is_some()
        } else {
            self.message_id.is_some()
        }
    }

    /// How the turn went, and what the agent said on its way (the oldest
    /// lines elided when they are long).
    fn summary(&self, ending: Ending) -> String {
        let how = ending.mark();
        let mut summary = format!("{how} · {} · {}", self.tool_count(), elapsed(self.started));
        let mut kept: Vec<String> = Vec::new();
        let mut room = INTERIM_KEPT;
        for said in self.said.iter().rev() {
            if said.len() > room {
                if kept.is_empty() {
                    kept.push(crate::policy::clip(said, room));
                }
                break;
            }
            room -= said.len();
            kept.push(said.clone());
        }
        if kept.len() < self.said.len() {
            summary.push_str("\n💬 …");
        }
        for said in kept.iter().rev() {
            summary.push_str("\n💬 ");
            summary.push_str(said);
        }
        summary
    }

    /// How many calls ran, and how many were denied (they did not run).
    fn tool_count(&self) -> String {
        let mut count = match self.tools {
            1 => "1 tool".to_string(),
            n => format!("{n} tools"),
        };
        if self.denied > 0 {
            count.push_str(&format!(" · {} denied", self.denied));
        }
        count
    }
}

/// The last `max` characters of `text`, "…" before them when cut.
fn tail(text: &str, max: usize) -> String {
    let count = text.chars().count();
    if count <= max {
        return text.to_string();
    }
    let kept: String = text.chars().skip(count - max).collect();
    format!("…{kept}")
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
        drafts: 0,
        no_drafts: AtomicBool::new(false),
    };
    // Dropping `tx` lets the task send what is queued, then end.
    (tx, crate::tasks::spawn(outbound.run(rx, stop)))
}

struct TopicPoster {
    session: Weak<Session>,
    member: Arc<Member>,
    progress: Option<Progress>,
    long_answers_as_file: bool,
    /// Drafts begun: the next draft's id is one more.
    drafts: i64,
    /// The Bot API server lacks drafts (a self-hosted one, or a proxy,
    /// that lags behind Telegram): the progress is an edited message, as in
    /// a group.
    no_drafts: AtomicBool,
}

impl TopicPoster {
    /// Whether this session's chat shows drafts: a private chat, on a
    /// server that has them.
    fn drafting(&self) -> bool {
        !self.no_drafts.load(Ordering::Relaxed)
            && target(&self.member).is_some_and(|t| t.chat_id > 0)
    }

    /// A new turn's progress, with a draft of its own.
    fn new_progress(&mut self) -> Progress {
        self.drafts += 1;
        Progress::new(self.drafts)
    }

    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<ToTopic>, stop: CancellationToken) {
        let mut typing: Option<tokio::time::Interval> = None;
        let mut queue = VecDeque::new();
        loop {
            let drafting = self.drafting();
            let edit_every = if target(&self.member).is_some_and(|t| t.chat_id > 0) {
                PRIVATE_EDIT_EVERY
            } else {
                EDIT_EVERY
            };
            let edit_due = self.progress.as_ref().and_then(|p| {
                let last = p.last_shown?;
                match (drafting, p.stale) {
                    (true, true) => Some(last + DRAFT_EVERY),
                    (true, false) => Some(last + DRAFT_REFRESH),
                    // What a person acts on is shown now; the rest waits
                    // for the next edit.
                    (false, stale) => {
                        stale.then(|| if p.urgent { last } else { last + edit_every })
                    }
                }
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

    /// Hands what queued up over, in order; the progress message follows
    /// the tool calls and the answers.
    async fn work_off(
        &mut self,
        queue: &mut VecDeque<ToTopic>,
        typing: &mut Option<tokio::time::Interval>,
    ) {
        for item in queue.drain(..) {
            match item {
                ToTopic::Reply { markdown, done } => {
                    let _ = done.send(self.reply(&markdown).await);
                }
                ToTopic::Answer { markdown, cut } => self.answer(markdown, cut).await,
                ToTopic::Failed(error) => self.failed(error).await,
                ToTopic::Plain(text) => self.hand_over_text(&render::escape(&text)).await,
                ToTopic::Busy(busy) => {
                    *typing = busy.then(|| {
                        let mut every = tokio::time::interval(TYPING_EVERY);
                        // After a long wait, one indicator, not one per
                        // missed tick.
                        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                        every
                    });
                    self.busy(busy).await;
                }
                ToTopic::Tool {
                    name,
                    argument,
                    call_id,
                } => {
                    let step = Step::new(name, &argument, call_id);
                    self.update_progress(|p| p.start(step)).await;
                }
                ToTopic::Approval(approval) => {
                    // The approval message is the one that asks: a turn
                    // that shows nothing yet gets no message for it.
                    if let Some(p) = self.progress.as_mut() {
                        p.decide(approval);
                    }
                }
                ToTopic::Interim(text) => {
                    self.update_progress(|p| {
                        p.said.push(text);
                        // What it wrote is a line of the progress now.
                        p.writing.clear();
                    })
                    .await;
                }
                // A group's budget has no room for it: the answer comes
                // whole.
                ToTopic::Writing(text) if self.drafting() => {
                    self.update_progress(|p| p.writing = text).await;
                }
                ToTopic::Writing(_) => {}
                ToTopic::Flush(done) => {
                    let _ = done.send(());
                }
                ToTopic::Waiting(count) => self.waiting(count),
            }
        }
    }

    /// The turn's answer: where the progress was a draft, how the turn
    /// went heads it (the turn's one message); a long block of code goes as
    /// a file.
    async fn answer(&mut self, markdown: String, cut: bool) {
        let summary = self.draft_summary(Ending::of(cut));
        let block = self
            .long_answers_as_file
            .then(|| render::long_block(&markdown))
            .flatten()
            .filter(|block| block.code.len() <= MAX_INLINE_FILE);
        match block {
            Some(block) => self.hand_over_block(&block, cut, summary).await,
            None => {
                let html = ToTopic::Answer { markdown, cut }.html().unwrap_or_default();
                self.hand_over_text(&headed(summary, html)).await;
            }
        }
        self.finish_turn(Ending::of(cut)).await;
    }

    /// The turn failed for good: said once in the answer's place, headed
    /// by how the turn went where the progress was a draft.
    async fn failed(&mut self, error: String) {
        let summary = self.draft_summary(Ending::Failed);
        let html = ToTopic::Failed(error).html().unwrap_or_default();
        self.hand_over_text(&headed(summary, html)).await;
        self.finish_turn(Ending::Failed).await;
    }

    /// How the turn went, to head its message where the progress was a
    /// draft (which the message takes the place of), when there is more to
    /// say than the mark.
    fn draft_summary(&self, ending: Ending) -> Option<String> {
        self.drafting()
            .then_some(self.progress.as_ref())
            .flatten()
            .filter(|p| p.tools > 0 || !p.said.is_empty())
            .map(|p| render::escape(&p.summary(ending)))
    }

    /// A turn began (a progress of its own) or ended: one that ended
    /// without an answer says how it went.
    async fn busy(&mut self, busy: bool) {
        match (busy, self.progress.take()) {
            (true, _) => self.progress = Some(self.new_progress()),
            (false, Some(done)) if done.message_id.is_some() || !done.said.is_empty() => {
                self.finish(&done, Ending::Answered).await;
            }
            (false, _) => {}
        }
    }

    /// How many messages wait for the next turn: shown with the progress
    /// at once where it shows already (a person may want to steer now),
    /// else with its first showing: never a message of its own.
    fn waiting(&mut self, count: usize) {
        if let Some(p) = self.progress.as_mut()
            && p.waiting != count
        {
            p.waiting = count;
            p.stale = true;
            p.urgent = true;
        }
    }

    /// Changes the turn's progress (a new one if there is none) and shows
    /// it, unless it is shown soon anyway.
    async fn update_progress(&mut self, change: impl FnOnce(&mut Progress)) {
        let mut p = self.progress.take().unwrap_or_else(|| self.new_progress());
        change(&mut p);
        p.stale = true;
        if !p.shown(self.drafting()) {
            self.show(&mut p).await;
        }
        self.progress = Some(p);
    }

    /// The answer went first; the turn's summary follows it. Where the
    /// progress was a draft, the summary went with the answer, whose
    /// message takes the draft's place: what comes next is a new draft.
    async fn finish_turn(&mut self, ending: Ending) {
        if let Some(done) = self.progress.take() {
            if self.drafting() {
                let draft_id = self.new_progress().draft_id;
                self.progress = Some(Progress {
                    draft_id,
                    writing: String::new(),
                    said: Vec::new(),
                    last_shown: None,
                    stale: false,
                    ..done
                });
                return;
            }
            self.finish(&done, ending).await;
            self.progress = Some(Progress {
                message_id: None,
                said: Vec::new(),
                ..done
            });
        }
    }

    /// The agent's own message: handed over in order; the agent hears how
    /// many messages the leader took, or why it took none.
    async fn reply(&self, markdown: &str) -> Result<u32, String> {
        let items: Vec<PostItem> = render::split(&render::render(markdown), render::MESSAGE_LIMIT)
            .into_iter()
            .map(|chunk| PostItem::Text {
                text: chunk,
                format: TextFormat::Html,
                reply_to: None,
                merge: false,
            })
            .collect();
        let count = items.len() as u32;
        self.member
            .post(items, HAND_OVER_PATIENCE)
            .await
            .map(|_| count)
            .map_err(|e| format!("the relay did not take it: {e}"))
    }

    /// Hands an answer over as its prose, then its long code block as a
    /// file.
    async fn hand_over_block(&self, block: &render::LongBlock, cut: bool, summary: Option<String>) {
        let mut items = Vec::new();
        let prose = if block.prose.is_empty() {
            String::new()
        } else {
            render::render(&block.prose)
        };
        let prose = headed(summary, prose);
        if !prose.is_empty() {
            items.extend(text_items(&prose));
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
        items.push(PostItem::Document {
            name: block.file_name.clone(),
            text: block.code.clone(),
            caption: Some(caption),
        });
        self.hand_over(items, &block.prose).await;
    }

    /// Hands a text (Telegram HTML) over, split under the message limit;
    /// answers waiting together may share a message at the leader.
    async fn hand_over_text(&self, html: &str) {
        self.hand_over(text_items(html), html).await;
    }

    /// Hands `items` over. One the relay would not take (no topic, or no
    /// relay for [`HAND_OVER_PATIENCE`]) is said to the host, never lost
    /// without a word.
    async fn hand_over(&self, items: Vec<PostItem>, shown: &str) {
        if items.is_empty() {
            return;
        }
        let Err(e) = self.member.post(items, HAND_OVER_PATIENCE).await else {
            return;
        };
        let Some(session) = self.session.upgrade() else {
            return;
        };
        if e.code() == Some(BusErrorCode::NoTopic) {
            // No topic to send it to; the status line says why.
            tracing::info!("not sent: this session has no topic ({e})");
            return;
        }
        tracing::warn!("cannot hand a message to the relay: {e}");
        session.not_handed_over(shown, &e.to_string());
    }

    /// Posts or edits the progress message with its current state (in a
    /// private chat, shows its draft). A background request: when the
    /// chat's budget is spent it is not sent, and the next state is tried
    /// after the usual interval.
    async fn show(&self, p: &mut Progress) {
        p.last_shown = Some(Instant::now());
        p.stale = false;
        p.urgent = false;
        if self.drafting() {
            let op = TopicOp::Draft(Draft {
                draft_id: p.draft_id,
                text: p.draft_html(),
                format: TextFormat::Html,
                // Offered only where pressing it stops the turn.
                can_stop: self.session.upgrade().is_some_and(|s| s.can_abort()),
            });
            match self.member.topic_background(op).await {
                Ok(_) => return,
                // From now on the progress is a message of its own, shown
                // now: the leader said why once, at warn.
                Err(e) if e.code() == Some(BusErrorCode::Unsupported) => {
                    self.no_drafts.store(true, Ordering::Relaxed);
                }
                Err(e) => {
                    if e.code() == Some(BusErrorCode::Paced) {
                        p.stale = true;
                    }
                    tracing::debug!("draft not shown: {e}");
                    return;
                }
            }
        }
        let text = render::escape(&p.text());
        let op = match p.message_id {
            None => TopicOp::SendText(SendText {
                text,
                format: TextFormat::Html,
                buttons: p.buttons(),
                reply_to: None,
            }),
            Some(message_id) => TopicOp::EditText(EditText {
                message_id,
                text,
                format: TextFormat::Html,
                buttons: p.buttons(),
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

    /// Turns the progress message into the turn's summary: handed over
    /// after the answer, so it follows it. What the agent said on its way
    /// is kept there; when the progress message never got out (the budget
    /// was spent), the summary is a message of its own if it holds any.
    async fn finish(&self, p: &Progress, ending: Ending) {
        let text = render::escape(&p.summary(ending));
        let item = match p.message_id {
            Some(message_id) => PostItem::Edit {
                message_id,
                text,
                format: TextFormat::Html,
            },
            None if !p.said.is_empty() => PostItem::Text {
                text,
                format: TextFormat::Html,
                reply_to: None,
                merge: true,
            },
            None => return,
        };
        if let Err(e) = self.member.post(vec![item], HAND_OVER_PATIENCE).await {
            tracing::debug!("cannot finish the progress message: {e}");
        }
    }
}

/// `html` under `summary` (both Telegram HTML), when there is one.
fn headed(summary: Option<String>, html: String) -> String {
    match summary {
        Some(summary) if html.is_empty() => summary,
        Some(summary) => format!("{summary}\n\n{html}"),
        None => html,
    }
}

/// A text (Telegram HTML) as items for the topic, split under the message
/// limit; each may share a message with its neighbours.
fn text_items(html: &str) -> Vec<PostItem> {
    render::split(html, render::MESSAGE_LIMIT)
        .into_iter()
        .map(|chunk| PostItem::Text {
            text: chunk,
            format: TextFormat::Html,
            reply_to: None,
            merge: true,
        })
        .collect()
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_answer_says_it_is_cut_off_and_plain_text_is_escaped() {
        let cut = ToTopic::Answer {
            markdown: "half an".into(),
            cut: true,
        }
        .html()
        .unwrap();
        assert!(cut.starts_with("half an"), "{cut}");
        assert!(
            cut.contains("⏹ <i>Stopped: this answer is cut off.</i>"),
            "{cut}"
        );
        assert_eq!(ToTopic::Plain("a < b".into()).html().unwrap(), "a &lt; b");
    }

    #[test]
    fn a_failed_turn_says_its_error_once_in_the_answers_place_and_its_summary_says_failed() {
        let said = ToTopic::Failed("503 <overloaded>.".into()).html().unwrap();
        assert_eq!(
            said,
            "⚠️ The turn failed: 503 &lt;overloaded&gt;. No answer came of it."
        );
        let long = ToTopic::Failed("x".repeat(ERROR_SHOWN * 3)).html().unwrap();
        assert!(long.len() < ERROR_SHOWN + 100, "{}", long.len());
        let mut p = Progress::new(1);
        p.tools = 2;
        assert_eq!(p.summary(Ending::Failed), "⚠️ Failed · 2 tools · 0:00");
    }

    #[test]
    fn a_draft_shows_the_progress_and_the_end_of_what_is_written() {
        let mut p = Progress::new(1);
        p.start(Step::new("bash".into(), "ls", None));
        p.writing = format!("{}**the end**", "x".repeat(WRITING_SHOWN * 2));
        let html = p.draft_html();
        assert!(
            html.starts_with("⚙️ Working · 1 tool · 0:00\n▸ bash: ls\n\n…x"),
            "{html}"
        );
        assert!(html.contains("<b>the end</b>"), "{html}");
        assert!(html.chars().count() < 4096 - 100, "{}", html.len());
        p.writing = "  ".into();
        assert!(
            !p.draft_html().contains("\n\n"),
            "nothing written, nothing shown"
        );
    }

    #[test]
    fn the_summary_keeps_what_the_agent_said_on_its_way_newest_first_to_go_last() {
        let mut p = Progress::new(1);
        p.tools = 3;
        assert_eq!(p.summary(Ending::Answered), "✓ · 3 tools · 0:00");
        p.said = vec!["Looking at the tests.".into(), "Now the build.".into()];
        assert_eq!(
            p.summary(Ending::Answered),
            "✓ · 3 tools · 0:00\n💬 Looking at the tests.\n💬 Now the build."
        );
        p.said = vec!["x".repeat(INTERIM_KEPT), "the last word".into()];
        let summary = p.summary(Ending::Stopped);
        assert!(summary.starts_with("⏹ Stopped · 3 tools"), "{summary}");
        assert!(summary.contains("\n💬 …\n💬 the last word"), "{summary}");
        p.said = vec!["y".repeat(INTERIM_KEPT * 2)];
        assert!(p.summary(Ending::Answered).len() < INTERIM_KEPT + 100);
        p.step = Some(Step::new("bash".into(), "ls", None));
        let shown = format!(
            "\n💬 {}\n▸ bash: ls",
            crate::policy::clip(&p.said[0], INTERIM_SHOWN)
        );
        assert!(p.text().ends_with(&shown), "{}", p.text());
    }

    #[test]
    fn a_call_waiting_for_approval_shows_as_waiting_then_as_running_or_denied() {
        let approval = |call_id: &str, asked| ApprovalStep {
            call_id: call_id.into(),
            name: "bash".into(),
            argument: "$ rm -rf build".into(),
            asked,
        };
        let mut p = Progress::new(1);
        p.start(Step::new(
            "bash".into(),
            "$ rm -rf build",
            Some("t1".into()),
        ));
        p.decide(approval("t1", Asked::Waiting));
        assert_eq!(
            p.text(),
            "⏸ Waiting · 0 tools · 0:00\n🔐 bash: $ rm -rf build — waits for your approval"
        );
        p.decide(approval("t1", Asked::Allowed));
        assert_eq!(
            p.text(),
            "⚙️ Working · 1 tool · 0:00\n▸ bash: $ rm -rf build"
        );

        // Claude Code's permission hook names no call: the tool's name finds it.
        p.start(Step::new("bash".into(), "$ git push -f", Some("t2".into())));
        p.decide(approval("", Asked::Waiting));
        p.decide(approval("", Asked::Denied));
        assert_eq!(
            p.text(),
            "⚙️ Working · 1 tool · 1 denied · 0:00\n🚫 bash: $ git push -f — denied, not run"
        );
        assert_eq!(p.summary(Ending::Answered), "✓ · 1 tool · 1 denied · 0:00");

        // A call the host told of only by asking becomes the step, uncounted.
        let mut p = Progress::new(1);
        p.decide(approval("t3", Asked::Waiting));
        assert!(p.text().contains("🔐 bash: $ rm -rf build"), "{}", p.text());
        p.decide(approval("t3", Asked::Denied));
        assert_eq!(p.summary(Ending::Answered), "✓ · 0 tools · 1 denied · 0:00");

        // Asked before the host tells of the call: the call still waits.
        p.decide(approval("t4", Asked::Waiting));
        p.start(Step::new("bash".into(), "$ make", Some("t4".into())));
        assert!(
            p.text()
                .ends_with("🔐 bash: $ make — waits for your approval"),
            "{}",
            p.text()
        );
        p.decide(approval("t4", Asked::Allowed));
        assert_eq!(p.summary(Ending::Answered), "✓ · 1 tool · 1 denied · 0:00");
    }
}

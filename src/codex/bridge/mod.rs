//! The bridge plays host to the in-process session on Codex's behalf, as
//! `claude/bridge.rs` does for Claude Code: it is one client of Codex's
//! app-server, and everything Codex says that the relay cares about is
//! turned into the host protocol here, and back — the one place the
//! mapping lives (docs/DESIGN.md, "Codex"):
//!
//! | Codex (app-server) | the session (host protocol) |
//! |---|---|
//! | `thread/started` (a conversation), or the first `thread/status/changed` of a thread resumed elsewhere | `initialize` (first) or `session/started` (a switch), profile `file:codex:<thread id>` |
//! | `turn/started`; `turn/completed` | `agent/started`; `agent/ended {lastAssistantText, aborted}` (+ a notice when it failed) |
//! | `item/started` `userMessage` typed at the terminal | `input/received` (mirrored into the topic) |
//! | `item/started`/`item/completed` of a command, a file change, an MCP or web tool | `tool/started`/`tool/ended` (the progress message) |
//! | `item/completed` `agentMessage` | the turn's answer, kept for `agent/ended` |
//! | `item/commandExecution/requestApproval`, `item/fileChange/requestApproval`, `item/permissions/requestApproval` | `approval/request` → `accept` / `acceptForSession` / `decline` |
//! | `item/tool/requestUserInput` | `question/ask`, one per question |
//! | `serverRequest/resolved` of a request the relay did not answer | `approval/resolved` / `question/resolved` (the phone's message closes) |
//! | ← `turn/start` (joins a running turn) | `agent/sendUserMessage` |
//! | ← `turn/steer` (into the running turn, `expectedTurnId`) | `agent/sendUserMessage {deliverAs: steer}` |
//! | ← `turn/interrupt` | `agent/abort` (`/stop`) |
//!
//! Where Codex's TUI is the other client ([`Mode::BesideTui`]), the bridge
//! follows the thread the TUI has open and leaves to the TUI what the
//! relay does not decide (a request the `[approvals]` policy does not ask
//! about, or one nobody could be asked about on the phone): the TUI asks
//! every request itself, and the first answer wins. Where the relay is
//! Codex's only client ([`Mode::Alone`], a session started from the phone),
//! it opens or resumes the thread itself and answers every request.
//!
//! A connection sees a thread's events only once it resumed the thread
//! (`thread/resume`), which Codex refuses until the thread's first turn
//! has begun; so the bridge subscribes when it can — at once, after every
//! status change of the thread, after a turn it started, and every few
//! seconds — and meanwhile starts turns without seeing them.
//!
//! The bridge in parts, each an `impl` of [`CodexBridge`] read on its own:
//! this file (what it holds, how it runs, what it tells the session),
//! `thread.rs` (which thread the session is, and the subscription),
//! `events.rs` (Codex's notifications → the session's events),
//! `requests.rs` (Codex's approvals and questions → the phone, and the
//! answers back), `session.rs` (what the session asks of its host: a
//! prompt, `/stop`; and what the engine and the tool ask of the bridge).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

mod events;
mod requests;
mod session;
mod thread;

use super::app_server::{AppServer, Incoming};
use super::wire;
use crate::host_client::{Link, Said};

/// Requests to Codex that answer at once.
const QUICK: Duration = Duration::from_secs(30);
/// Requests to the session that answer at once.
const SESSION_QUICK: Duration = Duration::from_secs(30);
/// The prefix of the `clientUserMessageId` of a prompt from the phone.
const FROM_PHONE: &str = "agent-relay-";
/// Tool names the `[approvals]` policy sees for Codex's requests: a shell
/// command, a change to files, more permissions.
const BASH: &str = "bash";
const EDIT: &str = "edit";
const PERMISSIONS: &str = "permissions";

/// Who else talks to the app-server.
#[derive(Debug, Clone)]
pub enum Mode {
    /// Codex's TUI (`agent-relay codex`): the bridge follows its thread.
    BesideTui,
    /// Nobody: the bridge opens the thread (a session started from the
    /// phone) and answers every request itself.
    Alone(Opening),
}

/// How a session started from the phone gets its thread.
#[derive(Debug, Clone)]
pub enum Opening {
    Start { cwd: String, model: Option<String> },
    Resume { thread_id: String },
}

/// The thread a session started from the phone got: what its engine
/// needs to resume it and to name the model in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Opened {
    pub thread_id: String,
    pub model: Option<String>,
}

/// A request of Codex's that the bridge handed to the session and has not
/// answered yet.
#[derive(Debug, Clone)]
enum Forwarded {
    Approval { tool_call_id: String },
    Questions { ids: Vec<String> },
}

#[derive(Default)]
struct CodexState {
    /// The thread the session is, once there is one.
    thread: Option<String>,
    /// Threads seen, so a thread that comes back (a status change of an
    /// old thread) does not take the session back to it.
    known: HashSet<String>,
    /// This connection gets the thread's events.
    subscribed: bool,
    /// The turn running, as far as the bridge saw.
    turn: Option<String>,
    /// Turns that completed lately: a `turn/start` answered after its turn
    /// completed (a quick one) must not start it again, or the session
    /// would wait for its end for ever (and hold what is written meanwhile
    /// for a turn that never ends).
    completed: VecDeque<String>,
    /// Turns a prompt from the phone started or joined.
    phone_turns: HashSet<String>,
    /// The last agent message of the running turn: its answer.
    answer: Option<String>,
    /// File changes by item id, for the approval that follows them.
    changes: HashMap<String, Vec<wire::FileUpdate>>,
    /// Requests forwarded to the session, by Codex's request id.
    forwarded: HashMap<String, Forwarded>,
    seen: crate::ids::RecentUpdates,
    /// The model a turn from the phone is started with (a launched
    /// session's `/model`); none: the thread's.
    model: Option<String>,
}

/// One client of Codex's app-server playing host to the session.
pub struct CodexBridge {
    codex: AppServer,
    session: Link,
    mode: Mode,
    state: Mutex<CodexState>,
    /// Pokes the subscriber: a moment at which `thread/resume` may work.
    try_subscribe: Notify,
    stop: CancellationToken,
    /// The session's first thread, or why there is none (alone only).
    opened: watch::Sender<Option<Result<Opened, String>>>,
    /// When a turn last started or ended (a launched session idle long
    /// enough is ended).
    activity: watch::Sender<std::time::Instant>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A JSON-RPC id as a map key (Codex's are numbers, but may be strings).
fn key(id: &Value) -> String {
    id.to_string()
}

impl CodexBridge {
    pub fn new(codex: AppServer, session: Link, mode: Mode) -> Arc<Self> {
        let model = match &mode {
            Mode::Alone(Opening::Start { model, .. }) => model.clone(),
            _ => None,
        };
        Arc::new(Self {
            codex,
            session,
            mode,
            state: Mutex::new(CodexState {
                model,
                ..CodexState::default()
            }),
            try_subscribe: Notify::new(),
            stop: CancellationToken::new(),
            opened: watch::channel(None).0,
            activity: watch::channel(std::time::Instant::now()).0,
        })
    }

    /// When a turn last started or ended.
    pub fn activity(&self) -> watch::Receiver<std::time::Instant> {
        self.activity.subscribe()
    }

    /// Waits until the session has its first thread (opened or resumed by
    /// the bridge alone), or the bridge could not open one.
    pub async fn opened(&self) -> Result<Opened, String> {
        let mut opened = self.opened.subscribe();
        let outcome = opened
            .wait_for(Option::is_some)
            .await
            .map_err(|_| "the bridge is gone".to_string())?
            .clone();
        outcome.unwrap_or_else(|| Err("the bridge is gone".into()))
    }

    /// The first outcome of opening a thread is the one that counts.
    fn set_opened(&self, outcome: Result<Opened, String>) {
        self.opened.send_if_modified(|opened| {
            let first = opened.is_none();
            if first {
                *opened = Some(outcome);
            }
            first
        });
    }

    fn state(&self) -> MutexGuard<'_, CodexState> {
        lock(&self.state)
    }

    fn beside_tui(&self) -> bool {
        matches!(self.mode, Mode::BesideTui)
    }

    /// The thread the session is, once there is one.
    pub fn thread(&self) -> Option<String> {
        self.state().thread.clone()
    }

    /// The model turns from the phone start with from now on (`None`: the
    /// thread's own).
    pub fn set_model(&self, model: Option<String>) {
        self.state().model = model;
    }

    /// Runs until Codex's connection ends or [`CodexBridge::finish`]: reads what
    /// Codex says and what the session asks of its host.
    pub async fn run(
        self: Arc<Self>,
        mut from_codex: mpsc::UnboundedReceiver<Incoming>,
        from_session: mpsc::UnboundedReceiver<Said>,
    ) {
        self.clone().spawn_session_loop(from_session);
        self.clone().spawn_subscriber();
        if let Err(e) = self.open_thread().await {
            tracing::warn!("no Codex thread for the session: {e}");
            self.set_opened(Err(e.to_string()));
        }
        loop {
            let incoming = tokio::select! {
                () = self.stop.cancelled() => break,
                incoming = from_codex.recv() => incoming,
            };
            match incoming {
                Some(Incoming::Notification { method, params }) => {
                    self.on_notification(&method, params).await;
                }
                Some(Incoming::Request { id, method, params }) => {
                    let me = self.clone();
                    crate::tasks::spawn(async move { me.on_request(id, &method, params).await });
                }
                None => break,
            }
        }
        self.stop.cancel();
    }

    /// Stops the bridge's tasks (the session is closed by its owner).
    pub fn finish(&self) {
        self.stop.cancel();
    }

    /// Whether `thread_id` is the session's thread.
    fn ours(&self, thread_id: &str) -> bool {
        self.state().thread.as_deref() == Some(thread_id)
    }

    /// An event for the session, once it has a thread (it is initialized
    /// with the first).
    fn tell_session(&self, method: &str, params: Value) {
        if self.state().thread.is_none() {
            return;
        }
        if let Err(e) = self.session.notify(method, params) {
            tracing::debug!(method, "the session is gone: {e}");
        }
    }
}

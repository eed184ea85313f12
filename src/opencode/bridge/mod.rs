//! The bridge plays host to the in-process session on OpenCode's behalf,
//! as `codex/bridge/` does for Codex: it is one client of `opencode
//! serve`, and everything OpenCode says that the relay cares about is
//! turned into the host protocol here, and back — the one place the
//! mapping lives (docs/OPENCODE.md has the shapes it relies on):
//!
//! | OpenCode (`opencode serve`) | the session (host protocol) |
//! |---|---|
//! | `session.created` (no parent), or the first activity of a session opened elsewhere | `initialize` (first) or `session/started` (a switch), profile `file:opencode:<session id>` |
//! | `session.status` `busy`; `idle` | `agent/started`; `agent/ended {lastAssistantText, aborted}`, or `agent/ended {error}` when `session.error` said why it failed (after OpenCode's own retries) |
//! | `session.status` `retry` | `turn/ended {error}` when the failed try had written (its text is no answer); nothing else is told of a retry |
//! | a user's text part typed at the terminal | `input/received` (mirrored into the topic) |
//! | an assistant's text part, and its deltas | `turn/text` (the draft), the turn's answer kept for `agent/ended` |
//! | a tool part `running`; `completed`/`error` | `tool/started`; `tool/ended` (the progress message) |
//! | `permission.asked` | `approval/request` → `once` / `reject` (the session keeps "for 30 min" itself) |
//! | `question.asked` | `question/ask`, one per question → the answers, or `reject` |
//! | `permission.replied`, `question.replied`/`rejected` of a request the relay did not answer | `approval/resolved` / `question/resolved` (the phone's message closes) |
//! | ← `POST /session/{id}/prompt_async` (while busy: into the running turn's next step, so the session sends one then only to steer) | `agent/sendUserMessage` |
//! | ← `POST /session/{id}/abort` | `agent/abort` (`/stop`) |
//!
//! Beside OpenCode's TUI ([`Mode::BesideTui`]) the bridge follows the
//! session the TUI works in and leaves to the TUI what the relay does not
//! decide: the TUI shows every permission ask and question itself, and the
//! first answer wins. Alone ([`Mode::Alone`], a session started from the
//! phone) it creates or resumes the session itself and answers everything.
//! A sub-agent's session (the `task` tool) is the session's too: its asks
//! come to the phone.
//!
//! In parts, each an `impl` of [`OpenCodeBridge`]: this file (what it
//! holds, how it runs), `events.rs` (which session, and OpenCode's events
//! → the session's), `asks.rs` (permission asks and questions → the phone,
//! and the answers back), `session.rs` (what the session asks of its host,
//! and what the engine and the tool ask of the bridge).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

mod asks;
mod events;
mod session;

use super::server::Server;
use super::wire;
use crate::host_client::{Link, Said};

/// Requests to OpenCode that answer at once.
const QUICK: Duration = Duration::from_secs(30);
/// Requests to the session that answer at once.
const SESSION_QUICK: Duration = Duration::from_secs(30);
/// Messages whose role is remembered (a part names its message only).
const ROLES: usize = 4096;

/// Who else talks to the server.
#[derive(Debug, Clone)]
pub enum Mode {
    /// OpenCode's TUI (`agent-relay opencode`): the bridge follows it.
    BesideTui,
    /// Nobody: the bridge opens the session (one started from the phone)
    /// and answers every ask itself.
    Alone(Opening),
}

/// How a session started from the phone gets its OpenCode session.
#[derive(Debug, Clone)]
pub enum Opening {
    Start,
    Resume { session_id: String },
}

/// A request of OpenCode's that the bridge handed to the session and has
/// not answered yet.
#[derive(Debug, Clone)]
enum Forwarded {
    Approval { tool_call_id: String },
    Questions { ids: Vec<String> },
}

/// What the bridge knows of the turn running.
#[derive(Default)]
struct Turn {
    /// It was started, or joined, from the phone.
    from_phone: bool,
    /// `/stop` ended it.
    aborted: bool,
    /// Why it failed, as `session.error` said.
    failed: Option<String>,
    /// The assistant message with the latest text, and its text parts.
    answer_message: Option<String>,
    answer: Vec<(String, String)>,
    /// Tool calls started, and ended, by call id (a part is updated more
    /// than once).
    tools: HashSet<String>,
    tools_ended: HashSet<String>,
}

impl Turn {
    /// The answer so far: the text parts of the last message that wrote.
    fn answer(&self) -> Option<String> {
        let text: Vec<&str> = self
            .answer
            .iter()
            .map(|(_, t)| t.trim())
            .filter(|t| !t.is_empty())
            .collect();
        (!text.is_empty()).then(|| text.join("\n\n"))
    }
}

#[derive(Default)]
struct OpenCodeState {
    /// The session the relay's session is, once there is one.
    session: Option<String>,
    /// Sessions seen, so one that comes back does not take over.
    known: HashSet<String>,
    /// Sub-agents' sessions of ours.
    children: HashSet<String>,
    /// The turn running, as far as the bridge saw.
    turn: Option<Turn>,
    /// Message id → role, for the parts that name their message only.
    roles: HashMap<String, String>,
    roles_order: VecDeque<String>,
    /// User text parts mirrored already (a part is updated more than once).
    mirrored: HashSet<String>,
    /// Requests forwarded to the session, by OpenCode's request id.
    forwarded: HashMap<String, Forwarded>,
    seen: crate::ids::RecentUpdates,
    /// The model a prompt from the phone names (a launched session's
    /// `/model`); none: OpenCode's choice.
    model: Option<wire::ModelRef>,
}

impl OpenCodeState {
    fn remember_role(&mut self, message: String, role: String) {
        if self.roles.insert(message.clone(), role).is_none() {
            self.roles_order.push_back(message);
            if self.roles_order.len() > ROLES
                && let Some(old) = self.roles_order.pop_front()
            {
                self.roles.remove(&old);
            }
        }
    }

    /// Whether `session` is ours or one of our sub-agents'.
    fn concerns(&self, session: &str) -> bool {
        self.session.as_deref() == Some(session) || self.children.contains(session)
    }
}

/// One client of `opencode serve` playing host to the session.
pub struct OpenCodeBridge {
    server: Server,
    session: Link,
    mode: Mode,
    state: Mutex<OpenCodeState>,
    stop: CancellationToken,
    /// The session's first OpenCode session, or why there is none (alone).
    opened: watch::Sender<Option<Result<String, String>>>,
    /// When a turn last started or ended.
    activity: watch::Sender<Instant>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl OpenCodeBridge {
    pub fn new(server: Server, session: Link, mode: Mode) -> Arc<Self> {
        Arc::new(Self {
            server,
            session,
            mode,
            state: Mutex::default(),
            stop: CancellationToken::new(),
            opened: watch::channel(None).0,
            activity: watch::channel(Instant::now()).0,
        })
    }

    /// When a turn last started or ended.
    pub fn activity(&self) -> watch::Receiver<Instant> {
        self.activity.subscribe()
    }

    /// Waits until the session has its first OpenCode session (opened or
    /// resumed by the bridge alone), or the bridge could not open one.
    pub async fn opened(&self) -> Result<String, String> {
        let mut opened = self.opened.subscribe();
        let outcome = opened
            .wait_for(Option::is_some)
            .await
            .map_err(|_| "the bridge is gone".to_string())?
            .clone();
        outcome.unwrap_or_else(|| Err("the bridge is gone".into()))
    }

    /// The first outcome of opening a session is the one that counts.
    fn set_opened(&self, outcome: Result<String, String>) {
        self.opened.send_if_modified(|opened| {
            let first = opened.is_none();
            if first {
                *opened = Some(outcome);
            }
            first
        });
    }

    fn state(&self) -> MutexGuard<'_, OpenCodeState> {
        lock(&self.state)
    }

    fn beside_tui(&self) -> bool {
        matches!(self.mode, Mode::BesideTui)
    }

    /// The OpenCode session the relay's session is, once there is one.
    pub fn session_id(&self) -> Option<String> {
        self.state().session.clone()
    }

    /// The model prompts from the phone name from now on.
    pub fn set_model(&self, model: Option<wire::ModelRef>) {
        self.state().model = model;
    }

    /// Runs until OpenCode's event stream is given up or
    /// [`OpenCodeBridge::finish`]: reads what OpenCode says and what the
    /// session asks of its host.
    pub async fn run(self: Arc<Self>, from_session: mpsc::UnboundedReceiver<Said>) {
        self.clone().spawn_session_loop(from_session);
        let (mut events, mut connections) = self.server.events(self.stop.clone());
        if let Err(e) = self.open().await {
            tracing::warn!("no OpenCode session for the relay's session: {e}");
            self.set_opened(Err(e.to_string()));
        }
        loop {
            tokio::select! {
                () = self.stop.cancelled() => break,
                event = events.recv() => match event {
                    Some(event) => self.clone().on_event(event).await,
                    None => break,
                },
                Some(()) = connections.recv() => self.caught_up().await,
            }
        }
        self.stop.cancel();
    }

    /// Stops the bridge's tasks (the session is closed by its owner).
    pub fn finish(&self) {
        self.stop.cancel();
    }

    /// An event for the session, once it has an OpenCode session (it is
    /// initialized with the first).
    fn tell_session(&self, method: &str, params: Value) {
        if self.state().session.is_none() {
            return;
        }
        if let Err(e) = self.session.notify(method, params) {
            tracing::debug!(method, "the session is gone: {e}");
        }
    }
}

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

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::app_server::{AppServer, AppServerError, Incoming};
use super::wire::{self, Item, method as codex};
use crate::host_client::{FromSidecar, HostError, Link, Said};
use crate::protocol::host::*;

/// Requests to Codex that answer at once.
const QUICK: Duration = Duration::from_secs(30);
/// Requests to the session that answer at once.
const SESSION_QUICK: Duration = Duration::from_secs(30);
/// Requests to the session that wait for a person (the session applies
/// its own timeout).
const PERSON: Duration = Duration::from_secs(24 * 3600);
/// How often a thread not yet subscribed to is tried again, besides after
/// each of its status changes.
const SUBSCRIBE_RETRY: Duration = Duration::from_secs(2);
/// The most pages of `model/list` read (a page holds every model Codex
/// 0.171 knows).
const MODEL_PAGES: usize = 5;
/// Update ids remembered to drop a prompt delivered twice.
const SEEN: usize = 4096;
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
struct State {
    /// The thread the session is, once there is one.
    thread: Option<String>,
    /// Threads seen, so a thread that comes back (a status change of an
    /// old thread) does not take the session back to it.
    known: HashSet<String>,
    /// This connection gets the thread's events.
    subscribed: bool,
    /// The turn running, as far as the bridge saw.
    turn: Option<String>,
    /// Turns a prompt from the phone started or joined.
    phone_turns: HashSet<String>,
    /// The last agent message of the running turn: its answer.
    answer: Option<String>,
    /// File changes by item id, for the approval that follows them.
    changes: HashMap<String, Vec<wire::FileUpdate>>,
    /// Requests forwarded to the session, by Codex's request id.
    forwarded: HashMap<String, Forwarded>,
    seen: VecDeque<i64>,
    seen_set: HashSet<i64>,
    /// The model a turn from the phone is started with (a launched
    /// session's `/model`); none: the thread's.
    model: Option<String>,
}

pub struct Bridge {
    codex: AppServer,
    session: Link,
    mode: Mode,
    state: Mutex<State>,
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

impl Bridge {
    pub fn new(codex: AppServer, session: Link, mode: Mode) -> Arc<Self> {
        let model = match &mode {
            Mode::Alone(Opening::Start { model, .. }) => model.clone(),
            _ => None,
        };
        Arc::new(Self {
            codex,
            session,
            mode,
            state: Mutex::new(State {
                model,
                ..State::default()
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

    fn state(&self) -> MutexGuard<'_, State> {
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

    /// Runs until Codex's connection ends or [`Bridge::finish`]: reads what
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

    // ------------------------------------------------------------ the thread

    /// The thread at the start: opened by the bridge when alone; beside the
    /// TUI, one it already has loaded (the TUI may have been quicker).
    async fn open_thread(&self) -> Result<(), AppServerError> {
        match &self.mode {
            Mode::Alone(Opening::Start { cwd, model }) => {
                let opened: wire::WithThread = self
                    .codex
                    .request(
                        codex::THREAD_START,
                        &wire::ThreadStartParams {
                            cwd: cwd.clone(),
                            model: model.clone(),
                        },
                        QUICK,
                    )
                    .await?;
                // The connection that starts a thread gets its events.
                self.state().subscribed = true;
                self.name_after_folder(&opened.thread.id, cwd).await;
                self.adopt(opened.thread, "startup").await;
            }
            Mode::Alone(Opening::Resume { thread_id }) => {
                let opened: wire::WithThread = self
                    .codex
                    .request(
                        codex::THREAD_RESUME,
                        &wire::ThreadResumeParams {
                            thread_id: thread_id.clone(),
                            exclude_turns: true,
                        },
                        QUICK,
                    )
                    .await?;
                self.state().subscribed = true;
                self.adopt(opened.thread, "resume").await;
            }
            Mode::BesideTui => {
                let loaded: wire::LoadedThreads = self
                    .codex
                    .request(codex::THREAD_LOADED_LIST, &json!({}), QUICK)
                    .await?;
                for thread_id in loaded.data {
                    self.consider(&thread_id).await;
                }
            }
        }
        Ok(())
    }

    /// Names a thread the relay opened after its folder, as its topic is
    /// named. Codex writes nothing of a thread before its first turn, so
    /// one ended before that could not be resumed (`no rollout found`): a
    /// session started without a prompt, then ended, idle or caught by a
    /// restart of `serve`. Naming it writes it down.
    async fn name_after_folder(&self, thread_id: &str, cwd: &str) {
        let Some(name) = std::path::Path::new(cwd)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
        else {
            return;
        };
        let named: Result<Value, _> = self
            .codex
            .request(
                codex::THREAD_NAME_SET,
                &json!({"threadId": thread_id, "name": name}),
                QUICK,
            )
            .await;
        if let Err(e) = named {
            tracing::warn!(
                thread_id,
                "cannot name the thread (it cannot be resumed before its first turn): {e}"
            );
        }
    }

    /// A thread the TUI opened without a `thread/started` (a resumed one
    /// announces itself by its status only): adopted if it is new and a
    /// conversation.
    async fn consider(&self, thread_id: &str) {
        if !self.beside_tui() || self.state().known.contains(thread_id) {
            return;
        }
        let read: Result<wire::WithThread, _> = self
            .codex
            .request(
                codex::THREAD_READ,
                &json!({"threadId": thread_id, "includeTurns": false}),
                QUICK,
            )
            .await;
        match read {
            Ok(read) => self.adopt(read.thread, "resume").await,
            Err(e) => tracing::debug!(thread_id, "cannot read the thread: {e}"),
        }
    }

    /// Makes `thread` the session's: the first one initializes the
    /// session, a later one switches it (as pi's `/new` does).
    async fn adopt(&self, thread: wire::Thread, reason: &str) {
        {
            let mut state = self.state();
            if !state.known.insert(thread.id.clone()) && state.thread.is_some() {
                return;
            }
            if !thread.is_conversation() || state.thread.as_deref() == Some(&thread.id) {
                return;
            }
        }
        let info = json!({
            "id": thread.id,
            "file": super::session_file(&thread.id),
            "name": thread.name,
        });
        let first = self.state().thread.is_none();
        let said = if first {
            let cwd = thread
                .cwd
                .clone()
                .or_else(|| {
                    std::env::current_dir()
                        .ok()
                        .map(|d| d.display().to_string())
                })
                .unwrap_or_default();
            let params = json!({
                "protocolVersion": PROTOCOL_VERSION,
                "host": {"name": "codex", "version": ""},
                "pid": std::process::id(),
                "cwd": cwd,
                "session": info,
                "hasUI": false,
            });
            match self
                .session
                .request(method::INITIALIZE, params, SESSION_QUICK)
                .await
            {
                Ok(_) => self.session.notify(method::INITIALIZED, json!({})),
                Err(e) => Err(e),
            }
        } else {
            tracing::info!(thread = %thread.id, "Codex switched threads");
            self.session.notify(
                method::SESSION_STARTED,
                json!({"reason": reason, "session": info}),
            )
        };
        if let Err(e) = said {
            tracing::warn!("the session did not take Codex's thread: {e}");
            self.set_opened(Err(format!("the relay's session did not take it: {e}")));
            return;
        }
        self.set_opened(Ok(Opened {
            thread_id: thread.id.clone(),
            model: thread.model.clone(),
        }));
        {
            let mut state = self.state();
            let resumed_already = state.subscribed && matches!(self.mode, Mode::Alone(_));
            state.thread = Some(thread.id);
            state.subscribed = resumed_already;
            state.turn = None;
            state.answer = None;
        }
        self.try_subscribe.notify_one();
    }

    /// Subscribes to the session's thread whenever it is not yet.
    fn spawn_subscriber(self: Arc<Self>) {
        crate::tasks::spawn(async move {
            loop {
                tokio::select! {
                    () = self.stop.cancelled() => return,
                    () = self.try_subscribe.notified() => {}
                    () = tokio::time::sleep(SUBSCRIBE_RETRY) => {}
                }
                let Some(thread_id) = ({
                    let state = self.state();
                    state.thread.clone().filter(|_| !state.subscribed)
                }) else {
                    continue;
                };
                let resumed: Result<Value, _> = self
                    .codex
                    .request(
                        codex::THREAD_RESUME,
                        &wire::ThreadResumeParams {
                            thread_id: thread_id.clone(),
                            exclude_turns: true,
                        },
                        QUICK,
                    )
                    .await;
                match resumed {
                    Ok(_) => {
                        let mut state = self.state();
                        if state.thread.as_deref() == Some(&thread_id) {
                            state.subscribed = true;
                        }
                        tracing::debug!(thread_id, "subscribed to the thread");
                    }
                    // Before its first turn Codex has nothing to resume.
                    Err(e) => tracing::debug!(thread_id, "not subscribed yet: {e}"),
                }
            }
        });
    }

    fn ours(&self, thread_id: &str) -> bool {
        self.state().thread.as_deref() == Some(thread_id)
    }

    // ------------------------------------------------------------ Codex's notifications

    async fn on_notification(&self, method: &str, params: Value) {
        match method {
            codex::THREAD_STARTED => match serde_json::from_value::<wire::WithThread>(params) {
                Ok(started) if self.beside_tui() => self.adopt(started.thread, "new").await,
                Ok(_) => {}
                Err(e) => tracing::debug!("unreadable thread/started: {e}"),
            },
            codex::THREAD_STATUS_CHANGED => {
                let Ok(changed) = serde_json::from_value::<wire::ThreadStatusChanged>(params)
                else {
                    return;
                };
                if self.ours(&changed.thread_id) {
                    self.try_subscribe.notify_one();
                } else {
                    self.consider(&changed.thread_id).await;
                }
            }
            codex::TURN_STARTED => {
                if let Ok(turn) = serde_json::from_value::<wire::TurnEvent>(params)
                    && self.ours(&turn.thread_id)
                {
                    self.turn_started(&turn.turn.id);
                }
            }
            codex::TURN_COMPLETED => {
                if let Ok(turn) = serde_json::from_value::<wire::TurnEvent>(params)
                    && self.ours(&turn.thread_id)
                {
                    self.turn_completed(turn.turn);
                }
            }
            codex::ITEM_STARTED | codex::ITEM_COMPLETED => {
                match serde_json::from_value::<wire::ItemEvent>(params) {
                    Ok(event) if self.ours(&event.thread_id) => {
                        self.on_item(event.item, method == codex::ITEM_STARTED);
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!(method, "unreadable item: {e}"),
                }
            }
            codex::SERVER_REQUEST_RESOLVED => {
                if let Ok(resolved) = serde_json::from_value::<wire::ServerRequestResolved>(params)
                {
                    self.resolved(&resolved.request_id);
                }
            }
            _ => {}
        }
    }

    /// A turn began (seen, or started by the bridge itself before it could
    /// see the thread): the session is busy until it completes.
    fn turn_started(&self, turn_id: &str) {
        {
            let mut state = self.state();
            if state.turn.as_deref() == Some(turn_id) {
                return;
            }
            state.turn = Some(turn_id.to_string());
            state.answer = None;
        }
        self.activity.send_replace(std::time::Instant::now());
        self.tell_session(method::AGENT_STARTED, json!({}));
    }

    fn turn_completed(&self, turn: wire::Turn) {
        self.activity.send_replace(std::time::Instant::now());
        let answer = {
            let mut state = self.state();
            state.phone_turns.remove(&turn.id);
            state.changes.clear();
            state.turn = None;
            state.answer.take()
        };
        if turn.status == wire::TurnStatus::Failed {
            let why = turn
                .error
                .map(|e| e.message)
                .filter(|m| !m.trim().is_empty())
                .unwrap_or_else(|| "no reason given".into());
            self.tell_session(
                method::AGENT_NOTICE,
                json!({"text": format!("⚠️ Codex could not finish this turn: {why}")}),
            );
        }
        self.tell_session(
            method::AGENT_ENDED,
            json!({
                "lastAssistantText": answer,
                "aborted": turn.status == wire::TurnStatus::Interrupted,
            }),
        );
    }

    fn on_item(&self, item: Item, started: bool) {
        match item {
            Item::UserMessage {
                content, client_id, ..
            } if started => {
                // What the phone sent is not echoed back; what was typed
                // at the terminal is mirrored so the topic reads whole.
                let from_phone = client_id.is_some_and(|id| id.starts_with(FROM_PHONE));
                let text: Vec<String> = content
                    .into_iter()
                    .filter_map(|part| match part {
                        wire::UserInput::Text { text } => Some(text),
                        _ => None,
                    })
                    .collect();
                let source = if from_phone {
                    "extension"
                } else {
                    "interactive"
                };
                self.tell_session(
                    method::INPUT_RECEIVED,
                    json!({"text": text.join("\n"), "source": source}),
                );
            }
            Item::AgentMessage { text, .. } if !started && !text.trim().is_empty() => {
                self.state().answer = Some(text);
            }
            Item::CommandExecution {
                id,
                command,
                status,
            } => {
                let args = json!({"command": inner_command(&command)});
                self.tool(started, BASH, &id, args, status);
            }
            Item::FileChange {
                id,
                changes,
                status,
            } => {
                let args =
                    json!({"path": changes.first().map(|c| c.path.clone()).unwrap_or_default()});
                if started {
                    self.state().changes.insert(id.clone(), changes);
                }
                self.tool(started, EDIT, &id, args, status);
            }
            Item::McpToolCall {
                id,
                server,
                tool,
                arguments,
            } => {
                let name = format!("{server}.{tool}");
                self.tool(started, &name, &id, arguments, wire::ItemStatus::Other);
            }
            Item::DynamicToolCall {
                id,
                tool,
                arguments,
            } => self.tool(started, &tool, &id, arguments, wire::ItemStatus::Other),
            Item::WebSearch { id, query } => self.tool(
                started,
                "web_search",
                &id,
                json!({"query": query}),
                wire::ItemStatus::Other,
            ),
            _ => {}
        }
    }

    fn tool(&self, started: bool, name: &str, id: &str, args: Value, status: wire::ItemStatus) {
        if started {
            self.tell_session(
                method::TOOL_STARTED,
                json!({"toolName": name, "toolCallId": id, "args": args}),
            );
        } else {
            let failed = matches!(
                status,
                wire::ItemStatus::Failed | wire::ItemStatus::Declined
            );
            self.tell_session(
                method::TOOL_ENDED,
                json!({"toolName": name, "toolCallId": id, "isError": failed}),
            );
        }
    }

    /// A request of Codex's was answered, by the relay or another client
    /// (the TUI), or withdrawn (the turn ended): a question the phone still
    /// shows for it closes.
    fn resolved(&self, request_id: &Value) {
        let Some(forwarded) = self.state().forwarded.remove(&key(request_id)) else {
            return;
        };
        match forwarded {
            Forwarded::Approval { tool_call_id } => self.tell_session(
                method::APPROVAL_RESOLVED,
                json!({"toolCallId": tool_call_id}),
            ),
            Forwarded::Questions { ids } => {
                for id in ids {
                    self.tell_session(method::QUESTION_RESOLVED, json!({"id": id}));
                }
            }
        }
    }

    // ------------------------------------------------------------ Codex's requests

    async fn on_request(&self, id: Value, method: &str, params: Value) {
        let answered = match method {
            codex::COMMAND_APPROVAL => self.command_approval(&id, params).await,
            codex::FILE_CHANGE_APPROVAL => self.file_change_approval(&id, params).await,
            codex::PERMISSIONS_APPROVAL => self.permissions_approval(&id, params).await,
            codex::USER_INPUT => self.user_input(&id, params).await,
            other => {
                tracing::debug!(
                    method = other,
                    "a request of Codex's the relay leaves alone"
                );
                return;
            }
        };
        if let Err(e) = answered {
            tracing::warn!(method, "cannot answer Codex: {e}");
        }
    }

    /// Whether the relay answers a request it forwarded and got `by` back:
    /// not once it was resolved elsewhere, and beside the TUI not when the
    /// relay did not decide (the TUI asks it already).
    fn answers(&self, id: &Value, decision: Decision, by: DecidedBy) -> bool {
        let still_open = self.state().forwarded.remove(&key(id)).is_some();
        if !still_open {
            return false;
        }
        let undecided = decision == Decision::Defer || by == DecidedBy::Unavailable;
        !(undecided && self.beside_tui())
    }

    async fn approve(
        &self,
        id: &Value,
        turn_id: &str,
        tool_call_id: &str,
        tool: &str,
        mut input: Value,
        reason: Option<String>,
    ) -> Option<ApprovalResult> {
        // Codex's own words for why it asks reach the phone as the call's
        // description.
        if let Some(reason) = reason.filter(|r| !r.trim().is_empty()) {
            input["description"] = reason.into();
        }
        let from_telegram = match &self.mode {
            Mode::Alone(_) => true,
            Mode::BesideTui => self.state().phone_turns.contains(turn_id),
        };
        self.state().forwarded.insert(
            key(id),
            Forwarded::Approval {
                tool_call_id: tool_call_id.to_string(),
            },
        );
        let params = ApprovalParams {
            tool_call_id: tool_call_id.to_string(),
            tool: tool.to_string(),
            input,
            from_telegram,
        };
        let asked = match serde_json::to_value(&params) {
            Ok(params) => self
                .session
                .request(method::APPROVAL_REQUEST, params, PERSON)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let decided = asked
            .and_then(|v| serde_json::from_value::<ApprovalResult>(v).map_err(|e| e.to_string()))
            .unwrap_or_else(|why| ApprovalResult {
                decision: Decision::Deny,
                reason: Some(format!("the relay could not ask ({why})")),
                by: DecidedBy::Unavailable,
                for_session: false,
            });
        self.answers(id, decided.decision, decided.by)
            .then_some(decided)
    }

    async fn command_approval(&self, id: &Value, params: Value) -> Result<(), AppServerError> {
        let Ok(asked) = serde_json::from_value::<wire::CommandApproval>(params) else {
            return Ok(());
        };
        if !self.ours(&asked.thread_id) {
            return Ok(());
        }
        let command = asked
            .command
            .as_deref()
            .map(inner_command)
            .or_else(|| {
                (!asked.command_actions.is_empty()).then(|| {
                    asked
                        .command_actions
                        .iter()
                        .map(|a| a.command.as_str())
                        .collect::<Vec<_>>()
                        .join(" && ")
                })
            })
            .unwrap_or_default();
        let input = json!({"command": command});
        let Some(decided) = self
            .approve(
                id,
                &asked.turn_id,
                &asked.item_id,
                BASH,
                input,
                asked.reason,
            )
            .await
        else {
            return Ok(());
        };
        self.codex.respond(
            id,
            &wire::ApprovalAnswer {
                decision: codex_decision(&decided, self.beside_tui()),
            },
        )
    }

    async fn file_change_approval(&self, id: &Value, params: Value) -> Result<(), AppServerError> {
        let Ok(asked) = serde_json::from_value::<wire::FileChangeApproval>(params) else {
            return Ok(());
        };
        if !self.ours(&asked.thread_id) {
            return Ok(());
        }
        let changes = self
            .state()
            .changes
            .get(&asked.item_id)
            .cloned()
            .unwrap_or_default();
        let input = change_input(&changes, asked.grant_root.as_deref());
        let Some(decided) = self
            .approve(
                id,
                &asked.turn_id,
                &asked.item_id,
                EDIT,
                input,
                asked.reason,
            )
            .await
        else {
            return Ok(());
        };
        self.codex.respond(
            id,
            &wire::ApprovalAnswer {
                decision: codex_decision(&decided, self.beside_tui()),
            },
        )
    }

    async fn permissions_approval(&self, id: &Value, params: Value) -> Result<(), AppServerError> {
        let Ok(asked) = serde_json::from_value::<wire::PermissionsApproval>(params) else {
            return Ok(());
        };
        if !self.ours(&asked.thread_id) {
            return Ok(());
        }
        let input = json!({"permissions": asked.permissions.clone()});
        let Some(decided) = self
            .approve(
                id,
                &asked.turn_id,
                &asked.item_id,
                PERMISSIONS,
                input,
                asked.reason,
            )
            .await
        else {
            return Ok(());
        };
        let allowed =
            codex_decision(&decided, self.beside_tui()) != wire::ApprovalDecision::Decline;
        self.codex.respond(
            id,
            &wire::PermissionsAnswer {
                // Nothing granted is a refusal.
                permissions: if allowed {
                    asked.permissions
                } else {
                    json!({})
                },
                scope: if decided.for_session {
                    "session"
                } else {
                    "turn"
                },
            },
        )
    }

    /// The model asks its user: each question on the phone (not a secret
    /// one), in turn.
    async fn user_input(&self, id: &Value, params: Value) -> Result<(), AppServerError> {
        let Ok(asked) = serde_json::from_value::<wire::UserInputRequest>(params) else {
            return Ok(());
        };
        if !self.ours(&asked.thread_id) {
            return Ok(());
        }
        let ids: Vec<String> = asked
            .questions
            .iter()
            .map(|q| format!("{}:{}", key(id), q.id))
            .collect();
        self.state()
            .forwarded
            .insert(key(id), Forwarded::Questions { ids: ids.clone() });
        let mut answer = wire::UserInputAnswer::default();
        let mut unanswered = false;
        for (question, question_id) in asked.questions.iter().zip(ids) {
            if question.is_secret {
                unanswered = true;
                continue;
            }
            let options: Vec<String> = question
                .options
                .iter()
                .flatten()
                .map(|o| o.label.clone())
                .collect();
            let mut text = match question.header.trim() {
                "" => question.question.clone(),
                header => format!("{header}: {}", question.question),
            };
            for option in question.options.iter().flatten() {
                if !option.description.trim().is_empty() {
                    text.push_str(&format!("\n• {}: {}", option.label, option.description));
                }
            }
            let params = QuestionParams {
                question: text,
                allow_text: question.is_other || options.is_empty(),
                options,
                timeout_ms: None,
                id: Some(question_id),
            };
            let said = match serde_json::to_value(&params) {
                Ok(params) => self
                    .session
                    .request(method::QUESTION_ASK, params, PERSON)
                    .await
                    .ok()
                    .and_then(|v| serde_json::from_value::<QuestionResult>(v).ok()),
                Err(_) => None,
            };
            match said.and_then(|r| r.answer) {
                Some(text) => {
                    answer.answers.insert(
                        question.id.clone(),
                        wire::Answers {
                            answers: vec![text],
                        },
                    );
                }
                None => unanswered = true,
            }
            if !self.state().forwarded.contains_key(&key(id)) {
                // Answered at the terminal meanwhile.
                return Ok(());
            }
        }
        if self.state().forwarded.remove(&key(id)).is_none() || (unanswered && self.beside_tui()) {
            return Ok(());
        }
        self.codex.respond(id, &answer)
    }

    // ------------------------------------------------------------ the session's requests

    fn tell_session(&self, method: &str, params: Value) {
        if self.state().thread.is_none() {
            return;
        }
        if let Err(e) = self.session.notify(method, params) {
            tracing::debug!(method, "the session is gone: {e}");
        }
    }

    /// Answers what the session asks of its host, until it is gone.
    fn spawn_session_loop(self: Arc<Self>, mut from: mpsc::UnboundedReceiver<Said>) {
        crate::tasks::spawn(async move {
            while let Some(Said { message, .. }) = from.recv().await {
                match message {
                    FromSidecar::Request { id, method, params } => {
                        let me = self.clone();
                        crate::tasks::spawn(async move {
                            let sent = match me.on_session_request(&method, params).await {
                                Ok(result) => me.session.respond(id, result),
                                Err((code, why)) => me.session.respond_error(id, code, &why),
                            };
                            if let Err(e) = sent {
                                tracing::debug!("the session is gone: {e}");
                            }
                        });
                    }
                    FromSidecar::Notification { method, params } => {
                        // The status line and notices: the TUI has no place
                        // for them, the log has.
                        tracing::debug!(method, %params, "from the session");
                    }
                    FromSidecar::Response(_) | FromSidecar::NotJson(_) => {}
                }
            }
        });
    }

    async fn on_session_request(
        &self,
        method: &str,
        params: Value,
    ) -> Result<Value, (i64, String)> {
        match method {
            method::AGENT_SEND_USER_MESSAGE => {
                let params: SendUserMessageParams = serde_json::from_value(params)
                    .map_err(|e| (-32602, format!("Invalid params: {e}")))?;
                self.prompt(params).await
            }
            method::AGENT_ABORT => self.interrupt().await,
            _ => Err((-32601, format!("Method not found: {method}"))),
        }
    }

    /// A prompt from the topic starts a turn on the thread, or joins the
    /// one running.
    async fn prompt(&self, params: SendUserMessageParams) -> Result<Value, (i64, String)> {
        let update_id = params.origin.update_id;
        let (thread_id, model) = {
            let mut state = self.state();
            if !state.seen_set.insert(update_id) {
                return Ok(json!({"accepted": true}));
            }
            state.seen.push_back(update_id);
            if state.seen.len() > SEEN
                && let Some(old) = state.seen.pop_front()
            {
                state.seen_set.remove(&old);
            }
            (state.thread.clone(), state.model.clone())
        };
        let forget = || {
            let mut state = self.state();
            state.seen_set.remove(&update_id);
        };
        let Some(thread_id) = thread_id else {
            forget();
            return Err((-32000, "Codex has no thread open yet".into()));
        };
        let mut input = vec![wire::UserInput::Text { text: params.text }];
        input.extend(
            params
                .attachments
                .iter()
                .filter(|a| a.kind == AttachmentKind::Photo)
                .map(|a| wire::UserInput::LocalImage {
                    path: a.path.clone(),
                }),
        );
        let started: Result<TurnOnly, _> = self
            .codex
            .request(
                codex::TURN_START,
                &wire::TurnStartParams {
                    thread_id,
                    input,
                    client_user_message_id: format!("{FROM_PHONE}{update_id}"),
                    model,
                },
                QUICK,
            )
            .await;
        match started {
            Ok(started) => {
                self.state().phone_turns.insert(started.turn.id.clone());
                self.turn_started(&started.turn.id);
                self.try_subscribe.notify_one();
                Ok(json!({"accepted": true}))
            }
            Err(e) => {
                forget();
                Err((-32000, format!("Codex did not take the message: {e}")))
            }
        }
    }

    /// `/stop`: the running turn is interrupted.
    async fn interrupt(&self) -> Result<Value, (i64, String)> {
        let (thread_id, turn_id) = {
            let state = self.state();
            (state.thread.clone(), state.turn.clone())
        };
        let (Some(thread_id), Some(turn_id)) = (thread_id, turn_id) else {
            return Err((-32000, "Codex is not working on anything".into()));
        };
        self.codex
            .request::<_, Value>(
                codex::TURN_INTERRUPT,
                &wire::TurnInterruptParams { thread_id, turn_id },
                QUICK,
            )
            .await
            .map(|_| json!({}))
            .map_err(|e| (-32000, e.to_string()))
    }

    /// The models Codex offers a person (not the hidden ones), as
    /// `model/list` pages them: what a turn names, and what the phone shows.
    pub async fn models(
        &self,
    ) -> Result<Vec<crate::protocol::launch::ModelChoice>, AppServerError> {
        let mut models = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MODEL_PAGES {
            let page: wire::ModelList = self
                .codex
                .request(codex::MODEL_LIST, &json!({"cursor": cursor}), QUICK)
                .await?;
            models.extend(page.data.into_iter().filter(|m| !m.hidden).map(|m| {
                let label = if m.display_name.trim().is_empty() {
                    m.model.clone()
                } else {
                    m.display_name
                };
                crate::protocol::launch::ModelChoice { id: m.model, label }
            }));
            cursor = page.next_cursor;
            if cursor.is_none() {
                break;
            }
        }
        Ok(models)
    }

    /// `file/send` through the session, for the relay's tool
    /// ([`super::tools`]): the session checks the path against the policy
    /// and the leader uploads the file; a refusal says why.
    pub async fn send_file(&self, params: &SendFileParams) -> Result<SendFileResult, String> {
        let params = serde_json::to_value(params).map_err(|e| e.to_string())?;
        let sent = self
            .session
            .request(method::FILE_SEND, params, crate::mcp::SEND_FILE_WAIT)
            .await
            .map_err(|e| match e {
                HostError::Rpc { message, .. } => message,
                other => other.to_string(),
            })?;
        serde_json::from_value(sent).map_err(|e| e.to_string())
    }

    /// A request to the session, for the launch engine (a command typed in
    /// the topic it handles itself).
    pub async fn ask_session(&self, method: &str, params: Value) -> Result<Value, HostError> {
        self.session.request(method, params, SESSION_QUICK).await
    }
}

/// The result of `turn/start`.
#[derive(serde::Deserialize)]
struct TurnOnly {
    turn: wire::Turn,
}

/// How the session's decision goes back to Codex. Beside the TUI a request
/// the relay did not decide is never answered (see [`Bridge::answers`]);
/// alone, "no approval needed" lets it run and nobody to ask refuses it.
fn codex_decision(decided: &ApprovalResult, beside_tui: bool) -> wire::ApprovalDecision {
    match (decided.decision, decided.by) {
        (Decision::Allow, _) if decided.for_session => wire::ApprovalDecision::AcceptForSession,
        (Decision::Allow, _) => wire::ApprovalDecision::Accept,
        (Decision::Defer, by) if by != DecidedBy::Unavailable && !beside_tui => {
            wire::ApprovalDecision::Accept
        }
        _ => wire::ApprovalDecision::Decline,
    }
}

/// The command a person would read: Codex runs every command as
/// `/bin/bash -lc '<command>'`, and the policy's patterns (`^git push`)
/// are about what is inside.
fn inner_command(command: &str) -> String {
    let Some(words) = shlex::split(command) else {
        return command.to_string();
    };
    match words.as_slice() {
        [shell, flag, inner]
            if ["bash", "sh", "zsh"]
                .contains(&shell.rsplit('/').next().unwrap_or(shell.as_str()))
                && flag.starts_with('-')
                && flag.ends_with('c') =>
        {
            inner.clone()
        }
        _ => command.to_string(),
    }
}

/// A file change as the approval shows it: the first path outside the
/// project if any (the policy's `outside_project` reads `path`), and every
/// file's diff.
fn change_input(changes: &[wire::FileUpdate], grant_root: Option<&str>) -> Value {
    let path = changes
        .iter()
        .map(|c| c.path.clone())
        .next()
        .or_else(|| grant_root.map(str::to_string))
        .unwrap_or_default();
    let diff: Vec<String> = changes
        .iter()
        .map(|c| format!("{}\n{}", c.path, c.diff.trim_end()))
        .collect();
    let mut input = json!({"path": path, "diff": diff.join("\n")});
    if let Some(root) = grant_root {
        input["grantRoot"] = root.into();
    }
    input
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_shown_is_the_one_inside_codexs_shell() {
        assert_eq!(
            inner_command("/bin/bash -lc 'touch made && echo made'"),
            "touch made && echo made"
        );
        assert_eq!(
            inner_command(r#"/bin/bash -lc 'echo '"'"'hi'"'"''"#),
            "echo 'hi'"
        );
        assert_eq!(
            inner_command("git push origin main"),
            "git push origin main"
        );
        assert_eq!(inner_command("/bin/bash -lc"), "/bin/bash -lc");
        assert_eq!(inner_command("unbalanced 'quote"), "unbalanced 'quote");
    }

    fn decided(decision: Decision, by: DecidedBy, for_session: bool) -> ApprovalResult {
        ApprovalResult {
            decision,
            reason: None,
            by,
            for_session,
        }
    }

    #[test]
    fn the_three_buttons_are_codexs_three_decisions() {
        use wire::ApprovalDecision::*;
        let phone = DecidedBy::Phone;
        assert_eq!(
            codex_decision(&decided(Decision::Allow, phone, false), true),
            Accept
        );
        assert_eq!(
            codex_decision(&decided(Decision::Allow, phone, true), true),
            AcceptForSession
        );
        assert_eq!(
            codex_decision(&decided(Decision::Deny, phone, false), true),
            Decline
        );
        // Alone, no approval needed runs it and nobody to ask refuses it.
        let policy = DecidedBy::Policy;
        assert_eq!(
            codex_decision(&decided(Decision::Defer, policy, false), false),
            Accept
        );
        let nobody = DecidedBy::Unavailable;
        assert_eq!(
            codex_decision(&decided(Decision::Deny, nobody, false), false),
            Decline
        );
    }

    #[test]
    fn a_file_change_shows_every_diff_and_the_path_the_policy_reads() {
        let changes = vec![
            wire::FileUpdate {
                path: "/p/a.rs".into(),
                diff: "@@ -1 +1 @@\n-a\n+b\n".into(),
            },
            wire::FileUpdate {
                path: "/p/b.rs".into(),
                diff: "+c".into(),
            },
        ];
        let input = change_input(&changes, None);
        assert_eq!(input["path"], "/p/a.rs");
        assert_eq!(input["diff"], "/p/a.rs\n@@ -1 +1 @@\n-a\n+b\n/p/b.rs\n+c");
    }
}

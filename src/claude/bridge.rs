//! The bridge plays host to the in-process session, on Claude Code's
//! behalf: what Claude Code says (MCP tools, channel permission requests,
//! hook events) becomes host-protocol requests and events, and what the
//! session asks of its host (prompts from the topic) becomes channel
//! notifications or waits in the inbox for the `telegram_inbox` tool.
//!
//! The session starts when Claude Code says which session it is: the
//! SessionStart hook (authoritative), else the first tool call or, after a
//! short grace, the MCP server's environment (`CLAUDE_CODE_SESSION_ID`).
//! A SessionStart naming another session (`/clear`, `/resume`) switches
//! the session to it, as pi's `/new` does.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::ClaudeEnv;
use crate::config::{Config, ConfigError};
use crate::host::HostLink;
use crate::host_client::{FromSidecar, HostError, Link, Said};
use crate::protocol::claude::{HookAnswer, HookCall, HookInput};
use crate::protocol::host::*;

/// How long the MCP server waits for the SessionStart hook before it
/// starts the session from its own environment.
pub(super) const HOOK_GRACE: Duration = Duration::from_secs(3);
/// Requests to the session that answer at once.
const QUICK: Duration = Duration::from_secs(30);
/// `/telegram-connect` waits 15 s for the registration; a little more.
const CONNECT: Duration = Duration::from_secs(20);
/// Requests that wait for a person (the session applies its own timeout).
const PERSON: Duration = Duration::from_secs(24 * 3600);
/// Messages kept for `telegram_inbox`, at most (the oldest go first, and
/// the topic is told).
const INBOX: usize = 256;
/// The MCP method that pushes a message into Claude Code as a turn.
pub(super) const CHANNEL: &str = "notifications/claude/channel";
/// How long a channel message may wait for a turn before the topic hears
/// where it waits.
const CHANNEL_GRACE: Duration = Duration::from_secs(15);
/// What the topic hears about a message no turn took (no turn runs, so no
/// Stop hook will hand it over).
const WAITING_NOTICE: &str = "📥 Claude Code has not taken this yet: no turn is running at its terminal. It reads messages from here when a turn ends (or the agent checks its inbox, the telegram_inbox tool), or at once where Claude Code's channels are on. To have every message start a turn, start the session from here instead: /new <folder> claude.";
/// What the model reads when a turn would end with messages from the phone
/// waiting: the Stop hook's reason, and the turn goes on with them.
const STOP_REASON: &str = "The user sent these messages from Telegram while you were working. Answer them now, in this turn:";
/// How the bridge answers a channel permission request.
pub(super) const CHANNEL_PERMISSION: &str = "notifications/claude/channel/permission";

/// A message from the topic that no turn has taken yet.
#[derive(Debug, Clone)]
pub(super) struct Unread {
    pub text: String,
    pub origin: MessageOrigin,
    /// The files that came with it, saved in the session's inbox (the
    /// text names their paths too).
    pub attachments: Vec<Attachment>,
    pub at_ms: u64,
}

/// What the bridge knows of Claude Code and of the session it plays host to.
#[derive(Default)]
struct ClaudeState {
    /// The Claude Code session the relay session is, once started.
    session_id: Option<String>,
    cwd: Option<String>,
    /// Push prompts as channel notifications (the client takes them).
    channel: bool,
    inbox: VecDeque<Unread>,
    /// The topic was told that messages wait for `telegram_inbox` (once
    /// per batch: reset when the inbox is read).
    told_waiting: bool,
    seen: crate::ids::RecentUpdates,
    /// The current turn came from Telegram (its prompt was a channel message).
    from_telegram: bool,
    /// Approvals waiting for the phone right now.
    approvals_open: u32,
    /// A turn runs at Claude Code's terminal (UserPromptSubmit to Stop): a
    /// message from the phone waits for its Stop hook, which hands it over.
    turn_running: bool,
    /// Claude Code's transcript of the session (every hook names it).
    transcript: Option<std::path::PathBuf>,
}

/// The host of Claude Code's session, played between Claude Code (its MCP
/// server and hooks) and the session.
pub struct ClaudeBridge {
    session: Link,
    mcp: OnceLock<HostLink>,
    pub(super) env: ClaudeEnv,
    auto_connect: bool,
    state: Mutex<ClaudeState>,
    /// Serializes starting and switching the session.
    start: tokio::sync::Mutex<()>,
    pub(super) stop: tokio_util::sync::CancellationToken,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl ClaudeBridge {
    pub(super) fn new(
        session: Link,
        config: &Result<Config, ConfigError>,
        env: ClaudeEnv,
    ) -> Arc<Self> {
        Arc::new(Self {
            session,
            mcp: OnceLock::new(),
            env,
            auto_connect: config.as_ref().is_ok_and(|c| c.auto_connect),
            state: Mutex::default(),
            start: tokio::sync::Mutex::new(()),
            stop: tokio_util::sync::CancellationToken::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, ClaudeState> {
        lock(&self.state)
    }

    pub(super) fn set_mcp(&self, link: HostLink) {
        let _ = self.mcp.set(link);
    }

    /// The client takes `notifications/claude/channel`.
    pub(super) fn use_channel(&self, yes: bool) {
        self.state().channel = yes;
    }

    pub(super) fn interactive(&self) -> bool {
        self.env.interactive()
    }

    // ------------------------------------------------------------ the session

    /// Starts the session as `session_id` (or switches it there), unless it
    /// is that session already. `wait`: until it is on the relay.
    pub(super) async fn ensure_session(
        &self,
        session_id: Option<&str>,
        cwd: Option<&str>,
        reason: &str,
        wait: bool,
    ) -> Result<Option<String>, String> {
        let _one_at_a_time = self.start.lock().await;
        let (current, known_cwd) = {
            let state = self.state();
            (state.session_id.clone(), state.cwd.clone())
        };
        let Some(session_id) = session_id
            .map(str::to_string)
            .or_else(|| current.clone())
            .or_else(|| self.env.session_id.clone())
        else {
            return Err("Claude Code did not say which session this is".into());
        };
        let cwd = cwd
            .map(str::to_string)
            .or(known_cwd)
            .or_else(|| self.env.project_dir.clone())
            .or_else(|| {
                std::env::current_dir()
                    .ok()
                    .map(|d| d.display().to_string())
            })
            .unwrap_or_default();
        let info = json!({"id": session_id, "file": super::session_file(&session_id)});
        match current {
            Some(current) if current == session_id => {}
            Some(_) => {
                tracing::info!(%session_id, reason, "Claude Code switched sessions");
                self.session
                    .notify(
                        method::SESSION_STARTED,
                        json!({"reason": reason, "session": info}),
                    )
                    .map_err(|e| e.to_string())?;
                self.state().session_id = Some(session_id);
            }
            None => {
                self.initialize_session(info, &cwd).await?;
                let mut state = self.state();
                state.session_id = Some(session_id);
                state.cwd = Some(cwd);
            }
        }
        if !(wait && self.auto_connect) {
            return Ok(None);
        }
        self.connect_session().await.map(Some)
    }

    /// The session's `initialize` (and `initialized`) as `info` in `cwd`.
    async fn initialize_session(&self, info: Value, cwd: &str) -> Result<(), String> {
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "host": {"name": "claude-code", "version": ""},
            "pid": std::os::unix::process::parent_id(),
            "cwd": cwd,
            "session": info,
            "hasUI": false,
            // `agent/abort` is refused: Claude Code at its keyboard is
            // stopped there (Esc), so no stop button is offered.
            "canAbort": false,
            // Claude Code at its keyboard fetches the topic's messages
            // itself (`telegram_inbox`) when a turn asks: nothing can go
            // into the turn that runs, so nothing is offered to steer.
            "canSteer": false,
        });
        self.session
            .request(method::INITIALIZE, params, QUICK)
            .await
            .map_err(|e| e.to_string())?;
        self.session
            .notify(method::INITIALIZED, json!({}))
            .map_err(|e| e.to_string())
    }

    /// Has the session join the relay: idempotent, it waits for the
    /// registration; where it went, or why not.
    async fn connect_session(&self) -> Result<String, String> {
        let result = self
            .session
            .request(
                method::COMMAND_EXECUTE,
                json!({"name": "telegram-connect", "args": ""}),
                CONNECT,
            )
            .await
            .map_err(|e| e.to_string())?;
        let message = result["message"].as_str().unwrap_or_default().to_string();
        if result["ok"].as_bool() == Some(true) {
            Ok(message)
        } else {
            Err(message)
        }
    }

    /// Starts the session from the environment if nothing did within the
    /// grace (no hooks installed).
    pub(super) fn start_after_grace(self: Arc<Self>) {
        crate::tasks::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(HOOK_GRACE) => {}
                () = self.stop.cancelled() => return,
            }
            if self.state().session_id.is_none()
                && let Err(e) = self.ensure_session(None, None, "startup", false).await
            {
                tracing::warn!("cannot start the session: {e}");
            }
        });
    }

    /// A request to the session, started first if it was not.
    pub(super) async fn ask_session(
        &self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, String> {
        if self.state().session_id.is_none() {
            // Claude Code called a tool before any hook said which session
            // this is: start from the environment. A question waits to be
            // on the relay (it waits for a person anyway); what hands
            // something over answers within 2 s, the joining included.
            let wait = method == method::QUESTION_ASK;
            if let Err(e) = self.ensure_session(None, None, "startup", wait).await {
                tracing::warn!("the session is not on the relay: {e}");
            }
        }
        self.session
            .request(method, params, timeout)
            .await
            .map_err(|e| match e {
                HostError::Rpc { message, .. } => message,
                other => other.to_string(),
            })
    }

    fn tell_session(&self, method: &str, params: Value) {
        if self.state().session_id.is_none() {
            return;
        }
        if let Err(e) = self.session.notify(method, params) {
            tracing::debug!(method, "the session is gone: {e}");
        }
    }

    /// Answers what the session asks of its host, until it is gone.
    pub(super) fn spawn_session_loop(self: Arc<Self>, mut from: mpsc::UnboundedReceiver<Said>) {
        crate::tasks::spawn(async move {
            while let Some(Said { message, .. }) = from.recv().await {
                match message {
                    FromSidecar::Request { id, method, params } => {
                        let answer = self.on_session_request(&method, params);
                        let sent = match answer {
                            Ok(result) => self.session.respond(id, result),
                            Err((code, why)) => self.session.respond_error(id, code, &why),
                        };
                        if sent.is_err() {
                            break;
                        }
                    }
                    FromSidecar::Notification { method, params } => {
                        tracing::debug!(method, %params, "from the session");
                    }
                    FromSidecar::Response(_) | FromSidecar::NotJson(_) => {}
                }
            }
        });
    }

    fn on_session_request(
        self: &Arc<Self>,
        method: &str,
        params: Value,
    ) -> Result<Value, (i64, String)> {
        match method {
            method::AGENT_SEND_USER_MESSAGE => {
                let params: SendUserMessageParams = serde_json::from_value(params)
                    .map_err(|e| (-32602, format!("Invalid params: {e}")))?;
                self.deliver(params);
                // Taken when a turn takes it (a channel turn, or
                // `telegram_inbox`): until then the relay keeps it.
                Ok(json!({"accepted": true, "queued": true}))
            }
            method::AGENT_ABORT => Err((
                -32000,
                "Claude Code cannot be stopped from Telegram; press Esc in its terminal".into(),
            )),
            _ => Err((-32601, format!("Method not found: {method}"))),
        }
    }

    /// A prompt from the topic: into the inbox, and to Claude Code as a
    /// channel message when it takes those.
    fn deliver(self: &Arc<Self>, params: SendUserMessageParams) {
        let waiting = Unread {
            text: params.text,
            origin: params.origin,
            attachments: params.attachments,
            at_ms: now_ms(),
        };
        let (channel, dropped, update_id, turn_running) = {
            let mut state = self.state();
            let id = waiting.origin.update_id;
            if !state.seen.insert(id) {
                return;
            }
            state.inbox.push_back(waiting.clone());
            let dropped = (state.inbox.len() > INBOX).then(|| state.inbox.pop_front());
            (state.channel, dropped.flatten(), id, state.turn_running)
        };
        // Only a channel message can start a turn, and Claude Code may
        // ignore channels (print mode, or channels off): when no turn took
        // the message in a while — at once without channels — the topic is
        // told where it waits, once per batch, so it does not seem lost.
        let grace = if channel {
            CHANNEL_GRACE
        } else {
            Duration::ZERO
        };
        let me = Arc::clone(self);
        crate::tasks::spawn(async move {
            tokio::time::sleep(grace).await;
            // A running turn's Stop hook hands the message over; only a
            // message still waiting once no turn runs is one to tell of.
            if turn_running && !channel {
                return;
            }
            let tell = {
                let mut state = me.state();
                let waiting = state.inbox.iter().any(|w| w.origin.update_id == update_id);
                waiting && !std::mem::replace(&mut state.told_waiting, true)
            };
            if tell {
                me.tell_session(method::AGENT_NOTICE, json!({"text": WAITING_NOTICE}));
            }
        });
        if let Some(dropped) = dropped {
            self.tell_session(
                method::AGENT_NOTICE,
                json!({"text": format!("⚠️ {INBOX} messages are waiting unread; this one was dropped: {}", crate::policy::clip(&dropped.text, 200))}),
            );
        }
        if channel && let Some(mcp) = self.mcp.get() {
            mcp.notify(CHANNEL, &channel_params(&waiting));
        }
    }

    /// The messages no turn has taken yet; a turn takes them now.
    pub(super) fn take_inbox(&self) -> Vec<Unread> {
        let taken: Vec<Unread> = {
            let mut state = self.state();
            state.told_waiting = false;
            state.inbox.drain(..).collect()
        };
        self.taken(taken.iter().map(|w| w.origin.update_id).collect());
        taken
    }

    /// Tells the session a turn took these messages: the relay may forget
    /// them now.
    fn taken(&self, update_ids: Vec<i64>) {
        if !update_ids.is_empty() {
            self.tell_session(method::AGENT_TAKEN, json!({"updateIds": update_ids}));
        }
    }

    /// Says in the topic what nobody read, before the session ends: the
    /// relay keeps it for this session, which gets it when it is resumed.
    pub(super) async fn finish(&self) {
        self.stop.cancel();
        self.failed_unseen().await;
        let unread: Vec<Unread> = {
            let mut state = self.state();
            state.inbox.drain(..).collect()
        };
        if unread.is_empty() {
            return;
        }
        let mut text = format!(
            "⏸ This Claude Code session ended before it read {} message(s) sent here; they are kept and reach it when it is resumed (claude --resume or --continue):",
            unread.len()
        );
        for waiting in &unread {
            text.push_str(&format!("\n• {}", crate::policy::clip(&waiting.text, 300)));
        }
        let sent = self
            .session
            .request(
                method::TOPIC_SEND,
                json!({"text": text}),
                Duration::from_secs(3),
            )
            .await;
        if let Err(e) = sent {
            tracing::warn!("cannot tell the topic what went unread: {e}");
        }
    }

    // ------------------------------------------------------------ approvals

    /// Asks the session whether a tool call may run (its `[approvals]`
    /// policy, the phone). A turn counts as from Telegram when its prompt
    /// came from the topic, or when nobody sits at the terminal (print
    /// mode), where Claude Code would refuse the call otherwise.
    pub(super) async fn approve(&self, id: &str, tool: &str, input: Value) -> ApprovalResult {
        let from_telegram = self.state().from_telegram || !self.interactive();
        let params = ApprovalParams {
            tool_call_id: id.to_string(),
            tool: tool.to_string(),
            input,
            from_telegram,
        };
        self.state().approvals_open += 1;
        let asked = match serde_json::to_value(&params) {
            Ok(params) => {
                self.ask_session(method::APPROVAL_REQUEST, params, PERSON)
                    .await
            }
            Err(e) => Err(e.to_string()),
        };
        self.state().approvals_open -= 1;
        match asked.and_then(|v| serde_json::from_value(v).map_err(|e| e.to_string())) {
            Ok(result) => result,
            Err(why) => ApprovalResult {
                decision: Decision::Deny,
                reason: Some(format!("Denied: the relay could not ask ({why}).")),
                by: DecidedBy::Unavailable,
                for_session: false,
            },
        }
    }

    /// `notifications/claude/channel/permission_request`: the terminal's
    /// permission dialog, relayed; the answer goes back as
    /// `notifications/claude/channel/permission`, none when the relay does
    /// not decide (the dialog stays).
    pub(super) fn relay_permission(self: Arc<Self>, params: Value) {
        crate::tasks::spawn(async move {
            let Some(request_id) = params["request_id"].as_str().map(str::to_string) else {
                tracing::warn!("a channel permission request without request_id");
                return;
            };
            let tool = params["tool_name"].as_str().unwrap_or("tool").to_string();
            let preview = params["input_preview"].as_str().unwrap_or_default();
            let input = serde_json::from_str::<Value>(preview)
                .ok()
                .filter(Value::is_object)
                .unwrap_or_else(|| json!({"description": params["description"], "input": preview}));
            let decided = self.approve(&request_id, &tool, input).await;
            let behavior = match decided.decision {
                Decision::Allow => "allow",
                Decision::Deny => "deny",
                Decision::Defer => return,
            };
            if let Some(mcp) = self.mcp.get() {
                mcp.notify(
                    CHANNEL_PERMISSION,
                    &json!({"request_id": request_id, "behavior": behavior}),
                );
            }
        });
    }

    // ------------------------------------------------------------ hooks

    /// One hook event from `agent-relay hook`.
    pub(super) async fn on_hook(&self, call: HookCall) -> HookAnswer {
        let input: HookInput = serde_json::from_value(call.input.clone()).unwrap_or_default();
        let session_id = (!input.session_id.is_empty()).then_some(input.session_id.as_str());
        let cwd = (!input.cwd.is_empty()).then_some(input.cwd.as_str());
        let event = call.event.as_str();
        if !input.transcript_path.is_empty() {
            self.state().transcript = Some(input.transcript_path.clone().into());
        }
        if event != "SessionStart" && self.state().session_id.as_deref() != session_id {
            // A hook of a session the relay session is not (yet): say which.
            if let Err(e) = self.ensure_session(session_id, cwd, "resume", false).await {
                return note(format!("agent-relay: {e}"));
            }
        }
        match event {
            "SessionStart" => {
                let reason = input.source.as_deref().unwrap_or("startup");
                match self.ensure_session(session_id, cwd, reason, true).await {
                    Ok(Some(message)) => note(format!("agent-relay: {message}")),
                    Ok(None) => HookAnswer::default(),
                    Err(why) => HookAnswer {
                        output: Some(json!({"systemMessage": format!("agent-relay: {why}")})),
                        note: Some(format!("agent-relay: {why}")),
                    },
                }
            }
            "UserPromptSubmit" => self.prompt_submitted(input.prompt.unwrap_or_default()),
            "PreToolUse" => {
                self.tell_session(
                    method::TOOL_STARTED,
                    json!({"toolName": input.tool_name, "toolCallId": input.tool_use_id, "args": input.tool_input}),
                );
                HookAnswer::default()
            }
            "PostToolUse" | "PostToolUseFailure" => {
                self.tell_session(
                    method::TOOL_ENDED,
                    json!({"toolName": input.tool_name, "toolCallId": input.tool_use_id, "isError": event != "PostToolUse"}),
                );
                HookAnswer::default()
            }
            "PermissionRequest" => self.permission_request(input).await,
            "Notification" => {
                let waiting_on_phone = self.state().approvals_open > 0;
                let permission = input.notification_type.as_deref() == Some("permission_prompt");
                if let Some(message) = input.message.filter(|_| !(permission && waiting_on_phone)) {
                    self.tell_session(
                        method::AGENT_NOTICE,
                        json!({"text": format!("⏳ {message}")}),
                    );
                }
                HookAnswer::default()
            }
            "Stop" => self.stop(input.last_assistant_message).await,
            "StopFailure" => self.stop_failed(&input).await,
            "SessionEnd" => HookAnswer::default(),
            other => note(format!(
                "agent-relay: the {other} hook is not one the relay uses"
            )),
        }
    }

    /// A turn began at Claude Code's terminal: with a message the phone
    /// sent (taken from the inbox), or one typed there, mirrored.
    fn prompt_submitted(&self, prompt: String) -> HookAnswer {
        let from_telegram = self.took_from_inbox(&prompt);
        {
            let mut state = self.state();
            state.from_telegram = from_telegram;
            state.turn_running = true;
        }
        self.tell_session(method::AGENT_STARTED, json!({}));
        let source = if from_telegram {
            "extension"
        } else {
            "interactive"
        };
        self.tell_session(
            method::INPUT_RECEIVED,
            json!({"text": prompt, "source": source}),
        );
        HookAnswer::default()
    }

    /// Claude Code asks whether a tool call may run: the relay's decision,
    /// or none (Claude Code asks as it would) where it is not the relay's.
    async fn permission_request(&self, input: HookInput) -> HookAnswer {
        let tool = input.tool_name.unwrap_or_else(|| "tool".into());
        let id = input.tool_use_id.unwrap_or_default();
        let decided = self
            .approve(&id, &tool, input.tool_input.unwrap_or(Value::Null))
            .await;
        let decision = match decided.decision {
            Decision::Allow => json!({"behavior": "allow"}),
            Decision::Deny => json!({
                "behavior": "deny",
                "message": decided.reason.unwrap_or_else(|| "Denied from Telegram.".into()),
            }),
            Decision::Defer => return HookAnswer::default(),
        };
        HookAnswer {
            output: Some(json!({"hookSpecificOutput": {
                "hookEventName": "PermissionRequest",
                "decision": decision,
            }})),
            note: None,
        }
    }

    /// A turn would end. Messages from the phone waiting meanwhile go on
    /// with it: the Stop hook blocks the stop with them as its reason, as
    /// Claude Code documents, so a session at a keyboard takes a message
    /// from the phone without channels. Otherwise the turn ends.
    async fn stop(&self, last: Option<String>) -> HookAnswer {
        let waiting = self.take_inbox();
        if waiting.is_empty() {
            {
                let mut state = self.state();
                state.from_telegram = false;
                state.turn_running = false;
            }
            // Asked, not told: the hook returns once the answer is the
            // relay's, on disk, and Claude Code may exit at once.
            let ended = self
                .session
                .request(
                    method::AGENT_ENDED,
                    json!({"lastAssistantText": last}),
                    QUICK,
                )
                .await;
            if let Err(e) = ended {
                tracing::warn!("the answer may not have reached the relay: {e}");
            }
            return HookAnswer::default();
        }
        // What the turn said so far is an answer of its own; the turn goes
        // on, driven from the phone now.
        self.state().from_telegram = true;
        if let Some(text) = last.filter(|t| !t.trim().is_empty()) {
            self.tell_session(method::TURN_ENDED, json!({"assistantText": text}));
        }
        let mut reason = STOP_REASON.to_string();
        for message in &waiting {
            reason.push_str("\n\n");
            reason.push_str(&message.text);
        }
        HookAnswer {
            output: Some(json!({"decision": "block", "reason": reason})),
            note: None,
        }
    }

    /// The turn ended on an API error after Claude Code's own retries
    /// (StopFailure fires instead of Stop; a try Claude Code made again is
    /// no hook at all): the topic is told once, with the error, and its
    /// text is no answer. Claude Code waits for no answer here, so messages
    /// from the phone cannot go on with the turn: they wait, and the topic
    /// hears where.
    async fn stop_failed(&self, input: &HookInput) -> HookAnswer {
        let said = [
            &input.last_assistant_message,
            &input.error_details,
            &input.error,
        ]
        .into_iter()
        .flatten()
        .map(|said| failure(said))
        .find(|said| !said.is_empty());
        self.turn_failed(said.unwrap_or_else(|| "an API error".into()))
            .await;
        let tell = {
            let mut state = self.state();
            !state.inbox.is_empty() && !std::mem::replace(&mut state.told_waiting, true)
        };
        if tell {
            self.tell_session(method::AGENT_NOTICE, json!({"text": WAITING_NOTICE}));
        }
        HookAnswer::default()
    }

    /// A print-mode run that an API error ended leaves before its
    /// StopFailure hook is served (Claude Code stops the MCP server at
    /// once): a turn still running at the end whose transcript ends in an
    /// API error is told as failed now.
    async fn failed_unseen(&self) {
        let Some(transcript) = ({
            let state = self.state();
            state.transcript.clone().filter(|_| state.turn_running)
        }) else {
            return;
        };
        if let Some(said) = super::transcript::api_error(&transcript) {
            self.turn_failed(failure(&said)).await;
        }
    }

    /// The turn failed for good with `error`: said once (whichever of the
    /// hook and the transcript tells it first).
    async fn turn_failed(&self, error: String) {
        {
            let mut state = self.state();
            state.from_telegram = false;
            if !std::mem::replace(&mut state.turn_running, false) {
                return;
            }
        }
        // Asked, not told, as at Stop: it is the relay's before Claude
        // Code exits.
        let ended = self
            .session
            .request(method::AGENT_ENDED, json!({"error": error}), QUICK)
            .await;
        if let Err(e) = ended {
            tracing::warn!("the failure may not have reached the relay: {e}");
        }
    }

    /// Whether `prompt` is a channel message of ours; the messages it
    /// carries leave the inbox.
    fn took_from_inbox(&self, prompt: &str) -> bool {
        if !prompt.trim_start().starts_with("<channel") {
            return false;
        }
        let ids: HashSet<i64> = prompt
            .match_indices("update_id=\"")
            .filter_map(|(at, key)| {
                let rest = &prompt[at + key.len()..];
                rest.split('"').next()?.parse().ok()
            })
            .collect();
        self.state()
            .inbox
            .retain(|w| !ids.contains(&w.origin.update_id));
        self.taken(ids.into_iter().collect());
        true
    }
}

/// An API error as the topic quotes it: Claude Code's line for it
/// (`API Error: 503 overloaded. …`) without its prefix.
pub(crate) fn failure(said: &str) -> String {
    let said = said.trim();
    said.strip_prefix("API Error:")
        .unwrap_or(said)
        .trim()
        .to_string()
}

fn note(text: String) -> HookAnswer {
    HookAnswer {
        output: None,
        note: Some(text),
    }
}

/// `notifications/claude/channel` params for a message, as the official
/// Telegram plugin sends them: the text, and the meta Claude Code shows as
/// attributes of the `<channel>` tag.
pub(super) fn channel_params(waiting: &Unread) -> Value {
    let origin = &waiting.origin;
    let mut meta = json!({
        "chat_id": origin.chat_id.to_string(),
        "user_id": origin.user_id.to_string(),
        "update_id": origin.update_id.to_string(),
        "ts": waiting.at_ms.to_string(),
    });
    if let Some(message_id) = origin.message_id {
        meta["message_id"] = message_id.to_string().into();
    }
    if let Some(thread_id) = origin.thread_id {
        meta["thread_id"] = thread_id.to_string().into();
    }
    // Meta values are strings: the saved files' paths as a JSON list, and
    // the first picture's as `image_path`, the official plugin's key.
    if !waiting.attachments.is_empty() {
        let paths: Vec<&str> = waiting
            .attachments
            .iter()
            .map(|a| a.path.as_str())
            .collect();
        meta["attachments"] = serde_json::to_string(&paths).unwrap_or_default().into();
    }
    if let Some(photo) = waiting
        .attachments
        .iter()
        .find(|a| a.kind == AttachmentKind::Photo)
    {
        meta["image_path"] = photo.path.clone().into();
    }
    json!({"content": waiting.text, "meta": meta})
}

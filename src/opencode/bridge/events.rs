//! Which OpenCode session the relay's session is — the one the bridge
//! opens alone, or the one the TUI works in, adopted (the first
//! initializes the session, a later one switches it) — and OpenCode's
//! events as the session's: a turn started and ended, what was typed at
//! the terminal, the answer and its draft, each tool call.

use std::sync::Arc;

use serde_json::{Value, json};

use super::{Mode, OpenCodeBridge, Opening, QUICK, SESSION_QUICK, Turn};
use crate::opencode::server::ServerError;
use crate::opencode::wire::{self, event};
use crate::protocol::host::{PROTOCOL_VERSION, method};

impl OpenCodeBridge {
    /// The session at the start: created or resumed by the bridge alone;
    /// beside the TUI, none until the TUI works in one.
    pub(super) async fn open(&self) -> Result<(), ServerError> {
        let opened: wire::SessionInfo = match &self.mode {
            Mode::BesideTui => return Ok(()),
            Mode::Alone(Opening::Start) => {
                self.server
                    .post(wire::route::SESSION, Some(&json!({})), QUICK)
                    .await?
            }
            Mode::Alone(Opening::Resume { session_id }) => {
                let route = format!("{}/{session_id}", wire::route::SESSION);
                self.server.get(&route, QUICK).await?
            }
        };
        self.adopt(opened, "startup").await;
        Ok(())
    }

    /// A session the TUI works in that the bridge has not seen created
    /// (one it resumed): adopted if it is no sub-agent's.
    async fn consider(&self, session_id: &str) {
        {
            let state = self.state();
            if !self.beside_tui() || state.known.contains(session_id) || state.concerns(session_id)
            {
                return;
            }
        }
        let route = format!("{}/{session_id}", wire::route::SESSION);
        match self.server.get::<wire::SessionInfo>(&route, QUICK).await {
            Ok(info) => self.adopt(info, "resume").await,
            Err(e) => tracing::debug!(session_id, "cannot read the session: {e}"),
        }
    }

    /// Makes `info` the relay's session: the first one initializes the
    /// session, a later one switches it (as pi's `/new` does). A
    /// sub-agent's session of ours is noted as ours.
    async fn adopt(&self, info: wire::SessionInfo, reason: &str) {
        {
            let mut state = self.state();
            if let Some(parent) = &info.parent_id {
                if state.concerns(parent) {
                    state.children.insert(info.id.clone());
                }
                return;
            }
            if !state.known.insert(info.id.clone()) || state.session.as_deref() == Some(&info.id) {
                return;
            }
        }
        // OpenCode's placeholder title names nothing: the topic is named
        // after the folder then.
        let title = info
            .title
            .as_deref()
            .filter(|t| !t.starts_with(wire::UNTITLED));
        let profile = json!({
            "id": info.id,
            "file": crate::opencode::session_file(&info.id),
            "name": title,
        });
        let first = self.state().session.is_none();
        let said = match first {
            true => self.initialize(&info, profile).await,
            false => {
                tracing::info!(session = %info.id, "OpenCode switched sessions");
                self.session.notify(
                    method::SESSION_STARTED,
                    json!({"reason": reason, "session": profile}),
                )
            }
        };
        if let Err(e) = said {
            tracing::warn!("the relay's session did not take OpenCode's: {e}");
            self.set_opened(Err(format!("the relay's session did not take it: {e}")));
            return;
        }
        self.set_opened(Ok(info.id.clone()));
        let mut state = self.state();
        state.session = Some(info.id);
        state.children.clear();
        state.turn = None;
    }

    async fn initialize(
        &self,
        info: &wire::SessionInfo,
        profile: Value,
    ) -> Result<(), crate::host_client::HostError> {
        let cwd = info
            .directory
            .clone()
            .unwrap_or_else(|| self.server.directory().to_string());
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "host": {"name": "opencode", "version": ""},
            "pid": std::process::id(),
            "cwd": cwd,
            "session": profile,
            "hasUI": false,
            // A prompt sent while the session is busy goes into the loop
            // that runs: OpenCode 1.18.33 gives it to the model with the
            // next step's request (docs/OPENCODE.md).
            "canSteer": true,
        });
        self.session
            .request(method::INITIALIZE, params, SESSION_QUICK)
            .await?;
        self.session.notify(method::INITIALIZED, json!({}))
    }

    pub(super) async fn on_event(self: Arc<Self>, event: wire::Event) {
        let properties = event.properties;
        match event.kind.as_str() {
            event::SESSION_CREATED => {
                if let Ok(created) = serde_json::from_value::<wire::SessionCreated>(properties)
                    && (self.beside_tui() || created.info.parent_id.is_some())
                {
                    self.adopt(created.info, "new").await;
                }
            }
            event::SESSION_STATUS => {
                if let Ok(status) = serde_json::from_value::<wire::SessionStatus>(properties) {
                    self.on_status(status).await;
                }
            }
            event::SESSION_ERROR => {
                if let Ok(error) = serde_json::from_value::<wire::SessionError>(properties) {
                    self.on_error(error);
                }
            }
            event::MESSAGE_UPDATED => {
                if let Ok(updated) = serde_json::from_value::<wire::MessageUpdated>(properties) {
                    let info = updated.info;
                    if info.role == "user" {
                        self.consider(&info.session_id).await;
                    }
                    self.state().remember_role(info.id, info.role);
                }
            }
            event::PART_UPDATED => {
                if let Ok(updated) = serde_json::from_value::<wire::PartUpdated>(properties) {
                    self.on_part(updated.part);
                }
            }
            event::PART_DELTA => {
                if let Ok(delta) = serde_json::from_value::<wire::PartDelta>(properties) {
                    self.on_delta(delta);
                }
            }
            _ => self.on_ask_event(&event.kind, properties),
        }
    }

    async fn on_status(&self, status: wire::SessionStatus) {
        if !self.state().concerns(&status.session_id) {
            if status.status.kind == "busy" {
                self.consider(&status.session_id).await;
            }
            return;
        }
        if self.state().session.as_deref() != Some(&status.session_id) {
            // A sub-agent's turn is part of ours.
            return;
        }
        match status.status.kind.as_str() {
            "busy" => {
                self.turn_started(false);
            }
            "idle" => self.turn_ended(),
            "retry" => self.retrying(&status.status),
            _ => {}
        }
    }

    /// A turn began (seen, or started by the bridge itself): the session is
    /// busy until it ends. A prompt from the phone joins a running turn.
    /// True when this began one (none ran).
    pub(super) fn turn_started(&self, from_phone: bool) -> bool {
        {
            let mut state = self.state();
            if let Some(turn) = &mut state.turn {
                turn.from_phone |= from_phone;
                return false;
            }
            state.turn = Some(Turn {
                from_phone,
                ..Turn::default()
            });
        }
        self.activity.send_replace(std::time::Instant::now());
        self.tell_session(method::AGENT_STARTED, json!({}));
        true
    }

    pub(super) fn turn_ended(&self) {
        let Some(turn) = self.state().turn.take() else {
            return;
        };
        self.activity.send_replace(std::time::Instant::now());
        if let Some(why) = turn.failed.as_ref().filter(|_| !turn.aborted) {
            // Failed for good (OpenCode's own retries are over): no answer
            // comes of it, whatever the turn had written.
            self.tell_session(method::AGENT_ENDED, json!({"error": why}));
            return;
        }
        self.tell_session(
            method::AGENT_ENDED,
            json!({"lastAssistantText": turn.answer(), "aborted": turn.aborted}),
        );
    }

    /// OpenCode tries a failed model call again itself (up to five more
    /// times, after a delay): that is no failure of the turn, and nothing
    /// is told of it, but what the failed try wrote (a stream cut
    /// mid-answer) is broken: never the answer, and gone from the draft.
    fn retrying(&self, status: &wire::Status) {
        let broken = {
            let mut state = self.state();
            let Some(turn) = &mut state.turn else { return };
            turn.answer_message = None;
            std::mem::take(&mut turn.answer)
        };
        if broken.is_empty() {
            return;
        }
        let why = status.message.as_deref().unwrap_or("the model failed");
        self.tell_session(
            method::TURN_ENDED,
            json!({"assistantText": "", "error": why}),
        );
    }

    fn on_error(&self, error: wire::SessionError) {
        let mut state = self.state();
        let ours = error
            .session_id
            .as_deref()
            .is_none_or(|s| state.concerns(s));
        let (Some(info), Some(turn)) = (error.error, state.turn.as_mut()) else {
            return;
        };
        if !ours {
            return;
        }
        if info.name == wire::ABORTED {
            turn.aborted = true;
        } else {
            turn.failed = Some(info.message());
        }
    }

    fn on_part(&self, part: wire::Part) {
        let role = {
            let state = self.state();
            if !state.concerns(&part.session_id) {
                return;
            }
            state.roles.get(&part.message_id).cloned()
        };
        match (part.kind.as_str(), role.as_deref()) {
            ("text", Some("user")) => self.mirror(&part),
            ("text", _) => self.answer_text(&part.session_id, &part.message_id, &part.id, |t| {
                *t = part.text.clone().unwrap_or_default();
            }),
            ("tool", _) => self.tool(&part),
            _ => {}
        }
    }

    fn on_delta(&self, delta: wire::PartDelta) {
        if delta.field != "text" || !self.state().concerns(&delta.session_id) {
            return;
        }
        let is_user = self
            .state()
            .roles
            .get(&delta.message_id)
            .map(String::as_str)
            == Some("user");
        if !is_user {
            self.answer_text(&delta.session_id, &delta.message_id, &delta.part_id, |t| {
                t.push_str(&delta.delta);
            });
        }
    }

    /// What was typed at the terminal goes to the topic, so it reads whole;
    /// what the phone sent is not echoed back.
    fn mirror(&self, part: &wire::Part) {
        let from_phone = part.metadata.get(wire::FROM_PHONE).is_some();
        let text = part.text.clone().unwrap_or_default();
        if part.synthetic || from_phone || text.trim().is_empty() {
            return;
        }
        if !self.state().mirrored.insert(part.id.clone()) {
            return;
        }
        self.tell_session(
            method::INPUT_RECEIVED,
            json!({"text": text, "source": "interactive"}),
        );
    }

    /// The answer's text grows (`change` edits one part of it): the draft
    /// shows it. A sub-agent's text is its own, not the answer.
    fn answer_text(
        &self,
        session_id: &str,
        message_id: &str,
        part_id: &str,
        change: impl FnOnce(&mut String),
    ) {
        let draft = {
            let mut state = self.state();
            if state.session.as_deref() != Some(session_id) {
                return;
            }
            let Some(turn) = &mut state.turn else { return };
            if turn.answer_message.as_deref() != Some(message_id) {
                turn.answer_message = Some(message_id.to_string());
                turn.answer.clear();
            }
            let at = match turn.answer.iter().position(|(id, _)| id == part_id) {
                Some(at) => at,
                None => {
                    turn.answer.push((part_id.to_string(), String::new()));
                    turn.answer.len() - 1
                }
            };
            change(&mut turn.answer[at].1);
            turn.answer()
        };
        if let Some(text) = draft {
            self.tell_session(method::TURN_TEXT, json!({"text": text}));
        }
    }

    /// A tool call, for the progress message: started once it runs, ended
    /// once it completed or failed.
    fn tool(&self, part: &wire::Part) {
        let (Some(name), Some(call), Some(state)) = (&part.tool, &part.call_id, &part.state) else {
            return;
        };
        let (start, end) = {
            let mut bridge = self.state();
            let Some(turn) = &mut bridge.turn else { return };
            let ended = matches!(state.status.as_str(), "completed" | "error");
            let start = (state.status == "running" || ended) && turn.tools.insert(call.clone());
            (start, ended && turn.tools_ended.insert(call.clone()))
        };
        if start {
            self.tell_session(
                method::TOOL_STARTED,
                json!({"toolName": name, "toolCallId": call, "args": state.input}),
            );
        }
        if end {
            self.tell_session(
                method::TOOL_ENDED,
                json!({"toolName": name, "toolCallId": call, "isError": state.status == "error"}),
            );
        }
    }

    /// The event stream (re)connected: a turn that ended while it was down
    /// ends now.
    pub(super) async fn caught_up(&self) {
        let Some(session_id) = self.session_id() else {
            return;
        };
        let statuses: Result<Value, _> = self.server.get(wire::route::STATUSES, QUICK).await;
        let busy = statuses
            .map(|s| s[&session_id]["type"].as_str() == Some("busy"))
            .unwrap_or(true);
        if !busy {
            self.turn_ended();
        }
    }
}

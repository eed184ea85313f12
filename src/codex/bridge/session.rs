//! What the session asks of its host — a prompt from the topic is a
//! turn (or joins the one running), `/stop` interrupts it — and what the
//! launch engine and the relay's tool ask of the bridge (the models, a
//! file to send, a command).

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{CodexBridge, FROM_PHONE, QUICK, SESSION_QUICK};
use crate::codex::app_server::AppServerError;
use crate::codex::wire::{self, method as codex};
use crate::host_client::{HostError, Said};
use crate::protocol::host::{
    AttachmentKind, DeliverAs, SendFileParams, SendFileResult, SendUserMessageParams, method,
};

/// The most pages of `model/list` read (a page holds every model Codex
/// 0.171 knows).
const MODEL_PAGES: usize = 5;

impl CodexBridge {
    /// Answers what the session asks of its host, until it is gone.
    pub(super) fn spawn_session_loop(self: Arc<Self>, from: mpsc::UnboundedReceiver<Said>) {
        let session = self.session.clone();
        session.answer_requests(from, move |method, params| {
            let me = self.clone();
            async move { me.on_session_request(&method, params).await }
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
    /// one running; a steer goes into the running turn (`turn/steer`), or,
    /// when that turn has just ended, starts one.
    async fn prompt(&self, params: SendUserMessageParams) -> Result<Value, (i64, String)> {
        let update_id = params.origin.update_id;
        let (thread_id, model, turn) = {
            let mut state = self.state();
            if !state.seen.insert(update_id) {
                return Ok(json!({"accepted": true}));
            }
            let steer = params.deliver_as == Some(DeliverAs::Steer);
            let turn = state.turn.clone().filter(|_| steer);
            (state.thread.clone(), state.model.clone(), turn)
        };
        let forget = || {
            let mut state = self.state();
            state.seen.remove(update_id);
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
        if let Some(turn) = turn
            && self.steer(&thread_id, &input, turn, update_id).await
        {
            return Ok(json!({"accepted": true}));
        }
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

    /// `turn/steer`: `input` into `turn`, the thread's running turn (Codex
    /// refuses it once that turn ended: false, and the caller starts one).
    async fn steer(
        &self,
        thread_id: &str,
        input: &[wire::UserInput],
        expected_turn_id: String,
        update_id: i64,
    ) -> bool {
        let steered: Result<Value, _> = self
            .codex
            .request(
                codex::TURN_STEER,
                &wire::TurnSteerParams {
                    thread_id: thread_id.to_string(),
                    input: input.to_vec(),
                    expected_turn_id,
                    client_user_message_id: format!("{FROM_PHONE}{update_id}"),
                },
                QUICK,
            )
            .await;
        if let Err(e) = &steered {
            tracing::debug!("turn/steer refused, starting a turn: {e}");
        }
        steered.is_ok()
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

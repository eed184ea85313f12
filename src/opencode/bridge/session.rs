//! What the session asks of its host — a prompt from the topic is a
//! prompt to the OpenCode session (one sent while a turn runs goes into it:
//! a steer), `/stop` aborts the turn — and what the launch engine and the
//! relay's tool ask of the bridge (the models, a file to send, a command).

use std::sync::Arc;

use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{OpenCodeBridge, QUICK, SESSION_QUICK};
use crate::host_client::{HostError, Said};
use crate::opencode::server::ServerError;
use crate::opencode::wire;
use crate::protocol::host::{
    AttachmentKind, SendFileParams, SendFileResult, SendUserMessageParams, method,
};
use crate::protocol::launch::ModelChoice;

impl OpenCodeBridge {
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
            method::AGENT_ABORT => self.abort().await,
            _ => Err((-32601, format!("Method not found: {method}"))),
        }
    }

    /// A prompt from the topic: its text marked as the phone's, its photos
    /// as images.
    async fn prompt(&self, params: SendUserMessageParams) -> Result<Value, (i64, String)> {
        let update_id = params.origin.update_id;
        let (session_id, model) = {
            let mut state = self.state();
            if !state.seen.insert(update_id) {
                return Ok(json!({"accepted": true}));
            }
            (state.session.clone(), state.model.clone())
        };
        let forget = || {
            self.state().seen.remove(update_id);
        };
        let Some(session_id) = session_id else {
            forget();
            return Err((-32000, "OpenCode has no session open yet".into()));
        };
        let prompt = wire::Prompt {
            parts: prompt_parts(&params),
            model,
        };
        let route = format!("{}/{session_id}/prompt_async", wire::route::SESSION);
        // Busy before the prompt goes: a quick turn may end (its idle come)
        // before the post is answered, and a turn begun after its end would
        // never end for the session, which holds what is written meanwhile
        // for the next turn.
        let began = self.turn_started(true);
        match self
            .server
            .post::<_, Value>(&route, Some(&prompt), QUICK)
            .await
        {
            Ok(_) => Ok(json!({"accepted": true})),
            Err(e) => {
                if began {
                    self.turn_ended();
                }
                forget();
                Err((-32000, format!("OpenCode did not take the message: {e}")))
            }
        }
    }

    /// `/stop`: the running turn is aborted.
    async fn abort(&self) -> Result<Value, (i64, String)> {
        let (session_id, busy) = {
            let state = self.state();
            (state.session.clone(), state.turn.is_some())
        };
        let (Some(session_id), true) = (session_id, busy) else {
            return Err((-32000, "OpenCode is not working on anything".into()));
        };
        let route = format!("{}/{session_id}/abort", wire::route::SESSION);
        self.server
            .post::<Value, Value>(&route, None, QUICK)
            .await
            .map(|_| json!({}))
            .map_err(|e| (-32000, e.to_string()))
    }

    /// The models of the providers OpenCode can use (its own list, as its
    /// model picker shows it), as `provider/model`; and the configured one.
    pub async fn models(&self) -> Result<(Vec<ModelChoice>, Option<String>), ServerError> {
        let listed: wire::Providers = self.server.get(wire::route::PROVIDERS, QUICK).await?;
        let models = listed
            .providers
            .into_iter()
            .flat_map(|provider| {
                let name = if provider.name.trim().is_empty() {
                    provider.id.clone()
                } else {
                    provider.name.clone()
                };
                provider.models.into_iter().map(move |(id, model)| {
                    let model_name = if model.name.trim().is_empty() {
                        id.clone()
                    } else {
                        model.name
                    };
                    ModelChoice {
                        id: format!("{}/{id}", provider.id),
                        label: format!("{name}: {model_name}"),
                    }
                })
            })
            .collect();
        let config: wire::Config = self.server.get(wire::route::CONFIG, QUICK).await?;
        Ok((models, config.model))
    }

    /// Offers the relay's `send_file` to OpenCode: an MCP server, `agent-relay
    /// codex-tools <socket>` (the one Codex runs), added to the running
    /// server for this folder only, never to the user's configuration.
    pub async fn offer_tool(&self, exe: &str, socket: &str) -> Result<(), ServerError> {
        let body = json!({
            "name": crate::codex::tools::SERVER_NAME,
            "config": {
                "type": "local",
                "command": [exe, "codex-tools", socket],
                "enabled": true,
                "timeout": crate::mcp::SEND_FILE_WAIT.as_millis() as u64,
            },
        });
        self.server
            .post::<_, Value>(wire::route::MCP, Some(&body), QUICK)
            .await
            .map(|_| ())
    }

    /// `file/send` through the session, for the relay's tool: the session
    /// checks the path against the policy and the leader uploads the file;
    /// a refusal says why.
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

    /// A request to the session, for the launch engine.
    pub async fn ask_session(&self, method: &str, params: Value) -> Result<Value, HostError> {
        self.session.request(method, params, SESSION_QUICK).await
    }
}

/// The prompt's parts: the text (marked as the phone's, so it is not
/// mirrored back), then each photo as an image OpenCode shows its model.
fn prompt_parts(params: &SendUserMessageParams) -> Vec<wire::PromptPart> {
    let mut parts = vec![wire::PromptPart::Text {
        text: params.text.clone(),
        metadata: json!({wire::FROM_PHONE: params.origin.update_id.to_string()}),
    }];
    parts.extend(
        params
            .attachments
            .iter()
            .filter(|a| a.kind == AttachmentKind::Photo)
            .map(|a| wire::PromptPart::File {
                mime: a.mime_type.clone().unwrap_or_else(|| "image/jpeg".into()),
                url: format!("file://{}", a.path),
                filename: std::path::Path::new(&a.path)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            }),
    );
    parts
}

//! OpenCode's shapes, as the pinned version (`tests/opencode`, 1.18.33)
//! serves them (docs/OPENCODE.md): the routes the relay calls, the events
//! of `GET /event` it reads, and what it sends back. Only the fields the
//! relay uses; the rest is ignored as OpenCode adds to it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The routes, relative to the server; each takes `?directory=`.
pub mod route {
    pub const EVENTS: &str = "/event";
    pub const SESSION: &str = "/session";
    /// Every busy session's status, by id (an idle one is left out).
    pub const STATUSES: &str = "/session/status";
    pub const PROVIDERS: &str = "/config/providers";
    pub const CONFIG: &str = "/config";
    pub const MCP: &str = "/mcp";
    pub const PERMISSION: &str = "/permission";
    pub const QUESTION: &str = "/question";
}

/// The event types the relay reads.
pub mod event {
    pub const SESSION_CREATED: &str = "session.created";
    pub const SESSION_STATUS: &str = "session.status";
    pub const SESSION_ERROR: &str = "session.error";
    pub const MESSAGE_UPDATED: &str = "message.updated";
    pub const PART_UPDATED: &str = "message.part.updated";
    pub const PART_DELTA: &str = "message.part.delta";
    pub const PERMISSION_ASKED: &str = "permission.asked";
    pub const PERMISSION_REPLIED: &str = "permission.replied";
    pub const QUESTION_ASKED: &str = "question.asked";
    pub const QUESTION_REPLIED: &str = "question.replied";
    pub const QUESTION_REJECTED: &str = "question.rejected";
}

/// The key of a prompt's text part's `metadata` that marks it the relay's
/// (its value: the Telegram update it came from).
pub const FROM_PHONE: &str = "agentRelay";

/// One event of `GET /event`: `{id, type, properties}`.
#[derive(Debug, Clone, Deserialize)]
pub struct Event {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub properties: Value,
}

/// A session (`POST /session`, `GET /session/{id}`, `session.created`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionInfo {
    pub id: String,
    /// A sub-agent's session names the session that started it.
    #[serde(rename = "parentID", default)]
    pub parent_id: Option<String>,
    #[serde(default)]
    pub directory: Option<String>,
    #[serde(default)]
    pub title: Option<String>,
}

/// How the title of a session OpenCode has not titled yet begins.
pub const UNTITLED: &str = "New session - ";

#[derive(Debug, Clone, Deserialize)]
pub struct SessionCreated {
    pub info: SessionInfo,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SessionStatus {
    #[serde(rename = "sessionID")]
    pub session_id: String,
    pub status: Status,
}

/// `idle`, `busy`, or `retry` (the provider failed; OpenCode waits and
/// asks again).
#[derive(Debug, Clone, Deserialize)]
pub struct Status {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub message: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SessionError {
    #[serde(rename = "sessionID", default)]
    pub session_id: Option<String>,
    #[serde(default)]
    pub error: Option<ErrorInfo>,
}

/// `{name, data: {message}}`: `MessageAbortedError` is a `/stop`.
#[derive(Debug, Clone, Deserialize)]
pub struct ErrorInfo {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub data: Value,
}

/// The name of the error an abort ends a turn with.
pub const ABORTED: &str = "MessageAbortedError";

impl ErrorInfo {
    /// What a person reads of it: a provider's HTTP status before its
    /// message (`503 overloaded`), as the other hosts say it.
    pub fn message(&self) -> String {
        let said = self.data["message"].as_str().unwrap_or_default().trim();
        let said = if said.is_empty() { &self.name } else { said };
        match self.data["statusCode"].as_u64() {
            Some(status) if !said.starts_with(&status.to_string()) => format!("{status} {said}"),
            _ => said.to_string(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct MessageUpdated {
    pub info: MessageInfo,
}

#[derive(Debug, Clone, Deserialize)]
pub struct MessageInfo {
    pub id: String,
    #[serde(rename = "sessionID")]
    pub session_id: String,
    pub role: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PartUpdated {
    pub part: Part,
}

/// A part of a message: text, a tool call, a file, a step…
#[derive(Debug, Clone, Deserialize)]
pub struct Part {
    pub id: String,
    #[serde(rename = "sessionID")]
    pub session_id: String,
    #[serde(rename = "messageID")]
    pub message_id: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    /// OpenCode's own text (a file read for the prompt), not typed.
    #[serde(default)]
    pub synthetic: bool,
    #[serde(default)]
    pub metadata: Value,
    #[serde(default)]
    pub tool: Option<String>,
    #[serde(rename = "callID", default)]
    pub call_id: Option<String>,
    #[serde(default)]
    pub state: Option<ToolState>,
}

/// A tool call's state: `pending`, `running`, `completed` or `error`.
#[derive(Debug, Clone, Deserialize)]
pub struct ToolState {
    pub status: String,
    #[serde(default)]
    pub input: Value,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PartDelta {
    #[serde(rename = "sessionID")]
    pub session_id: String,
    #[serde(rename = "messageID")]
    pub message_id: String,
    #[serde(rename = "partID")]
    pub part_id: String,
    #[serde(default)]
    pub field: String,
    #[serde(default)]
    pub delta: String,
}

/// `permission.asked`: a tool call waits for a person.
#[derive(Debug, Clone, Deserialize)]
pub struct PermissionAsked {
    pub id: String,
    #[serde(rename = "sessionID")]
    pub session_id: String,
    /// The tool's permission: `bash`, `edit`, `read`, `external_directory`…
    pub permission: String,
    #[serde(default)]
    pub patterns: Vec<String>,
    #[serde(default)]
    pub metadata: Value,
    /// What "always" would allow from now on.
    #[serde(default)]
    pub always: Vec<String>,
    #[serde(default)]
    pub tool: Option<ToolRef>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ToolRef {
    #[serde(rename = "callID")]
    pub call_id: String,
}

/// `permission.replied`, `question.replied`, `question.rejected`.
#[derive(Debug, Clone, Deserialize)]
pub struct Replied {
    #[serde(rename = "requestID")]
    pub request_id: String,
}

/// `POST /permission/{id}/reply`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PermissionReply {
    Once,
    Reject,
}

#[derive(Debug, Clone, Serialize)]
pub struct PermissionAnswer {
    pub reply: PermissionReply,
    /// With a refusal, what the model reads (it goes on with it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// `question.asked`: the model asks its user (the `question` tool).
#[derive(Debug, Clone, Deserialize)]
pub struct QuestionAsked {
    pub id: String,
    #[serde(rename = "sessionID")]
    pub session_id: String,
    pub questions: Vec<Question>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Question {
    pub question: String,
    #[serde(default)]
    pub header: String,
    #[serde(default)]
    pub options: Vec<QuestionOption>,
    /// A typed answer is welcome (OpenCode's default).
    #[serde(default = "yes")]
    pub custom: bool,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
pub struct QuestionOption {
    pub label: String,
    #[serde(default)]
    pub description: String,
}

/// `POST /question/{id}/reply`: one list of labels (or a typed answer) per
/// question, in order.
#[derive(Debug, Clone, Default, Serialize)]
pub struct QuestionAnswer {
    pub answers: Vec<Vec<String>>,
}

/// `POST /session/{id}/prompt_async`.
#[derive(Debug, Clone, Serialize)]
pub struct Prompt {
    pub parts: Vec<PromptPart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<ModelRef>,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum PromptPart {
    Text {
        text: String,
        metadata: Value,
    },
    File {
        mime: String,
        url: String,
        filename: String,
    },
}

/// A model as a prompt names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModelRef {
    #[serde(rename = "providerID")]
    pub provider_id: String,
    #[serde(rename = "modelID")]
    pub model_id: String,
}

impl ModelRef {
    /// `provider/model`, as OpenCode's `--model` and `model` setting write
    /// it (a model id may hold `/` itself).
    pub fn parse(name: &str) -> Option<Self> {
        let (provider, model) = name.split_once('/')?;
        (!provider.is_empty() && !model.is_empty()).then(|| Self {
            provider_id: provider.into(),
            model_id: model.into(),
        })
    }
}

/// `GET /config/providers`: the providers a person can use, each with its
/// models.
#[derive(Debug, Clone, Deserialize)]
pub struct Providers {
    pub providers: Vec<Provider>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Provider {
    pub id: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub models: BTreeMap<String, ModelInfo>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ModelInfo {
    #[serde(default)]
    pub name: String,
}

/// `GET /config`: the configured model, `provider/model`.
#[derive(Debug, Clone, Deserialize)]
pub struct Config {
    #[serde(default)]
    pub model: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_providers_error_reads_with_its_status_as_the_other_hosts_say_it() {
        let error = |data: Value| ErrorInfo {
            name: "APIError".into(),
            data,
        };
        // As OpenCode 1.18.33 said a 503 after its last try.
        let said = error(
            serde_json::json!({"message": "still down", "statusCode": 503, "isRetryable": true}),
        );
        assert_eq!(said.message(), "503 still down");
        let said =
            error(serde_json::json!({"message": "503 Service Unavailable", "statusCode": 503}));
        assert_eq!(said.message(), "503 Service Unavailable");
        assert_eq!(error(serde_json::json!({})).message(), "APIError");
        assert_eq!(
            error(serde_json::json!({"message": "terminated"})).message(),
            "terminated"
        );
    }

    #[test]
    fn a_model_is_named_provider_slash_model() {
        let model = ModelRef::parse("openrouter/anthropic/claude").unwrap();
        assert_eq!(model.provider_id, "openrouter");
        assert_eq!(model.model_id, "anthropic/claude");
        assert!(ModelRef::parse("no-provider").is_none());
        assert!(ModelRef::parse("/model").is_none());
    }

    #[test]
    fn a_prompt_reads_as_opencode_takes_it() {
        let prompt = Prompt {
            parts: vec![
                PromptPart::Text {
                    text: "hi".into(),
                    metadata: serde_json::json!({FROM_PHONE: "7"}),
                },
                PromptPart::File {
                    mime: "image/jpeg".into(),
                    url: "file:///tmp/a.jpg".into(),
                    filename: "a.jpg".into(),
                },
            ],
            model: ModelRef::parse("fake/m"),
        };
        assert_eq!(
            serde_json::to_value(&prompt).unwrap(),
            serde_json::json!({
                "parts": [
                    {"type": "text", "text": "hi", "metadata": {"agentRelay": "7"}},
                    {"type": "file", "mime": "image/jpeg", "url": "file:///tmp/a.jpg", "filename": "a.jpg"},
                ],
                "model": {"providerID": "fake", "modelID": "m"},
            })
        );
    }
}

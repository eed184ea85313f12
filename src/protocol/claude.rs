//! Claude Code's side of the relay: what `agent-relay hook <event>` hands
//! its session's MCP server (`agent-relay mcp`) over the session's hook
//! socket, one JSON line each way, and the fields of Claude Code's hook
//! input the relay reads (docs/DESIGN.md, "Claude Code").

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One hook event, as `agent-relay hook` read it from Claude Code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookCall {
    /// The event named on the command line (`SessionStart`, `Stop`, …).
    pub event: String,
    /// Claude Code's hook input, as it came on stdin.
    pub input: Value,
    /// `CLAUDE_CODE_ENTRYPOINT` of the hook: `cli` in the terminal UI,
    /// `sdk-cli` in print mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<String>,
}

/// The MCP server's answer to a [`HookCall`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HookAnswer {
    /// What the hook prints on stdout for Claude Code (its hook output
    /// JSON), when it decides something.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
    /// A line for the hook's stderr (Claude Code shows it in verbose mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The fields of a hook input the relay reads; every event has the first
/// four, the rest belong to some events only. Unknown fields are ignored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HookInput {
    #[serde(default)]
    pub session_id: String,
    #[serde(default)]
    pub transcript_path: String,
    #[serde(default)]
    pub cwd: String,
    #[serde(default)]
    pub hook_event_name: String,
    /// SessionStart: `startup`, `resume`, `clear`, `compact` or `fork`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// SessionStart: the session's title, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_title: Option<String>,
    /// UserPromptSubmit: the prompt as submitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Tool events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_input: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_use_id: Option<String>,
    /// Notification.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notification_type: Option<String>,
    /// Stop: the turn's final text. StopFailure: the API error as Claude
    /// Code shows it (`API Error: 503 …`), never an answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_assistant_message: Option<String>,
    /// StopFailure: what kind of API error ended the turn (`server_error`,
    /// `rate_limit`, `overloaded`, …), after Claude Code's own retries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// StopFailure: more about it, when Claude Code has more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_details: Option<String>,
    /// Stop: Claude Code goes on because a Stop hook said so before.
    #[serde(default)]
    pub stop_hook_active: bool,
}

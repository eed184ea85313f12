//! Claude Code's tools on the relay's MCP server (`src/mcp.rs`), which
//! Claude Code starts as `agent-relay mcp`:
//!
//! * `reply`, `send_file`, `ask`, `status`, `telegram_inbox`, and
//!   `permission` for `--permission-prompt-tool` in print mode;
//! * Claude Code's channel extension: the experimental `claude/channel`
//!   and `claude/channel/permission` capabilities. Prompts from the topic
//!   go out as `notifications/claude/channel` to a client that takes them
//!   (Claude Code, or one that declares `claude/channel`), and always wait
//!   in the inbox until a turn took them.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::bridge::{ClaudeBridge, Unread};
use crate::mcp::{SEND_FILE_WAIT, send_file_params, send_file_tool, sent_text, tool_result};
use crate::protocol::host::*;

/// What the model reads about this server.
const INSTRUCTIONS: &str = "agent-relay connects this session to a Telegram topic of its own. \
Messages the user writes there arrive as <channel source=\"agent-relay\" …> turns, or wait for the \
telegram_inbox tool. With agent-relay's hooks installed, your final answer of each turn is posted \
into the topic by itself; use `reply` for anything else the user should read on the phone \
(Markdown), `send_file` to send them a file or picture from the project, and `ask` to put a \
question to them with buttons. Files the user sends are saved on this machine; the message names \
their paths.";

/// How long a tool that hands something over (`reply`, `status`) waits for
/// the session, which answers within `ANSWER_WITHIN`: a bound on one that
/// does not answer at all.
const TOOL_WAIT: Duration = Duration::from_secs(10);

/// The tools of one Claude Code's session, played through its bridge.
pub(super) struct ClaudeTools {
    bridge: Arc<ClaudeBridge>,
}

impl crate::mcp::Tools for ClaudeTools {
    const INSTRUCTIONS: &'static str = INSTRUCTIONS;

    fn initialize(&self, params: &Value) -> Option<Value> {
        let declares = params["capabilities"]["experimental"]
            .get("claude/channel")
            .is_some();
        let claude_code = params["clientInfo"]["name"].as_str() == Some("claude-code");
        // Claude Code declares no client capability for channels; it takes
        // them where its channels are on and ignores them elsewhere, and the
        // inbox keeps every message either way.
        self.bridge.use_channel(declares || claude_code);
        Some(json!({"claude/channel": {}, "claude/channel/permission": {}}))
    }

    fn list(&self) -> Value {
        tools()
    }

    async fn call(&self, name: &str, args: Value) -> Option<Value> {
        let outcome = match name {
            "reply" => self.reply(&args).await,
            "send_file" => self.send_file(args).await,
            "ask" => self.ask(&args).await,
            "status" => self.status().await,
            "telegram_inbox" => Ok(inbox_text(&self.bridge.take_inbox())),
            "permission" => return Some(self.permission(&args).await),
            _ => return None,
        };
        Some(tool_result(outcome))
    }

    fn notify(&self, method: &str, params: Value) {
        match method {
            "notifications/initialized" => self.bridge.clone().start_after_grace(),
            "notifications/claude/channel/permission_request" => {
                self.bridge.clone().relay_permission(params);
            }
            other => tracing::trace!(method = other, "MCP notification"),
        }
    }
}

impl ClaudeTools {
    /// The tools for `bridge`'s session; `link` is how the bridge reaches
    /// Claude Code (its channel notifications).
    pub fn new(bridge: Arc<ClaudeBridge>, link: crate::host::HostLink) -> Self {
        bridge.set_mcp(link);
        Self { bridge }
    }

    async fn reply(&self, args: &Value) -> Result<String, String> {
        let text = args["text"].as_str().unwrap_or_default();
        if text.trim().is_empty() {
            return Err("reply needs a non-empty `text`".into());
        }
        let result = self
            .bridge
            .ask_session(method::TOPIC_SEND, json!({"text": text}), TOOL_WAIT)
            .await?;
        let result: TopicSendResult = serde_json::from_value(result).map_err(|e| e.to_string())?;
        if result.kept {
            let why = result
                .reason
                .unwrap_or_else(|| "Telegram has not answered yet".into());
            return Ok(format!("Not in the Telegram topic yet, but kept: {why}."));
        }
        if result.sent {
            Ok(match result.messages {
                1 => "Sent to the Telegram topic.".to_string(),
                n => format!("Sent to the Telegram topic as {n} messages."),
            })
        } else {
            Err(format!(
                "Not sent: {}",
                result.reason.unwrap_or_else(|| "unknown".into())
            ))
        }
    }

    /// `file/send` through the session: the leader checks the path and
    /// uploads the file; a refusal comes back saying why.
    async fn send_file(&self, args: Value) -> Result<String, String> {
        let params = send_file_params(args)?;
        let result = self
            .bridge
            .ask_session(
                method::FILE_SEND,
                serde_json::to_value(&params).map_err(|e| e.to_string())?,
                SEND_FILE_WAIT,
            )
            .await
            .map_err(|why| format!("Not sent: {why}"))?;
        let result: SendFileResult = serde_json::from_value(result).map_err(|e| e.to_string())?;
        Ok(sent_text(&params, &result))
    }

    async fn ask(&self, args: &Value) -> Result<String, String> {
        let question = args["question"].as_str().unwrap_or_default();
        if question.trim().is_empty() {
            return Err("ask needs a `question`".into());
        }
        let options: Vec<String> = args["options"]
            .as_array()
            .map(|o| {
                o.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        let allow_text = args["allow_text"].as_bool().unwrap_or(options.is_empty());
        let mut params = json!({"question": question, "options": options, "allowText": allow_text});
        if let Some(secs) = args["timeout_s"].as_u64() {
            params["timeoutMs"] = json!(secs.clamp(10, 3600) * 1000);
        }
        let result = self
            .bridge
            .ask_session(method::QUESTION_ASK, params, Duration::from_secs(3700))
            .await?;
        let result: QuestionResult = serde_json::from_value(result).map_err(|e| e.to_string())?;
        let why = result.reason;
        match (result.answer, result.by) {
            (Some(answer), _) => Ok(format!("The user answered: {answer}")),
            (None, DecidedBy::Timeout) => Err("Nobody answered in time.".into()),
            (None, DecidedBy::Unavailable) => Err(format!(
                "Nobody could be asked: {}.",
                why.unwrap_or_else(|| "this session has no Telegram topic right now".into())
            )),
            (None, _) => Err("The question was dismissed.".into()),
        }
    }

    async fn status(&self) -> Result<String, String> {
        let result = self
            .bridge
            .ask_session(
                method::COMMAND_EXECUTE,
                json!({"name": "telegram-status", "args": ""}),
                TOOL_WAIT,
            )
            .await?;
        Ok(result["message"].as_str().unwrap_or_default().to_string())
    }

    /// `--permission-prompt-tool`: Claude Code's question in print mode,
    /// answered as a JSON text. The relay's `[approvals]` policy decides who
    /// is asked; a call it leaves to the host is denied, since in print mode
    /// nobody else could allow it.
    async fn permission(&self, args: &Value) -> Value {
        let tool = args["tool_name"].as_str().unwrap_or("tool");
        let id = args["tool_use_id"].as_str().unwrap_or_default();
        let input = args.get("input").cloned().unwrap_or(json!({}));
        let decided = self.bridge.approve(id, tool, input.clone()).await;
        let answer = match decided.decision {
            Decision::Allow => json!({"behavior": "allow", "updatedInput": input}),
            Decision::Deny => json!({
                "behavior": "deny",
                "message": decided.reason.unwrap_or_else(|| "Denied from Telegram.".into()),
            }),
            Decision::Defer => json!({
                "behavior": "deny",
                "message": format!("agent-relay's [approvals] policy does not ask about {tool}, and nobody else can allow it here."),
            }),
        };
        json!({"content": [{"type": "text", "text": answer.to_string()}]})
    }
}

/// What `telegram_inbox` answers.
fn inbox_text(waiting: &[Unread]) -> String {
    if waiting.is_empty() {
        return "No messages are waiting.".into();
    }
    let mut out = format!("{} message(s) from the Telegram topic:", waiting.len());
    for w in waiting {
        out.push_str(&format!(
            "\n\n<message user_id=\"{}\" message_id=\"{}\">\n{}\n</message>",
            w.origin.user_id,
            w.origin.message_id.unwrap_or_default(),
            w.text
        ));
    }
    out
}

fn tools() -> Value {
    json!([
        {
            "name": "reply",
            "description": "Send a message (Markdown) into this session's Telegram topic, where the user reads it on the phone.",
            "inputSchema": {
                "type": "object",
                "properties": {"text": {"type": "string", "description": "Markdown; long texts are split into several messages."}},
                "required": ["text"],
            },
        },
        send_file_tool(),
        {
            "name": "ask",
            "description": "Ask the user a question in the Telegram topic and wait for the answer: a tap on one of the options, or a written reply.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "question": {"type": "string"},
                    "options": {"type": "array", "items": {"type": "string"}, "description": "Answers to offer as buttons."},
                    "allow_text": {"type": "boolean", "description": "Accept a written answer too (default: only when there are no options)."},
                    "timeout_s": {"type": "integer", "minimum": 10, "maximum": 3600, "description": "How long to wait (default 600)."},
                },
                "required": ["question"],
            },
        },
        {
            "name": "status",
            "description": "This session's relay status: its topic, the leader, the approvals policy.",
            "inputSchema": {"type": "object", "properties": {}},
        },
        {
            "name": "telegram_inbox",
            "description": "Messages the user wrote in this session's Telegram topic that no turn has taken yet; they are taken by reading them.",
            "inputSchema": {"type": "object", "properties": {}},
        },
        {
            "name": "permission",
            "description": "For --permission-prompt-tool: asks the user on the phone whether a tool call may run.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "tool_name": {"type": "string"},
                    "input": {"type": "object"},
                    "tool_use_id": {"type": "string"},
                },
                "required": ["tool_name", "input"],
            },
        },
    ])
}

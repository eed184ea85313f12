//! The MCP server of the hosts that take the relay's tools over the Model
//! Context Protocol: Claude Code (`agent-relay mcp`, its tools in
//! `claude/tools.rs`) and Codex (`agent-relay codex-tools`, in
//! `codex/tools.rs`). The lifecycle and the method table are here, on the
//! crate's JSON-RPC transport (`docs/decisions/0002-mcp-server.md` says
//! why not the official SDK); what a host offers is a [`Tools`].
//!
//! * `initialize` answers the client's protocol version when we speak it
//!   (else our newest), the `tools` capability and the host's
//!   `experimental` ones, and its instructions; `server/discover` (the
//!   draft stateless lifecycle) is an unknown method, so Claude Code falls
//!   back to `initialize`, the lifecycle it was seen to use.
//! * `ping`, `tools/list`, `tools/call`; anything else is -32601, an
//!   unknown tool -32602.
//! * The `send_file` tool is the same for every host ([`send_file_tool`],
//!   [`sent_text`]): the host protocol's `file/send`.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::host::{RpcError, Service, encode_result};
use crate::protocol::host::{SendAs, SendFileParams, SendFileResult};

/// How long `send_file` waits for the session, which answers within
/// `protocol::host::ANSWER_WITHIN` (an upload Telegram has not answered by
/// then goes on, and the answer says so): a bound on a session that does
/// not answer at all.
pub const SEND_FILE_WAIT: Duration = Duration::from_secs(10);

/// The MCP protocol versions this server speaks, newest first.
const VERSIONS: [&str; 4] = ["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// What one host's MCP server offers.
pub trait Tools: Send + Sync + 'static {
    /// What the model reads about the server (Claude Code puts it under
    /// "MCP McpServer Instructions").
    const INSTRUCTIONS: &'static str;

    /// The client's `initialize` params, seen; the `experimental`
    /// capabilities the answer declares, if any.
    fn initialize(&self, _params: &Value) -> Option<Value> {
        None
    }

    /// The tools, as `tools/list` names them (an array).
    fn list(&self) -> Value;

    /// Runs the tool `name` with `args`: the `tools/call` result, or `None`
    /// when there is no such tool.
    fn call(&self, name: &str, args: Value) -> impl Future<Output = Option<Value>> + Send;

    /// A notification from the client (by default ignored). Must not block.
    fn notify(&self, _method: &str, _params: Value) {}
}

/// An MCP server of `T`'s tools, as a [`Service`] for
/// [`crate::host::serve_service`].
pub struct McpServer<T> {
    tools: T,
}

impl<T: Tools> McpServer<T> {
    pub fn new(tools: T) -> Arc<Self> {
        Arc::new(Self { tools })
    }

    fn initialize(&self, params: &Value) -> Value {
        let mut capabilities = json!({"tools": {"listChanged": false}});
        if let Some(experimental) = self.tools.initialize(params) {
            capabilities["experimental"] = experimental;
        }
        json!({
            "protocolVersion": protocol_version(params),
            "capabilities": capabilities,
            "serverInfo": {"name": "agent-relay", "version": env!("CARGO_PKG_VERSION")},
            "instructions": T::INSTRUCTIONS,
        })
    }

    async fn call_tool(&self, params: &Value) -> Result<Value, RpcError> {
        let name = params["name"].as_str().unwrap_or_default();
        let args = params.get("arguments").cloned().unwrap_or(json!({}));
        self.tools
            .call(name, args)
            .await
            .ok_or_else(|| RpcError::invalid_params(format!("Unknown tool: {name}")))
    }
}

impl<T: Tools> Service for McpServer<T> {
    async fn call(
        self: Arc<Self>,
        method: String,
        params: Option<Box<RawValue>>,
    ) -> Result<Box<RawValue>, RpcError> {
        let params = tree(params.as_deref())?;
        let result = match method.as_str() {
            "initialize" => self.initialize(&params),
            "ping" => json!({}),
            "tools/list" => json!({"tools": self.tools.list()}),
            "tools/call" => self.call_tool(&params).await?,
            _ => return Err(RpcError::method_not_found(&method)),
        };
        encode_result(&result)
    }

    fn notify(&self, method: &str, params: Option<Box<RawValue>>) {
        match tree(params.as_deref()) {
            Ok(params) => self.tools.notify(method, params),
            Err(e) => tracing::warn!(method, "an unreadable notification: {}", e.message),
        }
    }
}

/// The MCP version to answer `initialize` with: the client's when we
/// speak it, else our newest.
fn protocol_version(params: &Value) -> &'static str {
    let asked = params["protocolVersion"].as_str().unwrap_or_default();
    VERSIONS
        .iter()
        .find(|v| **v == asked)
        .unwrap_or(&VERSIONS[0])
}

/// A request's or notification's params as the tree the MCP side reads
/// them as (`null` when absent).
fn tree(params: Option<&RawValue>) -> Result<Value, RpcError> {
    params.map_or(Ok(Value::Null), |raw| {
        serde_json::from_str(raw.get())
            .map_err(|e| RpcError::invalid_params(format!("Invalid params: {e}")))
    })
}

/// A `tools/call` result: the text, flagged as an error when the tool
/// failed (the model reads it either way).
pub fn tool_result(outcome: Result<String, String>) -> Value {
    match outcome {
        Ok(text) => json!({"content": [{"type": "text", "text": text}]}),
        Err(why) => json!({"content": [{"type": "text", "text": why}], "isError": true}),
    }
}

/// The `send_file` tool as `tools/list` names it.
pub fn send_file_tool() -> Value {
    json!({
        "name": "send_file",
        "description": "Send a file from this session's working directory to its Telegram topic: pictures as photos, anything else as a document (at most 50 MB).",
        "inputSchema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Absolute, or relative to the working directory; it must lie there (links resolved) or in a folder the user allowed."},
                "caption": {"type": "string", "description": "Plain text shown under the file."},
                "as": {"type": "string", "enum": ["photo", "document"], "description": "Left out: a picture small enough goes as a photo."},
            },
            "required": ["path"],
        },
    })
}

/// `send_file`'s arguments as the host protocol's `file/send` params.
pub fn send_file_params(args: Value) -> Result<SendFileParams, String> {
    serde_json::from_value(args).map_err(|e| format!("send_file: {e}"))
}

/// What `send_file` tells the model when the file went, or is on its way.
pub fn sent_text(params: &SendFileParams, result: &SendFileResult) -> String {
    if let Some(kept) = &result.kept {
        return format!("{} is not in the Telegram topic yet: {kept}.", params.path);
    }
    let kind = match result.sent_as {
        SendAs::Photo => "a photo",
        SendAs::Document => "a document",
    };
    format!(
        "Sent {} to the Telegram topic as {kind} ({}).",
        params.path,
        crate::files::describe_size(result.size)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A host with one tool, `echo`, and a channel of its own.
    struct Echo {
        experimental: Option<Value>,
    }

    impl Tools for Echo {
        const INSTRUCTIONS: &'static str = "echoes";

        fn initialize(&self, _params: &Value) -> Option<Value> {
            self.experimental.clone()
        }

        fn list(&self) -> Value {
            json!([{"name": "echo"}])
        }

        async fn call(&self, name: &str, args: Value) -> Option<Value> {
            (name == "echo").then(|| tool_result(Ok(args["text"].to_string())))
        }
    }

    async fn ask(tools: Echo, method: &str, params: Value) -> Result<Value, RpcError> {
        let params = RawValue::from_string(params.to_string()).unwrap();
        let answer = McpServer::new(tools)
            .call(method.into(), Some(params))
            .await?;
        Ok(serde_json::from_str(answer.get()).unwrap())
    }

    #[tokio::test]
    async fn the_method_table_answers_for_the_hosts_tools() {
        let plain = || Echo { experimental: None };
        let init = ask(plain(), "initialize", json!({})).await.unwrap();
        assert_eq!(
            init["capabilities"],
            json!({"tools": {"listChanged": false}}),
            "no experimental capability unless the host has one"
        );
        assert_eq!(init["instructions"], "echoes");
        let channel = Echo {
            experimental: Some(json!({"x/channel": {}})),
        };
        let init = ask(channel, "initialize", json!({})).await.unwrap();
        assert_eq!(
            init["capabilities"]["experimental"],
            json!({"x/channel": {}})
        );
        let listed = ask(plain(), "tools/list", json!({})).await.unwrap();
        assert_eq!(listed, json!({"tools": [{"name": "echo"}]}));
        let called = json!({"name": "echo", "arguments": {"text": "hi"}});
        let called = ask(plain(), "tools/call", called).await.unwrap();
        assert_eq!(called["content"][0]["text"], "\"hi\"");
        let unknown = json!({"name": "nope", "arguments": {}});
        let refused = ask(plain(), "tools/call", unknown).await.unwrap_err();
        assert_eq!(
            (refused.code, refused.message.as_str()),
            (-32602, "Unknown tool: nope")
        );
        let refused = ask(plain(), "server/discover", json!({}))
            .await
            .unwrap_err();
        assert_eq!(refused.code, -32601);
    }

    #[test]
    fn initialize_answers_the_clients_version_when_spoken_else_the_newest() {
        let asked = |v: &str| protocol_version(&json!({"protocolVersion": v}));
        assert_eq!(asked("2025-03-26"), "2025-03-26");
        assert_eq!(asked("2099-01-01"), VERSIONS[0]);
        assert_eq!(protocol_version(&Value::Null), VERSIONS[0]);
    }
}

//! The JSON Schemas under `schema/`: every wire type of the host protocol
//! and the bus, and the config file. `agent-relay schema` writes them, and a
//! test fails when the checked-in copies are stale (`UPDATE_SCHEMAS=1`
//! rewrites them).

use schemars::{JsonSchema, Schema, SchemaGenerator, generate::SchemaSettings};

/// One schema file: its name under `schema/` and its contents.
pub struct SchemaFile {
    pub name: String,
    pub schema: Schema,
}

/// What request `R`'s ack carries, as the protocol names it.
type Reply<R> = <R as crate::protocol::bus::Request>::Reply;

fn file<T: JsonSchema>(name: &str) -> SchemaFile {
    let generator = SchemaGenerator::new(SchemaSettings::draft2020_12());
    SchemaFile {
        name: format!("{name}.schema.json"),
        schema: generator.into_root_schema_for::<T>(),
    }
}

/// Every schema `schema/` must hold, in a stable order.
pub fn schemas() -> Vec<SchemaFile> {
    use crate::protocol::bus as b;
    use crate::protocol::host as h;
    vec![
        // host → sidecar
        file::<h::InitializeParams>("host/initialize.params"),
        file::<h::InitializeResult>("host/initialize.result"),
        file::<h::InitializedParams>("host/initialized.params"),
        file::<h::SessionStartedParams>("host/session-started.params"),
        file::<h::SessionShutdownParams>("host/session-shutdown.params"),
        file::<h::ExecuteParams>("host/command-execute.params"),
        file::<h::ExecuteResult>("host/command-execute.result"),
        file::<h::EmptyParams>("host/agent-started.params"),
        file::<h::AgentEndedParams>("host/agent-ended.params"),
        file::<h::EmptyParams>("host/turn-started.params"),
        file::<h::TurnEndedParams>("host/turn-ended.params"),
        file::<h::TurnTextParams>("host/turn-text.params"),
        file::<h::ToolParams>("host/tool-started.params"),
        file::<h::ToolParams>("host/tool-ended.params"),
        file::<h::InputReceivedParams>("host/input-received.params"),
        file::<h::ShutdownParams>("host/shutdown.params"),
        file::<h::SendFileParams>("host/file-send.params"),
        file::<h::SendFileResult>("host/file-send.result"),
        file::<h::TopicSendParams>("host/topic-send.params"),
        file::<h::TopicSendResult>("host/topic-send.result"),
        file::<h::NoticeParams>("host/agent-notice.params"),
        file::<h::ApprovalParams>("host/approval-request.params"),
        file::<h::ApprovalResult>("host/approval-request.result"),
        file::<h::ApprovalResolvedParams>("host/approval-resolved.params"),
        file::<h::QuestionParams>("host/question-ask.params"),
        file::<h::QuestionResult>("host/question-ask.result"),
        file::<h::QuestionResolvedParams>("host/question-resolved.params"),
        file::<h::TakenParams>("host/agent-taken.params"),
        // sidecar → host
        file::<h::SetStatusParams>("host/ui-set-status.params"),
        file::<h::NotifyParams>("host/ui-notify.params"),
        file::<h::ConfirmParams>("host/ui-confirm.params"),
        file::<h::ConfirmResult>("host/ui-confirm.result"),
        file::<h::SendUserMessageParams>("host/agent-send-user-message.params"),
        file::<h::SendUserMessageResult>("host/agent-send-user-message.result"),
        file::<h::AbortParams>("host/agent-abort.params"),
        file::<h::AbortParams>("host/agent-abort.result"),
        // bus
        file::<b::ToLeader>("bus/to-leader"),
        file::<b::FromLeader>("bus/from-leader"),
        file::<Reply<b::Register>>("bus/register.result"),
        file::<Reply<b::Reconcile>>("bus/reconcile.result"),
        file::<Reply<b::Disconnect>>("bus/disconnect.result"),
        file::<Reply<b::Restart>>("bus/restart.result"),
        file::<Reply<b::StatusQuery>>("bus/status.result"),
        file::<Reply<b::Pair>>("bus/pair.result"),
        file::<Reply<b::Fetch>>("bus/fetch.result"),
        file::<Reply<b::Post>>("bus/post.result"),
        file::<Reply<b::Resend>>("bus/resend.result"),
        file::<Reply<b::ServeHello>>("bus/serve.result"),
        // agent-relay serve across machines (the cluster's launch question)
        file::<crate::protocol::launch::RemoteOrder>("cluster/launch.question"),
        file::<crate::protocol::launch::RemoteDone>("cluster/launch.answer"),
        // Claude Code: agent-relay hook ⇄ agent-relay mcp
        file::<crate::protocol::claude::HookCall>("claude/hook-call"),
        file::<crate::protocol::claude::HookAnswer>("claude/hook-answer"),
        // config
        file::<crate::config::ConfigFile>("config"),
    ]
}

impl SchemaFile {
    /// The file's bytes: pretty JSON with a trailing newline.
    pub fn render(&self) -> String {
        let mut text = serde_json::to_string_pretty(&self.schema).expect("schemas serialize");
        text.push('\n');
        text
    }
}

/// Writes every schema under `dir` (creating subfolders); returns the paths.
pub fn write_schemas(dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut written = Vec::new();
    for file in schemas() {
        let path = dir.join(&file.name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, file.render())?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> std::path::PathBuf {
        std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
    }

    fn updating() -> bool {
        std::env::var_os("UPDATE_SCHEMAS").is_some_and(|v| v == "1")
    }

    /// `extension-manifest.json` is checked in for hosts to read: it fails
    /// when it drifts from the code, and is rewritten under
    /// `UPDATE_SCHEMAS=1`.
    #[test]
    fn manifest_matches_the_sidecar() {
        let path = root().join("extension-manifest.json");
        let mut manifest: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let commands = serde_json::to_value(crate::commands::specs()).unwrap();
        let files: Vec<String> = schemas().into_iter().map(|f| f.name).collect();
        let current = manifest["commands"] == commands
            && manifest["version"] == env!("CARGO_PKG_VERSION")
            && manifest["schemas"]["files"] == serde_json::json!(files);
        if !current && updating() {
            manifest["commands"] = commands;
            manifest["version"] = env!("CARGO_PKG_VERSION").into();
            manifest["schemas"]["files"] = serde_json::json!(files);
            let mut text = serde_json::to_string_pretty(&manifest).unwrap();
            text.push('\n');
            std::fs::write(&path, text).unwrap();
            return;
        }
        assert_eq!(
            manifest["commands"], commands,
            "manifest commands differ from initialize's"
        );
        assert_eq!(manifest["version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(manifest["schemas"]["files"], serde_json::json!(files));
        assert_eq!(
            manifest["protocolVersion"],
            crate::protocol::host::PROTOCOL_VERSION
        );
        assert_eq!(manifest["statusKey"], crate::protocol::host::STATUS_KEY);
        assert_eq!(manifest["transport"]["framing"], "ndjson");
        assert_eq!(manifest["transport"]["protocol"], "jsonrpc-2.0");
    }
}

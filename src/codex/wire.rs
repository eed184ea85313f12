//! The shapes of Codex's app-server protocol that the relay reads and
//! writes, and only those (docs/CODEX.md lists each, checked against the
//! pinned Codex with `codex app-server generate-json-schema`). They are
//! Codex's, not ours, so they live here rather than in `protocol/` with a
//! schema of their own. Every struct ignores the fields it does not name,
//! and an item or status of a kind the relay does not know reads as
//! `Other`: a newer Codex adds kinds without breaking the relay.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub mod method {
    //! Method names, one place.

    // The relay → the app-server.
    pub const INITIALIZE: &str = "initialize";
    pub const INITIALIZED: &str = "initialized";
    pub const THREAD_START: &str = "thread/start";
    pub const THREAD_RESUME: &str = "thread/resume";
    pub const THREAD_LOADED_LIST: &str = "thread/loaded/list";
    pub const THREAD_READ: &str = "thread/read";
    pub const TURN_START: &str = "turn/start";
    pub const TURN_INTERRUPT: &str = "turn/interrupt";
    pub const TURN_STEER: &str = "turn/steer";
    pub const MODEL_LIST: &str = "model/list";
    pub const THREAD_NAME_SET: &str = "thread/name/set";
    pub const HOOKS_LIST: &str = "hooks/list";
    pub const CONFIG_BATCH_WRITE: &str = "config/batchWrite";

    // The app-server's notifications.
    pub const THREAD_STARTED: &str = "thread/started";
    pub const THREAD_STATUS_CHANGED: &str = "thread/status/changed";
    pub const TURN_STARTED: &str = "turn/started";
    pub const TURN_COMPLETED: &str = "turn/completed";
    pub const ITEM_STARTED: &str = "item/started";
    pub const ITEM_COMPLETED: &str = "item/completed";
    pub const SERVER_REQUEST_RESOLVED: &str = "serverRequest/resolved";

    // The app-server's requests to its clients.
    pub const COMMAND_APPROVAL: &str = "item/commandExecution/requestApproval";
    pub const FILE_CHANGE_APPROVAL: &str = "item/fileChange/requestApproval";
    pub const PERMISSIONS_APPROVAL: &str = "item/permissions/requestApproval";
    pub const USER_INPUT: &str = "item/tool/requestUserInput";

    /// Notifications the relay never reads, left out of its connection at
    /// `initialize` (`optOutNotificationMethods`): the streamed deltas come
    /// once per token or output chunk, and the relay takes each item whole.
    pub const NOT_READ: &[&str] = &[
        "item/agentMessage/delta",
        "item/commandExecution/outputDelta",
        "item/fileChange/outputDelta",
        "item/reasoning/textDelta",
        "item/reasoning/summaryTextDelta",
        "item/reasoning/summaryPartAdded",
        "item/plan/delta",
        "thread/tokenUsage/updated",
        "account/rateLimits/updated",
    ];
}

/// `initialize` params.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    pub client_info: ClientInfo,
    pub capabilities: Capabilities,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClientInfo {
    pub name: String,
    pub title: String,
    pub version: String,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    pub opt_out_notification_methods: Vec<String>,
}

/// A thread, as `thread/started`, `thread/start` and `thread/resume` carry it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Thread {
    pub id: String,
    #[serde(default)]
    pub cwd: Option<String>,
    /// Not kept on disk: the TUI's helper threads (a title, a summary).
    #[serde(default)]
    pub ephemeral: bool,
    /// A sub-agent's thread names the thread that spawned it.
    #[serde(default)]
    pub parent_thread_id: Option<String>,
    /// What the user named the thread (`/rename`), if anything.
    #[serde(default)]
    pub name: Option<String>,
    /// The model its turns run with unless a turn names another.
    #[serde(default)]
    pub model: Option<String>,
}

impl Thread {
    /// Whether this is a conversation a person has with Codex, rather than
    /// a helper or a sub-agent of one.
    pub fn is_conversation(&self) -> bool {
        !self.ephemeral && self.parent_thread_id.is_none()
    }
}

/// `thread/started` params; the `thread` of `thread/start` and
/// `thread/resume` results.
#[derive(Debug, Clone, Deserialize)]
pub struct WithThread {
    pub thread: Thread,
}

/// `model/list` result: the models Codex offers (its own catalogue, known
/// offline too), a page at a time.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelList {
    pub data: Vec<Model>,
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// One model of `model/list`: `model` is what a turn names.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Model {
    pub model: String,
    #[serde(default)]
    pub display_name: String,
    #[serde(default)]
    pub hidden: bool,
}

/// `thread/start` params (a thread the relay starts itself).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadStartParams {
    pub cwd: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// `thread/resume` params: subscribes this connection to the thread's
/// events (its turns are not wanted, only what happens from now on).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadResumeParams {
    pub thread_id: String,
    pub exclude_turns: bool,
}

/// `thread/loaded/list` result.
#[derive(Debug, Clone, Deserialize)]
pub struct LoadedThreads {
    #[serde(default)]
    pub data: Vec<String>,
}

/// One part of a prompt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum UserInput {
    Text {
        text: String,
    },
    /// A picture on this machine, which Codex shows the model.
    LocalImage {
        path: String,
    },
    #[serde(other)]
    Other,
}

/// `turn/start` params. Sent while a turn runs, it joins that turn.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnStartParams {
    pub thread_id: String,
    pub input: Vec<UserInput>,
    /// Comes back as the `clientId` of the prompt's `userMessage` item: how
    /// the relay knows a turn came from the phone.
    pub client_user_message_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// `turn/steer` params: input into the turn `expected_turn_id`, which must
/// be the thread's running turn (Codex refuses it otherwise).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnSteerParams {
    pub thread_id: String,
    pub input: Vec<UserInput>,
    pub expected_turn_id: String,
    pub client_user_message_id: String,
}

/// `turn/interrupt` params.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnInterruptParams {
    pub thread_id: String,
    pub turn_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TurnStatus {
    InProgress,
    Completed,
    Interrupted,
    Failed,
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TurnError {
    #[serde(default)]
    pub message: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Turn {
    pub id: String,
    pub status: TurnStatus,
    #[serde(default)]
    pub error: Option<TurnError>,
}

/// `turn/started` and `turn/completed` params; the result of `turn/start`
/// has the `turn` alone.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnEvent {
    #[serde(default)]
    pub thread_id: String,
    pub turn: Turn,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ItemStatus {
    InProgress,
    Completed,
    Failed,
    Declined,
    #[serde(other)]
    Other,
}

/// One change of a `fileChange` item.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FileUpdate {
    pub path: String,
    #[serde(default)]
    pub diff: String,
}

/// What a turn is made of, as far as the relay reads it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Item {
    #[serde(rename_all = "camelCase")]
    UserMessage {
        id: String,
        #[serde(default)]
        content: Vec<UserInput>,
        /// The `clientUserMessageId` of the `turn/start` that sent it.
        #[serde(default)]
        client_id: Option<String>,
    },
    AgentMessage {
        id: String,
        #[serde(default)]
        text: String,
    },
    CommandExecution {
        id: String,
        #[serde(default)]
        command: String,
        status: ItemStatus,
    },
    FileChange {
        id: String,
        #[serde(default)]
        changes: Vec<FileUpdate>,
        status: ItemStatus,
    },
    McpToolCall {
        id: String,
        #[serde(default)]
        server: String,
        #[serde(default)]
        tool: String,
        #[serde(default)]
        arguments: Value,
    },
    DynamicToolCall {
        id: String,
        #[serde(default)]
        tool: String,
        #[serde(default)]
        arguments: Value,
    },
    WebSearch {
        id: String,
        #[serde(default)]
        query: String,
    },
    #[serde(other)]
    Other,
}

/// `item/started` and `item/completed` params.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ItemEvent {
    #[serde(default)]
    pub thread_id: String,
    pub item: Item,
}

/// `thread/status/changed` params: only which thread matters to the relay
/// (a thread that becomes active has a turn, so it can be resumed).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadStatusChanged {
    pub thread_id: String,
}

/// `serverRequest/resolved` params: a request to the clients was answered
/// (by any of them) or withdrawn. The id is the one this connection got
/// the request under.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerRequestResolved {
    pub request_id: Value,
}

/// What Codex's three approval requests share: whose call it is, and why
/// the model wants it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalAsked {
    pub thread_id: String,
    pub turn_id: String,
    pub item_id: String,
    /// Why the model wants it (its `justification`).
    #[serde(default)]
    pub reason: Option<String>,
}

/// `item/commandExecution/requestApproval` params.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CommandApproval {
    #[serde(flatten)]
    pub asked: ApprovalAsked,
    /// The whole command line, e.g. `/bin/bash -lc 'touch x'`.
    #[serde(default)]
    pub command: Option<String>,
    /// The parsed command, for showing: `[{type, command, …}]`.
    #[serde(default)]
    pub command_actions: Vec<CommandAction>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CommandAction {
    #[serde(default)]
    pub command: String,
}

/// `item/fileChange/requestApproval` params; the changes themselves came
/// with the item's `item/started`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileChangeApproval {
    #[serde(flatten)]
    pub asked: ApprovalAsked,
    /// Writes under this folder for the rest of the session.
    #[serde(default)]
    pub grant_root: Option<String>,
}

/// `item/permissions/requestApproval` params.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PermissionsApproval {
    #[serde(flatten)]
    pub asked: ApprovalAsked,
    /// What is asked for (`fileSystem`, `network`), granted as it is.
    #[serde(default)]
    pub permissions: Value,
}

/// The answer to a command or file-change approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ApprovalDecision {
    Accept,
    /// Accept, and the same command (the same files) does not ask again
    /// in this thread.
    AcceptForSession,
    /// Refused; the model is told and the turn goes on.
    Decline,
}

#[derive(Debug, Clone, Serialize)]
pub struct ApprovalAnswer {
    pub decision: ApprovalDecision,
}

/// The answer to a permissions approval: what is granted (an empty
/// profile grants nothing) and for how long.
#[derive(Debug, Clone, Serialize)]
pub struct PermissionsAnswer {
    pub permissions: Value,
    /// `turn` or `session`.
    pub scope: &'static str,
}

/// `item/tool/requestUserInput` params: the model asks its user.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserInputRequest {
    pub thread_id: String,
    #[serde(default)]
    pub questions: Vec<UserQuestion>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UserQuestion {
    pub id: String,
    #[serde(default)]
    pub header: String,
    #[serde(default)]
    pub question: String,
    #[serde(default)]
    pub options: Option<Vec<UserOption>>,
    /// A written answer is welcome beside the options.
    #[serde(default)]
    pub is_other: bool,
    /// Not to be shown: the phone is not asked.
    #[serde(default)]
    pub is_secret: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct UserOption {
    pub label: String,
    #[serde(default)]
    pub description: String,
}

/// The answer to `item/tool/requestUserInput`: each question's id with
/// its answers.
#[derive(Debug, Clone, Default, Serialize)]
pub struct UserInputAnswer {
    pub answers: std::collections::BTreeMap<String, Answers>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Answers {
    pub answers: Vec<String>,
}

/// `hooks/list` params and result (`agent-relay install codex`).
#[derive(Debug, Clone, Serialize)]
pub struct HooksListParams {
    pub cwds: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct HooksList {
    #[serde(default)]
    pub data: Vec<HooksOfFolder>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct HooksOfFolder {
    #[serde(default)]
    pub hooks: Vec<HookEntry>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HookEntry {
    pub key: String,
    pub current_hash: String,
    /// `trusted`, `untrusted`, `modified` or `managed`.
    #[serde(default)]
    pub trust_status: String,
    #[serde(default)]
    pub command: Option<String>,
}

/// `config/batchWrite` params: edits to the user's `config.toml`, made by
/// Codex itself.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigBatchWrite {
    pub edits: Vec<ConfigEdit>,
    pub reload_user_config: bool,
}

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConfigEdit {
    pub key_path: String,
    pub value: Value,
    /// `replace` or `upsert`.
    pub merge_strategy: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn items_of_known_and_unknown_kinds_read() {
        let item: Item = serde_json::from_value(json!({
            "type": "commandExecution", "id": "c1", "command": "/bin/bash -lc 'ls'",
            "status": "declined", "cwd": "/p", "commandActions": [], "processId": null
        }))
        .unwrap();
        assert_eq!(
            item,
            Item::CommandExecution {
                id: "c1".into(),
                command: "/bin/bash -lc 'ls'".into(),
                status: ItemStatus::Declined
            }
        );
        let later: Item =
            serde_json::from_value(json!({"type": "imageGeneration", "id": "i", "status": "x"}))
                .unwrap();
        assert_eq!(later, Item::Other);
        let mine: Item = serde_json::from_value(json!({
            "type": "userMessage", "id": "u", "clientId": "relay-7",
            "content": [{"type": "text", "text": "hi", "text_elements": []}, {"type": "mention", "name": "x"}]
        }))
        .unwrap();
        assert_eq!(
            mine,
            Item::UserMessage {
                id: "u".into(),
                content: vec![UserInput::Text { text: "hi".into() }, UserInput::Other],
                client_id: Some("relay-7".into())
            }
        );
    }

    #[test]
    fn a_turn_status_codex_adds_later_reads_as_other() {
        let turn: TurnEvent = serde_json::from_value(
            json!({"threadId": "t", "turn": {"id": "u", "status": "paused", "items": []}}),
        )
        .unwrap();
        assert_eq!(turn.turn.status, TurnStatus::Other);
    }
}

//! The host protocol (docs/DESIGN.md, "The host protocol"): JSON-RPC 2.0
//! params and results between a coding agent and its sidecar. Field names
//! are camelCase on the wire; unknown fields are ignored so hosts can be
//! newer than we are.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The host protocol version this sidecar speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// The status-line key the sidecar writes (`ui/setStatus`).
pub const STATUS_KEY: &str = "relay";

pub mod method {
    //! Method names, one place.
    pub const INITIALIZE: &str = "initialize";
    pub const INITIALIZED: &str = "initialized";
    pub const SESSION_STARTED: &str = "session/started";
    pub const SESSION_SHUTDOWN: &str = "session/shutdown";
    pub const COMMAND_EXECUTE: &str = "command/execute";
    pub const AGENT_STARTED: &str = "agent/started";
    pub const AGENT_ENDED: &str = "agent/ended";
    pub const TURN_STARTED: &str = "turn/started";
    pub const TURN_ENDED: &str = "turn/ended";
    pub const TURN_TEXT: &str = "turn/text";
    pub const TOOL_STARTED: &str = "tool/started";
    pub const TOOL_ENDED: &str = "tool/ended";
    pub const INPUT_RECEIVED: &str = "input/received";
    pub const SHUTDOWN: &str = "shutdown";
    pub const UI_SET_STATUS: &str = "ui/setStatus";
    pub const UI_NOTIFY: &str = "ui/notify";
    pub const UI_CONFIRM: &str = "ui/confirm";
    pub const AGENT_SEND_USER_MESSAGE: &str = "agent/sendUserMessage";
    pub const AGENT_ABORT: &str = "agent/abort";
    pub const APPROVAL_REQUEST: &str = "approval/request";
    pub const QUESTION_ASK: &str = "question/ask";
    pub const UI_SELECT: &str = "ui/select";
    pub const CANCEL_REQUEST: &str = "$/cancelRequest";
    pub const FILE_SEND: &str = "file/send";
    pub const TOPIC_SEND: &str = "topic/send";
    pub const AGENT_NOTICE: &str = "agent/notice";
    pub const APPROVAL_RESOLVED: &str = "approval/resolved";
    pub const QUESTION_RESOLVED: &str = "question/resolved";
    pub const AGENT_TAKEN: &str = "agent/taken";
}

// ---------------------------------------------------------------- host → sidecar

/// `initialize` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    /// The newest protocol version the host speaks.
    pub protocol_version: u32,
    pub host: HostInfo,
    /// The host's process id.
    #[serde(default)]
    pub pid: Option<u32>,
    /// The session's working directory.
    pub cwd: String,
    pub session: SessionInfo,
    /// Whether the host can show dialogs (`ui/confirm`).
    #[serde(default, rename = "hasUI")]
    pub has_ui: bool,
    /// Whether `agent/abort` can stop the host's turn. Where it cannot
    /// (Claude Code at its own keyboard), a private chat's draft offers no
    /// stop button: a button that cannot stop anything is not shown.
    #[serde(default = "can_abort_by_default", rename = "canAbort")]
    pub can_abort: bool,
    /// Whether a prompt sent `deliverAs: steer` while a turn runs goes into
    /// that turn (the model's next request has it). Where it can, a message
    /// written mid-turn waits in the relay for the next turn and the topic
    /// offers to steer it in; where it cannot (or the host says nothing, as
    /// an older one), `/steer` says why and nothing is offered.
    #[serde(default, rename = "canSteer")]
    pub can_steer: bool,
}

/// Hosts that said nothing about it (pi's extension, older hosts) can.
fn can_abort_by_default() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HostInfo {
    pub name: String,
    #[serde(default)]
    pub version: String,
}

/// The agent session the host runs. `file` names it across restarts when the
/// host persists sessions; `name` is what the user calls it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionInfo {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `initialize` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    pub protocol_version: u32,
    pub sidecar: SidecarInfo,
    pub commands: Vec<CommandSpec>,
    pub status_key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SidecarInfo {
    pub name: String,
    pub version: String,
}

/// A command the host should offer its user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CommandSpec {
    /// Without the leading slash, e.g. `telegram-connect` or `relay`.
    pub name: String,
    pub description: String,
    /// Usage of the arguments, e.g. `status | restart`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<String>,
}

/// `initialized` params (nothing is required).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InitializedParams {}

/// `session/started` params: the host began (or switched to) a session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionStartedParams {
    /// e.g. `startup`, `new`, `resume`, `fork`, `reload`.
    pub reason: String,
    /// The session now running, when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<SessionInfo>,
}

/// `session/shutdown` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionShutdownParams {
    pub reason: String,
}

/// `command/execute` params. `name` is with or without the leading slash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ExecuteParams {
    pub name: String,
    #[serde(default)]
    pub args: String,
}

/// `command/execute` result: `message` is shown to the user as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ExecuteResult {
    pub ok: bool,
    pub message: String,
    /// The user declined a confirmation the command asked for: nothing
    /// changed, and that is no error (`ok` is false all the same).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancelled: bool,
}

impl ExecuteResult {
    pub fn new(ok: bool, message: impl Into<String>) -> Self {
        Self {
            ok,
            message: message.into(),
            cancelled: false,
        }
    }

    /// The user said no: nothing changed.
    pub fn cancelled(message: impl Into<String>) -> Self {
        Self {
            cancelled: true,
            ..Self::new(false, message)
        }
    }
}

/// `agent/started`, `turn/started` params (nothing is required).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EmptyParams {}

/// `agent/ended` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentEndedParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_assistant_text: Option<String>,
    /// The run was stopped (`/stop`, Escape): its last answer is cut off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub aborted: bool,
    /// The run failed for good with this error (its model call did, and
    /// the host will not try again): no answer comes of it, whatever text
    /// it had written, and the topic is told so once. A host that tries a
    /// failed call again itself (pi) says this only after its last try.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `turn/ended` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnEndedParams {
    #[serde(default)]
    pub assistant_text: String,
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// The turn was stopped: its text is cut off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub aborted: bool,
    /// The turn's model call failed with this error (a stream cut
    /// mid-answer, a 503): its text is broken, never an answer or a line of
    /// the progress. The host may try again; `agent/ended` says whether the
    /// run failed for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `turn/text` params: the text the current turn has written so far, while
/// it writes it. Each one supersedes the last (a host may send them as
/// often as it likes; the sidecar shows the newest now and then, where the
/// chat can show a draft); `turn/ended` still brings the whole.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnTextParams {
    #[serde(default)]
    pub text: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ToolCall {
    pub name: String,
}

/// `tool/started` and `tool/ended` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolParams {
    #[serde(default)]
    pub tool_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The call's arguments (`tool/started`), for showing what it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
}

/// `input/received` params: the user (or an extension) gave the agent input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct InputReceivedParams {
    pub text: String,
    /// `interactive`, `rpc` or `extension`; input from `extension` that we
    /// injected ourselves is not echoed back to Telegram.
    #[serde(default)]
    pub source: String,
}

/// `shutdown` params.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ShutdownParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

// ---------------------------------------------------------------- sidecar → host

/// How a status text should be coloured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Tone {
    Info,
    Success,
    Warning,
    Error,
    Muted,
}

/// `ui/setStatus` params; `text: null` clears the entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SetStatusParams {
    pub key: String,
    pub text: Option<String>,
    pub tone: Tone,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NotifyLevel {
    Info,
    Warning,
    Error,
}

/// `ui/notify` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NotifyParams {
    pub message: String,
    pub level: NotifyLevel,
}

/// `ui/confirm` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfirmParams {
    pub title: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// `ui/confirm` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ConfirmResult {
    pub confirmed: bool,
}

/// How a prompt reaches a busy agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DeliverAs {
    /// Into the running turn, which goes on with it (`/steer`, the topic's
    /// ⚡ Steer now): sent only to a host that said `canSteer`. A host whose
    /// turn has ended meanwhile takes it as a prompt.
    Steer,
    /// Queue after the current turn.
    FollowUp,
}

/// Where a relayed prompt came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MessageOrigin {
    pub chat_id: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<i64>,
    pub user_id: i64,
    pub update_id: i64,
    /// The Telegram message, in its chat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<i64>,
}

/// `agent/sendUserMessage` params.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendUserMessageParams {
    /// The prompt. With attachments it is the caption (or a voice note's
    /// transcript) followed by one line per file naming its path, so a host
    /// that ignores `attachments` still tells the agent where they are.
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver_as: Option<DeliverAs>,
    pub origin: MessageOrigin,
    /// Files that came with the message (an album: every file of it),
    /// already saved on this machine. A host that can show images to its
    /// model passes the photos as images.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
}

/// What kind of file a Telegram message carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum AttachmentKind {
    /// A picture Telegram compressed (always JPEG).
    Photo,
    /// Any file sent as it is (a screenshot sent "as a file" too).
    Document,
    /// A voice note (OGG/Opus).
    Voice,
    Audio,
    Video,
    /// A round video message.
    VideoNote,
    /// A GIF or silent video.
    Animation,
}

/// A file from Telegram, saved in the session's inbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Attachment {
    pub kind: AttachmentKind,
    /// Absolute path of the saved file.
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Bytes.
    pub size: u64,
    /// The name the sender gave it (documents, audio, video), as sent:
    /// never used as a path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Seconds, for voice notes, audio and video.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<u32>,
}

/// How a file goes to Telegram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SendAs {
    /// Shown inline, recompressed by Telegram (JPEG, PNG, GIF, WebP, BMP up
    /// to 10 MB).
    Photo,
    /// Sent byte for byte (up to 50 MB).
    Document,
}

/// `file/send` params (host → sidecar): the agent sends a file into its
/// session's topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendFileParams {
    /// Absolute, or relative to the session's working directory. It must
    /// lie there (symbolic links resolved) or under a folder of
    /// `[files] send_from`.
    pub path: String,
    /// Shown under the file, plain text (at most 1024 characters; longer is
    /// cut).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caption: Option<String>,
    /// Photo or document; left out, a picture small enough goes as a photo
    /// and everything else as a document.
    #[serde(default, rename = "as", skip_serializing_if = "Option::is_none")]
    pub send_as: Option<SendAs>,
}

/// The JSON-RPC error code of a `file/send` that was not done; the message
/// says why (not connected, outside the allowed folders, too big, Telegram
/// refused it).
pub const FILE_NOT_SENT: i32 = -32001;

/// `file/send` result, within [`ANSWER_WITHIN`] whatever Telegram does. A
/// refusal is a JSON-RPC error ([`FILE_NOT_SENT`]) whose message says why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendFileResult {
    /// The message that holds the file; 0 while it is `kept`.
    pub message_id: i64,
    /// How it went; while it is `kept`, how it was asked to go (a
    /// document when that was left open).
    pub sent_as: SendAs,
    /// Bytes sent (while it is `kept`, the file's size).
    pub size: u64,
    /// Telegram has not answered yet: the upload goes on, and the topic is
    /// told if the file does not arrive. Says why it waits, as a sentence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<String>,
}

/// How long `file/send` and `topic/send` take at most before they answer
/// (hand-over included): what Telegram has not done by then is `kept`.
/// Tools answer within 2 s, and an agent's turn never waits on Telegram.
pub const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_millis(1_500);

/// `agent/sendUserMessage` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SendUserMessageResult {
    pub accepted: bool,
    /// Accepted, but no turn took it yet (a host whose turns fetch their
    /// messages, as Claude Code's `telegram_inbox`): the relay keeps it
    /// until the host says `agent/taken`, so a session that ends first
    /// gets it again when it is resumed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queued: bool,
}

/// `agent/taken` params (host → sidecar, notification): messages a turn
/// took, which the host had answered `queued`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TakenParams {
    /// Their `origin.updateId`s.
    pub update_ids: Vec<i64>,
}

/// `agent/abort` params and result (both empty objects).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AbortParams {}

// ---------------------------------------------------------------- approvals and questions

/// `approval/request` params (host → sidecar): a tool call the agent is
/// about to make. The sidecar applies the `[approvals]` policy and, when a
/// person must decide, asks on the phone (and at the terminal, with
/// `ui/select`, when the policy says both).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalParams {
    pub tool_call_id: String,
    pub tool: String,
    /// The call's arguments, as the agent gave them.
    #[serde(default)]
    pub input: serde_json::Value,
    /// The turn was started by a message from Telegram.
    #[serde(default)]
    pub from_telegram: bool,
}

/// `approval/request` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalResult {
    pub decision: Decision,
    /// Why, for the agent and the log (a denial's reason reaches the model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub by: DecidedBy,
    /// The person allowed it for the rest of the session ("Allow for this
    /// session"): a host that can remember that itself (Codex's
    /// `acceptForSession`) does; the relay's own grant holds either way.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub for_session: bool,
}

/// `approval/resolved` params (host → sidecar, a notification): the host
/// asked at its own terminal too (Codex's TUI always does), and the answer
/// there came first. The phone's question for `toolCallId` closes, saying
/// so; the `approval/request` still gets its answer, which the host then
/// ignores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalResolvedParams {
    pub tool_call_id: String,
    /// What the terminal decided, when the host knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
}

/// `question/resolved` params (host → sidecar, a notification): the
/// question `id` was answered at the host's own terminal first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct QuestionResolvedParams {
    pub id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Decision {
    Allow,
    Deny,
    /// The relay does not decide: the host goes on as it would without it.
    Defer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DecidedBy {
    Phone,
    Terminal,
    /// The policy needs no approval for this call.
    Policy,
    /// An "allow for this session" grant still runs.
    Grant,
    /// Nobody answered in time.
    Timeout,
    /// Nobody could be asked: no topic, no relay, no terminal.
    Unavailable,
}

/// `question/ask` params (host → sidecar): the agent asks its user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuestionParams {
    pub question: String,
    /// Answers to choose from; may be empty when `allowText`.
    #[serde(default)]
    pub options: Vec<String>,
    /// A free-text answer is welcome.
    #[serde(default)]
    pub allow_text: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Names the question for a later `question/resolved`, when the host
    /// asks at its own terminal too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// `question/ask` result: the answer, or none (`by` says why).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QuestionResult {
    /// The chosen option's index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<u32>,
    /// The answer as text: the chosen option, or what was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    pub by: DecidedBy,
    /// Why nobody answered (`timeout`, `unavailable`): the question never
    /// reached the phone (Telegram not answering), or nobody took it up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `ui/select` params (sidecar → host): a choice at the terminal. The
/// sidecar may withdraw it with `$/cancelRequest` (the phone answered).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelectParams {
    pub title: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub options: Vec<String>,
    /// Offer a text field as well.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_text: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// `ui/select` result; neither field: dismissed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelectResult {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// `$/cancelRequest` params (sidecar → host, a notification): the request
/// `id` (a dialog) is no longer wanted; the host may close it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CancelParams {
    pub id: u64,
}

// ---------------------------------------------------------------- the agent's own words

/// `topic/send` params (host → sidecar): Markdown the agent sends into its
/// topic now, through a tool of its own (Claude Code's `reply`), rendered
/// and split as an answer is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TopicSendParams {
    pub text: String,
}

/// `topic/send` result, within [`ANSWER_WITHIN`]: the messages went out,
/// or they are `kept` (the relay has them and posts them when Telegram
/// answers; `reason` says why they wait), or why none will go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TopicSendResult {
    pub sent: bool,
    /// Messages posted, or kept to be posted (a long text is split).
    #[serde(default)]
    pub messages: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Not out yet, but the relay's to post: they go when Telegram answers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept: bool,
}

/// `agent/notice` params (host → sidecar, a notification): something the
/// person should hear in the topic, e.g. that the agent waits for them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct NoticeParams {
    pub text: String,
}

//! The bus protocol (docs/DESIGN.md, "The bus"): `kind`-tagged envelopes on
//! the leader's local socket, one JSON object per line. Requests carry an
//! `id` and are answered with an [`Ack`] carrying the same id, the leader's
//! current epoch and the request's outcome.
//!
//! A session asks the leader for *what* to do in its topic ([`TopicOp`]),
//! never *where*: no envelope a follower sends names a chat or a topic. The
//! leader fills the target from the session's registration, so a follower
//! cannot reach another session's topic because it cannot name one.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;

/// The bus protocol version; a leader refuses a follower that speaks another.
/// 3: deliveries carry files, fetched with `fetch`; `sendFile` (a follower
/// of 2 would hand its host an empty prompt for a photo); the `paced` and
/// blocker frames, background topic requests.
/// 4: answers are handed over (`post`), kept by the leader and sent from
/// its store; `resend`; the `outbox` and `topicGone` frames (a follower of
/// 3 would wait for answers to be sent, and lose them with its process).
/// 5: `agent-relay serve` joins (`serve`, `orderDone`, `launchReport`; the
/// leader's `order`), and `register` says which launch a session is (a
/// leader of 4 would take serve for a session and never start anything).
/// 6: an ask says whom it concerns (`Ask::concerns`: an approval only its
/// requester or an owner may answer, under `[approvals] by`), a delivery
/// says it is a scheduled firing, and a topic request may fail
/// `unsupported` (a leader of 5 would let anyone answer any approval).
pub const BUS_PROTOCOL_VERSION: u32 = 6;

pub use super::host::{AttachmentKind, SendAs};
pub use super::launch::{
    LaunchReport, Order, OrderDone, ServeHello, ServeStatus, ServeWelcome, SessionLaunch,
};
pub use crate::ids::{Epoch, Generation, Slot, Target};

/// A session's route as the follower remembers it; carried on re-register so
/// a new leader reuses the topic instead of creating a duplicate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    pub profile_key: String,
    pub slot: Slot,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    pub topic_name: String,
}

// ---------------------------------------------------------------- follower → leader

/// Every frame a sidecar sends to the leader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum ToLeader {
    Register(Register),
    Heartbeat(Heartbeat),
    Reconcile(Reconcile),
    Disconnect(Disconnect),
    Topic(TopicRequest),
    DeliveryAck(DeliveryAck),
    Restart(Restart),
    Status(StatusQuery),
    Pair(Pair),
    Fetch(Fetch),
    /// `agent-relay serve` joins as this machine's launcher.
    Serve(ServeHello),
    /// `serve` answers an order.
    OrderDone(OrderDone),
    /// `serve` says what happened to a launched session.
    LaunchReport(LaunchReport),
    Post(Post),
    Resend(Resend),
}

/// A request to the leader, and the type its [`Ack`] carries: the leader
/// answers with [`Ack::answer`] and the member reads it with
/// [`Ack::reply`], so both ends agree on the answer's type at compile time
/// (a [`DeliveryAck`] is no request: it gets no answer).
pub trait Request: Into<ToLeader> {
    type Reply: Serialize + serde::de::DeserializeOwned;
    /// The id the ack echoes.
    fn id(&self) -> u64;
}

/// Each request with the variant it travels as and the type of its answer.
macro_rules! requests {
    ($($variant:ident($request:ty) -> $reply:ty;)*) => {$(
        impl Request for $request {
            type Reply = $reply;
            fn id(&self) -> u64 {
                self.id
            }
        }
        impl From<$request> for ToLeader {
            fn from(request: $request) -> Self {
                ToLeader::$variant(request)
            }
        }
    )*};
}

requests! {
    Register(Register) -> Registered;
    Heartbeat(Heartbeat) -> ();
    Reconcile(Reconcile) -> Reconciled;
    Disconnect(Disconnect) -> Disconnected;
    Topic(TopicRequest) -> TopicDone;
    Restart(Restart) -> Restarting;
    Status(StatusQuery) -> BusStatus;
    Pair(Pair) -> PairingLink;
    Fetch(Fetch) -> Fetched;
    Serve(ServeHello) -> ServeWelcome;
    OrderDone(OrderDone) -> ();
    LaunchReport(LaunchReport) -> ();
    Post(Post) -> Posted;
    Resend(Resend) -> Resent;
}

/// How long the leader may take over a session's call in its topic, pacing
/// and retries included, before it gives up and says why; the member waits
/// [`MEMBER_GRACE`] longer, so the leader's answer is what the session hears.
pub const TOPIC_DEADLINE: Duration = Duration::from_secs(240);
/// The same for fetching the files of one message…
pub const FETCH_DEADLINE: Duration = Duration::from_secs(240);
/// …and for sending a file.
pub const UPLOAD_DEADLINE: Duration = Duration::from_secs(600);
/// How much longer than the leader's deadline a member waits for its answer.
pub const MEMBER_GRACE: Duration = Duration::from_secs(30);

/// Join the bus as a session (or rejoin it after a reconnect).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Register {
    pub id: u64,
    /// Names this sidecar process; fresh for every process.
    pub instance_id: String,
    /// A random secret of this instance, sent with every registration: a
    /// leader that has seen the instance refuses a registration under its
    /// id without the same secret, so no other process can take over a
    /// session by reusing its (public) instance id.
    pub instance_secret: String,
    /// Fresh for every registration of this instance (strictly growing).
    pub registration_generation: Generation,
    /// Names the session across process restarts.
    pub profile_key: String,
    pub session_name: String,
    pub cwd: String,
    pub pid: u32,
    /// The route this session had before, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried: Option<Route>,
    pub protocol_version: u32,
    /// The user asked to connect: try creating the topic even if an earlier
    /// attempt ended with an unknown outcome.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retry_provisioning: bool,
    /// The route of the session this instance switched away from (its host
    /// ran `/new` or `/resume`): the leader closes that topic, which opens
    /// again when the session is resumed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left: Option<Route>,
    /// The launch this session is, when `agent-relay serve` started it
    /// (docs/DESIGN.md, *Launching*).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<String>,
}

/// The result of a successful [`Register`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Registered {
    pub epoch: Epoch,
    pub route: Route,
    /// Why the route has no topic yet (e.g. no chat configured), if it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
    /// Nobody is allowed to drive sessions yet: `/telegram-connect` should
    /// offer a pairing link.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub needs_pairing: bool,
    /// What keeps the session from having a topic, when waiting will not
    /// help: the user must fix something (`problem` says what), then run
    /// `/telegram-connect`. The leader does not try again by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocker: Option<Blocker>,
}

/// Why no topic can be had until the user fixes something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Blocker {
    /// Telegram rejected the bot token (401).
    TokenRejected,
    /// The bot may not create or manage topics in the chat.
    NoTopicRights,
    /// The configured chat has no topics.
    NotAForum,
    /// The configured chat does not exist, or the bot is not in it.
    ChatNotFound,
}

/// Liveness; sent every [`HEARTBEAT_INTERVAL_MS`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    pub id: u64,
    pub generation: Generation,
}

pub const HEARTBEAT_INTERVAL_MS: u64 = 2_000;
/// Missed heartbeats after which the leader drops a follower.
pub const HEARTBEAT_MISSES: u32 = 3;

/// The follower's full route snapshot: replaces what the leader holds for
/// this instance.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reconcile {
    pub id: u64,
    pub generation: Generation,
    pub observed_epoch: Epoch,
    pub routes: Vec<Route>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Reconciled {
    pub epoch: Epoch,
    /// Profile keys whose routes the leader now holds.
    pub accepted: Vec<String>,
    pub rejected: Vec<RejectedRoute>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RejectedRoute {
    pub key: String,
    pub reason: String,
}

/// Delete this session's topic and leave the bus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disconnect {
    pub id: u64,
    pub generation: Generation,
}

/// Something to do in the session's own topic. The leader performs it with
/// the session's registered target and paces it with every other call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopicRequest {
    pub id: u64,
    pub generation: Generation,
    pub op: TopicOp,
    /// A request a later one supersedes (a typing indicator, a progress
    /// edit): the leader performs it only when the chat's message budget
    /// allows it now, and answers `paced` instead of waiting.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub background: bool,
}

/// What a session may do in its topic. Answered with [`TopicDone`], or a
/// [`BusError`] whose code is the leader's decision about the failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum TopicOp {
    /// Post a message. HTML that Telegram refuses is sent again as plain
    /// text by the leader (`TopicDone::plain`).
    SendText(SendText),
    /// Replace the text (and buttons) of a message this session posted.
    EditText(EditText),
    /// Replace or remove the buttons of a message this session posted.
    EditButtons(EditButtons),
    /// Show "typing…" for about five seconds.
    Typing,
    /// Show a partial message while it is written (`sendMessageDraft`):
    /// in a private chat only, shown for about 30 s after its last change
    /// and kept by nobody, so the finished text is posted as a message.
    Draft(Draft),
    /// Ask the person on the phone: a message with one button per option
    /// (and, with `freeText`, a reply to the message as the answer). The
    /// leader answers at once with the message (`TopicDone::messageId`);
    /// wait for the answer with `awaitAnswer`.
    Ask(Ask),
    /// Wait for the answer to an ask (`TopicDone::answer`). After a
    /// failover the new leader adopts the ask from this request.
    AwaitAnswer(AwaitAnswer),
    /// Close an ask that was answered elsewhere (at the terminal) or not at
    /// all: the message shows `outcome` and loses its buttons. If the phone
    /// answered first, that answer comes back instead (`TopicDone::answer`).
    CloseAsk(CloseAsk),
    /// Post a file (a multipart upload by the leader). The bytes never
    /// cross the bus: the leader reads a path after checking it, or takes
    /// a short text the session made (docs/DESIGN.md, *Files*).
    SendFile(SendFile),
}

/// A draft for the topic (see [`TopicOp::Draft`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Draft {
    /// Not 0; the same id animates the change, a new one starts a new
    /// draft. A press of its stop button names it.
    pub draft_id: i64,
    /// At most one message's worth; empty shows "Thinking…".
    pub text: String,
    pub format: TextFormat,
    /// Offer the person a button that stops the turn.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub can_stop: bool,
}

/// A file for the topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendFile {
    pub source: FileSource,
    /// Plain text under the file; cut to Telegram's 1024 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caption: Option<String>,
    /// None: a picture small enough goes as a photo, the rest as a document.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_as: Option<SendAs>,
}

/// Where the bytes of a [`SendFile`] come from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum FileSource {
    /// An absolute path the leader opens after checking it: inside the
    /// session's registered working directory or a folder of
    /// `[files] send_from` once symbolic links are resolved, a regular file
    /// of the user's, 50 MB at most.
    Path(String),
    /// A text the session made (a long answer as a file), at most
    /// [`MAX_INLINE_FILE`] bytes, sent as a document called `name`.
    Text { name: String, text: String },
}

/// The most bytes a [`FileSource::Text`] may carry: well inside a frame.
pub const MAX_INLINE_FILE: usize = 512 * 1024;

/// Hand messages over for the session's topic. The leader writes them to
/// its store, on disk, before it answers ([`Posted`]), and sends them from
/// there in order, pacing and merging them with what else waits: the
/// session never waits for Telegram, and a process that dies right after
/// the answer loses nothing. What does not arrive is offered again in the
/// topic by the leader (docs/DESIGN.md, *Outbound*).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Post {
    pub id: u64,
    pub generation: Generation,
    pub items: Vec<PostItem>,
    /// This instance's number for the hand-over, the same when it is
    /// handed over again after a lost acknowledgement: the leader then
    /// finds the entries it made instead of making them twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hand: Option<u64>,
}

/// One thing to post into the topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum PostItem {
    /// A message of at most one message's worth (4096 UTF-16 units after
    /// parsing). `merge`: it may share a message with the texts around it
    /// that may too (an answer, where several wait for the chat's budget).
    #[serde(rename_all = "camelCase")]
    Text {
        text: String,
        format: TextFormat,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reply_to: Option<i64>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        merge: bool,
    },
    /// A new text for a message this session posted; its buttons go.
    #[serde(rename_all = "camelCase")]
    Edit {
        message_id: i64,
        text: String,
        format: TextFormat,
    },
    /// A short text as a document (at most [`MAX_INLINE_FILE`] bytes).
    #[serde(rename_all = "camelCase")]
    Document {
        name: String,
        text: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        caption: Option<String>,
    },
}

/// `post` result: the items are the leader's now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Posted {
    /// The outbox entries, in the items' order.
    pub ids: Vec<i64>,
}

/// `/resend`: every message of this session that did not reach the topic,
/// or may not have, goes again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resend {
    pub id: u64,
    pub generation: Generation,
}

/// `resend` result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Resent {
    pub count: u32,
}

/// Download the files of a delivery into the session's inbox. Asked by the
/// session when it takes the delivery, so the files arrive in the order of
/// the topic and only for the session that owns the message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Fetch {
    pub id: u64,
    pub generation: Generation,
    pub update_id: i64,
}

/// `fetch` result: the delivery's files, in the order of its attachments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Fetched {
    pub files: Vec<FetchedFile>,
}

/// One file saved in the session's inbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FetchedFile {
    pub kind: AttachmentKind,
    /// Absolute path in the inbox.
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    pub size: u64,
    /// The sender's name for it, as sent (never used as a path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<u32>,
}

/// A question for the phone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ask {
    /// The question's single-use token: 32 hex digits of randomness, chosen
    /// by the asker. Asking again with the same token (after losing the
    /// leader mid-request) finds the message already posted.
    pub token: String,
    /// Telegram HTML.
    pub text: String,
    /// Button labels, in order; an answer names the index.
    pub options: Vec<String>,
    /// A reply to the message answers it with its text.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub free_text: bool,
    /// How long the leader keeps the ask open at most (the asker normally
    /// closes it sooner, with its own outcome).
    pub expires_in_ms: u64,
    /// Who may answer it, beyond who may write to the session at all.
    #[serde(default, skip_serializing_if = "Concerns::is_anyone")]
    pub concerns: Concerns,
}

/// Who an ask concerns, when several people share the bot (`[access]`):
/// who may answer it on the phone besides the owners.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Concerns {
    /// Whoever may write to the session (owners and drivers): a question.
    #[default]
    Anyone,
    /// A tool call waiting for approval: who may answer is `[approvals] by`
    /// (the requester is whose message started the turn, when one did).
    Approval {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        requester: Option<i64>,
    },
    /// The owners alone (deleting a session's topic).
    Owners,
}

impl Concerns {
    pub fn is_anyone(&self) -> bool {
        *self == Self::Anyone
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AwaitAnswer {
    pub token: String,
    pub message_id: i64,
    /// The ask itself, so a leader that never saw it can adopt it.
    pub ask: Ask,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloseAsk {
    pub token: String,
    pub message_id: i64,
    /// One line shown under the question, e.g. "✅ Allowed at the terminal".
    pub outcome: String,
}

/// How the person on the phone answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AskAnswer {
    /// The index of the button tapped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<u32>,
    /// The text of a reply, for an ask with `freeText`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    pub user_id: i64,
    /// The first name Telegram shows for the user.
    pub user_name: String,
    /// Unix milliseconds.
    pub at_ms: u64,
}

/// How a text is to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TextFormat {
    /// Telegram HTML, as `crate::render` makes it.
    Html,
    /// Shown as it is.
    Plain,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SendText {
    /// At most one message's worth (4096 UTF-16 units after parsing).
    pub text: String,
    pub format: TextFormat,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buttons: Option<Keyboard>,
    /// A message of this session's topic to reply to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EditText {
    pub message_id: i64,
    pub text: String,
    pub format: TextFormat,
    /// The buttons after the edit; none removes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buttons: Option<Keyboard>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EditButtons {
    pub message_id: i64,
    /// None removes every button.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buttons: Option<Keyboard>,
}

/// Inline buttons under a message, row by row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Keyboard {
    pub rows: Vec<Vec<Button>>,
}

/// A button that sends `data` back to the session when tapped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Button {
    pub text: String,
    /// 1–64 bytes, delivered verbatim with the tap.
    pub data: String,
}

/// A topic request that was performed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopicDone {
    /// The message posted (`sendText`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<i64>,
    /// Telegram refused the HTML, so the text went out plain.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plain: bool,
    /// The phone's answer (`awaitAnswer`, or `closeAsk` when the phone
    /// answered first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<AskAnswer>,
    /// How a file went (`sendFile`), and how many bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent_as: Option<SendAs>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
}

/// The follower handed delivery `delivery_id` to its host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryAck {
    pub generation: Generation,
    pub delivery_id: u64,
}

/// Ask the leader to restart the relay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Restart {
    pub id: u64,
    pub generation: Generation,
}

/// Ask for a one-time pairing link (`/telegram-connect` with nobody paired).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pair {
    pub id: u64,
    pub generation: Generation,
}

/// `pair` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PairingLink {
    /// `https://t.me/<bot>?start=<code>`
    pub url: String,
    pub expires_in_s: u64,
}

/// Ask for the bus status (needs no registration: `agent-relay status` uses it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StatusQuery {
    pub id: u64,
    /// Also every other machine's sessions, when the relay spans machines
    /// (docs/CLUSTER.md): the leader asks them and waits up to 2 s.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cluster: bool,
}

// ---------------------------------------------------------------- leader → follower

/// Every frame the leader sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum FromLeader {
    Ack(Ack),
    Deliver(Deliver),
    Restarting(Restarting),
    Health(Health),
    Paired(Paired),
    Paced(Paced),
    Cluster(ClusterLink),
    /// To `serve`: something to do with a launched session.
    Order(Order),
    Outbox(OutboxReport),
    TopicGone(TopicGone),
}

/// What the leader holds of this session's messages (`post`); pushed on
/// every change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OutboxReport {
    /// Messages still to go.
    pub waiting: u32,
    /// The next one waits this long for the chat's budget, as far as the
    /// leader knows now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paced_ms: Option<u64>,
    /// Messages that reached neither the topic nor a notice about them.
    #[serde(default)]
    pub undelivered: u32,
}

/// The session's topic is gone (Telegram said so while the leader sent
/// into it): register again for a new one; what waits goes there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopicGone {
    pub thread_id: i64,
}

/// This machine's link to the other machines of the relay (docs/CLUSTER.md);
/// pushed on every change, and only when a cluster is configured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterLink {
    /// This machine's node name.
    pub node: String,
    pub state: ClusterLinkState,
    /// Why the link is down, when it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The machine that polls Telegram for the whole bot, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub polled_by: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ClusterLinkState {
    /// Not connected yet since the leader started.
    Connecting,
    Up,
    /// Cut off: this machine sends its sessions' text straight to
    /// Telegram and receives nothing until the link is back.
    Down,
}

/// A request of this session waits for its chat's message budget (Telegram
/// allows about 20 messages a minute in a group, shared by every topic, and
/// about one a second in a private chat); its ack follows when it went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Paced {
    /// The waiting request.
    pub id: u64,
    /// How long it will wait, as far as the leader knows now.
    pub wait_ms: u64,
}

/// A Telegram user paired with the bot: sessions may now be driven.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Paired {
    pub user_id: i64,
}

/// How the leader's link to Telegram is doing; pushed on every change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "telegram", rename_all = "camelCase")]
pub enum Health {
    /// Polling works.
    Ok,
    /// Not polled yet.
    Starting,
    /// Telegram's 409: another process polls this bot.
    Conflict,
    /// Telegram cannot be reached or keeps failing.
    Offline { reason: String },
    /// Telegram rejected the bot token (401): nothing works until it is
    /// replaced.
    Unauthorized,
    /// The poll is alive but hears nothing while updates wait at Telegram
    /// (`getWebhookInfo` counts `pending`); the leader restarts it.
    Deaf { pending: u32 },
}

/// The answer to a request: its outcome, decoded in one place. `id` is
/// absent when the request could not be read. On the wire it reads
/// `{id, epoch, ok, result?, error?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(into = "AckWire", try_from = "AckWire")]
pub struct Ack {
    pub id: Option<u64>,
    pub epoch: Epoch,
    pub outcome: Result<Value, BusError>,
}

impl Ack {
    /// The leader's answer to request `R` (`id` absent when the request
    /// could not be read).
    pub fn answer<R: Request>(
        id: Option<u64>,
        epoch: Epoch,
        outcome: Result<R::Reply, BusError>,
    ) -> Self {
        let outcome = outcome.and_then(|reply| {
            serde_json::to_value(reply)
                .map_err(|e| BusError::new(BusErrorCode::Internal, e.to_string()))
        });
        Self { id, epoch, outcome }
    }

    /// The outcome as request `R`'s answer.
    pub fn reply<R: Request>(self) -> Result<R::Reply, BusError> {
        let value = self.outcome?;
        serde_json::from_value(value).map_err(|e| BusError {
            code: BusErrorCode::Internal,
            message: format!("the leader's answer is malformed: {e}"),
        })
    }
}

/// [`Ack`] as it travels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename = "Ack", rename_all = "camelCase")]
struct AckWire {
    id: Option<u64>,
    epoch: Epoch,
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<BusError>,
}

impl From<Ack> for AckWire {
    fn from(ack: Ack) -> Self {
        let (ok, result, error) = match ack.outcome {
            Ok(value) => (true, Some(value), None),
            Err(error) => (false, None, Some(error)),
        };
        Self {
            id: ack.id,
            epoch: ack.epoch,
            ok,
            result,
            error,
        }
    }
}

impl TryFrom<AckWire> for Ack {
    type Error = String;
    fn try_from(wire: AckWire) -> Result<Self, String> {
        let outcome = match (wire.ok, wire.result, wire.error) {
            (true, result, None) => Ok(result.unwrap_or(Value::Null)),
            (false, None, Some(error)) => Err(error),
            (true, _, Some(_)) => return Err("an ok ack carries no error".into()),
            (false, _, _) => return Err("a failed ack carries exactly an error".into()),
        };
        Ok(Self {
            id: wire.id,
            epoch: wire.epoch,
            outcome,
        })
    }
}

impl JsonSchema for Ack {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Ack".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        AckWire::json_schema(generator)
    }
}

/// Why a request failed. For topic requests the code is the leader's
/// decision about a Telegram failure, made in one place
/// (`leader::failure`): the session acts on the code alone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, thiserror::Error)]
#[serde(rename_all = "camelCase")]
#[error("{message}")]
pub struct BusError {
    pub code: BusErrorCode,
    pub message: String,
}

impl BusError {
    pub fn new(code: BusErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum BusErrorCode {
    /// The frame was not a valid envelope.
    BadFrame,
    /// The bus protocol versions differ.
    ProtocolVersion,
    /// The request carried a generation other than the current registration's.
    StaleGeneration,
    /// The connection has no registration.
    NotRegistered,
    /// All 26 slots are taken by live sessions.
    NoFreeSlot,
    /// The request reaches outside what this session owns (another
    /// session's message or ask, an instance id that is not its own).
    Forbidden,
    /// The ask is closed: it expired at the leader, or was closed.
    AskClosed,
    /// The session has no topic (yet): nothing was sent.
    NoTopic,
    /// The session's topic is gone; the leader stopped trusting it, and
    /// registering again provisions a new one. Nothing was sent.
    TopicGone,
    /// The call may or may not have reached the topic. It is never
    /// replayed blindly: a duplicate is worse than a gap the user is told of.
    CommitUnknown,
    /// Telegram refused the call for good (the message says why); retrying
    /// the same call cannot help.
    Telegram,
    /// The leader is restarting, or Telegram stayed unreachable past the
    /// request's deadline. Nothing was sent.
    Unavailable,
    /// A file that may not be sent: outside the session's folder and the
    /// configured ones, missing, not a regular file of the user's. Nothing
    /// was sent.
    FileRefused,
    /// A file over the Bot API's limits: 20 MB to download, 50 MB (photos
    /// 10 MB) to upload. Nothing was sent or saved.
    FileTooBig,
    /// A background request found its chat's message budget spent: it was
    /// not sent, and a later one will say the same thing better.
    Paced,
    /// The Bot API server lacks what the request needs (a self-hosted one
    /// or a proxy that lags behind Telegram: `sendMessageDraft`, say).
    /// Nothing was sent; the session does without it from now on.
    Unsupported,
    /// Anything else.
    Internal,
}

/// A message from the session's topic, for the session that owns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deliver {
    pub delivery_id: u64,
    pub update_id: i64,
    pub message: InboundMessage,
}

/// A message an allowed user wrote in the topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InboundMessage {
    pub chat_id: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<i64>,
    pub user_id: i64,
    pub message_id: i64,
    pub text: String,
    /// The message of the topic this one replies to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<i64>,
    /// The files the message carries (their bytes: `fetch`); `text` is
    /// then the caption, possibly empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<InboundAttachment>,
    /// The album the message belongs to: its messages come one by one and
    /// make one prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_group_id: Option<String>,
    /// A scheduled prompt's firing (`/every`, `/at`), not a person's
    /// message: its turn decides approvals as `[schedules] approvals` says.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub scheduled: bool,
}

/// A file an inbound message carries, as Telegram describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InboundAttachment {
    pub kind: AttachmentKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Bytes, when Telegram says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<u32>,
}

/// The leader is about to step down on purpose; expect these to come back.
/// It is what a restart means to do: the leader answers `restart` with it
/// (and broadcasts it) just before it steps down; the caller then polls
/// `status` until the expected routes are back and reports a
/// [`RestartOutcome`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Restarting {
    /// The epoch that is ending.
    pub epoch: Epoch,
    pub expected_instances: u32,
    pub expected_routes: u32,
    /// The profile keys whose routes must come back.
    pub expected: Vec<String>,
    /// When the relay spans machines: every machine's part of the plan
    /// (this one's included). Empty for a single machine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machines: Vec<MachinePlan>,
}

/// What a restart expects of one machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachinePlan {
    pub node: String,
    /// The machine's local epoch that ends.
    pub epoch: Epoch,
    /// The profile keys on that machine whose routes must come back.
    pub expected: Vec<String>,
}

/// The bus as the leader sees it (`status` result).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BusStatus {
    pub epoch: Epoch,
    pub leader_pid: u32,
    pub leader_instance: String,
    /// Unix milliseconds when this leader took over.
    pub leader_since_ms: u64,
    pub sessions: Vec<SessionStatus>,
    /// How the leader's poll of Telegram is doing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub poll: Option<PollReport>,
    /// Every chat whose message budget was used lately.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pacing: Vec<ChatPacing>,
    /// Every machine of the relay, when it spans machines and the query
    /// asked for them (`StatusQuery::cluster`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterStatus>,
    /// This machine's `agent-relay serve`, when it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<ServeStatus>,
    /// What the Bot API server was found to lack (a method such as
    /// `sendMessageDraft`, or disabled buttons), and what the relay does
    /// instead.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lacking: Vec<String>,
}

/// The leader's poll, for `/relay status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PollReport {
    pub health: Health,
    /// Milliseconds since `getUpdates` last answered; none yet when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_ok_age_ms: Option<u64>,
    /// Updates waiting at Telegram when `getWebhookInfo` was last asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_updates: Option<u32>,
    /// Times the poll was restarted because it heard nothing.
    #[serde(default)]
    pub restarts: u32,
}

/// One chat's message budget, for `/relay status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChatPacing {
    pub chat_id: i64,
    /// Messages (sends and edits) in the current window.
    pub used: u32,
    /// What the window allows: 20 a minute in a group, 1 a second in a
    /// private chat.
    pub capacity: u32,
    pub window_ms: u64,
    /// Requests waiting for the budget now.
    pub waiting: u32,
    /// When the next one may go, from now.
    pub next_free_ms: u64,
    /// The longest any request waited for this chat's budget.
    pub longest_wait_ms: u64,
    /// Requests that had to wait at all.
    pub paced: u64,
}

/// The machines of a relay that spans machines, as one of them sees them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// The machine that answered.
    pub node: String,
    /// Its link to the others.
    pub link: ClusterLinkState,
    /// The machine that polls Telegram for the whole bot, and its lease term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub polled_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    /// Every machine that ever joined, this one included, by name.
    pub machines: Vec<MachineStatus>,
}

/// One machine and its sessions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineStatus {
    pub node: String,
    /// Whether it answered in time; a silent machine shows no sessions.
    pub answered: bool,
    /// Its local leader's epoch and sessions, when it answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<Epoch>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<SessionStatus>,
    /// Its `agent-relay serve`, when it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<ServeStatus>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionStatus {
    pub slot: Slot,
    pub topic_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<Target>,
    pub profile_key: String,
    pub session_name: String,
    pub cwd: String,
    pub pid: u32,
    pub instance_id: String,
    /// Milliseconds since the last frame from this session.
    pub heartbeat_age_ms: u64,
    /// Whether the session is connected right now (false: binding kept only).
    pub live: bool,
    /// Whether its route snapshot was reconciled with this leader.
    #[serde(default)]
    pub reconciled: bool,
    /// When `agent-relay serve` started it: its launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch: Option<SessionLaunch>,
}

/// How a restart ended, as the caller reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum RestartOutcome {
    Complete {
        routes: u32,
        elapsed_ms: u64,
    },
    PartialTimeout {
        back: u32,
        expected: u32,
        missing: Vec<String>,
        elapsed_ms: u64,
    },
    Failed {
        reason: String,
        elapsed_ms: u64,
    },
}

/// `disconnect` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disconnected {
    /// The topic that was deleted, if the session had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted: Option<Target>,
    /// The deletion is not confirmed yet; the next leader finishes it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cleanup_pending: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_decode_their_outcome_in_one_place() {
        let ok = r#"{"id":4,"epoch":2,"ok":true,"result":{"messageId":9}}"#;
        let ack: Ack = serde_json::from_str(ok).unwrap();
        assert_eq!(
            ack.clone().reply::<TopicRequest>().unwrap().message_id,
            Some(9)
        );
        assert_eq!(serde_json::to_string(&ack).unwrap(), ok);
        let failed =
            r#"{"id":4,"epoch":2,"ok":false,"error":{"code":"topicGone","message":"gone"}}"#;
        let ack: Ack = serde_json::from_str(failed).unwrap();
        assert_eq!(
            ack.reply::<TopicRequest>().unwrap_err().code,
            BusErrorCode::TopicGone
        );
        for contradictory in [
            r#"{"id":1,"epoch":1,"ok":false}"#,
            r#"{"id":1,"epoch":1,"ok":true,"error":{"code":"internal","message":"x"}}"#,
        ] {
            assert!(
                serde_json::from_str::<Ack>(contradictory).is_err(),
                "{contradictory}"
            );
        }
    }

    #[test]
    fn envelopes_are_kind_tagged() {
        let frame = ToLeader::Heartbeat(Heartbeat {
            id: 3,
            generation: 9,
        });
        let text = serde_json::to_string(&frame).unwrap();
        assert_eq!(text, r#"{"kind":"heartbeat","id":3,"generation":9}"#);
        assert_eq!(serde_json::from_str::<ToLeader>(&text).unwrap(), frame);
    }

    #[test]
    fn slots_are_letters() {
        assert_eq!(Slot::from_index(0).unwrap().to_string(), "A");
        assert_eq!(Slot::from_index(25).unwrap().letter(), 'Z');
        assert!(Slot::from_index(26).is_none());
        assert!(serde_json::from_str::<Slot>("\"a\"").is_err());
        assert_eq!(serde_json::from_str::<Slot>("\"Q\"").unwrap().index(), 16);
    }
}

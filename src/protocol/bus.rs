//! The bus protocol (DESIGN §4): `kind`-tagged envelopes on the leader's local
//! socket, one JSON object per line. Requests carry an `id` and are answered
//! with an [`Ack`] carrying the same id and the leader's current epoch.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The bus protocol version; a leader refuses a follower that speaks another.
pub const BUS_PROTOCOL_VERSION: u32 = 1;

/// The leader's term. It grows by one every time a sidecar becomes leader.
pub type Epoch = u64;

/// A registration's fencing token: every request but `register` must carry
/// the generation of the instance's current registration.
pub type Generation = u64;

/// A topic slot, `A` to `Z`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Slot(u8);

impl JsonSchema for Slot {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Slot".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A topic slot, one letter A-Z.",
            "type": "string",
            "pattern": "^[A-Z]$"
        })
    }
}

impl Slot {
    pub const ALL: usize = 26;

    pub fn from_index(index: usize) -> Option<Self> {
        (index < Self::ALL).then(|| Self(b'A' + index as u8))
    }

    pub fn index(self) -> usize {
        usize::from(self.0 - b'A')
    }

    pub fn letter(self) -> char {
        char::from(self.0)
    }
}

impl std::fmt::Display for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.letter())
    }
}

impl TryFrom<String> for Slot {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        match s.as_bytes() {
            [b @ b'A'..=b'Z'] => Ok(Self(*b)),
            _ => Err(format!("slot must be one letter A-Z, found {s:?}")),
        }
    }
}

impl From<Slot> for String {
    fn from(s: Slot) -> String {
        s.to_string()
    }
}

/// Where a session's messages go: a chat and (once provisioned) a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    pub chat_id: i64,
    pub thread_id: i64,
}

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
    Telegram(TelegramCall),
    DeliveryAck(DeliveryAck),
    Restart(Restart),
    Status(StatusQuery),
    Pair(Pair),
}

/// Join the bus as a session (or rejoin it after a reconnect).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Register {
    pub id: u64,
    /// Names this sidecar process; fresh for every process.
    pub instance_id: String,
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

/// A Bot API call proxied through the leader.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TelegramCall {
    pub id: u64,
    pub generation: Generation,
    pub method: String,
    pub params: Value,
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
}

/// The answer to a request. `id` is absent when the request could not be read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Ack {
    pub id: Option<u64>,
    pub epoch: Epoch,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<BusError>,
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema, thiserror::Error)]
#[serde(rename_all = "camelCase")]
#[error("{message}")]
pub struct BusError {
    pub code: BusErrorCode,
    pub message: String,
    /// Seconds to wait before the same call (Telegram's 429).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
    /// The call may or may not have taken effect; it must not be replayed blindly.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub commit_unknown: bool,
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
    /// The request reaches outside what this session owns.
    Forbidden,
    /// Telegram refused or failed the call.
    Telegram,
    /// Telegram could not parse the HTML: send the text plain instead.
    BadMarkup,
    /// The session's topic is gone; registering again provisions a new one.
    TopicGone,
    /// The leader is restarting or shutting down.
    Unavailable,
    /// Anything else.
    Internal,
}

/// An inbound Telegram message for the session that owns its topic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Deliver {
    pub delivery_id: u64,
    pub update_id: i64,
    pub message: InboundMessage,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InboundMessage {
    pub chat_id: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread_id: Option<i64>,
    pub user_id: i64,
    pub message_id: i64,
    pub text: String,
}

/// The leader is about to step down on purpose; expect these to come back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Restarting {
    pub epoch: Epoch,
    pub expected_instances: u32,
    pub expected_routes: u32,
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
}

/// `restart` result.
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
}

#[cfg(test)]
mod tests {
    use super::*;

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

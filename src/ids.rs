//! The small value types every layer names: a bot's [`BotId`], a leader's
//! [`Epoch`], a registration's [`Generation`], a topic [`Slot`], a
//! [`Target`] (chat and topic) and a [`Place`] (a chat, in a topic or not). They live apart from the wire types so the store and the
//! topic rules can use them without depending on any protocol. And
//! [`RecentUpdates`], the bounded memory of update ids that drops a
//! delivery seen twice.

use std::collections::{HashSet, VecDeque};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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

/// Where the leader writes: a chat, and a topic of it or none (outside
/// topics: a private chat, or a forum's General topic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Place {
    pub chat_id: i64,
    pub thread_id: Option<i64>,
}

impl Place {
    /// A chat outside its topics.
    pub fn chat(chat_id: i64) -> Self {
        Self {
            chat_id,
            thread_id: None,
        }
    }
}

impl From<Target> for Place {
    fn from(target: Target) -> Self {
        Self {
            chat_id: target.chat_id,
            thread_id: Some(target.thread_id),
        }
    }
}

/// The id of a bot: the digits before `:` in its token. It names the bot's bus
/// and database, so two bots never share either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BotId(pub u64);

impl std::fmt::Display for BotId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A machine's name in a cluster (docs/CLUSTER.md, *Configuration*): 1–32
/// of `[a-z0-9-]`, because it appears in NATS subjects, consumer names and
/// topic names.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct NodeName(String);

impl NodeName {
    pub const MAX_CHARS: usize = 32;

    /// A configured name, checked as it is.
    pub fn parse(name: &str) -> Result<Self, String> {
        let ok = !name.is_empty()
            && name.len() <= Self::MAX_CHARS
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if ok {
            Ok(Self(name.to_string()))
        } else {
            Err(format!(
                "a node name is 1-{} characters of a-z, 0-9 and '-', found {name:?}",
                Self::MAX_CHARS
            ))
        }
    }

    /// A name made from a host name: lowercased, the domain dropped, every
    /// other character `-`, cut to [`Self::MAX_CHARS`]; `None` if nothing
    /// is left.
    pub fn from_host(host: &str) -> Option<Self> {
        let short = host.split('.').next().unwrap_or_default();
        let name: String = short
            .chars()
            .map(|c| match c.to_ascii_lowercase() {
                c @ ('a'..='z' | '0'..='9') => c,
                _ => '-',
            })
            .take(Self::MAX_CHARS)
            .collect();
        let name = name.trim_matches('-');
        Self::parse(name).ok()
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for NodeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for NodeName {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        Self::parse(&s)
    }
}

impl From<NodeName> for String {
    fn from(n: NodeName) -> String {
        n.0
    }
}

/// The update ids seen most recently, at most [`RecentUpdates::KEPT`] of
/// them: what drops a prompt delivered twice (a leader's failover hands
/// over what it had not seen acknowledged).
#[derive(Debug, Default)]
pub struct RecentUpdates {
    order: VecDeque<i64>,
    set: HashSet<i64>,
}

impl RecentUpdates {
    /// How many update ids are remembered.
    pub const KEPT: usize = 4096;

    pub fn contains(&self, id: i64) -> bool {
        self.set.contains(&id)
    }

    /// Remembers `id`, forgetting the oldest beyond [`Self::KEPT`]; false
    /// when it was there already.
    pub fn insert(&mut self, id: i64) -> bool {
        if !self.set.insert(id) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > Self::KEPT
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        true
    }

    /// Forgets `id`: its delivery failed, so the next one must be taken.
    pub fn remove(&mut self, id: i64) {
        if self.set.remove(&id) {
            self.order.retain(|&kept| kept != id);
        }
    }
}

#[cfg(test)]
mod recent_tests {
    use super::RecentUpdates;

    #[test]
    fn recent_updates_are_bounded_forget_the_oldest_and_a_removed_one() {
        let mut seen = RecentUpdates::default();
        for id in 0..(RecentUpdates::KEPT as i64 + 10) {
            assert!(seen.insert(id));
        }
        assert!(!seen.insert(20), "a repeat");
        assert!(!seen.contains(0) && seen.contains(RecentUpdates::KEPT as i64 + 9));
        assert_eq!(seen.set.len(), RecentUpdates::KEPT);
        seen.remove(20);
        assert!(seen.insert(20), "taken again after its delivery failed");
        assert_eq!(seen.order.len(), seen.set.len());
    }
}

//! Claims in the key-value bucket `relay-<bot>-claims` (docs/CLUSTER.md,
//! *Claims*): node names, slots and topics, each created if absent and
//! then changed only by compare-and-set on the revision its writer read,
//! so two machines never hold the same one; and the `getUpdates` offset,
//! a fenced write of the lease holder that never moves backwards.

use async_nats::jetstream::kv;
use futures::TryStreamExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use super::buckets::Claimed;
use super::buckets::{cas, create, delete_at, read, to_bytes};
use super::lease::Term;
use super::{Cluster, ClusterError, Node, NodeName, timed};
use crate::ids::Slot;

/// What can be claimed, and its key in the bucket.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClaimKey {
    /// A machine's name.
    Node(NodeName),
    /// A slot letter in a chat.
    Slot { chat: i64, slot: Slot },
    /// A topic of a chat.
    Topic { chat: i64, thread: i64 },
}

impl ClaimKey {
    /// Keys are `[-/_=.a-zA-Z0-9]`: chat ids keep their minus sign.
    pub fn key(&self) -> String {
        match self {
            Self::Node(name) => format!("node.{name}"),
            Self::Slot { chat, slot } => format!("slot.{chat}.{slot}"),
            Self::Topic { chat, thread } => format!("topic.{chat}.{thread}"),
        }
    }
}

/// What a node claim holds: the machine's id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct NodeClaim {
    node_id: String,
}

/// What a slot or topic claim holds: the machine whose session holds it,
/// and the session (its profile key on that machine).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionClaim {
    pub node: NodeName,
    pub profile_key: String,
}

/// The key of the bot-wide `getUpdates` offset.
const OFFSET: &str = "offset";

/// A value written under a fencing token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Fenced<T> {
    term: u64,
    value: T,
}

/// The claims of one bot. Cheap to clone.
#[derive(Clone)]
pub struct Claims {
    cluster: Cluster,
}

impl Cluster {
    pub fn claims(&self) -> Claims {
        Claims {
            cluster: self.clone(),
        }
    }
}

impl Claims {
    fn kv(&self) -> &kv::Store {
        &self.cluster.claims_kv
    }

    /// Creates `key` with `value` if nobody holds it: [`ClusterError::Taken`]
    /// otherwise. Returns the revision to update or release it with.
    pub async fn create<T: Serialize>(
        &self,
        key: &ClaimKey,
        value: &T,
    ) -> Result<u64, ClusterError> {
        create(self.kv(), &key.key(), to_bytes(value)?).await
    }

    /// Reads a claim; `None` when nobody holds it.
    pub async fn get<T: DeserializeOwned>(
        &self,
        key: &ClaimKey,
    ) -> Result<Option<Claimed<T>>, ClusterError> {
        read(self.kv(), &key.key()).await
    }

    /// Replaces a claim, if it is still at `revision`: [`ClusterError::Changed`]
    /// otherwise (somebody wrote or released it since).
    pub async fn update<T: Serialize>(
        &self,
        key: &ClaimKey,
        value: &T,
        revision: u64,
    ) -> Result<u64, ClusterError> {
        cas(self.kv(), &key.key(), to_bytes(value)?, revision).await
    }

    /// Gives a claim up, if it is still at `revision`.
    pub async fn release(&self, key: &ClaimKey, revision: u64) -> Result<(), ClusterError> {
        delete_at(self.kv(), &key.key(), revision).await
    }

    /// Every slot claimed in `chat`: the 26 keys read at once.
    pub async fn slots(
        &self,
        chat: i64,
    ) -> Result<Vec<(Slot, Claimed<SessionClaim>)>, ClusterError> {
        let reads = (0..Slot::ALL)
            .filter_map(Slot::from_index)
            .map(|slot| async move {
                let claim = self
                    .get::<SessionClaim>(&ClaimKey::Slot { chat, slot })
                    .await?;
                Ok::<_, ClusterError>(claim.map(|c| (slot, c)))
            });
        let read = futures::future::try_join_all(reads).await?;
        Ok(read.into_iter().flatten().collect())
    }

    /// Every key in the bucket (a few per session and machine).
    pub async fn keys(&self) -> Result<Vec<String>, ClusterError> {
        timed(async {
            let keys = self.kv().keys().await.map_err(ClusterError::unreachable)?;
            keys.try_collect::<Vec<String>>()
                .await
                .map_err(ClusterError::unreachable)
        })
        .await
    }

    /// The machines that joined: every node claim's name.
    pub async fn nodes(&self) -> Result<Vec<NodeName>, ClusterError> {
        let mut nodes: Vec<NodeName> = self
            .keys()
            .await?
            .iter()
            .filter_map(|k| k.strip_prefix("node."))
            .filter_map(|name| NodeName::parse(name).ok())
            .collect();
        nodes.sort();
        Ok(nodes)
    }

    /// Removes a key whatever its revision (`cluster forget` only).
    pub(super) async fn remove(&self, key: &str) -> Result<(), ClusterError> {
        timed(async {
            self.kv()
                .delete(key)
                .await
                .map_err(ClusterError::unreachable)
        })
        .await
    }

    /// Reads a key as JSON of any shape (`cluster forget` only).
    pub(super) async fn read_raw(
        &self,
        key: &str,
    ) -> Result<Option<serde_json::Value>, ClusterError> {
        Ok(read::<serde_json::Value>(self.kv(), key)
            .await?
            .map(|c| c.value))
    }

    /// Claims this machine's name, or finds it already ours.
    pub(super) async fn claim_node(&self, node: &Node) -> Result<(), ClusterError> {
        let key = ClaimKey::Node(node.name.clone());
        let mine = NodeClaim {
            node_id: node.id.clone(),
        };
        match self.create(&key, &mine).await {
            Ok(_) => Ok(()),
            Err(ClusterError::Taken { .. }) => match self.get::<NodeClaim>(&key).await? {
                Some(held) if held.value == mine => Ok(()),
                // Released between our create and our read: try once more.
                None => self.create(&key, &mine).await.map(drop),
                Some(_) => Err(ClusterError::NodeNameTaken {
                    name: node.name.clone(),
                }),
            },
            Err(e) => Err(e),
        }
    }

    /// The next `getUpdates` offset, if a leader stored one.
    pub async fn offset(&self) -> Result<Option<i64>, ClusterError> {
        Ok(read::<Fenced<i64>>(self.kv(), OFFSET)
            .await?
            .map(|c| c.value.value))
    }

    /// Moves the offset forward to `offset` under the lease term `term`.
    ///
    /// The fence: the write is a compare-and-set on the revision it read,
    /// and happens only if the stored offset was not written by a newer
    /// term and the lease still carries `term`; so once a newer leader
    /// wrote, an older one never can. An offset at or behind the stored
    /// one is left as it is (success): the offset never moves backwards.
    pub async fn advance_offset(&self, term: Term, offset: i64) -> Result<(), ClusterError> {
        // A compare-and-set loses only to a concurrent writer; a few rounds
        // settle it (and a stale one is fenced off on the next read).
        for _ in 0..4 {
            let stored = read::<Fenced<i64>>(self.kv(), OFFSET).await?;
            if let Some(stored) = &stored {
                if stored.value.term > term.0 {
                    return Err(ClusterError::Fenced {
                        term: term.0,
                        why: format!("term {} wrote the offset since", stored.value.term),
                    });
                }
                if stored.value.value >= offset {
                    return Ok(());
                }
            }
            match self.cluster.lease_holder().await? {
                Some(holder) if holder.term == term => {}
                Some(holder) => {
                    return Err(ClusterError::Fenced {
                        term: term.0,
                        why: format!("the lease is term {} of {}", holder.term, holder.node),
                    });
                }
                None => {
                    return Err(ClusterError::Fenced {
                        term: term.0,
                        why: "nobody holds the lease".into(),
                    });
                }
            }
            let value = to_bytes(&Fenced {
                term: term.0,
                value: offset,
            })?;
            let revision = stored.map_or(0, |s| s.revision);
            match cas(self.kv(), OFFSET, value, revision).await {
                Ok(_) => return Ok(()),
                Err(ClusterError::Changed { .. }) => continue,
                Err(e) => return Err(e),
            }
        }
        Err(ClusterError::Changed { key: OFFSET.into() })
    }
}

//! The bot-wide claims of slots and topics (docs/CLUSTER.md, *Claims*):
//! made by create-if-absent and changed only by compare-and-set, so two
//! machines never hold the same slot or topic. Registration claims what it
//! picks; a disconnect or a reclaimed slot gives it back; a machine that
//! joins (or comes back) claims what its bindings hold.

use std::sync::PoisonError;

use super::Ground;
use super::node::ClusterNode;
use crate::cluster::claims::{ClaimKey, SessionClaim};
use crate::cluster::{Cluster, ClusterError};
use crate::protocol::bus::{Slot, Target};

/// Makes `key` this session's: created, already its own, or taken over
/// from another session of this machine (a local reclaim, decided under
/// the registry lock). [`ClusterError::Taken`] names the other machine.
async fn claim(cluster: &Cluster, key: &ClaimKey, profile_key: &str) -> Result<(), ClusterError> {
    let claims = cluster.claims();
    let mine = SessionClaim {
        node: cluster.node().name.clone(),
        profile_key: profile_key.to_string(),
    };
    for _ in 0..4 {
        match claims.create(key, &mine).await {
            Ok(_) => return Ok(()),
            Err(ClusterError::Taken { .. }) => {}
            Err(e) => return Err(e),
        }
        match claims.get::<SessionClaim>(key).await? {
            // Released since: create again.
            None => {}
            Some(held) if held.value == mine => return Ok(()),
            Some(held) if held.value.node == mine.node => {
                match claims.update(key, &mine, held.revision).await {
                    Ok(_) => return Ok(()),
                    Err(ClusterError::Changed { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Some(held) => {
                return Err(ClusterError::Taken {
                    key: format!("{} (by machine {})", key.key(), held.value.node),
                });
            }
        }
    }
    Err(ClusterError::Changed { key: key.key() })
}

/// Gives up `key` if this session of this machine holds it.
async fn release(cluster: &Cluster, key: &ClaimKey, profile_key: &str) -> Result<(), ClusterError> {
    let claims = cluster.claims();
    match claims.get::<SessionClaim>(key).await? {
        Some(held)
            if held.value.node == cluster.node().name && held.value.profile_key == profile_key =>
        {
            claims.release(key, held.revision).await
        }
        _ => Ok(()),
    }
}

/// Claims what this machine's stored bindings hold: after joining, and
/// whenever the connection comes back. A slot or topic another machine
/// took meanwhile stays theirs; the session gets another at its next
/// registration.
pub(super) async fn adopt(ground: &Ground, cluster: &Cluster) {
    let bindings = ground
        .store
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .bindings();
    let bindings = match bindings {
        Ok(bindings) => bindings,
        Err(e) => {
            tracing::warn!("cannot read the bindings to claim them: {e}");
            return;
        }
    };
    for b in bindings {
        if b.status == crate::store::BindingStatus::Offline {
            continue;
        }
        let Some(chat) = b.chat_id.or(ground.chat_id) else {
            continue;
        };
        let mut keys = vec![ClaimKey::Slot { chat, slot: b.slot }];
        keys.extend(b.target().map(|t| ClaimKey::Topic {
            chat: t.chat_id,
            thread: t.thread_id,
        }));
        for key in keys {
            if let Err(e) = claim(cluster, &key, &b.profile_key).await {
                tracing::warn!(profile = %b.profile_key, "cannot claim {}: {e}", key.key());
            }
        }
    }
}

/// How a bot-wide slot claim came out.
pub(in crate::leader) enum SlotClaim {
    /// The slot is this session's across the cluster (or there is no cluster).
    Held,
    /// Another machine holds it: pick again.
    Taken,
    /// NATS cannot be reached: nothing new may be claimed now.
    Unreachable(String),
}

/// The topic name, with this machine's name when the relay spans machines.
pub(in crate::leader) fn topic_name(
    node: Option<&ClusterNode>,
    slot: Slot,
    session_name: &str,
) -> String {
    let node = node.map(|c| c.name().to_string());
    crate::topics::topic_name(slot, node.as_deref(), session_name)
}

/// A registration's claims across machines: none without a cluster.
pub(in crate::leader) struct Claims<'a> {
    pub node: Option<&'a ClusterNode>,
    /// The chat that holds the topics, as far as it is known without
    /// asking Telegram: slots are claimed per chat.
    pub chat: Option<i64>,
}

impl Claims<'_> {
    /// The slots other machines hold in the topics' chat: a registration
    /// here never picks them.
    pub(in crate::leader) async fn foreign_slots(&self) -> Vec<Slot> {
        let (Some(node), Some(chat)) = (self.node, self.chat) else {
            return Vec::new();
        };
        let Some(cluster) = node.connected().await else {
            return Vec::new();
        };
        match cluster.claims().slots(chat).await {
            Ok(slots) => slots
                .into_iter()
                .filter(|(_, c)| c.value.node != *node.name())
                .map(|(slot, _)| slot)
                .collect(),
            Err(e) => {
                tracing::debug!("cannot read the cluster's slots: {e}");
                Vec::new()
            }
        }
    }

    /// Makes the slot a registration picked the session's across the cluster.
    pub(in crate::leader) async fn claim_slot(&self, slot: Slot, profile_key: &str) -> SlotClaim {
        let (Some(node), Some(chat)) = (self.node, self.chat) else {
            return SlotClaim::Held;
        };
        let Some(cluster) = node.connected().await else {
            return SlotClaim::Unreachable(cluster_down(node));
        };
        match claim(&cluster, &ClaimKey::Slot { chat, slot }, profile_key).await {
            Ok(()) => SlotClaim::Held,
            Err(ClusterError::Taken { key }) => {
                tracing::info!("slot {slot} is taken elsewhere ({key}); picking another");
                SlotClaim::Taken
            }
            Err(e) => SlotClaim::Unreachable(format!("the cluster is unreachable: {e}")),
        }
    }

    /// Whether a stored topic may still be this session's: not claimed by
    /// another machine (unknown when NATS is away: then it stays ours).
    pub(in crate::leader) async fn topic_is_ours(&self, target: Target) -> bool {
        let Some(cluster) = self.node.and_then(ClusterNode::cluster) else {
            return true;
        };
        let key = ClaimKey::Topic {
            chat: target.chat_id,
            thread: target.thread_id,
        };
        match cluster.claims().get::<SessionClaim>(&key).await {
            Ok(Some(held)) if held.value.node != cluster.node().name => {
                tracing::warn!(
                    thread = target.thread_id,
                    "the stored topic is machine {}'s now; making another",
                    held.value.node
                );
                false
            }
            _ => true,
        }
    }

    /// Claims a session's topic across the cluster, so that its updates
    /// come to this machine. A failure is logged: the claim is made again
    /// when the connection is back.
    pub(in crate::leader) async fn claim_topic(&self, target: Target, profile_key: &str) {
        let Some(cluster) = self.node.and_then(ClusterNode::cluster) else {
            return;
        };
        let key = ClaimKey::Topic {
            chat: target.chat_id,
            thread: target.thread_id,
        };
        if let Err(e) = claim(&cluster, &key, profile_key).await {
            tracing::warn!("cannot claim topic {}: {e}", target.thread_id);
        }
    }

    /// Gives up a session's slot and topic across the cluster (a
    /// disconnect, a slot reclaimed here), off the caller's path.
    pub(in crate::leader) fn release(
        &self,
        profile_key: &str,
        slot: Option<Slot>,
        target: Option<Target>,
    ) {
        let Some(cluster) = self.node.and_then(ClusterNode::cluster) else {
            return;
        };
        let mut keys: Vec<ClaimKey> = Vec::new();
        if let (Some(slot), Some(chat)) = (slot, target.map(|t| t.chat_id).or(self.chat)) {
            keys.push(ClaimKey::Slot { chat, slot });
        }
        keys.extend(target.map(|t| ClaimKey::Topic {
            chat: t.chat_id,
            thread: t.thread_id,
        }));
        let profile_key = profile_key.to_string();
        crate::tasks::spawn(async move {
            for key in keys {
                if let Err(e) = release(&cluster, &key, &profile_key).await {
                    tracing::warn!("cannot release {}: {e}", key.key());
                }
            }
        });
    }
}

/// Why nothing new can be claimed now, as a session is told.
pub(super) fn cluster_down(node: &ClusterNode) -> String {
    let link = node.link();
    let link = link.borrow();
    match &link.reason {
        Some(reason) => format!("the cluster is unreachable ({reason})"),
        None => "the cluster is not connected yet".into(),
    }
}

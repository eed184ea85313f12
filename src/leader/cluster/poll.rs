//! The poller's journal while this machine holds the bot-wide lease
//! (docs/CLUSTER.md, *Inbound*): each update for a session goes into the
//! stream on the subject of the machine whose session owns its topic, then
//! the bot-wide offset moves past the batch by a write fenced by the term.
//! Only then may the next `getUpdates` confirm the batch. The machine
//! decides which machine an update is for; that machine decides, from its
//! own bindings, which of its sessions (`consume.rs`).

use std::collections::HashMap;

use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::super::batch::Batch;
use super::super::poller::{Journal, Step, decoded, update_id_of};
use crate::backoff::Backoff;
use crate::cluster::claims::{ClaimKey, SessionClaim};
use crate::cluster::inbound::RoutedUpdate;
use crate::cluster::lease::Term;
use crate::cluster::{Cluster, ClusterError, NodeName};
use crate::store::StoreError;
use crate::telegram::{Update, UpdateKind};

pub(super) struct ClusterPoll {
    pub cluster: Cluster,
    pub term: Term,
    /// The offset of the next poll: the cluster's, as this term moved it.
    pub offset: Option<i64>,
    pub retry: Backoff,
    pub stop: CancellationToken,
    /// Where the updates for no session go: this leader's router.
    pub batches: mpsc::Sender<Batch>,
}

impl Journal for ClusterPoll {
    fn offset(&self) -> Result<Option<i64>, StoreError> {
        Ok(self.offset)
    }

    async fn journal(&mut self, raw: Vec<Value>) -> Result<Step, StoreError> {
        let Some(last) = raw.iter().filter_map(update_id_of).max() else {
            return Ok(Step::Confirm);
        };
        let mut owners: HashMap<(i64, i64), Option<NodeName>> = HashMap::new();
        let mut outgoing = Vec::new();
        let mut others = Vec::new();
        for (value, update) in raw.iter().zip(decoded_with_values(&raw)) {
            let Some(update) = update else { continue };
            let node = match topic_of(&update) {
                Some(topic) => match owners.get(&topic) {
                    Some(node) => node.clone(),
                    None => match self.owner(topic).await {
                        Ok(node) => owners.entry(topic).or_insert(node).clone(),
                        Err(e) => return Ok(self.again("cannot read a topic's claim", e).await),
                    },
                },
                None => None,
            };
            match node {
                Some(node) => outgoing.push(RoutedUpdate {
                    node,
                    update_id: update.update_id,
                    payload: serde_json::to_vec(value).unwrap_or_default().into(),
                }),
                None => others.push(update),
            }
        }
        if !outgoing.is_empty()
            && let Err(e) = self.cluster.inbound().publish(self.term, &outgoing).await
        {
            return Ok(self.again("cannot publish updates", e).await);
        }
        match self
            .cluster
            .claims()
            .advance_offset(self.term, last + 1)
            .await
        {
            Ok(()) => {}
            Err(e @ ClusterError::Fenced { .. }) => {
                tracing::warn!("stopping the poll: {e}");
                return Ok(Step::Stop);
            }
            Err(e) => return Ok(self.again("cannot advance the offset", e).await),
        }
        self.offset = Some(last + 1);
        self.retry.reset();
        // Published and confirmed: the updates for no session are this
        // leader's to answer.
        let batch = Batch::unowned(others);
        let _ = self.batches.send(batch).await;
        Ok(Step::Confirm)
    }
}

/// Each raw update decoded, or `None` where it does not decode (skipped,
/// and logged, by [`decoded`]).
fn decoded_with_values(raw: &[Value]) -> impl Iterator<Item = Option<Update>> + '_ {
    raw.iter()
        .map(|value| decoded(std::slice::from_ref(value)).next())
}

impl ClusterPoll {
    /// The machine whose session owns a topic, if any.
    async fn owner(&self, (chat, thread): (i64, i64)) -> Result<Option<NodeName>, ClusterError> {
        let claim = self
            .cluster
            .claims()
            .get::<SessionClaim>(&ClaimKey::Topic { chat, thread })
            .await?;
        Ok(claim.map(|c| c.value.node))
    }

    /// Waits before the batch comes again.
    async fn again(&mut self, what: &str, e: ClusterError) -> Step {
        tracing::warn!(term = %self.term, "{what}; the batch comes again: {e}");
        tokio::select! {
            () = self.stop.cancelled() => {}
            () = tokio::time::sleep(self.retry.step()) => {}
        }
        Step::Again
    }
}

/// The topic an update happened in: a message's, or a tapped button's
/// message's.
fn topic_of(update: &Update) -> Option<(i64, i64)> {
    let message = match &update.kind {
        UpdateKind::Message(m) | UpdateKind::EditedMessage(m) => m,
        UpdateKind::CallbackQuery(q) => q.message.as_ref()?,
        UpdateKind::GenerationStopped(stopped) => {
            return Some((stopped.chat.id, stopped.message_thread_id?));
        }
        UpdateKind::Unknown { .. } => return None,
    };
    Some((message.chat.id, message.topic()?))
}

//! Questions to every machine at once (docs/CLUSTER.md, *`/relay status`
//! and `/relay restart`*): a node publishes on `relay.<bot>.status` or
//! `relay.<bot>.restart` with a reply inbox, every node's local leader
//! answers, and the asker gathers the answers until each machine it
//! expects answered or the window passed. A machine that does not answer
//! is named as such by the caller, never waited for longer.
//!
//! And forgetting a machine for good (`agent-relay cluster forget`).

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::claims::SessionClaim;
use super::server::{Envelope, Reply, Server, Stamp};
use super::{Cluster, ClusterError, NodeName, timed};

/// How long an asker gathers answers at most.
pub const ANSWER_WINDOW: Duration = Duration::from_secs(2);

/// What one asks every machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Question {
    /// Each machine's sessions.
    Status,
    /// Restart every machine's relay with a plan.
    Restart,
    /// An order for one machine's `agent-relay serve` (`/new box:…`): the
    /// machine named answers, the others stay silent.
    Launch,
}

impl Question {
    pub(super) fn word(self) -> &'static str {
        match self {
            Self::Status => "status",
            Self::Restart => "restart",
            Self::Launch => "launch",
        }
    }
}

impl Cluster {
    /// Asks every machine `question` and gathers the answers, until each
    /// of `expected` answered or [`ANSWER_WINDOW`] passed. Answers from
    /// machines not expected count too; an unreadable one is skipped.
    pub async fn ask_nodes<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        question: Question,
        request: &Req,
        expected: &[NodeName],
    ) -> Result<Vec<(NodeName, Resp)>, ClusterError> {
        self.ask_nodes_within(question, request, expected, ANSWER_WINDOW)
            .await
    }

    /// [`Cluster::ask_nodes`] with a window of its own: a question whose
    /// answer takes a while (an agent started on another machine).
    pub async fn ask_nodes_within<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        question: Question,
        request: &Req,
        expected: &[NodeName],
        window: Duration,
    ) -> Result<Vec<(NodeName, Resp)>, ClusterError> {
        let payload: Bytes = serde_json::to_vec(&Envelope {
            from: self.node.name.clone(),
            term: None,
            body: request,
        })
        .map_err(|e| ClusterError::unreadable("a question", e))?
        .into();
        let inbox = self.client.new_inbox();
        let mut answers = self
            .client
            .subscribe(inbox.clone())
            .await
            .map_err(ClusterError::unreachable)?;
        self.client
            .publish_with_reply(self.names.question_subject(question), inbox, payload)
            .await
            .map_err(ClusterError::unreachable)?;
        let mut out: Vec<(NodeName, Resp)> = Vec::new();
        let window = tokio::time::sleep(window);
        tokio::pin!(window);
        while !expected.iter().all(|n| out.iter().any(|(m, _)| m == n)) {
            let message = tokio::select! {
                () = &mut window => break,
                m = answers.next() => match m {
                    Some(m) => m,
                    None => break,
                },
            };
            match serde_json::from_slice::<Reply<Resp>>(&message.payload) {
                Ok(Reply {
                    node: Some(node),
                    body,
                    ..
                }) if !out.iter().any(|(m, _)| *m == node) => out.push((node, body)),
                Ok(Reply { node: Some(_), .. }) => {}
                Ok(Reply { node: None, .. }) => {
                    tracing::warn!("an answer to {question:?} that names no machine");
                }
                Err(e) => tracing::warn!("an unreadable answer to {question:?}: {e}"),
            }
        }
        Ok(out)
    }

    /// Starts answering `question` for this machine. Dropping the
    /// returned [`Server`] stops it.
    pub async fn answer_nodes(&self, question: Question) -> Result<Server, ClusterError> {
        self.serve(
            self.names.question_subject(question),
            None,
            Stamp::Node(self.node.name.clone()),
        )
        .await
    }

    /// Forgets a machine for good: its name (so that a reinstalled machine
    /// can take it again), its slot and topic claims and its durable
    /// consumer. The updates still waiting for it, which nobody can deliver
    /// any more (the sessions they were for lived in that machine's store),
    /// come back in [`Forgotten::waiting`]: the caller tells their topics,
    /// then drops them with [`Cluster::drop_waiting`].
    ///
    /// The claims go first, so that no leader routes anything new to the
    /// machine while its backlog is read.
    pub async fn forget(&self, name: &NodeName) -> Result<Forgotten, ClusterError> {
        let claims = self.claims();
        let mut removed = 0;
        for key in claims.keys().await? {
            let theirs = if key == format!("node.{name}") {
                true
            } else if key.starts_with("slot.") || key.starts_with("topic.") {
                claims
                    .read_raw(&key)
                    .await?
                    .and_then(|v| serde_json::from_value::<SessionClaim>(v).ok())
                    .is_some_and(|c| c.node == *name)
            } else {
                false
            };
            if theirs {
                claims.remove(&key).await?;
                removed += 1;
            }
        }
        let consumer = self.names.consumer(name);
        let had_consumer = timed(async {
            Ok::<_, ClusterError>(self.inbound.delete_consumer(&consumer).await.is_ok())
        })
        .await?;
        Ok(Forgotten {
            claims: removed,
            had_consumer,
            waiting: self.waiting_for(name).await?,
        })
    }

    /// Every update on `name`'s subject, in stream order.
    async fn waiting_for(&self, name: &NodeName) -> Result<Vec<Waiting>, ClusterError> {
        use async_nats::jetstream::stream::RawMessageErrorKind;
        let subject = self.names.inbound_subject(name);
        let mut out = Vec::new();
        let mut from = 1;
        loop {
            let got = timed(async {
                match self
                    .inbound
                    .get_first_raw_message_by_subject(&subject, from)
                    .await
                {
                    Ok(message) => Ok(Some(message)),
                    Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
                    Err(e) => Err(ClusterError::unreachable(e)),
                }
            })
            .await?;
            let Some(message) = got else { break };
            from = message.sequence + 1;
            out.push(Waiting {
                sequence: message.sequence,
                payload: message.payload,
            });
        }
        Ok(out)
    }

    /// Drops the updates on `name`'s subject up to and including stream
    /// sequence `through` (what [`Cluster::forget`] returned, once told):
    /// anything published after it stays. Returns how many were dropped.
    pub async fn drop_waiting(&self, name: &NodeName, through: u64) -> Result<u64, ClusterError> {
        let purged = timed(async {
            self.inbound
                .purge()
                .filter(self.names.inbound_subject(name))
                .sequence(through + 1)
                .await
                .map_err(ClusterError::refused)
        })
        .await?;
        Ok(purged.purged)
    }
}

/// What [`Cluster::forget`] removed, and what it found waiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forgotten {
    /// The name, slot and topic claims removed.
    pub claims: usize,
    /// Whether the machine had a durable consumer.
    pub had_consumer: bool,
    /// The updates that were waiting for the machine, oldest first.
    pub waiting: Vec<Waiting>,
}

/// One update that was waiting for a forgotten machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    /// Its sequence in the inbound stream.
    pub sequence: u64,
    /// The update as the leader published it (Telegram's JSON).
    pub payload: Bytes,
}

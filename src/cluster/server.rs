//! The one request/reply server of the cluster: a subscription whose
//! messages are requests, each read as the asker's type and answered once
//! on its reply subject. The leader of a term serves the other machines'
//! Bot API calls with it ([`super::calls`]), and every machine its
//! questions to all ([`super::nodes`]).
//!
//! What tells the two apart is the stamp: a term's server takes only
//! requests for its term and signs each answer with it; a machine's
//! server takes every request and signs each answer with its name.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use futures::StreamExt;

use super::lease::Term;
use super::{Cluster, ClusterError, NodeName};

/// A request on the wire.
#[derive(Serialize, Deserialize)]
pub(super) struct Envelope<T> {
    pub from: NodeName,
    /// The term a call is for; questions to every machine have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    pub body: T,
}

/// An answer on the wire, signed by the term or the machine that answered.
#[derive(Serialize, Deserialize)]
pub(super) struct Reply<T> {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeName>,
    pub body: T,
}

/// Whose server it is: what it accepts and how it signs its answers.
#[derive(Debug, Clone)]
pub(super) enum Stamp {
    /// The leader of this term: requests for another term are skipped.
    Term(Term),
    /// This machine: every request is taken.
    Node(NodeName),
}

/// Requests to one server, in the order they arrive. Dropping it
/// unsubscribes.
pub struct Server {
    subscriber: async_nats::Subscriber,
    client: async_nats::Client,
    stamp: Stamp,
}

/// One request to answer.
pub struct Request<Req> {
    pub from: NodeName,
    pub request: Req,
    reply: Option<async_nats::Subject>,
    client: async_nats::Client,
    stamp: Stamp,
}

impl Cluster {
    /// Starts serving `subject`; with `queue`, as one of a queue group (each
    /// request reaches one member only). Returns once the subscription is
    /// in place on the server, so nobody is told of it too early.
    pub(super) async fn serve(
        &self,
        subject: String,
        queue: Option<&str>,
        stamp: Stamp,
    ) -> Result<Server, ClusterError> {
        let subscribed = match queue {
            Some(group) => {
                self.client
                    .queue_subscribe(subject, group.to_string())
                    .await
            }
            None => self.client.subscribe(subject).await,
        };
        let subscriber = subscribed.map_err(ClusterError::unreachable)?;
        self.round_trip().await?;
        Ok(Server {
            subscriber,
            client: self.client.clone(),
            stamp,
        })
    }
}

impl Server {
    /// The next request; `None` once the subscription ended. One that
    /// cannot be read, or is for another term, is logged and skipped: its
    /// asker times out (or counts this machine as silent).
    pub async fn next<Req: DeserializeOwned>(&mut self) -> Option<Request<Req>> {
        loop {
            let message = self.subscriber.next().await?;
            match serde_json::from_slice::<Envelope<Req>>(&message.payload) {
                Ok(envelope) => {
                    if let Stamp::Term(term) = &self.stamp
                        && envelope.term != Some(term.0)
                    {
                        tracing::warn!(term = ?envelope.term, "a call for another term");
                        continue;
                    }
                    return Some(Request {
                        from: envelope.from,
                        request: envelope.body,
                        reply: message.reply,
                        client: self.client.clone(),
                        stamp: self.stamp.clone(),
                    });
                }
                Err(e) => tracing::warn!("an unreadable request: {e}"),
            }
        }
    }
}

impl<Req> Request<Req> {
    /// Sends the answer back to the asker.
    pub async fn answer<Resp: Serialize>(self, response: &Resp) -> Result<(), ClusterError> {
        let Some(reply) = self.reply else {
            return Ok(());
        };
        let (term, node) = match self.stamp {
            Stamp::Term(term) => (Some(term.0), None),
            Stamp::Node(node) => (None, Some(node)),
        };
        let payload: bytes::Bytes = serde_json::to_vec(&Reply {
            term,
            node,
            body: response,
        })
        .map_err(|e| ClusterError::unreadable("an answer", e))?
        .into();
        self.client
            .publish(reply, payload)
            .await
            .map_err(ClusterError::unreachable)
    }
}

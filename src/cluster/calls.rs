//! Bot API calls through the bot-wide leader (docs/CLUSTER.md, *Outbound*):
//! any node asks `relay.<bot>.call.<term>`, and only the leader of that
//! term answers, after running the call through its one rate limiter. The
//! subject names the term, so a request never reaches a leader the caller
//! does not believe in, and the reply names it too.
//!
//! The bodies are the caller's own types (the leader's topic operations
//! and their outcomes, in phase 2): this layer only carries them as JSON.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::lease::Term;
use super::{Cluster, ClusterError, NodeName};

/// A request on the wire.
#[derive(Serialize, Deserialize)]
struct Envelope<T> {
    from: NodeName,
    term: u64,
    body: T,
}

/// A reply on the wire.
#[derive(Serialize, Deserialize)]
struct Reply<T> {
    term: u64,
    body: T,
}

/// Why a call got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// Nobody serves that term (it ended, or no leader was elected yet):
    /// nothing was done. Ask again under the next term.
    #[error("no leader serves term {0}")]
    NoLeader(Term),
    /// No answer in time: the call may or may not have been made.
    #[error("the leader did not answer within {0:?}")]
    TimedOut(Duration),
    /// The cluster cannot be reached, or the answer was not readable.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// The request/reply side of the cluster.
#[derive(Clone)]
pub struct Calls {
    cluster: Cluster,
}

impl Cluster {
    pub fn calls(&self) -> Calls {
        Calls {
            cluster: self.clone(),
        }
    }
}

impl Calls {
    /// Asks the leader of `term` to make a call, waiting up to `deadline`
    /// for its answer.
    pub async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        term: Term,
        request: &Req,
        deadline: Duration,
    ) -> Result<Resp, CallError> {
        let envelope = Envelope {
            from: self.cluster.node.name.clone(),
            term: term.0,
            body: request,
        };
        let payload: Bytes = serde_json::to_vec(&envelope)
            .map_err(|e| ClusterError::decode("a call", e))?
            .into();
        let subject = self.cluster.names.call_subject(term);
        let request = async_nats::Request::new()
            .payload(payload)
            .timeout(Some(deadline));
        let answer = self
            .cluster
            .client
            .send_request(subject, request)
            .await
            .map_err(|e| match e.kind() {
                async_nats::RequestErrorKind::NoResponders => CallError::NoLeader(term),
                async_nats::RequestErrorKind::TimedOut => CallError::TimedOut(deadline),
                _ => CallError::Cluster(ClusterError::unreachable(e)),
            })?;
        let reply: Reply<Resp> = serde_json::from_slice(&answer.payload)
            .map_err(|e| ClusterError::decode("a call's answer", e))?;
        if reply.term != term.0 {
            return Err(CallError::Cluster(ClusterError::decode(
                "a call's answer",
                format!("answered by term {} instead of {term}", reply.term),
            )));
        }
        Ok(reply.body)
    }

    /// Starts answering calls for `term` (the leader does, while it leads).
    /// Dropping the returned [`CallServer`] stops it.
    pub async fn serve(&self, term: Term) -> Result<CallServer, ClusterError> {
        let subject = self.cluster.names.call_subject(term);
        // A queue group: should two processes of one term ever subscribe,
        // each call still reaches one of them only.
        let subscriber = self
            .cluster
            .client
            .queue_subscribe(subject, "leader".into())
            .await
            .map_err(ClusterError::unreachable)?;
        // The subscription is in place on the server before anyone is told
        // that this term leads.
        self.cluster.round_trip().await?;
        Ok(CallServer {
            subscriber,
            client: self.cluster.client.clone(),
            term,
        })
    }
}

/// The leader's end: calls for one term, in the order they arrived.
pub struct CallServer {
    subscriber: async_nats::Subscriber,
    client: async_nats::Client,
    term: Term,
}

/// One call to answer.
pub struct IncomingCall<Req> {
    pub from: NodeName,
    pub request: Req,
    reply: Option<async_nats::Subject>,
    client: async_nats::Client,
    term: Term,
}

impl CallServer {
    /// The next call; `None` once the subscription ended. A call that cannot
    /// be read is logged and skipped: its caller times out.
    pub async fn next<Req: DeserializeOwned>(&mut self) -> Option<IncomingCall<Req>> {
        loop {
            let message = self.subscriber.next().await?;
            match serde_json::from_slice::<Envelope<Req>>(&message.payload) {
                Ok(envelope) if envelope.term == self.term.0 => {
                    return Some(IncomingCall {
                        from: envelope.from,
                        request: envelope.body,
                        reply: message.reply,
                        client: self.client.clone(),
                        term: self.term,
                    });
                }
                Ok(envelope) => tracing::warn!(term = envelope.term, "a call for another term"),
                Err(e) => tracing::warn!("an unreadable call: {e}"),
            }
        }
    }
}

impl<Req> IncomingCall<Req> {
    /// Sends the answer back to the caller.
    pub async fn answer<Resp: Serialize>(self, response: &Resp) -> Result<(), ClusterError> {
        let Some(reply) = self.reply else {
            return Ok(());
        };
        let payload: Bytes = serde_json::to_vec(&Reply {
            term: self.term.0,
            body: response,
        })
        .map_err(|e| ClusterError::decode("an answer", e))?
        .into();
        self.client
            .publish(reply, payload)
            .await
            .map_err(ClusterError::unreachable)
    }
}

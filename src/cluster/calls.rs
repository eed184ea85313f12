//! Bot API calls through the bot-wide leader (docs/CLUSTER.md, *Outbound*):
//! any node asks `relay.<bot>.call.<term>`, and only the leader of that
//! term answers, after running the call through its one rate limiter. The
//! subject names the term, so a request never reaches a leader the caller
//! does not believe in, and the reply names it too.
//!
//! The bodies are the caller's own types (the leader's Bot API calls and
//! their outcomes): this layer only carries them as JSON. The leader's end
//! is the cluster's one request/reply [`Server`].

use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::lease::Term;
use super::server::{Envelope, Reply, Server, Stamp};
use super::{Cluster, ClusterError};

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
            term: Some(term.0),
            body: request,
        };
        let payload: Bytes = serde_json::to_vec(&envelope)
            .map_err(|e| ClusterError::unreadable("a call", e))?
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
            .map_err(|e| ClusterError::unreadable("a call's answer", e))?;
        if reply.term != Some(term.0) {
            return Err(CallError::Cluster(ClusterError::unreadable(
                "a call's answer",
                format!("answered by term {:?} instead of {term}", reply.term),
            )));
        }
        Ok(reply.body)
    }

    /// Starts answering calls for `term` (the leader does, while it leads).
    /// Dropping the returned [`Server`] stops it.
    pub async fn serve(&self, term: Term) -> Result<Server, ClusterError> {
        // A queue group: should two processes of one term ever subscribe,
        // each call still reaches one of them only.
        self.cluster
            .serve(
                self.cluster.names.call_subject(term),
                Some("leader"),
                Stamp::Term(term),
            )
            .await
    }
}

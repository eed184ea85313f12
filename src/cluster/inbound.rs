//! The inbound stream `RELAY_<bot>_IN` (docs/CLUSTER.md, *Inbound*): the
//! lease holder publishes each update on the subject of the node whose
//! session owns its topic, with the update id as `Nats-Msg-Id`, before it
//! confirms the offset to Telegram; each node reads its subject through a
//! durable pull consumer with explicit acks, in stream order, and acks a
//! message once it is in its own journal.

use std::time::Duration;

use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures::StreamExt;

use super::lease::Term;
use super::{Cluster, ClusterError, Names, NodeName, REQUEST_TIMEOUT, open_or_create, timed};

/// The header naming the term of the leader that published an update.
const TERM_HEADER: &str = "Relay-Term";

/// How long the stream remembers an update id to drop a repeat: far longer
/// than a takeover, after which a new leader fetches again what its
/// predecessor published but did not confirm.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(600);

/// How long a delivered message may stay unacknowledged before JetStream
/// hands it out again: short, since a delivery lost on its way (a
/// connection that dropped while it travelled) waits this long, and a node
/// journals a batch in milliseconds. A repeat is dropped by the journal.
pub const ACK_WAIT: Duration = Duration::from_secs(5);

/// The stream's limits: far beyond what a person types. If ever reached, a
/// publish is refused, the leader does not confirm and the poll pauses
/// (Telegram keeps the updates): nothing is dropped.
const MAX_BYTES: i64 = 1 << 30;
const MAX_MESSAGES: i64 = 1_000_000;

pub(super) async fn ensure_stream(
    js: &jetstream::Context,
    names: &Names,
) -> Result<stream::Stream, ClusterError> {
    let name = names.inbound_stream();
    open_or_create(
        js,
        &format!("the stream {name}"),
        || async { js.get_stream(&name).await },
        |replicas| stream::Config {
            name: name.clone(),
            description: Some("agent-relay: updates routed to nodes (docs/CLUSTER.md)".into()),
            subjects: vec![format!("relay.{}.in.>", names.bot)],
            retention: stream::RetentionPolicy::WorkQueue,
            discard: stream::DiscardPolicy::New,
            max_bytes: MAX_BYTES,
            max_messages: MAX_MESSAGES,
            duplicate_window: DEDUP_WINDOW,
            storage: stream::StorageType::File,
            num_replicas: replicas,
            ..Default::default()
        },
    )
    .await
}

/// What one publish came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Published {
    /// The message's sequence in the stream.
    pub sequence: u64,
    /// The stream already had this update id (within [`DEDUP_WINDOW`]):
    /// nothing was added.
    pub duplicate: bool,
}

/// One update for a node, as the leader publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutedUpdate {
    pub node: NodeName,
    pub update_id: i64,
    /// Whatever the nodes read (the leader's journal entry, as JSON).
    pub payload: Bytes,
}

/// The publishing side of the inbound stream.
#[derive(Clone)]
pub struct Inbound {
    cluster: Cluster,
}

impl Cluster {
    pub fn inbound(&self) -> Inbound {
        Inbound {
            cluster: self.clone(),
        }
    }
}

impl Inbound {
    /// Publishes a batch in order and waits until the stream stored every
    /// update (replicated, when it has replicas). Only then may the leader
    /// confirm the batch to Telegram. A repeat of an update id is dropped
    /// by the stream and reported as `duplicate`.
    pub async fn publish(
        &self,
        term: Term,
        batch: &[RoutedUpdate],
    ) -> Result<Vec<Published>, ClusterError> {
        let js = &self.cluster.js;
        let mut acks = Vec::with_capacity(batch.len());
        // Sent one after another on one connection, the messages reach the
        // stream in this order; the acknowledgements are awaited together.
        for update in batch {
            let message = jetstream::message::PublishMessage::build()
                .payload(update.payload.clone())
                .message_id(update.update_id.to_string())
                .header(TERM_HEADER, term.0.to_string().as_str());
            let ack = timed(async {
                js.send_publish(self.cluster.names.inbound_subject(&update.node), message)
                    .await
                    .map_err(ClusterError::unreachable)
            })
            .await?;
            acks.push(ack);
        }
        let mut published = Vec::with_capacity(acks.len());
        for ack in acks {
            let ack = timed(async { ack.await.map_err(publish_error) }).await?;
            published.push(Published {
                sequence: ack.sequence,
                duplicate: ack.duplicate,
            });
        }
        Ok(published)
    }

    /// This node's durable consumer made afresh, for a new process of the
    /// node (a local failover): what its dead predecessor fetched but did
    /// not acknowledge would otherwise wait [`ACK_WAIT`] at the server, or
    /// longer when the server handed it to a pull request of the dead
    /// process. On a work-queue stream an acknowledged update is gone, so
    /// the new consumer starts with exactly the unacknowledged ones, in
    /// stream order. Only one process of a node reads at a time (the
    /// machine's bus lock, and the node claim across machines).
    pub async fn fresh_consumer(&self, node: &NodeName) -> Result<NodeConsumer, ClusterError> {
        let durable = self.cluster.names.consumer(node);
        let stream = &self.cluster.inbound;
        // Missing already is fine; unreachable fails the create below too.
        let _ = timed(async {
            stream
                .delete_consumer(&durable)
                .await
                .map_err(ClusterError::unreachable)
        })
        .await;
        self.consumer(node).await
    }

    /// This node's durable consumer, created if missing. It survives the
    /// node's absence: what was published meanwhile waits for it.
    pub async fn consumer(&self, node: &NodeName) -> Result<NodeConsumer, ClusterError> {
        let durable = self.cluster.names.consumer(node);
        let config = consumer::pull::Config {
            durable_name: Some(durable.clone()),
            description: Some(format!("agent-relay: updates for node {node}")),
            filter_subject: self.cluster.names.inbound_subject(node),
            deliver_policy: consumer::DeliverPolicy::All,
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: ACK_WAIT,
            max_ack_pending: 10_000,
            ..Default::default()
        };
        let stream = &self.cluster.inbound;
        let consumer = timed(async {
            stream
                .get_or_create_consumer(&durable, config)
                .await
                .map_err(ClusterError::unreachable)
        })
        .await?;
        Ok(NodeConsumer { consumer })
    }
}

fn publish_error(e: jetstream::context::PublishError) -> ClusterError {
    match e.kind() {
        jetstream::context::PublishErrorKind::TimedOut
        | jetstream::context::PublishErrorKind::BrokenPipe => ClusterError::unreachable(e),
        _ => ClusterError::refused(e),
    }
}

/// A node's durable pull consumer of its subject.
pub struct NodeConsumer {
    consumer: consumer::PullConsumer,
}

/// One update delivered to a node.
pub struct Delivery {
    pub update_id: i64,
    /// The term of the leader that published it.
    pub term: Option<Term>,
    pub payload: Bytes,
    /// Its sequence in the stream: deliveries come in this order.
    pub stream_sequence: u64,
    /// How many times it was delivered (more than once after a node died
    /// before acknowledging).
    pub delivered: i64,
    message: jetstream::Message,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("update_id", &self.update_id)
            .field("stream_sequence", &self.stream_sequence)
            .field("delivered", &self.delivered)
            .finish_non_exhaustive()
    }
}

impl NodeConsumer {
    /// Up to `max` deliveries in stream order, waiting up to `wait` for the
    /// first; an empty batch when nothing came.
    pub async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, ClusterError> {
        let mut messages = tokio::time::timeout(wait + REQUEST_TIMEOUT, async {
            self.consumer
                .fetch()
                .max_messages(max)
                .expires(wait)
                .messages()
                .await
                .map_err(ClusterError::unreachable)
        })
        .await
        .map_err(|_| ClusterError::Unreachable("the fetch was not answered".into()))??;
        let mut out = Vec::new();
        let overall = tokio::time::sleep(wait + REQUEST_TIMEOUT);
        tokio::pin!(overall);
        loop {
            let next = tokio::select! {
                next = messages.next() => next,
                () = &mut overall => break,
            };
            let Some(message) = next else { break };
            let message = message.map_err(ClusterError::unreachable)?;
            let (stream_sequence, delivered) = {
                let info = message
                    .info()
                    .map_err(|e| ClusterError::unreadable("a delivery", e))?;
                (info.stream_sequence, info.delivered)
            };
            let headers = message.headers.as_ref();
            let update_id = headers
                .and_then(|h| h.get(async_nats::header::NATS_MESSAGE_ID))
                .and_then(|v| v.as_str().parse().ok())
                .ok_or_else(|| ClusterError::unreadable("a delivery", "no update id"))?;
            let term = headers
                .and_then(|h| h.get(TERM_HEADER))
                .and_then(|v| v.as_str().parse().ok())
                .map(Term);
            out.push(Delivery {
                update_id,
                term,
                payload: message.payload.clone(),
                stream_sequence,
                delivered,
                message,
            });
        }
        Ok(out)
    }
}

impl Delivery {
    /// Acknowledges the delivery and waits until JetStream recorded it: it
    /// is never handed out again.
    pub async fn ack(&self) -> Result<(), ClusterError> {
        timed(async {
            self.message
                .double_ack()
                .await
                .map_err(ClusterError::unreachable)
        })
        .await
    }
}

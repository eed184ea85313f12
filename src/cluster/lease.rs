//! The bot-wide lease (docs/CLUSTER.md, *The lease*): the key `leader` of
//! the lease bucket, created if absent, renewed by compare-and-set on its
//! revision, expired by the bucket's max age. The revision of the create
//! that won is the **term**: the bot-wide epoch and the fencing token of
//! everything the leader writes.
//!
//! The lease belongs to the node (name and node id), not the process: a
//! new local leader on the same machine adopts it by a compare-and-set
//! renewal and keeps the term.

use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::buckets::{cas, create, delete_at, read, to_bytes};
use super::{Cluster, ClusterError, Node, NodeName, timed};

/// The lease bucket's max age: a lease not renewed for this long is gone.
pub const LEASE_TIME: Duration = Duration::from_secs(6);
/// How often the holder renews.
pub const RENEW_EVERY: Duration = Duration::from_secs(1);
/// How long after its last successful renewal (measured from when it was
/// sent) the holder stops leading: early enough to end its long poll on
/// Telegram's side before the server can expire the lease.
pub const STEP_DOWN_AFTER: Duration = Duration::from_secs(3);
/// How often a contender tries to take a lease it cannot see go (expiry
/// by age leaves no marker to watch on NATS 2.9).
pub const RETRY_EVERY: Duration = Duration::from_millis(500);

/// The key of the lease in its bucket.
pub(super) const KEY: &str = "leader";

/// A lease term: the revision of the create that won the lease. Terms only
/// grow, so a larger one is a later leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Term(pub u64);

impl std::fmt::Display for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// What the lease's value says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Record {
    node: NodeName,
    node_id: String,
    /// Absent in the value of the create itself, whose revision is the term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    term: Option<u64>,
}

/// The lease as read: who holds it, the term and the revision to compare against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub node: NodeName,
    pub node_id: String,
    pub term: Term,
    pub revision: u64,
}

/// Who leads, as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leadership {
    /// Not known yet (just started, or NATS is unreachable).
    Unknown,
    /// Another node leads (or nobody, between an expiry and a takeover).
    Follower { leader: Option<(NodeName, Term)> },
    /// This node leads under `term`.
    Leading { term: Term },
}

impl Leadership {
    pub fn term(&self) -> Option<Term> {
        match self {
            Self::Leading { term } => Some(*term),
            Self::Follower { leader } => leader.as_ref().map(|(_, t)| *t),
            Self::Unknown => None,
        }
    }
}

impl Cluster {
    /// Reads the lease: `None` when nobody holds it.
    pub async fn lease_holder(&self) -> Result<Option<Holder>, ClusterError> {
        Ok(read::<Record>(&self.lease_kv, KEY)
            .await?
            .map(|read| Holder {
                term: Term(read.value.term.unwrap_or(read.revision)),
                node: read.value.node,
                node_id: read.value.node_id,
                revision: read.revision,
            }))
    }

    /// Starts campaigning for the lease and, once held, renewing it. The
    /// returned [`LeaseKeeper`] tells who leads; drop or
    /// [`LeaseKeeper::release`] it to stop.
    pub fn campaign(&self) -> LeaseKeeper {
        let (state, leadership) = watch::channel(Leadership::Unknown);
        let stop = CancellationToken::new();
        let campaign = Campaign {
            cluster: self.clone(),
            state,
            stop: stop.clone(),
            held: None,
        };
        let task = crate::tasks::spawn(campaign.run());
        LeaseKeeper {
            leadership,
            stop,
            task: Some(task),
        }
    }
}

/// A running campaign for the lease.
pub struct LeaseKeeper {
    leadership: watch::Receiver<Leadership>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<Option<Held>>>,
}

impl LeaseKeeper {
    /// Who leads now, and every change.
    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.clone()
    }

    /// Stops and, if this node holds the lease, deletes it (expecting its
    /// revision) so a successor is elected at once, not after the lease time.
    pub async fn release(mut self) {
        self.stop.cancel();
        let Some(task) = self.task.take() else {
            return;
        };
        if let Ok(Some(held)) = task.await {
            let released = delete_at(&held.kv, KEY, held.revision).await;
            match released {
                Ok(()) => tracing::info!(term = %held.term, "released the lease"),
                Err(e) => tracing::warn!("cannot release the lease; it expires by itself: {e}"),
            }
        }
    }

    /// Stops renewing without releasing: the lease expires by itself after
    /// [`LEASE_TIME`], as when a machine disappears.
    pub async fn abandon(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The lease as this node holds it.
struct Held {
    kv: kv::Store,
    term: Term,
    revision: u64,
    /// When the last successful renewal (or the create) was sent.
    renewed_at: Instant,
    /// When to send the next renewal.
    next_try: Instant,
}

struct Campaign {
    cluster: Cluster,
    state: watch::Sender<Leadership>,
    stop: CancellationToken,
    held: Option<Held>,
}

impl Campaign {
    fn me(&self) -> &Node {
        &self.cluster.node
    }

    fn set(&self, new: Leadership) {
        self.state.send_if_modified(|old| {
            if *old == new {
                return false;
            }
            tracing::info!(leadership = ?new, "the bot-wide lease changed");
            *old = new;
            true
        });
    }

    /// Returns the lease it still holds when stopped, for a release.
    async fn run(mut self) -> Option<Held> {
        let mut watch = None;
        while !self.stop.is_cancelled() {
            if self.held.is_some() {
                self.renew().await;
                continue;
            }
            if let Err(e) = self.contend().await {
                tracing::debug!("campaigning for the lease: {e}");
                self.set(Leadership::Unknown);
            }
            if self.held.is_some() {
                continue;
            }
            // Wait for a change of the key (a release is seen at once) or
            // the retry period, whichever comes first.
            if watch.is_none() {
                watch = timed(async {
                    self.cluster
                        .lease_kv
                        .watch(KEY)
                        .await
                        .map_err(ClusterError::unreachable)
                })
                .await
                .ok();
            }
            let changed = async {
                match watch.as_mut() {
                    Some(w) => w.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.stop.cancelled() => break,
                () = tokio::time::sleep(RETRY_EVERY) => {}
                next = changed => {
                    if !matches!(next, Some(Ok(_))) {
                        watch = None;
                    }
                }
            }
        }
        self.held.take()
    }

    /// One try: adopt this node's own lease, take a free one, or note who
    /// holds it.
    async fn contend(&mut self) -> Result<(), ClusterError> {
        let me = self.me().clone();
        let sent = Instant::now();
        match self.cluster.lease_holder().await? {
            Some(holder) if holder.node_id == me.id => {
                // Our own node's lease (a local failover, or our own
                // step-down while NATS was away): keep it and its term.
                let record = Record {
                    node: me.name.clone(),
                    node_id: me.id.clone(),
                    term: Some(holder.term.0),
                };
                let revision = self.write(&record, holder.revision).await?;
                tracing::info!(term = %holder.term, "adopted this node's lease");
                self.hold(holder.term, revision, sent);
            }
            Some(holder) => self.set(Leadership::Follower {
                leader: Some((holder.node, holder.term)),
            }),
            None => {
                let record = Record {
                    node: me.name.clone(),
                    node_id: me.id.clone(),
                    term: None,
                };
                match create(&self.cluster.lease_kv, KEY, to_bytes(&record)?).await {
                    Ok(revision) => {
                        tracing::info!(term = revision, "took the bot-wide lease");
                        self.hold(Term(revision), revision, sent);
                    }
                    Err(ClusterError::Taken { .. }) => {
                        self.set(Leadership::Follower { leader: None });
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    fn hold(&mut self, term: Term, revision: u64, sent: Instant) {
        self.held = Some(Held {
            kv: self.cluster.lease_kv.clone(),
            term,
            revision,
            renewed_at: sent,
            next_try: sent + RENEW_EVERY,
        });
        self.set(Leadership::Leading { term });
    }

    /// Waits for the next renewal and sends it; steps down when the lease
    /// was taken or could not be renewed for [`STEP_DOWN_AFTER`].
    async fn renew(&mut self) {
        let Some(held) = self.held.as_ref() else {
            return;
        };
        let deadline = held.renewed_at + STEP_DOWN_AFTER;
        let next = held.next_try.min(deadline);
        tokio::select! {
            () = self.stop.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
        }
        let Some(held) = self.held.as_ref() else {
            return;
        };
        let me = self.me().clone();
        let record = Record {
            node: me.name,
            node_id: me.id,
            term: Some(held.term.0),
        };
        let (term, revision) = (held.term, held.revision);
        let sent = Instant::now();
        let renewed = tokio::select! {
            () = self.stop.cancelled() => return,
            () = tokio::time::sleep_until(deadline) => Err(ClusterError::Unreachable("no answer before the step-down deadline".into())),
            r = self.write(&record, revision) => r,
        };
        match renewed {
            Ok(revision) => {
                if let Some(held) = self.held.as_mut() {
                    held.revision = revision;
                    held.renewed_at = sent;
                    held.next_try = sent + RENEW_EVERY;
                }
            }
            Err(ClusterError::Changed { .. }) => {
                tracing::warn!(%term, "the lease was taken or expired: stepping down");
                self.held = None;
                self.set(Leadership::Follower { leader: None });
            }
            Err(e) => {
                if Instant::now() >= deadline {
                    tracing::warn!(%term, "cannot renew the lease ({e}): stepping down");
                    self.held = None;
                    self.set(Leadership::Unknown);
                } else if let Some(held) = self.held.as_mut() {
                    tracing::debug!(%term, "a renewal failed, trying again: {e}");
                    // Not at once: without NATS a publish fails at once too.
                    held.next_try = Instant::now() + RETRY_EVERY;
                }
            }
        }
    }

    /// Compare-and-set of the lease on `revision`.
    async fn write(&self, record: &Record, revision: u64) -> Result<u64, ClusterError> {
        cas(&self.cluster.lease_kv, KEY, to_bytes(record)?, revision).await
    }
}

//! The bot-wide lease (docs/CLUSTER.md, *The lease*): the key `leader` of
//! the lease bucket, created if absent, renewed by compare-and-set on its
//! revision, expired by the bucket's max age. The revision of the create
//! that won is the **term**: the bot-wide epoch and the fencing token of
//! everything the leader writes.
//!
//! The lease belongs to the node (name and node id), not the process: a
//! new local leader on the same machine adopts it by a compare-and-set
//! renewal and keeps the term.
//!
//! A machine's relay is *present* while its connection to NATS is open:
//! it answers on its presence subject, and the server answers "no
//! responders" for it once that connection closed, as it does at once
//! when the process dies. A holder's machine found absent for
//! [`GONE_FOR`], its lease unchanged, loses the lease to the first
//! machine that deletes it at that revision; a holder that is only cut
//! off stays present (its connection is not closed yet) and its lease is
//! waited out (docs/CLUSTER.md, *A holder that dies*).

use std::time::Duration;

use async_nats::jetstream::kv;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::buckets::{cas, create, delete_at, read, to_bytes};
use super::{Cluster, ClusterError, Link, Node, NodeName, timed};

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

/// How often a follower asks whether the holder's machine is present.
pub const PROBE_EVERY: Duration = Duration::from_millis(200);
/// How long the holder's machine must stay absent, its lease unchanged,
/// before another machine takes the lease: long enough for a holder whose
/// connection closed under it to have stopped polling (it stops on the
/// client's own disconnect event), and for a new local leader on its
/// machine to adopt the lease first.
pub const GONE_FOR: Duration = Duration::from_millis(400);
/// How long a presence probe waits: no answer at all is no evidence.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

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

    /// Whether the machine `node_id` has a relay connected to NATS now:
    /// the server's own "no responders" when none is subscribed to its
    /// presence subject. A probe unanswered (a machine cut off, a server
    /// slow to answer) says nothing.
    pub async fn presence(&self, node_id: &str) -> Presence {
        let request = async_nats::Request::new().timeout(Some(PROBE_TIMEOUT));
        let asked = self
            .client
            .send_request(self.names.presence_subject(node_id), request)
            .await;
        match asked {
            Ok(_) => Presence::Present,
            Err(e) if e.kind() == async_nats::RequestErrorKind::NoResponders => Presence::Absent,
            Err(_) => Presence::Unknown,
        }
    }

    /// Answers on this machine's presence subject until `stop`. The
    /// subscription is sent before this returns, so anything this
    /// connection sends later (a create of the lease) reaches the server
    /// after it; the client sends it again after each reconnection, before
    /// anything else.
    async fn be_present(&self, stop: CancellationToken) -> Result<(), ClusterError> {
        let subject = self.names.presence_subject(&self.node.id);
        let mut asked = self
            .client
            .subscribe(subject)
            .await
            .map_err(ClusterError::unreachable)?;
        let client = self.client.clone();
        crate::tasks::spawn(async move {
            loop {
                let probe = tokio::select! {
                    () = stop.cancelled() => break,
                    probe = asked.next() => probe,
                };
                let Some(probe) = probe else { break };
                if let Some(reply) = probe.reply {
                    let _ = client.publish(reply, bytes::Bytes::new()).await;
                }
            }
        });
        Ok(())
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
            absent: None,
        };
        let task = crate::tasks::spawn(campaign.run());
        LeaseKeeper {
            leadership,
            stop,
            task: Some(task),
        }
    }
}

/// Whether a machine has a relay connected to NATS, as the server knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Connected: its relay answered.
    Present,
    /// No connection of that machine is subscribed: the server said
    /// "no responders".
    Absent,
    /// No answer in time: a machine cut off looks like this.
    Unknown,
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
    /// The connection closed since the last renewal: not leading until a
    /// renewal succeeds over the new one.
    suspended: bool,
}

struct Campaign {
    cluster: Cluster,
    state: watch::Sender<Leadership>,
    stop: CancellationToken,
    held: Option<Held>,
    /// Another machine's lease, at this revision, whose machine was first
    /// found absent then.
    absent: Option<(u64, Instant)>,
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
        if let Err(e) = self.cluster.be_present(self.stop.clone()).await {
            tracing::warn!("cannot answer for this machine's presence: {e}");
        }
        let mut link = self.cluster.link();
        let mut watch = None;
        while !self.stop.is_cancelled() {
            if self.held.is_some() {
                self.renew(&mut link).await;
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
            // A holder found absent is asked again once it could be gone
            // for good; a present one every probe period.
            let retry = match self.absent {
                Some((_, since)) => tokio::time::sleep_until(since + GONE_FOR),
                None => tokio::time::sleep(PROBE_EVERY.min(RETRY_EVERY)),
            };
            tokio::select! {
                () = self.stop.cancelled() => break,
                () = retry => {}
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
            Some(holder) => {
                if !self.gone(&holder).await {
                    self.set(Leadership::Follower {
                        leader: Some((holder.node, holder.term)),
                    });
                    return Ok(());
                }
                match delete_at(&self.cluster.lease_kv, KEY, holder.revision).await {
                    Ok(()) => {
                        tracing::warn!(
                            holder = %holder.node,
                            term = %holder.term,
                            "the holder's relay is gone from NATS: taking the lease"
                        );
                        self.take(&me, sent).await?;
                    }
                    // Renewed, adopted or taken meanwhile: not gone.
                    Err(ClusterError::Changed { .. }) => self.set(Leadership::Follower {
                        leader: Some((holder.node, holder.term)),
                    }),
                    Err(e) => return Err(e),
                }
            }
            None => self.take(&me, sent).await?,
        }
        Ok(())
    }

    /// Whether `holder`'s machine has been absent from NATS for
    /// [`GONE_FOR`] with its lease at the same revision.
    async fn gone(&mut self, holder: &Holder) -> bool {
        if self.cluster.presence(&holder.node_id).await != Presence::Absent {
            self.absent = None;
            return false;
        }
        match self.absent {
            Some((revision, since)) if revision == holder.revision => since.elapsed() >= GONE_FOR,
            _ => {
                self.absent = Some((holder.revision, Instant::now()));
                false
            }
        }
    }

    /// Creates the lease if nobody holds it.
    async fn take(&mut self, me: &Node, sent: Instant) -> Result<(), ClusterError> {
        self.absent = None;
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
        Ok(())
    }

    fn hold(&mut self, term: Term, revision: u64, sent: Instant) {
        self.held = Some(Held {
            kv: self.cluster.lease_kv.clone(),
            term,
            revision,
            renewed_at: sent,
            next_try: sent + RENEW_EVERY,
            suspended: false,
        });
        self.set(Leadership::Leading { term });
    }

    /// Waits for the next renewal and sends it; steps down when the lease
    /// was taken or could not be renewed for [`STEP_DOWN_AFTER`]. While the
    /// connection is closed it does not lead (another machine may find it
    /// absent and take the lease), and leads again only once a renewal
    /// over the new connection found the lease still its own.
    async fn renew(&mut self, link: &mut watch::Receiver<Link>) {
        let Some(held) = self.held.as_ref() else {
            return;
        };
        let deadline = held.renewed_at + STEP_DOWN_AFTER;
        let next = held.next_try.min(deadline);
        tokio::select! {
            () = self.stop.cancelled() => return,
            () = tokio::time::sleep_until(next) => {}
            changed = link.changed() => {
                if changed.is_ok() {
                    self.follow_link(*link.borrow_and_update());
                }
                return;
            }
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
                let up = *link.borrow() == Link::Up;
                let mut resumed = false;
                if let Some(held) = self.held.as_mut() {
                    held.revision = revision;
                    held.renewed_at = sent;
                    held.next_try = sent + RENEW_EVERY;
                    resumed = held.suspended && up;
                    held.suspended &= !up;
                }
                if resumed {
                    tracing::info!(%term, "the lease is still this node's: leading again");
                    self.set(Leadership::Leading { term });
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

    /// The connection closed: stop leading at once, since the server no
    /// longer sees this machine present. Back: renew at once.
    fn follow_link(&mut self, now: Link) {
        let Some(held) = self.held.as_mut() else {
            return;
        };
        match now {
            Link::Down if !held.suspended => {
                held.suspended = true;
                let term = held.term;
                tracing::warn!(%term, "the NATS connection closed: not polling until a renewal over a new one");
                self.set(Leadership::Unknown);
            }
            Link::Up if held.suspended => held.next_try = Instant::now(),
            _ => {}
        }
    }

    /// Compare-and-set of the lease on `revision`.
    async fn write(&self, record: &Record, revision: u64) -> Result<u64, ClusterError> {
        cas(&self.cluster.lease_kv, KEY, to_bytes(record)?, revision).await
    }
}

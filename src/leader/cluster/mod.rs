//! The leader as one machine of a relay that spans machines
//! (docs/CLUSTER.md, *Where it plugs in*). Without `[cluster]` nothing here
//! runs and the leader is the single-machine leader of docs/DESIGN.md.
//!
//! This folder is the leader's lowest layer but one: it names none of the
//! leader's flows. What it needs of its leader comes in a [`Ground`] (the
//! store, who may write, the poll's client and health), and what the other
//! machines ask of this one is answered through [`Machine`], which the
//! leader implements with its flows.
//!
//! * [`run`] — connects (and keeps trying), then for the leader's whole
//!   life: campaigns for the lease and, while it holds it, polls Telegram
//!   ([`poll`]) and serves the other machines' Bot API calls ([`calls`]);
//!   reads this machine's consumer into the local journal ([`consume`]);
//!   answers the other machines' questions ([`questions`]).
//! * [`node`] — this machine as the leader sees it: the connection once
//!   made, who holds the bot-wide lease, the link for the status line.
//! * [`claims`] — the bot-wide claims of slots and topics that
//!   registration makes.
//!
//! NATS itself stays behind `crate::cluster`.

pub(super) mod calls;
pub(super) mod claims;
mod consume;
mod node;
mod poll;
pub(super) mod questions;

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::access::Access;
use super::batch::Batch;
use super::failure::{Failure, Performed};
use super::poller::{Journal, PollFacts, PollHealth, Poller};
use crate::backoff::Backoff;
use crate::cluster::lease::{Leadership, Term};
use crate::cluster::{Cluster, Link};
use crate::protocol::bus::{BusError, BusStatus, ClusterLinkState, Restarting};
use crate::protocol::launch::{RemoteDone, RemoteOp};
use crate::store::{Store, StoreError};
use crate::telegram::{BotApi, BotCall, Priority};
use claims::adopt;
use consume::consume;
use poll::ClusterPoll;
use questions::{answer_launch, answer_restart, answer_status};

pub(super) use node::ClusterNode;

/// What the cluster side works with, from its leader.
pub(super) struct Ground {
    pub node: Arc<ClusterNode>,
    pub store: Arc<Mutex<Store>>,
    pub access: Arc<Access>,
    /// The configured chat for topics, if any.
    pub chat_id: Option<i64>,
    /// The poll's client.
    pub api: BotApi,
    pub health: watch::Sender<PollHealth>,
    pub poll: Arc<Mutex<PollFacts>>,
    /// The leader's: cancelled when it steps down.
    pub stop: CancellationToken,
}

impl Ground {
    /// A poller into `journal`, until `stop`.
    fn poller<J: Journal>(&self, journal: J, stop: CancellationToken) -> Poller<J> {
        Poller {
            api: self.api.clone(),
            journal,
            health: self.health.clone(),
            facts: self.poll.clone(),
            stop,
        }
    }
}

/// What the other machines ask of this one, answered by its leader.
pub(super) trait Machine: Send + Sync + 'static {
    /// Makes a Bot API call another machine sent to this one, which holds
    /// the bot-wide lease.
    fn call(
        &self,
        call: BotCall,
        priority: Priority,
        deadline: Duration,
    ) -> impl Future<Output = Result<Performed, Failure>> + Send;
    /// This machine's sessions, for another machine's `/relay status`.
    fn status(&self) -> Result<BusStatus, BusError>;
    /// Another machine's `/relay restart`: step down for `plan`.
    fn restart(&self, plan: Restarting);
    /// An order for this machine's `serve` (`/new box:…`).
    fn launch(&self, op: RemoteOp) -> impl Future<Output = RemoteDone> + Send;
}

/// The leader's cluster side, for the leader's whole life: returns when
/// the leader stops, or with the error of a journal that failed (then the
/// leader must not go on, as when its own poller fails).
pub(super) async fn run<M: Machine>(
    machine: Arc<M>,
    ground: Arc<Ground>,
    batches: mpsc::Sender<Batch>,
) -> Result<(), StoreError> {
    let Some(cluster) = connect(&ground).await else {
        return Ok(());
    };
    let keeper = cluster.campaign();
    let stop = ground.stop.clone();
    let mut helpers = tokio::task::JoinSet::new();
    helpers.spawn(crate::tasks::boxed(follow_link(
        ground.clone(),
        cluster.clone(),
    )));
    helpers.spawn(crate::tasks::boxed(mirror_leadership(
        ground.clone(),
        keeper.leadership(),
    )));
    helpers.spawn(crate::tasks::boxed(answer_status(
        machine.clone(),
        cluster.clone(),
        stop.clone(),
    )));
    helpers.spawn(crate::tasks::boxed(answer_restart(
        machine.clone(),
        cluster.clone(),
        stop.clone(),
    )));
    helpers.spawn(crate::tasks::boxed(answer_launch(
        machine.clone(),
        cluster.clone(),
        stop.clone(),
    )));
    let mut consuming =
        crate::tasks::spawn(consume(ground.clone(), cluster.clone(), batches.clone()));
    let result = tokio::select! {
        led = lead(&machine, &ground, &cluster, keeper.leadership(), &batches) => led,
        consumed = &mut consuming => consumed.unwrap_or(Ok(())),
    };
    stop.cancel();
    if !consuming.is_finished() {
        let _ = consuming.await;
    }
    helpers.shutdown().await;
    // The poller has ended: a successor may poll at once, not after the
    // lease time. (A machine that dies lets it expire instead.)
    keeper.release().await;
    result
}

/// Connects, and keeps trying until it works or the leader stops; the link
/// says why meanwhile.
async fn connect(ground: &Ground) -> Option<Cluster> {
    let (node, stop) = (&ground.node, &ground.stop);
    let node_id = match &node.node_id {
        Ok(id) => id.clone(),
        Err(why) => {
            tracing::error!("cannot join the cluster: {why}");
            node.set_link(ClusterLinkState::Down, Some(why.clone()));
            stop.cancelled().await;
            return None;
        }
    };
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
    loop {
        let attempt = tokio::select! {
            () = stop.cancelled() => return None,
            r = Cluster::connect(&node.config, node.bot, &node_id) => r,
        };
        match attempt {
            Ok(cluster) => {
                tracing::info!(node = %node.name(), "joined the cluster");
                node.cluster.send_replace(Some(cluster.clone()));
                node.set_link(ClusterLinkState::Up, None);
                adopt(ground, &cluster).await;
                return Some(cluster);
            }
            Err(e) => {
                let why = e.to_string();
                if node.link().borrow().reason.as_ref() != Some(&why) {
                    tracing::warn!("cannot join the cluster: {why}");
                }
                node.set_link(ClusterLinkState::Down, Some(why));
                tokio::select! {
                    () = stop.cancelled() => return None,
                    () = tokio::time::sleep(backoff.step()) => {}
                }
            }
        }
    }
}

/// Mirrors the connection's state into the link; when it comes back, the
/// claims of this machine's sessions are asserted again (they may have
/// been made while it was away, or lost with a NATS server's disk).
async fn follow_link(ground: Arc<Ground>, cluster: Cluster) {
    let node = &ground.node;
    let mut link = cluster.link();
    let mut was = Link::Up;
    loop {
        let now = *link.borrow_and_update();
        match now {
            Link::Up => node.set_link(ClusterLinkState::Up, None),
            Link::Down => node.set_link(
                ClusterLinkState::Down,
                Some("the connection to NATS is lost; reconnecting".into()),
            ),
        }
        if now == Link::Up && was == Link::Down {
            tracing::info!("the cluster connection is back");
            adopt(&ground, &cluster).await;
        }
        was = now;
        tokio::select! {
            () = ground.stop.cancelled() => return,
            changed = link.changed() => if changed.is_err() { return },
        }
    }
}

async fn mirror_leadership(ground: Arc<Ground>, mut leadership: watch::Receiver<Leadership>) {
    loop {
        ground
            .node
            .set_leadership(leadership.borrow_and_update().clone());
        tokio::select! {
            () = ground.stop.cancelled() => return,
            changed = leadership.changed() => if changed.is_err() { return },
        }
    }
}

/// While this machine holds the lease: polls Telegram under its term and
/// serves the other machines' calls; between terms, waits.
async fn lead<M: Machine>(
    machine: &Arc<M>,
    ground: &Ground,
    cluster: &Cluster,
    mut leadership: watch::Receiver<Leadership>,
    batches: &mpsc::Sender<Batch>,
) -> Result<(), StoreError> {
    loop {
        let now = leadership.borrow_and_update().clone();
        if let Leadership::Leading { term } = now {
            poll_under(machine, ground, cluster, term, &mut leadership, batches).await?;
        }
        if ground.stop.is_cancelled() {
            return Ok(());
        }
        tokio::select! {
            () = ground.stop.cancelled() => return Ok(()),
            changed = leadership.changed() => if changed.is_err() { return Ok(()) },
        }
    }
}

fn leading(leadership: &watch::Receiver<Leadership>, term: Term) -> bool {
    *leadership.borrow() == Leadership::Leading { term }
}

/// The offset the term polls from: the bot-wide one (the first leader
/// ever starts from its own). `None`: the term or the leader ended first.
async fn cluster_offset(
    ground: &Ground,
    cluster: &Cluster,
    term: Term,
    leadership: &mut watch::Receiver<Leadership>,
) -> Result<Option<Option<i64>>, StoreError> {
    let mut retry = Backoff::new(Duration::from_millis(250), Duration::from_secs(2));
    loop {
        match cluster.claims().offset().await {
            Ok(Some(offset)) => return Ok(Some(Some(offset))),
            Ok(None) => {
                let store = ground.store.lock().unwrap_or_else(PoisonError::into_inner);
                return store.offset().map(Some);
            }
            Err(e) => {
                tracing::warn!(%term, "cannot read the cluster's offset: {e}");
                tokio::select! {
                    () = ground.stop.cancelled() => return Ok(None),
                    _ = leadership.changed() => if !leading(leadership, term) { return Ok(None) },
                    () = tokio::time::sleep(retry.step()) => {}
                }
            }
        }
    }
}

/// One term of polling: from the cluster's offset, until the lease is
/// lost, the poller is fenced off, or the leader stops.
async fn poll_under<M: Machine>(
    machine: &Arc<M>,
    ground: &Ground,
    cluster: &Cluster,
    term: Term,
    leadership: &mut watch::Receiver<Leadership>,
    batches: &mpsc::Sender<Batch>,
) -> Result<(), StoreError> {
    let stop = ground.stop.child_token();
    let Some(offset) = cluster_offset(ground, cluster, term, leadership).await? else {
        return Ok(());
    };
    let serving = crate::tasks::spawn(calls::serve(
        machine.clone(),
        cluster.clone(),
        term,
        stop.clone(),
    ));
    tracing::info!(%term, ?offset, "polling Telegram for the whole bot");
    let journal = ClusterPoll {
        cluster: cluster.clone(),
        term,
        offset,
        retry: Backoff::new(Duration::from_millis(250), Duration::from_secs(2)),
        stop: stop.clone(),
        batches: batches.clone(),
    };
    let mut polling = crate::tasks::spawn(ground.poller(journal, stop.clone()).run());
    let ended = loop {
        tokio::select! {
            ended = &mut polling => break ended,
            changed = leadership.changed() => {
                if changed.is_err() || !leading(leadership, term) {
                    tracing::info!(%term, "the lease is gone: stopping the poll");
                    stop.cancel();
                }
            }
        }
    };
    stop.cancel();
    let _ = serving.await;
    ground
        .health
        .send_if_modified(|h| std::mem::replace(h, PollHealth::Starting) != PollHealth::Starting);
    match ended {
        Ok(result) => result?,
        Err(e) => tracing::error!("the poller ended abnormally: {e}"),
    }
    // Fenced off before the lease watch said so: wait until it does.
    while leading(leadership, term) && !ground.stop.is_cancelled() {
        tokio::select! {
            () = ground.stop.cancelled() => {}
            changed = leadership.changed() => if changed.is_err() { break },
        }
    }
    Ok(())
}

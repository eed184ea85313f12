//! The leader as one machine of a relay that spans machines
//! (docs/CLUSTER.md, *Where it plugs in*). Without `[cluster]` nothing here
//! runs and the leader is the single-machine leader of docs/DESIGN.md.
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
mod claims;
mod consume;
mod node;
mod poll;
mod questions;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::Leader;
use super::batch::Batch;
use super::poller::PollHealth;
use crate::backoff::Backoff;
use crate::cluster::lease::{Leadership, Term};
use crate::cluster::{Cluster, Link};
use crate::protocol::bus::ClusterLinkState;
use crate::store::StoreError;
use claims::adopt;
use consume::consume;
use poll::ClusterPoll;
use questions::{answer_launch, answer_restart, answer_status};

pub(super) use claims::SlotClaim;
pub(super) use node::ClusterNode;

/// The leader's cluster side, for the leader's whole life: returns when
/// the leader stops, or with the error of a journal that failed (then the
/// leader must not go on, as when its own poller fails).
pub(super) async fn run(
    leader: Arc<Leader>,
    node: Arc<ClusterNode>,
    batches: mpsc::Sender<Batch>,
) -> Result<(), StoreError> {
    let Some(cluster) = connect(&leader, &node).await else {
        return Ok(());
    };
    let keeper = cluster.campaign();
    let mut helpers = tokio::task::JoinSet::new();
    helpers.spawn(crate::tasks::boxed(follow_link(
        leader.clone(),
        node.clone(),
        cluster.clone(),
    )));
    helpers.spawn(crate::tasks::boxed(mirror_leadership(
        leader.clone(),
        node.clone(),
        keeper.leadership(),
    )));
    helpers.spawn(crate::tasks::boxed(answer_status(
        leader.clone(),
        cluster.clone(),
    )));
    helpers.spawn(crate::tasks::boxed(answer_restart(
        leader.clone(),
        cluster.clone(),
    )));
    helpers.spawn(crate::tasks::boxed(answer_launch(
        leader.clone(),
        cluster.clone(),
    )));
    let mut consuming =
        crate::tasks::spawn(consume(leader.clone(), cluster.clone(), batches.clone()));
    let result = tokio::select! {
        led = lead(&leader, &cluster, keeper.leadership(), &batches) => led,
        consumed = &mut consuming => consumed.unwrap_or(Ok(())),
    };
    leader.stop.cancel();
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
async fn connect(leader: &Arc<Leader>, node: &ClusterNode) -> Option<Cluster> {
    let node_id = match &node.node_id {
        Ok(id) => id.clone(),
        Err(why) => {
            tracing::error!("cannot join the cluster: {why}");
            node.set_link(ClusterLinkState::Down, Some(why.clone()));
            leader.stop.cancelled().await;
            return None;
        }
    };
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
    loop {
        let attempt = tokio::select! {
            () = leader.stop.cancelled() => return None,
            r = Cluster::connect(&node.config, node.bot, &node_id) => r,
        };
        match attempt {
            Ok(cluster) => {
                tracing::info!(node = %node.name(), "joined the cluster");
                node.cluster.send_replace(Some(cluster.clone()));
                node.set_link(ClusterLinkState::Up, None);
                adopt(leader, &cluster).await;
                return Some(cluster);
            }
            Err(e) => {
                let why = e.to_string();
                if node.link().borrow().reason.as_ref() != Some(&why) {
                    tracing::warn!("cannot join the cluster: {why}");
                }
                node.set_link(ClusterLinkState::Down, Some(why));
                tokio::select! {
                    () = leader.stop.cancelled() => return None,
                    () = tokio::time::sleep(backoff.step()) => {}
                }
            }
        }
    }
}

/// Mirrors the connection's state into the link; when it comes back, the
/// claims of this machine's sessions are asserted again (they may have
/// been made while it was away, or lost with a NATS server's disk).
async fn follow_link(leader: Arc<Leader>, node: Arc<ClusterNode>, cluster: Cluster) {
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
            adopt(&leader, &cluster).await;
        }
        was = now;
        tokio::select! {
            () = leader.stop.cancelled() => return,
            changed = link.changed() => if changed.is_err() { return },
        }
    }
}

async fn mirror_leadership(
    leader: Arc<Leader>,
    node: Arc<ClusterNode>,
    mut leadership: watch::Receiver<Leadership>,
) {
    loop {
        node.set_leadership(leadership.borrow_and_update().clone());
        tokio::select! {
            () = leader.stop.cancelled() => return,
            changed = leadership.changed() => if changed.is_err() { return },
        }
    }
}

/// While this machine holds the lease: polls Telegram under its term and
/// serves the other machines' calls; between terms, waits.
async fn lead(
    leader: &Arc<Leader>,
    cluster: &Cluster,
    mut leadership: watch::Receiver<Leadership>,
    batches: &mpsc::Sender<Batch>,
) -> Result<(), StoreError> {
    loop {
        let now = leadership.borrow_and_update().clone();
        if let Leadership::Leading { term } = now {
            poll_under(leader, cluster, term, &mut leadership, batches).await?;
        }
        if leader.stop.is_cancelled() {
            return Ok(());
        }
        tokio::select! {
            () = leader.stop.cancelled() => return Ok(()),
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
    leader: &Arc<Leader>,
    cluster: &Cluster,
    term: Term,
    leadership: &mut watch::Receiver<Leadership>,
) -> Result<Option<Option<i64>>, StoreError> {
    let mut retry = Backoff::new(Duration::from_millis(250), Duration::from_secs(2));
    loop {
        match cluster.claims().offset().await {
            Ok(Some(offset)) => return Ok(Some(Some(offset))),
            Ok(None) => return leader.store().offset().map(Some),
            Err(e) => {
                tracing::warn!(%term, "cannot read the cluster's offset: {e}");
                tokio::select! {
                    () = leader.stop.cancelled() => return Ok(None),
                    _ = leadership.changed() => if !leading(leadership, term) { return Ok(None) },
                    () = tokio::time::sleep(retry.step()) => {}
                }
            }
        }
    }
}

/// One term of polling: from the cluster's offset, until the lease is
/// lost, the poller is fenced off, or the leader stops.
async fn poll_under(
    leader: &Arc<Leader>,
    cluster: &Cluster,
    term: Term,
    leadership: &mut watch::Receiver<Leadership>,
    batches: &mpsc::Sender<Batch>,
) -> Result<(), StoreError> {
    let stop = leader.stop.child_token();
    let Some(offset) = cluster_offset(leader, cluster, term, leadership).await? else {
        return Ok(());
    };
    let serving = crate::tasks::spawn(calls::serve(
        leader.clone(),
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
    let mut polling = crate::tasks::spawn(leader.poller(journal, stop.clone()).run());
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
    leader
        .health
        .send_if_modified(|h| std::mem::replace(h, PollHealth::Starting) != PollHealth::Starting);
    match ended {
        Ok(result) => result?,
        Err(e) => tracing::error!("the poller ended abnormally: {e}"),
    }
    // Fenced off before the lease watch said so: wait until it does.
    while leading(leadership, term) && !leader.stop.is_cancelled() {
        tokio::select! {
            () = leader.stop.cancelled() => {}
            changed = leadership.changed() => if changed.is_err() { break },
        }
    }
    Ok(())
}

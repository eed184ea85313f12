//! The leader as one machine of a relay that spans machines
//! (docs/CLUSTER.md, *Where it plugs in*). Without `[cluster]` nothing here
//! runs and the leader is the single-machine leader of docs/DESIGN.md.
//!
//! * [`ClusterNode`] — this machine as the leader sees it: the connection
//!   once made, who holds the bot-wide lease, the link for the status line.
//! * [`run`] — connects (and keeps trying), then for the leader's whole
//!   life: campaigns for the lease and, while it holds it, polls Telegram
//!   and serves the other machines' Bot API calls; reads this machine's
//!   consumer into the local journal; answers the other machines'
//!   questions (`/relay status`, `/relay restart`).
//! * [`ClusterPoll`] — the poller's journal step under a lease term:
//!   publish to the stream, then advance the fenced offset.
//! * the bot-wide claims of slots and topics that `sessions.rs` makes.
//!
//! NATS itself stays behind `crate::cluster`.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::poller::{Batch, PollHealth, route_then_flush};
use super::triage::{Journaling, Triaged};
use super::{Leader, Restarting, remote};
use crate::backoff::Backoff;
use crate::cluster::claims::{ClaimKey, SessionClaim};
use crate::cluster::inbound::RoutedUpdate;
use crate::cluster::lease::{Leadership, Term};
use crate::cluster::nodes::Question;
use crate::cluster::{BotId, Cluster, ClusterConfig, ClusterError, Link, NodeName};
use crate::protocol::bus::*;
use crate::store::StoreError;
use crate::telegram::{Update, UpdateKind};

/// How long one fetch from this machine's consumer waits for updates.
/// Short: a pull request waiting at a NATS server that is lost (or whose
/// consumer moves to another server of a NATS cluster) is never answered,
/// and costs at most this much delay. One pull request per interval while
/// idle is ~100 bytes.
const FETCH_WAIT: Duration = Duration::from_secs(5);
/// Most updates one fetch takes.
const FETCH_MAX: usize = 100;
/// How long a registration waits for the first connection to the cluster
/// before it goes on without (a leader that just started connects in
/// milliseconds; an unreachable cluster should not hold a session up).
const FIRST_CONNECT: Duration = Duration::from_secs(3);

/// This machine in the cluster, as its leader sees it.
pub(super) struct ClusterNode {
    config: ClusterConfig,
    bot: BotId,
    /// This machine's id (docs/CLUSTER.md, *The lease*), or why it has none.
    node_id: Result<String, String>,
    cluster: watch::Sender<Option<Cluster>>,
    leadership: watch::Sender<Leadership>,
    link: watch::Sender<ClusterLink>,
}

impl ClusterNode {
    /// This machine's side of the cluster; its id is kept in a private
    /// file beside the store (`<bot>.node-id`), made the first time.
    pub fn new(config: ClusterConfig, bot: BotId, store_path: &Path) -> Self {
        let node_id = node_id(&store_path.with_extension("node-id"));
        let link = ClusterLink {
            node: config.node.to_string(),
            state: ClusterLinkState::Connecting,
            reason: None,
            polled_by: None,
        };
        Self {
            config,
            bot,
            node_id,
            cluster: watch::channel(None).0,
            leadership: watch::channel(Leadership::Unknown).0,
            link: watch::channel(link).0,
        }
    }

    pub fn name(&self) -> &NodeName {
        &self.config.node
    }

    /// The connection, once made.
    pub fn cluster(&self) -> Option<Cluster> {
        self.cluster.borrow().clone()
    }

    /// The connection, waiting a little for the first one.
    pub async fn connected(&self) -> Option<Cluster> {
        let mut cluster = self.cluster.subscribe();
        let found = tokio::time::timeout(FIRST_CONNECT, cluster.wait_for(Option::is_some)).await;
        found.ok().and_then(Result::ok).and_then(|c| c.clone())
    }

    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.subscribe()
    }

    /// The link as the status line shows it, and every change.
    pub fn link(&self) -> watch::Receiver<ClusterLink> {
        self.link.subscribe()
    }

    pub fn is_up(&self) -> bool {
        self.link.borrow().state == ClusterLinkState::Up
    }

    fn set_link(&self, state: ClusterLinkState, reason: Option<String>) {
        self.link.send_if_modified(|l| {
            let changed = l.state != state || l.reason != reason;
            l.state = state;
            l.reason = reason;
            changed
        });
    }

    fn set_leadership(&self, now: Leadership) {
        let polled_by = match &now {
            Leadership::Leading { .. } => Some(self.name().to_string()),
            Leadership::Follower { leader } => leader.as_ref().map(|(n, _)| n.to_string()),
            Leadership::Unknown => None,
        };
        self.leadership.send_replace(now);
        self.link.send_if_modified(|l| {
            let changed = l.polled_by != polled_by;
            l.polled_by = polled_by;
            changed
        });
    }
}

/// Reads this machine's id, or makes one: a random id in a file of the
/// user's own that nobody else can write (`paths`' checks).
fn node_id(path: &Path) -> Result<String, String> {
    use std::io::{Read, Write};
    let shown = path.display();
    match crate::paths::open_private_file(path) {
        Ok(Some(mut file)) => {
            let mut text = String::new();
            file.read_to_string(&mut text)
                .map_err(|e| format!("cannot read {shown}: {e}"))?;
            let id = text.trim();
            let shaped = !id.is_empty()
                && id.len() <= 64
                && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
            if shaped {
                Ok(id.to_string())
            } else {
                Err(format!(
                    "{shown} does not hold a node id; remove it and this machine joins as a new one (run `agent-relay cluster forget <name>` for its old name first)"
                ))
            }
        }
        Ok(None) => {
            let id = uuid::Uuid::new_v4().to_string();
            let mut file = crate::paths::create_private_file(path).map_err(|e| e.to_string())?;
            file.write_all(format!("{id}\n").as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("cannot write {shown}: {e}"))?;
            Ok(id)
        }
        Err(e) => Err(e.to_string()),
    }
}

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
    helpers.spawn(follow_link(leader.clone(), node.clone(), cluster.clone()));
    helpers.spawn(mirror_leadership(
        leader.clone(),
        node.clone(),
        keeper.leadership(),
    ));
    helpers.spawn(answer_status(leader.clone(), cluster.clone()));
    helpers.spawn(answer_restart(leader.clone(), cluster.clone()));
    let mut consuming = tokio::spawn(consume(leader.clone(), cluster.clone(), batches.clone()));
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
                if node.link.borrow().reason.as_ref() != Some(&why) {
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
    // The offset is bot-wide; the first leader ever starts from its own.
    let offset = loop {
        match cluster.claims().offset().await {
            Ok(Some(offset)) => break Some(offset),
            Ok(None) => break leader.store().offset()?,
            Err(e) => {
                tracing::warn!(%term, "cannot read the cluster's offset: {e}");
                tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    _ = leadership.changed() => if !leading(leadership, term) { return Ok(()) },
                    () = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    };
    let serving = tokio::spawn(remote::serve(
        leader.clone(),
        cluster.clone(),
        term,
        stop.clone(),
    ));
    tracing::info!(%term, ?offset, "polling Telegram for the whole bot");
    let step = ClusterPoll {
        cluster: cluster.clone(),
        term,
        offset,
        retry: Backoff::new(Duration::from_millis(250), Duration::from_secs(2)),
        stop: stop.clone(),
    };
    let mut polling = tokio::spawn(
        leader
            .poller(batches.clone(), stop.clone(), Some(step))
            .run(),
    );
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

/// The poller's journal step while this machine holds the lease
/// (docs/CLUSTER.md, *Inbound*): each update for a session goes into the
/// stream on the subject of the machine whose session owns its topic,
/// then the bot-wide offset moves past the batch by a write fenced by the
/// term. Only then may the next `getUpdates` confirm the batch.
pub(super) struct ClusterPoll {
    cluster: Cluster,
    term: Term,
    offset: Option<i64>,
    retry: Backoff,
    stop: CancellationToken,
}

/// What the poller does after a batch.
pub(super) enum Step {
    /// Published and confirmed: the updates for no session are the
    /// leader's to answer.
    Done(Vec<Update>),
    /// Not confirmed (NATS failed): the next poll fetches the batch again,
    /// and the stream drops what it already has.
    Again,
    /// A newer term wrote the offset, or the lease is another's: stop.
    Fenced,
}

impl ClusterPoll {
    /// The offset of the next `getUpdates`.
    pub fn offset(&self) -> Option<i64> {
        self.offset
    }

    pub async fn journal(&mut self, raw: &[Value]) -> Step {
        let Some(last) = raw.iter().filter_map(super::poller::update_id_of).max() else {
            return Step::Done(Vec::new());
        };
        let mut owners: HashMap<(i64, i64), Option<NodeName>> = HashMap::new();
        let mut outgoing = Vec::new();
        let mut others = Vec::new();
        for value in raw {
            let update = match Update::decode(value) {
                Ok(update) => update,
                Err(e) => {
                    tracing::warn!("skipping an update: {e}");
                    continue;
                }
            };
            let node = match topic_of(&update) {
                Some(topic) => match owners.get(&topic) {
                    Some(node) => node.clone(),
                    None => match self.owner(topic).await {
                        Ok(node) => owners.entry(topic).or_insert(node).clone(),
                        Err(e) => return self.again("cannot read a topic's claim", e).await,
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
            return self.again("cannot publish updates", e).await;
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
                return Step::Fenced;
            }
            Err(e) => return self.again("cannot advance the offset", e).await,
        }
        self.offset = Some(last + 1);
        self.retry.reset();
        Step::Done(others)
    }

    /// The machine whose session owns a topic, if any.
    async fn owner(&self, (chat, thread): (i64, i64)) -> Result<Option<NodeName>, ClusterError> {
        let claim = self
            .cluster
            .claims()
            .get::<SessionClaim>(&ClaimKey::Topic { chat, thread })
            .await?;
        Ok(claim.map(|c| c.value.node))
    }

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
        UpdateKind::Unknown { .. } => return None,
    };
    Some((message.chat.id, message.topic()?))
}

/// This machine's second source of updates: its durable consumer. Each
/// batch is triaged against this machine's own sessions and users,
/// journaled, handed to the router like a poller's batch, and only
/// acknowledged to JetStream once the journal is on disk.
async fn consume(
    leader: Arc<Leader>,
    cluster: Cluster,
    batches: mpsc::Sender<Batch>,
) -> Result<(), StoreError> {
    let name = cluster.node().name.clone();
    let inbound = cluster.inbound();
    let mut triage = Journaling::new(leader.store.clone(), leader.access.clone());
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
    let mut consumer = None;
    // The first consumer of this process is made afresh: a predecessor
    // that died (a local failover) may hold deliveries it never acknowledged.
    let mut fresh = true;
    let mut link = cluster.link();
    while !leader.stop.is_cancelled() {
        if *link.borrow_and_update() == Link::Down {
            tokio::select! {
                () = leader.stop.cancelled() => break,
                _ = link.changed() => continue,
            }
        }
        let reader = match &consumer {
            Some(reader) => reader,
            None => {
                let made = tokio::select! {
                    () = leader.stop.cancelled() => break,
                    made = async {
                        if fresh {
                            inbound.fresh_consumer(&name).await
                        } else {
                            inbound.consumer(&name).await
                        }
                    } => made,
                };
                match made {
                    Ok(made) => {
                        fresh = false;
                        consumer.insert(made)
                    }
                    Err(e) => {
                        tracing::debug!("cannot open this machine's consumer: {e}");
                        tokio::select! {
                            () = leader.stop.cancelled() => break,
                            () = tokio::time::sleep(backoff.step()) => {}
                        }
                        continue;
                    }
                }
            }
        };
        let fetched = tokio::select! {
            () = leader.stop.cancelled() => break,
            fetched = reader.fetch(FETCH_MAX, FETCH_WAIT) => fetched,
            // A pull request does not survive a lost connection (nor a
            // restarted server): ask again once the link is back.
            _ = link.changed() => continue,
        };
        let deliveries = match fetched {
            Ok(deliveries) => deliveries,
            Err(e) => {
                tracing::debug!("fetching this machine's updates failed: {e}");
                consumer = None;
                tokio::select! {
                    () = leader.stop.cancelled() => break,
                    () = tokio::time::sleep(backoff.step()) => {}
                }
                continue;
            }
        };
        backoff.reset();
        if deliveries.is_empty() {
            continue;
        }
        triage.prepare();
        let mut journal = Vec::new();
        let mut notices = Vec::new();
        let mut others = Vec::new();
        for delivery in &deliveries {
            let decoded = serde_json::from_slice::<Value>(&delivery.payload)
                .map_err(|e| e.to_string())
                .and_then(|v| Update::decode(&v).map_err(|e| e.to_string()));
            match decoded {
                Ok(update) => match triage.journal(&update) {
                    Triaged::Journal(entry) => journal.push(entry),
                    // A tap, a message nobody here journals, a file too big
                    // to fetch are answered once: a redelivery is a repeat.
                    Triaged::Notice(notice) if delivery.delivered <= 1 => notices.push(notice),
                    Triaged::Leader if delivery.delivered <= 1 => others.push(update),
                    Triaged::Notice(_) | Triaged::Leader => {}
                },
                Err(e) => tracing::warn!(
                    update = delivery.update_id,
                    "an unreadable update from the cluster: {e}"
                ),
            }
        }
        let written = leader.store().journal_received_unflushed(&journal)?;
        // A runtime shutting down: nothing is acknowledged, so JetStream
        // hands the batch out again.
        if !route_then_flush(&batches, journal, written, notices, others).await? {
            break;
        }
        // On disk: JetStream may forget them (docs/CLUSTER.md, *Inbound*).
        let acks = deliveries.iter().map(|d| d.ack());
        for (delivery, acked) in deliveries.iter().zip(futures::future::join_all(acks).await) {
            if let Err(e) = acked {
                tracing::debug!(
                    update = delivery.update_id,
                    "not acknowledged; it comes again and the journal drops it: {e}"
                );
            }
        }
    }
    Ok(())
}

/// Makes `key` this session's: created, already its own, or taken over
/// from another session of this machine (a local reclaim, decided under
/// the registry lock). [`ClusterError::Taken`] names the other machine.
async fn claim(cluster: &Cluster, key: &ClaimKey, profile_key: &str) -> Result<(), ClusterError> {
    let claims = cluster.claims();
    let mine = SessionClaim {
        node: cluster.node().name.clone(),
        profile_key: profile_key.to_string(),
    };
    for _ in 0..4 {
        match claims.create(key, &mine).await {
            Ok(_) => return Ok(()),
            Err(ClusterError::Taken { .. }) => {}
            Err(e) => return Err(e),
        }
        match claims.get::<SessionClaim>(key).await? {
            // Released since: create again.
            None => {}
            Some(held) if held.value == mine => return Ok(()),
            Some(held) if held.value.node == mine.node => {
                match claims.update(key, &mine, held.revision).await {
                    Ok(_) => return Ok(()),
                    Err(ClusterError::Changed { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Some(held) => {
                return Err(ClusterError::Taken {
                    key: format!("{} (by machine {})", key.key(), held.value.node),
                });
            }
        }
    }
    Err(ClusterError::Changed { key: key.key() })
}

/// Gives up `key` if this session of this machine holds it.
async fn release(cluster: &Cluster, key: &ClaimKey, profile_key: &str) -> Result<(), ClusterError> {
    let claims = cluster.claims();
    match claims.get::<SessionClaim>(key).await? {
        Some(held)
            if held.value.node == cluster.node().name && held.value.profile_key == profile_key =>
        {
            claims.release(key, held.revision).await
        }
        _ => Ok(()),
    }
}

/// Claims what this machine's stored bindings hold: after joining, and
/// whenever the connection comes back. A slot or topic another machine
/// took meanwhile stays theirs; the session gets another at its next
/// registration.
async fn adopt(leader: &Leader, cluster: &Cluster) {
    let bindings = match leader.store().bindings() {
        Ok(bindings) => bindings,
        Err(e) => {
            tracing::warn!("cannot read the bindings to claim them: {e}");
            return;
        }
    };
    for b in bindings {
        if b.status == crate::store::BindingStatus::Offline {
            continue;
        }
        let Some(chat) = b.chat_id.or(leader.chat_id) else {
            continue;
        };
        let mut keys = vec![ClaimKey::Slot { chat, slot: b.slot }];
        keys.extend(b.target().map(|t| ClaimKey::Topic {
            chat: t.chat_id,
            thread: t.thread_id,
        }));
        for key in keys {
            if let Err(e) = claim(cluster, &key, &b.profile_key).await {
                tracing::warn!(profile = %b.profile_key, "cannot claim {}: {e}", key.key());
            }
        }
    }
}

/// How a bot-wide slot claim came out.
pub(super) enum SlotClaim {
    /// The slot is this session's across the cluster (or there is no cluster).
    Held,
    /// Another machine holds it: pick again.
    Taken,
    /// NATS cannot be reached: nothing new may be claimed now.
    Unreachable(String),
}

impl Leader {
    /// The chat that holds the topics, as far as it is known without
    /// asking Telegram: slots are claimed per chat.
    fn claims_chat(&self) -> Option<i64> {
        self.chat_id.or_else(|| self.access.owner())
    }

    /// The topic name, with this machine's name when the relay spans machines.
    pub(super) fn topic_name(&self, slot: Slot, session_name: &str) -> String {
        let node = self.cluster.as_ref().map(|c| c.name().to_string());
        crate::topics::topic_name(slot, node.as_deref(), session_name)
    }

    /// The slots other machines hold in the topics' chat: a registration
    /// here never picks them.
    pub(super) async fn foreign_slots(&self) -> Vec<Slot> {
        let (Some(node), Some(chat)) = (&self.cluster, self.claims_chat()) else {
            return Vec::new();
        };
        let Some(cluster) = node.connected().await else {
            return Vec::new();
        };
        match cluster.claims().slots(chat).await {
            Ok(slots) => slots
                .into_iter()
                .filter(|(_, c)| c.value.node != *node.name())
                .map(|(slot, _)| slot)
                .collect(),
            Err(e) => {
                tracing::debug!("cannot read the cluster's slots: {e}");
                Vec::new()
            }
        }
    }

    /// Makes the slot a registration picked the session's across the cluster.
    pub(super) async fn claim_slot(&self, slot: Slot, profile_key: &str) -> SlotClaim {
        let (Some(node), Some(chat)) = (&self.cluster, self.claims_chat()) else {
            return SlotClaim::Held;
        };
        let Some(cluster) = node.connected().await else {
            return SlotClaim::Unreachable(cluster_down(node));
        };
        match claim(&cluster, &ClaimKey::Slot { chat, slot }, profile_key).await {
            Ok(()) => SlotClaim::Held,
            Err(ClusterError::Taken { key }) => {
                tracing::info!("slot {slot} is taken elsewhere ({key}); picking another");
                SlotClaim::Taken
            }
            Err(e) => SlotClaim::Unreachable(format!("the cluster is unreachable: {e}")),
        }
    }

    /// Whether a stored topic may still be this session's: not claimed by
    /// another machine (unknown when NATS is away: then it stays ours).
    pub(super) async fn topic_is_ours(&self, target: Target) -> bool {
        let Some(cluster) = self.cluster.as_ref().and_then(|n| n.cluster()) else {
            return true;
        };
        let key = ClaimKey::Topic {
            chat: target.chat_id,
            thread: target.thread_id,
        };
        match cluster.claims().get::<SessionClaim>(&key).await {
            Ok(Some(held)) if held.value.node != cluster.node().name => {
                tracing::warn!(
                    thread = target.thread_id,
                    "the stored topic is machine {}'s now; making another",
                    held.value.node
                );
                false
            }
            _ => true,
        }
    }

    /// Claims a session's topic across the cluster, so that its updates
    /// come to this machine. A failure is logged: the claim is made again
    /// when the connection is back.
    pub(super) async fn claim_topic(&self, target: Target, profile_key: &str) {
        let Some(cluster) = self.cluster.as_ref().and_then(|n| n.cluster()) else {
            return;
        };
        let key = ClaimKey::Topic {
            chat: target.chat_id,
            thread: target.thread_id,
        };
        if let Err(e) = claim(&cluster, &key, profile_key).await {
            tracing::warn!("cannot claim topic {}: {e}", target.thread_id);
        }
    }

    /// Gives up a session's slot and topic across the cluster (a
    /// disconnect, a slot reclaimed here), off the caller's path.
    pub(super) fn release_claims(
        &self,
        profile_key: &str,
        slot: Option<Slot>,
        target: Option<Target>,
    ) {
        let Some(cluster) = self.cluster.as_ref().and_then(|n| n.cluster()) else {
            return;
        };
        let mut keys: Vec<ClaimKey> = Vec::new();
        if let (Some(slot), Some(chat)) = (slot, target.map(|t| t.chat_id).or(self.claims_chat())) {
            keys.push(ClaimKey::Slot { chat, slot });
        }
        keys.extend(target.map(|t| ClaimKey::Topic {
            chat: t.chat_id,
            thread: t.thread_id,
        }));
        let profile_key = profile_key.to_string();
        tokio::spawn(async move {
            for key in keys {
                if let Err(e) = release(&cluster, &key, &profile_key).await {
                    tracing::warn!("cannot release {}: {e}", key.key());
                }
            }
        });
    }

    /// The local status with every other machine's sessions (asked, up to
    /// 2 s), for `/relay status` and a restart's convergence.
    pub(super) async fn cluster_status(&self) -> Result<BusStatus, BusError> {
        let mut status = self.status()?;
        let Some(node) = &self.cluster else {
            return Ok(status);
        };
        let link = node.link.borrow().clone();
        let me = node.name().clone();
        let mut machines = vec![MachineStatus {
            node: me.to_string(),
            answered: true,
            epoch: Some(status.epoch),
            sessions: status.sessions.clone(),
        }];
        if let Some(cluster) = node.cluster().filter(|_| node.is_up()) {
            let known: Vec<NodeName> = match cluster.claims().nodes().await {
                Ok(nodes) => nodes.into_iter().filter(|n| *n != me).collect(),
                Err(e) => {
                    tracing::debug!("cannot list the machines: {e}");
                    Vec::new()
                }
            };
            let answers: Vec<(NodeName, BusStatus)> = cluster
                .ask_nodes(Question::Status, &(), &known)
                .await
                .unwrap_or_else(|e| {
                    tracing::debug!("cannot ask the machines: {e}");
                    Vec::new()
                });
            for (name, theirs) in answers.into_iter().filter(|(n, _)| *n != me) {
                machines.push(MachineStatus {
                    node: name.to_string(),
                    answered: true,
                    epoch: Some(theirs.epoch),
                    sessions: theirs.sessions,
                });
            }
            for name in known {
                if !machines.iter().any(|m| m.node == name.as_str()) {
                    machines.push(MachineStatus {
                        node: name.to_string(),
                        answered: false,
                        epoch: None,
                        sessions: Vec::new(),
                    });
                }
            }
        }
        // This machine first, then the others by name.
        machines[1..].sort_by(|a, b| a.node.cmp(&b.node));
        status.cluster = Some(ClusterStatus {
            node: me.to_string(),
            link: link.state,
            polled_by: link.polled_by.clone(),
            term: node.leadership.borrow().term().map(|t| t.0),
            machines,
        });
        Ok(status)
    }

    /// `/relay restart` across machines (docs/CLUSTER.md): the plan names
    /// every machine's live sessions at its current epoch; every machine's
    /// leader steps down as a single machine's does, and the caller
    /// watches them all come back.
    pub(super) async fn restart_cluster(self: &Arc<Self>) -> Result<Restarting, BusError> {
        if let Some(plan) = self.restarting.get() {
            return Ok(plan.clone());
        }
        let node = self
            .cluster
            .as_ref()
            .ok_or_else(|| BusError::new(BusErrorCode::Internal, "no cluster is configured"))?;
        let cluster = node.cluster().filter(|_| node.is_up()).ok_or_else(|| {
            BusError::new(
                BusErrorCode::Unavailable,
                format!(
                    "{}; /relay restart restarts every machine and needs the cluster",
                    cluster_down(node)
                ),
            )
        })?;
        let status = self.cluster_status().await?;
        let machines: Vec<MachinePlan> = status
            .cluster
            .iter()
            .flat_map(|c| &c.machines)
            .filter(|m| m.answered)
            .map(|m| {
                let mut expected: Vec<String> = m
                    .sessions
                    .iter()
                    .filter(|s| s.live)
                    .map(|s| s.profile_key.clone())
                    .collect();
                expected.sort();
                MachinePlan {
                    node: m.node.clone(),
                    epoch: m.epoch.unwrap_or_default(),
                    expected,
                }
            })
            .collect();
        let mine = machines.iter().find(|m| m.node == node.name().as_str());
        let expected = mine.map(|m| m.expected.clone()).unwrap_or_default();
        let routes: usize = machines.iter().map(|m| m.expected.len()).sum();
        let plan = Restarting {
            epoch: self.epoch,
            expected_instances: routes as u32,
            expected_routes: routes as u32,
            expected,
            machines,
        };
        let plan = self.restarting.get_or_init(|| plan).clone();
        let others: Vec<NodeName> = plan
            .machines
            .iter()
            .filter(|m| m.node != node.name().as_str())
            .filter_map(|m| NodeName::parse(&m.node).ok())
            .collect();
        let told: Vec<(NodeName, bool)> = cluster
            .ask_nodes(Question::Restart, &plan, &others)
            .await
            .unwrap_or_default();
        tracing::info!(
            machines = plan.machines.len(),
            told = told.len(),
            routes = plan.expected_routes,
            "restarting the relay on every machine"
        );
        self.step_down_for(&plan);
        Ok(plan)
    }

    /// Tells this machine's sessions about a restart, and steps down.
    pub(super) fn step_down_for(&self, plan: &Restarting) {
        self.registry
            .broadcast(&FromLeader::Restarting(plan.clone()));
        self.stop.cancel();
    }

    /// The session list a message outside every topic gets, with every
    /// machine's sessions.
    pub(super) async fn overview_everywhere(&self) -> String {
        let status = match self.cluster_status().await {
            Ok(status) => status,
            Err(e) => return format!("The relay cannot list its sessions: {}", e.message),
        };
        let machines = status.cluster.map(|c| c.machines).unwrap_or_default();
        if machines.iter().all(|m| m.sessions.is_empty()) {
            return "No agent sessions are connected. Run /telegram-connect in one.".into();
        }
        let mut out = String::from("Write in a session's topic to talk to it:\n");
        for m in &machines {
            if !m.answered {
                out.push_str(&format!("• machine {} is not answering\n", m.node));
            }
            for s in &m.sessions {
                let state = if s.live { "live" } else { "offline" };
                out.push_str(&format!("• {} — {state} — {}\n", s.topic_name, s.cwd));
            }
        }
        out.trim_end().to_string()
    }
}

/// Why nothing new can be claimed now, as a session is told.
fn cluster_down(node: &ClusterNode) -> String {
    let link = node.link.borrow();
    match &link.reason {
        Some(reason) => format!("the cluster is unreachable ({reason})"),
        None => "the cluster is not connected yet".into(),
    }
}

/// Answers the other machines' `/relay status` with this machine's sessions.
async fn answer_status(leader: Arc<Leader>, cluster: Cluster) {
    let Ok(mut questions) = cluster.answer_nodes(Question::Status).await else {
        tracing::warn!("cannot answer the other machines' status questions");
        return;
    };
    loop {
        let asked = tokio::select! {
            () = leader.stop.cancelled() => return,
            asked = questions.next::<Value>() => asked,
        };
        let Some(asked) = asked else { return };
        match leader.status() {
            Ok(status) => {
                if let Err(e) = asked.answer(&status).await {
                    tracing::debug!("cannot answer a status question: {e}");
                }
            }
            Err(e) => tracing::warn!("cannot read this machine's status: {e}"),
        }
    }
}

/// Restarts this machine's relay when another machine asks (its
/// `/relay restart`).
async fn answer_restart(leader: Arc<Leader>, cluster: Cluster) {
    let Ok(mut questions) = cluster.answer_nodes(Question::Restart).await else {
        tracing::warn!("cannot answer the other machines' restarts");
        return;
    };
    loop {
        let asked = tokio::select! {
            () = leader.stop.cancelled() => return,
            asked = questions.next::<Restarting>() => asked,
        };
        let Some(asked) = asked else { return };
        if asked.from == cluster.node().name {
            // Our own question: the asker steps down by itself.
            continue;
        }
        tracing::info!(by = %asked.from, "restarting the relay, asked by another machine");
        let plan = leader
            .restarting
            .get_or_init(|| asked.request.clone())
            .clone();
        let _ = asked.answer(&true).await;
        leader.step_down_for(&plan);
        return;
    }
}

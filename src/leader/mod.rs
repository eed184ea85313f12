//! The leader: the one sidecar per bot that holds the bus lock. It owns the
//! socket, the registry of live sessions, the Telegram poller and outbox,
//! and every write to the store.
//!
//! [`Leader`] is made of owners, each with one job:
//!
//! * [`registry::Registry`] — connections, registrations, the generation
//!   check, who owns which profile. Bookkeeping only.
//! * [`router::Router`] — delivery: journaled updates to their sessions (one
//!   path for a new batch and for a backlog), acknowledgements, and the
//!   leader's own answers off the routing path ([`replies`]).
//! * [`outbox::Outbox`] — every Bot API call, typed and paced, each failure
//!   decided once ([`failure`]). Never touches the store.
//! * [`access::Access`] — who may drive sessions, and pairing.
//! * [`asks::Asks`] — the questions open on the phone.
//! * [`inbox::FileInbox`] — the sessions' inboxes, where files users send
//!   are saved.
//! * the store, behind a mutex, written by the leader alone.
//!
//! The flows that combine them have a file each, named for the flow:
//! registration in three steps ([`register`]), leaving for good
//! ([`disconnect`]), a session's request in its topic ([`topic`]), the
//! questions and their taps ([`asks`]), files both ways ([`files`]), the
//! status ([`status`]) and `/relay restart` ([`restart`]); inbound, the
//! poll ([`poller`]), the [`triage`] and the [`batch`] on its way to the
//! router; one connection's reader and writer in [`conn`]. The lock order
//! is written where the locks are ([`registry::Registry`]).
//!
//! When the relay spans machines (`[cluster]`, docs/CLUSTER.md), the
//! leader is also one machine of the cluster ([`cluster`]): it polls only
//! while it holds the bot-wide lease, reads its own updates from the
//! cluster's stream, and makes its Bot API calls through the machine that
//! polls (chosen in [`outbox::Outbox::call`]).

mod access;
mod asks;
mod batch;
mod budget;
mod cluster;
mod command;
mod conn;
mod control;
mod courier;
mod disconnect;
mod failure;
mod files;
mod inbox;
mod launches;
mod outbox;
mod poller;
mod register;
mod registry;
mod replies;
mod restart;
mod router;
mod schedules;
mod status;
mod topic;
mod triage;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use interprocess::local_socket::tokio::Listener;
use interprocess::local_socket::traits::tokio::Listener as _;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::bus::election::{LeaderInfo, LeaderLock};
use crate::config::{Config, FilesPolicy};
use crate::paths::Paths;
use crate::protocol::bus::*;
use crate::store::{Store, StoreError};
use crate::telegram::SetupError;
use access::Access;
use batch::Batch;
use cluster::ClusterNode;
use inbox::FileInbox;
use outbox::Outbox;
use poller::{Journal, LocalJournal, PollFacts, PollHealth, Poller};
use registry::Registry;
use router::Router;

/// Why a sidecar that won the lock could not lead.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LeaderError {
    #[error("the relay database cannot be used: {0}")]
    Store(#[from] StoreError),
    #[error("cannot bind the bus socket: {0}")]
    Bind(std::io::Error),
    #[error("cannot set up the Telegram client: {0}")]
    Telegram(#[from] SetupError),
}

/// The leader's owners and the little it knows besides.
pub(super) struct Leader {
    epoch: Epoch,
    instance_id: String,
    since_ms: u64,
    /// The configured chat for topics, if any.
    chat_id: Option<i64>,
    store: Arc<Mutex<Store>>,
    registry: Registry,
    router: Router,
    /// Every Bot API call: made here, or through the machine that polls
    /// when the relay spans machines.
    outbox: Outbox,
    access: Arc<Access>,
    asks: asks::Asks,
    /// Sends what sessions handed over, from the store.
    courier: courier::Courier,
    /// What the message budget was, for the next leader.
    budget: budget::Kept,
    /// Where the files users send are saved, one folder per session.
    inbox: FileInbox,
    /// `[files]`: the folders files may be sent from besides a session's own.
    files: FilesPolicy,
    health: watch::Sender<PollHealth>,
    poll: Arc<Mutex<PollFacts>>,
    /// The restart this leader is stepping down for, once one was asked:
    /// a second request joins it.
    restarting: OnceLock<Restarting>,
    /// Held while the cleanup intents a predecessor left are worked off:
    /// nothing is provisioned before.
    cleanup: Arc<tokio::sync::Mutex<()>>,
    /// This machine in the cluster; `None` for a single machine.
    cluster: Option<Arc<ClusterNode>>,
    /// Sessions `agent-relay serve` launches: orders on their way, and who
    /// waits for a launch's session.
    launches: launches::Launches,
    /// The control place's state: what its buttons offer.
    control: control::Control,
    /// `[launch]`: where agents may be started, and how.
    launch_policy: crate::config::LaunchPolicy,
    /// A drain (`drain.rs`): it leads only to send what waits.
    draining: bool,
    stop: CancellationToken,
}

impl Leader {
    fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The ack of request `R`, typed as the member reads it.
    fn ack<R: Request>(&self, id: Option<u64>, result: Result<R::Reply, BusError>) -> FromLeader {
        FromLeader::Ack(Ack::answer::<R>(id, self.epoch, result))
    }

    fn prune(self: &Arc<Self>) {
        match self.store().prune() {
            Ok(pruned) => tracing::debug!(?pruned, "pruned the store"),
            Err(e) => tracing::warn!("cannot prune the store: {e}"),
        }
        if let Err(e) = self.store().prune_launches() {
            tracing::warn!("cannot prune the launches: {e}");
        }
        // The inboxes of sessions whose binding is gone go too.
        match self.store().bindings() {
            Ok(bindings) => {
                let live = bindings.into_iter().map(|b| b.profile_key).collect();
                let leader = self.clone();
                crate::tasks::spawn(async move { leader.inbox.prune(live).await });
            }
            Err(e) => tracing::warn!("cannot read the bindings to prune the inboxes: {e}"),
        }
    }

    /// A poller of this leader into `journal`: its own (a single machine),
    /// or the cluster's stream (one per lease term).
    fn poller<J: Journal>(&self, journal: J, stop: CancellationToken) -> Poller<J> {
        Poller {
            api: self.outbox.api().clone(),
            journal,
            health: self.health.clone(),
            facts: self.poll.clone(),
            stop,
        }
    }

    /// This machine's own journal, for a single machine's poller.
    fn local_journal(&self, batches: mpsc::Sender<Batch>) -> LocalJournal {
        LocalJournal {
            store: self.store.clone(),
            triage: triage::Triage::new(self.store.clone(), self.access.clone()),
            batches,
        }
    }

    /// This machine's cluster link as the bus wire states it, when it has one.
    fn wire_cluster(&self) -> Option<FromLeader> {
        let node = self.cluster.as_ref()?;
        Some(FromLeader::Cluster(node.link().borrow().clone()))
    }
}

fn store_error(e: StoreError) -> BusError {
    BusError::new(BusErrorCode::Internal, format!("relay database: {e}"))
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A running leader. Call [`LeaderHandle::stop`] to step down.
pub(crate) struct LeaderHandle {
    leader: Arc<Leader>,
    task: tokio::task::JoinHandle<()>,
    lock: LeaderLock,
}

mod drain;
pub(crate) use drain::drain;

/// Starts leading: opens the store, bumps the epoch, binds the socket,
/// writes `leader.json` and starts polling Telegram. The lock is held until
/// [`LeaderHandle::stop`].
pub(crate) async fn start(
    lock: LeaderLock,
    paths: &Paths,
    instance_id: String,
    config: &Config,
) -> Result<LeaderHandle, LeaderError> {
    start_with(lock, paths, instance_id, config, false).await
}

/// [`start`], for a drain too (`draining`: it never starts another).
///
/// Long because a leader starts in one order that must not change: the
/// cluster, the outbox and the budget, the store, the socket, leader.json.
async fn start_with(
    lock: LeaderLock,
    paths: &Paths,
    instance_id: String,
    config: &Config,
    draining: bool,
) -> Result<LeaderHandle, LeaderError> {
    let bot = config.bot_id().ok_or(SetupError::Http {
        message: "no bot token".into(),
    })?;
    let store_path: PathBuf = paths.store_file(bot);
    let cluster = config
        .cluster
        .as_ref()
        .map(|cluster| Arc::new(ClusterNode::new(cluster.clone(), bot, &store_path)));
    let outbox = Outbox::new(config, cluster.clone())?;
    let (budget, spent) = budget::Kept::read(paths.budget_file(bot));
    outbox.go_on_from(&spent);
    let configured = config.allowed_users.clone();
    let (store, epoch, access) = tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
        let mut store = Store::open(&store_path)?;
        let epoch = store.bump_epoch()?;
        let access = Access::load(&configured, &store)?;
        Ok((store, epoch, access))
    })
    .await
    .map_err(|e| LeaderError::Bind(std::io::Error::other(e)))??;
    let listener = lock.bind().map_err(LeaderError::Bind)?;
    let since_ms = now_ms();
    if let Err(e) = lock.write_info(&LeaderInfo {
        pid: std::process::id(),
        epoch,
        instance: instance_id.clone(),
        started: since_ms,
    }) {
        tracing::warn!("cannot write leader.json: {e}");
    }
    tracing::info!(epoch, "leading the bus");
    let (settle, acks) = mpsc::unbounded_channel();
    let (health, _) = watch::channel(PollHealth::Starting);
    let leader = Arc::new(Leader {
        epoch,
        instance_id,
        since_ms,
        chat_id: config.chat_id,
        store: Arc::new(Mutex::new(store)),
        registry: Registry::default(),
        router: Router::new(settle),
        outbox,
        access: Arc::new(access),
        asks: asks::Asks::default(),
        courier: courier::Courier::default(),
        budget,
        inbox: FileInbox::new(paths.clone(), bot, config.files.inbox_max_bytes),
        files: config.files.clone(),
        health,
        poll: Arc::default(),
        restarting: OnceLock::new(),
        cleanup: Arc::default(),
        cluster,
        launches: launches::Launches::default(),
        control: control::Control::default(),
        launch_policy: config.launch.clone(),
        draining,
        stop: CancellationToken::new(),
    });
    let task = crate::tasks::spawn(run(leader.clone(), listener, acks));
    Ok(LeaderHandle { leader, task, lock })
}

impl LeaderHandle {
    /// Whether the leader is still serving.
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Steps down because this process leaves the bus for good. When no
    /// other session is on the bus to lead next and messages still wait to
    /// go, a drain takes over (`drain.rs`): a process of its own, detached,
    /// that leads until they went.
    pub async fn leave(self) {
        if self.leader.wants_drain() {
            drain::spawn(&self.leader);
        }
        self.stop().await;
    }

    /// Steps down: stops the poller, closes every connection and the socket,
    /// removes the control files and only then releases the lock, so there
    /// are never two pollers and never a socket without a lock holder.
    pub async fn stop(self) {
        self.leader.stop.cancel();
        if let Err(e) = self.task.await {
            tracing::warn!("leader task ended abnormally: {e}");
        }
        self.lock.remove_control_files();
        drop(self.lock);
    }
}

/// Most acknowledgements written in one transaction.
const SETTLE_BATCH: usize = 1024;

/// How often the store is pruned (see `Store::prune`), at the latest: it
/// is pruned sooner after every `KEEP_SETTLED` acknowledgements, so a busy
/// relay keeps at most twice that many settled entries.
const PRUNE_EVERY: Duration = Duration::from_secs(600);

/// The leader's life: it starts the cleanups and the poll, then serves the
/// socket and the acknowledgements until it steps down, and stops what it
/// started before it returns. Long because it is one `select!` over every
/// source the leader serves: one place shows what each of them does.
async fn run(
    leader: Arc<Leader>,
    listener: Listener,
    mut acks: mpsc::UnboundedReceiver<(String, i64)>,
) {
    leader.start_cleanups();
    let mut courier = crate::tasks::spawn(courier::run(leader.clone()));
    let (batches_tx, mut batches) = mpsc::channel(64);
    let mut poller = leader.start_poll(batches_tx);
    // A single machine's link never changes (its sender lives as long).
    let (_single, single) = watch::channel(ClusterLink {
        node: String::new(),
        state: ClusterLinkState::Up,
        reason: None,
        polled_by: None,
    });
    let mut link = leader.cluster.as_ref().map_or(single, |node| node.link());
    let mut health = leader.health.subscribe();
    let mut conns = JoinSet::new();
    let mut sweep = tokio::time::interval(Duration::from_millis(500));
    let mut prune = tokio::time::interval(PRUNE_EVERY);
    let mut schedules = tokio::time::interval(schedules::TICK);
    schedules.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut keep_budget = tokio::time::interval(budget::KEEP_EVERY);
    let silent_limit = Duration::from_millis(HEARTBEAT_INTERVAL_MS * u64::from(HEARTBEAT_MISSES));
    let mut settled_since_prune = 0;
    loop {
        tokio::select! {
            () = leader.stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(stream) => {
                    conns.spawn(crate::tasks::boxed(conn::serve(leader.clone(), stream)));
                }
                Err(e) => {
                    // A descriptor limit, say: the next accept may work.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(batch) = batches.recv() => leader.route(batch),
            Some(first) = acks.recv() => {
                settled_since_prune += leader.settle_queued(first, &mut acks);
                if settled_since_prune >= crate::store::KEEP_SETTLED {
                    settled_since_prune = 0;
                    leader.prune();
                }
            }
            Ok(()) = health.changed() => {
                leader.registry.broadcast(&FromLeader::Health(leader.wire_health()));
            }
            Ok(()) = link.changed() => {
                if let Some(frame) = leader.wire_cluster() {
                    leader.registry.broadcast(&frame);
                }
            }
            _ = sweep.tick() => {
                leader.registry.sweep(silent_limit);
                leader.expire_asks();
            }
            _ = prune.tick() => leader.prune(),
            _ = schedules.tick() => leader.fire_schedules(),
            _ = keep_budget.tick() => leader.keep_budget(),
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            polled = &mut poller => {
                // The poller (and a cluster's side) only returns on a store
                // failure, or when stopping: without its journal the
                // leader must not go on.
                if !leader.stop.is_cancelled() {
                    tracing::error!("the poller stopped: {polled:?}; stepping down");
                }
                break;
            }
        }
    }
    leader.stop.cancel();
    if !poller.is_finished() {
        let _ = poller.await;
    }
    let _ = (&mut courier).await;
    // Calls on their way to Telegram may land; cut off, their messages
    // would be of unknown fate for the next leader.
    leader.courier.land().await;
    leader.registry.close_all();
    while conns.join_next().await.is_some() {}
    drop(listener);
    // Acknowledgements that came in before the connections closed.
    let mut rest = Vec::new();
    while let Ok(ack) = acks.try_recv() {
        rest.push(ack);
    }
    leader.settle(&rest);
    leader.keep_budget();
}

impl Leader {
    /// Finishes the deletions a predecessor left (`disconnect.rs`). The
    /// cleanup lock is taken before the first accept, so no registration
    /// provisions anything until they are done.
    fn start_cleanups(self: &Arc<Self>) {
        match self.cleanup.clone().try_lock_owned() {
            Ok(guard) => {
                let leader = self.clone();
                crate::tasks::spawn(async move {
                    disconnect::finish_cleanups(&leader).await;
                    drop(guard);
                });
            }
            Err(_) => tracing::error!("the cleanup lock is taken before the leader started"),
        }
    }

    /// One machine polls by itself; a machine of a cluster polls only while
    /// it holds the bot-wide lease, and reads its own updates from the
    /// cluster's stream.
    fn start_poll(
        self: &Arc<Self>,
        batches: mpsc::Sender<Batch>,
    ) -> tokio::task::JoinHandle<Result<(), StoreError>> {
        match self.cluster.clone() {
            None => {
                let journal = self.local_journal(batches);
                crate::tasks::spawn(self.poller(journal, self.stop.clone()).run())
            }
            Some(node) => crate::tasks::spawn(cluster::run(self.clone(), node, batches)),
        }
    }

    /// Settles `first` with whatever acknowledgements queued up meanwhile,
    /// in one transaction; answers how many.
    fn settle_queued(
        &self,
        first: (String, i64),
        acks: &mut mpsc::UnboundedReceiver<(String, i64)>,
    ) -> usize {
        let mut batch = vec![first];
        while batch.len() < SETTLE_BATCH
            && let Ok(ack) = acks.try_recv()
        {
            batch.push(ack);
        }
        self.settle(&batch);
        batch.len()
    }
}

//! The leader: the one sidecar per bot that holds the bus lock. It owns the
//! socket, the registry of live sessions, the Telegram poller and outbox,
//! and every write to the store.
//!
//! [`Leader`] is a hub: it starts, runs one loop over everything it
//! serves, and hands each request, update and tick to the flow that owns
//! it. What the flows share is one [`context::Context`]: the store, who is
//! on the bus ([`registry`]), every Bot API call ([`outbox`], each failure
//! decided in [`failure`]), the one way to speak ([`speaker`]), the work
//! done off the routing path ([`errands`]), who may write ([`access`]).
//! Each flow is a type that owns its state and takes the context; a flow
//! that needs another holds it, so the order below is the order they may
//! call each other in (`tests/tidy.rs` keeps their files free of circles;
//! ARCHITECTURE.md has the map):
//!
//! * [`asks::Asks`] — questions on the phone and the taps that answer them;
//! * [`courier::Courier`] — what sessions hand over, sent from the store
//!   (asks: a message that did not arrive is offered with a button);
//! * [`launches::Launches`] — sessions `serve` launches, and its orders;
//! * [`router::Router`] — journaled messages to their sessions (asks:
//!   a reply may answer a question; launches: a message starts its
//!   session again);
//! * [`schedules::Schedules`] — scheduled prompts (router, launches);
//! * [`restart::Restart`] — `/relay restart` (launches, for the status);
//! * [`control::ControlPlace`] — the commands and buttons the leader
//!   answers itself (launches, schedules);
//! * [`register::Registrations`] — sessions joining, and leaving for good
//!   ([`disconnect`]) (router, launches);
//! * [`files::Files`] — files both ways, into the sessions' [`inbox`]es;
//! * [`topic::Topics`] — a session's request in its topic (asks, files);
//! * [`pairing`] — pairing links and `/start <code>`.
//!
//! Inbound, the [`poller`] reads Telegram, the [`triage`] decides what
//! enters the journal, and a [`batch`] comes to the loop here; one
//! connection's reader and writer are [`conn`]. [`status`] is what the bus
//! looks like; [`budget`] keeps the message budget for the next leader,
//! and [`drain`] sends what a last process left behind.
//!
//! When the relay spans machines (`[cluster]`, docs/CLUSTER.md), the
//! leader is also one machine of the cluster ([`cluster`], which names no
//! flow: what other machines ask is answered here, as [`cluster::Machine`]).

mod access;
mod asks;
mod batch;
mod budget;
mod cluster;
mod conn;
mod context;
mod control;
mod courier;
mod disconnect;
mod errands;
mod failure;
mod files;
mod inbox;
mod launches;
mod outbox;
mod pairing;
mod poller;
mod receipts;
mod register;
mod registry;
mod restart;
mod router;
mod schedules;
mod speaker;
mod status;
mod topic;
mod triage;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use interprocess::local_socket::tokio::Listener;
use interprocess::local_socket::traits::tokio::Listener as _;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::bus::election::{LeaderInfo, LeaderLock};
use crate::config::{Config, Role};
use crate::ids::Place;
use crate::paths::Paths;
use crate::phone::PhoneCommand;
use crate::protocol::bus::*;
use crate::protocol::launch::{RemoteDone, RemoteOp};
use crate::store::{Store, StoreError};
use crate::telegram::{BotCall, ChatKind, Message, Priority, SetupError, Update, UpdateKind};
use access::Access;
use asks::Asks;
use batch::Batch;
use cluster::{ClusterNode, Ground, Machine};
use context::Context;
use control::ControlPlace;
use courier::Courier;
use errands::Refusal;
use failure::{Failure, Performed};
use files::Files;
use inbox::FileInbox;
use launches::Launches;
use outbox::Outbox;
use poller::{LocalJournal, Poller};
use receipts::Receipts;
use register::Registrations;
use restart::Restart;
use router::Router;
use schedules::Schedules;
use status::Status;
use topic::Topics;

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

/// The hub: the context and the flows (see the module docs).
pub(super) struct Leader {
    cx: Arc<Context>,
    asks: Arc<Asks>,
    courier: Arc<Courier>,
    launches: Arc<Launches>,
    receipts: Arc<Receipts>,
    router: Arc<Router>,
    schedules: Arc<Schedules>,
    restart: Arc<Restart>,
    control: Arc<ControlPlace>,
    registrations: Arc<Registrations>,
    files: Arc<Files>,
    topics: Arc<Topics>,
    /// What the message budget was, for the next leader.
    budget: budget::Kept,
    /// A drain (`drain.rs`): it leads only to send what waits.
    draining: bool,
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

/// Gets what a leader needs ready ahead of time, on a thread of its own,
/// so that a member elected later leads sooner: its HTTP client's TLS
/// settings (the system's roots, read once per process).
pub(crate) fn prepare() {
    crate::telegram::client::prepare_tls();
}

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
/// The store is opened beside the outbox's construction (a failover
/// waits for the longer of the two, not both), so an outbox that cannot
/// be built (a bad API URL) still costs an epoch; nothing uses either
/// before both are there.
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
    // The store opens (checked, the epoch written: milliseconds of disk)
    // on a blocking thread while the outbox builds its HTTP client (the
    // TLS roots: milliseconds of CPU).
    let (configured, roles) = (config.allowed_users.clone(), config.roles.clone());
    let approve_by = config.approvals.by;
    let opened = store_path.clone();
    let opening = tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
        let mut store = Store::open(&opened)?;
        crate::logging::milestone("store-opened", 0);
        let epoch = store.bump_epoch()?;
        crate::logging::milestone("epoch", 0);
        let access = Access::load(&configured, roles, approve_by, &store)?;
        Ok((store, epoch, access))
    });
    let cluster = config
        .cluster
        .as_ref()
        .map(|cluster| Arc::new(ClusterNode::new(cluster.clone(), bot, &store_path)));
    let outbox = Outbox::new(config, cluster.clone());
    crate::logging::milestone("outbox", 0);
    let (store, epoch, access) = opening
        .await
        .map_err(|e| LeaderError::Bind(std::io::Error::other(e)))??;
    let outbox = outbox?;
    let (budget, spent) = budget::Kept::read(paths.budget_file(bot));
    outbox.go_on_from(&spent);
    crate::logging::milestone("store", 0);
    let listener = lock.bind().map_err(LeaderError::Bind)?;
    crate::logging::milestone("bind", 0);
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
    let cx = Arc::new(Context::new(context::Parts {
        epoch,
        instance_id,
        since_ms,
        chat_id: config.chat_id,
        store,
        outbox,
        access,
        cluster,
    }));
    let (settle, acks) = mpsc::unbounded_channel();
    let inbox = FileInbox::new(paths.clone(), bot, config.files.inbox_max_bytes);
    let leader = Arc::new(Leader::new(cx, config, inbox, budget, settle, draining));
    let task = crate::tasks::spawn(guarded(leader.clone(), listener, acks));
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
        self.leader.cx.stop.cancel();
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
/// A leader's first prune: soon (leaders that come and go still keep the
/// store bounded), but not while it takes over.
const PRUNE_FIRST: Duration = Duration::from_secs(2);

/// The leader's life, guarded: a panic anywhere on its loop must not leave
/// this process holding `bus.lock` while nobody leads. The leader steps
/// down at once, says so in the log, and drops every connection: the
/// member that holds the lock sees its own connection go, releases the
/// lock and the bus elects a leader again, as after a crash.
async fn guarded(
    leader: Arc<Leader>,
    listener: Listener,
    acks: mpsc::UnboundedReceiver<(String, i64)>,
) {
    let cx = leader.cx.clone();
    unless_it_panics(run(leader, listener, acks), |why| {
        tracing::error!(
            "the leader panicked ({why}); stepping down so the bus elects a leader again"
        );
        cx.stop.cancel();
        cx.registry.drop_all();
    })
    .await;
}

/// Runs `life`; if it panics, `then` gets what the panic said instead of
/// the panic going on up.
async fn unless_it_panics(life: impl Future<Output = ()>, then: impl FnOnce(String)) {
    let life = std::panic::AssertUnwindSafe(life);
    if let Err(panic) = futures::FutureExt::catch_unwind(life).await {
        then(errands::panic_text(panic.as_ref()));
    }
}

/// What the leader's loop does on a clock.
struct Ticks {
    /// Silent connections closed, expired questions settled.
    sweep: tokio::time::Interval,
    prune: tokio::time::Interval,
    schedules: tokio::time::Interval,
    keep_budget: tokio::time::Interval,
}

impl Ticks {
    /// Nothing on a clock runs while a new leader takes over: each first
    /// tick comes a period after the start (the prune's after
    /// [`PRUNE_FIRST`]), so the first connections and the first poll do
    /// not wait behind store work on the loop.
    fn new() -> Self {
        let every = |first: Duration, period: Duration| {
            let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + first, period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            ticks
        };
        let sweep = Duration::from_millis(500);
        Self {
            sweep: every(sweep, sweep),
            prune: every(PRUNE_FIRST, PRUNE_EVERY),
            schedules: every(schedules::TICK, schedules::TICK),
            keep_budget: every(budget::KEEP_EVERY, budget::KEEP_EVERY),
        }
    }
}

/// The leader's life: it starts the cleanups and the poll, then serves the
/// socket and the acknowledgements until it steps down, and stops what it
/// started before it returns. One `select!` over every source the leader
/// serves: one place shows what each of them does.
async fn run(
    leader: Arc<Leader>,
    listener: Listener,
    mut acks: mpsc::UnboundedReceiver<(String, i64)>,
) {
    let cx = leader.cx.clone();
    leader.registrations.start_cleanups();
    let mut courier = crate::tasks::spawn(courier::run(leader.courier.clone()));
    crate::tasks::spawn(leader.receipts.clone().run());
    let (batches_tx, mut batches) = mpsc::channel(64);
    let mut poller = leader.start_poll(batches_tx);
    // A single machine's link never changes (its sender lives as long).
    let (_single, single) = watch::channel(ClusterLink {
        node: String::new(),
        state: ClusterLinkState::Up,
        reason: None,
        polled_by: None,
    });
    let mut link = cx.cluster.as_ref().map_or(single, |node| node.link());
    let mut health = cx.health.subscribe();
    let mut conns = JoinSet::new();
    let mut ticks = Ticks::new();
    let silent_limit = Duration::from_millis(HEARTBEAT_INTERVAL_MS * u64::from(HEARTBEAT_MISSES));
    let mut settled_since_prune = 0;
    loop {
        tokio::select! {
            () = cx.stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(stream) => {
                    crate::logging::milestone("accept", 0);
                    conns.spawn(crate::tasks::boxed(conn::serve(leader.clone(), stream)));
                }
                Err(e) => {
                    // A descriptor limit, say: the next accept may work.
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(batch) = batches.recv() => leader.take(batch),
            Some(first) = acks.recv() => {
                settled_since_prune += leader.settle_queued(first, &mut acks);
                if settled_since_prune >= crate::store::KEEP_SETTLED {
                    settled_since_prune = 0;
                    leader.prune();
                }
            }
            Ok(()) = health.changed() => {
                cx.registry.broadcast(&FromLeader::Health(cx.wire_health()));
            }
            Ok(()) = link.changed() => {
                if let Some(frame) = leader.wire_cluster() {
                    cx.registry.broadcast(&frame);
                }
            }
            _ = ticks.sweep.tick() => {
                cx.registry.sweep(silent_limit);
                leader.asks.expire();
            }
            _ = ticks.prune.tick() => leader.prune(),
            _ = ticks.schedules.tick() => leader.schedules.fire_due(),
            _ = ticks.keep_budget.tick() => leader.budget.keep(&cx.outbox),
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            polled = &mut poller => {
                // The poller (and a cluster's side) only returns on a store
                // failure, or when stopping: without its journal the
                // leader must not go on.
                if !cx.stop.is_cancelled() {
                    tracing::error!("the poller stopped: {polled:?}; stepping down");
                }
                break;
            }
        }
    }
    cx.stop.cancel();
    if !poller.is_finished() {
        let _ = poller.await;
    }
    let _ = (&mut courier).await;
    leader.wind_down(conns, listener, acks).await;
}

impl Leader {
    /// The flows, each handed the context and the flows it calls, in the
    /// order they may call each other.
    fn new(
        cx: Arc<Context>,
        config: &Config,
        inbox: FileInbox,
        budget: budget::Kept,
        settle: mpsc::UnboundedSender<(String, i64)>,
        draining: bool,
    ) -> Self {
        let asks = Arc::new(Asks::new(cx.clone()));
        let courier = Arc::new(Courier::new(cx.clone(), asks.clone()));
        let launches = Arc::new(Launches::new(cx.clone(), config.launch.clone()));
        let receipts = Arc::new(Receipts::new(cx.clone(), config.receipts));
        let router = Arc::new(Router::new(
            cx.clone(),
            asks.clone(),
            launches.clone(),
            receipts.clone(),
            settle,
        ));
        let schedules = Arc::new(Schedules::new(cx.clone(), router.clone(), launches.clone()));
        let restart = Arc::new(Restart::new(cx.clone(), launches.clone()));
        let control = Arc::new(ControlPlace::new(
            cx.clone(),
            launches.clone(),
            schedules.clone(),
        ));
        let registrations = Arc::new(Registrations::new(
            cx.clone(),
            router.clone(),
            launches.clone(),
        ));
        let files = Arc::new(Files::new(cx.clone(), inbox, config.files.clone()));
        let topics = Arc::new(Topics::new(cx.clone(), asks.clone(), files.clone()));
        Self {
            cx,
            asks,
            courier,
            launches,
            receipts,
            router,
            schedules,
            restart,
            control,
            registrations,
            files,
            topics,
            budget,
            draining,
        }
    }

    /// After the loop, the poller and the courier: the calls on their way
    /// land, the connections close, and what was acknowledged meanwhile is
    /// settled.
    async fn wind_down(
        &self,
        mut conns: JoinSet<()>,
        listener: Listener,
        mut acks: mpsc::UnboundedReceiver<(String, i64)>,
    ) {
        // Calls on their way to Telegram may land; cut off, their messages
        // would be of unknown fate for the next leader.
        self.courier.land().await;
        self.cx.registry.close_all();
        while conns.join_next().await.is_some() {}
        drop(listener);
        // Acknowledgements that came in before the connections closed.
        let mut rest = Vec::new();
        while let Ok(ack) = acks.try_recv() {
            rest.push(ack);
        }
        self.router.settle(&rest);
        self.budget.keep(&self.cx.outbox);
    }

    /// The bus as this leader sees it (this machine).
    fn status(&self) -> Result<BusStatus, BusError> {
        self.status_view().here()
    }

    fn status_view(&self) -> Status<'_> {
        Status {
            cx: &self.cx,
            launches: &self.launches,
        }
    }

    /// The ack of request `R`, typed as the member reads it.
    fn ack<R: Request>(&self, id: Option<u64>, result: Result<R::Reply, BusError>) -> FromLeader {
        FromLeader::Ack(Ack::answer::<R>(id, self.cx.epoch, result))
    }

    /// What a batch brought: its journaled messages routed, its notices
    /// said, its commands run and the updates no session takes answered.
    /// Never awaits.
    fn take(&self, batch: Batch) {
        self.router.route(batch.journaled);
        for notice in batch.notices {
            let place = Place {
                chat_id: notice.chat_id,
                thread_id: Some(notice.thread_id),
            };
            self.cx.speaker.later(place, notice.text);
        }
        for (update, command) in batch.commands {
            if let UpdateKind::Message(message) = &update.kind {
                self.command(message, command);
            }
        }
        for update in batch.others {
            self.answer(update);
        }
    }

    /// A command the leader answers (the triage read it): pairing for
    /// anybody in the bot's private chat, the rest for allowed users in
    /// the relay's own chats.
    fn command(&self, message: &Message, command: PhoneCommand) {
        let Some(user) = message.from.as_ref() else {
            return;
        };
        let allowed = self.cx.access.is_allowed(user.id);
        let private = message.chat.kind == ChatKind::Private;
        let mut prefix = String::new();
        if let (PhoneCommand::Start(code), true) = (&command, private) {
            // A user who may already drive sessions does not spend the
            // code (someone else may be about to use it): they are told.
            if !code.is_empty() && !allowed {
                pairing::redeem(&self.cx, user.id, message.chat.id, code);
                return;
            }
            if allowed {
                prefix.push_str("You are already paired with this bot.\n");
            }
        }
        if !allowed || !self.cx.is_ours(message) {
            return;
        }
        // Who starts a session is named in `/sessions`.
        let store = self.cx.shared_store();
        self.cx.access.saw(&store, user.id, &user.first_name);
        prefix.push_str(self.no_session_here(message));
        self.control.command(message, command, prefix);
    }

    /// An update that is not for a session and no command: a message
    /// outside any session's topic, an edit, a tap. Never awaits.
    fn answer(&self, update: Update) {
        match update.kind {
            UpdateKind::Message(message) => self.answer_message(&message),
            UpdateKind::EditedMessage(message) => self.edited(&message),
            UpdateKind::CallbackQuery(query)
                if query.data.as_deref().is_some_and(|d| d.starts_with("c:")) =>
            {
                self.control.tap(&query)
            }
            // ⚡ Steer now: the session does it (the triage journaled it
            // as `/steer`); the leader ends the spinner.
            UpdateKind::CallbackQuery(query)
                if query.data.as_deref() == Some(crate::phone::STEER_BUTTON) =>
            {
                self.steer_tapped(&query)
            }
            UpdateKind::CallbackQuery(query) => self.asks.tap(&query),
            // A stop button in no session's topic, or pressed by someone
            // who may not write: there is no turn of theirs to stop.
            UpdateKind::GenerationStopped(_) | UpdateKind::Unknown { .. } => {}
        }
    }

    /// ⚡ Steer now tapped: its spinner ends. An allowed person's tap in a
    /// session's topic went to the session as `/steer`, which answers in
    /// the topic when there is something to say; a stranger's is refused
    /// (at most once a window).
    fn steer_tapped(&self, query: &crate::telegram::CallbackQuery) {
        let allowed = !query.from.is_bot && self.cx.access.is_allowed(query.from.id);
        let toast = if !allowed {
            if !self.cx.errands.admit(query.from.id, errands::Refusal::Tap) {
                return;
            }
            "You are not allowed to use these buttons.".to_string()
        } else if let Some(why) = self.cx.access.refuses(query.from.id, Role::Driver) {
            // A viewer's tap was not journaled: nothing is steered.
            why
        } else {
            "⚡ Steering the running turn".to_string()
        };
        let (speaker, id) = (self.cx.speaker.clone(), query.id.clone());
        self.cx
            .errands
            .run(async move { speaker.toast(&id, &toast).await });
    }

    /// A message no session takes and no command: the session list, in the
    /// relay's own chats, for an allowed user.
    fn answer_message(&self, message: &Message) {
        let Some(user) = message.from.as_ref().filter(|u| !u.is_bot) else {
            return;
        };
        let text = message.text.as_deref().unwrap_or_default().trim();
        // Service messages (a topic made, a member joined) have neither.
        if !self.cx.access.is_allowed(user.id) || (text.is_empty() && message.media().is_none()) {
            return;
        }
        // The session list names local paths: only where the relay lives,
        // never in some other group an allowed user happens to be in.
        if !self.cx.is_ours(message) {
            return;
        }
        let prefix = self.no_session_here(message);
        let in_a_session = message.topic().is_some() && prefix.is_empty();
        if in_a_session && self.cx.access.role(user.id) == Some(Role::Viewer) {
            // Told once a while, and never a prompt.
            if self.cx.errands.admit(user.id, Refusal::Viewer) {
                let text = "👁 You are a viewer here ([access] in config.toml): you can read this session, not write to it, so your messages here reach no agent.";
                let place = Place {
                    chat_id: message.chat.id,
                    thread_id: message.topic(),
                };
                self.cx.speaker.later(place, text.into());
            }
            return;
        }
        self.control.message(message, prefix.to_string());
    }

    /// An edited message no session takes: an edit of a command does not
    /// run it again, and the person is told so; other edits change
    /// nothing.
    fn edited(&self, message: &Message) {
        let command = message.text.as_deref().and_then(PhoneCommand::parse);
        let allowed = message
            .from
            .as_ref()
            .is_some_and(|u| !u.is_bot && self.cx.access.is_allowed(u.id));
        if command.is_some() && allowed && self.cx.is_ours(message) {
            let place = Place {
                chat_id: message.chat.id,
                thread_id: message.topic(),
            };
            let text = "✏️ An edited command is not run again; send it as a new message to run it.";
            self.cx.speaker.later(place, text.into());
        }
    }

    /// What a message in a topic no session owns is told first.
    fn no_session_here(&self, message: &Message) -> &'static str {
        let Some(thread) = message.topic() else {
            return "";
        };
        let owned = self
            .cx
            .store()
            .binding_by_thread(message.chat.id, thread)
            .ok()
            .flatten()
            .is_some();
        if owned {
            ""
        } else {
            "This topic belongs to no session, so your message reached no agent.\n"
        }
    }

    fn prune(&self) {
        match self.cx.store().prune() {
            Ok(pruned) => tracing::debug!(?pruned, "pruned the store"),
            Err(e) => tracing::warn!("cannot prune the store: {e}"),
        }
        if let Err(e) = self.cx.store().prune_launches() {
            tracing::warn!("cannot prune the launches: {e}");
        }
        // The inboxes of sessions whose binding is gone go too.
        match self.cx.store().bindings() {
            Ok(bindings) => {
                let live = bindings.into_iter().map(|b| b.profile_key).collect();
                let files = self.files.clone();
                crate::tasks::spawn(async move { files.inbox.prune(live).await });
            }
            Err(e) => tracing::warn!("cannot read the bindings to prune the inboxes: {e}"),
        }
    }

    /// This machine's cluster link as the bus wire states it, when it has one.
    fn wire_cluster(&self) -> Option<FromLeader> {
        let node = self.cx.cluster.as_ref()?;
        Some(FromLeader::Cluster(node.link().borrow().clone()))
    }

    /// Whether this leader, leaving for good, hands its work to a drain:
    /// messages wait that could go now. Other sessions on the bus may be
    /// leaving at the same moment (two `claude -p` ending together), so
    /// they are not counted on: when one of them leads next, the drain
    /// finds the lock taken and nothing left to it, and ends.
    fn wants_drain(&self) -> bool {
        !self.draining && self.courier.sendable() > 0
    }

    /// One machine polls by itself; a machine of a cluster polls only while
    /// it holds the bot-wide lease, and reads its own updates from the
    /// cluster's stream.
    fn start_poll(
        self: &Arc<Self>,
        batches: mpsc::Sender<Batch>,
    ) -> tokio::task::JoinHandle<Result<(), StoreError>> {
        let cx = &self.cx;
        match cx.cluster.clone() {
            None => {
                let journal = LocalJournal {
                    store: cx.shared_store(),
                    triage: triage::Triage::new(cx.shared_store(), cx.access.clone()),
                    batches,
                };
                let poller = Poller {
                    api: cx.outbox.api().clone(),
                    journal,
                    health: cx.health.clone(),
                    facts: cx.poll.clone(),
                    stop: cx.stop.clone(),
                };
                crate::tasks::spawn(poller.run())
            }
            Some(node) => {
                let ground = Arc::new(Ground {
                    node,
                    store: cx.shared_store(),
                    access: cx.access.clone(),
                    chat_id: cx.chat_id,
                    api: cx.outbox.api().clone(),
                    health: cx.health.clone(),
                    poll: cx.poll.clone(),
                    stop: cx.stop.clone(),
                });
                crate::tasks::spawn(cluster::run(self.clone(), ground, batches))
            }
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
        self.router.settle(&batch);
        batch.len()
    }
}

/// What the other machines of a cluster ask of this one, answered by the
/// flows.
impl Machine for Leader {
    async fn call(
        &self,
        call: BotCall,
        priority: Priority,
        deadline: Duration,
    ) -> Result<Performed, Failure> {
        self.cx
            .outbox
            .call_for_another_machine(call, priority, deadline)
            .await
    }

    fn status(&self) -> Result<BusStatus, BusError> {
        Leader::status(self)
    }

    fn restart(&self, plan: Restarting) {
        self.restart.asked_by_another_machine(plan);
    }

    async fn launch(&self, op: RemoteOp) -> RemoteDone {
        self.launches.run_here(op).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_on_the_leaders_loop_steps_it_down_instead_of_going_on_up() {
        let (said, heard) = std::sync::mpsc::channel();
        unless_it_panics(
            async {
                let every: u64 = std::hint::black_box(0);
                let _ = 60 / every;
            },
            |why| said.send(why).unwrap(),
        )
        .await;
        let why = heard.try_recv().expect("told of the panic");
        assert!(why.contains("divide by zero"), "{why}");
        unless_it_panics(async {}, |_| panic!("no panic, nothing to say")).await;
    }
}

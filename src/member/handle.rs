//! [`Member`]: a session's handle on its bot's bus. Every method is a
//! message to the member's actor ([`super::actor`]), which owns the
//! connection; the handle itself holds channels only.

use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::actor::{Actor, Channels, Membership};
use crate::config::Config;
use crate::paths::Paths;
use crate::protocol::bus::*;

/// How long a request to the leader may take before the caller gives up.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a topic request may take, pacing included: a little longer
/// than the leader's own deadline, so the leader's answer (sent, or why
/// not) is what the session hears, not a timeout.
const TOPIC_TIMEOUT: Duration = TOPIC_DEADLINE.saturating_add(MEMBER_GRACE);
/// The same for fetching a message's files…
const FETCH_TIMEOUT: Duration = FETCH_DEADLINE.saturating_add(MEMBER_GRACE);
/// …and for sending a file.
pub const UPLOAD_TIMEOUT: Duration = UPLOAD_DEADLINE.saturating_add(MEMBER_GRACE);

/// What a session needs to join its bot's bus.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub paths: Paths,
    pub config: Config,
    pub profile_key: String,
    pub session_name: String,
    pub cwd: String,
    pub pid: u32,
    /// The launch this session is, when `agent-relay serve` started it.
    pub launch: Option<String>,
}

/// What `agent-relay serve` needs to join its bot's bus as the machine's
/// launcher (docs/DESIGN.md, *Launching*): no topic, no deliveries; orders
/// from the leader instead.
#[derive(Debug, Clone)]
pub struct LauncherRequest {
    pub paths: Paths,
    pub config: Config,
    pub pid: u32,
    /// The engines it can start.
    pub engines: Vec<String>,
}

/// What a launcher membership hands its owner: the leader's orders, and
/// every welcome (one per registration: after a failover the new leader
/// says again which sessions should be running).
pub struct LauncherLink {
    pub orders: mpsc::Receiver<Order>,
    pub welcomes: watch::Receiver<Option<ServeWelcome>>,
}

/// This member's place on the bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Not registered yet.
    Joining,
    /// Registered, and this process holds the lock.
    Leader,
    /// Registered through another process's leader.
    Follower,
    /// The connection broke; trying again.
    Reconnecting,
    /// Left the bus.
    Stopped,
}

impl Role {
    pub fn is_connected(self) -> bool {
        matches!(self, Role::Leader | Role::Follower)
    }

    pub fn describe(self) -> &'static str {
        match self {
            Role::Joining => "joining the relay",
            Role::Leader => "leading the relay",
            Role::Follower => "following the relay's leader",
            Role::Reconnecting => "reconnecting to the relay",
            Role::Stopped => "not on the relay",
        }
    }
}

/// Everything a session may want to show about its membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberState {
    pub role: Role,
    pub route: Option<Route>,
    pub epoch: Option<Epoch>,
    pub leader_pid: Option<u32>,
    /// How the leader's link to Telegram is doing.
    pub telegram: Health,
    /// Nobody may drive sessions yet: pairing is needed.
    pub needs_pairing: bool,
    /// The route snapshot was reconciled with the leader at `epoch`.
    pub synced: bool,
    /// The last restart announced by a leader, and when it was heard.
    pub restarting: Option<(Restarting, Instant)>,
    /// Why the member cannot do its job right now, if it cannot.
    pub problem: Option<String>,
    /// What keeps this session from having a topic until the user acts.
    pub blocker: Option<Blocker>,
    /// A request of this session waits for its chat's message budget until
    /// then (the latest of the waiting ones).
    pub paced_until: Option<Instant>,
    /// This machine's link to the others, when the relay spans machines.
    pub cluster: Option<ClusterLink>,
    /// What the leader holds of this session's messages.
    pub outbox: OutboxReport,
}

impl MemberState {
    fn joining() -> Self {
        Self {
            role: Role::Joining,
            route: None,
            epoch: None,
            leader_pid: None,
            telegram: Health::Starting,
            needs_pairing: false,
            synced: false,
            restarting: None,
            problem: None,
            blocker: None,
            paced_until: None,
            cluster: None,
            outbox: OutboxReport::default(),
        }
    }
}

/// Why a request through the bus failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemberError {
    #[error("not connected to the relay (reconnecting)")]
    NotConnected,
    #[error("the relay did not answer within {0:?}")]
    Timeout(Duration),
    #[error("this session has left the relay")]
    Stopped,
    /// The leader's answer, with its decision in the code.
    #[error("{0}")]
    Refused(BusError),
}

impl MemberError {
    /// The leader's decision, when it made one.
    pub fn code(&self) -> Option<BusErrorCode> {
        match self {
            Self::Refused(e) => Some(e.code),
            _ => None,
        }
    }
}

/// What the session asks its actor for: to register again (a matter of
/// the actor's own), or a request to the leader, made with the id and the
/// registration's generation of the moment it is sent.
pub(super) enum Call {
    /// Register again on a fresh connection, retrying topic creation.
    Reregister,
    /// Register again as another session (the host switched sessions).
    Rebind {
        profile_key: String,
        session_name: String,
    },
    Request(Box<dyn FnOnce(u64, Generation) -> ToLeader + Send>),
}

pub(super) struct Pending {
    pub call: Call,
    /// The leader's ack of a request; `None` for what the actor does itself.
    pub reply: oneshot::Sender<Result<Option<Ack>, MemberError>>,
}

/// One sidecar's membership of its bot's bus.
pub struct Member {
    calls: mpsc::Sender<Pending>,
    /// Delivery acknowledgements, apart from requests: they are never
    /// dropped for a busy request queue, and go out in bursts.
    acks: mpsc::UnboundedSender<u64>,
    state: watch::Receiver<MemberState>,
    stop: CancellationToken,
    task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The next hand-over's number (see [`Post::hand`]).
    hands: std::sync::atomic::AtomicU64,
}

impl Member {
    /// Starts the member actor. Deliveries for this session arrive on the
    /// returned channel.
    pub fn join(request: JoinRequest) -> (Member, mpsc::Receiver<Deliver>) {
        let (deliveries_tx, deliveries_rx) = mpsc::channel(1024);
        let member = Self::start(request, |channels| {
            Actor::new(
                channels,
                Membership::Session {
                    deliveries: deliveries_tx,
                },
            )
        });
        (member, deliveries_rx)
    }

    /// Starts the membership of `agent-relay serve`: it may lead like any
    /// member, and takes the leader's orders for the sessions it launches.
    pub fn join_launcher(request: LauncherRequest) -> (Member, LauncherLink) {
        let (orders_tx, orders) = mpsc::channel(64);
        let (welcomes_tx, welcomes) = watch::channel(None);
        let join = JoinRequest {
            paths: request.paths,
            config: request.config,
            profile_key: String::new(),
            session_name: String::new(),
            cwd: String::new(),
            pid: request.pid,
            launch: None,
        };
        let member = Self::start(join, |channels| {
            Actor::new(
                channels,
                Membership::Launcher {
                    engines: request.engines,
                    orders: orders_tx,
                    welcomes: welcomes_tx,
                },
            )
        });
        (member, LauncherLink { orders, welcomes })
    }

    fn start(request: JoinRequest, actor: impl FnOnce(Channels) -> Actor) -> Member {
        let (calls_tx, calls_rx) = mpsc::channel(64);
        let (acks_tx, acks_rx) = mpsc::unbounded_channel();
        let (state_tx, state_rx) = watch::channel(MemberState::joining());
        let stop = CancellationToken::new();
        let actor = actor(Channels {
            request,
            state: state_tx,
            calls: calls_rx,
            acks: acks_rx,
            stop: stop.clone(),
        });
        let task = crate::tasks::spawn(actor.run());
        Member {
            calls: calls_tx,
            acks: acks_tx,
            state: state_rx,
            stop,
            task: tokio::sync::Mutex::new(Some(task)),
            hands: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A launcher answers an order of the leader's.
    pub async fn order_done(
        &self,
        order_id: u64,
        outcome: crate::protocol::launch::OrderOutcome,
    ) -> Result<(), MemberError> {
        let done = move |id, generation| crate::protocol::launch::OrderDone {
            id,
            generation,
            order_id,
            outcome,
        };
        self.request(done, REQUEST_TIMEOUT).await
    }

    /// A launcher tells the leader what happened to one of its sessions.
    pub async fn report(
        &self,
        launch_id: String,
        event: crate::protocol::launch::LaunchEvent,
    ) -> Result<(), MemberError> {
        let report = move |id, generation| crate::protocol::launch::LaunchReport {
            id,
            generation,
            launch_id,
            event,
        };
        self.request(report, REQUEST_TIMEOUT).await
    }

    pub fn watch(&self) -> watch::Receiver<MemberState> {
        self.state.clone()
    }

    /// Waits until registered (or `timeout`), then returns the state.
    pub async fn wait_registered(&self, timeout: Duration) -> MemberState {
        let mut state = self.state.clone();
        let registered = state.wait_for(|s| s.role.is_connected() && s.route.is_some());
        match tokio::time::timeout(timeout, registered).await {
            Ok(Ok(s)) => s.clone(),
            _ => self.state.borrow().clone(),
        }
    }

    /// Sends request `R`, made with the id and generation of the moment it
    /// goes, and reads the leader's answer as `R`'s.
    pub(super) async fn request<R: Request + 'static>(
        &self,
        make: impl FnOnce(u64, Generation) -> R + Send + 'static,
        timeout: Duration,
    ) -> Result<R::Reply, MemberError> {
        let call = Call::Request(Box::new(move |id, generation| make(id, generation).into()));
        match self.call(call, timeout).await? {
            Some(ack) => ack.reply::<R>().map_err(MemberError::Refused),
            None => Err(MemberError::Refused(BusError::new(
                BusErrorCode::Internal,
                "the request was answered without an ack",
            ))),
        }
    }

    async fn call(&self, call: Call, timeout: Duration) -> Result<Option<Ack>, MemberError> {
        let (reply, answer) = oneshot::channel();
        self.calls
            .send(Pending { call, reply })
            .await
            .map_err(|_| MemberError::Stopped)?;
        tokio::time::timeout(timeout, answer)
            .await
            .map_err(|_| MemberError::Timeout(timeout))?
            .map_err(|_| MemberError::Stopped)?
    }

    /// Registers again, asking the leader to retry creating the topic even
    /// after an unknown outcome (the user asked for it).
    pub async fn reregister(&self) -> Result<(), MemberError> {
        self.call(Call::Reregister, REQUEST_TIMEOUT).await.map(drop)
    }

    /// Registers again as another session of the same host: its own profile,
    /// its own topic. The previous registration ends; its binding stays.
    pub async fn rebind(
        &self,
        profile_key: String,
        session_name: String,
    ) -> Result<(), MemberError> {
        self.call(
            Call::Rebind {
                profile_key,
                session_name,
            },
            REQUEST_TIMEOUT,
        )
        .await
        .map(drop)
    }

    pub async fn status(&self) -> Result<BusStatus, MemberError> {
        let status = |id, _| StatusQuery { id, cluster: false };
        self.request(status, REQUEST_TIMEOUT).await
    }

    /// The status with every machine's sessions when the relay spans
    /// machines (the leader asks them, up to 2 s); else [`Member::status`].
    pub async fn cluster_status(&self) -> Result<BusStatus, MemberError> {
        let status = |id, _| StatusQuery { id, cluster: true };
        self.request(status, REQUEST_TIMEOUT).await
    }

    /// Deletes this session's topic through the leader (generation-fenced).
    pub async fn disconnect(&self) -> Result<Disconnected, MemberError> {
        let disconnect = |id, generation| Disconnect { id, generation };
        self.request(disconnect, REQUEST_TIMEOUT).await
    }

    /// A one-time pairing link (when nobody is paired yet).
    pub async fn pair(&self) -> Result<PairingLink, MemberError> {
        let pair = |id, generation| Pair { id, generation };
        self.request(pair, REQUEST_TIMEOUT).await
    }

    /// Does `op` in this session's topic. It may wait at the leader for the
    /// chat's pace (and any `retry_after`); a failure carries the leader's
    /// decision ([`MemberError::code`]).
    pub async fn topic(&self, op: TopicOp) -> Result<TopicDone, MemberError> {
        self.topic_within(op, TOPIC_TIMEOUT).await
    }

    /// Like [`Member::topic`], for a request a later one supersedes (typing,
    /// a progress edit): it never waits for the chat's budget, and fails
    /// with [`BusErrorCode::Paced`] when the budget is spent.
    pub async fn topic_background(&self, op: TopicOp) -> Result<TopicDone, MemberError> {
        self.topic_request(op, true, TOPIC_TIMEOUT).await
    }

    /// Like [`Member::topic`], for a request that waits longer than sending
    /// does (an answer to a question).
    pub async fn topic_within(
        &self,
        op: TopicOp,
        timeout: Duration,
    ) -> Result<TopicDone, MemberError> {
        self.topic_request(op, false, timeout).await
    }

    /// Downloads the files of delivery `update_id` (one of this session's)
    /// into its inbox, or finds them there; answers with their paths.
    pub async fn fetch(&self, update_id: i64) -> Result<Fetched, MemberError> {
        let fetch = move |id, generation| Fetch {
            id,
            generation,
            update_id,
        };
        self.request(fetch, FETCH_TIMEOUT).await
    }

    async fn topic_request(
        &self,
        op: TopicOp,
        background: bool,
        timeout: Duration,
    ) -> Result<TopicDone, MemberError> {
        let topic = move |id, generation| TopicRequest {
            id,
            generation,
            op,
            background,
        };
        self.request(topic, timeout).await
    }

    /// Hands `items` over for this session's topic: they are the leader's,
    /// on disk, when this returns, and go out from there (a failure to go
    /// is offered again in the topic by the leader). Waits for the relay
    /// while it is between leaders, up to `patience`.
    pub async fn post(
        &self,
        items: Vec<PostItem>,
        patience: Duration,
    ) -> Result<Posted, MemberError> {
        let give_up = Instant::now() + patience;
        // One number for every try: a try whose answer was lost may have
        // been written.
        let hand = self
            .hands
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        loop {
            let items = items.clone();
            let post = move |id, generation| Post {
                id,
                generation,
                items,
                hand: Some(hand),
            };
            match self.request(post, REQUEST_TIMEOUT).await {
                Err(MemberError::NotConnected) if Instant::now() < give_up => {
                    let left = give_up.saturating_duration_since(Instant::now());
                    let mut state = self.state.clone();
                    let back = state.wait_for(|s| s.role.is_connected() && s.route.is_some());
                    if tokio::time::timeout(left, back).await.is_err() {
                        return Err(MemberError::NotConnected);
                    }
                }
                other => return other,
            }
        }
    }

    /// `/resend`: what did not reach the topic goes again.
    pub async fn resend(&self) -> Result<Resent, MemberError> {
        let resend = |id, generation| Resend { id, generation };
        self.request(resend, REQUEST_TIMEOUT).await
    }

    /// Tells the leader a delivery reached the host. Best effort: an ack lost
    /// with the connection means the delivery comes again, and the session
    /// drops it as a duplicate.
    pub fn ack_delivery(&self, delivery_id: u64) {
        if self.acks.send(delivery_id).is_err() {
            tracing::debug!(delivery_id, "delivery ack not sent: the member is gone");
        }
    }

    /// Leaves the bus; a leader stops leading and releases the lock.
    pub async fn leave(&self) {
        self.stop.cancel();
        if let Some(task) = self.task.lock().await.take()
            && let Err(e) = task.await
        {
            tracing::warn!("bus member ended abnormally: {e}");
        }
    }

    pub(super) fn state(&self) -> MemberState {
        self.state.borrow().clone()
    }
}

//! The member's actor. It loops forever: try the lock (and lead if it is
//! free), connect to the socket, check that the leader runs as this user,
//! register, then serve the connection until it breaks; then back off
//! briefly and start again.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use interprocess::local_socket::tokio::Stream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::handle::{Call, JoinRequest, MemberError, MemberState, Pending, Role};
use crate::backoff::Backoff;
use crate::bus::election::BusDir;
use crate::bus::wire::{self, Received, WireReader, WireWriter};
use crate::config::BotId;
use crate::leader::{self, LeaderHandle};
use crate::protocol::bus::*;

/// Reconnecting after a lost connection: fast, the leader may be gone and
/// a new one elected within milliseconds. The first waits are short
/// because a SIGKILLed leader's socket closes before the kernel lets go of
/// its lock: the first survivors to notice find the lock still held and
/// its socket refusing, and try again within a millisecond.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(1), Duration::from_millis(500));
/// After a refused registration or a bus that cannot be trusted: retrying
/// at once would only hammer the leader (and Telegram) with the same request.
const REFUSED: Backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
/// Most delivery acknowledgements sent with one write.
const ACK_BURST: usize = 256;
/// How long the leader has to answer a registration.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a connection ended.
enum Ended {
    Stopped,
    Lost(String),
    /// The leader refused the registration, or the bus cannot be trusted.
    Refused(String),
    /// The session asked to register again.
    Reregister,
}

/// What the connection loop does after a frame.
enum Next {
    Go,
    Reconcile,
    Reregister,
}

type Waiting = HashMap<u64, oneshot::Sender<Result<Option<Ack>, MemberError>>>;

/// What the handle and the actor share, whatever the membership.
pub(super) struct Channels {
    pub request: JoinRequest,
    pub state: watch::Sender<MemberState>,
    pub calls: mpsc::Receiver<Pending>,
    pub acks: mpsc::UnboundedReceiver<u64>,
    pub stop: CancellationToken,
}

/// What this member is on the bus.
pub(super) enum Membership {
    /// A session: it registers a profile, gets a topic and deliveries.
    Session { deliveries: mpsc::Sender<Deliver> },
    /// `agent-relay serve`, this machine's launcher: no topic; the
    /// leader's orders, and a welcome per registration.
    Launcher {
        engines: Vec<String>,
        orders: mpsc::Sender<crate::protocol::launch::Order>,
        welcomes: watch::Sender<Option<ServeWelcome>>,
    },
}

pub(super) struct Actor {
    request: JoinRequest,
    bus: BusDir,
    instance_id: String,
    /// Proves to a leader that a registration under `instance_id` is ours.
    instance_secret: String,
    generation: Generation,
    next_id: u64,
    carried: Option<Route>,
    /// The route of the session this instance switched away from, told to
    /// the leader with the next registration.
    left: Option<Route>,
    /// Requests waiting for their chat's budget, and until when.
    paced: HashMap<u64, Instant>,
    /// When the next message the leader holds for this session may go.
    outbox_paced: Option<Instant>,
    retry_provisioning: bool,
    leader: Option<LeaderHandle>,
    state: watch::Sender<MemberState>,
    calls: mpsc::Receiver<Pending>,
    acks: mpsc::UnboundedReceiver<u64>,
    membership: Membership,
    stop: CancellationToken,
}

impl Actor {
    pub fn new(channels: Channels, membership: Membership) -> Self {
        let Channels {
            request,
            state,
            calls,
            acks,
            stop,
        } = channels;
        let bot = request.config.bot_id().unwrap_or(BotId(0));
        Self {
            bus: BusDir::new(request.paths.bus_dir(bot)),
            instance_id: uuid::Uuid::new_v4().to_string(),
            instance_secret: uuid::Uuid::new_v4().simple().to_string(),
            request,
            generation: 0,
            next_id: 0,
            carried: None,
            left: None,
            paced: HashMap::new(),
            outbox_paced: None,
            retry_provisioning: false,
            leader: None,
            state,
            calls,
            acks,
            membership,
            stop,
        }
    }

    fn is_launcher(&self) -> bool {
        matches!(self.membership, Membership::Launcher { .. })
    }

    pub async fn run(mut self) {
        let mut reconnect = RECONNECT;
        let mut refused = REFUSED;
        loop {
            if self.stop.is_cancelled() {
                break;
            }
            let ended = match self.try_lead().await {
                Err(why) => Ended::Refused(why),
                Ok(()) => match self.connect().await {
                    Ok(stream) => self.serve(stream).await,
                    // Somebody else's directory or socket: not a leader that
                    // is merely gone, so no quick retry.
                    Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                        Ended::Refused(e.to_string())
                    }
                    Err(e) => {
                        tracing::debug!("cannot reach the bus leader: {e}");
                        self.set(|s| {
                            if s.role != Role::Joining {
                                s.role = Role::Reconnecting;
                            }
                        });
                        if self.idle(reconnect.step()).await {
                            break;
                        }
                        continue;
                    }
                },
            };
            match ended {
                Ended::Stopped => break,
                Ended::Reregister => continue,
                Ended::Lost(why) => {
                    tracing::info!("bus connection lost: {why}");
                    reconnect.reset();
                    refused.reset();
                    self.set(|s| s.role = Role::Reconnecting);
                    // Straight back to the lock: the leader may be gone.
                }
                Ended::Refused(why) => {
                    tracing::warn!("not joining the bus: {why}");
                    self.set(|s| {
                        s.role = Role::Reconnecting;
                        s.problem = Some(why);
                    });
                    if self.idle(refused.step()).await {
                        break;
                    }
                }
            }
        }
        self.set(|s| s.role = Role::Stopped);
        if let Some(leader) = self.leader.take() {
            // Leaving for good: what only this leader would have sent goes
            // on without it (`leader::drain`).
            leader.leave().await;
        }
    }

    /// Waits `delay`, failing calls that arrive meanwhile. True when stopping.
    async fn idle(&mut self, delay: Duration) -> bool {
        let sleep = tokio::time::sleep(delay);
        tokio::pin!(sleep);
        loop {
            tokio::select! {
                () = &mut sleep => return false,
                () = self.stop.cancelled() => return true,
                // Acks without a connection are dropped: the leader will
                // deliver again, and the session drops the repeat.
                Some(_) = self.acks.recv(), if !self.acks.is_closed() => {}
                Some(pending) = self.calls.recv() => {
                    let answer = match pending.call {
                        // Remembered for the next registration.
                        Call::Rebind { profile_key, session_name } => {
                            self.rebind(profile_key, session_name);
                            Ok(None)
                        }
                        _ => Err(MemberError::NotConnected),
                    };
                    let _ = pending.reply.send(answer);
                }
            }
        }
    }

    fn set(&self, change: impl FnOnce(&mut MemberState)) {
        self.state.send_if_modified(|s| {
            let before = s.clone();
            change(s);
            *s != before
        });
    }

    fn rebind(&mut self, profile_key: String, session_name: String) {
        self.request.profile_key = profile_key;
        self.request.session_name = session_name;
        // Several switches before the leader heard of the first: the topic
        // it has to close is still the first one's.
        let left = self.carried.take();
        self.left = self.left.take().or(left);
        self.set(|s| s.route = None);
    }

    /// Becomes leader if the lock is free. An error means the bus directory
    /// cannot be trusted or used: the member then does not join at all.
    async fn try_lead(&mut self) -> Result<(), String> {
        if self.leader.as_ref().is_some_and(LeaderHandle::is_running) {
            return Ok(());
        }
        if let Some(dead) = self.leader.take() {
            dead.stop().await;
        }
        match self.bus.try_lock() {
            Ok(Some(lock)) => {
                crate::logging::milestone("lock", 0);
                let started = leader::start(
                    lock,
                    &self.request.paths,
                    self.instance_id.clone(),
                    &self.request.config,
                )
                .await;
                match started {
                    Ok(handle) => self.leader = Some(handle),
                    Err(e) => {
                        tracing::error!("won the bus lock but cannot lead: {e}");
                        self.set(|s| s.problem = Some(e.to_string()));
                    }
                }
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => Err(format!("the bus lock cannot be used: {e}")),
        }
    }

    /// Connects, in a bus directory that passes the checks, to a leader
    /// that runs as this user.
    async fn connect(&self) -> std::io::Result<Stream> {
        self.bus.connect().await
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Registers on `stream` and serves it until it breaks or we stop.
    async fn serve(&mut self, stream: Stream) -> Ended {
        let (mut reader, mut writer) = wire::split(stream);
        if self.is_launcher() {
            return match self.hello(&mut reader, &mut writer).await {
                Ok(()) => self.serve_registered(reader, writer).await,
                Err(ended) => ended,
            };
        }
        match self.register(&mut reader, &mut writer).await {
            Ok(registered) => {
                let role = if self.leader.is_some() {
                    Role::Leader
                } else {
                    // Ready to lead: a follower elected later polls without
                    // first reading the system's TLS roots.
                    leader::prepare();
                    Role::Follower
                };
                let leader_pid = self.bus.leader_info().map(|i| i.pid);
                self.carried = Some(registered.route.clone());
                self.retry_provisioning = false;
                self.left = None;
                self.set(|s| {
                    s.role = role;
                    s.route = Some(registered.route);
                    s.epoch = Some(registered.epoch);
                    s.leader_pid = leader_pid;
                    s.problem = registered.problem;
                    s.blocker = registered.blocker;
                    s.needs_pairing = registered.needs_pairing;
                });
            }
            Err(ended) => return ended,
        }
        self.serve_registered(reader, writer).await
    }

    /// A launcher's registration: `serve` says hello, the leader welcomes
    /// it with the sessions that should be running.
    async fn hello(
        &mut self,
        reader: &mut WireReader,
        writer: &mut WireWriter,
    ) -> Result<(), Ended> {
        let Membership::Launcher { engines, .. } = &self.membership else {
            return Err(Ended::Refused("not a launcher".into()));
        };
        let engines = engines.clone();
        self.generation += 1;
        let id = self.next_id();
        let hello = ServeHello {
            id,
            instance_id: self.instance_id.clone(),
            instance_secret: self.instance_secret.clone(),
            registration_generation: self.generation,
            pid: self.request.pid,
            protocol_version: BUS_PROTOCOL_VERSION,
            engines,
        };
        let welcome = self.answer(&hello, reader, writer).await?;
        let role = if self.leader.is_some() {
            Role::Leader
        } else {
            Role::Follower
        };
        let leader_pid = self.bus.leader_info().map(|i| i.pid);
        self.set(|s| {
            s.role = role;
            s.epoch = Some(welcome.epoch);
            s.leader_pid = leader_pid;
            s.problem = None;
            s.synced = true;
        });
        if let Membership::Launcher { welcomes, .. } = &self.membership {
            welcomes.send_replace(Some(welcome));
        }
        Ok(())
    }

    /// Sends a registration and waits for its answer.
    async fn answer<R: Request + Clone>(
        &mut self,
        request: &R,
        reader: &mut WireReader,
        writer: &mut WireWriter,
    ) -> Result<R::Reply, Ended> {
        let id = request.id();
        let frame: ToLeader = request.clone().into();
        writer
            .send(&frame)
            .await
            .map_err(|e| Ended::Lost(format!("register: {e}")))?;
        let deadline = tokio::time::sleep(REGISTER_TIMEOUT);
        tokio::pin!(deadline);
        loop {
            let frame = tokio::select! {
                () = self.stop.cancelled() => return Err(Ended::Stopped),
                () = &mut deadline => return Err(Ended::Lost("the leader did not answer the registration".into())),
                frame = reader.recv::<FromLeader>() => frame,
            };
            match frame {
                // A refusal is a problem to show; a connection lost while
                // registering is just part of reconnecting (syncing).
                Ok(Some(Received::Envelope(FromLeader::Ack(ack)))) if ack.id == Some(id) => {
                    return ack.reply::<R>().map_err(|e| Ended::Refused(e.message));
                }
                Ok(Some(_)) => continue,
                Ok(None) => return Err(Ended::Lost("the leader closed the connection".into())),
                Err(e) => return Err(Ended::Lost(e.to_string())),
            }
        }
    }

    async fn register(
        &mut self,
        reader: &mut WireReader,
        writer: &mut WireWriter,
    ) -> Result<Registered, Ended> {
        self.generation += 1;
        let id = self.next_id();
        let register = Register {
            id,
            instance_id: self.instance_id.clone(),
            instance_secret: self.instance_secret.clone(),
            registration_generation: self.generation,
            profile_key: self.request.profile_key.clone(),
            session_name: self.request.session_name.clone(),
            cwd: self.request.cwd.clone(),
            pid: self.request.pid,
            carried: self.carried.clone(),
            protocol_version: BUS_PROTOCOL_VERSION,
            retry_provisioning: self.retry_provisioning,
            left: self.left.clone(),
            launch: self.request.launch.clone(),
        };
        self.answer(&register, reader, writer).await
    }

    async fn serve_registered(&mut self, mut reader: WireReader, mut writer: WireWriter) -> Ended {
        let mut waiting = Waiting::new();
        let interval = Duration::from_millis(HEARTBEAT_INTERVAL_MS);
        let mut heartbeat =
            tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        let silent_limit = interval * HEARTBEAT_MISSES;
        let mut last_heard = Instant::now();
        let mut acks = Vec::with_capacity(ACK_BURST);
        // Every (re)connect of a session starts with the route snapshot.
        let mut reconcile = None;
        if !self.is_launcher() {
            match self.send_reconcile(&mut writer).await {
                Ok(id) => reconcile = Some(id),
                Err(e) => return Ended::Lost(e.to_string()),
            }
        }
        let ended = loop {
            tokio::select! {
                () = self.stop.cancelled() => {
                    self.last_acks(&mut writer).await;
                    break Ended::Stopped;
                }
                frame = reader.recv::<FromLeader>() => match frame {
                    Ok(Some(Received::Envelope(frame))) => {
                        last_heard = Instant::now();
                        match self.on_frame(frame, &mut waiting, &mut reconcile).await {
                            Next::Go => {}
                            Next::Reconcile => match self.send_reconcile(&mut writer).await {
                                Ok(id) => reconcile = Some(id),
                                Err(e) => break Ended::Lost(e.to_string()),
                            },
                            Next::Reregister => break Ended::Reregister,
                        }
                    }
                    Ok(Some(Received::Malformed { error, .. })) => {
                        tracing::warn!("malformed frame from the leader: {error}");
                    }
                    Ok(Some(Received::Oversized)) => break Ended::Lost("oversized frame from the leader".into()),
                    Ok(None) => break Ended::Lost("the leader closed the connection".into()),
                    Err(e) => break Ended::Lost(e.to_string()),
                },
                Some(call) = self.calls.recv() => {
                    if let Some(ended) = self.call(call, &mut writer, &mut waiting).await {
                        break ended;
                    }
                }
                n = self.acks.recv_many(&mut acks, ACK_BURST), if !self.acks.is_closed() => {
                    let generation = self.generation;
                    let frames: Vec<ToLeader> = acks
                        .drain(..n)
                        .map(|delivery_id| ToLeader::DeliveryAck(DeliveryAck { generation, delivery_id }))
                        .collect();
                    if let Err(e) = writer.send_all(&frames).await {
                        break Ended::Lost(e.to_string());
                    }
                }
                _ = heartbeat.tick() => {
                    if last_heard.elapsed() > silent_limit {
                        break Ended::Lost(format!("the leader was silent for {silent_limit:?}"));
                    }
                    let id = self.next_id();
                    let hb = ToLeader::Heartbeat(Heartbeat { id, generation: self.generation });
                    if let Err(e) = writer.send(&hb).await {
                        break Ended::Lost(e.to_string());
                    }
                }
            }
        };
        for (_, reply) in waiting.drain() {
            let _ = reply.send(Err(MemberError::NotConnected));
        }
        self.paced.clear();
        self.outbox_paced = None;
        self.set(|s| s.paced_until = None);
        ended
    }

    /// Acknowledgements still queued go out before the member leaves: a
    /// message the host took must not come to it again.
    async fn last_acks(&mut self, writer: &mut WireWriter) {
        let generation = self.generation;
        let mut frames = Vec::new();
        while let Ok(delivery_id) = self.acks.try_recv() {
            frames.push(ToLeader::DeliveryAck(DeliveryAck {
                generation,
                delivery_id,
            }));
        }
        if !frames.is_empty()
            && let Err(e) = writer.send_all(&frames).await
        {
            tracing::debug!("acknowledgements not sent while leaving: {e}");
        }
    }

    /// What the session asks while connected: a request goes to the leader
    /// and waits for its ack; registering again ends this connection.
    async fn call(
        &mut self,
        call: Pending,
        writer: &mut WireWriter,
        waiting: &mut Waiting,
    ) -> Option<Ended> {
        let id = self.next_id();
        let generation = self.generation;
        let envelope = match call.call {
            Call::Reregister => {
                self.retry_provisioning = true;
                let _ = call.reply.send(Ok(None));
                return Some(Ended::Reregister);
            }
            Call::Rebind {
                profile_key,
                session_name,
            } => {
                self.rebind(profile_key, session_name);
                let _ = call.reply.send(Ok(None));
                return Some(Ended::Reregister);
            }
            Call::Request(envelope) => envelope(id, generation),
        };
        if let Err(e) = writer.send(&envelope).await {
            let _ = call.reply.send(Err(MemberError::NotConnected));
            return Some(Ended::Lost(e.to_string()));
        }
        waiting.insert(id, call.reply);
        None
    }

    /// Sends this session's full route snapshot; returns the request id.
    async fn send_reconcile(&mut self, writer: &mut WireWriter) -> std::io::Result<u64> {
        let id = self.next_id();
        let (observed_epoch, routes) = {
            let state = self.state.borrow();
            (
                state.epoch.unwrap_or(0),
                state.route.iter().cloned().collect(),
            )
        };
        self.set(|s| s.synced = false);
        writer
            .send(&ToLeader::Reconcile(Reconcile {
                id,
                generation: self.generation,
                observed_epoch,
                routes,
            }))
            .await?;
        Ok(id)
    }

    /// Handles one frame from the leader.
    async fn on_frame(
        &mut self,
        frame: FromLeader,
        waiting: &mut Waiting,
        reconcile: &mut Option<u64>,
    ) -> Next {
        match frame {
            FromLeader::Ack(ack) => return self.on_ack(ack, waiting, reconcile),
            FromLeader::Deliver(deliver) => match &self.membership {
                Membership::Session { deliveries } => {
                    crate::logging::milestone("received", deliver.update_id);
                    if deliveries.send(deliver).await.is_err() {
                        tracing::debug!("no session listens for deliveries");
                    }
                }
                Membership::Launcher { .. } => tracing::warn!("a delivery to serve ignored"),
            },
            FromLeader::Order(order) => match &self.membership {
                Membership::Launcher { orders, .. } => {
                    if orders.send(order).await.is_err() {
                        tracing::debug!("nobody takes the leader's orders");
                    }
                }
                Membership::Session { .. } => tracing::warn!("an order to a session ignored"),
            },
            FromLeader::Restarting(plan) => {
                tracing::info!(epoch = plan.epoch, "the leader is restarting the relay");
                self.set(|s| {
                    s.synced = false;
                    s.restarting = Some((plan, Instant::now()));
                });
            }
            FromLeader::Health(health) => self.set(|s| s.telegram = health),
            FromLeader::Paced(paced) => {
                if waiting.contains_key(&paced.id) {
                    let until = Instant::now() + Duration::from_millis(paced.wait_ms);
                    self.paced.insert(paced.id, until);
                    self.show_pacing();
                }
            }
            FromLeader::Cluster(link) => {
                let back = link.state == ClusterLinkState::Up
                    && self
                        .state
                        .borrow()
                        .cluster
                        .as_ref()
                        .is_some_and(|l| l.state != ClusterLinkState::Up);
                self.set(|s| s.cluster = Some(link));
                // Joined without a topic while the cluster was away: try again.
                if back && self.topicless() {
                    return Next::Reregister;
                }
            }
            FromLeader::Outbox(report) => {
                let until = report
                    .paced_ms
                    .map(|wait| Instant::now() + Duration::from_millis(wait));
                self.outbox_paced = until;
                self.set(|s| s.outbox = report);
                self.show_pacing();
            }
            FromLeader::TopicGone(gone) => {
                tracing::info!(
                    thread = gone.thread_id,
                    "the topic is gone; registering for a new one"
                );
                return Next::Reregister;
            }
            FromLeader::Paired(_) => {
                self.set(|s| s.needs_pairing = false);
                // Paired while this session had no topic: register again so
                // the leader can provision one now.
                if self.topicless() {
                    return Next::Reregister;
                }
            }
        }
        Next::Go
    }

    /// An ack: the route snapshot's, or a request's (handed to whoever
    /// waits). An ack of a new epoch means a new leader: the snapshot goes
    /// to it.
    fn on_ack(&mut self, ack: Ack, waiting: &mut Waiting, reconcile: &mut Option<u64>) -> Next {
        if ack.id.is_some() && ack.id == *reconcile {
            *reconcile = None;
            return self.reconciled(ack);
        }
        let moved = self.state.borrow().epoch != Some(ack.epoch);
        if moved {
            tracing::info!(epoch = ack.epoch, "the leader's epoch changed; reconciling");
            self.set(|s| s.epoch = Some(ack.epoch));
        }
        if let Some(id) = ack.id
            && self.paced.remove(&id).is_some()
        {
            self.show_pacing();
        }
        match ack.id.and_then(|id| waiting.remove(&id)) {
            Some(reply) => {
                let _ = reply.send(Ok(Some(ack)));
            }
            None => {
                if let Err(e) = ack.outcome {
                    tracing::debug!("leader refused a frame: {e}");
                }
            }
        }
        if moved && reconcile.is_none() && !self.is_launcher() {
            return Next::Reconcile;
        }
        Next::Go
    }

    /// Whether this session is registered without a topic.
    fn topicless(&self) -> bool {
        self.state
            .borrow()
            .route
            .as_ref()
            .is_some_and(|r| r.target.is_none())
    }

    /// The latest of the waits for the chat's budget, for the status line.
    fn show_pacing(&self) {
        let until = self
            .paced
            .values()
            .copied()
            .chain(self.outbox_paced)
            .filter(|until| *until > Instant::now())
            .max();
        self.set(|s| s.paced_until = until);
    }

    /// The leader's answer to our route snapshot.
    fn reconciled(&mut self, ack: Ack) -> Next {
        let answer = match ack.reply::<Reconcile>() {
            Ok(answer) => answer,
            Err(why) => {
                tracing::warn!("reconcile failed: {why}");
                self.set(|s| s.problem = Some(format!("reconcile failed: {why}")));
                return Next::Go;
            }
        };
        if let Some(rejected) = answer.rejected.first() {
            // Our picture is wrong: forget it and register afresh.
            tracing::warn!(key = %rejected.key, "route rejected: {}", rejected.reason);
            self.carried = None;
            self.set(|s| s.problem = Some(format!("route rejected: {}", rejected.reason)));
            return Next::Reregister;
        }
        self.set(|s| {
            s.epoch = Some(answer.epoch);
            s.synced = true;
        });
        Next::Go
    }
}

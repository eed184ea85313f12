//! The machine-local bus (DESIGN §4): every sidecar of one bot is a
//! [`Member`]; the one holding the kernel lock also runs the [`leader`].
//!
//! A member is an actor. It loops forever: try the lock (and lead if it is
//! free), connect to the socket, register, then serve the connection until it
//! breaks; then back off briefly and start again. The leader's own session
//! registers through the socket like every other one, so there is exactly one
//! registration path and the leader is an ordinary session.

pub mod election;
pub mod leader;
pub mod wire;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use interprocess::local_socket::tokio::Stream;
use interprocess::local_socket::traits::tokio::Stream as _;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use crate::config::{BotId, Config};
use crate::paths::Paths;
use crate::protocol::bus::*;
use election::BusDir;
use leader::LeaderHandle;
use wire::{Incoming, WireReader, WireWriter};

/// Reconnect backoff: starts here and doubles…
const BACKOFF_START: Duration = Duration::from_millis(10);
/// …up to here.
const BACKOFF_CAP: Duration = Duration::from_millis(500);
/// How long a request to the leader may take before the caller gives up.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Backoff after a refused registration starts here…
const REFUSED_START: Duration = Duration::from_secs(1);
/// …and grows up to here.
const REFUSED_CAP: Duration = Duration::from_secs(30);
/// Most delivery acknowledgements sent with one write.
const ACK_BURST: usize = 256;
/// How long a restart may take to converge before it is reported partial.
pub const RESTART_WINDOW: Duration = Duration::from_secs(10);
/// How often the restart's caller looks at the bus while it converges.
const RESTART_POLL: Duration = Duration::from_millis(20);
/// How long a Bot API call through the leader may take, pacing included.
const TELEGRAM_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the leader has to answer a registration.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);

/// What a session needs to join its bot's bus.
#[derive(Debug, Clone)]
pub struct JoinRequest {
    pub paths: Paths,
    pub config: Config,
    pub profile_key: String,
    pub session_name: String,
    pub cwd: String,
    pub pid: u32,
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
    #[error("{0}")]
    Refused(BusError),
    #[error("the leader's answer is malformed: {0}")]
    Malformed(String),
}

enum Call {
    /// Register again on a fresh connection, retrying topic creation.
    Reregister,
    /// Register again as another session (the host switched sessions).
    Rebind {
        profile_key: String,
        session_name: String,
    },
    Status,
    Disconnect,
    Restart,
    Pair,
    Telegram {
        method: String,
        params: Value,
    },
}

struct Pending {
    call: Call,
    reply: oneshot::Sender<Result<Value, MemberError>>,
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
}

impl Member {
    /// Starts the member actor. Deliveries for this session arrive on the
    /// returned channel.
    pub fn join(request: JoinRequest) -> (Member, mpsc::Receiver<Deliver>) {
        let (calls_tx, calls_rx) = mpsc::channel(64);
        let (acks_tx, acks_rx) = mpsc::unbounded_channel();
        let (deliveries_tx, deliveries_rx) = mpsc::channel(1024);
        let (state_tx, state_rx) = watch::channel(MemberState {
            role: Role::Joining,
            route: None,
            epoch: None,
            leader_pid: None,
            telegram: Health::Starting,
            needs_pairing: false,
            synced: false,
            restarting: None,
            problem: None,
        });
        let stop = CancellationToken::new();
        let actor = Actor {
            bus: BusDir::new(request.paths.bus_dir(bot_id(&request.config))),
            store_path: request.paths.store_file(bot_id(&request.config)),
            instance_id: uuid::Uuid::new_v4().to_string(),
            request,
            generation: 0,
            next_id: 0,
            carried: None,
            retry_provisioning: false,
            leader: None,
            state: state_tx,
            calls: calls_rx,
            acks: acks_rx,
            deliveries: deliveries_tx,
            stop: stop.clone(),
        };
        let task = tokio::spawn(actor.run());
        (
            Member {
                calls: calls_tx,
                acks: acks_tx,
                state: state_rx,
                stop,
                task: tokio::sync::Mutex::new(Some(task)),
            },
            deliveries_rx,
        )
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

    async fn call<T: DeserializeOwned>(&self, call: Call) -> Result<T, MemberError> {
        self.call_within(call, REQUEST_TIMEOUT).await
    }

    async fn call_within<T: DeserializeOwned>(
        &self,
        call: Call,
        timeout: Duration,
    ) -> Result<T, MemberError> {
        let (reply, answer) = oneshot::channel();
        self.calls
            .send(Pending { call, reply })
            .await
            .map_err(|_| MemberError::Stopped)?;
        let value = tokio::time::timeout(timeout, answer)
            .await
            .map_err(|_| MemberError::Timeout(timeout))?
            .map_err(|_| MemberError::Stopped)??;
        serde_json::from_value(value).map_err(|e| MemberError::Malformed(e.to_string()))
    }

    /// Registers again, asking the leader to retry creating the topic even
    /// after an unknown outcome (the user asked for it).
    pub async fn reregister(&self) -> Result<(), MemberError> {
        let (reply, answer) = oneshot::channel();
        self.calls
            .send(Pending {
                call: Call::Reregister,
                reply,
            })
            .await
            .map_err(|_| MemberError::Stopped)?;
        tokio::time::timeout(REQUEST_TIMEOUT, answer)
            .await
            .map_err(|_| MemberError::Timeout(REQUEST_TIMEOUT))?
            .map_err(|_| MemberError::Stopped)?
            .map(drop)
    }

    /// Registers again as another session of the same host: its own profile,
    /// its own topic. The previous registration ends; its binding stays.
    pub async fn rebind(
        &self,
        profile_key: String,
        session_name: String,
    ) -> Result<(), MemberError> {
        self.call_within::<Value>(
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
        self.call(Call::Status).await
    }

    /// Deletes this session's topic through the leader (generation-fenced).
    pub async fn disconnect(&self) -> Result<Disconnected, MemberError> {
        self.call(Call::Disconnect).await
    }

    /// A one-time pairing link (when nobody is paired yet).
    pub async fn pair(&self) -> Result<PairingLink, MemberError> {
        self.call(Call::Pair).await
    }

    /// Tells the leader a delivery reached the host. Best effort: an ack lost
    /// with the connection means the delivery comes again, and the session
    /// drops it as a duplicate.
    pub fn ack_delivery(&self, delivery_id: u64) {
        if self.acks.send(delivery_id).is_err() {
            tracing::debug!(delivery_id, "delivery ack not sent: the member is gone");
        }
    }

    /// `/relay restart`: asks the leader to restart the relay (or joins a
    /// restart already under way), then watches the bus until every expected
    /// route is back at a newer epoch, for at most [`RESTART_WINDOW`].
    pub async fn restart(&self) -> RestartOutcome {
        let started = Instant::now();
        let mut asked_while_away = false;
        let plan = loop {
            if let Some(plan) = self.restart_in_flight().await {
                break plan;
            }
            match self.call::<RestartPlan>(Call::Restart).await {
                Ok(plan) => break plan,
                // Between leaders (another restart, a failover): wait to be
                // back, then join what is under way or ask again, once.
                Err(MemberError::NotConnected) if !asked_while_away => {
                    asked_while_away = true;
                    self.wait_registered(RESTART_WINDOW).await;
                }
                Err(e) => {
                    return RestartOutcome::Failed {
                        reason: e.to_string(),
                        elapsed_ms: started.elapsed().as_millis() as u64,
                    };
                }
            }
        };
        self.converge(&plan, started).await
    }

    /// A restart announced recently that has not converged yet: a request
    /// now joins it instead of restarting again.
    async fn restart_in_flight(&self) -> Option<RestartPlan> {
        let (plan, heard) = self.state.borrow().restarting.clone()?;
        if heard.elapsed() >= RESTART_WINDOW {
            return None;
        }
        match self.status().await {
            Ok(status) if converged(&plan, &status) => None,
            _ => Some(plan),
        }
    }

    async fn converge(&self, plan: &RestartPlan, started: Instant) -> RestartOutcome {
        let deadline = started + RESTART_WINDOW;
        let elapsed_ms = || started.elapsed().as_millis() as u64;
        let mut last: Option<BusStatus> = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Ok(Ok(status)) = tokio::time::timeout(left, self.status()).await
                && status.epoch > plan.epoch
            {
                if converged(plan, &status) {
                    return RestartOutcome::Complete {
                        routes: plan.expected_routes,
                        elapsed_ms: elapsed_ms(),
                    };
                }
                last = Some(status);
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(RESTART_POLL).await;
        }
        match last {
            Some(status) => {
                let missing: Vec<String> = plan
                    .expected
                    .iter()
                    .filter(|key| {
                        !status
                            .sessions
                            .iter()
                            .any(|s| &s.profile_key == *key && s.live && s.reconciled)
                    })
                    .cloned()
                    .collect();
                RestartOutcome::PartialTimeout {
                    back: plan.expected_routes.saturating_sub(missing.len() as u32),
                    expected: plan.expected_routes,
                    missing,
                    elapsed_ms: elapsed_ms(),
                }
            }
            None => RestartOutcome::Failed {
                reason: self
                    .state
                    .borrow()
                    .problem
                    .clone()
                    .unwrap_or_else(|| "no leader was elected".into()),
                elapsed_ms: elapsed_ms(),
            },
        }
    }

    /// A Bot API call through the leader. It may wait there for the chat's
    /// pace (and any `retry_after`), so it gets a longer timeout than other
    /// requests: giving up early would report a send as failed that the
    /// leader still performs.
    pub async fn telegram(&self, method: &str, params: Value) -> Result<Value, MemberError> {
        self.call_within(
            Call::Telegram {
                method: method.to_string(),
                params,
            },
            TELEGRAM_TIMEOUT,
        )
        .await
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
}

/// Whether every route a restart expects is back, live and reconciled at a
/// newer epoch.
fn converged(plan: &RestartPlan, status: &BusStatus) -> bool {
    status.epoch > plan.epoch
        && plan.expected.iter().all(|key| {
            status
                .sessions
                .iter()
                .any(|s| &s.profile_key == key && s.live && s.reconciled)
        })
}

fn bot_id(config: &Config) -> BotId {
    config.bot_id().unwrap_or(BotId(0))
}

/// Why a connection ended.
enum Ended {
    Stopped,
    Lost(String),
    /// The leader refused the registration; retrying at once would only
    /// hammer it (and Telegram) with the same request.
    Refused(String),
    /// The session asked to register again.
    Reregister,
}

struct Actor {
    request: JoinRequest,
    bus: BusDir,
    store_path: std::path::PathBuf,
    instance_id: String,
    generation: Generation,
    next_id: u64,
    carried: Option<Route>,
    retry_provisioning: bool,
    leader: Option<LeaderHandle>,
    state: watch::Sender<MemberState>,
    calls: mpsc::Receiver<Pending>,
    acks: mpsc::UnboundedReceiver<u64>,
    deliveries: mpsc::Sender<Deliver>,
    stop: CancellationToken,
}

impl Actor {
    async fn run(mut self) {
        let mut backoff = BACKOFF_START;
        let mut refused = REFUSED_START;
        loop {
            if self.stop.is_cancelled() {
                break;
            }
            self.try_lead().await;
            match self.connect().await {
                Ok(stream) => match self.serve(stream).await {
                    Ended::Stopped => break,
                    Ended::Reregister => continue,
                    Ended::Lost(why) => {
                        tracing::info!("bus connection lost: {why}");
                        backoff = BACKOFF_START;
                        refused = REFUSED_START;
                        self.set(|s| {
                            s.role = Role::Reconnecting;
                        });
                        // Straight back to the lock: the leader may be gone.
                        continue;
                    }
                    Ended::Refused(why) => {
                        tracing::warn!("registration refused: {why}");
                        self.set(|s| s.role = Role::Reconnecting);
                        let wait = refused.mul_f64(0.5 + fastrand::f64());
                        refused = (refused * 2).min(REFUSED_CAP);
                        if self.idle(wait).await {
                            break;
                        }
                        continue;
                    }
                },
                Err(e) => {
                    tracing::debug!("cannot reach the bus leader: {e}");
                    self.set(|s| {
                        if s.role != Role::Joining {
                            s.role = Role::Reconnecting;
                        }
                    });
                }
            }
            let jittered = backoff.mul_f64(0.5 + fastrand::f64());
            if self.idle(jittered).await {
                break;
            }
            backoff = (backoff * 2).min(BACKOFF_CAP);
        }
        self.set(|s| s.role = Role::Stopped);
        if let Some(leader) = self.leader.take() {
            leader.stop().await;
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
                            self.request.profile_key = profile_key;
                            self.request.session_name = session_name;
                            self.carried = None;
                            Ok(Value::Null)
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

    /// Becomes leader if the lock is free.
    async fn try_lead(&mut self) {
        if self.leader.as_ref().is_some_and(LeaderHandle::is_running) {
            return;
        }
        if let Some(dead) = self.leader.take() {
            dead.stop().await;
        }
        match self.bus.try_lock() {
            Ok(Some(lock)) => {
                let started = leader::start(
                    lock,
                    self.store_path.clone(),
                    self.instance_id.clone(),
                    &self.request.config,
                )
                .await;
                match started {
                    Ok(handle) => {
                        self.leader = Some(handle);
                    }
                    Err(e) => {
                        tracing::error!("won the bus lock but cannot lead: {e}");
                        self.set(|s| s.problem = Some(e.to_string()));
                    }
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!("cannot open the bus lock: {e}");
                self.set(|s| s.problem = Some(format!("bus lock: {e}")));
            }
        }
    }

    async fn connect(&self) -> std::io::Result<Stream> {
        Stream::connect(self.bus.socket_name()?).await
    }

    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Registers on `stream` and serves it until it breaks or we stop.
    async fn serve(&mut self, stream: Stream) -> Ended {
        let (mut reader, mut writer) = wire::split(stream);
        match self.register(&mut reader, &mut writer).await {
            Ok(registered) => {
                let role = if self.leader.is_some() {
                    Role::Leader
                } else {
                    Role::Follower
                };
                let leader_pid = self.bus.leader_info().map(|i| i.pid);
                self.carried = Some(registered.route.clone());
                self.retry_provisioning = false;
                self.set(|s| {
                    s.role = role;
                    s.route = Some(registered.route);
                    s.epoch = Some(registered.epoch);
                    s.leader_pid = leader_pid;
                    s.problem = registered.problem;
                    s.needs_pairing = registered.needs_pairing;
                });
            }
            Err(ended) => {
                // A refusal is a problem to show; a connection lost while
                // registering is just part of reconnecting (syncing).
                if let Ended::Refused(why) = &ended {
                    self.set(|s| s.problem = Some(why.clone()));
                }
                return ended;
            }
        }
        self.serve_registered(reader, writer).await
    }

    async fn register(
        &mut self,
        reader: &mut WireReader,
        writer: &mut WireWriter,
    ) -> Result<Registered, Ended> {
        self.generation += 1;
        let id = self.next_id();
        let register = ToLeader::Register(Register {
            id,
            instance_id: self.instance_id.clone(),
            registration_generation: self.generation,
            profile_key: self.request.profile_key.clone(),
            session_name: self.request.session_name.clone(),
            cwd: self.request.cwd.clone(),
            pid: self.request.pid,
            carried: self.carried.clone(),
            protocol_version: BUS_PROTOCOL_VERSION,
            retry_provisioning: self.retry_provisioning,
        });
        writer
            .send(&register)
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
                Ok(Some(Incoming::Envelope(FromLeader::Ack(ack)))) if ack.id == Some(id) => {
                    return match (ack.ok, ack.result, ack.error) {
                        (true, Some(result), _) => serde_json::from_value(result).map_err(|e| {
                            Ended::Lost(format!("malformed registration answer: {e}"))
                        }),
                        (_, _, Some(e)) => Err(Ended::Refused(e.message)),
                        _ => Err(Ended::Lost("malformed registration answer".into())),
                    };
                }
                Ok(Some(_)) => continue,
                Ok(None) => return Err(Ended::Lost("the leader closed the connection".into())),
                Err(e) => return Err(Ended::Lost(e.to_string())),
            }
        }
    }

    async fn serve_registered(&mut self, mut reader: WireReader, mut writer: WireWriter) -> Ended {
        let mut pending: HashMap<u64, oneshot::Sender<Result<Value, MemberError>>> = HashMap::new();
        let interval = Duration::from_millis(HEARTBEAT_INTERVAL_MS);
        let mut heartbeat =
            tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        let silent_limit = interval * HEARTBEAT_MISSES;
        let mut last_heard = Instant::now();
        let mut acks = Vec::with_capacity(ACK_BURST);
        // Every (re)connect starts with the route snapshot.
        let mut reconcile = match self.send_reconcile(&mut writer).await {
            Ok(id) => Some(id),
            Err(e) => return Ended::Lost(e.to_string()),
        };
        let ended = loop {
            tokio::select! {
                () = self.stop.cancelled() => break Ended::Stopped,
                frame = reader.recv::<FromLeader>() => match frame {
                    Ok(Some(Incoming::Envelope(frame))) => {
                        last_heard = Instant::now();
                        match self.on_frame(frame, &mut pending, &mut reconcile).await {
                            Next::Go => {}
                            Next::Reconcile => match self.send_reconcile(&mut writer).await {
                                Ok(id) => reconcile = Some(id),
                                Err(e) => break Ended::Lost(e.to_string()),
                            },
                            Next::Reregister => break Ended::Reregister,
                        }
                    }
                    Ok(Some(Incoming::Malformed { error, .. })) => {
                        tracing::warn!("malformed frame from the leader: {error}");
                    }
                    Ok(Some(Incoming::Oversized)) => break Ended::Lost("oversized frame from the leader".into()),
                    Ok(None) => break Ended::Lost("the leader closed the connection".into()),
                    Err(e) => break Ended::Lost(e.to_string()),
                },
                Some(call) = self.calls.recv() => {
                    let id = self.next_id();
                    let generation = self.generation;
                    let envelope = match call.call {
                        Call::Reregister => {
                            self.retry_provisioning = true;
                            let _ = call.reply.send(Ok(Value::Null));
                            break Ended::Reregister;
                        }
                        Call::Rebind { profile_key, session_name } => {
                            self.request.profile_key = profile_key;
                            self.request.session_name = session_name;
                            self.carried = None;
                            self.set(|s| s.route = None);
                            let _ = call.reply.send(Ok(Value::Null));
                            break Ended::Reregister;
                        }
                        Call::Pair => ToLeader::Pair(Pair { id, generation }),
                        Call::Status => ToLeader::Status(StatusQuery { id }),
                        Call::Disconnect => ToLeader::Disconnect(Disconnect { id, generation }),
                        Call::Restart => ToLeader::Restart(Restart { id, generation }),
                        Call::Telegram { method, params } => ToLeader::Telegram(TelegramCall { id, generation, method, params }),
                    };
                    if let Err(e) = writer.send(&envelope).await {
                        let _ = call.reply.send(Err(MemberError::NotConnected));
                        break Ended::Lost(e.to_string());
                    }
                    pending.insert(id, call.reply);
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
        for (_, reply) in pending.drain() {
            let _ = reply.send(Err(MemberError::NotConnected));
        }
        ended
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
        pending: &mut HashMap<u64, oneshot::Sender<Result<Value, MemberError>>>,
        reconcile: &mut Option<u64>,
    ) -> Next {
        match frame {
            FromLeader::Ack(ack) => {
                if ack.id.is_some() && ack.id == *reconcile {
                    *reconcile = None;
                    return self.reconciled(ack);
                }
                let moved = self.state.borrow().epoch != Some(ack.epoch);
                if moved {
                    tracing::info!(epoch = ack.epoch, "the leader's epoch changed; reconciling");
                    self.set(|s| s.epoch = Some(ack.epoch));
                }
                if let Some(reply) = ack.id.and_then(|id| pending.remove(&id)) {
                    let answer = if ack.ok {
                        Ok(ack.result.unwrap_or(Value::Null))
                    } else {
                        Err(MemberError::Refused(ack.error.unwrap_or_else(|| {
                            BusError {
                                code: BusErrorCode::Internal,
                                message: "refused without a reason".into(),
                                retry_after: None,
                                commit_unknown: false,
                            }
                        })))
                    };
                    let _ = reply.send(answer);
                } else if let Some(e) = ack.error {
                    tracing::debug!("leader refused a frame: {e}");
                }
                if moved && reconcile.is_none() {
                    return Next::Reconcile;
                }
            }
            FromLeader::Deliver(deliver) => {
                if self.deliveries.send(deliver).await.is_err() {
                    tracing::debug!("no session listens for deliveries");
                }
            }
            FromLeader::Restarting(plan) => {
                tracing::info!(epoch = plan.epoch, "the leader is restarting the relay");
                self.set(|s| {
                    s.synced = false;
                    s.restarting = Some((plan, Instant::now()));
                });
            }
            FromLeader::Health(health) => self.set(|s| s.telegram = health),
            FromLeader::Paired(_) => {
                self.set(|s| s.needs_pairing = false);
                // Paired while this session had no topic: register again so
                // the leader can provision one now.
                let topicless = self
                    .state
                    .borrow()
                    .route
                    .as_ref()
                    .is_some_and(|r| r.target.is_none());
                if topicless {
                    return Next::Reregister;
                }
            }
        }
        Next::Go
    }

    /// The leader's answer to our route snapshot.
    fn reconciled(&mut self, ack: Ack) -> Next {
        let answer = ack
            .result
            .filter(|_| ack.ok)
            .and_then(|v| serde_json::from_value::<Reconciled>(v).ok());
        let Some(answer) = answer else {
            let why = ack
                .error
                .map_or_else(|| "malformed answer".into(), |e| e.message);
            tracing::warn!("reconcile failed: {why}");
            self.set(|s| s.problem = Some(format!("reconcile failed: {why}")));
            return Next::Go;
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

/// What the connection loop does after a frame.
enum Next {
    Go,
    Reconcile,
    Reregister,
}

/// Asks the running leader for the bus status without joining as a session
/// (`agent-relay status`). `Ok(None)` when no leader is running.
pub async fn query_status(paths: &Paths, bot: BotId) -> Result<Option<BusStatus>, MemberError> {
    let bus = BusDir::new(paths.bus_dir(bot));
    let Ok(name) = bus.socket_name() else {
        return Ok(None);
    };
    let Ok(stream) = Stream::connect(name).await else {
        return Ok(None);
    };
    let (mut reader, mut writer) = wire::split(stream);
    writer
        .send(&ToLeader::Status(StatusQuery { id: 1 }))
        .await
        .map_err(|_| MemberError::NotConnected)?;
    let answer = tokio::time::timeout(REGISTER_TIMEOUT, async {
        loop {
            match reader.recv::<FromLeader>().await {
                Ok(Some(Incoming::Envelope(FromLeader::Ack(ack)))) if ack.id == Some(1) => {
                    return Ok(ack);
                }
                Ok(Some(_)) => continue,
                _ => return Err(MemberError::NotConnected),
            }
        }
    })
    .await
    .map_err(|_| MemberError::Timeout(REGISTER_TIMEOUT))??;
    match (answer.ok, answer.result, answer.error) {
        (true, Some(v), _) => serde_json::from_value(v)
            .map(Some)
            .map_err(|e| MemberError::Malformed(e.to_string())),
        (_, _, Some(e)) => Err(MemberError::Refused(e)),
        _ => Err(MemberError::Malformed("empty status answer".into())),
    }
}

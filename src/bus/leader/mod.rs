//! The leader: the one sidecar per bot that holds the bus lock. It owns the
//! socket, the registry of live sessions, the Telegram poller and outbox, and
//! every write to the store.
//!
//! Each connection gets a reader loop and a writer task joined by a bounded
//! channel, so the leader can push deliveries at any time and a slow follower
//! can never stall the others (its channel fills and it is dropped).
//! Register and disconnect for one profile are serialized by a per-profile
//! lock; everything else a session sends is fenced by its generation.

mod registry;
mod relay;
mod router;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use interprocess::local_socket::tokio::{Listener, Stream};
use interprocess::local_socket::traits::StreamCommon as _;
use interprocess::local_socket::traits::tokio::Listener as _;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::election::{LeaderInfo, LeaderLock};
use super::wire::{self, Incoming};
use crate::config::Config;
use crate::protocol::bus::*;
use crate::store::{Store, StoreError};
use crate::telegram::SetupError;
use crate::telegram::poller::Poller;
use registry::Registration;
use relay::{Journaling, Relay};

/// Most frames written to one follower with one flush.
const WRITE_BURST: usize = 256;

/// How many frames may wait for one follower before it counts as stuck.
const OUTBOX_FRAMES: usize = 4096;

/// A connection's id inside this leader.
type ConnId = u64;

/// Why a sidecar that won the lock could not lead.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("the relay database cannot be used: {0}")]
    Store(#[from] StoreError),
    #[error("cannot bind the bus socket: {0}")]
    Bind(std::io::Error),
    #[error("cannot set up the Telegram client: {0}")]
    Telegram(#[from] SetupError),
}

/// A running leader. Call [`LeaderHandle::stop`] to step down.
pub struct LeaderHandle {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
    lock: LeaderLock,
}

struct Conn {
    outbox: mpsc::Sender<FromLeader>,
    last_seen: Instant,
    session: Option<Registration>,
    close: CancellationToken,
}

#[derive(Default)]
struct Registry {
    next_conn: ConnId,
    conns: HashMap<ConnId, Conn>,
}

impl Registry {
    fn live(&self) -> impl Iterator<Item = (ConnId, &Registration)> {
        self.conns
            .iter()
            .filter_map(|(id, c)| c.session.as_ref().map(|s| (*id, s)))
    }

    /// The connection whose live session owns `profile_key`.
    fn owner_of(&self, profile_key: &str) -> Option<(ConnId, &Registration)> {
        self.live()
            .find(|(_, s)| s.route.profile_key == profile_key)
    }
}

struct Shared {
    epoch: Epoch,
    instance_id: String,
    since_ms: u64,
    store: Arc<Mutex<Store>>,
    registry: Mutex<Registry>,
    profile_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    relay: Relay,
    /// Profiles whose topic was told that the session is away, so it is told
    /// only once per absence.
    told_offline: Mutex<HashSet<String>>,
    /// The restart this leader is stepping down for, once one was asked:
    /// a second request joins it.
    restarting: std::sync::OnceLock<Restarting>,
    /// Held while the cleanup intents a predecessor left are worked off:
    /// nothing is provisioned before.
    cleanup: Arc<tokio::sync::Mutex<()>>,
    /// Delivery acknowledgements waiting to be written (`router::settle`).
    settle: mpsc::UnboundedSender<(String, i64)>,
    stop: CancellationToken,
}

impl Shared {
    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn profile_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.profile_locks.lock().unwrap_or_else(|e| e.into_inner());
        locks.entry(key.to_string()).or_default().clone()
    }

    fn ack_ok<T: Serialize>(&self, id: u64, result: &T) -> FromLeader {
        FromLeader::Ack(Ack {
            id: Some(id),
            epoch: self.epoch,
            ok: true,
            result: serde_json::to_value(result).ok(),
            error: None,
        })
    }

    fn ack_err(&self, id: Option<u64>, error: BusError) -> FromLeader {
        FromLeader::Ack(Ack {
            id,
            epoch: self.epoch,
            ok: false,
            result: None,
            error: Some(error),
        })
    }

    fn ack<T: Serialize>(&self, id: u64, result: Result<T, BusError>) -> FromLeader {
        match result {
            Ok(r) => self.ack_ok(id, &r),
            Err(e) => self.ack_err(Some(id), e),
        }
    }

    /// Queues a frame for one connection; a follower that does not read is
    /// dropped rather than allowed to stall the leader.
    fn send(&self, conn: ConnId, frame: FromLeader) {
        let registry = self.registry();
        if let Some(c) = registry.conns.get(&conn)
            && c.outbox.try_send(frame).is_err()
        {
            tracing::warn!(conn, "follower is not reading; dropping its connection");
            c.close.cancel();
        }
    }

    fn broadcast(&self, frame: &FromLeader) {
        let registry = self.registry();
        for (id, c) in &registry.conns {
            if c.session.is_some() && c.outbox.try_send(frame.clone()).is_err() {
                tracing::warn!(
                    conn = id,
                    "follower is not reading; dropping its connection"
                );
                c.close.cancel();
            }
        }
    }
}

fn error(code: BusErrorCode, message: impl Into<String>) -> BusError {
    BusError {
        code,
        message: message.into(),
        retry_after: None,
        commit_unknown: false,
    }
}

fn store_error(e: StoreError) -> BusError {
    error(BusErrorCode::Internal, format!("relay database: {e}"))
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Starts leading: opens the store, bumps the epoch, binds the socket,
/// writes `leader.json` and starts polling Telegram. The lock is held until
/// [`LeaderHandle::stop`].
pub async fn start(
    lock: LeaderLock,
    store_path: PathBuf,
    instance_id: String,
    config: &Config,
) -> Result<LeaderHandle, LeaderError> {
    let relay = Relay::new(config)?;
    let (store, epoch) = tokio::task::spawn_blocking(move || -> Result<_, StoreError> {
        let mut store = Store::open(&store_path)?;
        let epoch = store.bump_epoch()?;
        Ok((store, epoch))
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
    let shared = Arc::new(Shared {
        epoch,
        instance_id,
        since_ms,
        store: Arc::new(Mutex::new(store)),
        registry: Mutex::new(Registry::default()),
        profile_locks: Mutex::default(),
        relay,
        told_offline: Mutex::default(),
        restarting: std::sync::OnceLock::new(),
        cleanup: Arc::default(),
        settle,
        stop: CancellationToken::new(),
    });
    let allowed = config.allowed_users.clone();
    let task = tokio::spawn(run(shared.clone(), listener, allowed, acks));
    Ok(LeaderHandle { shared, task, lock })
}

impl LeaderHandle {
    pub fn epoch(&self) -> Epoch {
        self.shared.epoch
    }

    /// Whether the leader is still serving.
    pub fn is_running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Steps down: stops the poller, closes every connection and the socket,
    /// removes the control files and only then releases the lock, so there
    /// are never two pollers and never a socket without a lock holder.
    pub async fn stop(self) {
        self.shared.stop.cancel();
        if let Err(e) = self.task.await {
            tracing::warn!("leader task ended abnormally: {e}");
        }
        self.lock.remove_control_files();
        drop(self.lock);
    }
}

/// `/relay restart`: answers with the plan, tells every session, and steps
/// down. The member that owns this leader then releases the lock, and the
/// bus elects a leader again; sessions come back on their own.
fn restart(shared: &Arc<Shared>, conn: ConnId, req: &Restart) {
    if let Err(e) = registry::check_generation(shared, conn, req.generation) {
        shared.send(conn, shared.ack_err(Some(req.id), e));
        return;
    }
    let mut first = false;
    let plan = shared.restarting.get_or_init(|| {
        first = true;
        let mut expected: Vec<String> = shared
            .registry()
            .live()
            .filter(|(_, s)| s.ready)
            .map(|(_, s)| s.route.profile_key.clone())
            .collect();
        expected.sort();
        let count = expected.len() as u32;
        Restarting {
            epoch: shared.epoch,
            expected_instances: count,
            expected_routes: count,
            expected,
        }
    });
    shared.send(conn, shared.ack_ok(req.id, plan));
    if first {
        tracing::info!(
            routes = plan.expected_routes,
            "restarting the relay on request"
        );
        shared.broadcast(&FromLeader::Restarting(plan.clone()));
        shared.stop.cancel();
    }
}

/// Finishes the topic deletions a previous leader promised but could not
/// confirm, before anything is provisioned.
async fn finish_cleanups(shared: &Shared) {
    let intents = match shared.store().pending_cleanups() {
        Ok(intents) => intents,
        Err(e) => {
            tracing::error!("cannot read cleanup intents: {e}");
            return;
        }
    };
    for intent in intents {
        let params =
            serde_json::json!({"chat_id": intent.chat_id, "message_thread_id": intent.thread_id});
        let result = tokio::select! {
            () = shared.stop.cancelled() => return,
            r = shared.relay.call("deleteForumTopic", &params) => r,
        };
        let mut store = shared.store();
        let recorded = match result {
            Ok(_) | Err(crate::telegram::TelegramError::ThreadGone { .. }) => {
                tracing::info!(
                    thread = intent.thread_id,
                    "finished a predecessor's topic deletion"
                );
                store.finish_cleanup(intent.id)
            }
            Err(e) => {
                tracing::warn!(
                    thread = intent.thread_id,
                    "a pending topic deletion failed again: {e}"
                );
                store.record_cleanup_attempt(intent.id)
            }
        };
        if let Err(e) = recorded {
            tracing::error!("cannot update a cleanup intent: {e}");
        }
    }
}

/// Most acknowledgements written in one transaction.
const SETTLE_BATCH: usize = 1024;

async fn run(
    shared: Arc<Shared>,
    listener: Listener,
    allowed: Vec<i64>,
    mut acks: mpsc::UnboundedReceiver<(String, i64)>,
) {
    // Taken before the first accept, so no registration provisions anything
    // until the cleanups are done.
    match shared.cleanup.clone().try_lock_owned() {
        Ok(guard) => {
            let shared = shared.clone();
            tokio::spawn(async move {
                finish_cleanups(&shared).await;
                drop(guard);
            });
        }
        Err(_) => tracing::error!("the cleanup lock is taken before the leader started"),
    }
    let (batches_tx, mut batches) = mpsc::channel(64);
    let poller = Poller {
        api: shared.relay.api().clone(),
        store: shared.store.clone(),
        triage: Journaling::new(shared.store.clone(), allowed),
        batches: batches_tx,
        health: shared.relay.health.clone(),
        stop: shared.stop.clone(),
    };
    let mut poller = tokio::spawn(poller.run());
    let mut health = shared.relay.health.subscribe();
    let mut conns = JoinSet::new();
    let mut sweep = tokio::time::interval(Duration::from_millis(500));
    let silent_limit = Duration::from_millis(HEARTBEAT_INTERVAL_MS * u64::from(HEARTBEAT_MISSES));
    loop {
        tokio::select! {
            () = shared.stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(stream) => {
                    conns.spawn(serve_connection(shared.clone(), stream));
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(batch) = batches.recv() => router::route(&shared, batch).await,
            Some(first) = acks.recv() => {
                // Whatever queued up meanwhile goes into the same transaction.
                let mut batch = vec![first];
                while batch.len() < SETTLE_BATCH && let Ok(ack) = acks.try_recv() {
                    batch.push(ack);
                }
                router::settle(&shared, &batch);
            }
            Ok(()) = health.changed() => {
                let frame = FromLeader::Health(shared.relay.wire_health());
                shared.broadcast(&frame);
            }
            _ = sweep.tick() => drop_silent(&shared, silent_limit),
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            polled = &mut poller => {
                // The poller only returns on a store failure: without its
                // journal the leader must not go on.
                tracing::error!("the poller stopped: {polled:?}; stepping down");
                break;
            }
        }
    }
    shared.stop.cancel();
    if !poller.is_finished() {
        let _ = poller.await;
    }
    for conn in shared.registry().conns.values() {
        conn.close.cancel();
    }
    while conns.join_next().await.is_some() {}
    drop(listener);
    // Acknowledgements that came in before the connections closed.
    let mut rest = Vec::new();
    while let Ok(ack) = acks.try_recv() {
        rest.push(ack);
    }
    router::settle(&shared, &rest);
}

/// Drops followers that missed [`HEARTBEAT_MISSES`] heartbeats. Their
/// bindings stay: only live routing authority goes.
fn drop_silent(shared: &Shared, limit: Duration) {
    let registry = shared.registry();
    for (id, conn) in &registry.conns {
        if conn.session.is_some() && conn.last_seen.elapsed() > limit {
            tracing::info!(conn = id, "follower silent for {limit:?}; dropping it");
            conn.close.cancel();
        }
    }
}

/// Only processes of the same user may join the bus.
fn same_user(stream: &Stream) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    match stream.peer_creds() {
        Ok(creds) => creds.euid() == Some(me),
        Err(e) => {
            tracing::warn!("cannot read peer credentials: {e}");
            false
        }
    }
}

async fn serve_connection(shared: Arc<Shared>, stream: Stream) {
    if !same_user(&stream) {
        tracing::warn!("refused a bus connection from another user");
        return;
    }
    let (mut reader, mut writer) = wire::split(stream);
    let (outbox, mut outgoing) = mpsc::channel::<FromLeader>(OUTBOX_FRAMES);
    let close = CancellationToken::new();
    let id = {
        let mut registry = shared.registry();
        registry.next_conn += 1;
        let id = registry.next_conn;
        registry.conns.insert(
            id,
            Conn {
                outbox,
                last_seen: Instant::now(),
                session: None,
                close: close.clone(),
            },
        );
        id
    };
    let writer_close = close.clone();
    let writer_task = tokio::spawn(async move {
        // Whatever queued up meanwhile goes out in one write.
        let mut burst = Vec::with_capacity(WRITE_BURST);
        while outgoing.recv_many(&mut burst, WRITE_BURST).await > 0 {
            if let Err(e) = writer.send_all(&burst).await {
                tracing::debug!("bus write failed: {e}");
                break;
            }
            burst.clear();
        }
        writer_close.cancel();
    });
    let mut requests = JoinSet::new();
    loop {
        let incoming = tokio::select! {
            () = close.cancelled() => break,
            () = shared.stop.cancelled() => break,
            incoming = reader.recv::<ToLeader>() => incoming,
            Some(_) = requests.join_next(), if !requests.is_empty() => continue,
        };
        match incoming {
            Ok(Some(Incoming::Envelope(envelope))) => {
                if let Some(c) = shared.registry().conns.get_mut(&id) {
                    c.last_seen = Instant::now();
                }
                handle(&shared, id, envelope, &mut requests);
            }
            Ok(Some(Incoming::Malformed { id: request, error })) => {
                tracing::debug!(conn = id, "malformed bus frame: {error}");
                shared.send(
                    id,
                    shared.ack_err(request, self::error(BusErrorCode::BadFrame, error)),
                );
            }
            Ok(Some(Incoming::Oversized)) => {
                tracing::warn!(conn = id, "oversized bus frame; closing that connection");
                break;
            }
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(conn = id, "bus read failed: {e}");
                break;
            }
        }
    }
    // Wait for the cancelled requests so none of them writes after we leave.
    requests.shutdown().await;
    let gone = shared.registry().conns.remove(&id);
    if let Some(session) = gone.and_then(|c| c.session) {
        tracing::info!(slot = %session.route.slot, "session left the bus; its binding stays");
    }
    // Dropping the registry entry dropped the outbox sender: the writer
    // drains what is queued (an ack, an error) and ends.
    let _ = tokio::time::timeout(Duration::from_secs(1), writer_task).await;
}

/// Runs one request. Quick ones are answered inline; those that may wait on
/// a lock or on Telegram get a task, so heartbeats keep flowing meanwhile.
fn handle(shared: &Arc<Shared>, conn: ConnId, envelope: ToLeader, requests: &mut JoinSet<()>) {
    match envelope {
        ToLeader::Heartbeat(hb) => {
            let result = registry::check_generation(shared, conn, hb.generation).map(drop);
            shared.send(conn, shared.ack(hb.id, result));
        }
        ToLeader::Status(q) => {
            shared.send(conn, shared.ack(q.id, registry::status(shared)));
        }
        ToLeader::DeliveryAck(ack) => router::delivered(shared, conn, &ack),
        ToLeader::Reconcile(req) => {
            shared.send(
                conn,
                shared.ack(req.id, registry::reconcile(shared, conn, &req)),
            );
        }
        ToLeader::Restart(req) => restart(shared, conn, &req),
        ToLeader::Pair(req) => {
            let shared = shared.clone();
            requests.spawn(async move {
                let result = router::pair(&shared, conn, req.generation).await;
                shared.send(conn, shared.ack(req.id, result));
            });
        }
        ToLeader::Register(req) => {
            let shared = shared.clone();
            requests.spawn(async move {
                let (id, generation) = (req.id, req.registration_generation);
                let result = registry::register(&shared, conn, req).await;
                let registered = result.is_ok();
                shared.send(conn, shared.ack(id, result));
                if registered {
                    shared.send(conn, FromLeader::Health(shared.relay.wire_health()));
                    router::go_live(&shared, conn, generation);
                }
            });
        }
        ToLeader::Disconnect(req) => {
            let shared = shared.clone();
            requests.spawn(async move {
                let result = registry::disconnect(&shared, conn, req.generation).await;
                shared.send(conn, shared.ack(req.id, result));
            });
        }
        ToLeader::Telegram(req) => {
            let shared = shared.clone();
            requests.spawn(async move {
                let result = match registry::check_generation(&shared, conn, req.generation) {
                    Ok(session) => {
                        let result = shared
                            .relay
                            .call_for(session.route.target, &req.method, &req.params)
                            .await;
                        if let Err(BusError {
                            code: BusErrorCode::TopicGone,
                            ..
                        }) = &result
                        {
                            // Its next registration must not trust the topic.
                            registry::mark_stale(&shared, &session.route.profile_key);
                        }
                        result
                    }
                    Err(e) => Err(e),
                };
                shared.send(conn, shared.ack(req.id, result));
            });
        }
    }
}

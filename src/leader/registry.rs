//! Who is on the bus: connections, the registration each carries, the one
//! generation check, and which connection owns which profile. Pure
//! bookkeeping under one mutex: no Telegram, no store, no awaits.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::protocol::bus::*;

/// A connection's id inside this leader.
pub(super) type ConnId = u64;

/// A live session: routing authority for its route.
#[derive(Debug, Clone)]
pub(super) struct Registration {
    /// The key the session asked for; its lock serializes register and
    /// disconnect for every key derived from it.
    pub base_key: String,
    pub instance_id: String,
    pub generation: Generation,
    pub session_name: String,
    pub cwd: String,
    pub pid: u32,
    pub route: Route,
    /// False while its topic is being provisioned and its backlog queued:
    /// it holds its slot and key but gets no new deliveries yet.
    pub ready: bool,
    /// The session's route snapshot agrees with this leader.
    pub reconciled: bool,
}

/// `agent-relay serve` on this connection: the machine's launcher.
#[derive(Debug, Clone)]
pub(super) struct LauncherReg {
    pub generation: Generation,
    pub pid: u32,
    pub engines: Vec<String>,
}

pub(super) struct Conn {
    outbox: mpsc::Sender<FromLeader>,
    pub last_seen: Instant,
    pub opened: Instant,
    /// A frame came: a status query or a member about to register speaks
    /// at once, an idle connection never.
    spoke: bool,
    pub session: Option<Registration>,
    /// Set instead of `session` when `serve` registered here.
    pub launcher: Option<LauncherReg>,
    close: CancellationToken,
}

impl Conn {
    /// Whether anything registered on this connection.
    fn registered(&self) -> bool {
        self.session.is_some() || self.launcher.is_some()
    }

    /// Queues a frame; a follower that does not read is dropped rather than
    /// allowed to stall the leader. False when the frame was not queued.
    pub fn push(&self, id: ConnId, frame: FromLeader) -> bool {
        if self.outbox.try_send(frame).is_ok() {
            return true;
        }
        tracing::warn!(
            conn = id,
            "follower is not reading; dropping its connection"
        );
        self.close.cancel();
        false
    }

    pub fn close(&self) {
        self.close.cancel();
    }
}

/// Every connection and registration of this leader.
///
/// Lock order of the leader (take them in this order, never the reverse):
/// a profile lock (async, held across provisioning) → the cleanup lock
/// (async) → this registry → the store → the router's and access's own
/// small maps. The registry and store locks are never held across an await.
#[derive(Default)]
pub(super) struct Registry {
    conns: Mutex<Conns>,
    /// Serializes register and disconnect per base profile key.
    profile_locks: Mutex<HashMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>>,
    /// The secret each instance registered with, for this leader's life.
    secrets: Mutex<HashMap<String, String>>,
}

#[derive(Default)]
pub(super) struct Conns {
    next: ConnId,
    pub map: HashMap<ConnId, Conn>,
}

impl Conns {
    pub fn live(&self) -> impl Iterator<Item = (ConnId, &Registration)> {
        self.map
            .iter()
            .filter_map(|(id, c)| c.session.as_ref().map(|s| (*id, s)))
    }

    /// The connection whose live session owns `profile_key`.
    pub fn owner_of(&self, profile_key: &str) -> Option<(ConnId, &Registration)> {
        self.live()
            .find(|(_, s)| s.route.profile_key == profile_key)
    }

    /// The registration of `conn`, if `generation` is its current one: the
    /// one generation check of the leader.
    pub fn session(&self, conn: ConnId, generation: Generation) -> Result<&Registration, BusError> {
        let session = self
            .map
            .get(&conn)
            .and_then(|c| c.session.as_ref())
            .ok_or_else(|| {
                BusError::new(
                    BusErrorCode::NotRegistered,
                    "this connection has no registration",
                )
            })?;
        if session.generation != generation {
            return Err(BusError::new(
                BusErrorCode::StaleGeneration,
                format!(
                    "generation {generation} is stale: the current registration is generation {}",
                    session.generation
                ),
            ));
        }
        Ok(session)
    }

    pub fn session_mut(
        &mut self,
        conn: ConnId,
        generation: Generation,
    ) -> Result<&mut Registration, BusError> {
        self.session(conn, generation)?;
        Ok(self
            .map
            .get_mut(&conn)
            .and_then(|c| c.session.as_mut())
            .expect("checked just above"))
    }

    pub fn push(&self, conn: ConnId, frame: FromLeader) -> bool {
        self.map.get(&conn).is_some_and(|c| c.push(conn, frame))
    }

    /// The connection of this machine's `serve`, if it is on the bus.
    pub fn launcher(&self) -> Option<(ConnId, &LauncherReg)> {
        self.map
            .iter()
            .find_map(|(id, c)| c.launcher.as_ref().map(|l| (*id, l)))
    }

    /// The launcher registration of `conn`, if `generation` is its current
    /// one.
    pub fn launcher_of(
        &self,
        conn: ConnId,
        generation: Generation,
    ) -> Result<&LauncherReg, BusError> {
        match self.map.get(&conn).and_then(|c| c.launcher.as_ref()) {
            Some(l) if l.generation == generation => Ok(l),
            Some(l) => Err(BusError::new(
                BusErrorCode::StaleGeneration,
                format!(
                    "generation {generation} is stale: the current registration is generation {}",
                    l.generation
                ),
            )),
            None => Err(BusError::new(
                BusErrorCode::NotRegistered,
                "this connection has no registration",
            )),
        }
    }

    /// Whether `conn` holds a registration (a session's or a launcher's)
    /// at `generation`: what a heartbeat checks.
    pub fn alive(&self, conn: ConnId, generation: Generation) -> Result<(), BusError> {
        if self.map.get(&conn).is_some_and(|c| c.launcher.is_some()) {
            return self.launcher_of(conn, generation).map(drop);
        }
        self.session(conn, generation).map(drop)
    }

    /// An instance that registers again replaces its previous registration
    /// (on another connection, which is closed, or on this one), but only
    /// with a newer generation: an old duplicate must not win.
    pub fn replace_instance(
        &mut self,
        conn: ConnId,
        instance_id: &str,
        generation: Generation,
    ) -> Result<(), BusError> {
        let previous = self
            .live()
            .find(|(_, s)| s.instance_id == instance_id)
            .map(|(id, s)| (id, s.generation));
        let Some((old_conn, old_generation)) = previous else {
            return Ok(());
        };
        if generation <= old_generation {
            return Err(BusError::new(
                BusErrorCode::StaleGeneration,
                format!(
                    "registration generation {generation} is not newer than the live one ({old_generation})"
                ),
            ));
        }
        if let Some(c) = self.map.get_mut(&old_conn) {
            c.session = None;
            if old_conn != conn {
                c.close();
            }
        }
        Ok(())
    }
}

/// Connections that never registered may not pile up: at most this many at
/// once, each for at most [`UNREGISTERED_TIMEOUT`]. When they are all
/// there, a new one closes the oldest that has not said a word yet, so a
/// flood of idle connections never keeps out a status query or a session
/// about to register (both speak at once).
pub(super) const MAX_UNREGISTERED: usize = 32;
pub(super) const UNREGISTERED_TIMEOUT: Duration = Duration::from_secs(5);
/// All connections at once: 26 sessions, their reconnects, status queries.
/// Beyond it new connections are closed at once, so sockets can never eat
/// the descriptors the store and the Telegram client need.
pub(super) const MAX_CONNECTIONS: usize = 128;

impl Registry {
    pub fn lock(&self) -> MutexGuard<'_, Conns> {
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a new connection, or refuses it when there are too many.
    pub fn open(
        &self,
        outbox: mpsc::Sender<FromLeader>,
        close: CancellationToken,
    ) -> Result<ConnId, &'static str> {
        let mut conns = self.lock();
        if conns.map.len() >= MAX_CONNECTIONS {
            return Err("too many bus connections");
        }
        let unregistered = conns.map.values().filter(|c| !c.registered()).count();
        if unregistered >= MAX_UNREGISTERED {
            let oldest_idle = conns
                .map
                .iter()
                .filter(|(_, c)| !c.registered() && !c.spoke)
                .min_by_key(|(_, c)| c.opened)
                .map(|(id, _)| *id);
            let Some(idle) = oldest_idle.and_then(|id| conns.map.remove(&id).map(|c| (id, c)))
            else {
                return Err("too many unregistered bus connections");
            };
            tracing::info!(conn = idle.0, "closing an idle bus connection to make room");
            idle.1.close.cancel();
        }
        conns.next += 1;
        let id = conns.next;
        let now = Instant::now();
        conns.map.insert(
            id,
            Conn {
                outbox,
                last_seen: now,
                opened: now,
                spoke: false,
                session: None,
                launcher: None,
                close,
            },
        );
        Ok(id)
    }

    /// Forgets a closed connection; returns its registration, if any.
    pub fn remove(&self, conn: ConnId) -> Option<Registration> {
        self.lock().map.remove(&conn).and_then(|c| c.session)
    }

    pub fn touch(&self, conn: ConnId) {
        if let Some(c) = self.lock().map.get_mut(&conn) {
            c.last_seen = Instant::now();
            c.spoke = true;
        }
    }

    /// A copy of the registration of `conn` at `generation`.
    pub fn session(&self, conn: ConnId, generation: Generation) -> Result<Registration, BusError> {
        self.lock().session(conn, generation).cloned()
    }

    pub fn send(&self, conn: ConnId, frame: FromLeader) {
        self.lock().push(conn, frame);
    }

    /// Sends to every registered session.
    pub fn broadcast(&self, frame: &FromLeader) {
        let conns = self.lock();
        for (id, c) in &conns.map {
            if c.session.is_some() {
                c.push(*id, frame.clone());
            }
        }
    }

    pub fn close_all(&self) {
        for c in self.lock().map.values() {
            c.close.cancel();
        }
    }

    /// Closes and forgets every connection at once, for a leader whose
    /// loop is gone (it panicked): no task is left to take them out one
    /// by one, and each writer ends only when its queue's sender goes.
    pub fn drop_all(&self) {
        for (_, c) in self.lock().map.drain() {
            c.close.cancel();
        }
    }

    /// Closes sessions that missed every heartbeat for `silent` (their
    /// bindings stay: only live routing authority goes) and connections that
    /// did not register within [`UNREGISTERED_TIMEOUT`].
    pub fn sweep(&self, silent: Duration) {
        let conns = self.lock();
        for (id, c) in &conns.map {
            let expired = if c.registered() {
                c.last_seen.elapsed() > silent
            } else {
                c.opened.elapsed() > UNREGISTERED_TIMEOUT
            };
            if expired && !c.close.is_cancelled() {
                tracing::info!(
                    conn = id,
                    registered = c.registered(),
                    "closing a silent bus connection"
                );
                c.close.cancel();
            }
        }
    }

    /// The lock that serializes register and disconnect for `base_key`.
    pub fn profile_lock(&self, base_key: &str) -> std::sync::Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .profile_locks
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Locks nobody holds or waits for are dropped, so the map stays as
        // small as the set of sessions registering right now.
        locks.retain(|_, lock| std::sync::Arc::strong_count(lock) > 1);
        locks.entry(base_key.to_string()).or_default().clone()
    }

    /// Checks an instance's secret: the first registration of an instance
    /// id at this leader records it, every later one must repeat it.
    pub fn vouch(&self, instance_id: &str, secret: &str) -> Result<(), BusError> {
        if secret.len() < 16 {
            return Err(BusError::new(
                BusErrorCode::BadFrame,
                "an instance secret has at least 16 characters",
            ));
        }
        // Bounded: instances come and go over a long leadership. When full,
        // only the live ones are kept (read before taking the secrets lock).
        let live: Option<std::collections::HashSet<String>> = (self.secrets().len() >= MAX_SECRETS)
            .then(|| {
                self.lock()
                    .live()
                    .map(|(_, s)| s.instance_id.clone())
                    .collect()
            });
        let mut secrets = self.secrets();
        if let Some(live) = live {
            secrets.retain(|id, _| live.contains(id));
        }
        match secrets.get(instance_id) {
            Some(known) if known != secret => Err(BusError::new(
                BusErrorCode::Forbidden,
                "instance id taken: another process registered under it",
            )),
            Some(_) => Ok(()),
            None => {
                secrets.insert(instance_id.to_string(), secret.to_string());
                Ok(())
            }
        }
    }

    fn secrets(&self) -> MutexGuard<'_, HashMap<String, String>> {
        self.secrets.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Instance secrets remembered before the dead ones are forgotten.
const MAX_SECRETS: usize = 4096;

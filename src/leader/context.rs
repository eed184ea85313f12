//! What the leader's flows share ([`Context`]): the store, who is on the
//! bus, Telegram (the outbox and the one way the leader speaks), who may
//! write, and the leader's own identity and life. Every flow is handed it;
//! it owns no flow's state and makes no decision a flow makes.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::access::Access;
use super::cluster::ClusterNode;
use super::errands::Errands;
use super::failure::{Failure, FailureKind, Performed, store_error};
use super::outbox::Outbox;
use super::poller::{PollFacts, PollHealth};
use super::registry::Registry;
use super::speaker::Speaker;
use crate::protocol::bus::*;
use crate::store::{BindingStatus, Store};
use crate::telegram::{ChatKind, Message};

/// What the flows share; see the module docs.
pub(super) struct Context {
    pub epoch: Epoch,
    pub instance_id: String,
    pub since_ms: u64,
    /// The configured chat for topics, if any.
    pub chat_id: Option<i64>,
    store: Arc<Mutex<Store>>,
    /// Connections and registrations.
    pub registry: Registry,
    /// Every Bot API call: made here, or through the machine that polls
    /// when the relay spans machines.
    pub outbox: Arc<Outbox>,
    /// The one way the leader says something of its own.
    pub speaker: Speaker,
    /// The leader's own work off the routing path.
    pub errands: Errands,
    /// Who may drive sessions.
    pub access: Arc<Access>,
    /// This machine in the cluster; `None` for a single machine.
    pub cluster: Option<Arc<ClusterNode>>,
    /// How the poll is doing, for the status line.
    pub health: watch::Sender<PollHealth>,
    pub poll: Arc<Mutex<PollFacts>>,
    /// Cancelled when the leader steps down.
    pub stop: CancellationToken,
}

/// What a [`Context`] is made of.
pub(super) struct Parts {
    pub epoch: Epoch,
    pub instance_id: String,
    pub since_ms: u64,
    pub chat_id: Option<i64>,
    pub store: Store,
    pub outbox: Outbox,
    pub access: Access,
    pub cluster: Option<Arc<ClusterNode>>,
}

impl Context {
    pub fn new(parts: Parts) -> Self {
        let store = Arc::new(Mutex::new(parts.store));
        let outbox = Arc::new(parts.outbox);
        let stop = CancellationToken::new();
        Self {
            epoch: parts.epoch,
            instance_id: parts.instance_id,
            since_ms: parts.since_ms,
            chat_id: parts.chat_id,
            speaker: Speaker::new(outbox.clone(), store.clone()),
            errands: Errands::new(stop.clone()),
            store,
            registry: Registry::default(),
            outbox,
            access: Arc::new(parts.access),
            cluster: parts.cluster,
            health: watch::channel(PollHealth::Starting).0,
            poll: Arc::default(),
            stop,
        }
    }

    /// The store, written by the leader alone; never held across an await.
    pub fn store(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The store itself, for what reads it on a thread of its own (the
    /// triage, a write that waits for the disk).
    pub fn shared_store(&self) -> Arc<Mutex<Store>> {
        self.store.clone()
    }

    /// Whether `message` is in one of the relay's own chats (the private
    /// chat, or the configured group), where its lists may go: they name
    /// local paths.
    pub fn is_ours(&self, message: &Message) -> bool {
        message.chat.kind == ChatKind::Private || Some(message.chat.id) == self.chat_id
    }

    /// Remembers that a session's topic is gone, so its next registration
    /// provisions a new one instead of trusting it.
    pub fn mark_stale(&self, profile_key: &str) {
        if let Err(e) = self
            .store()
            .set_binding_status(profile_key, BindingStatus::Stale)
        {
            tracing::warn!("cannot mark the binding stale: {e}");
        }
    }

    /// Whether `message_id` is one the session of `profile` posted in its
    /// topic: what a session may edit, reply to or close.
    pub fn own_message(
        &self,
        profile: &str,
        target: Target,
        message_id: i64,
    ) -> Result<(), BusError> {
        let owner = self
            .store()
            .message_owner(target.chat_id, message_id)
            .map_err(store_error)?;
        if owner.as_deref() == Some(profile) {
            Ok(())
        } else {
            Err(BusError::new(
                BusErrorCode::Forbidden,
                format!("message {message_id} is not one of this session's"),
            ))
        }
    }

    /// Records what a call in a session's topic did: who posted the
    /// message, or that the topic is gone.
    pub fn record(&self, profile: &str, target: Target, done: Result<&Performed, &Failure>) {
        match done {
            Ok(performed) => {
                if let Some(id) = performed.reply.message_id()
                    && let Err(e) = self.store().record_sent(target.chat_id, id, profile, None)
                {
                    tracing::warn!("cannot remember who posted message {id}: {e}");
                }
            }
            // Its next registration must not trust the topic.
            Err(e) if e.kind == FailureKind::TopicGone => self.mark_stale(profile),
            Err(_) => {}
        }
    }

    /// The poll health as the bus wire states it.
    pub fn wire_health(&self) -> Health {
        match &*self.health.borrow() {
            PollHealth::Starting => Health::Starting,
            PollHealth::Ok => Health::Ok,
            PollHealth::Conflict => Health::Conflict,
            PollHealth::Offline(reason) => Health::Offline {
                reason: reason.clone(),
            },
            PollHealth::Unauthorized => Health::Unauthorized,
            PollHealth::Deaf(pending) => Health::Deaf { pending: *pending },
        }
    }
}

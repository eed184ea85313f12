//! Who is on the bus: registration (slot, profile key, topic), fencing by
//! generation, disconnect, and the status table.

use std::sync::Arc;

use super::{ConnId, Shared, error, now_ms, store_error};
use crate::protocol::bus::*;
use crate::store::{Binding, BindingStatus, NewCleanup};
use crate::telegram::TelegramError;
use crate::topics;

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
    /// False while its topic is being provisioned: it holds its slot and key
    /// but gets no deliveries yet.
    pub ready: bool,
    /// The session's route snapshot agrees with this leader.
    pub reconciled: bool,
}

/// The most routes one instance may claim in a reconcile.
const MAX_ROUTES: usize = Slot::ALL;

/// The registration of `conn` if `generation` is its current one.
pub(super) fn check_generation(
    shared: &Shared,
    conn: ConnId,
    generation: Generation,
) -> Result<Registration, BusError> {
    let registry = shared.registry();
    let session = registry
        .conns
        .get(&conn)
        .and_then(|c| c.session.as_ref())
        .ok_or_else(|| {
            error(
                BusErrorCode::NotRegistered,
                "this connection has no registration",
            )
        })?;
    if session.generation != generation {
        return Err(error(
            BusErrorCode::StaleGeneration,
            format!(
                "generation {generation} is stale: the current registration is generation {}",
                session.generation
            ),
        ));
    }
    Ok(session.clone())
}

/// Registers a session: picks its key and slot, claims them at once (so a
/// concurrent registration cannot take them), then provisions its topic
/// without holding any lock but the profile's.
pub(super) async fn register(
    shared: &Arc<Shared>,
    conn: ConnId,
    req: Register,
) -> Result<Registered, BusError> {
    if req.protocol_version != BUS_PROTOCOL_VERSION {
        return Err(error(
            BusErrorCode::ProtocolVersion,
            format!(
                "bus protocol {} is not supported (the leader speaks {BUS_PROTOCOL_VERSION}); update agent-relay",
                req.protocol_version
            ),
        ));
    }
    let lock = shared.profile_lock(&req.profile_key);
    let _serialized = lock.lock().await;

    let stored = shared.store().bindings().map_err(store_error)?;
    let claimed = claim(shared, conn, &req, &stored)?;
    let binding = stored.iter().find(|b| b.profile_key == claimed.profile_key);

    let provisioned = provision(shared, &req, &claimed, binding).await;
    let result = finish(shared, conn, &req, claimed, binding, provisioned);
    if result.is_err() {
        // Give the slot and key back: the session is not on the bus.
        if let Some(c) = shared.registry().conns.get_mut(&conn)
            && c.session
                .as_ref()
                .is_some_and(|s| s.generation == req.registration_generation)
        {
            c.session = None;
        }
    }
    result
}

/// What [`claim`] reserved.
struct Claim {
    profile_key: String,
    slot: Slot,
    /// The topic the session had, if it is still to be trusted as a hint.
    hint: Option<Target>,
    /// Another stored binding held the slot; it loses it on success.
    reclaimed_from: Option<String>,
}

fn claim(
    shared: &Shared,
    conn: ConnId,
    req: &Register,
    stored: &[Binding],
) -> Result<Claim, BusError> {
    let mut registry = shared.registry();
    if !registry.conns.contains_key(&conn) {
        return Err(error(BusErrorCode::Unavailable, "connection closed"));
    }
    // An instance that registers again replaces its previous registration,
    // but only with a newer generation: an old duplicate must not win.
    let previous = registry
        .live()
        .find(|(_, s)| s.instance_id == req.instance_id)
        .map(|(id, s)| (id, s.generation));
    if let Some((old_conn, old_generation)) = previous {
        if req.registration_generation <= old_generation {
            return Err(error(
                BusErrorCode::StaleGeneration,
                format!(
                    "registration generation {} is not newer than the live one ({old_generation})",
                    req.registration_generation
                ),
            ));
        }
        if let Some(c) = registry.conns.get_mut(&old_conn) {
            c.session = None;
            if old_conn != conn {
                c.close.cancel();
            }
        }
    }

    let profile_key = topics::effective_profile_key(
        &req.profile_key,
        req.carried.as_ref().map(|r| r.profile_key.as_str()),
        |key| registry.owner_of(key).is_some(),
    );
    let binding = stored
        .iter()
        .find(|b| b.profile_key == profile_key && b.status != BindingStatus::Offline);
    let carried = req
        .carried
        .as_ref()
        .filter(|r| r.profile_key == profile_key);
    let preferred = carried.map(|r| r.slot).or(binding.map(|b| b.slot));
    let live_slots: Vec<Slot> = registry.live().map(|(_, s)| s.route.slot).collect();
    let held: Vec<topics::HeldSlot> = stored
        .iter()
        .filter(|b| b.profile_key != profile_key)
        .map(|b| topics::HeldSlot {
            slot: b.slot,
            offline: b.status == BindingStatus::Offline,
            updated_ms: b.updated_ms,
        })
        .collect();
    let slot = topics::allocate_slot(preferred, &live_slots, &held).ok_or_else(|| {
        error(
            BusErrorCode::NoFreeSlot,
            format!("all {} slots are taken by live sessions", Slot::ALL),
        )
    })?;
    // A stored topic is a hint only while it still carries this slot's name.
    let hint = carried
        .filter(|r| r.slot == slot)
        .and_then(|r| r.target)
        .or_else(|| binding.filter(|b| b.slot == slot).and_then(Binding::target));
    let reclaimed_from = stored
        .iter()
        .find(|b| b.slot == slot && b.profile_key != profile_key)
        .map(|b| b.profile_key.clone());
    let c = registry
        .conns
        .get_mut(&conn)
        .ok_or_else(|| error(BusErrorCode::Unavailable, "connection closed"))?;
    c.session = Some(Registration {
        base_key: req.profile_key.clone(),
        instance_id: req.instance_id.clone(),
        generation: req.registration_generation,
        session_name: req.session_name.clone(),
        cwd: req.cwd.clone(),
        pid: req.pid,
        route: Route {
            profile_key: profile_key.clone(),
            slot,
            target: None,
            topic_name: topics::topic_name(slot, &req.session_name),
        },
        ready: false,
        reconciled: false,
    });
    Ok(Claim {
        profile_key,
        slot,
        hint,
        reclaimed_from,
    })
}

/// The outcome of provisioning a session's topic.
enum Provisioned {
    /// The topic to use; `created` when it is new.
    Topic { target: Target, created: bool },
    /// No topic can be had now; the session still joins the bus.
    Without(String),
    /// Creating may have happened or not: never create again blindly.
    CreateUnknown(TelegramError),
}

async fn provision(
    shared: &Shared,
    req: &Register,
    claim: &Claim,
    binding: Option<&Binding>,
) -> Result<Provisioned, BusError> {
    // A predecessor's unfinished deletions come first (see `finish_cleanups`).
    drop(shared.cleanup.lock().await);
    let chat = match shared.relay.topic_chat(&shared.store).await {
        Ok(chat) => chat,
        Err(why) => return Ok(Provisioned::Without(why)),
    };
    if binding.is_some_and(|b| b.status == BindingStatus::CreateUnknown) && !req.retry_provisioning
    {
        return Ok(Provisioned::Without(
            "creating this session's topic may or may not have succeeded; run /telegram-connect to try again".into(),
        ));
    }
    if let Some(target) = claim.hint.filter(|t| t.chat_id == chat) {
        // The same process coming back (a failover) keeps its topic as it
        // is; a new process probes it first.
        let same_process = binding.is_some_and(|b| b.instance_id == req.instance_id)
            || req
                .carried
                .as_ref()
                .is_some_and(|r| r.target == Some(target));
        if same_process && binding.is_some_and(|b| b.status == BindingStatus::Active) {
            return Ok(Provisioned::Topic {
                target,
                created: false,
            });
        }
        match shared.relay.probe(target).await {
            Ok(true) => {
                return Ok(Provisioned::Topic {
                    target,
                    created: false,
                });
            }
            Ok(false) => {
                tracing::info!(
                    thread = target.thread_id,
                    "stored topic is gone; creating a new one"
                );
                mark_stale(shared, &claim.profile_key);
            }
            Err(e) => {
                return Err(error(
                    BusErrorCode::Telegram,
                    format!(
                        "cannot verify topic {} (thread {}): {e}; not creating a duplicate, will retry",
                        claim.slot, target.thread_id
                    ),
                ));
            }
        }
    }
    let name = topics::topic_name(claim.slot, &req.session_name);
    match shared.relay.create_topic(chat, &name).await {
        Ok(target) => Ok(Provisioned::Topic {
            target,
            created: true,
        }),
        Err(e) if e.commit_unknown() => Ok(Provisioned::CreateUnknown(e)),
        Err(e) => Err(error(
            BusErrorCode::Telegram,
            format!("cannot create topic {name:?} in chat {chat}: {e}"),
        )),
    }
}

/// Writes the binding and makes the registration live.
fn finish(
    shared: &Arc<Shared>,
    conn: ConnId,
    req: &Register,
    claim: Claim,
    binding: Option<&Binding>,
    provisioned: Result<Provisioned, BusError>,
) -> Result<Registered, BusError> {
    let (target, status, problem, created) = match provisioned? {
        Provisioned::Topic { target, created } => {
            (Some(target), BindingStatus::Active, None, created)
        }
        Provisioned::Without(why) => (
            None,
            binding.map_or(BindingStatus::Active, |b| b.status),
            Some(why),
            false,
        ),
        Provisioned::CreateUnknown(e) => (
            None,
            BindingStatus::CreateUnknown,
            Some(format!(
                "creating this session's topic may or may not have succeeded ({e}); run /telegram-connect to try again"
            )),
            false,
        ),
    };
    let route = Route {
        profile_key: claim.profile_key.clone(),
        slot: claim.slot,
        target,
        topic_name: topics::topic_name(claim.slot, &req.session_name),
    };
    let now = now_ms();
    let record = Binding {
        profile_key: claim.profile_key.clone(),
        instance_id: req.instance_id.clone(),
        session_name: req.session_name.clone(),
        cwd: req.cwd.clone(),
        chat_id: target.map(|t| t.chat_id),
        thread_id: target.map(|t| t.thread_id),
        slot: claim.slot,
        topic_name: route.topic_name.clone(),
        status,
        announced: !created && binding.is_some_and(|b| b.announced),
        created_ms: binding.map_or(now, |b| b.created_ms),
        updated_ms: now,
    };
    {
        let mut store = shared.store();
        if let Some(holder) = &claim.reclaimed_from {
            tracing::info!(slot = %claim.slot, %holder, "reclaiming a slot from a session that is away");
            store.remove_binding(holder).map_err(store_error)?;
        }
        store.upsert_binding(&record).map_err(store_error)?;
    }
    let mut registry = shared.registry();
    let session = registry
        .conns
        .get_mut(&conn)
        .and_then(|c| c.session.as_mut())
        .filter(|s| s.generation == req.registration_generation)
        .ok_or_else(|| {
            error(
                BusErrorCode::Unavailable,
                "the registration was replaced meanwhile",
            )
        })?;
    // Deliveries start once the session has its answer (`router::go_live`).
    session.route = route.clone();
    drop(registry);
    shared
        .told_offline
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&claim.profile_key);
    if let Some(target) = target
        && !record.announced
    {
        super::router::announce(
            shared,
            target,
            &claim.profile_key,
            &record.topic_name,
            &req.cwd,
        );
    }
    tracing::info!(slot = %claim.slot, profile = %claim.profile_key, "session registered");
    Ok(Registered {
        epoch: shared.epoch,
        route,
        problem,
        needs_pairing: shared.relay.allowed_users(&shared.store).is_empty(),
    })
}

/// Replaces what the leader holds for this instance with its route
/// snapshot: each route is accepted when it is exactly the session's current
/// registration, and rejected with the reason otherwise.
pub(super) fn reconcile(
    shared: &Shared,
    conn: ConnId,
    req: &Reconcile,
) -> Result<Reconciled, BusError> {
    if req.routes.len() > MAX_ROUTES {
        return Err(error(
            BusErrorCode::BadFrame,
            format!(
                "{} routes in one reconcile; at most {MAX_ROUTES}",
                req.routes.len()
            ),
        ));
    }
    if req.observed_epoch > shared.epoch {
        return Err(error(
            BusErrorCode::Unavailable,
            format!(
                "this leader's epoch {} is older than the observed {}",
                shared.epoch, req.observed_epoch
            ),
        ));
    }
    let mut registry = shared.registry();
    let session = registry
        .conns
        .get_mut(&conn)
        .and_then(|c| c.session.as_mut())
        .ok_or_else(|| {
            error(
                BusErrorCode::NotRegistered,
                "this connection has no registration",
            )
        })?;
    if session.generation != req.generation {
        return Err(error(
            BusErrorCode::StaleGeneration,
            format!("generation {} is stale", req.generation),
        ));
    }
    let mut accepted = Vec::new();
    let mut rejected = Vec::new();
    for route in &req.routes {
        let own = &session.route;
        let reason = if route.profile_key != own.profile_key {
            Some("unknown: this session does not own that route".to_string())
        } else if route.slot != own.slot {
            Some(format!("moved: the slot is {} now", own.slot))
        } else if route.target != own.target {
            Some("moved: the topic changed".to_string())
        } else {
            None
        };
        match reason {
            None => accepted.push(route.profile_key.clone()),
            Some(reason) => rejected.push(RejectedRoute {
                key: route.profile_key.clone(),
                reason,
            }),
        }
    }
    session.reconciled = accepted.contains(&session.route.profile_key);
    Ok(Reconciled {
        epoch: shared.epoch,
        accepted,
        rejected,
    })
}

/// Remembers that a session's topic is gone, so the next registration
/// provisions a new one instead of trusting it.
pub(super) fn mark_stale(shared: &Shared, profile_key: &str) {
    if let Err(e) = shared
        .store()
        .set_binding_status(profile_key, BindingStatus::Stale)
    {
        tracing::warn!("cannot mark the binding stale: {e}");
    }
}

/// Deletes the session's topic, marks its binding offline and ends its
/// registration — in that order, and only when Telegram confirmed.
pub(super) async fn disconnect(
    shared: &Shared,
    conn: ConnId,
    generation: Generation,
) -> Result<Disconnected, BusError> {
    let base_key = check_generation(shared, conn, generation)?.base_key;
    let lock = shared.profile_lock(&base_key);
    let _serialized = lock.lock().await;
    // Checked again under the profile lock: a re-register may have won.
    let session = check_generation(shared, conn, generation)?;
    if session.instance_id == shared.instance_id {
        return disconnect_leader(shared, conn, session).await;
    }
    if let Some(target) = session.route.target {
        let deleted = shared
            .relay
            .call(
                "deleteForumTopic",
                &serde_json::json!({"chat_id": target.chat_id, "message_thread_id": target.thread_id}),
            )
            .await;
        match deleted {
            Ok(_) | Err(TelegramError::ThreadGone { .. }) => {}
            Err(e) => {
                return Err(error(
                    BusErrorCode::Telegram,
                    format!("topic deletion not confirmed: {e}"),
                ));
            }
        }
    }
    set_offline(shared, conn, &session)?;
    tracing::info!(slot = %session.route.slot, "session disconnected; its topic is deleted");
    Ok(Disconnected {
        deleted: session.route.target,
        cleanup_pending: false,
    })
}

/// The binding goes offline (its topic deleted or about to be) and the
/// registration ends.
fn set_offline(shared: &Shared, conn: ConnId, session: &Registration) -> Result<(), BusError> {
    {
        let mut store = shared.store();
        match store
            .binding(&session.route.profile_key)
            .map_err(store_error)?
        {
            Some(mut binding) => {
                binding.status = BindingStatus::Offline;
                binding.chat_id = None;
                binding.thread_id = None;
                store.upsert_binding(&binding).map_err(store_error)?;
            }
            None => tracing::warn!("disconnecting a session without a stored binding"),
        }
    }
    if let Some(c) = shared.registry().conns.get_mut(&conn) {
        c.session = None;
    }
    Ok(())
}

/// The leader's own session leaves: it is about to hand leadership over
/// whatever Telegram says, so the deletion is written down first as a
/// cleanup intent that its successor finishes if this attempt fails.
async fn disconnect_leader(
    shared: &Shared,
    conn: ConnId,
    session: Registration,
) -> Result<Disconnected, BusError> {
    let mut deleted = None;
    if let Some(target) = session.route.target {
        let intent = shared
            .store()
            .add_cleanup(&NewCleanup {
                chat_id: target.chat_id,
                thread_id: target.thread_id,
                profile_key: session.route.profile_key.clone(),
                reason: "the leader's session disconnected".into(),
            })
            .map_err(store_error)?;
        let result = shared
            .relay
            .call(
                "deleteForumTopic",
                &serde_json::json!({"chat_id": target.chat_id, "message_thread_id": target.thread_id}),
            )
            .await;
        let mut store = shared.store();
        match result {
            Ok(_) | Err(TelegramError::ThreadGone { .. }) => {
                store.finish_cleanup(intent).map_err(store_error)?;
                deleted = Some(target);
            }
            Err(e) => {
                tracing::warn!("topic deletion not confirmed; the next leader finishes it: {e}");
                store.record_cleanup_attempt(intent).map_err(store_error)?;
            }
        }
    }
    set_offline(shared, conn, &session)?;
    Ok(Disconnected {
        cleanup_pending: deleted.is_none() && session.route.target.is_some(),
        deleted,
    })
}

pub(super) fn status(shared: &Shared) -> Result<BusStatus, BusError> {
    let stored = shared.store().bindings().map_err(store_error)?;
    let registry = shared.registry();
    let mut sessions: Vec<SessionStatus> = registry
        .conns
        .values()
        .filter_map(|c| c.session.as_ref().map(|s| (c, s)))
        .map(|(c, s)| SessionStatus {
            slot: s.route.slot,
            topic_name: s.route.topic_name.clone(),
            target: s.route.target,
            profile_key: s.route.profile_key.clone(),
            session_name: s.session_name.clone(),
            cwd: s.cwd.clone(),
            pid: s.pid,
            instance_id: s.instance_id.clone(),
            heartbeat_age_ms: c.last_seen.elapsed().as_millis() as u64,
            live: true,
            reconciled: s.reconciled,
        })
        .collect();
    for b in stored {
        let live = sessions.iter().any(|s| s.profile_key == b.profile_key);
        if !live && b.status != BindingStatus::Offline {
            sessions.push(SessionStatus {
                slot: b.slot,
                topic_name: b.topic_name.clone(),
                target: b.target(),
                profile_key: b.profile_key,
                session_name: b.session_name,
                cwd: b.cwd,
                pid: 0,
                instance_id: b.instance_id,
                heartbeat_age_ms: now_ms().saturating_sub(b.updated_ms),
                live: false,
                reconciled: false,
            });
        }
    }
    sessions.sort_by_key(|s| (s.slot, !s.live));
    Ok(BusStatus {
        epoch: shared.epoch,
        leader_pid: std::process::id(),
        leader_instance: shared.instance_id.clone(),
        leader_since_ms: shared.since_ms,
        sessions,
    })
}

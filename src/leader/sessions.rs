//! What a session asks of the leader: to register (a key, a slot, a topic),
//! to reconcile its route, to act in its topic, to disconnect, and the
//! status table. These flows combine the owners — registry, store, outbox,
//! router — in one place each.

use std::sync::Arc;

use super::cluster::SlotClaim;
use super::registry::{ConnId, Registration};
use super::{Leader, now_ms, store_error};
use crate::protocol::bus::*;
use crate::render;
use crate::store::{Binding, BindingStatus, NewCleanup};
use crate::telegram::{Priority, TOPICS_SWITCH, TelegramError};
use crate::topics;

/// The most routes one instance may claim in a reconcile.
const MAX_ROUTES: usize = Slot::ALL;

/// What [`Leader::claim`] reserved.
struct Claim {
    profile_key: String,
    slot: Slot,
    /// The topic the session had, if it is still to be trusted as a hint.
    hint: Option<Target>,
    /// Another stored binding held the slot; it loses it on success.
    reclaimed_from: Option<Binding>,
}

/// The outcome of provisioning a session's topic.
enum Provisioned {
    /// The topic to use; `created` when it is new.
    Topic { target: Target, created: bool },
    /// No topic can be had now; the session still joins the bus.
    Without(String),
    /// No topic until the user fixes something; nothing is retried by
    /// itself, so a dead topic or a refused right is not asked again and
    /// again.
    Blocked(Blocker, String),
    /// Creating may have happened or not: never create again blindly.
    CreateUnknown(TelegramError),
}

impl Leader {
    /// Registers a session: picks its key and slot, claims them at once (so a
    /// concurrent registration cannot take them), then provisions its topic
    /// without holding any lock but the profile's.
    pub(super) async fn register(
        self: &Arc<Self>,
        conn: ConnId,
        req: Register,
    ) -> Result<Registered, BusError> {
        if req.protocol_version != BUS_PROTOCOL_VERSION {
            return Err(BusError::new(
                BusErrorCode::ProtocolVersion,
                format!(
                    "bus protocol {} is not supported (the leader speaks {BUS_PROTOCOL_VERSION}); update agent-relay",
                    req.protocol_version
                ),
            ));
        }
        self.registry
            .vouch(&req.instance_id, &req.instance_secret)?;
        let lock = self.registry.profile_lock(&req.profile_key);
        let _serialized = lock.lock().await;

        let stored = self.store().bindings().map_err(store_error)?;
        // Across machines, a slot is claimed bot-wide once it is reserved
        // here; one another machine took meanwhile is picked again.
        let mut foreign = self.foreign_slots().await;
        let (claimed, cut_off) = loop {
            let claimed = self.claim(conn, &req, &stored, &foreign)?;
            match self.claim_slot(claimed.slot, &claimed.profile_key).await {
                SlotClaim::Held => break (claimed, None),
                // Never picked again: at most 26 rounds, then `noFreeSlot`.
                SlotClaim::Taken => {
                    self.unclaim(conn, req.registration_generation);
                    foreign.push(claimed.slot);
                }
                SlotClaim::Unreachable(why) => break (claimed, Some(why)),
            }
        };
        let binding = stored.iter().find(|b| b.profile_key == claimed.profile_key);

        let provisioned = match cut_off {
            // Without the cluster only a session that keeps its slot and
            // topic gets one: nothing new may be claimed.
            Some(why) if claimed.hint.is_none() => Ok(Provisioned::Without(format!(
                "{why}; this session joins without a topic until the cluster is back"
            ))),
            _ => self.provision(&req, &claimed, binding).await,
        };
        if let Ok(Provisioned::Topic { target, .. }) = &provisioned {
            self.claim_topic(*target, &claimed.profile_key).await;
        }
        let result = self.finish(conn, &req, claimed, binding, provisioned);
        if let (Ok(registered), Some(left)) = (&result, &req.left)
            && left.profile_key != registered.route.profile_key
        {
            let leader = self.clone();
            let (left, instance) = (left.clone(), req.instance_id.clone());
            let now = registered.route.topic_name.clone();
            tokio::spawn(async move { leader.close_left(&left, &instance, &now).await });
        }
        if result.is_err() {
            // Give the slot and key back: the session is not on the bus.
            self.unclaim(conn, req.registration_generation);
        }
        result
    }

    /// Gives back what [`Leader::claim`] reserved for this registration.
    fn unclaim(&self, conn: ConnId, generation: Generation) {
        if let Some(c) = self.registry.lock().map.get_mut(&conn)
            && c.session
                .as_ref()
                .is_some_and(|s| s.generation == generation)
        {
            c.session = None;
        }
    }

    /// Reserves a key and a slot for a registration. `foreign` are the
    /// slots other machines hold: never picked.
    fn claim(
        &self,
        conn: ConnId,
        req: &Register,
        stored: &[Binding],
        foreign: &[Slot],
    ) -> Result<Claim, BusError> {
        let mut conns = self.registry.lock();
        if !conns.map.contains_key(&conn) {
            return Err(BusError::new(
                BusErrorCode::Unavailable,
                "connection closed",
            ));
        }
        // An instance that registers again replaces its previous registration,
        // but only with a newer generation: an old duplicate must not win.
        let previous = conns
            .live()
            .find(|(_, s)| s.instance_id == req.instance_id)
            .map(|(id, s)| (id, s.generation));
        if let Some((old_conn, old_generation)) = previous {
            if req.registration_generation <= old_generation {
                return Err(BusError::new(
                    BusErrorCode::StaleGeneration,
                    format!(
                        "registration generation {} is not newer than the live one ({old_generation})",
                        req.registration_generation
                    ),
                ));
            }
            if let Some(c) = conns.map.get_mut(&old_conn) {
                c.session = None;
                if old_conn != conn {
                    c.close();
                }
            }
        }

        let profile_key = topics::effective_profile_key(
            &req.profile_key,
            req.carried.as_ref().map(|r| r.profile_key.as_str()),
            |key| conns.owner_of(key).is_some(),
        );
        let binding = stored
            .iter()
            .find(|b| b.profile_key == profile_key && b.status != BindingStatus::Offline);
        let carried = req
            .carried
            .as_ref()
            .filter(|r| r.profile_key == profile_key);
        let preferred = carried.map(|r| r.slot).or(binding.map(|b| b.slot));
        let live_slots: Vec<Slot> = conns
            .live()
            .map(|(_, s)| s.route.slot)
            .chain(foreign.iter().copied())
            .collect();
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
            BusError::new(
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
            .cloned();
        let c = conns
            .map
            .get_mut(&conn)
            .ok_or_else(|| BusError::new(BusErrorCode::Unavailable, "connection closed"))?;
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
                topic_name: self.topic_name(slot, &req.session_name),
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

    async fn provision(
        &self,
        req: &Register,
        claim: &Claim,
        binding: Option<&Binding>,
    ) -> Result<Provisioned, BusError> {
        // A predecessor's unfinished deletions come first (see `finish_cleanups`).
        drop(self.cleanup.lock().await);
        let chat = match self.topic_chat().await {
            Ok(chat) => chat,
            Err(Ok(blocked)) => return Ok(blocked),
            Err(Err(why)) => return Ok(Provisioned::Without(why)),
        };
        if binding.is_some_and(|b| b.status == BindingStatus::CreateUnknown)
            && !req.retry_provisioning
        {
            return Ok(Provisioned::Without(
                "creating this session's topic may or may not have succeeded; run /telegram-connect to try again".into(),
            ));
        }
        // A topic Telegram said is gone is not asked about again.
        let known_gone = |t: &Target| {
            binding.is_some_and(|b| b.status == BindingStatus::Stale && b.target() == Some(*t))
        };
        if let Some(target) = claim.hint.filter(|t| t.chat_id == chat && !known_gone(t))
            && self.topic_is_ours(target).await
        {
            // Its host switched back to it (`/resume`): open it again.
            if binding.is_some_and(|b| b.closed && b.target() == Some(target)) {
                match self.outbox.reopen_topic(target).await {
                    Ok(()) => {
                        return Ok(Provisioned::Topic {
                            target,
                            created: false,
                        });
                    }
                    Err(TelegramError::ThreadGone { .. }) => self.mark_stale(&claim.profile_key),
                    Err(e) => {
                        if let Some(blocked) = blocked(&e, chat) {
                            return Ok(blocked);
                        }
                        return Err(BusError::new(
                            BusErrorCode::Telegram,
                            format!("cannot reopen topic {}: {e}; will retry", claim.slot),
                        ));
                    }
                }
            }
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
            match self.outbox.probe(target).await {
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
                    self.mark_stale(&claim.profile_key);
                }
                Err(e) => {
                    if let Some(blocked) = blocked(&e, chat) {
                        return Ok(blocked);
                    }
                    return Err(BusError::new(
                        BusErrorCode::Telegram,
                        format!(
                            "cannot verify topic {} (thread {}): {e}; not creating a duplicate, will retry",
                            claim.slot, target.thread_id
                        ),
                    ));
                }
            }
        }
        let name = self.topic_name(claim.slot, &req.session_name);
        match self.outbox.create_topic(chat, &name).await {
            Ok(target) => Ok(Provisioned::Topic {
                target,
                created: true,
            }),
            Err(e) if e.commit_unknown() => Ok(Provisioned::CreateUnknown(e)),
            Err(e) => match blocked(&e, chat) {
                Some(blocked) => Ok(blocked),
                None => Err(BusError::new(
                    BusErrorCode::Telegram,
                    format!("cannot create topic {name:?} in chat {chat}: {e}"),
                )),
            },
        }
    }

    /// The chat that holds the topics: the configured one, else the private
    /// chat with the paired user when the bot has topics enabled there.
    /// The error is what to provision instead: blocked, or without a topic
    /// for now.
    async fn topic_chat(&self) -> Result<i64, Result<Provisioned, String>> {
        if let Some(chat) = self.chat_id {
            return Ok(chat);
        }
        let Some(user) = self.access.owner() else {
            return Err(Err("no chat configured and nobody paired: set chat_id or run /telegram-connect to pair".into()));
        };
        match self.outbox.bot().await {
            Ok(bot) if bot.has_topics_enabled => Ok(user),
            Ok(_) => Err(Ok(Provisioned::Blocked(
                Blocker::NotAForum,
                format!(
                    "no chat_id configured, and the bot has no topics in private chats: {TOPICS_SWITCH}, or set chat_id to a forum supergroup"
                ),
            ))),
            Err(e) => {
                Err(blocked(&e, user)
                    .ok_or_else(|| format!("cannot ask Telegram about the bot: {e}")))
            }
        }
    }

    /// Writes the binding and makes the registration live.
    fn finish(
        self: &Arc<Self>,
        conn: ConnId,
        req: &Register,
        claim: Claim,
        binding: Option<&Binding>,
        provisioned: Result<Provisioned, BusError>,
    ) -> Result<Registered, BusError> {
        let mut blocker = None;
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
            Provisioned::Blocked(why, text) => {
                tracing::warn!(profile = %claim.profile_key, "no topic until the user acts: {text}");
                blocker = Some(why);
                (
                    None,
                    binding.map_or(BindingStatus::Active, |b| b.status),
                    Some(text),
                    false,
                )
            }
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
            topic_name: self.topic_name(claim.slot, &req.session_name),
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
            // Registered again: open (reopened above if it was closed).
            closed: target.is_none() && binding.is_some_and(|b| b.closed),
            created_ms: binding.map_or(now, |b| b.created_ms),
            updated_ms: now,
        };
        let mut orphaned = None;
        {
            let mut store = self.store();
            if let Some(holder) = &claim.reclaimed_from {
                tracing::info!(slot = %claim.slot, holder = %holder.profile_key, "reclaiming a slot from a session that is away");
                let left_behind = store
                    .pending_for(&holder.profile_key)
                    .map_err(store_error)?;
                let had_topic = holder.target().is_some();
                store
                    .remove_binding(&holder.profile_key)
                    .map_err(store_error)?;
                orphaned = Some((left_behind, had_topic));
            }
            store.upsert_binding(&record).map_err(store_error)?;
        }
        if let Some((left_behind, had_topic)) = orphaned {
            // Its messages have nobody to go to any more.
            self.give_up(
                left_behind.into_iter().map(|e| e.update).collect(),
                &format!(
                    "its session was away so long that its slot went to {}",
                    record.topic_name
                ),
                had_topic,
            );
        }
        // Deliveries start once the session has its answer (`go_live`).
        self.registry
            .lock()
            .session_mut(conn, req.registration_generation)
            .map_err(|_| {
                BusError::new(
                    BusErrorCode::Unavailable,
                    "the registration was replaced meanwhile",
                )
            })?
            .route = route.clone();
        if let Some(holder) = &claim.reclaimed_from {
            // Its slot is this session's now; its topic nobody's.
            self.release_claims(&holder.profile_key, None, holder.target());
        }
        self.router.back(&claim.profile_key);
        if let Some(target) = target
            && !record.announced
        {
            self.announce(target, &claim.profile_key, &record.topic_name, &req.cwd);
        }
        tracing::info!(slot = %claim.slot, profile = %claim.profile_key, "session registered");
        Ok(Registered {
            epoch: self.epoch,
            route,
            problem,
            needs_pairing: self.access.needs_pairing(),
            blocker,
        })
    }

    /// Closes the topic of the session an instance switched away from (its
    /// host's `/new` or `/resume`), saying where it went: the session is
    /// not gone, and its topic opens again when it is resumed. Only the
    /// instance that held the topic may close it, and only while nobody
    /// else has taken the session up.
    async fn close_left(&self, left: &Route, instance: &str, now: &str) {
        let Some(target) = left.target else { return };
        let binding = match self.store().binding(&left.profile_key) {
            Ok(Some(b)) => b,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!("cannot read the binding to close: {e}");
                return;
            }
        };
        let ours = binding.instance_id == instance
            && binding.target() == Some(target)
            && binding.status == BindingStatus::Active
            && !binding.closed;
        if !ours || self.registry.lock().owner_of(&left.profile_key).is_some() {
            return;
        }
        let text = format!(
            "⏸ Switched to another session: {now}. This topic is closed until this session is resumed; what you write here waits for it."
        );
        if let Err(e) = self
            .outbox
            .say(target.chat_id, Some(target.thread_id), &text)
            .await
        {
            tracing::warn!("cannot say where the session went: {e}");
        }
        match self.outbox.close_topic(target).await {
            Ok(()) => {
                if let Err(e) = self.store().set_topic_closed(&left.profile_key, true) {
                    tracing::warn!("cannot remember the topic is closed: {e}");
                }
                tracing::info!(profile = %left.profile_key, "closed the topic of a session its host left");
            }
            Err(e) => tracing::warn!("cannot close the topic of a session its host left: {e}"),
        }
    }

    /// Posts the "connected" notice in a topic that was just bound.
    fn announce(self: &Arc<Self>, target: Target, profile_key: &str, topic_name: &str, cwd: &str) {
        let leader = self.clone();
        let profile_key = profile_key.to_string();
        let text = format!("🟢 {topic_name} connected\n{cwd}");
        tokio::spawn(async move {
            match leader
                .outbox
                .say(target.chat_id, Some(target.thread_id), &text)
                .await
            {
                Ok(()) => {
                    let mut store = leader.store();
                    let marked = store.binding(&profile_key).and_then(|b| match b {
                        Some(mut b) if b.target() == Some(target) => {
                            b.announced = true;
                            store.upsert_binding(&b)
                        }
                        _ => Ok(()),
                    });
                    if let Err(e) = marked {
                        tracing::warn!("cannot remember the topic was announced: {e}");
                    }
                }
                Err(e) => tracing::warn!("cannot post the connected notice: {e}"),
            }
        });
    }

    /// Replaces what the leader holds for this instance with its route
    /// snapshot: each route is accepted when it is exactly the session's
    /// current registration, and rejected with the reason otherwise.
    pub(super) fn reconcile(&self, conn: ConnId, req: &Reconcile) -> Result<Reconciled, BusError> {
        if req.routes.len() > MAX_ROUTES {
            return Err(BusError::new(
                BusErrorCode::BadFrame,
                format!(
                    "{} routes in one reconcile; at most {MAX_ROUTES}",
                    req.routes.len()
                ),
            ));
        }
        if req.observed_epoch > self.epoch {
            return Err(BusError::new(
                BusErrorCode::Unavailable,
                format!(
                    "this leader's epoch {} is older than the observed {}",
                    self.epoch, req.observed_epoch
                ),
            ));
        }
        let mut conns = self.registry.lock();
        let session = conns.session_mut(conn, req.generation)?;
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
            epoch: self.epoch,
            accepted,
            rejected,
        })
    }

    /// Does what a session asked in its own topic. The target comes from its
    /// registration; a message to edit must be one it posted, a tap to
    /// answer one it was handed.
    pub(super) async fn topic(
        &self,
        conn: ConnId,
        req: &TopicRequest,
    ) -> Result<TopicDone, BusError> {
        let session = self.registry.session(conn, req.generation)?;
        let profile = &session.route.profile_key;
        let target = session
            .route
            .target
            .ok_or_else(|| BusError::new(BusErrorCode::NoTopic, "this session has no topic yet"))?;
        let own_message = |message_id: i64| -> Result<(), BusError> {
            let owner = self
                .store()
                .message_owner(target.chat_id, message_id)
                .map_err(store_error)?;
            if owner.as_deref() == Some(profile.as_str()) {
                Ok(())
            } else {
                Err(BusError::new(
                    BusErrorCode::Forbidden,
                    format!("message {message_id} is not one of this session's"),
                ))
            }
        };
        match &req.op {
            TopicOp::SendText(send) => {
                if let Some(reply_to) = send.reply_to {
                    own_message(reply_to)?;
                }
            }
            TopicOp::EditText(edit) => own_message(edit.message_id)?,
            TopicOp::EditButtons(edit) => own_message(edit.message_id)?,
            TopicOp::Typing => {}
            TopicOp::SendFile(send) => {
                let done = self.send_file(&session.cwd, target, send).await;
                self.after_send(profile, target, &done);
                return done;
            }
            TopicOp::Ask(ask) => return self.ask(profile, target, ask).await,
            TopicOp::AwaitAnswer(wait) => {
                if !self.asks.knows(&wait.token) {
                    // Asked of a predecessor: adopt it, if the message is ours.
                    own_message(wait.message_id)?;
                    self.asks
                        .insert(profile, target, wait.message_id, wait.ask.clone());
                }
                let answer = self.asks.wait(&wait.token, profile)?;
                return match answer.await {
                    Ok(Ok(answer)) => Ok(TopicDone {
                        answer: Some(answer),
                        ..TopicDone::default()
                    }),
                    Ok(Err(e)) => Err(e),
                    Err(_) => Err(BusError::new(
                        BusErrorCode::Unavailable,
                        "the leader is stepping down",
                    )),
                };
            }
            TopicOp::CloseAsk(close) => {
                let closed = if self.asks.knows(&close.token) {
                    self.asks.close(&close.token, profile, &close.outcome)?
                } else {
                    own_message(close.message_id)?;
                    Ok((target, close.message_id, String::new()))
                };
                return match closed {
                    Err(answer) => Ok(TopicDone {
                        answer: Some(answer),
                        ..TopicDone::default()
                    }),
                    Ok((target, message_id, text)) => {
                        self.settle_ask(target, message_id, &text, &render::escape(&close.outcome))
                            .await;
                        Ok(TopicDone::default())
                    }
                };
            }
        }
        // What a person waits for goes first; an edit after; what a later
        // request supersedes never waits.
        let priority = match &req.op {
            _ if req.background => Priority::Background,
            TopicOp::SendText(_) => Priority::High,
            _ => Priority::Normal,
        };
        let waiting = |wait: std::time::Duration| {
            self.registry.send(
                conn,
                FromLeader::Paced(Paced {
                    id: req.id,
                    wait_ms: wait.as_millis() as u64,
                }),
            );
        };
        let done = self
            .outbox
            .perform(target, &req.op, priority, waiting)
            .await;
        self.after_send(profile, target, &done);
        done
    }

    /// Records what a send did: who posted the message, or that the topic
    /// is gone.
    fn after_send(&self, profile: &str, target: Target, done: &Result<TopicDone, BusError>) {
        match done {
            Ok(TopicDone {
                message_id: Some(id),
                ..
            }) => {
                if let Err(e) = self.store().record_sent(target.chat_id, *id, profile, None) {
                    tracing::warn!("cannot remember who posted message {id}: {e}");
                }
            }
            Err(e) if e.code == BusErrorCode::TopicGone => {
                // Its next registration must not trust the topic.
                self.mark_stale(profile);
            }
            _ => {}
        }
    }

    /// Posts a question with its buttons and opens it; asked again with the
    /// same token (the asker lost its leader while posting), it finds the
    /// message instead of posting another.
    async fn ask(&self, profile: &str, target: Target, ask: &Ask) -> Result<TopicDone, BusError> {
        let buttons = self.asks.buttons(ask)?;
        let posted = self.store().asked(&ask.token).map_err(store_error)?;
        if let Some((chat_id, message_id, owner)) = posted {
            if owner != profile || chat_id != target.chat_id {
                return Err(BusError::new(
                    BusErrorCode::Forbidden,
                    "that token is another question's",
                ));
            }
            self.asks.insert(profile, target, message_id, ask.clone());
            return Ok(TopicDone {
                message_id: Some(message_id),
                ..TopicDone::default()
            });
        }
        let send = TopicOp::SendText(SendText {
            text: ask.text.clone(),
            format: TextFormat::Html,
            buttons: Some(buttons),
            reply_to: None,
        });
        let done = self
            .outbox
            .perform(target, &send, Priority::High, |_| {})
            .await;
        if let Err(e) = &done
            && e.code == BusErrorCode::TopicGone
        {
            self.mark_stale(profile);
        }
        let done = done?;
        let message_id = done.message_id.ok_or_else(|| {
            BusError::new(
                BusErrorCode::Internal,
                "the question was posted without an id",
            )
        })?;
        if let Err(e) =
            self.store()
                .record_sent(target.chat_id, message_id, profile, Some(&ask.token))
        {
            tracing::warn!("cannot remember who asked message {message_id}: {e}");
        }
        self.asks.insert(profile, target, message_id, ask.clone());
        Ok(done)
    }

    /// Shows how a question ended (`outcome`, HTML) under its text and
    /// takes its buttons away. Best effort: the decision stands either way.
    pub(super) async fn settle_ask(
        &self,
        target: Target,
        message_id: i64,
        text: &str,
        outcome: &str,
    ) {
        let edit = TopicOp::EditText(EditText {
            message_id,
            text: if text.is_empty() {
                outcome.to_string()
            } else {
                format!("{text}\n\n{outcome}")
            },
            format: TextFormat::Html,
            buttons: None,
        });
        if let Err(e) = self
            .outbox
            .perform(target, &edit, Priority::Normal, |_| {})
            .await
        {
            tracing::warn!(message_id, "cannot show how a question ended: {e}");
        }
    }

    /// Remembers that a session's topic is gone, so the next registration
    /// provisions a new one instead of trusting it.
    pub(super) fn mark_stale(&self, profile_key: &str) {
        if let Err(e) = self
            .store()
            .set_binding_status(profile_key, BindingStatus::Stale)
        {
            tracing::warn!("cannot mark the binding stale: {e}");
        }
    }

    /// Deletes the session's topic, marks its binding offline and ends its
    /// registration — in that order, and only when Telegram confirmed. The
    /// leader's own session writes a cleanup intent first: it hands
    /// leadership over whatever Telegram says, and its successor finishes a
    /// deletion this attempt could not confirm.
    pub(super) async fn disconnect(
        self: &Arc<Self>,
        conn: ConnId,
        generation: Generation,
    ) -> Result<Disconnected, BusError> {
        let base_key = self.registry.session(conn, generation)?.base_key;
        let lock = self.registry.profile_lock(&base_key);
        let _serialized = lock.lock().await;
        // Checked again under the profile lock: a re-register may have won.
        let session = self.registry.session(conn, generation)?;
        let leaving_leader = session.instance_id == self.instance_id;
        let mut deleted = None;
        let mut cleanup_pending = false;
        if let Some(target) = session.route.target {
            let intent = if leaving_leader {
                Some(
                    self.store()
                        .add_cleanup(&NewCleanup {
                            chat_id: target.chat_id,
                            thread_id: target.thread_id,
                            profile_key: session.route.profile_key.clone(),
                            reason: "the leader's session disconnected".into(),
                        })
                        .map_err(store_error)?,
                )
            } else {
                None
            };
            match (self.outbox.delete_topic(target).await, intent) {
                (Ok(()), intent) => {
                    if let Some(intent) = intent {
                        self.store().finish_cleanup(intent).map_err(store_error)?;
                    }
                    deleted = Some(target);
                }
                (Err(e), Some(intent)) => {
                    tracing::warn!(
                        "topic deletion not confirmed; the next leader finishes it: {e}"
                    );
                    self.store()
                        .record_cleanup_attempt(intent)
                        .map_err(store_error)?;
                    cleanup_pending = true;
                }
                (Err(e), None) => {
                    return Err(BusError::new(
                        BusErrorCode::Telegram,
                        format!("topic deletion not confirmed: {e}"),
                    ));
                }
            }
        }
        self.set_offline(conn, &session)?;
        self.release_claims(
            &session.route.profile_key,
            Some(session.route.slot),
            session.route.target,
        );
        tracing::info!(slot = %session.route.slot, "session disconnected; its topic is deleted");
        // What it had not taken yet has nobody to go to any more; its
        // topic is gone, so the chat is told outside the topics — before
        // answering, since a leader whose own session this was steps down
        // next, and a reply still on its way would go with it.
        let pending = self.store().pending_for(&session.route.profile_key);
        match pending {
            Ok(pending) => {
                self.give_up_now(
                    pending.into_iter().map(|e| e.update).collect(),
                    &format!("{} was disconnected", session.route.topic_name),
                    deleted.is_none() && !cleanup_pending,
                )
                .await;
            }
            Err(e) => tracing::error!("cannot read what the session left behind: {e}"),
        }
        Ok(Disconnected {
            deleted,
            cleanup_pending,
        })
    }

    /// The binding goes offline (its topic deleted or about to be) and the
    /// registration ends.
    fn set_offline(&self, conn: ConnId, session: &Registration) -> Result<(), BusError> {
        {
            let mut store = self.store();
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
        if let Some(c) = self.registry.lock().map.get_mut(&conn) {
            c.session = None;
        }
        Ok(())
    }

    /// A one-time pairing link for `/telegram-connect`, only while nobody
    /// may drive sessions: a paired relay never hands out another code.
    pub(super) async fn pair(
        &self,
        conn: ConnId,
        generation: Generation,
    ) -> Result<PairingLink, BusError> {
        self.registry.session(conn, generation)?;
        if self.cluster.is_some() {
            // The machine that polls would get the link's code, and each
            // machine keeps its own users: a pairing made here would reach
            // one machine at most.
            return Err(BusError::new(
                BusErrorCode::Forbidden,
                "this relay spans machines: put your Telegram user id in allowed_users in config.toml on every machine (agent-relay setup writes it)",
            ));
        }
        if !self.access.needs_pairing() {
            return Err(BusError::new(
                BusErrorCode::Forbidden,
                "somebody is paired already; add more users with allowed_users in config.toml",
            ));
        }
        let bot = self.outbox.bot().await.map_err(super::outbox::decide)?;
        if bot.username.is_empty() {
            return Err(BusError::new(
                BusErrorCode::Telegram,
                "the bot has no username, so it cannot be paired by link",
            ));
        }
        let code = self.access.new_pairing_code();
        Ok(PairingLink {
            url: format!("https://t.me/{}?start={code}", bot.username),
            expires_in_s: super::access::PAIRING_TTL.as_secs(),
        })
    }

    pub(super) fn status(&self) -> Result<BusStatus, BusError> {
        let stored = self.store().bindings().map_err(store_error)?;
        let conns = self.registry.lock();
        let mut sessions: Vec<SessionStatus> = conns
            .map
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
        drop(conns);
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
        let pacing = self
            .outbox
            .budgets()
            .into_iter()
            .map(|b| ChatPacing {
                chat_id: b.chat,
                used: b.used as u32,
                capacity: b.capacity as u32,
                window_ms: b.period.as_millis() as u64,
                waiting: b.waiting as u32,
                next_free_ms: b.next_free.as_millis() as u64,
                longest_wait_ms: b.longest_wait.as_millis() as u64,
                paced: b.paced,
            })
            .collect();
        Ok(BusStatus {
            epoch: self.epoch,
            leader_pid: std::process::id(),
            leader_instance: self.instance_id.clone(),
            leader_since_ms: self.since_ms,
            sessions,
            poll: Some(self.poll_report()),
            pacing,
            cluster: None,
        })
    }
}

/// What keeps a session from having a topic in `chat` until the user fixes
/// it, if `e` says so: then asking again cannot help.
fn blocked(e: &TelegramError, chat: i64) -> Option<Provisioned> {
    let (blocker, text) = match e {
        TelegramError::Unauthorized => (
            Blocker::TokenRejected,
            "Telegram rejected the bot token (401 Unauthorized): put a valid token from @BotFather in bot_token, then run /telegram-connect; `agent-relay doctor` checks it".to_string(),
        ),
        TelegramError::NotEnoughRights { description } => (
            Blocker::NoTopicRights,
            format!(
                "the bot may not manage topics in chat {chat} ({description}): make it an administrator with \"Manage topics\" (and \"Delete messages\" for /telegram-disconnect), then run /telegram-connect; `agent-relay doctor` checks it"
            ),
        ),
        TelegramError::NotAForum { description } => (
            Blocker::NotAForum,
            format!(
                "chat {chat} has no topics ({description}): enable Topics in the group's settings, then run /telegram-connect"
            ),
        ),
        TelegramError::ChatNotFound { description } | TelegramError::Forbidden { description } => (
            Blocker::ChatNotFound,
            format!(
                "the bot cannot reach chat {chat} ({description}): check chat_id and add the bot to the group, then run /telegram-connect"
            ),
        ),
        _ => return None,
    };
    Some(Provisioned::Blocked(blocker, text))
}

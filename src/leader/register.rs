//! Registration: a session joins the bus with a key, a slot and a topic
//! (docs/DESIGN.md, "The bus"). One registration goes through three steps
//! of a [`Registering`], each taking what the one before found:
//!
//! 1. **claim** — under the registry lock, pick the session's profile key
//!    and slot and reserve them at once, so a concurrent registration
//!    cannot take them (across machines, the slot is also claimed
//!    bot-wide; one another machine holds is picked again);
//! 2. **provision** — without any lock but the profile's, find the topic:
//!    the one the session had (reopened if its host had switched away,
//!    probed if another process held it), or a new one; or say why there
//!    is none;
//! 3. **finish** — write the binding, make the registration the session's
//!    route, give up what a reclaimed slot's old holder left, and announce
//!    a new topic.
//!
//! A registration that fails gives its slot and key back. Reconciling a
//! route snapshot after a failover, and closing the topic of a session
//! the host switched away from, live here too.

use std::sync::Arc;

use super::cluster::claims::{Claims, SlotClaim, topic_name};
use super::context::Context;
use super::failure::store_error;
use super::failure::{Failure, FailureKind};
use super::launches::Launches;
use super::now_ms;
use super::registry::{ConnId, Conns, Registration};
use super::router::Router;
use super::speaker::Say;
use crate::protocol::bus::*;
use crate::store::{Binding, BindingStatus};
use crate::telegram::TOPICS_SWITCH;
use crate::topics;

/// The most routes one instance may claim in a reconcile.
const MAX_ROUTES: usize = Slot::ALL;

/// Sessions joining the bus, and leaving it for good (`disconnect.rs`).
pub(super) struct Registrations {
    pub(super) cx: Arc<Context>,
    /// What a reclaimed slot's old holder left is given up; a disconnected
    /// session's too.
    pub(super) router: Arc<Router>,
    /// A launched session's first prompt, and who waits for it.
    launches: Arc<Launches>,
    /// Held while the cleanup intents a predecessor left are worked off:
    /// nothing is provisioned before.
    pub(super) cleanup: Arc<tokio::sync::Mutex<()>>,
}

/// One registration on its way through its steps.
struct Registering<'a> {
    leader: &'a Registrations,
    conn: ConnId,
    req: &'a Register,
    /// Every stored binding, read once when the registration began.
    stored: Vec<Binding>,
    /// What a new topic's notice says of the launch this session is.
    launch_note: Option<String>,
}

/// What the claim step reserved.
struct Claim {
    profile_key: String,
    slot: Slot,
    /// The topic the session had, if it is still to be trusted as a hint.
    hint: Option<Target>,
    /// Another stored binding held the slot; it loses it on success.
    reclaimed_from: Option<Binding>,
    /// Nothing new may be claimed across machines now (why).
    cut_off: Option<String>,
}

/// What the provision step found.
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
    CreateUnknown(Failure),
}

impl Registrations {
    pub fn new(cx: Arc<Context>, router: Arc<Router>, launches: Arc<Launches>) -> Self {
        Self {
            cx,
            router,
            launches,
            cleanup: Arc::default(),
        }
    }

    /// This machine's claims across machines (none without a cluster).
    pub(super) fn claims(&self) -> Claims<'_> {
        Claims {
            node: self.cx.cluster.as_deref(),
            chat: self.cx.chat_id.or_else(|| self.cx.access.topics_user()),
        }
    }

    /// The topic name of `slot`, with this machine's name when the relay
    /// spans machines.
    fn topic_name(&self, slot: Slot, session_name: &str) -> String {
        topic_name(self.cx.cluster.as_deref(), slot, session_name)
    }

    /// Registers a session (see the module docs).
    pub async fn register(
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
        self.cx
            .registry
            .vouch(&req.instance_id, &req.instance_secret)?;
        let lock = self.cx.registry.profile_lock(&req.profile_key);
        let _serialized = lock.lock().await;
        let launch_note = req
            .launch
            .as_deref()
            .and_then(|id| self.launches.launch_note(id));
        let stored = self.cx.store().bindings().map_err(store_error)?;
        let registering = Registering {
            leader: self,
            conn,
            req: &req,
            stored,
            launch_note,
        };
        let result = registering.run().await;
        match &result {
            Ok(registered) => {
                if let Some(launch) = &req.launch {
                    self.launches
                        .launched_registered(launch, &registered.route, 0);
                }
                if let Some(left) = req
                    .left
                    .clone()
                    .filter(|left| left.profile_key != registered.route.profile_key)
                {
                    let leader = self.clone();
                    let (instance, now) = (req.instance_id, registered.route.topic_name.clone());
                    crate::tasks::spawn(
                        async move { leader.close_left(&left, &instance, &now).await },
                    );
                }
            }
            // Give the slot and key back: the session is not on the bus.
            Err(_) => self.unclaim(conn, req.registration_generation),
        }
        result
    }

    /// Gives back what the claim step reserved for this registration.
    fn unclaim(&self, conn: ConnId, generation: Generation) {
        if let Some(c) = self.cx.registry.lock().map.get_mut(&conn)
            && c.session
                .as_ref()
                .is_some_and(|s| s.generation == generation)
        {
            c.session = None;
        }
    }
}

impl Registering<'_> {
    async fn run(&self) -> Result<Registered, BusError> {
        let claim = self.claim().await?;
        let binding = self.binding(&claim.profile_key);
        let provisioned = match &claim.cut_off {
            // Without the cluster only a session that keeps its slot and
            // topic gets one: nothing new may be claimed.
            Some(why) if claim.hint.is_none() => Provisioned::Without(format!(
                "{why}; this session joins without a topic until the cluster is back"
            )),
            _ => self.provision(&claim, binding).await?,
        };
        if let Provisioned::Topic { target, .. } = &provisioned {
            self.leader
                .claims()
                .claim_topic(*target, &claim.profile_key)
                .await;
        }
        self.finish(claim, provisioned)
    }

    /// The stored binding of `profile_key`, if any.
    fn binding(&self, profile_key: &str) -> Option<&Binding> {
        self.stored.iter().find(|b| b.profile_key == profile_key)
    }

    /// Step 1: reserves a key and a slot here, then the slot across
    /// machines; a slot another machine took meanwhile is never picked
    /// again (at most 26 rounds, then `noFreeSlot`).
    async fn claim(&self) -> Result<Claim, BusError> {
        let claims = self.leader.claims();
        let mut foreign = claims.foreign_slots().await;
        loop {
            let mut claim = self.reserve(&foreign)?;
            match claims.claim_slot(claim.slot, &claim.profile_key).await {
                SlotClaim::Held => return Ok(claim),
                SlotClaim::Taken => {
                    self.leader
                        .unclaim(self.conn, self.req.registration_generation);
                    foreign.push(claim.slot);
                }
                SlotClaim::Unreachable(why) => {
                    claim.cut_off = Some(why);
                    return Ok(claim);
                }
            }
        }
    }

    /// Reserves a key and a slot under the registry lock. `foreign` are the
    /// slots other machines hold: never picked.
    fn reserve(&self, foreign: &[Slot]) -> Result<Claim, BusError> {
        let req = self.req;
        let mut conns = self.leader.cx.registry.lock();
        if !conns.map.contains_key(&self.conn) {
            return Err(BusError::new(
                BusErrorCode::Unavailable,
                "connection closed",
            ));
        }
        conns.replace_instance(self.conn, &req.instance_id, req.registration_generation)?;
        let claim = self.pick(&conns, foreign)?;
        let c = conns
            .map
            .get_mut(&self.conn)
            .ok_or_else(|| BusError::new(BusErrorCode::Unavailable, "connection closed"))?;
        c.session = Some(Registration {
            base_key: req.profile_key.clone(),
            instance_id: req.instance_id.clone(),
            generation: req.registration_generation,
            session_name: req.session_name.clone(),
            cwd: req.cwd.clone(),
            pid: req.pid,
            route: Route {
                profile_key: claim.profile_key.clone(),
                slot: claim.slot,
                target: None,
                topic_name: self.leader.topic_name(claim.slot, &req.session_name),
            },
            ready: false,
            reconciled: false,
        });
        Ok(claim)
    }

    /// The session's profile key (its own unless a live session has it),
    /// its slot (the one it had, else a free one, else one held by the
    /// session away longest), and what it had in that slot.
    fn pick(&self, conns: &Conns, foreign: &[Slot]) -> Result<Claim, BusError> {
        let req = self.req;
        let profile_key = topics::effective_profile_key(
            &req.profile_key,
            req.carried.as_ref().map(|r| r.profile_key.as_str()),
            |key| conns.owner_of(key).is_some(),
        );
        let binding = self
            .stored
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
        let held: Vec<topics::HeldSlot> = self
            .stored
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
        let reclaimed_from = self
            .stored
            .iter()
            .find(|b| b.slot == slot && b.profile_key != profile_key)
            .cloned();
        Ok(Claim {
            profile_key,
            slot,
            hint,
            reclaimed_from,
            cut_off: None,
        })
    }

    /// Step 2: the session's topic — the one it had, when that can still
    /// be trusted, or a new one.
    async fn provision(
        &self,
        claim: &Claim,
        binding: Option<&Binding>,
    ) -> Result<Provisioned, BusError> {
        // A predecessor's unfinished deletions come first (`disconnect.rs`).
        drop(self.leader.cleanup.lock().await);
        let chat = match self.leader.topic_chat().await {
            Ok(chat) => chat,
            Err(instead) => return Ok(instead),
        };
        if binding.is_some_and(|b| b.status == BindingStatus::CreateUnknown)
            && !self.req.retry_provisioning
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
            && self.leader.claims().topic_is_ours(target).await
            && let Some(kept) = self.keep(claim, binding, target, chat).await?
        {
            return Ok(kept);
        }
        let name = self.leader.topic_name(claim.slot, &self.req.session_name);
        match self.leader.cx.outbox.create_topic(chat, &name).await {
            Ok(target) => Ok(Provisioned::Topic {
                target,
                created: true,
            }),
            Err(e) if e.kind == FailureKind::CommitUnknown => Ok(Provisioned::CreateUnknown(e)),
            Err(e) => match blocked(&e, chat) {
                Some(blocked) => Ok(blocked),
                None => Err(BusError::new(
                    BusErrorCode::Telegram,
                    format!("cannot create topic {name:?} in chat {chat}: {e}"),
                )),
            },
        }
    }

    /// The topic the session had, if it may keep it: reopened when its
    /// host switched back to it, as it is for the same process coming back
    /// (a failover), probed for a new process. `None`: it is gone, make
    /// another.
    async fn keep(
        &self,
        claim: &Claim,
        binding: Option<&Binding>,
        target: Target,
        chat: i64,
    ) -> Result<Option<Provisioned>, BusError> {
        let kept = Provisioned::Topic {
            target,
            created: false,
        };
        let leader = self.leader;
        // Its host switched back to it (`/resume`): open it again.
        if binding.is_some_and(|b| b.closed && b.target() == Some(target)) {
            return match leader.cx.outbox.reopen_topic(target).await {
                Ok(()) => Ok(Some(kept)),
                Err(e) if e.kind == FailureKind::TopicGone => {
                    leader.cx.mark_stale(&claim.profile_key);
                    Ok(None)
                }
                Err(e) => match blocked(&e, chat) {
                    Some(blocked) => Ok(Some(blocked)),
                    None => Err(BusError::new(
                        BusErrorCode::Telegram,
                        format!("cannot reopen topic {}: {e}; will retry", claim.slot),
                    )),
                },
            };
        }
        let same_process = binding.is_some_and(|b| b.instance_id == self.req.instance_id)
            || self
                .req
                .carried
                .as_ref()
                .is_some_and(|r| r.target == Some(target));
        if same_process && binding.is_some_and(|b| b.status == BindingStatus::Active) {
            return Ok(Some(kept));
        }
        match leader.cx.outbox.probe(target).await {
            Ok(true) => Ok(Some(kept)),
            Ok(false) => {
                tracing::info!(
                    thread = target.thread_id,
                    "stored topic is gone; creating a new one"
                );
                leader.cx.mark_stale(&claim.profile_key);
                Ok(None)
            }
            Err(e) => match blocked(&e, chat) {
                Some(blocked) => Ok(Some(blocked)),
                None => Err(BusError::new(
                    BusErrorCode::Telegram,
                    format!(
                        "cannot verify topic {} (thread {}): {e}; not creating a duplicate, will retry",
                        claim.slot, target.thread_id
                    ),
                )),
            },
        }
    }

    /// Step 3: writes the binding and makes the registration live.
    ///
    /// Long because the binding, the slot taken from another, the live
    /// registration and the answer are written under one registry lock.
    fn finish(&self, claim: Claim, provisioned: Provisioned) -> Result<Registered, BusError> {
        let req = self.req;
        let leader = self.leader;
        let binding = self.binding(&claim.profile_key);
        let outcome = Outcome::of(provisioned, binding, &claim.profile_key);
        let route = Route {
            profile_key: claim.profile_key.clone(),
            slot: claim.slot,
            target: outcome.target,
            topic_name: leader.topic_name(claim.slot, &req.session_name),
        };
        let now = now_ms();
        let record = Binding {
            profile_key: claim.profile_key.clone(),
            instance_id: req.instance_id.clone(),
            session_name: req.session_name.clone(),
            cwd: req.cwd.clone(),
            chat_id: outcome.target.map(|t| t.chat_id),
            thread_id: outcome.target.map(|t| t.thread_id),
            slot: claim.slot,
            topic_name: route.topic_name.clone(),
            status: outcome.status,
            announced: !outcome.created && binding.is_some_and(|b| b.announced),
            // Registered again: open (reopened above if it was closed).
            closed: outcome.target.is_none() && binding.is_some_and(|b| b.closed),
            created_ms: binding.map_or(now, |b| b.created_ms),
            updated_ms: now,
        };
        leader.bind(&record, binding, claim.reclaimed_from.as_ref())?;
        // Deliveries start once the session has its answer (`go_live`).
        leader
            .cx
            .registry
            .lock()
            .session_mut(self.conn, req.registration_generation)
            .map_err(|_| {
                BusError::new(
                    BusErrorCode::Unavailable,
                    "the registration was replaced meanwhile",
                )
            })?
            .route = route.clone();
        if let Some(holder) = &claim.reclaimed_from {
            // Its slot is this session's now; its topic nobody's.
            leader
                .claims()
                .release(&holder.profile_key, None, holder.target());
        }
        leader.router.back(&claim.profile_key);
        if let Some(target) = outcome.target
            && !record.announced
        {
            leader.announce(
                target,
                &claim.profile_key,
                &record.topic_name,
                &req.cwd,
                self.launch_note.as_deref(),
            );
        }
        tracing::info!(slot = %claim.slot, profile = %claim.profile_key, "session registered");
        Ok(Registered {
            epoch: leader.cx.epoch,
            route,
            problem: outcome.problem,
            needs_pairing: leader.cx.access.needs_pairing(),
            blocker: outcome.blocker,
        })
    }
}

/// What provisioning means for the binding and the session's answer.
struct Outcome {
    target: Option<Target>,
    status: BindingStatus,
    problem: Option<String>,
    blocker: Option<Blocker>,
    created: bool,
}

impl Outcome {
    fn of(provisioned: Provisioned, binding: Option<&Binding>, profile_key: &str) -> Self {
        let unchanged = binding.map_or(BindingStatus::Active, |b| b.status);
        let without = |problem: String, blocker| Self {
            target: None,
            status: unchanged,
            problem: Some(problem),
            blocker,
            created: false,
        };
        match provisioned {
            Provisioned::Topic { target, created } => Self {
                target: Some(target),
                status: BindingStatus::Active,
                problem: None,
                blocker: None,
                created,
            },
            Provisioned::Without(why) => without(why, None),
            Provisioned::Blocked(blocker, text) => {
                tracing::warn!(profile = %profile_key, "no topic until the user acts: {text}");
                without(text, Some(blocker))
            }
            Provisioned::CreateUnknown(e) => Self {
                status: BindingStatus::CreateUnknown,
                ..without(
                    format!(
                        "creating this session's topic may or may not have succeeded ({e}); run /telegram-connect to try again"
                    ),
                    None,
                )
            },
        }
    }
}

impl Registrations {
    /// The chat that holds the topics: the configured one, else the private
    /// chat with the paired user when the bot has topics enabled there.
    /// The error is what to provision instead: blocked, or without a topic
    /// for now.
    async fn topic_chat(&self) -> Result<i64, Provisioned> {
        if let Some(chat) = self.cx.chat_id {
            return Ok(chat);
        }
        let Some(user) = self.cx.access.topics_user() else {
            return Err(Provisioned::Without("no chat configured and nobody paired: set chat_id or run /telegram-connect to pair".into()));
        };
        match self.cx.outbox.bot().await {
            Ok(bot) if bot.has_topics_enabled => Ok(user),
            Ok(_) => Err(Provisioned::Blocked(
                Blocker::NotAForum,
                format!(
                    "no chat_id configured, and the bot has no topics in private chats: {TOPICS_SWITCH}, or set chat_id to a forum supergroup"
                ),
            )),
            Err(e) => Err(blocked(&e, user).unwrap_or_else(|| {
                Provisioned::Without(format!("cannot ask Telegram about the bot: {e}"))
            })),
        }
    }

    /// Writes a session's binding (`before`: what was stored); a binding
    /// whose slot it takes over is removed, and the messages that waited
    /// for it are given up. A binding written again unchanged (a session
    /// registering again after a failover) is only stamped, without the
    /// fsync: a crowd of survivors re-registering at once does not queue
    /// behind one flush each.
    fn bind(
        &self,
        record: &Binding,
        before: Option<&Binding>,
        reclaimed: Option<&Binding>,
    ) -> Result<(), BusError> {
        let unchanged = |b: &Binding| {
            let times = |b: &Binding| Binding {
                created_ms: 0,
                updated_ms: 0,
                ..b.clone()
            };
            times(b) == times(record)
        };
        if reclaimed.is_none()
            && before.is_some_and(unchanged)
            && self
                .cx
                .store()
                .touch_binding(&record.profile_key)
                .map_err(store_error)?
        {
            return Ok(());
        }
        let mut orphaned = None;
        {
            let mut store = self.cx.store();
            if let Some(holder) = reclaimed {
                tracing::info!(slot = %record.slot, holder = %holder.profile_key, "reclaiming a slot from a session that is away");
                let left_behind = store
                    .pending_for(&holder.profile_key)
                    .map_err(store_error)?;
                store
                    .remove_binding(&holder.profile_key)
                    .map_err(store_error)?;
                store
                    .posts_abandoned(&holder.profile_key, "its session's slot went to another")
                    .map_err(store_error)?;
                orphaned = Some((left_behind, holder.target().is_some()));
            }
            store.upsert_binding(record).map_err(store_error)?;
        }
        if let Some((left_behind, had_topic)) = orphaned {
            // Its messages have nobody to go to any more.
            self.router.give_up(
                left_behind.into_iter().map(|e| e.update).collect(),
                &format!(
                    "its session was away so long that its slot went to {}",
                    record.topic_name
                ),
                had_topic,
            );
        }
        Ok(())
    }

    /// Closes the topic of the session an instance switched away from (its
    /// host's `/new` or `/resume`), saying where it went: the session is
    /// not gone, and its topic opens again when it is resumed. Only the
    /// instance that held the topic may close it, and only while nobody
    /// else has taken the session up.
    async fn close_left(&self, left: &Route, instance: &str, now: &str) {
        let Some(target) = left.target else { return };
        let binding = match self.cx.store().binding(&left.profile_key) {
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
        if !ours
            || self
                .cx
                .registry
                .lock()
                .owner_of(&left.profile_key)
                .is_some()
        {
            return;
        }
        let text = format!(
            "⏸ Switched to another session: {now}. This topic is closed until this session is resumed; what you write here waits for it."
        );
        if let Err(e) = self.cx.speaker.now(target.into(), Say::plain(text)).await {
            tracing::warn!("cannot say where the session went: {e}");
        }
        match self.cx.outbox.close_topic(target).await {
            Ok(()) => {
                if let Err(e) = self.cx.store().set_topic_closed(&left.profile_key, true) {
                    tracing::warn!("cannot remember the topic is closed: {e}");
                }
                tracing::info!(profile = %left.profile_key, "closed the topic of a session its host left");
            }
            Err(e) => tracing::warn!("cannot close the topic of a session its host left: {e}"),
        }
    }

    /// Posts the "connected" notice in a topic that was just bound.
    fn announce(
        &self,
        target: Target,
        profile_key: &str,
        topic_name: &str,
        cwd: &str,
        launch_note: Option<&str>,
    ) {
        let cx = self.cx.clone();
        let profile_key = profile_key.to_string();
        let mut text = format!("🟢 {topic_name} connected\n{cwd}");
        if let Some(note) = launch_note {
            text.push('\n');
            text.push_str(note);
        }
        crate::tasks::spawn(async move {
            match cx.speaker.now(target.into(), Say::plain(text)).await {
                Ok(_) => {
                    let mut store = cx.store();
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
    pub fn reconcile(&self, conn: ConnId, req: &Reconcile) -> Result<Reconciled, BusError> {
        if req.routes.len() > MAX_ROUTES {
            return Err(BusError::new(
                BusErrorCode::BadFrame,
                format!(
                    "{} routes in one reconcile; at most {MAX_ROUTES}",
                    req.routes.len()
                ),
            ));
        }
        if req.observed_epoch > self.cx.epoch {
            return Err(BusError::new(
                BusErrorCode::Unavailable,
                format!(
                    "this leader's epoch {} is older than the observed {}",
                    self.cx.epoch, req.observed_epoch
                ),
            ));
        }
        let mut conns = self.cx.registry.lock();
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
            epoch: self.cx.epoch,
            accepted,
            rejected,
        })
    }
}

/// What keeps a session from having a topic in `chat` until the user fixes
/// it, if `failure` says so: then asking again cannot help.
fn blocked(failure: &Failure, chat: i64) -> Option<Provisioned> {
    let e = &failure.message;
    let (blocker, text) = match failure.kind {
        FailureKind::TokenRejected => (
            Blocker::TokenRejected,
            "Telegram rejected the bot token (401 Unauthorized): put a valid token from @BotFather in bot_token, then run /telegram-connect; `agent-relay doctor` checks it".to_string(),
        ),
        FailureKind::NoTopicRights => (
            Blocker::NoTopicRights,
            format!(
                "the bot may not manage topics in chat {chat} ({e}): make it an administrator with \"Manage topics\" (and \"Delete messages\" for /telegram-disconnect), then run /telegram-connect; `agent-relay doctor` checks it"
            ),
        ),
        FailureKind::NotAForum => (
            Blocker::NotAForum,
            format!(
                "chat {chat} has no topics ({e}): enable Topics in the group's settings, then run /telegram-connect"
            ),
        ),
        FailureKind::ChatUnreachable => (
            Blocker::ChatNotFound,
            format!(
                "the bot cannot reach chat {chat} ({e}): check chat_id and add the bot to the group, then run /telegram-connect"
            ),
        ),
        _ => return None,
    };
    Some(Provisioned::Blocked(blocker, text))
}

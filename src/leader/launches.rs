//! Sessions `agent-relay serve` launches (docs/DESIGN.md, *Launching*),
//! as the leader sees them: this machine's `serve` on the bus (its
//! welcome: which sessions should be running), the orders the leader hands
//! it and their answers, what it reports about its agents (each said in
//! the session's topic), and the link between a launch and the session
//! that registers for it.
//!
//! The leader keeps the record (`store::Launch`); `serve` keeps the
//! processes. A launch's first prompt waits in its record until its
//! session registers, and then goes into the journal before the session
//! goes live: it is delivered like any message, in order, once.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

use super::context::Context;
use super::failure::store_error;
use super::registry::{ConnId, LauncherReg};
use super::speaker::Say;
use crate::config::LaunchPolicy;
use crate::protocol::bus::*;
use crate::protocol::launch::{
    LaunchEvent, LaunchSpec, OrderOp, OrderOutcome, RemoteDone, RemoteOp,
};
use crate::render::escape;
use crate::store::{Launch, LaunchState, NewUpdate};

/// The data of a button that resumes launch `id` (`c:r:`, read by the
/// control place).
fn resume_button(id: &str) -> String {
    format!("c:r:{id}")
}

/// What a line in a launch's topic comes with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    /// The session runs (again): the line alone.
    Running,
    /// It does not run: a Resume button, and the topic closed when `close`.
    Stopped { close: bool },
}

/// What a report from `serve` means for its launch: the state it is in
/// now and why (unchanged when `None`), and what its topic is told.
struct Happened {
    state: Option<LaunchState>,
    note: Option<String>,
    said: Option<(String, Told)>,
}

impl Happened {
    /// The one match over what `serve` reports (started, ended, idle,
    /// crashed): each event's state, note and line side by side.
    fn of(launch: &Launch, event: &LaunchEvent) -> Self {
        let (state, note, said) = match event {
            LaunchEvent::Started { after_restart, .. } => {
                let said = after_restart.then(|| {
                    format!("↻ agent-relay serve restarted; this session was started again from {}'s own session store.", launch.engine)
                });
                (None, None, said.map(|s| (s, Told::Running)))
            }
            LaunchEvent::Ended { by_user } => {
                tracing::info!(target: "audit", user = by_user, launch = %launch.id, engine = %launch.engine, folder = %launch.folder, "a launched session ended");
                let said = "⏹ Session ended. This topic is closed; /resume in the chat, or the button, starts it again with its history.".to_string();
                (
                    Some(LaunchState::Ended),
                    Some("ended with /end".to_string()),
                    Some((said, Told::Stopped { close: true })),
                )
            }
            LaunchEvent::Idle { idle_s } => {
                let hours = *idle_s as f64 / 3600.0;
                let said = format!(
                    "💤 Ended after {hours:.1} h without a turn ([launch] idle_end_hours). Write here to start it again with its history."
                );
                (
                    Some(LaunchState::Idle),
                    Some(format!("idle for {hours:.1} h")),
                    Some((said, Told::Stopped { close: false })),
                )
            }
            LaunchEvent::Crashed {
                code,
                signal,
                stderr,
            } => {
                let how = match (code, signal) {
                    (Some(code), _) => format!("exit code {code}"),
                    (None, Some(signal)) => format!("signal {signal}"),
                    (None, None) => "no exit status".into(),
                };
                let mut said = format!("⚠️ {} stopped by itself ({how}).", launch.engine);
                if !stderr.trim().is_empty() {
                    said.push_str(&format!(
                        "\nIts last words on stderr:\n{}",
                        crate::policy::clip(stderr.trim(), 1500)
                    ));
                }
                said.push_str("\nWrite here or tap Resume to start it again with its history.");
                (
                    Some(LaunchState::Crashed),
                    Some(how),
                    Some((said, Told::Stopped { close: false })),
                )
            }
        };
        Self { state, note, said }
    }
}

/// What the person is told when this machine has no `serve`.
pub(super) const NO_SERVE: &str = "agent-relay serve is not running on this machine: start it with `agent-relay serve` (or `agent-relay install service` to keep it running)";
/// How long any other order may take.
const ORDER_WAIT: Duration = Duration::from_secs(30);

/// The leader's side of launching: orders on their way, and who waits for
/// a launch's session.
pub(super) struct Launches {
    cx: Arc<Context>,
    /// `[launch]`: where agents may be started, and how.
    policy: LaunchPolicy,
    next_order: AtomicU64,
    /// Orders `serve` has not answered yet: its connection, and who waits.
    orders: Mutex<HashMap<u64, (ConnId, oneshot::Sender<OrderOutcome>)>>,
    /// Who waits for a launch's session to register: launch id → waiters.
    registered: Mutex<HashMap<String, Vec<oneshot::Sender<Route>>>>,
    /// Launches being started again now: one resume at a time each.
    resuming: Mutex<HashSet<String>>,
    /// Launches `serve` is bringing back after its restart (its welcome
    /// named them), until each registers or is reported: their topics are
    /// told when they are back, so a message meanwhile needs no word.
    returning: Mutex<HashSet<String>>,
}

/// What becomes of a message for a launched session that is away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Comeback {
    /// None: the topic is told the session is away.
    No,
    /// It is started again for the message; the topic is told so.
    Resuming,
    /// `serve` is bringing it back (asked to take it next); its topic is
    /// told when it is back, and the message waits for it.
    Returning,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A launch id: 48 random bits in hex, short enough for a button's data.
pub(super) fn new_launch_id() -> String {
    format!("{:012x}", fastrand::u64(..) & 0xffff_ffff_ffff)
}

impl Launches {
    pub fn new(cx: Arc<Context>, policy: LaunchPolicy) -> Self {
        Self {
            cx,
            policy,
            next_order: AtomicU64::new(0),
            orders: Mutex::default(),
            registered: Mutex::default(),
            resuming: Mutex::default(),
            returning: Mutex::default(),
        }
    }

    /// `[launch]`, as configured.
    pub fn policy(&self) -> &LaunchPolicy {
        &self.policy
    }

    /// The engines `/new` knows by name: every `[launch.commands]` name
    /// (each engine has one, its default command), and those this
    /// machine's `serve` said it starts (`Engine`'s names, which the leader
    /// may not import: `launch` is a bus member). A new engine needs no
    /// edit here.
    pub fn engines(&self) -> Vec<String> {
        let mut names: Vec<String> = self.serve_status().map(|s| s.engines).unwrap_or_default();
        for name in self.policy.commands.keys() {
            if !names.contains(name) {
                names.push(name.clone());
            }
        }
        names
    }

    /// What `/new` says when no folder may have agents.
    pub fn no_roots(&self) -> String {
        "starting agents from the phone is off on this machine: add the folders agents may work in to config.toml as <code>[launch] roots = [\"~/code\"]</code>, then restart agent-relay serve".into()
    }

    /// Runs `op` with this machine's `serve`; what it says is one line of
    /// HTML for the control place.
    pub async fn run_here(self: &Arc<Self>, op: RemoteOp) -> RemoteDone {
        match op {
            RemoteOp::New {
                folder,
                engine,
                prompt,
                by_user,
            } => {
                let engine = engine.unwrap_or_else(|| self.policy.default_engine.clone());
                if self.policy.roots.is_empty() {
                    return refused(&self.no_roots());
                }
                tracing::info!(target: "audit", user = by_user, %folder, %engine, "start a session from the phone");
                let spec = LaunchSpec {
                    launch_id: new_launch_id(),
                    engine: engine.clone(),
                    folder,
                    resume_id: None,
                    model: None,
                    by_user,
                };
                match self.start_new(spec, prompt).await {
                    Ok(route) => RemoteDone {
                        ok: true,
                        text: format!(
                            "▶ {} started: {}",
                            escape(&engine),
                            topic_html(&route.topic_name, route.target)
                        ),
                    },
                    Err(why) => refused(&why),
                }
            }
            RemoteOp::Resume { launch_id, by_user } => match self.resume(&launch_id, by_user).await
            {
                Ok((route, started)) => RemoteDone {
                    ok: true,
                    text: format!(
                        "{}: {}",
                        if started {
                            "▶ Resumed"
                        } else {
                            "● Running already"
                        },
                        topic_html(&route.topic_name, route.target)
                    ),
                },
                Err(why) => refused(&why),
            },
            RemoteOp::End { launch_id, by_user } => match self.end(&launch_id, by_user).await {
                Ok(()) => RemoteDone {
                    ok: true,
                    text: "⏹ Ended.".into(),
                },
                Err(why) => refused(&why),
            },
        }
    }

    /// `serve` joins as this machine's launcher. A launcher registered
    /// before is replaced: `serve` holds its own lock while it runs, so the
    /// one before is gone. The welcome names every session that should be
    /// running, for `serve` to start again after a restart.
    pub(super) fn serve_hello(
        &self,
        conn: ConnId,
        hello: &ServeHello,
    ) -> Result<ServeWelcome, BusError> {
        if hello.protocol_version != BUS_PROTOCOL_VERSION {
            return Err(BusError::new(
                BusErrorCode::ProtocolVersion,
                format!(
                    "bus protocol {} is not supported (the leader speaks {BUS_PROTOCOL_VERSION}); update agent-relay",
                    hello.protocol_version
                ),
            ));
        }
        self.cx
            .registry
            .vouch(&hello.instance_id, &hello.instance_secret)?;
        let resume = self.to_resume()?;
        {
            let mut conns = self.cx.registry.lock();
            let before: Vec<ConnId> = conns
                .map
                .iter()
                .filter(|(id, c)| c.launcher.is_some() && **id != conn)
                .map(|(id, _)| *id)
                .collect();
            for id in before {
                if let Some(c) = conns.map.get_mut(&id) {
                    c.launcher = None;
                    c.close();
                }
            }
            let c = conns
                .map
                .get_mut(&conn)
                .ok_or_else(|| BusError::new(BusErrorCode::Unavailable, "connection closed"))?;
            c.launcher = Some(LauncherReg {
                generation: hello.registration_generation,
                pid: hello.pid,
                engines: hello.engines.clone(),
            });
        }
        tracing::info!(
            pid = hello.pid,
            resume = resume.len(),
            "serve joined the bus"
        );
        Ok(ServeWelcome {
            epoch: self.cx.epoch,
            resume,
        })
    }

    /// The sessions that should be running, for a `serve` that joins: those
    /// with messages waiting first, so that `serve`, which starts a few at
    /// a time, brings back first the sessions someone waits for. Those not
    /// on the bus now are noted as returning.
    fn to_resume(&self) -> Result<Vec<LaunchSpec>, BusError> {
        let launches = self.cx.store().launches().map_err(store_error)?;
        let mut resume: Vec<(bool, LaunchSpec)> = Vec::new();
        let mut returning = HashSet::new();
        for launch in launches.into_iter().filter(|l| l.state.is_running()) {
            let key = launch.profile_key.as_deref();
            if self.live_route(key).is_none() {
                returning.insert(launch.id.clone());
            }
            let waiting = key
                .and_then(|key| self.cx.store().pending_for(key).ok())
                .is_some_and(|pending| !pending.is_empty());
            resume.push((waiting, spec_of(&launch, launch.by_user)));
        }
        resume.sort_by_key(|(waiting, _)| !waiting);
        *lock(&self.returning) = returning;
        Ok(resume.into_iter().map(|(_, spec)| spec).collect())
    }

    /// `serve` as `/relay status` shows it.
    pub(super) fn serve_status(&self) -> Option<ServeStatus> {
        let conns = self.cx.registry.lock();
        conns.launcher().map(|(_, l)| ServeStatus {
            pid: l.pid,
            engines: l.engines.clone(),
        })
    }

    /// Hands `op` to this machine's `serve` and waits for its answer.
    pub(super) async fn order(
        &self,
        op: OrderOp,
        wait: Duration,
    ) -> Result<OrderOutcome, BusError> {
        let unavailable = |why: &str| BusError::new(BusErrorCode::Unavailable, why);
        let order_id = self.next_order.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = oneshot::channel();
        {
            let conns = self.cx.registry.lock();
            let Some((conn, _)) = conns.launcher() else {
                return Err(unavailable(NO_SERVE));
            };
            lock(&self.orders).insert(order_id, (conn, tx));
            if !conns.push(conn, FromLeader::Order(Order { order_id, op })) {
                lock(&self.orders).remove(&order_id);
                return Err(unavailable("agent-relay serve is not reading its orders"));
            }
        }
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err(_)) => Err(unavailable(
                "agent-relay serve left the bus before it answered",
            )),
            Err(_) => {
                lock(&self.orders).remove(&order_id);
                Err(unavailable(&format!(
                    "agent-relay serve did not answer within {} s",
                    wait.as_secs()
                )))
            }
        }
    }

    /// `serve` answered an order.
    pub(super) fn order_done(&self, conn: ConnId, done: &OrderDone) -> Result<(), BusError> {
        self.cx.registry.lock().launcher_of(conn, done.generation)?;
        let waiting = lock(&self.orders).remove(&done.order_id);
        match waiting {
            Some((from, answer)) if from == conn => {
                let _ = answer.send(done.outcome.clone());
            }
            _ => tracing::debug!(
                order = done.order_id,
                "an answer to an order nobody waits for"
            ),
        }
        Ok(())
    }

    /// A connection closed: the orders it had not answered fail now rather
    /// than at their timeout.
    pub(super) fn launcher_gone(&self, conn: ConnId) {
        lock(&self.orders).retain(|_, (from, _)| *from != conn);
    }

    /// Records a new launch and has `serve` start it; answers once its
    /// session registered (with its route), or why not. One that did not
    /// start stays recorded as ended ("not started"), with no session: it
    /// is offered nowhere (`/new`'s folders, `/sessions`).
    pub(super) async fn start_new(
        &self,
        spec: LaunchSpec,
        prompt: Option<String>,
    ) -> Result<Route, String> {
        let launch = Launch {
            id: spec.launch_id.clone(),
            engine: spec.engine.clone(),
            folder: spec.folder.clone(),
            profile_key: None,
            resume_id: None,
            model: spec.model.clone(),
            state: LaunchState::Starting,
            note: None,
            first_prompt: prompt.map(|p| crate::redact::redact(&p).into_owned()),
            by_user: spec.by_user,
            created_ms: 0,
            updated_ms: 0,
        };
        self.cx
            .store()
            .insert_launch(&launch)
            .map_err(|e| e.to_string())?;
        let started = self.start(spec.clone()).await;
        if started.is_err()
            && let Err(e) = self.cx.store().set_launch_state(
                &spec.launch_id,
                LaunchState::Ended,
                Some("not started"),
            )
        {
            tracing::warn!("cannot record a launch that did not start: {e}");
        }
        started
    }

    /// Starts a recorded launch (new, or again) and waits for its session,
    /// `[launch] join_within_s` in all from the order.
    async fn start(&self, spec: LaunchSpec) -> Result<Route, String> {
        let id = spec.launch_id.clone();
        let within = self.policy.join_within;
        let deadline = tokio::time::Instant::now() + within;
        let (tx, registered) = oneshot::channel();
        lock(&self.registered)
            .entry(id.clone())
            .or_default()
            .push(tx);
        let outcome = self.order(OrderOp::Start(spec), within).await;
        let folder = match outcome {
            Ok(OrderOutcome::Started { folder, .. }) => {
                if let Err(e) = self.cx.store().set_launch_folder(&id, &folder) {
                    tracing::warn!("cannot record where a launch runs: {e}");
                }
                folder
            }
            Ok(OrderOutcome::Refused { reason }) => {
                lock(&self.registered).remove(&id);
                return Err(reason);
            }
            Ok(other) => {
                lock(&self.registered).remove(&id);
                return Err(format!("serve answered {other:?}"));
            }
            Err(e) => {
                // serve may have started it without answering in time.
                self.abandon(&id).await;
                return Err(e.message);
            }
        };
        tracing::debug!(launch = %id, %folder, "agent started; waiting for its session");
        match tokio::time::timeout_at(deadline, registered).await {
            Ok(Ok(route)) => Ok(route),
            _ => {
                self.abandon(&id).await;
                Err(format!(
                    "the agent started in {folder}, but its session did not join the relay within {} s ([launch] join_within_s in config.toml), so it was ended",
                    within.as_secs()
                ))
            }
        }
    }

    /// A start the person is told is not done ends its agent, if it runs:
    /// an agent nobody is told of, in no list and out of `/end`'s reach,
    /// must not go on (on its machine's agents cap, and on its own).
    async fn abandon(&self, id: &str) {
        lock(&self.registered).remove(id);
        let end = OrderOp::End {
            launch_id: id.to_string(),
            by_user: 0,
        };
        match self.order(end, ORDER_WAIT).await {
            Ok(OrderOutcome::Ended) => {
                tracing::info!(launch = id, "ended an agent whose start was given up")
            }
            Ok(other) => tracing::debug!(launch = id, "ending a start given up: {other:?}"),
            Err(e) => tracing::warn!(
                launch = id,
                "cannot end an agent whose start was given up: {e}"
            ),
        }
    }

    /// Starts launch `id` again from the engine's own session; answers its
    /// route once it registered, and whether it was started now (its topic
    /// says so). A launch that runs, or is being started again, is left
    /// alone.
    pub(super) async fn resume(
        self: &Arc<Self>,
        id: &str,
        by_user: i64,
    ) -> Result<(Route, bool), String> {
        let launch = self
            .cx
            .store()
            .launch(id)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "no such launched session on this machine".to_string())?;
        if launch.state == LaunchState::Running
            && let Some(route) = self.live_route(launch.profile_key.as_deref())
        {
            return Ok((route, false));
        }
        if !lock(&self.resuming).insert(id.to_string()) {
            return Err("it is being started already".into());
        }
        tracing::info!(target: "audit", user = by_user, launch = id, engine = %launch.engine, folder = %launch.folder, "resume a launched session");
        if let Err(e) = self
            .cx
            .store()
            .set_launch_state(id, LaunchState::Starting, None)
        {
            tracing::warn!("cannot record the resume: {e}");
        }
        let resumed = self.start(spec_of(&launch, by_user)).await;
        lock(&self.resuming).remove(id);
        match &resumed {
            // The topic shows the session came back, as it shows its end;
            // it was reopened when the session registered.
            Ok(_) => self.tell_launch(
                &launch,
                format!(
                    "▶ Resumed: {} started again from its own session store, with its history.",
                    launch.engine
                ),
                Told::Running,
            ),
            Err(why) => {
                if let Err(e) = self
                    .cx
                    .store()
                    .set_launch_state(id, launch.state, Some(why))
                {
                    tracing::warn!("cannot record a failed resume: {e}");
                }
            }
        }
        resumed.map(|route| (route, true))
    }

    /// Ends launch `id` (`/end`): `serve` ends its process, then reports,
    /// and the report closes the topic.
    pub(super) async fn end(&self, id: &str, by_user: i64) -> Result<(), String> {
        match self
            .order(
                OrderOp::End {
                    launch_id: id.to_string(),
                    by_user,
                },
                ORDER_WAIT,
            )
            .await
        {
            Ok(OrderOutcome::Ended) => Ok(()),
            Ok(OrderOutcome::Refused { reason }) => Err(reason),
            Ok(other) => Err(format!("serve answered {other:?}")),
            Err(e) => Err(e.message),
        }
    }

    /// The route of a live session, if `profile_key` has one.
    fn live_route(&self, profile_key: Option<&str>) -> Option<Route> {
        let conns = self.cx.registry.lock();
        conns.owner_of(profile_key?).map(|(_, s)| s.route.clone())
    }

    /// A session registered as a launch (`Register::launch`): the launch
    /// is linked to it, its first prompt journaled (before the session goes
    /// live, so it is delivered first), and whoever waits is told.
    pub(super) fn launched_registered(&self, launch_id: &str, route: &Route, user_hint: i64) {
        lock(&self.returning).remove(launch_id);
        let linked = self.cx.store().link_launch(launch_id, &route.profile_key);
        let launch = match linked {
            Ok(Some(launch)) => launch,
            Ok(None) => {
                tracing::warn!(
                    launch = launch_id,
                    "a session claimed a launch that is not its own"
                );
                return;
            }
            Err(e) => {
                tracing::error!("cannot link a launch to its session: {e}");
                return;
            }
        };
        if let (Some(prompt), Some(target)) = (launch.first_prompt.clone(), route.target) {
            // A schedule's first firing started this launch: its turn
            // decides approvals as a scheduled one. (Read before the store
            // is taken for the journal: it is one lock.)
            let detail = self.by_schedule(launch_id).then(|| {
                serde_json::to_string(&super::triage::MessageDetail {
                    scheduled: true,
                    ..super::triage::MessageDetail::default()
                })
                .ok()
            });
            let detail = detail.flatten();
            let journaled = self.cx.store().journal_own_prompt(NewUpdate {
                update_id: 0,
                owner: Some(route.profile_key.clone()),
                chat_id: target.chat_id,
                thread_id: Some(target.thread_id),
                user_id: if launch.by_user != 0 {
                    launch.by_user
                } else {
                    user_hint
                },
                message_id: 0,
                text: prompt,
                detail,
            });
            if let Err(e) = journaled {
                tracing::error!("cannot hand the launch's first prompt to its session: {e}");
            }
        }
        for waiter in lock(&self.registered).remove(launch_id).unwrap_or_default() {
            let _ = waiter.send(route.clone());
        }
    }

    /// Whether a schedule made in the control place started `launch_id`.
    fn by_schedule(&self, launch_id: &str) -> bool {
        match self.cx.store().schedules() {
            Ok(schedules) => schedules
                .iter()
                .any(|s| s.launch_id.as_deref() == Some(launch_id)),
            Err(e) => {
                tracing::warn!("cannot read the schedules: {e}");
                false
            }
        }
    }

    /// What `serve` says about one of its agents: recorded, and said in the
    /// session's topic.
    pub(super) fn launch_report(
        self: &Arc<Self>,
        conn: ConnId,
        report: &LaunchReport,
    ) -> Result<(), BusError> {
        self.cx
            .registry
            .lock()
            .launcher_of(conn, report.generation)?;
        let id = &report.launch_id;
        if !matches!(report.event, LaunchEvent::Started { .. }) {
            lock(&self.returning).remove(id);
        }
        let Some(launch) = self.cx.store().launch(id).map_err(store_error)? else {
            return Err(BusError::new(BusErrorCode::Forbidden, "no such launch"));
        };
        if let LaunchEvent::Started {
            resume_id, model, ..
        } = &report.event
            && let Err(e) =
                self.cx
                    .store()
                    .set_launch_started(id, resume_id.as_deref(), model.as_deref())
        {
            tracing::warn!("cannot record the launch's session: {e}");
        }
        let happened = Happened::of(&launch, &report.event);
        if let Some(state) = happened.state
            && let Err(e) = self
                .cx
                .store()
                .set_launch_state(id, state, happened.note.as_deref())
        {
            tracing::warn!("cannot record what happened to a launch: {e}");
        }
        if let Some((text, told)) = happened.said {
            self.tell_launch(&launch, text, told);
        }
        Ok(())
    }

    /// Says `text` in a launch's topic, with what `told` adds.
    fn tell_launch(self: &Arc<Self>, launch: &Launch, text: String, told: Told) {
        let Some(binding) = launch
            .profile_key
            .as_deref()
            .and_then(|key| self.cx.store().binding(key).ok().flatten())
        else {
            return;
        };
        let Some(target) = binding.target() else {
            return;
        };
        let close = told == Told::Stopped { close: true };
        let buttons = matches!(told, Told::Stopped { .. }).then(|| Keyboard {
            rows: vec![vec![Button {
                text: "▶ Resume".into(),
                data: resume_button(&launch.id),
            }]],
        });
        let profile = binding.profile_key.clone();
        let cx = self.cx.clone();
        self.cx.errands.run(async move {
            let say = Say::plain(text).with(buttons);
            // A session back is a line of status: the chat's budget goes to
            // answers first (after `serve` restarts, one per session).
            let said = match told {
                Told::Running => cx.speaker.notice(target.into(), say).await,
                Told::Stopped { .. } => cx.speaker.now(target.into(), say).await,
            };
            if let Err(e) = said {
                tracing::warn!("cannot tell a launch's topic: {e}");
            }
            if close {
                match cx.outbox.close_topic(target).await {
                    Ok(()) => {
                        if let Err(e) = cx.store().set_topic_closed(&profile, true) {
                            tracing::warn!("cannot remember the topic is closed: {e}");
                        }
                    }
                    Err(e) => tracing::warn!("cannot close an ended session's topic: {e}"),
                }
            }
        });
    }

    /// A message arrived for a launched session that is not running: it
    /// waits in the journal, and the session is started again for it (once
    /// per absence). Answers whether the owner is such a launch.
    pub(super) fn resume_for_message(self: &Arc<Self>, owner: &str, user: i64) -> Comeback {
        let launch = match self.cx.store().launch_by_profile(owner) {
            Ok(Some(launch)) if !launch.state.is_running() => launch,
            Ok(Some(launch)) if lock(&self.resuming).contains(&launch.id) => {
                return Comeback::Resuming;
            }
            Ok(Some(launch)) => return self.hurry(&launch, user),
            _ => return Comeback::No,
        };
        let launches = self.clone();
        self.cx.errands.run(async move {
            if let Err(why) = launches.resume(&launch.id, user).await {
                tracing::warn!(launch = %launch.id, "cannot resume for a message: {why}");
                let binding = launches.cx.store().binding(owner_key(&launch));
                if let Some(target) = binding.ok().flatten().and_then(|b| b.target()) {
                    let text = format!(
                        "⚠️ This session could not be started again: {why}. Your message is kept."
                    );
                    if let Err(e) = launches.cx.speaker.post(target.into(), text).await {
                        tracing::warn!("cannot say a resume failed: {e}");
                    }
                }
            }
        });
        Comeback::Resuming
    }

    /// A message waits for a launched session that should be running and
    /// is away: if this machine's `serve` is on the bus (it came back and
    /// is starting its sessions again a few at a time), it starts this one
    /// next rather than in its turn. One that runs or is being started
    /// already is left as it is; the message waits in the journal either
    /// way. `Returning` when `serve` is bringing it back after its restart.
    fn hurry(self: &Arc<Self>, launch: &Launch, user: i64) -> Comeback {
        if self.serve_status().is_none() {
            return Comeback::No;
        }
        let returning = if lock(&self.returning).contains(&launch.id) {
            Comeback::Returning
        } else {
            Comeback::No
        };
        let launches = self.clone();
        let spec = spec_of(launch, user);
        self.cx.errands.run(async move {
            let id = spec.launch_id.clone();
            let outcome = launches.order(OrderOp::Start(spec), ORDER_WAIT).await;
            tracing::debug!(launch = %id, "a message hurried a launched session: {outcome:?}");
        });
        returning
    }

    /// The line a launched session's new topic opens with, under its name.
    pub(super) fn launch_note(&self, id: &str) -> Option<String> {
        let launch = self.cx.store().launch(id).ok().flatten()?;
        let mut note = format!("▶ {}, started from the phone", launch.engine);
        if let Some(prompt) = &launch.first_prompt {
            note.push_str(&format!(": “{}”", crate::policy::clip(prompt.trim(), 300)));
        }
        Some(note)
    }

    /// The launch of a session, as `/sessions` and the status show it.
    pub(super) fn session_launches(&self) -> HashMap<String, SessionLaunch> {
        match self.cx.store().launches() {
            Ok(launches) => launches
                .into_iter()
                .filter_map(|l| {
                    Some((
                        l.profile_key.clone()?,
                        SessionLaunch {
                            launch_id: l.id,
                            engine: l.engine,
                            state: l.state.as_str().to_string(),
                            by_user: (l.by_user != 0).then_some(l.by_user),
                        },
                    ))
                })
                .collect(),
            Err(e) => {
                tracing::warn!("cannot read the launches: {e}");
                HashMap::new()
            }
        }
    }
}

/// A link to a topic, where Telegram has one (a supergroup's topic: its
/// `-100` id without the prefix).
pub(super) fn topic_link(target: Target) -> Option<String> {
    let id = target.chat_id.to_string();
    let bare = id.strip_prefix("-100")?;
    Some(format!("https://t.me/c/{bare}/{}", target.thread_id))
}

/// A topic's name as HTML, linked where Telegram allows.
pub(super) fn topic_html(name: &str, target: Option<Target>) -> String {
    match target.and_then(topic_link) {
        Some(link) => format!("<a href=\"{}\">{}</a>", escape(&link), escape(name)),
        None => format!("<b>{}</b>", escape(name)),
    }
}

/// What an order that did nothing says.
pub(super) fn refused(why: &str) -> RemoteDone {
    RemoteDone {
        ok: false,
        text: format!("⚠️ Not done: {}", escape(why)),
    }
}

fn owner_key(launch: &Launch) -> &str {
    launch.profile_key.as_deref().unwrap_or_default()
}

/// What `serve` needs to start `launch` (again).
fn spec_of(launch: &Launch, by_user: i64) -> LaunchSpec {
    LaunchSpec {
        launch_id: launch.id.clone(),
        engine: launch.engine.clone(),
        folder: launch.folder.clone(),
        resume_id: launch.resume_id.clone(),
        model: launch.model.clone(),
        by_user,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_links_exist_in_supergroups_only() {
        let group = Target {
            chat_id: -1_001_234_567_890,
            thread_id: 42,
        };
        assert_eq!(
            topic_link(group).as_deref(),
            Some("https://t.me/c/1234567890/42")
        );
        let private = Target {
            chat_id: 1001,
            thread_id: 42,
        };
        assert_eq!(topic_link(private), None);
    }
}

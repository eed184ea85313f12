//! One agent session: what the host told us about it, its three status facts
//! (binding, transport, sync), and the translation of host requests and
//! events into relay actions. It sees neither bytes nor sockets: the host
//! side is a [`HostLink`], the relay is a [`Member`] of the bus.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::commands::{self, Command};
use crate::commands::{relay_status_text, restart_text};
use crate::config::{Config, ConfigError};
use crate::host::{Handler, HostEvent, HostLink, RpcError};
use crate::member::{JoinRequest, Member, MemberState, Role};
use crate::paths::Paths;
use crate::protocol::bus::{ClusterLinkState, Health};
use crate::protocol::host::*;
use crate::topics;

mod approvals;
mod dialog;
mod facts;
mod inbound;
mod media;
mod outbound;
mod sending;
mod transcribe;
mod unsent;

pub use facts::{BindingFact, Facts, OutboxFact, SyncFact, TransportFact};
use facts::{
    describe_binding, describe_cluster, describe_outbox, describe_sync, describe_transport,
};
use outbound::ToTopic;

/// How long closing waits for the messages queued for the topic.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// How long `/telegram-connect` waits for the registration.
const CONNECT_WAIT: Duration = Duration::from_secs(15);

/// How much of a locally typed prompt is mirrored into the topic.
const MIRROR_LIMIT: usize = 2000;

/// How long the user has to answer a confirmation dialog.
const CONFIRM_TIMEOUT: Duration = Duration::from_secs(60);

/// The environment variable `agent-relay serve` names a launched agent's
/// launch in (docs/DESIGN.md, *Launching*): the sidecar its host spawns
/// registers as that launch, so the leader links the two without guessing.
pub const LAUNCH_ENV: &str = "AGENT_RELAY_LAUNCH_ID";

/// What `initialize` told us.
#[derive(Debug, Clone)]
struct Identity {
    cwd: String,
    session: SessionInfo,
    host_pid: Option<u32>,
    has_ui: bool,
    can_abort: bool,
    can_steer: bool,
}

impl Identity {
    /// Names the session across restarts: the host's session file when it has
    /// one (a resumed session gets its topic back), else cwd + session name.
    fn profile_key(&self) -> String {
        match &self.session.file {
            Some(file) => format!("file:{file}"),
            None => format!(
                "cwd:{}#{}",
                self.cwd,
                self.session.name.as_deref().unwrap_or("")
            ),
        }
    }

    /// What the topic is called after the slot letter.
    fn session_name(&self) -> String {
        if let Some(name) = self
            .session
            .name
            .as_deref()
            .filter(|n| !n.trim().is_empty())
        {
            return name.trim().to_string();
        }
        std::path::Path::new(&self.cwd)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "session".into())
    }
}

struct State {
    identity: Option<Identity>,
    initialized: bool,
    disconnected: bool,
    member: Option<Arc<Member>>,
    /// What the session sends into its topic, in order.
    outbound: Option<tokio::sync::mpsc::UnboundedSender<ToTopic>>,
    /// The task behind `outbound`, waited for when the session closes.
    outbound_task: Option<tokio::task::JoinHandle<()>>,
    /// The last answer sent, so `agent/ended` does not repeat `turn/ended`.
    last_answer: Option<String>,
    /// Cancels the tasks of the current membership.
    membership: CancellationToken,
}

/// One agent session, shared by the host transport's tasks.
pub struct Session {
    host: HostLink,
    paths: Paths,
    config: Result<Config, ConfigError>,
    state: Mutex<State>,
    facts: watch::Sender<Facts>,
    stop: CancellationToken,
    /// The agent is working (between `agent/started` and `agent/ended`).
    busy: AtomicBool,
    /// The run under way ended (`agent/ended`): what waited for it goes to
    /// the host (`inbound.rs`).
    run_ended: tokio::sync::Notify,
    /// `/stop` from the topic stopped the run under way: what the run
    /// answers from now on is cut off, whether or not the host says so.
    stopped: AtomicBool,
    /// "Allow for this session" grants.
    grants: Mutex<approvals::Grants>,
    /// Whose phone messages the host has, and whom the turn concerns.
    requesters: Mutex<approvals::Requesters>,
    /// The topic was told how to have voice notes transcribed.
    told_about_voice: AtomicBool,
    /// Answers of the host's own dialogs, for the questions they close.
    resolutions: Mutex<dialog::Resolutions>,
    /// Deliveries the host holds for a turn to take (`queued`), by update
    /// id: acknowledged when a turn takes them (`agent/taken`), else they
    /// stay the leader's for when the session is resumed.
    untaken: Mutex<Untaken>,
    /// Files on their way to the topic (`sending.rs`).
    uploads: Mutex<sending::Uploads>,
    /// Messages the relay would not take at all (`unsent.rs`).
    not_taken: std::sync::atomic::AtomicU32,
    /// The leader's count of messages that reached neither the topic nor
    /// a notice about them.
    leader_undelivered: std::sync::atomic::AtomicU32,
    /// The launch this session is, when `agent-relay serve` started it.
    launch: std::sync::OnceLock<String>,
    /// The `Arc` this session lives in, for spawning tasks from `&self`.
    this: std::sync::Weak<Session>,
}

/// A session served in this process, for a host played by the relay
/// itself (Claude Code's MCP server, Codex's bridge, a Codex hook): the
/// host protocol runs over an in-memory pipe, so the session is exactly
/// the one `agent-relay stdio` serves.
pub struct InProcess {
    /// The host's end: requests and notifications to the session.
    pub link: crate::host_client::Link,
    /// What the session says to its host on its own.
    pub from_session: tokio::sync::mpsc::UnboundedReceiver<crate::host_client::Said>,
    /// The session, once the transport made it (at once).
    pub session: Arc<std::sync::OnceLock<Arc<Session>>>,
}

impl InProcess {
    /// Starts the session's transport; the session exists once the host
    /// says `initialize`.
    pub fn start(paths: Paths, config: Result<Config, ConfigError>) -> Self {
        Self::start_as(paths, config, None)
    }

    /// [`InProcess::start`] for launch `launch` of `agent-relay serve`,
    /// marked before the session can join the bus.
    pub fn start_as(
        paths: Paths,
        config: Result<Config, ConfigError>,
        launch: Option<String>,
    ) -> Self {
        let (session_side, host_side) = tokio::io::duplex(1 << 16);
        let (session_in, session_out) = tokio::io::split(session_side);
        let (host_in, host_out) = tokio::io::split(host_side);
        let sessions: Arc<std::sync::OnceLock<Arc<Session>>> = Arc::default();
        let slot = sessions.clone();
        crate::tasks::spawn(async move {
            let served = crate::host::serve(session_in, session_out, move |link| {
                let session = Session::new(link, paths, config);
                if let Some(launch) = launch {
                    session.set_launch(launch);
                }
                let _ = slot.set(session.clone());
                session
            })
            .await;
            if let Err(e) = served {
                tracing::warn!("the in-process session's transport failed: {e}");
            }
        });
        let (link, from_session) = crate::host_client::Link::over(host_in, host_out, false);
        Self {
            link,
            from_session,
            session: sessions,
        }
    }

    /// Closes the session (see [`Session::close`]), if there is one.
    pub async fn close(session: &std::sync::OnceLock<Arc<Session>>) {
        if let Some(session) = session.get() {
            session.close().await;
        }
    }
}

/// Deliveries a host holds for a turn to take. The host's "a turn took
/// it" may overtake its own answer to the delivery (they travel apart), so
/// a take that finds nothing held is remembered, a bounded few.
#[derive(Default)]
struct Untaken {
    /// Update id → delivery id.
    held: std::collections::HashMap<i64, u64>,
    /// Updates taken before the host's answer said it holds them.
    taken_early: std::collections::VecDeque<i64>,
}

impl Untaken {
    /// How many early takes are remembered.
    const EARLY: usize = 64;

    /// Holds a delivery; true when a turn already took it.
    fn hold(&mut self, update_id: i64, delivery_id: u64) -> bool {
        if let Some(at) = self.taken_early.iter().position(|&id| id == update_id) {
            self.taken_early.remove(at);
            return true;
        }
        self.held.insert(update_id, delivery_id);
        false
    }

    /// The deliveries a turn took.
    fn took(&mut self, update_ids: &[i64]) -> Vec<u64> {
        let mut taken = Vec::new();
        for id in update_ids {
            match self.held.remove(id) {
                Some(delivery_id) => taken.push(delivery_id),
                None => {
                    if self.taken_early.len() == Self::EARLY {
                        self.taken_early.pop_front();
                    }
                    self.taken_early.push_back(*id);
                }
            }
        }
        taken
    }
}

impl Session {
    pub fn new(host: HostLink, paths: Paths, config: Result<Config, ConfigError>) -> Arc<Self> {
        let binding = match &config {
            Err(e) => BindingFact::Unconfigured {
                problem: Some(e.to_string()),
            },
            Ok(c) if c.token.is_none() => BindingFact::Unconfigured { problem: None },
            Ok(_) => BindingFact::Idle,
        };
        let (facts, _) = watch::channel(Facts {
            binding,
            transport: TransportFact::None,
            sync: SyncFact::None,
            outbox: OutboxFact::default(),
        });
        Arc::new_cyclic(|this| Self {
            this: this.clone(),
            host,
            paths,
            config,
            state: Mutex::new(State {
                identity: None,
                initialized: false,
                disconnected: false,
                member: None,
                outbound: None,
                outbound_task: None,
                last_answer: None,
                membership: CancellationToken::new(),
            }),
            facts,
            stop: CancellationToken::new(),
            busy: AtomicBool::new(false),
            run_ended: tokio::sync::Notify::new(),
            stopped: AtomicBool::new(false),
            grants: Mutex::default(),
            requesters: Mutex::default(),
            told_about_voice: AtomicBool::new(false),
            resolutions: Mutex::default(),
            untaken: Mutex::default(),
            uploads: Mutex::default(),
            not_taken: Default::default(),
            leader_undelivered: Default::default(),
            launch: std::sync::OnceLock::new(),
        })
    }

    /// Marks this session as launch `id` of `agent-relay serve`; call it
    /// before the session joins the bus.
    pub fn set_launch(&self, id: String) {
        if self.launch.set(id).is_err() {
            tracing::warn!("the session's launch was set twice");
        }
    }

    fn grants(&self) -> std::sync::MutexGuard<'_, approvals::Grants> {
        self.grants.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn requesters(&self) -> std::sync::MutexGuard<'_, approvals::Requesters> {
        self.requesters.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn resolutions(&self) -> std::sync::MutexGuard<'_, dialog::Resolutions> {
        self.resolutions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn has_ui(&self) -> bool {
        self.state().identity.as_ref().is_some_and(|i| i.has_ui)
    }

    /// Whether `/stop` (and a draft's stop button) can stop the host's turn.
    fn can_abort(&self) -> bool {
        self.state().identity.as_ref().is_none_or(|i| i.can_abort)
    }

    /// Whether a prompt can go into the host's running turn (`canSteer`):
    /// then a message written mid-turn waits here for the next turn, and
    /// the topic offers to steer it in (`inbound.rs`).
    fn can_steer(&self) -> bool {
        self.state().identity.as_ref().is_some_and(|i| i.can_steer)
    }

    /// The session's working directory, as the host said.
    fn cwd(&self) -> String {
        self.state()
            .identity
            .as_ref()
            .map(|i| i.cwd.clone())
            .unwrap_or_default()
    }

    /// The current facts (for tests and `/telegram-status`).
    pub fn facts(&self) -> Facts {
        self.facts.borrow().clone()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock means a panic elsewhere already; the state itself is
        // plain data and still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn member(&self) -> Option<Arc<Member>> {
        self.state().member.clone()
    }

    fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Relaxed)
    }

    /// The host stopped the run on `/stop`: if one was under way, its
    /// answer is cut off (a host may not say so itself).
    fn stopped_by_user(&self) {
        if self.is_busy() {
            self.stopped.store(true, Ordering::Relaxed);
        }
    }

    /// Queues something for this session's topic (dropped when not connected).
    fn send_out(&self, outgoing: ToTopic) {
        if let Some(tx) = &self.state().outbound {
            let _ = tx.send(outgoing);
        }
    }

    /// Pushes the status line whenever a fact changes, from `initialized` on,
    /// and every few seconds while a pacing countdown runs; tells the host
    /// once of what only the user can fix (a rejected token, missing rights).
    fn spawn_status_line(self: &Arc<Self>) {
        let mut facts = self.facts.subscribe();
        let host = self.host.clone();
        let stop = self.stop.clone();
        crate::tasks::spawn(async move {
            let mut last = None;
            let mut told = None;
            loop {
                let current = facts.borrow_and_update().clone();
                let (text, tone) = current.render();
                if last.as_ref() != Some(&(text.clone(), tone)) {
                    host.notify(
                        method::UI_SET_STATUS,
                        &SetStatusParams {
                            key: STATUS_KEY.into(),
                            text: Some(text.clone()),
                            tone,
                        },
                    );
                    last = Some((text, tone));
                }
                let notice = current.notice();
                if let Some(message) = &notice
                    && told.as_ref() != Some(message)
                {
                    host.notify(
                        method::UI_NOTIFY,
                        &NotifyParams {
                            message: message.clone(),
                            level: NotifyLevel::Error,
                        },
                    );
                }
                told = notice;
                let countdown = current
                    .outbox
                    .paced_until
                    .filter(|until| *until > std::time::Instant::now());
                tokio::select! {
                    changed = facts.changed() => if changed.is_err() { break },
                    () = stop.cancelled() => break,
                    () = tick(countdown) => {}
                }
            }
        });
    }

    /// Joins the bus (idempotent) and mirrors the member's state into facts.
    fn connect(self: &Arc<Self>) -> Result<Arc<Member>, String> {
        let config = match &self.config {
            Ok(c) if c.token.is_some() => c.clone(),
            Ok(c) => {
                return Err(format!(
                    "Telegram is not configured: set bot_token in {} or TELEGRAM_BOT_TOKEN.",
                    c.file.display()
                ));
            }
            Err(e) => return Err(format!("The configuration has an error: {e}")),
        };
        let mut state = self.state();
        if let Some(member) = &state.member {
            return Ok(member.clone());
        }
        let identity = state
            .identity
            .clone()
            .ok_or("the host has not sent initialize yet")?;
        let long_answers_as_file = config.files.long_answers_as_file;
        let (member, deliveries) = Member::join(JoinRequest {
            paths: self.paths.clone(),
            config,
            profile_key: identity.profile_key(),
            session_name: identity.session_name(),
            cwd: identity.cwd.clone(),
            pid: std::process::id(),
            launch: self.launch.get().cloned(),
        });
        let member = Arc::new(member);
        let membership = self.stop.child_token();
        state.member = Some(member.clone());
        state.disconnected = false;
        let (outbound, task) = outbound::spawn(
            Arc::downgrade(self),
            member.clone(),
            membership.clone(),
            long_answers_as_file,
        );
        state.outbound = Some(outbound);
        state.outbound_task = Some(task);
        state.membership = membership.clone();
        drop(state);
        if self.is_busy() {
            self.send_out(ToTopic::Busy(true));
        }
        self.facts
            .send_modify(|f| f.binding = BindingFact::Connecting);
        self.spawn_member_mirror(&member);
        crate::tasks::spawn(inbound::run(
            Arc::downgrade(self),
            member.clone(),
            deliveries,
            membership,
        ));
        Ok(member)
    }

    fn spawn_member_mirror(self: &Arc<Self>, member: &Member) {
        let mut states = member.watch();
        let session = Arc::downgrade(self);
        let stop = self.stop.clone();
        crate::tasks::spawn(async move {
            loop {
                let Some(session) = session.upgrade() else {
                    break;
                };
                let state = states.borrow_and_update().clone();
                session.apply_member_state(&state);
                drop(session);
                tokio::select! {
                    changed = states.changed() => if changed.is_err() { break },
                    () = stop.cancelled() => break,
                }
            }
        });
    }

    fn apply_member_state(&self, member: &MemberState) {
        if self.state().disconnected {
            return;
        }
        self.leader_reports_undelivered(member.outbox.undelivered);
        self.facts.send_modify(|f| {
            let blocked = member
                .route
                .as_ref()
                .is_some_and(|r| r.target.is_none())
                .then_some(member.blocker)
                .flatten();
            f.binding = match (&member.route, blocked) {
                (Some(_), _) if member.needs_pairing => BindingFact::Unpaired,
                (Some(_), Some(blocker)) => BindingFact::Blocked {
                    blocker,
                    problem: member.problem.clone().unwrap_or_default(),
                },
                // `laptop·api` when the relay spans machines.
                (Some(route), None) => BindingFact::Bound {
                    slot: route.slot,
                    name: topics::session_part(&route.topic_name).replace(" · ", "·"),
                },
                (None, _) => BindingFact::Connecting,
            };
            let cluster_down = member
                .cluster
                .as_ref()
                .is_some_and(|c| c.state == ClusterLinkState::Down);
            f.transport = transport_fact(member.role, &member.telegram, cluster_down);
            f.outbox.paced_until = member.paced_until;
            // A blocked binding's problem is the binding's to show.
            let problem = member.problem.as_ref().filter(|_| blocked.is_none());
            f.sync = match (problem, member.epoch) {
                (Some(problem), _) => SyncFact::Stale(problem.clone()),
                (None, Some(epoch)) if member.role.is_connected() && member.synced => {
                    SyncFact::Synced(epoch)
                }
                _ => SyncFact::Syncing,
            };
        });
    }

    async fn run(self: &Arc<Self>, command: Command) -> ExecuteResult {
        let (ok, message) = match command {
            Command::Status { debug } => (true, self.status_report(debug).await),
            Command::Connect => self.connect_command().await,
            Command::Disconnect => return self.disconnect().await,
            Command::RelayStatus => match self.member() {
                Some(member) => match member.cluster_status().await {
                    Ok(status) => (true, relay_status_text(&status)),
                    Err(e) => (false, format!("Relay status unavailable: {e}")),
                },
                None => (
                    false,
                    "This session is not connected to the relay; run /telegram-connect first."
                        .into(),
                ),
            },
            Command::RelayRestart => match self.member() {
                Some(member) => restart_text(&member.restart().await),
                None => (
                    false,
                    "This session is not connected to the relay; run /telegram-connect first."
                        .into(),
                ),
            },
        };
        ExecuteResult::new(ok, message)
    }

    /// `/telegram-connect`: join (or re-provision a topic that could not be
    /// had), and offer a pairing link when nobody may drive sessions yet.
    async fn connect_command(self: &Arc<Self>) -> (bool, String) {
        let had_member = self.member().is_some();
        let member = match self.connect() {
            Ok(member) => member,
            Err(message) => return (false, message),
        };
        let before = member.watch().borrow().clone();
        if had_member && before.route.as_ref().is_some_and(|r| r.target.is_none()) {
            // The user asks again: retry provisioning, even after an
            // unknown outcome.
            if let Err(e) = member.reregister().await {
                return (false, format!("Cannot register again: {e}"));
            }
            let mut states = member.watch();
            let _ = tokio::time::timeout(
                CONNECT_WAIT,
                states.wait_for(|s| s.role.is_connected() && s.epoch.is_some() && s != &before),
            )
            .await;
        }
        let state = member.wait_registered(CONNECT_WAIT).await;
        let Some(route) = state.route.clone() else {
            return (
                false,
                format!(
                    "Joining the relay is taking long: {}",
                    state.problem.as_deref().unwrap_or("no leader answered yet")
                ),
            );
        };
        let mut message = format!(
            "Connected as {} ({}).",
            route.topic_name,
            state.role.describe()
        );
        if let Some(problem) = &state.problem {
            message.push_str(&format!("\nNo topic yet: {problem}"));
        }
        if state.needs_pairing {
            match member.pair().await {
                Ok(link) => message.push_str(&format!(
                    "\nNobody is paired with the bot yet. Open {} on the phone that should drive this session and press Start (valid {} minutes).",
                    link.url,
                    link.expires_in_s / 60
                )),
                Err(e) => message.push_str(&format!("\nNobody is paired yet, and no pairing link could be made: {e}")),
            }
        }
        (state.problem.is_none() || state.needs_pairing, message)
    }

    async fn disconnect(self: &Arc<Self>) -> ExecuteResult {
        let Some(member) = self.member() else {
            return ExecuteResult::new(false, "This session is not connected to the relay.");
        };
        let what = match &member.watch().borrow().route {
            Some(route) => format!("topic {}", route.topic_name),
            None => "this session's topic".into(),
        };
        // Asked at the terminal and on the phone; the first answer counts.
        // A host without dialogs is not asked (the person just typed it).
        if self.has_ui()
            && let Err(cancelled) = self.confirm_disconnect(&what).await
        {
            return cancelled;
        }
        let disconnected = match member.disconnect().await {
            Ok(disconnected) => disconnected,
            Err(e) => {
                return ExecuteResult::new(
                    false,
                    format!("Topic deletion not confirmed ({e}); retry /telegram-disconnect."),
                );
            }
        };
        {
            let mut state = self.state();
            state.member = None;
            state.outbound = None;
            state.membership.cancel();
            state.disconnected = true;
        }
        member.leave().await;
        self.facts.send_modify(|f| {
            f.binding = BindingFact::Disconnected;
            f.transport = TransportFact::None;
            f.sync = SyncFact::None;
        });
        if disconnected.cleanup_pending {
            // The leader hands over whatever Telegram said; its successor
            // finishes the deletion.
            ExecuteResult::new(
                false,
                format!(
                    "Disconnected, but Telegram has not confirmed deleting {what} yet; the relay will finish it."
                ),
            )
        } else {
            ExecuteResult::new(
                true,
                format!("Deleted {what}; this session no longer relays to Telegram."),
            )
        }
    }

    /// Asks whether to delete `what` and disconnect; the answer to give
    /// when the person did not say yes.
    async fn confirm_disconnect(self: &Arc<Self>, what: &str) -> Result<(), ExecuteResult> {
        /// The confirmation's buttons (at the terminal, yes and no).
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        enum Disconnect {
            Delete,
            Keep,
        }
        let question = dialog::Question {
            title: "Disconnect from Telegram".into(),
            html: format!(
                "🗑 Delete <b>{}</b> and disconnect this session?",
                crate::render::escape(what)
            ),
            detail: Some(format!("Delete {what} and disconnect this session?")),
            options: dialog::Options::new([
                (Disconnect::Delete, "🗑 Yes, delete it".into()),
                (Disconnect::Keep, "Keep it".into()),
            ]),
            free_text: false,
            timeout: CONFIRM_TIMEOUT,
            terminal: dialog::Terminal::Confirm,
            timeout_outcome: "⌛ No answer: nothing changed".into(),
            elsewhere: None,
            concerns: crate::protocol::bus::Concerns::Owners,
        };
        match self.ask_person(question).await {
            dialog::Answer::Choice {
                choice: Disconnect::Delete,
                ..
            } => Ok(()),
            dialog::Answer::Nothing(_, why) => Err(ExecuteResult::cancelled(format!(
                "Disconnect cancelled ({why}); nothing changed."
            ))),
            _ => Err(ExecuteResult::cancelled(
                "Disconnect cancelled; nothing changed.",
            )),
        }
    }

    /// Where this session's topics go, as `/telegram-status` says it.
    fn chat_description(&self, config: &Config) -> String {
        if let Some(id) = config.chat_id {
            return format!("chat {id}");
        }
        // A private chat's id is its user's id.
        let bound = self
            .member()
            .and_then(|m| m.watch().borrow().route.as_ref().and_then(|r| r.target))
            .map(|t| t.chat_id)
            .filter(|id| *id > 0);
        match bound.or(config.allowed_users.first().copied()) {
            Some(user) => format!("private chat with user {user}"),
            None => "the private chat of whoever pairs".into(),
        }
    }

    async fn status_report(&self, debug: bool) -> String {
        let facts = self.facts();
        let mut out = format!("{}\n", self.config_line());
        out.push_str(&format!("binding: {}\n", describe_binding(&facts.binding)));
        let route = self.member().map(|m| m.watch().borrow().clone());
        let clustered = route.as_ref().is_some_and(|s| s.cluster.is_some());
        let transport = match facts.transport {
            // Across machines, the machine that polls is on the cluster line.
            TransportFact::Leader if clustered => "leader of this machine's sessions".to_string(),
            ref other => describe_transport(other),
        };
        out.push_str(&format!("transport: {transport}\n"));
        out.push_str(&format!("sync: {}\n", describe_sync(&facts.sync)));
        let private = route.as_ref().is_some_and(|s| {
            s.route
                .as_ref()
                .and_then(|r| r.target)
                .is_some_and(|t| t.chat_id > 0)
        });
        out.push_str(&format!(
            "outbox: {}\n",
            describe_outbox(&facts.outbox, private, std::time::Instant::now())
        ));
        match self.uploads_kept() {
            0 => {}
            1 => out.push_str("files: 1 on its way, Telegram has not answered yet\n"),
            n => out.push_str(&format!(
                "files: {n} on their way, Telegram has not answered yet\n"
            )),
        }
        if let Ok(config) = &self.config {
            out.push_str(&format!(
                "approvals: {}\n",
                describe_approvals(&config.approvals)
            ));
        }
        if let Some(grants) = self.grants().describe() {
            out.push_str(&format!("allowed for this session: {grants}\n"));
        }
        if let Some(state) = &route {
            if let Some(link) = &state.cluster {
                out.push_str(&format!("cluster: {}\n", describe_cluster(link)));
            }
            if let Some(pid) = state.leader_pid {
                out.push_str(&format!("leader: pid {pid}"));
                if let Some(epoch) = state.epoch {
                    out.push_str(&format!(", epoch {epoch}"));
                }
                out.push('\n');
            }
            if debug {
                out.push_str(&format!("debug: {state:?}\n"));
            }
        }
        if debug {
            out.push_str(&self.debug_lines());
        }
        out.truncate(out.trim_end().len());
        out
    }

    /// `/telegram-status`'s first line: the configuration in use.
    fn config_line(&self) -> String {
        match &self.config {
            Err(e) => format!("configuration: error — {e}"),
            Ok(c) => match &c.token {
                None => format!(
                    "configuration: not configured — set bot_token in {} (or TELEGRAM_BOT_TOKEN)",
                    c.file.display()
                ),
                Some(t) => format!(
                    "configuration: bot {} · {} · {} allowed user(s) · {}",
                    t.bot_id(),
                    self.chat_description(c),
                    c.allowed_users.len(),
                    c.file.display()
                ),
            },
        }
    }

    /// `/telegram-status debug`'s own lines: who this is and where its
    /// files are.
    fn debug_lines(&self) -> String {
        let mut out = String::new();
        let identity = self.state().identity.clone();
        if let Some(identity) = identity {
            out.push_str(&format!(
                "debug: profile {:?}, host pid {:?}, sidecar pid {}\n",
                identity.profile_key(),
                identity.host_pid,
                std::process::id()
            ));
        }
        out.push_str(&format!(
            "debug: state dir {}, runtime dir {}\n",
            self.paths.state_dir.display(),
            self.paths.runtime_dir.display()
        ));
        out
    }
}

/// The `[approvals]` policy as `/telegram-status` says it.
fn describe_approvals(policy: &crate::policy::Policy) -> String {
    let where_asked = match policy.mode {
        crate::policy::Mode::Off => return "off".to_string(),
        crate::policy::Mode::Both => "phone and terminal",
        _ => "on the phone",
    };
    format!(
        "{where_asked} for {} · denied after {} s without an answer{}",
        policy.tools().join(", "),
        policy.timeout.as_secs(),
        if policy.only_from_telegram {
            " · turns from Telegram only"
        } else {
            ""
        }
    )
}

impl Session {
    /// The host is ready: the status line starts, and the session joins the
    /// relay if it is configured to. Once.
    fn initialized(&self) {
        let Some(me) = self.me() else { return };
        let first = !std::mem::replace(&mut self.state().initialized, true);
        if !first {
            return;
        }
        me.spawn_status_line();
        let auto = matches!(&self.config, Ok(c) if c.token.is_some() && c.auto_connect);
        if auto && let Err(e) = me.connect() {
            tracing::warn!("cannot join the relay: {e}");
        }
    }

    /// A turn's text: on the way (it called tools), it joins the progress
    /// message; at the end, it is the answer.
    fn turn_ended(&self, turn: &TurnEndedParams) {
        if turn.error.is_some() {
            // A failed try's text is broken (a stream cut mid-answer): no
            // answer, no line of the progress, and gone from the draft. The
            // host may try again; `agent/ended` says if the turn failed.
            self.send_out(ToTopic::Writing(String::new()));
            return;
        }
        let text = turn.assistant_text.trim();
        if text.is_empty() {
            return;
        }
        if !turn.tool_calls.is_empty() && !turn.aborted {
            self.send_out(ToTopic::Interim(text.to_string()));
            return;
        }
        self.state().last_answer = Some(text.to_string());
        self.send_out(ToTopic::Answer {
            markdown: text.to_string(),
            cut: turn.aborted || self.stopped.load(Ordering::Relaxed),
        });
    }

    /// The agent is done: its last text is the answer unless a turn said it
    /// already; then the progress message's summary follows it. A run that
    /// failed for good says so once, with its error, and has no answer
    /// (one that was stopped meanwhile said `⏹ Stopped.` already).
    fn agent_ended(&self, ended: &AgentEndedParams) {
        self.busy.store(false, Ordering::Relaxed);
        self.run_ended.notify_one();
        let stopped = self.stopped.swap(false, Ordering::Relaxed);
        if let Some(error) = &ended.error {
            if !(ended.aborted || stopped) {
                self.send_out(ToTopic::Failed(error.trim().to_string()));
            }
            self.send_out(ToTopic::Busy(false));
            self.state().last_answer = None;
            return;
        }
        let last = ended.last_assistant_text.as_deref().map(str::trim);
        if let Some(text) = last.filter(|t| !t.is_empty()) {
            let already = self.state().last_answer.as_deref() == Some(text);
            if !already {
                self.send_out(ToTopic::Answer {
                    markdown: text.to_string(),
                    cut: ended.aborted || stopped,
                });
            }
        }
        self.send_out(ToTopic::Busy(false));
        self.state().last_answer = None;
    }
}

impl Handler for Session {
    async fn initialize(&self, params: InitializeParams) -> Result<InitializeResult, RpcError> {
        if params.protocol_version < PROTOCOL_VERSION {
            return Err(RpcError::invalid_params(format!(
                "unsupported protocolVersion {}: this sidecar speaks {PROTOCOL_VERSION}",
                params.protocol_version
            )));
        }
        self.state().identity = Some(Identity {
            cwd: params.cwd,
            session: params.session,
            host_pid: params.pid,
            has_ui: params.has_ui,
            can_abort: params.can_abort,
            can_steer: params.can_steer,
        });
        Ok(InitializeResult {
            protocol_version: PROTOCOL_VERSION,
            sidecar: SidecarInfo {
                name: env!("CARGO_PKG_NAME").into(),
                version: env!("CARGO_PKG_VERSION").into(),
            },
            commands: commands::specs(),
            status_key: STATUS_KEY.into(),
        })
    }

    async fn execute(&self, params: ExecuteParams) -> ExecuteResult {
        match commands::parse(&params.name, &params.args) {
            Ok(command) => match self.me() {
                Some(me) => me.run(command).await,
                None => ExecuteResult::new(false, "the session is shutting down"),
            },
            Err(usage) => ExecuteResult::new(false, usage.to_string()),
        }
    }

    fn notify(&self, event: HostEvent) {
        match event {
            HostEvent::Initialized => self.initialized(),
            HostEvent::AgentStarted => {
                self.busy.store(true, Ordering::Relaxed);
                self.stopped.store(false, Ordering::Relaxed);
                self.send_out(ToTopic::Busy(true));
            }
            HostEvent::TurnEnded(turn) => self.turn_ended(&turn),
            HostEvent::TurnText(writing) => {
                // Shown only where a draft can show it; superseded by the next.
                self.send_out(ToTopic::Writing(writing.text));
            }
            HostEvent::ToolStarted(tool) => {
                let argument = tool.args.as_ref().map(in_short).unwrap_or_default();
                self.send_out(ToTopic::Tool {
                    name: tool.tool_name,
                    argument,
                    call_id: tool.tool_call_id,
                });
            }
            HostEvent::AgentEnded(ended) => self.agent_ended(&ended),
            HostEvent::InputReceived(input) => {
                // What came from Telegram is not echoed back; what the user
                // typed at the computer is mirrored so the topic reads whole.
                if input.source != "extension" && !input.text.trim().is_empty() {
                    self.send_out(ToTopic::Plain(format!(
                        "🧑‍💻 {}",
                        crate::policy::clip(input.text.trim(), MIRROR_LIMIT)
                    )));
                }
            }
            HostEvent::Notice(notice) => {
                if !notice.text.trim().is_empty() {
                    self.send_out(ToTopic::Plain(crate::policy::clip(
                        notice.text.trim(),
                        MIRROR_LIMIT,
                    )));
                }
            }
            HostEvent::ApprovalResolved(resolved) => self.resolutions().resolve(
                format!("approval:{}", resolved.tool_call_id),
                resolved.decision,
            ),
            HostEvent::QuestionResolved(resolved) => self
                .resolutions()
                .resolve(format!("question:{}", resolved.id), None),
            HostEvent::SessionStarted(started) => {
                if let Some(session) = started.session
                    && let Some(me) = self.me()
                {
                    crate::tasks::spawn(async move { me.switch_session(session).await });
                }
            }
            HostEvent::Taken(taken) => self.turn_took(&taken.update_ids),
            other => tracing::trace!(?other, "host event"),
        }
    }

    async fn approve(&self, params: ApprovalParams) -> ApprovalResult {
        Session::approve(self, params).await
    }

    async fn ask(&self, params: QuestionParams) -> QuestionResult {
        self.question(params).await
    }

    async fn send_file(&self, params: SendFileParams) -> Result<SendFileResult, RpcError> {
        Session::send_file(self, params).await
    }

    async fn send_text(&self, params: TopicSendParams) -> TopicSendResult {
        Session::send_text(self, params).await
    }

    /// `agent/ended` sent as a request: answered once the turn's answer is
    /// the leader's (on disk), so a host may exit right after it.
    async fn agent_ended(&self, params: AgentEndedParams) {
        self.notify(HostEvent::AgentEnded(params));
        self.flushed(FLUSH_WAIT).await;
    }

    async fn shutdown(&self, params: ShutdownParams) {
        tracing::info!(reason = ?params.reason, "host asked to shut down");
        self.close().await;
    }
}

/// A tool's argument in one line for the progress message: the first
/// line of its preview, or, where that says nothing (a tool of the agent's
/// own whose preview is its JSON, `{`), its first text field.
pub(super) fn in_short(args: &serde_json::Value) -> String {
    let preview = crate::policy::preview(args);
    let first = preview.text.lines().next().unwrap_or_default().trim();
    if first.chars().any(char::is_alphanumeric) {
        return first.to_string();
    }
    let text = args
        .as_object()
        .and_then(|fields| fields.values().find_map(serde_json::Value::as_str));
    match text {
        Some(text) => text.lines().next().unwrap_or_default().trim().to_string(),
        None => serde_json::to_string(args).unwrap_or_default(),
    }
}

/// Resolves every few seconds while a countdown runs (so the status line
/// counts down), never otherwise.
async fn tick(countdown: Option<std::time::Instant>) {
    match countdown {
        Some(until) => {
            let left = until.saturating_duration_since(std::time::Instant::now());
            tokio::time::sleep(left.min(COUNTDOWN_STEP)).await;
        }
        None => std::future::pending().await,
    }
}

/// How often the pacing countdown in the status line moves.
const COUNTDOWN_STEP: Duration = Duration::from_secs(5);

impl Session {
    /// The host switched to another agent session (`/new`, `/resume`, …):
    /// its topic is the new session's, so the old membership is left (its
    /// binding stays for when it is resumed) and the new one joins.
    async fn switch_session(self: &Arc<Self>, session: SessionInfo) {
        let (old_key, identity, member) = {
            let mut state = self.state();
            let Some(identity) = state.identity.as_mut() else {
                return;
            };
            let old_key = identity.profile_key();
            identity.session = session;
            if identity.profile_key() == old_key {
                return;
            }
            (old_key, identity.clone(), state.member.clone())
        };
        tracing::info!(%old_key, "the host switched sessions; registering the new one");
        // The same membership (and leadership, if it leads) registers under
        // the new profile; the old binding stays for when it is resumed.
        if let Some(member) = member
            && let Err(e) = member
                .rebind(identity.profile_key(), identity.session_name())
                .await
        {
            tracing::warn!("cannot register the new session: {e}");
        }
    }

    /// The `Arc` this session lives in, for spawning tasks from `&self`.
    fn me(&self) -> Option<Arc<Self>> {
        self.this.upgrade()
    }

    /// The host holds delivery `delivery_id` (update `update_id`) until a
    /// turn takes it (at once if the host said so before its answer came).
    fn awaits_turn(&self, update_id: i64, delivery_id: u64) {
        let taken = self
            .untaken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .hold(update_id, delivery_id);
        if let (true, Some(member)) = (taken, self.member()) {
            member.ack_delivery(delivery_id);
        }
    }

    /// The updates the host holds for a turn.
    fn awaiting_turn(&self) -> std::collections::HashSet<i64> {
        self.untaken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .held
            .keys()
            .copied()
            .collect()
    }

    /// A turn took these messages: now they are settled.
    fn turn_took(&self, update_ids: &[i64]) {
        self.requesters().took(update_ids);
        let taken = self
            .untaken
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .took(update_ids);
        if let Some(member) = self.member() {
            for delivery_id in taken {
                member.ack_delivery(delivery_id);
            }
        }
    }

    /// Waits (up to `wait`) until everything queued for the topic so far
    /// is the leader's.
    async fn flushed(&self, wait: Duration) {
        let (done, flushed) = tokio::sync::oneshot::channel();
        self.send_out(ToTopic::Flush(done));
        if tokio::time::timeout(wait, flushed).await.is_err() {
            tracing::warn!("what was queued for the topic did not reach the relay within {wait:?}");
        }
    }

    /// Leaves the bus and stops background tasks, after what was queued
    /// for the topic went out (a host that exits right after its last
    /// answer, as `claude -p` and `pi -p` do, must not lose it), for at most
    /// [`FLUSH_WAIT`]. Idempotent.
    pub async fn close(&self) {
        self.uploads_cut_off();
        let task = {
            let mut state = self.state();
            state.outbound = None;
            state.outbound_task.take()
        };
        if let Some(task) = task
            && tokio::time::timeout(FLUSH_WAIT, task).await.is_err()
        {
            tracing::warn!("the last messages for the topic were not sent in time");
        }
        let member = {
            let mut state = self.state();
            state.membership.cancel();
            state.outbound = None;
            state.member.take()
        };
        if let Some(member) = member {
            member.leave().await;
        }
        self.stop.cancel();
    }
}

/// How this session reaches Telegram, from its place on the bus and the
/// leader's poll. Registered is connected: a new leader's poll that has not
/// answered yet (`Starting`) does not make the line say "reconnecting", so
/// after a failover the line follows the registration, not a timer.
fn transport_fact(role: Role, telegram: &Health, cluster_down: bool) -> TransportFact {
    match (role, telegram) {
        (Role::Joining | Role::Reconnecting | Role::Stopped, _) => TransportFact::Reconnecting,
        (_, Health::Unauthorized) => TransportFact::Unauthorized,
        _ if cluster_down => TransportFact::ClusterDown,
        (_, Health::Conflict) => TransportFact::Conflict,
        (_, Health::Offline { .. }) => TransportFact::Offline,
        (_, Health::Deaf { pending }) => TransportFact::Deaf { pending: *pending },
        (Role::Leader, _) => TransportFact::Leader,
        (Role::Follower, _) => TransportFact::Follower,
    }
}

#[cfg(test)]
mod transport_tests {
    use super::*;

    #[test]
    fn a_tools_argument_in_short_says_something() {
        let ask = serde_json::json!({"question": "Which database?\nOr none?", "options": ["a"]});
        assert_eq!(in_short(&ask), "Which database?");
        assert_eq!(
            in_short(&serde_json::json!({"command": "ls -l"})),
            "$ ls -l"
        );
        assert_eq!(in_short(&serde_json::json!({"n": 3})), "{\"n\":3}");
    }

    #[test]
    fn registered_with_a_new_leader_is_connected_before_its_poll_answers() {
        assert_eq!(
            transport_fact(Role::Follower, &Health::Starting, false),
            TransportFact::Follower
        );
        assert_eq!(
            transport_fact(Role::Leader, &Health::Starting, false),
            TransportFact::Leader
        );
        assert_eq!(
            transport_fact(Role::Reconnecting, &Health::Ok, false),
            TransportFact::Reconnecting
        );
        assert_eq!(
            transport_fact(Role::Follower, &Health::Deaf { pending: 3 }, false),
            TransportFact::Deaf { pending: 3 }
        );
    }
}

//! `agent-relay serve`, the machine's launcher (docs/DESIGN.md,
//! *Launching*). It holds `serve.lock` in the bus directory (one per bot
//! and machine), joins the bus as the launcher and then, until it is
//! stopped:
//!
//! * starts what the leader orders — after checking the folder against
//!   `[launch] roots` (`place`), with the agent's environment (`env`) —
//!   as its own child, and ends, lists models of and switches the model
//!   of what it started;
//! * reports each agent that ends: on purpose (`/end`), idle (`[launch]
//!   idle_end_hours` without a turn), or by itself (a crash, with its exit
//!   status and last stderr lines); a report that cannot be sent now (no
//!   leader for a moment) is sent after the next welcome;
//! * starts again, at every welcome, the sessions the leader's store says
//!   should be running and it does not run: after `serve` itself restarted
//!   (a crash, an upgrade, a reboot), each comes back in its own topic,
//!   from the agent's own session store — a few at a time, in the
//!   leader's order (those with messages waiting first), and one the
//!   leader orders started meanwhile (a message came for it) next;
//! * runs at most `[launch] max_agents` agents, being started included: a
//!   start past it is refused in words naming the setting;
//! * ends an agent whose start the leader gave up (it did not join in
//!   time), also while it is still being started: no agent runs that no
//!   list shows and no `/end` reaches.
//!
//! Stopped (SIGTERM, SIGINT), it ends its agents without reporting them
//! ended: they should be running, and come back when `serve` does. Killed
//! outright, its watcher (`watcher.rs`) ends their process groups.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::Engine;
use super::engine::{Agent, Context, Control, Exit, Start};
use crate::bus::election::BusDir;
use crate::config::Config;
use crate::member::{LauncherRequest, Member};
use crate::paths::Paths;
use crate::protocol::launch::{LaunchEvent, LaunchSpec, Order, OrderOp, OrderOutcome};

/// How long ending every agent may take when `serve` stops.
const STOPPING: Duration = Duration::from_secs(20);
/// How long a control of an agent may take.
const CONTROL: Duration = Duration::from_secs(30);

/// Why `serve` cannot run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "no bot token configured (bot_token in config.toml): agent-relay serve starts agents for a bot"
    )]
    NoToken,
    #[error("agent-relay serve already runs for this bot on this machine (pid {0}); one is enough")]
    AlreadyRunning(u32),
    #[error("cannot take {}: {message}", path.display())]
    Lock { path: PathBuf, message: String },
}

/// Why an agent of `serve`'s leaves.
#[derive(Debug, Clone, Copy)]
enum Ending {
    /// `/end`, by this user.
    ByUser(i64),
    /// Without a turn for this many seconds.
    Idle(u64),
    /// `serve` stops: it should come back with `serve`.
    Shutdown,
    /// The leader gave its start up (it did not join in time): it said so
    /// already, and the agent ends unreported.
    GivenUp,
}

impl Ending {
    /// What an `End` order means: by the relay itself (user 0), a start
    /// given up.
    fn ordered(by_user: i64) -> Self {
        if by_user == 0 {
            Self::GivenUp
        } else {
            Self::ByUser(by_user)
        }
    }
}

/// An agent its engine started, with where.
struct Spawned {
    folder: PathBuf,
    pid: u32,
    agent: Agent,
}

/// One agent `serve` runs.
struct Running {
    folder: PathBuf,
    pid: u32,
    control: mpsc::Sender<Control>,
    activity: watch::Receiver<Instant>,
    ending: Option<Ending>,
}

/// The agents `serve` has, by launch id, in every stage.
#[derive(Default)]
struct Agents {
    running: HashMap<String, Running>,
    /// Being started now (an order and a welcome may overlap), with the end
    /// asked for meanwhile, which comes as soon as it runs.
    starting: HashMap<String, Option<Ending>>,
    /// To be started again after `serve` came back, in the leader's order.
    queued: VecDeque<LaunchSpec>,
    /// Orders waiting for a start that is queued or under way.
    waiting: HashMap<String, Vec<oneshot::Sender<OrderOutcome>>>,
    /// Tasks starting what is queued.
    resuming: usize,
}

impl Agents {
    /// Processes running or on their way: what `[launch] max_agents` counts.
    fn count(&self) -> usize {
        self.running.len() + self.starting.len()
    }

    /// Moves `id`, if it is queued, to the front of the queue: a message
    /// waits for it. Answers whether it was queued.
    fn next_in_line(&mut self, id: &str) -> bool {
        let Some(at) = self.queued.iter().position(|q| q.launch_id == id) else {
            return false;
        };
        if let Some(spec) = self.queued.remove(at) {
            self.queued.push_front(spec);
        }
        true
    }

    fn has(&self, id: &str) -> bool {
        self.running.contains_key(id)
            || self.starting.contains_key(id)
            || self.queued.iter().any(|spec| spec.launch_id == id)
    }
}

/// `serve`'s state, shared by its tasks.
struct Serve {
    ctx: Context,
    member: Member,
    agents: Mutex<Agents>,
    /// Reports the leader has not taken yet.
    unsent: Mutex<Vec<(String, LaunchEvent)>>,
    exits: mpsc::UnboundedSender<(String, Exit)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `serve` until `stop` (see the module docs).
pub async fn run(paths: Paths, config: Config, stop: CancellationToken) -> Result<(), ServeError> {
    let bot = config.bot_id().ok_or(ServeError::NoToken)?;
    let bus = BusDir::new(paths.bus_dir(bot));
    let _held = match bus.try_lock_serve() {
        Ok(Some(held)) => held,
        Ok(None) => return Err(ServeError::AlreadyRunning(bus.serve_running().unwrap_or(0))),
        Err(e) => {
            return Err(ServeError::Lock {
                path: bus.serve_lock_path(),
                message: e.to_string(),
            });
        }
    };
    let engines: Vec<String> = config
        .launch
        .commands
        .keys()
        .filter(|name| Engine::parse(name).is_some())
        .cloned()
        .collect();
    let (member, link) = Member::join_launcher(LauncherRequest {
        paths: paths.clone(),
        config: config.clone(),
        pid: std::process::id(),
        engines,
    });
    super::watcher::start();
    let (exits, mut exited) = mpsc::unbounded_channel();
    let serve = Arc::new(Serve {
        ctx: Context { paths, config },
        member,
        agents: Mutex::default(),
        unsent: Mutex::default(),
        exits,
    });
    let mut orders = link.orders;
    let mut welcomes = link.welcomes;
    let mut idle = tokio::time::interval(idle_tick(serve.ctx.config.launch.idle_end));
    tracing::info!(pid = std::process::id(), "agent-relay serve runs");
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            Ok(()) = welcomes.changed() => {
                let resume = welcomes.borrow_and_update().as_ref().map(|w| w.resume.clone()).unwrap_or_default();
                serve.clone().welcomed(resume);
            }
            Some(order) = orders.recv() => {
                let serve = serve.clone();
                crate::tasks::spawn(async move { serve.obey(order).await });
            }
            Some((id, exit)) = exited.recv() => serve.clone().ended(&id, exit),
            _ = idle.tick() => serve.end_idle(),
        }
    }
    serve.stop_all().await;
    serve.member.leave().await;
    Ok(())
}

/// How many agents are started again at once after `serve` came back:
/// starting one is mostly the machine's work (pi compiles its extensions),
/// so about one per core, the first ones up soon rather than all late.
fn resume_at_once() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8))
}

/// How often idle agents are looked for.
fn idle_tick(idle: Option<Duration>) -> Duration {
    idle.map_or(Duration::from_secs(60), |idle| {
        (idle / 4).clamp(Duration::from_secs(1), Duration::from_secs(60))
    })
}

impl Serve {
    /// A (new) leader welcomed `serve`: what it could not report goes now,
    /// and what should run and does not is queued to start again, a few at
    /// a time ([`resume_at_once`]).
    fn welcomed(self: Arc<Self>, resume: Vec<LaunchSpec>) {
        let workers = {
            let mut agents = lock(&self.agents);
            for spec in resume {
                if !agents.has(&spec.launch_id) {
                    agents.queued.push_back(spec);
                }
            }
            let workers = resume_at_once()
                .saturating_sub(agents.resuming)
                .min(agents.queued.len());
            agents.resuming += workers;
            workers
        };
        crate::tasks::spawn(async move {
            let unsent = std::mem::take(&mut *lock(&self.unsent));
            for (id, event) in unsent {
                self.report(id, event).await;
            }
            for _ in 0..workers {
                let serve = self.clone();
                crate::tasks::spawn(async move { serve.resume_queued().await });
            }
        });
    }

    /// Starts what is queued again until nothing is; a session that cannot
    /// be started is told in its topic, as a crash.
    async fn resume_queued(self: Arc<Self>) {
        loop {
            let spec = {
                let mut agents = lock(&self.agents);
                let Some(spec) = agents.queued.pop_front() else {
                    agents.resuming -= 1;
                    return;
                };
                spec
            };
            let id = spec.launch_id.clone();
            if let OrderOutcome::Refused { reason } = self.start(spec, true).await {
                tracing::warn!(launch = %id, "cannot start a session again: {reason}");
                let event = LaunchEvent::Crashed {
                    code: None,
                    signal: None,
                    stderr: format!("agent-relay serve could not start it again: {reason}"),
                };
                self.report(id, event).await;
            }
        }
    }

    /// Runs one of the leader's orders and answers it.
    async fn obey(self: Arc<Self>, order: Order) {
        let outcome = match order.op {
            OrderOp::Start(spec) => {
                crate::logging::milestone("launch-order", 0);
                self.start(spec, false).await
            }
            OrderOp::End { launch_id, by_user } => {
                self.end(&launch_id, Ending::ordered(by_user)).await
            }
            OrderOp::Models { launch_id } => {
                let asked = self.control(&launch_id, Control::Models).await;
                match asked {
                    Ok((models, current)) => OrderOutcome::Models { models, current },
                    Err(reason) => OrderOutcome::Refused { reason },
                }
            }
            OrderOp::SetModel { launch_id, model } => {
                let set = self
                    .control(&launch_id, |reply| Control::SetModel(model, reply))
                    .await;
                match set {
                    Ok(model) => OrderOutcome::ModelSet { model },
                    Err(reason) => OrderOutcome::Refused { reason },
                }
            }
        };
        if let Err(e) = self.member.order_done(order.order_id, outcome).await {
            tracing::warn!("cannot answer an order: {e}");
        }
    }

    /// Starts (or starts again) one session; `after_restart` when `serve`
    /// itself came back. An order for a session being started, or queued
    /// to start again, waits for that start (one queued goes next in line)
    /// and answers as it does.
    async fn start(self: &Arc<Self>, spec: LaunchSpec, after_restart: bool) -> OrderOutcome {
        let id = spec.launch_id.clone();
        let waiting = {
            let mut agents = lock(&self.agents);
            if let Some(running) = agents.running.get(&id) {
                return OrderOutcome::Started {
                    folder: running.folder.display().to_string(),
                    pid: running.pid,
                };
            }
            if agents.next_in_line(&id) || agents.starting.contains_key(&id) {
                let (tx, rx) = oneshot::channel();
                agents.waiting.entry(id.clone()).or_default().push(tx);
                Some(rx)
            } else if agents.count() >= self.ctx.config.launch.max_agents {
                return OrderOutcome::Refused {
                    reason: format!(
                        "this machine runs {} agents already, as many as [launch] max_agents allows: /end one, or raise max_agents in {}",
                        agents.count(),
                        self.ctx.config.file.display()
                    ),
                };
            } else {
                agents.starting.insert(id.clone(), None);
                None
            }
        };
        if let Some(started) = waiting {
            return started.await.unwrap_or_else(|_| OrderOutcome::Refused {
                reason: "agent-relay serve is stopping".into(),
            });
        }
        let outcome = self.launch(spec, after_restart).await;
        let waiters = lock(&self.agents).waiting.remove(&id);
        for waiter in waiters.into_iter().flatten() {
            let _ = waiter.send(outcome.clone());
        }
        outcome
    }

    /// Starts one session now (it is noted as being started) and reports it.
    async fn launch(self: &Arc<Self>, spec: LaunchSpec, after_restart: bool) -> OrderOutcome {
        let id = spec.launch_id.clone();
        let started = self.spawn_agent(&spec).await;
        let ending = lock(&self.agents).starting.remove(&id).flatten();
        let agent = match started {
            Ok(agent) => agent,
            Err(reason) => return OrderOutcome::Refused { reason },
        };
        let folder = agent.folder.clone();
        let pid = agent.pid;
        lock(&self.agents).running.insert(
            id.clone(),
            Running {
                folder: folder.clone(),
                pid,
                control: agent.agent.control.clone(),
                activity: agent.agent.activity.clone(),
                ending,
            },
        );
        let exits = self.exits.clone();
        let exited = agent.agent.exited;
        let watched = id.clone();
        crate::tasks::spawn(async move {
            let exit = exited.await.unwrap_or_default();
            let _ = exits.send((watched, exit));
        });
        if ending.is_some() {
            // Ended while it was being started: it goes now, unreported as
            // started (the leader gave its start up, or it was `/end`ed).
            let (done, _) = oneshot::channel();
            let _ = agent.agent.control.send(Control::End(done)).await;
            return OrderOutcome::Ended;
        }
        let event = LaunchEvent::Started {
            resume_id: agent.agent.resume_id,
            model: agent.agent.model,
            after_restart,
        };
        self.report(id, event).await;
        OrderOutcome::Started {
            folder: folder.display().to_string(),
            pid,
        }
    }

    /// Checks the folder and the engine and has the engine start the agent.
    async fn spawn_agent(self: &Arc<Self>, spec: &LaunchSpec) -> Result<Spawned, String> {
        let launch = &self.ctx.config.launch;
        let engine = Engine::parse(&spec.engine)
            .filter(|_| launch.commands.contains_key(&spec.engine))
            .ok_or_else(|| {
                format!(
                    "{} is not an engine agent-relay serve runs here ({}); see [launch.commands] in config.toml",
                    spec.engine,
                    launch.commands.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            })?;
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let folder = super::place::resolve(&spec.folder, &launch.roots, home.as_deref(), &self.ctx.config.file)
            .map_err(|e| {
                tracing::info!(target: "audit", user = spec.by_user, folder = %spec.folder, engine = %spec.engine, "refused to start an agent: {e}");
                e.to_string()
            })?;
        let start = Start {
            launch_id: spec.launch_id.clone(),
            folder: folder.clone(),
            command: launch.commands[&spec.engine].clone(),
            resume: spec.resume_id.clone(),
            model: spec.model.clone(),
            env: super::env::agent_env(std::env::vars_os(), &spec.launch_id),
        };
        let agent = engine
            .start(start, &self.ctx)
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(
            target: "audit",
            user = spec.by_user,
            launch = %spec.launch_id,
            engine = %spec.engine,
            folder = %folder.display(),
            pid = agent.pid,
            resumed = spec.resume_id.is_some(),
            "started an agent"
        );
        Ok(Spawned {
            folder,
            pid: agent.pid,
            agent,
        })
    }

    /// Ends one agent for `why`; answered once its process is gone. One
    /// being started ends as soon as it runs, and one waiting to be started
    /// again is not started.
    async fn end(&self, id: &str, why: Ending) -> OrderOutcome {
        let control = {
            let mut agents = lock(&self.agents);
            if let Some(ending) = agents.starting.get_mut(id) {
                *ending = Some(why);
                return OrderOutcome::Ended;
            }
            let queued = agents.queued.len();
            agents.queued.retain(|spec| spec.launch_id != id);
            let was_queued = agents.queued.len() < queued;
            if was_queued {
                for waiter in agents.waiting.remove(id).into_iter().flatten() {
                    let _ = waiter.send(OrderOutcome::Refused {
                        reason: "it was ended before it started again".into(),
                    });
                }
            }
            match agents.running.get_mut(id) {
                Some(running) => {
                    running.ending = Some(why);
                    Some(running.control.clone())
                }
                None if was_queued => None,
                None => {
                    return OrderOutcome::Refused {
                        reason: "it is not running".into(),
                    };
                }
            }
        };
        let Some(control) = control else {
            // It was waiting to be started again: it is not, and says so.
            if let Ending::ByUser(by_user) = why {
                self.report(id.to_string(), LaunchEvent::Ended { by_user })
                    .await;
            }
            return OrderOutcome::Ended;
        };
        let (done, gone) = oneshot::channel();
        if control.send(Control::End(done)).await.is_ok() {
            let _ = tokio::time::timeout(STOPPING, gone).await;
        }
        OrderOutcome::Ended
    }

    /// Asks a running agent something.
    async fn control<T>(
        &self,
        id: &str,
        ask: impl FnOnce(oneshot::Sender<Result<T, String>>) -> Control,
    ) -> Result<T, String> {
        let control = lock(&self.agents)
            .running
            .get(id)
            .map(|r| r.control.clone())
            .ok_or("it is not running")?;
        let (reply, answer) = oneshot::channel();
        control
            .send(ask(reply))
            .await
            .map_err(|_| "the agent is gone".to_string())?;
        tokio::time::timeout(CONTROL, answer)
            .await
            .map_err(|_| format!("the agent did not answer within {} s", CONTROL.as_secs()))?
            .map_err(|_| "the agent is gone".to_string())?
    }

    /// An agent's process ended: reported as what ended it.
    fn ended(self: Arc<Self>, id: &str, exit: Exit) {
        let Some(running) = lock(&self.agents).running.remove(id) else {
            return;
        };
        let event = match running.ending {
            Some(Ending::Shutdown) => return,
            Some(Ending::GivenUp) => {
                tracing::info!(launch = id, "ended an agent whose start was given up");
                return;
            }
            Some(Ending::ByUser(by_user)) => LaunchEvent::Ended { by_user },
            Some(Ending::Idle(idle_s)) => LaunchEvent::Idle { idle_s },
            None => {
                tracing::warn!(launch = id, code = ?exit.code, signal = ?exit.signal, "an agent stopped by itself");
                LaunchEvent::Crashed {
                    code: exit.code,
                    signal: exit.signal,
                    stderr: exit.stderr,
                }
            }
        };
        let id = id.to_string();
        crate::tasks::spawn(async move { self.report(id, event).await });
    }

    /// Ends the agents that had no turn for `[launch] idle_end_hours`.
    fn end_idle(self: &Arc<Self>) {
        let Some(idle) = self.ctx.config.launch.idle_end else {
            return;
        };
        let idle_ones: Vec<(String, u64)> = lock(&self.agents)
            .running
            .iter()
            .filter(|(_, r)| r.ending.is_none())
            .filter_map(|(id, r)| {
                let quiet = r.activity.borrow().elapsed();
                (quiet >= idle).then(|| (id.clone(), quiet.as_secs()))
            })
            .collect();
        for (id, quiet) in idle_ones {
            tracing::info!(launch = %id, quiet_s = quiet, "ending an idle agent");
            let serve = self.clone();
            crate::tasks::spawn(async move { serve.end(&id, Ending::Idle(quiet)).await });
        }
    }

    /// Tells the leader; kept for the next welcome when it cannot be told.
    async fn report(&self, id: String, event: LaunchEvent) {
        if let Err(e) = self.member.report(id.clone(), event.clone()).await {
            tracing::info!(launch = %id, "a report waits for the leader: {e}");
            lock(&self.unsent).push((id, event));
        }
    }

    /// Ends every agent as `serve` stops (they come back with it); one
    /// still being started ends as soon as it runs.
    async fn stop_all(&self) {
        let controls: Vec<mpsc::Sender<Control>> = {
            let mut agents = lock(&self.agents);
            agents.queued.clear();
            agents.waiting.clear();
            for ending in agents.starting.values_mut() {
                *ending = Some(Ending::Shutdown);
            }
            agents
                .running
                .values_mut()
                .map(|r| {
                    r.ending = Some(Ending::Shutdown);
                    r.control.clone()
                })
                .collect()
        };
        let mut gone = Vec::new();
        for control in controls {
            let (done, ended) = oneshot::channel();
            if control.send(Control::End(done)).await.is_ok() {
                gone.push(ended);
            }
        }
        let _ = tokio::time::timeout(STOPPING, futures::future::join_all(gone)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_join_window_is_what_a_machine_asked_through_the_cluster_gets() {
        assert_eq!(
            crate::config::LaunchPolicy::JOIN_WITHIN_MOST,
            crate::protocol::launch::START_WAIT
        );
    }

    #[test]
    fn a_few_sessions_start_again_at_once() {
        assert!((2..=8).contains(&resume_at_once()));
    }

    #[test]
    fn a_session_a_message_waits_for_goes_next_in_line() {
        let spec = |id: &str| LaunchSpec {
            launch_id: id.into(),
            engine: "pi".into(),
            folder: "/w".into(),
            resume_id: None,
            model: None,
            by_user: 1,
        };
        let mut agents = Agents {
            queued: ["a", "b", "c"].map(spec).into(),
            ..Agents::default()
        };
        assert!(agents.next_in_line("c"));
        assert!(!agents.next_in_line("z"));
        let order: Vec<_> = agents.queued.iter().map(|s| s.launch_id.as_str()).collect();
        assert_eq!(order, ["c", "a", "b"]);
        assert!(agents.has("b") && !agents.has("z"));
        agents.starting.insert("d".into(), None);
        assert_eq!(agents.count(), 1, "queued ones are not running yet");
    }

    #[test]
    fn an_end_by_the_relay_itself_is_a_start_given_up() {
        assert!(matches!(Ending::ordered(0), Ending::GivenUp));
        assert!(matches!(Ending::ordered(7), Ending::ByUser(7)));
    }
}

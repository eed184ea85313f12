//! `agent-relay demo`: the whole relay on one machine, with nothing to
//! configure. The fake Bot API runs in this process; three real sidecars
//! (this very binary, `stdio`) are spawned and driven by simulated agents;
//! a user writes into each topic and the agents answer; then the leader is
//! SIGKILLed and the transcript shows the survivors taking over and a
//! message still getting through.
//!
//! Every step waits with a deadline and fails with a sentence naming what did
//! not happen, so the demo doubles as an end-to-end smoke test. The fake and
//! the sidecars live only as long as the demo: children are killed and the
//! temporary home is removed on success, failure and Ctrl-C alike.

use std::fmt::Display;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::process::Command;
use tokio::sync::{mpsc, watch};

use crate::fake_bot_api::{
    DEFAULT_FORUM_CHAT_ID as CHAT, DEFAULT_USER_ID as USER, FakeBotApi, FakeConfig, FakeServer,
    Inject, TopicInfo,
};
use crate::host_client::{FromSidecar, HostError, Link, Said, Sidecar};
use crate::protocol::host::{
    AgentEndedParams, EmptyParams, PROTOCOL_VERSION, SendUserMessageParams, SetStatusParams,
    TurnEndedParams, method,
};

/// How long any one step may take. Each is a fraction of a second on a
/// laptop; the margin is for loaded CI machines.
const STEP: Duration = Duration::from_secs(10);

/// The simulated user (the fake's default user has this name).
const USER_NAME: &str = "Alice";

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("cannot prepare the demo: {0}")]
    Setup(String),
    #[error("session {session}: {source}")]
    Host {
        session: &'static str,
        #[source]
        source: HostError,
    },
    #[error("{what} within {} s", after.as_secs())]
    Timeout { what: String, after: Duration },
    #[error("session {session}'s sidecar exited unexpectedly")]
    Exited { session: &'static str },
    #[error("the answer of session {session} arrived in topic “{found}” instead of its own")]
    WrongTopic {
        session: &'static str,
        found: String,
    },
    #[error("no session became the leader")]
    NoLeader,
    #[error("cannot SIGKILL session {session}'s sidecar: {source}")]
    Kill {
        session: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("interrupted")]
    Interrupted,
}

/// A simulated coding agent and what the user asks it.
struct Agent {
    name: &'static str,
    command: &'static str,
    outcome: &'static str,
    prompt: &'static str,
    /// Asked after the failover, if this agent survives it.
    later: &'static str,
}

const AGENTS: [Agent; 3] = [
    Agent {
        name: "api",
        command: "cargo test",
        outcome: "42 passed",
        prompt: "run the tests",
        later: "and the integration tests?",
    },
    Agent {
        name: "web",
        command: "npm run build",
        outcome: "the bundle is 212 kB",
        prompt: "build the frontend",
        later: "still there after the crash?",
    },
    Agent {
        name: "docs",
        command: "mdbook build",
        outcome: "no broken links",
        prompt: "check the links",
        later: "rebuild the docs once more",
    },
];

impl Agent {
    /// A canned Markdown answer that quotes the prompt, so the transcript
    /// (and the test) can tell which message it answers.
    fn answer(&self, prompt: &str) -> String {
        format!(
            "**{}** here: I ran `{}` for “{prompt}” — {}.",
            self.name, self.command, self.outcome
        )
    }
}

/// What a simulated host has seen of its sidecar, published by its task.
#[derive(Debug, Clone, Default)]
struct View {
    status: Option<String>,
    /// When `status` last changed.
    status_at: Option<Instant>,
    prompts: Vec<String>,
    closed: bool,
}

impl View {
    fn connected(&self) -> bool {
        self.status
            .as_deref()
            .is_some_and(|s| s.contains("● leader") || s.contains("● follower"))
    }

    fn leads(&self) -> bool {
        self.status
            .as_deref()
            .is_some_and(|s| s.contains("● leader"))
    }
}

/// One session of the demo: its sidecar, what its host saw, its topic.
struct Session {
    agent: &'static Agent,
    sidecar: Sidecar,
    view: watch::Receiver<View>,
    topic: Option<TopicInfo>,
}

impl Session {
    fn topic_name(&self) -> &str {
        self.topic.as_ref().map_or(self.agent.name, |t| &t.name)
    }
}

/// The readable output: one line per event, stamped with the time since the
/// demo started. Shared by the simulated hosts, which report status lines as
/// they arrive.
#[derive(Clone)]
struct Transcript {
    start: Instant,
    out: Arc<Mutex<Box<dyn Write + Send>>>,
}

impl Transcript {
    fn new(out: impl Write + Send + 'static) -> Self {
        Self {
            start: Instant::now(),
            out: Arc::new(Mutex::new(Box::new(out))),
        }
    }

    fn line(&self, text: impl Display) {
        let at = self.start.elapsed().as_secs_f64();
        self.plain(format_args!("[{at:>6.2}s] {text}"));
    }

    fn plain(&self, text: impl Display) {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        // A closed stdout (`demo | head`) must not fail the demo itself.
        let _ = writeln!(out, "{text}");
        let _ = out.flush();
    }
}

/// A private temporary `AGENT_RELAY_HOME`, removed when dropped.
struct DemoHome(PathBuf);

impl DemoHome {
    fn create() -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        // Short, because the bus socket's path must fit in `sun_path`.
        for _ in 0..16 {
            let path = std::env::temp_dir().join(format!(
                "agent-relay-demo-{}-{:04x}",
                std::process::id(),
                fastrand::u16(..)
            ));
            match std::fs::DirBuilder::new().mode(0o700).create(&path) {
                Ok(()) => return Ok(Self(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            "no unused temporary directory name",
        ))
    }
}

impl Drop for DemoHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs the demo, spawning `sidecar_exe stdio` for each session, and writes
/// the transcript to `out`. Everything it started is stopped before it
/// returns, whatever the outcome; Ctrl-C and SIGTERM end it early.
pub async fn run(sidecar_exe: &Path, out: impl Write + Send + 'static) -> Result<(), DemoError> {
    let transcript = Transcript::new(out);
    let home = DemoHome::create()
        .map_err(|e| DemoError::Setup(format!("cannot create a temporary directory: {e}")))?;
    let server = FakeBotApi::start(FakeConfig::default())
        .await
        .map_err(|e| DemoError::Setup(format!("cannot start the fake Bot API: {e}")))?;
    server.api().add_default_chats();

    let mut cast = Vec::new();
    let outcome = tokio::select! {
        outcome = script(sidecar_exe, &server, &home.0, &mut cast, &transcript) => outcome,
        interrupted = interruption() => interrupted,
    };
    for session in &mut cast {
        // Already dead (the killed leader) is fine.
        let _ = session.sidecar.kill();
        let _ = session.sidecar.wait_exit(STEP).await;
    }
    let _ = server.shutdown().await;
    drop(home);
    outcome
}

async fn interruption() -> Result<(), DemoError> {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
    Err(DemoError::Interrupted)
}

async fn script(
    exe: &Path,
    server: &FakeServer,
    home: &Path,
    cast: &mut Vec<Session>,
    transcript: &Transcript,
) -> Result<(), DemoError> {
    let fake = server.api();
    transcript.plain(format_args!(
        "agent-relay demo: three coding-agent sessions and a simulated Telegram ({}) \
         with a forum and user {USER_NAME}; nothing leaves this machine.",
        server.url()
    ));
    for agent in &AGENTS {
        start(exe, server, home, agent, cast, transcript).await?;
    }

    let mut answers = 0;
    for session in cast.iter_mut() {
        converse(&fake, session, session.agent.prompt, transcript).await?;
        answers += 1;
    }

    let leader = cast
        .iter()
        .position(|s| s.view.borrow().leads())
        .ok_or(DemoError::NoLeader)?;
    let killed_at = kill_leader(&mut cast[leader], transcript).await?;
    let mut survivors: Vec<&mut Session> = cast
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| *i != leader)
        .map(|(_, s)| s)
        .collect();
    let took = await_failover(&mut survivors, killed_at).await?;
    let new_leader = survivors
        .iter()
        .find(|s| s.view.borrow().leads())
        .map_or("?", |s| s.agent.name);
    transcript.line(format_args!(
        "✅ failover: {new_leader} leads now; every surviving session was connected again {} ms after the SIGKILL",
        took.as_millis()
    ));
    for session in survivors {
        converse(&fake, session, session.agent.later, transcript).await?;
        answers += 1;
    }
    transcript.plain(format_args!(
        "done in {:.1} s: {} sessions, {answers} answers each in its own topic, failover in {} ms.",
        transcript.start.elapsed().as_secs_f64(),
        AGENTS.len(),
        took.as_millis()
    ));
    Ok(())
}

/// Spawns one sidecar, plays its host through the handshake and waits until
/// it is on the bus and has its topic.
async fn start(
    exe: &Path,
    server: &FakeServer,
    home: &Path,
    agent: &'static Agent,
    cast: &mut Vec<Session>,
    transcript: &Transcript,
) -> Result<(), DemoError> {
    let host_error = |source| DemoError::Host {
        session: agent.name,
        source,
    };
    let cwd = home.join("work").join(agent.name);
    let (sidecar, incoming) =
        Sidecar::spawn(sidecar_command(exe, server, home)).map_err(host_error)?;
    transcript.line(format_args!(
        "▶ session {} starts (pid {})",
        agent.name,
        sidecar.pid().unwrap_or_default()
    ));
    let (publish, view) = watch::channel(View::default());
    let link = sidecar.link().clone();
    crate::tasks::spawn(play_agent(
        agent,
        link.clone(),
        incoming,
        publish,
        transcript.clone(),
    ));
    // In the cast before the first wait, so a failure below still stops it.
    let index = cast.len();
    cast.push(Session {
        agent,
        sidecar,
        view,
        topic: None,
    });
    let session = &mut cast[index];

    link.request(
        method::INITIALIZE,
        json!({
            "protocolVersion": PROTOCOL_VERSION,
            "host": {"name": "agent-relay-demo", "version": env!("CARGO_PKG_VERSION")},
            "pid": std::process::id(),
            "cwd": cwd.display().to_string(),
            "session": {"id": format!("demo-{}", agent.name), "name": agent.name},
            "hasUI": false,
        }),
        STEP,
    )
    .await
    .map_err(host_error)?;
    link.notify(method::INITIALIZED, json!({}))
        .map_err(host_error)?;
    await_view(session, "never connected to the relay", View::connected).await?;

    let topic = await_topic(server, agent).await?;
    transcript.line(format_args!(
        "🗂  topic “{}” created for session {}",
        topic.name, agent.name
    ));
    session.topic = Some(topic);
    Ok(())
}

/// `agent-relay stdio` of the demo's home, on the fake's bot.
fn sidecar_command(exe: &Path, server: &FakeServer, home: &Path) -> Command {
    let mut command = Command::new(exe);
    command
        .arg("stdio")
        .env("AGENT_RELAY_HOME", home)
        .env("TELEGRAM_BOT_TOKEN", server.api().token())
        .env("AGENT_RELAY_CHAT_ID", CHAT.to_string())
        .env("AGENT_RELAY_ALLOWED_USERS", USER.to_string())
        .env("AGENT_RELAY_API_URL", server.url());
    // The fake is on 127.0.0.1; a proxy from the user's shell would only
    // stand in the way.
    for proxy in [
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ] {
        command.env_remove(proxy);
    }
    command
}

/// The topic of `agent`'s session, once the fake has it.
async fn await_topic(
    server: &FakeServer,
    agent: &Agent,
) -> Result<crate::fake_bot_api::TopicInfo, DemoError> {
    let suffix = format!("· {}", agent.name);
    server
        .api()
        .wait_until(
            |api| {
                api.topics(CHAT)
                    .into_iter()
                    .find(|t| !t.deleted && t.name.ends_with(&suffix))
            },
            STEP,
        )
        .await
        .map_err(|_| DemoError::Timeout {
            what: format!("session {} never got a topic", agent.name),
            after: STEP,
        })
}

/// The simulated host of one session: reports status lines, takes every
/// prompt and answers it like an agent that finished one turn.
async fn play_agent(
    agent: &'static Agent,
    link: Link,
    mut incoming: mpsc::UnboundedReceiver<Said>,
    publish: watch::Sender<View>,
    transcript: Transcript,
) {
    while let Some(Said { message, .. }) = incoming.recv().await {
        match message {
            FromSidecar::Notification { method, params } if method == method::UI_SET_STATUS => {
                let Ok(status) = serde_json::from_value::<SetStatusParams>(params) else {
                    continue;
                };
                publish.send_if_modified(|view| {
                    if view.status == status.text {
                        return false;
                    }
                    // Written before anyone waiting for this status wakes,
                    // so the transcript keeps cause before effect.
                    transcript.line(format_args!(
                        "⚑  {:<5} status: {}",
                        agent.name,
                        status.text.as_deref().unwrap_or("(cleared)")
                    ));
                    view.status.clone_from(&status.text);
                    view.status_at = Some(Instant::now());
                    true
                });
            }
            FromSidecar::Notification { .. }
            | FromSidecar::Response(_)
            | FromSidecar::NotJson(_) => {}
            FromSidecar::Request { id, method, params }
                if method == method::AGENT_SEND_USER_MESSAGE =>
            {
                let Ok(message) = serde_json::from_value::<SendUserMessageParams>(params) else {
                    let _ = link.respond_error(id, -32602, "malformed agent/sendUserMessage");
                    continue;
                };
                let _ = link.respond(id, json!({"accepted": true}));
                publish.send_modify(|view| view.prompts.push(message.text.clone()));
                let answer = agent.answer(&message.text);
                // What a real agent says about one turn, in its order.
                let _ = link.notify(method::AGENT_STARTED, json!(EmptyParams {}));
                let _ = link.notify(
                    method::TURN_ENDED,
                    json!(TurnEndedParams {
                        assistant_text: answer.clone(),
                        tool_calls: Vec::new(),
                        aborted: false,
                        error: None,
                    }),
                );
                let _ = link.notify(
                    method::AGENT_ENDED,
                    json!(AgentEndedParams {
                        last_assistant_text: Some(answer),
                        aborted: false,
                        error: None,
                    }),
                );
            }
            FromSidecar::Request { id, method, .. } if method == method::UI_CONFIRM => {
                let _ = link.respond(id, json!({"confirmed": true}));
            }
            FromSidecar::Request { id, .. } => {
                let _ = link.respond_error(id, -32601, "the demo host does not offer this");
            }
        }
    }
    publish.send_modify(|view| view.closed = true);
}

/// Waits until the session's view satisfies `ready`; `what` completes
/// "session <name> … within 10 s" when it never does.
async fn await_view(
    session: &mut Session,
    what: &str,
    ready: impl Fn(&View) -> bool,
) -> Result<(), DemoError> {
    let name = session.agent.name;
    let waited = tokio::time::timeout(
        STEP,
        session.view.wait_for(|view| ready(view) || view.closed),
    )
    .await;
    match waited {
        Ok(Ok(view)) if ready(&view) => Ok(()),
        Ok(_) => Err(DemoError::Exited { session: name }),
        Err(_) => Err(DemoError::Timeout {
            what: format!("session {name} {what}"),
            after: STEP,
        }),
    }
}

/// The user writes `prompt` into the session's topic; waits for the agent to
/// get it and for its answer to arrive, and checks where it arrived.
async fn converse(
    fake: &FakeBotApi,
    session: &mut Session,
    prompt: &str,
    transcript: &Transcript,
) -> Result<(), DemoError> {
    let name = session.agent.name;
    let Some(topic) = session.topic.clone() else {
        return Err(DemoError::Setup(format!("session {name} has no topic")));
    };
    transcript.line(format_args!(
        "📱 {USER_NAME:<5} → “{}”: {prompt}",
        topic.name
    ));
    fake.inject_message(Inject {
        chat_id: CHAT,
        thread_id: Some(topic.thread_id),
        user_id: USER,
        text: prompt.to_owned(),
    });
    await_view(session, "never received its message", |view| {
        view.prompts.iter().any(|p| p == prompt)
    })
    .await?;

    // Look for the answer in every topic, so one in the wrong topic is
    // caught rather than waited for.
    let quoted = format!("“{prompt}”");
    let (thread, text) = fake
        .wait_until(
            |api| {
                api.topics(CHAT).into_iter().find_map(|t| {
                    api.messages(CHAT, Some(t.thread_id))
                        .into_iter()
                        .find(|m| m.plain_text.contains(&quoted))
                        .map(|m| (t.thread_id, m.plain_text))
                })
            },
            STEP,
        )
        .await
        .map_err(|_| DemoError::Timeout {
            what: format!("the answer of session {name} never reached Telegram"),
            after: STEP,
        })?;
    if thread != topic.thread_id {
        let found = fake
            .topics(CHAT)
            .into_iter()
            .find(|t| t.thread_id == thread)
            .map_or_else(|| thread.to_string(), |t| t.name);
        return Err(DemoError::WrongTopic {
            session: name,
            found,
        });
    }
    transcript.line(format_args!(
        "🤖 {name:<5} → “{}”: {text}",
        session.topic_name()
    ));
    Ok(())
}

async fn kill_leader(leader: &mut Session, transcript: &Transcript) -> Result<Instant, DemoError> {
    let name = leader.agent.name;
    transcript.line(format_args!(
        "💥 SIGKILL the leader, session {name} (pid {})",
        leader.sidecar.pid().unwrap_or_default()
    ));
    let killed_at = Instant::now();
    leader.sidecar.kill().map_err(|source| DemoError::Kill {
        session: name,
        source,
    })?;
    if leader.sidecar.wait_exit(STEP).await.is_err() {
        return Err(DemoError::Timeout {
            what: format!("session {name}'s sidecar did not die"),
            after: STEP,
        });
    }
    Ok(killed_at)
}

/// Waits until exactly one survivor leads and all are connected; returns the
/// time from the SIGKILL to the last status change that got them there.
async fn await_failover(
    survivors: &mut [&mut Session],
    killed_at: Instant,
) -> Result<Duration, DemoError> {
    let deadline = tokio::time::Instant::now() + STEP;
    loop {
        let views: Vec<View> = survivors.iter().map(|s| s.view.borrow().clone()).collect();
        if let Some(closed) = survivors.iter().zip(&views).find(|(_, v)| v.closed) {
            return Err(DemoError::Exited {
                session: closed.0.agent.name,
            });
        }
        let leaders = views.iter().filter(|v| v.leads()).count();
        if leaders == 1 && views.iter().all(View::connected) {
            let settled = views
                .iter()
                .filter_map(|v| v.status_at)
                .fold(killed_at, Instant::max);
            return Ok(settled.duration_since(killed_at));
        }
        let changes = survivors.iter_mut().map(|s| Box::pin(s.view.changed()));
        let any_change = futures::future::select_all(changes);
        let changed = tokio::time::timeout_at(deadline, any_change)
            .await
            .map(|(changed, index, _)| (changed.is_ok(), index));
        match changed {
            Ok((true, _)) => {}
            // The host task is gone without saying so: its sidecar is too.
            Ok((false, index)) => {
                return Err(DemoError::Exited {
                    session: survivors[index].agent.name,
                });
            }
            Err(_) => {
                return Err(DemoError::Timeout {
                    what: "the surviving sessions never reconnected to a new leader".into(),
                    after: STEP,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sidecar_that_dies_at_once_fails_the_demo_with_its_name() {
        // `true stdio` exits without a word, as a broken binary would.
        let outcome = run(Path::new("/bin/true"), std::io::sink()).await;
        assert!(
            matches!(
                outcome,
                Err(DemoError::Host {
                    session: "api",
                    source: HostError::Closed,
                })
            ),
            "{outcome:?}"
        );
    }
}

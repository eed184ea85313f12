//! The engine seam (docs/DESIGN.md, *Launching*, "The engine seam"): how
//! `serve` starts one kind of agent and drives it. An engine is one
//! variant of `Engine` (in `engines/mod.rs`, which calls it) and one file
//! under `engines/` with a `start` function:
//!
//! ```text
//! async fn start(start: Start, ctx: &Context) -> Result<Agent, EngineError>
//! ```
//!
//! It is **given** ([`Start`]) the launch id, the folder (already checked
//! against `[launch] roots`), the command line `[launch.commands]` names,
//! the agent's own session to continue (none for a new one), the model
//! asked for, and the complete environment (no relay secrets in it:
//! [`super::env`]). It **gives back** ([`Agent`]) a running child process
//! (its pid), the agent's own session id to resume it by (pi: its session
//! file; Claude Code: its session id; Codex: its thread id), the model in use, a channel of
//! [`Control`]s (list the models, switch the model, end the agent), a
//! receiver that resolves with the process's [`Exit`], and a
//! clock of its last turn (for `[launch] idle_end_hours`).
//!
//! Prompts do not go through the engine: they reach the agent through its
//! relay session, like any topic message (the journal, in order, once).
//! An agent that runs the relay's extension itself (pi's
//! `scripts/pi-extension.ts`) has a session of its own; for one that does
//! not (Claude Code, Codex), the engine runs a session inside `serve`
//! (`super::hosted`; for Codex the bridge of `crate::codex`) and plays its
//! host, turning `agent/sendUserMessage` into the agent's own input
//! protocol and the agent's output into host events. Stopping a turn is the session's too:
//! `/stop` in the topic becomes `agent/abort` to its host (pi's extension
//! aborts; a hosted engine sends its agent's interrupt). Either way the
//! session registers with
//! the launch id, so the leader links the two. The engine sets
//! [`LAUNCH_ENV`](crate::session::LAUNCH_ENV) in the agent's environment
//! (the sidecar reads it), and must not let the agent load the relay a
//! second time (the Claude Code plugin steps aside when it sees it).
//!
//! The process is `serve`'s child, in its own process group, ended with
//! `serve` (`SIGTERM` when `serve` dies, Linux; and its whole group by
//! `serve`'s watcher, `super::watcher`). Ending is: the input closed, 10 s,
//! then `SIGTERM` to the group, 5 s, then `SIGKILL`; what the agent left in
//! its group is ended after it.
//!
//! What every engine does alike is `super::starting`'s: spawning the
//! process, ending it when start-up fails (the error with its stderr),
//! serving the controls until it ends, and the end in one order. An
//! engine's file names what differs: its command line, how it gets going
//! on the pipes, what closes its input and what ends after it, and how it
//! answers the model questions (a `Driver`).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot, watch};

use crate::config::Config;
use crate::paths::Paths;
use crate::protocol::launch::ModelChoice;

/// What an engine is given.
#[derive(Debug, Clone)]
pub struct Start {
    pub launch_id: String,
    /// Resolved and checked against `[launch] roots`.
    pub folder: PathBuf,
    /// `[launch.commands]`: the program and the arguments of the person's
    /// choosing; the engine adds its own.
    pub command: Vec<String>,
    /// The agent's own session to continue; none starts a new one.
    pub resume: Option<String>,
    pub model: Option<String>,
    /// The whole environment of the agent's process.
    pub env: Vec<(OsString, OsString)>,
}

/// What `serve` lends every engine: the relay's files and configuration
/// (a hosted session joins the bus with them).
#[derive(Debug, Clone)]
pub struct Context {
    pub paths: Paths,
    pub config: Config,
}

/// A running agent, as its engine hands it to `serve`.
pub struct Agent {
    pub pid: u32,
    /// The agent's own session, to start it again.
    pub resume_id: Option<String>,
    pub model: Option<String>,
    pub control: mpsc::Sender<Control>,
    /// Resolves once the process ended.
    pub exited: oneshot::Receiver<Exit>,
    /// When a turn last started or ended.
    pub activity: watch::Receiver<Instant>,
}

/// The models an agent offers, and the one in use.
pub type Models = (Vec<ModelChoice>, Option<String>);

/// What `serve` asks of a running agent.
#[derive(Debug)]
pub enum Control {
    /// The models it offers, and the one in use.
    Models(oneshot::Sender<Result<Models, String>>),
    /// Switch the model for the turns that follow; answers the model set.
    SetModel(String, oneshot::Sender<Result<String, String>>),
    /// End the agent; answered once its process is gone.
    End(oneshot::Sender<()>),
}

/// How an agent's process ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    /// Its last lines on stderr.
    pub stderr: String,
}

/// Why an agent could not be started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    #[error("cannot run {program}: {message}")]
    Spawn { program: String, message: String },
    #[error("{engine} started but {message}")]
    Startup {
        engine: &'static str,
        message: String,
    },
}

//! What `agent-relay serve` and the leader say to each other on the bus
//! (docs/DESIGN.md, *Launching*), and what one machine asks another's
//! `serve` through the cluster.
//!
//! `serve` joins the bus as its machine's **launcher** ([`ServeHello`]):
//! it holds no topic. The leader hands it [`Order`]s (start or resume a
//! session, end one, list or switch its models), which it answers with
//! [`OrderDone`]; what happens to its agents on their own (a process
//! started, ended, crashed, went idle) it tells in [`LaunchReport`]s. The
//! launch id names a launched session from the moment `/new` asks for it;
//! its session names it again when it registers (`Register::launch`), so
//! the leader links the two without guessing.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::{Epoch, Generation};

/// How long starting an agent may take, its session's registration
/// included (pi loads its extensions, the sidecar joins, the topic is
/// made): the leader waits this long for `serve`, and a machine that asks
/// another's `serve` through the cluster a little longer.
pub const START_WAIT: std::time::Duration = std::time::Duration::from_secs(90);

/// `agent-relay serve` joins the bus as this machine's launcher.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServeHello {
    pub id: u64,
    pub instance_id: String,
    /// As a session's registration: proves the instance is this process.
    pub instance_secret: String,
    pub registration_generation: Generation,
    pub pid: u32,
    pub protocol_version: u32,
    /// The engines it can start (`pi`, `claude`), as configured.
    pub engines: Vec<String>,
}

/// The leader's answer to [`ServeHello`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServeWelcome {
    pub epoch: Epoch,
    /// The sessions that were running when `serve` last stopped (a crash,
    /// an upgrade, a reboot): it starts each again in its own topic.
    pub resume: Vec<LaunchSpec>,
}

/// A session to start: new, or again from the engine's own session store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LaunchSpec {
    pub launch_id: String,
    pub engine: String,
    /// The folder as the person wrote it (`~/api`) or as `serve` resolved
    /// it before; `serve` checks it against `[launch] roots` every time.
    pub folder: String,
    /// The engine's own session to continue (pi: its session file; Claude
    /// Code: its session id); none for a new session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Who asked, for the audit line.
    pub by_user: i64,
}

/// Something the leader asks of `serve`; answered with [`OrderDone`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Order {
    pub order_id: u64,
    pub op: OrderOp,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum OrderOp {
    /// Start a session (or start it again), as a child of `serve`.
    Start(LaunchSpec),
    /// End a running session: its process leaves, its topic stays.
    End { launch_id: String, by_user: i64 },
    /// The models the agent offers.
    Models { launch_id: String },
    /// Switch the agent's model for the turns that follow.
    SetModel { launch_id: String, model: String },
}

/// How an order went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum OrderOutcome {
    /// The process runs; its session registers on its own.
    Started {
        /// The folder, resolved (no link in it).
        folder: String,
        pid: u32,
    },
    Ended,
    Models {
        models: Vec<ModelChoice>,
        /// The model in use, when the agent says.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        current: Option<String>,
    },
    ModelSet {
        model: String,
    },
    /// Nothing was done, and why (a folder outside the roots, no such
    /// session, an engine that is not installed…), with the setting to
    /// change when one would help.
    Refused {
        reason: String,
    },
}

/// One model an agent offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelChoice {
    /// What switches to it (pi: `provider/id`; Claude Code: an alias or id).
    pub id: String,
    /// What the phone shows.
    pub label: String,
}

/// `serve`'s answer to an [`Order`] (acknowledged like any request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrderDone {
    pub id: u64,
    pub generation: Generation,
    pub order_id: u64,
    pub outcome: OrderOutcome,
}

/// What happened to a launched session by itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LaunchReport {
    pub id: u64,
    pub generation: Generation,
    pub launch_id: String,
    pub event: LaunchEvent,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum LaunchEvent {
    /// Its process started and the engine named its own session.
    Started {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resume_id: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// Started again because `serve` itself restarted.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        after_restart: bool,
    },
    /// Ended on purpose (`/end`).
    Ended { by_user: i64 },
    /// Ended after `[launch] idle_end_hours` without a turn.
    Idle { idle_s: u64 },
    /// Its process ended by itself.
    Crashed {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        /// The last lines it wrote to stderr.
        stderr: String,
    },
}

/// `serve` as the leader knows it (`/relay status`, `doctor`, `/sessions`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServeStatus {
    pub pid: u32,
    pub engines: Vec<String>,
}

/// A session's launch, as `/sessions` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionLaunch {
    pub launch_id: String,
    pub engine: String,
    /// `starting`, `running`, `ended`, `crashed` or `idle`.
    pub state: String,
    /// Who started it from the phone (the leader that shows the list
    /// names them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_user: Option<i64>,
}

/// One machine asks another's `serve` through the cluster (`/new box:…`, a
/// button of `/sessions`): the machine named runs the order; every other
/// one stays silent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoteOrder {
    /// The machine that runs it; none: whichever knows the launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub order: RemoteOp,
}

/// What one machine asks of another: an order its leader passes to its
/// `serve`, with the leader's part of it (the launch recorded, the topic
/// found).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum RemoteOp {
    /// `/new`: a new session in `folder`.
    New {
        folder: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        engine: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prompt: Option<String>,
        by_user: i64,
    },
    /// Resume a launched session.
    Resume { launch_id: String, by_user: i64 },
    /// End a launched session.
    End { launch_id: String, by_user: i64 },
}

/// The answer of the machine that ran a [`RemoteOrder`]: one line for the
/// person, and whether it worked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemoteDone {
    pub ok: bool,
    /// HTML, as the control place shows it.
    pub text: String,
}

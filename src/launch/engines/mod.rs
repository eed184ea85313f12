//! One file per engine (`super::engine` is the seam): each has
//! `start(Start, &Context) -> Result<Agent, EngineError>`, built on
//! `super::starting` (spawn, failed start-up, the controls served, the
//! end). [`Engine`] names them and calls the one asked for: a new engine
//! is a variant here and a file beside this one.

mod claude;
mod codex;
mod opencode;
mod pi;

use super::engine::{Agent, Context, EngineError, Start};

/// The agents `serve` can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// pi in RPC mode, with the relay's extension loaded.
    Pi,
    /// Claude Code headless and kept running (stream-json both ways).
    Claude,
    /// Codex's app-server on stdio, the relay its only client.
    Codex,
    /// `opencode serve` on 127.0.0.1, the relay its only client.
    OpenCode,
}

impl Engine {
    pub const ALL: [Engine; 4] = [Engine::Pi, Engine::Claude, Engine::Codex, Engine::OpenCode];

    /// Its name in `/new`, `[launch.commands]` and the store.
    pub fn name(self) -> &'static str {
        match self {
            Self::Pi => "pi",
            Self::Claude => "claude",
            Self::Codex => "codex",
            Self::OpenCode => "opencode",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.name() == name)
    }

    /// Starts the agent (see the module docs).
    pub async fn start(self, start: Start, ctx: &Context) -> Result<Agent, EngineError> {
        match self {
            Self::Pi => pi::start(start, ctx).await,
            Self::Claude => claude::start(start, ctx).await,
            Self::Codex => codex::start(start, ctx).await,
            Self::OpenCode => opencode::start(start, ctx).await,
        }
    }
}

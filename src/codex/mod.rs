//! Codex as a host (docs/DESIGN.md, "Codex"; docs/CODEX.md has what the
//! relay relies on, checked on the pinned Codex).
//!
//! Codex's app-server lets several clients share one thread: its own TUI
//! and another program each see every turn, and either may start one or
//! answer an approval. The relay is such a client. Inside it runs an
//! ordinary [`Session`] — the same bus member `agent-relay stdio` runs for
//! pi — driven over the host protocol by a [`CodexBridge`] that plays
//! its host, as `claude/bridge.rs` does for Claude Code:
//!
//! * [`app_server`] is the client itself, over either transport of the
//!   app-server (WebSocket on a unix socket, or stdio);
//! * [`bridge`] maps Codex's threads, turns, items and requests to the
//!   session and back, in one place;
//! * [`wrapper`] is `agent-relay codex [codex args…]`: a private app-server,
//!   the user's TUI on it in the foreground, the relay beside it;
//! * [`tools`] is the relay's tool for Codex, `send_file`: an MCP server
//!   Codex starts (`agent-relay codex-tools`), forwarding to the session;
//! * [`hook`] and [`install`] are the other way in, for plain `codex`:
//!   `agent-relay install codex` writes hooks that run `agent-relay hook
//!   --host codex <event>`, each of which joins the relay for a moment.
//!
//! A session started from the phone is [`launched`]: [`Mode::Alone`] on an
//! app-server `agent-relay serve` runs on stdio (`launch/engines/codex.rs`).

mod app_server;
mod bridge;
pub mod hook;
pub mod install;
pub mod tools;
mod wire;
pub mod wrapper;

use std::sync::{Arc, OnceLock};

use tokio::sync::mpsc;

pub use app_server::{AppServer, AppServerError, Incoming, Transport};
pub use bridge::{CodexBridge, Mode, Opened, Opening};

use crate::config::{Config, ConfigError};
use crate::paths::Paths;
use crate::session::Session;

/// The profile key's session file for a Codex thread: its id names it
/// across `codex resume`.
fn session_file(thread_id: &str) -> String {
    format!("codex:{thread_id}")
}

/// A session of the relay on one Codex connection, running.
pub struct Running {
    bridge: Arc<CodexBridge>,
    session: Arc<OnceLock<Arc<Session>>>,
    bridged: tokio::task::JoinHandle<()>,
}

/// Starts a session in process, its host played by a bridge on `codex`
/// (initialized already; `incoming` is what it says). It runs until the
/// connection ends or [`Running::stop`].
pub fn start(
    codex: AppServer,
    incoming: mpsc::UnboundedReceiver<Incoming>,
    paths: Paths,
    config: Result<Config, ConfigError>,
    mode: Mode,
) -> Running {
    start_as(codex, incoming, paths, config, mode, None)
}

/// [`start`] for a session `agent-relay serve` launched: alone on its
/// app-server, registered as `launch_id` (the leader links the two).
pub fn launched(
    codex: AppServer,
    incoming: mpsc::UnboundedReceiver<Incoming>,
    paths: Paths,
    config: Config,
    opening: Opening,
    launch_id: String,
) -> Running {
    start_as(
        codex,
        incoming,
        paths,
        Ok(config),
        Mode::Alone(opening),
        Some(launch_id),
    )
}

fn start_as(
    codex: AppServer,
    incoming: mpsc::UnboundedReceiver<Incoming>,
    paths: Paths,
    config: Result<Config, ConfigError>,
    mode: Mode,
    launch: Option<String>,
) -> Running {
    let crate::session::InProcess {
        link,
        from_session,
        session,
    } = crate::session::InProcess::start_as(paths, config, launch);
    let bridge = CodexBridge::new(codex, link, mode);
    let bridged = crate::tasks::spawn(bridge.clone().run(incoming, from_session));
    Running {
        bridge,
        session,
        bridged,
    }
}

impl Running {
    pub fn bridge(&self) -> &Arc<CodexBridge> {
        &self.bridge
    }

    /// Waits until Codex's connection ends.
    pub async fn finished(&mut self) {
        let _ = (&mut self.bridged).await;
    }

    /// Stops the bridge, then closes the session: what it queued for the
    /// topic goes out first (the session waits a few seconds at most), and
    /// it leaves the relay.
    pub async fn stop(self) {
        self.bridge.finish();
        let _ = self.bridged.await;
        crate::session::InProcess::close(&self.session).await;
    }
}

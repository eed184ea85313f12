//! OpenCode as a host (docs/OPENCODE.md has what the relay relies on,
//! checked on the pinned OpenCode; docs/decisions/0010-opencode-server.md
//! why the relay is a client of OpenCode's server).
//!
//! `opencode serve` lets several clients share its sessions: OpenCode's
//! own TUI (`opencode attach`) and another program each see every event,
//! and either may prompt a session or answer a permission ask. The relay
//! is such a client. Inside it runs an ordinary [`Session`] — the same bus
//! member `agent-relay stdio` runs for pi — driven over the host protocol
//! by an [`OpenCodeBridge`] that plays its host, as Codex's bridge does:
//!
//! * [`server`] is the client itself: OpenCode's HTTP routes and its event
//!   stream, on 127.0.0.1 behind a password;
//! * [`bridge`] maps OpenCode's sessions, turns, parts and asks to the
//!   relay's session and back, in one place;
//! * [`wrapper`] is `agent-relay opencode [opencode args…]`: a private
//!   `opencode serve`, the user's TUI attached to it in the foreground, the
//!   relay beside it.
//!
//! Files go back through the relay's `send_file`, the MCP server Codex
//! runs too (`crate::codex::tools`), added to the running server. A
//! session started from the phone is [`launched`]: [`Mode::Alone`] on an
//! `opencode serve` that `agent-relay serve` runs
//! (`launch/engines/opencode.rs`).

mod bridge;
mod server;
mod wire;
pub mod wrapper;

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

pub use bridge::{Mode, OpenCodeBridge, Opening};
pub use server::{Server, ServerError};
pub use wire::ModelRef;

use crate::config::{Config, ConfigError};
use crate::paths::Paths;
use crate::protocol::host::{SendFileParams, SendFileResult};
use crate::session::Session;

/// The profile key's session file for an OpenCode session: its id names it
/// across `--session`.
fn session_file(session_id: &str) -> String {
    format!("opencode:{session_id}")
}

/// The environment variable naming the OpenCode program to run (default
/// `opencode` on `PATH`).
pub const OPENCODE_BIN: &str = "AGENT_RELAY_OPENCODE_BIN";

/// The OpenCode program: [`OPENCODE_BIN`], else `opencode` on `PATH`.
pub fn program() -> PathBuf {
    std::env::var_os(OPENCODE_BIN)
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("opencode"), PathBuf::from)
}

/// The variable `opencode serve` and `opencode attach` read the server's
/// password from.
pub const PASSWORD_ENV: &str = "OPENCODE_SERVER_PASSWORD";

/// A fresh password for a private server.
pub fn new_password() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// A session of the relay on one OpenCode server, running.
pub struct Running {
    bridge: Arc<OpenCodeBridge>,
    session: Arc<OnceLock<Arc<Session>>>,
    bridged: tokio::task::JoinHandle<()>,
}

/// Starts a session in process, its host played by a bridge on `server`.
/// It runs until [`Running::stop`].
pub fn start(
    server: Server,
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
    let bridge = OpenCodeBridge::new(server, link, mode);
    let bridged = crate::tasks::spawn(bridge.clone().run(from_session));
    Running {
        bridge,
        session,
        bridged,
    }
}

/// [`start`] for a session `agent-relay serve` launched: alone on its
/// server, registered as `launch_id` (the leader links the two).
pub fn launched(
    server: Server,
    paths: Paths,
    config: Config,
    opening: Opening,
    launch_id: String,
) -> Running {
    start(
        server,
        paths,
        Ok(config),
        Mode::Alone(opening),
        Some(launch_id),
    )
}

impl Running {
    pub fn bridge(&self) -> &Arc<OpenCodeBridge> {
        &self.bridge
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

impl crate::codex::tools::SendsFiles for OpenCodeBridge {
    async fn send_file(&self, params: &SendFileParams) -> Result<SendFileResult, String> {
        OpenCodeBridge::send_file(self, params).await
    }
}

/// The relay's `send_file` for one OpenCode server: the socket bound in
/// `folder` (the relay's own, 0700), served for `bridge`'s session, and
/// the MCP server added to OpenCode. Dropped, it stops serving. `None`
/// (OpenCode runs without the tool, said in the log) when that fails.
pub async fn offer_tool(
    folder: &std::path::Path,
    bridge: &Arc<OpenCodeBridge>,
) -> Option<tokio::task::JoinHandle<()>> {
    const WITHOUT: &str = "OpenCode runs without the relay's send_file tool";
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            tracing::warn!("{WITHOUT}: {e}");
            return None;
        }
    };
    let (listener, socket) = match crate::codex::tools::bind(folder) {
        Ok(bound) => bound,
        Err(e) => {
            tracing::warn!("{WITHOUT}: {e}");
            return None;
        }
    };
    let serving = crate::codex::tools::serve(listener, bridge.clone());
    let offered = bridge
        .offer_tool(&exe.display().to_string(), &socket.display().to_string())
        .await;
    if let Err(e) = offered {
        tracing::warn!("{WITHOUT}: {e}");
        serving.abort();
        return None;
    }
    Some(serving)
}

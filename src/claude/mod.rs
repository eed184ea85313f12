//! Claude Code as a host (docs/DESIGN.md, "Claude Code").
//!
//! Claude Code runs extensions two ways, and the relay uses both:
//!
//! * `agent-relay mcp` ([`serve`]) is an MCP server on stdio, one per Claude
//!   Code process. Inside it runs an ordinary [`Session`](crate::session)
//!   — the same bus member `agent-relay stdio` runs for pi — driven over the
//!   host protocol by a [`bridge::ClaudeBridge`] that plays its host: the bridge
//!   turns the session's prompts into `notifications/claude/channel` (or
//!   keeps them for the `telegram_inbox` tool), and the MCP tools and
//!   Claude Code's hooks into host-protocol requests and events.
//! * `agent-relay hook <event>` ([`hook::run`]) is the command Claude Code
//!   runs for its hooks: it reads the event on stdin, hands it to its
//!   session's MCP server over a socket in the bus directory, and prints
//!   the answer (a permission decision) for Claude Code. The hooks are what
//!   tells the session which Claude Code session it is (`session_id`; the
//!   MCP server's own environment is wrong after `--continue`), when a turn
//!   starts, which tool runs, and the turn's final answer.
//!
//! [`tools`] are its tools on the relay's MCP server (`crate::mcp`);
//! [`install`] writes the MCP entry and the hooks into the user's Claude
//! Code settings; [`transcript`] reads how a turn an API error ended
//! when the StopFailure hook came too late to tell it.

mod bridge;
pub(crate) use bridge::failure as api_error;
pub mod hook;
pub mod install;
mod tools;
mod transcript;

use crate::config::{Config, ConfigError};
use crate::paths::Paths;

/// The profile key's session file for a Claude Code session: its
/// `session_id` names it across `--resume` and `--continue`.
fn session_file(session_id: &str) -> String {
    format!("claude-code:{session_id}")
}

/// What the MCP server learns from Claude Code's environment.
#[derive(Debug, Clone, Default)]
pub struct ClaudeEnv {
    /// `CLAUDE_CODE_SESSION_ID`: the session at startup (not after
    /// `--continue`: the SessionStart hook corrects it).
    pub session_id: Option<String>,
    /// `CLAUDE_PROJECT_DIR`.
    pub project_dir: Option<String>,
    /// `CLAUDE_CODE_ENTRYPOINT`: `cli` in the terminal UI, `sdk-cli` with `-p`.
    pub entrypoint: Option<String>,
    /// Names the Claude Code process, for the hook socket: its messaging
    /// socket's path, which its hooks and MCP servers all get.
    pub process_key: Option<String>,
}

impl ClaudeEnv {
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let session_id = var("CLAUDE_CODE_SESSION_ID");
        Self {
            process_key: process_key(var("CLAUDE_CODE_MESSAGING_SOCKET"), session_id.as_deref()),
            session_id,
            project_dir: var("CLAUDE_PROJECT_DIR"),
            entrypoint: var("CLAUDE_CODE_ENTRYPOINT"),
        }
    }

    /// Whether a person sits at Claude Code's terminal UI (not print mode).
    fn interactive(&self) -> bool {
        self.entrypoint.as_deref() == Some("cli")
    }
}

/// What names one Claude Code process to its hooks and its MCP server
/// alike: the messaging socket Claude Code hands both, else (an older
/// Claude Code) the session id.
fn process_key(messaging_socket: Option<String>, session_id: Option<&str>) -> Option<String> {
    messaging_socket
        .map(|s| format!("socket:{s}"))
        .or_else(|| session_id.map(|s| format!("session:{s}")))
}

/// The hook socket's file name in the bus directory for a process key:
/// short (a socket path has 107 bytes) and free of path characters.
fn hook_socket_file(process_key: &str) -> String {
    // FNV-1a, 64 bits: a name, not a secret (the directory is the user's
    // own and every peer is checked).
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in process_key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("claude-{hash:016x}.sock")
}

/// `agent-relay mcp`: serves Claude Code on `input`/`output` until EOF or
/// `stop` (Claude Code ends its MCP servers with SIGINT, then SIGTERM 0.1 s
/// later and SIGKILL 0.4 s after that, stdin still open), then leaves: what
/// nobody read is said in the topic, what the session holds is handed to
/// the relay, and the session leaves the bus — within [`LEAVE_WITHIN`].
pub async fn serve<R, W>(
    input: R,
    output: W,
    paths: Paths,
    config: Result<Config, ConfigError>,
    env: ClaudeEnv,
    stop: tokio_util::sync::CancellationToken,
) -> std::io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    // The session, in this process, behind the host protocol.
    let crate::session::InProcess {
        link,
        from_session,
        session,
    } = crate::session::InProcess::start(paths.clone(), config.clone());
    let bridge = bridge::ClaudeBridge::new(link, &config, env);
    bridge.clone().spawn_session_loop(from_session);
    bridge.clone().spawn_hook_socket(&paths, &config);
    let service = bridge.clone();
    let serving = crate::host::serve_service(input, output, move |link| {
        crate::mcp::McpServer::new(tools::ClaudeTools::new(service, link))
    });
    let served = tokio::select! {
        served = serving => served,
        () = stop.cancelled() => Ok(()),
    };
    let leave = async {
        bridge.finish().await;
        crate::session::InProcess::close(&session).await;
    };
    if tokio::time::timeout(LEAVE_WITHIN, leave).await.is_err() {
        tracing::warn!("leaving took longer than {LEAVE_WITHIN:?}; exiting anyway");
    }
    served
}

/// How long `agent-relay mcp` takes to leave at most: inside Claude Code's
/// window between SIGINT and SIGKILL (0.5 s). What it handed over is the
/// relay's already; a lock it held is the kernel's to release.
pub const LEAVE_WITHIN: std::time::Duration = std::time::Duration::from_millis(350);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_socket_is_named_by_the_claude_process() {
        let a = hook_socket_file("socket:/tmp/cc-socks/1.sock");
        assert_eq!(a, hook_socket_file("socket:/tmp/cc-socks/1.sock"));
        assert_ne!(a, hook_socket_file("socket:/tmp/cc-socks/2.sock"));
        assert!(a.len() < 32 && !a.contains('/'), "{a}");
        assert_eq!(
            process_key(None, Some("s1")).as_deref(),
            Some("session:s1"),
            "an older Claude Code without a messaging socket"
        );
        assert_eq!(
            process_key(Some("/x.sock".into()), Some("s1")).as_deref(),
            Some("socket:/x.sock")
        );
    }
}

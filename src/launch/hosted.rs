//! A relay session inside `serve`, for an engine whose agent runs no relay
//! extension of its own (Claude Code headless): the same [`Session`] a
//! sidecar runs, served over an in-memory pipe
//! ([`crate::session::InProcess`]), with the engine as its host (as
//! `claude::serve` does for Claude Code's MCP server). It registers as the
//! launch, so the leader links the two, and joins the bus like any member.
//! (Codex's engine has the same in the bridge `agent-relay codex` uses,
//! `crate::codex::launched`.)

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::json;
use tokio::sync::mpsc;

use super::engine::Context;
use crate::host_client::{Link, Said};
use crate::protocol::host::{PROTOCOL_VERSION, method};
use crate::session::Session;

/// How long the session has to join the relay and get its topic.
const CONNECT: Duration = Duration::from_secs(30);
/// Requests to the session that answer at once.
const QUICK: Duration = Duration::from_secs(10);

/// The engine's end of a hosted session.
pub(super) struct Hosted {
    /// The host protocol, host side.
    pub link: Link,
    /// What the session asks of its host.
    pub from_session: mpsc::UnboundedReceiver<Said>,
    session: Arc<OnceLock<Arc<Session>>>,
}

/// Identifies a hosted session to the relay.
pub(super) struct Identity<'a> {
    pub launch_id: &'a str,
    pub cwd: &'a str,
    /// The agent's own session id (the topic's name across resumes).
    pub session_id: &'a str,
    /// The profile's session file: `claude-code:<id>` keeps the topic a
    /// keyboard Claude Code session of the same id has.
    pub session_file: &'a str,
    pub host: &'a str,
    /// The host's `canSteer`: a prompt can go into its running turn.
    pub can_steer: bool,
}

impl Hosted {
    /// Starts the session and has it join the relay.
    pub async fn start(ctx: &Context, id: Identity<'_>) -> Result<Self, String> {
        let crate::session::InProcess {
            link,
            from_session,
            session,
        } = crate::session::InProcess::start_as(
            ctx.paths.clone(),
            Ok(ctx.config.clone()),
            Some(id.launch_id.to_string()),
        );
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "host": {"name": id.host, "version": ""},
            "pid": std::process::id(),
            "cwd": id.cwd,
            "session": {"id": id.session_id, "file": id.session_file},
            "hasUI": false,
            "canSteer": id.can_steer,
        });
        link.request(method::INITIALIZE, params, QUICK)
            .await
            .map_err(|e| e.to_string())?;
        link.notify(method::INITIALIZED, json!({}))
            .map_err(|e| e.to_string())?;
        // Idempotent: joins when `auto_connect` is off too, and waits for
        // the registration.
        let connected = link
            .request(
                method::COMMAND_EXECUTE,
                json!({"name": "telegram-connect", "args": ""}),
                CONNECT,
            )
            .await
            .map_err(|e| e.to_string())?;
        if connected["ok"].as_bool() != Some(true) {
            tracing::warn!(
                "a hosted session joined without its topic: {}",
                connected["message"].as_str().unwrap_or_default()
            );
        }
        Ok(Self {
            link,
            from_session,
            session,
        })
    }

    /// Leaves the relay once what was queued for the topic went out.
    pub async fn close(&self) {
        crate::session::InProcess::close(&self.session).await;
        self.link.close();
    }
}

//! A relay session inside `serve`, for an engine whose agent runs no relay
//! extension of its own (Claude Code headless, Codex): the same
//! [`Session`] a sidecar runs, served over an in-memory pipe, with the
//! engine as its host (as `claude::serve` does for Claude Code's MCP
//! server). It registers as the launch, so the leader links the two, and
//! joins the bus like any member.

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
}

impl Hosted {
    /// Starts the session and has it join the relay.
    pub async fn start(ctx: &Context, id: Identity<'_>) -> Result<Self, String> {
        let (session_side, host_side) = tokio::io::duplex(1 << 16);
        let (session_in, session_out) = tokio::io::split(session_side);
        let (host_in, host_out) = tokio::io::split(host_side);
        let (paths, config) = (ctx.paths.clone(), ctx.config.clone());
        let sessions: Arc<OnceLock<Arc<Session>>> = Arc::default();
        let slot = sessions.clone();
        let launch = id.launch_id.to_string();
        tokio::spawn(async move {
            let served = crate::host::serve(session_in, session_out, move |link| {
                let session = Session::new(link, paths, Ok(config));
                session.set_launch(launch);
                let _ = slot.set(session.clone());
                session
            })
            .await;
            if let Err(e) = served {
                tracing::warn!("a hosted session's transport failed: {e}");
            }
        });
        let (link, from_session) = Link::over(host_in, host_out, false);
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "host": {"name": id.host, "version": ""},
            "pid": std::process::id(),
            "cwd": id.cwd,
            "session": {"id": id.session_id, "file": id.session_file},
            "hasUI": false,
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
            session: sessions,
        })
    }

    /// Leaves the relay once what was queued for the topic went out.
    pub async fn close(&self) {
        if let Some(session) = self.session.get() {
            session.close().await;
        }
        self.link.close();
    }
}

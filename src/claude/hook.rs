//! `agent-relay hook <event>`: the command Claude Code runs for a hook. It
//! reads the event on stdin, hands it to the MCP server of the same Claude
//! Code process over that server's hook socket (a socket in the bus
//! directory named by the process, see [`super::hook_socket_file`]), and
//! prints what the server answers: a permission decision, or nothing.
//!
//! A hook never joins the bus and never leads: the session it speaks for
//! does, and keeps what a hook cannot (its topic, grants, progress). With
//! no server to talk to it decides nothing and exits 0, so Claude Code goes
//! on as without it; that is said on stderr.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use interprocess::local_socket::ListenerOptions;
use interprocess::local_socket::tokio::Stream;
use interprocess::local_socket::traits::tokio::{Listener as _, Stream as _};
use interprocess::os::unix::local_socket::ListenerOptionsExt;
use serde_json::Value;
use tokio_util::codec::Framed;

use super::bridge::ClaudeBridge;
use crate::backoff::Backoff;
use crate::bus::election::{BusDir, check_peer_is_me};
use crate::config::{Config, ConfigError};
use crate::framing::{Frame, LineCodec, MAX_FRAME_BYTES};
use crate::paths::Paths;
use crate::protocol::claude::{HookAnswer, HookCall};

/// How long SessionStart looks for its server: Claude Code starts its MCP
/// servers and its first hook at once, so the server may still be binding
/// its socket. Every later hook finds the server at once or not at all
/// (Claude Code stops it before SessionEnd): it decides at once.
const FIND_SERVER: Duration = Duration::from_secs(5);
/// Hook connections served at once (hooks of one event run in parallel).
const MAX_HOOKS: usize = 32;
/// Longest text kept of one string in a tool's input sent to the server
/// (a Write's whole file would not fit a line; the preview needs little).
const KEEP_CHARS: usize = 20_000;

/// Where the hook socket of the process named `key` lives.
fn socket_name(
    paths: &Paths,
    config: &Config,
    key: &str,
) -> std::io::Result<interprocess::local_socket::Name<'static>> {
    let bot = config.bot_id().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no bot token configured (config.toml bot_token or TELEGRAM_BOT_TOKEN)",
        )
    })?;
    BusDir::new(paths.bus_dir(bot)).side_socket_name(&super::hook_socket_file(key))
}

impl ClaudeBridge {
    /// Serves the hooks of this Claude Code process, until the bridge stops.
    pub(super) fn spawn_hook_socket(
        self: Arc<Self>,
        paths: &Paths,
        config: &Result<Config, ConfigError>,
    ) {
        let (Ok(config), Some(key)) = (config, self.env.process_key.clone()) else {
            return;
        };
        let bot = match config.bot_id() {
            Some(bot) => bot,
            None => return,
        };
        let bus = match BusDir::open_checked(paths.bus_dir(bot)) {
            Ok(bus) => bus,
            Err(e) => {
                tracing::warn!("no hook socket: {e}");
                return;
            }
        };
        let file = super::hook_socket_file(&key);
        let listener = bus.side_socket_name(&file).and_then(|name| {
            ListenerOptions::new()
                .name(name)
                .try_overwrite(true)
                .mode(0o600)
                .create_tokio()
        });
        let listener = match listener {
            Ok(listener) => listener,
            Err(e) => {
                tracing::warn!("cannot open the hook socket: {e}");
                return;
            }
        };
        let path = bus.path().join(file);
        let limit = Arc::new(tokio::sync::Semaphore::new(MAX_HOOKS));
        crate::tasks::spawn(async move {
            let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
            loop {
                let stream = tokio::select! {
                    () = self.stop.cancelled() => break,
                    accepted = listener.accept() => match accepted {
                        Ok(stream) => stream,
                        Err(e) => {
                            tracing::warn!("hook socket accept failed: {e}");
                            tokio::time::sleep(backoff.step()).await;
                            continue;
                        }
                    },
                };
                backoff.reset();
                let Ok(permit) = limit.clone().try_acquire_owned() else {
                    tracing::warn!("{MAX_HOOKS} hooks at once; refusing one");
                    continue;
                };
                let bridge = self.clone();
                crate::tasks::spawn(async move {
                    bridge.serve_hook(stream).await;
                    drop(permit);
                });
            }
            drop(listener);
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::debug!("cannot remove the hook socket: {e}");
            }
        });
    }

    async fn serve_hook(&self, stream: Stream) {
        if let Err(e) = check_peer_is_me(&stream) {
            tracing::warn!("refused a hook connection: {e}");
            return;
        }
        let mut framed = Framed::new(stream, LineCodec::default());
        let answer = match framed.next().await {
            Some(Ok(Frame::Line(line))) => match serde_json::from_str::<HookCall>(&line) {
                Ok(call) => self.on_hook(call).await,
                Err(e) => HookAnswer {
                    output: None,
                    note: Some(format!("agent-relay: unreadable hook call: {e}")),
                },
            },
            _ => return,
        };
        match serde_json::to_string(&answer) {
            Ok(line) => {
                if let Err(e) = framed.send(line).await {
                    tracing::debug!("the hook left before its answer: {e}");
                }
            }
            Err(e) => tracing::error!("cannot encode a hook answer: {e}"),
        }
    }
}

/// `agent-relay hook <event>`: the hook's output for Claude Code, if any,
/// and a note for stderr.
pub async fn run(
    event: &str,
    stdin: &[u8],
    paths: &Paths,
    config: Result<Config, ConfigError>,
) -> (Option<String>, Option<String>) {
    let input: Value = match serde_json::from_slice(stdin) {
        Ok(input) => input,
        Err(e) => {
            return (
                None,
                Some(format!("agent-relay: the hook input is not JSON: {e}")),
            );
        }
    };
    let config = match config {
        Ok(config) => config,
        Err(e) => return (None, Some(format!("agent-relay: {e}"))),
    };
    let env = super::ClaudeEnv::from_env();
    let key = env
        .process_key
        .clone()
        .or_else(|| input["session_id"].as_str().map(|s| format!("session:{s}")));
    let Some(key) = key else {
        return (
            None,
            Some("agent-relay: Claude Code named no session".into()),
        );
    };
    let not_running = || {
        Some("agent-relay: this Claude Code session's MCP server (agent-relay mcp) is not running; nothing was relayed".to_string())
    };
    let name = match socket_name(paths, &config, &key) {
        Ok(name) => name,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (None, not_running()),
        Err(e) => return (None, Some(format!("agent-relay: {e}"))),
    };
    let mut call = HookCall {
        event: event.to_string(),
        input,
        entrypoint: env.entrypoint,
    };
    let mut line = serde_json::to_string(&call).unwrap_or_default();
    if line.len() >= MAX_FRAME_BYTES {
        shrink(&mut call.input);
        line = serde_json::to_string(&call).unwrap_or_default();
    }
    let patience = if event == "SessionStart" {
        FIND_SERVER
    } else {
        Duration::ZERO
    };
    let Some(stream) = find_server(name, patience).await else {
        return (None, not_running());
    };
    let mut framed = Framed::new(stream, LineCodec::default());
    if let Err(e) = framed.send(line).await {
        return (
            None,
            Some(format!("agent-relay: cannot reach the MCP server: {e}")),
        );
    }
    match framed.next().await {
        Some(Ok(Frame::Line(line))) => match serde_json::from_str::<HookAnswer>(&line) {
            Ok(answer) => (answer.output.map(|o| o.to_string()), answer.note),
            Err(e) => (None, Some(format!("agent-relay: unreadable answer: {e}"))),
        },
        _ => (
            None,
            Some("agent-relay: the MCP server went away before it answered".into()),
        ),
    }
}

/// Connects to the server's socket, waiting for it up to `patience` (it
/// may still be starting), to a process of this user only.
async fn find_server(
    name: interprocess::local_socket::Name<'static>,
    patience: Duration,
) -> Option<Stream> {
    let deadline = tokio::time::Instant::now() + patience;
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    loop {
        match Stream::connect(name.clone()).await {
            Ok(stream) => return check_peer_is_me(&stream).ok().map(|()| stream),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return None,
            Err(_) if tokio::time::Instant::now() < deadline => {
                // Never past the deadline: the last try is at it.
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                tokio::time::sleep(backoff.step().min(left)).await;
            }
            Err(_) => return None,
        }
    }
}

/// Clips every long string in `value`, so the call fits one line.
fn shrink(value: &mut Value) {
    match value {
        Value::String(s) if s.chars().count() > KEEP_CHARS => {
            *s = crate::policy::clip(s, KEEP_CHARS);
        }
        Value::Array(items) => items.iter_mut().for_each(shrink),
        Value::Object(map) => map.values_mut().for_each(shrink),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_tool_input_is_clipped_to_fit_a_line() {
        let mut input = serde_json::json!({
            "tool_input": {"file_path": "/p/a", "content": "x".repeat(2 * MAX_FRAME_BYTES)},
            "session_id": "s",
        });
        shrink(&mut input);
        let text = input.to_string();
        assert!(text.len() < MAX_FRAME_BYTES, "{}", text.len());
        assert_eq!(input["tool_input"]["file_path"], "/p/a");
        assert_eq!(input["session_id"], "s");
    }
}

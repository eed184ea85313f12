//! Files back from Codex: a tool the relay offers Codex as an MCP server
//! (docs/DESIGN.md, "Codex").
//!
//! Codex runs no extension of the relay's, but it starts the MCP servers
//! its configuration names. The relay names one on Codex's command line
//! only (`-c mcp_servers.agent_relay.…`, never in the user's config.toml):
//! `agent-relay codex-tools <socket>`, a tiny MCP server on stdio whose
//! one tool, `send_file {path, caption?, as?}`, goes over `<socket>` to
//! the relay's session of that Codex ([`serve`]) as the host protocol's
//! `file/send` — the call pi's `telegram_send_file` and Claude Code's
//! `send_file` end in, with the same policy check (a path outside the
//! project is refused, and the tool's answer says why).
//!
//! The socket lies in a 0700 folder of the relay's, and both ends check
//! that the other runs as the same user. The MCP server is the one Claude
//! Code's tools run on (`crate::mcp`), its `send_file` tool the same.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::{JoinHandle, JoinSet};

use super::bridge::CodexBridge;
use crate::host::{HostLink, OutboundError, RpcError, Service, encode_result};
use crate::mcp::{SEND_FILE_WAIT, send_file_params, send_file_tool, sent_text, tool_result};
use crate::protocol::host::{FILE_NOT_SENT, SendFileParams, SendFileResult, method};

/// The MCP server's name in Codex's configuration: the model sees its
/// tool as this server's `send_file`.
pub const SERVER_NAME: &str = "agent_relay";
/// The socket's name in the relay's folder.
pub const SOCKET: &str = "tools.sock";
/// What the log says when Codex has to run without the tool.
const WITHOUT: &str = "Codex runs without the relay's send_file tool";

/// What the model reads about the server.
const INSTRUCTIONS: &str = "agent-relay connects this session to a Telegram topic of its own. \
Use `send_file` to send the user a file or picture from the project to read on the phone.";

/// The tool offered from `folder` (the relay's own, 0700): its socket bound
/// there before Codex starts, so the server Codex runs finds it, and what
/// Codex's command line gets to run that server. `None` when that fails:
/// Codex then runs without the tool, and the log says so.
pub fn offer(folder: &Path) -> Option<(UnixListener, Vec<String>)> {
    let offered = std::env::current_exe().and_then(|exe| {
        let (listener, socket) = bind(folder)?;
        Ok((listener, codex_args(&exe, &socket)))
    });
    offered
        .inspect_err(|e| tracing::warn!("{WITHOUT}: {e}"))
        .ok()
}

/// Binds the relay's end of the tool's socket in `folder`.
pub fn bind(folder: &Path) -> io::Result<(UnixListener, PathBuf)> {
    let socket = folder.join(SOCKET);
    match std::fs::remove_file(&socket) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    Ok((UnixListener::bind(&socket)?, socket))
}

/// What Codex's command line gets so that it runs `agent-relay
/// codex-tools <socket>` as an MCP server: `-c` overrides, each a TOML
/// value (a JSON string is one). The tool answers within 2 s (an upload
/// Telegram has not answered goes on, and the answer says so); Codex gives
/// it a few seconds more than the relay's own bound on a session that does
/// not answer. Codex does not ask about it (`approve`): it would stop the turn on a
/// question in the terminal for every file, and what the tool may send is
/// the relay's own check, the same for every host.
fn codex_args(exe: &Path, socket: &Path) -> Vec<String> {
    let quoted = |p: &Path| Value::String(p.display().to_string()).to_string();
    let key = format!("mcp_servers.{SERVER_NAME}");
    vec![
        "-c".into(),
        format!("{key}.command={}", quoted(exe)),
        "-c".into(),
        format!("{key}.args=[\"codex-tools\", {}]", quoted(socket)),
        "-c".into(),
        format!("{key}.tool_timeout_sec={}", SEND_FILE_WAIT.as_secs() + 5),
        "-c".into(),
        format!("{key}.default_tools_approval_mode=\"approve\""),
    ]
}

/// The tool for a Codex `serve` launched: its socket in a 0700 folder of
/// its own under the relay's runtime directory, served once the session
/// exists ([`Offer::serve`]); dropped, it stops serving and the folder goes.
pub struct Offer {
    folder: PathBuf,
    listener: Option<UnixListener>,
    serving: Option<JoinHandle<()>>,
    /// What Codex's command line gets ([`codex_args`]).
    pub args: Vec<String>,
}

impl Offer {
    /// Makes the folder `codex-launch-<launch_id>` and binds the socket; `None`
    /// (Codex runs without the tool, said in the log) when that fails.
    pub fn make(paths: &crate::paths::Paths, launch_id: &str) -> Option<Self> {
        if launch_id.is_empty() || !launch_id.chars().all(|c| c.is_ascii_alphanumeric()) {
            tracing::warn!("{WITHOUT}: an odd launch id");
            return None;
        }
        let folder = paths.runtime_dir.join(format!("codex-launch-{launch_id}"));
        if let Err(e) = paths.check_own_dir(&folder, crate::paths::Missing::Create) {
            tracing::warn!("{WITHOUT}: {e}");
            return None;
        }
        let Some((listener, args)) = offer(&folder) else {
            let _ = std::fs::remove_dir(&folder);
            return None;
        };
        Some(Self {
            folder,
            listener: Some(listener),
            serving: None,
            args,
        })
    }

    /// Serves the tool for `bridge`'s session.
    pub fn serve(&mut self, bridge: Arc<CodexBridge>) {
        if let Some(listener) = self.listener.take() {
            self.serving = Some(serve(listener, bridge));
        }
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        if let Some(serving) = self.serving.take() {
            serving.abort();
        }
        let _ = std::fs::remove_file(self.folder.join(SOCKET));
        let _ = std::fs::remove_dir(&self.folder);
    }
}

/// The relay's session a tool socket forwards `file/send` to: Codex's
/// bridge, or OpenCode's (which runs the same MCP server).
pub trait SendsFiles: Send + Sync + 'static {
    fn send_file(
        &self,
        params: &SendFileParams,
    ) -> impl std::future::Future<Output = Result<SendFileResult, String>> + Send;
}

impl SendsFiles for CodexBridge {
    async fn send_file(&self, params: &SendFileParams) -> Result<SendFileResult, String> {
        CodexBridge::send_file(self, params).await
    }
}

/// Serves the tool's connections for `bridge`'s session until aborted
/// (which ends the connections too).
pub fn serve<S: SendsFiles>(listener: UnixListener, bridge: Arc<S>) -> JoinHandle<()> {
    crate::tasks::spawn(async move {
        let mut connections = JoinSet::new();
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!("the tool socket failed: {e}");
                    return;
                }
            };
            if let Err(e) = check_peer_is_me(&stream) {
                tracing::warn!("a connection to the tool socket refused: {e}");
                continue;
            }
            let desk = Arc::new(Desk {
                bridge: bridge.clone(),
            });
            connections.spawn(crate::tasks::boxed(async move {
                let (read, write) = stream.into_split();
                let _ = crate::host::serve_service(read, write, move |_| desk).await;
            }));
        }
    })
}

fn check_peer_is_me(stream: &UnixStream) -> io::Result<()> {
    crate::bus::election::check_peer_uid(Some(stream.peer_cred()?.uid()), "the tool socket")
}

/// The relay's end of one connection: `file/send` to the session.
struct Desk<S> {
    bridge: Arc<S>,
}

impl<S: SendsFiles> Service for Desk<S> {
    async fn call(
        self: Arc<Self>,
        method: String,
        params: Option<Box<RawValue>>,
    ) -> Result<Box<RawValue>, RpcError> {
        if method != method::FILE_SEND {
            return Err(RpcError::method_not_found(&method));
        }
        let params: SendFileParams = params
            .as_deref()
            .map(|raw| serde_json::from_str(raw.get()))
            .transpose()
            .ok()
            .flatten()
            .ok_or_else(|| RpcError::invalid_params("file/send needs a `path`"))?;
        match self.bridge.send_file(&params).await {
            Ok(sent) => encode_result(&sent),
            Err(why) => Err(RpcError {
                code: FILE_NOT_SENT,
                message: why,
            }),
        }
    }

    fn notify(&self, _method: &str, _params: Option<Box<RawValue>>) {}
}

/// `agent-relay codex-tools <socket>`: the MCP server on `input`/`output`
/// until Codex closes it.
pub async fn run_mcp<R, W>(socket: &Path, input: R, output: W) -> io::Result<()>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let stream = UnixStream::connect(socket).await?;
    check_peer_is_me(&stream)?;
    let (read, write) = stream.into_split();
    let (link_tx, link_rx) = tokio::sync::oneshot::channel();
    let relay = crate::tasks::spawn(crate::host::serve_service(read, write, move |link| {
        let _ = link_tx.send(link);
        Arc::new(Quiet)
    }));
    let relay_link = link_rx
        .await
        .map_err(|_| io::Error::other("the relay's connection did not start"))?;
    let served = crate::host::serve_service(input, output, move |_| {
        crate::mcp::McpServer::new(CodexTools { relay: relay_link })
    })
    .await;
    relay.abort();
    served
}

/// The MCP side's end of the relay's connection: the relay asks nothing.
struct Quiet;

impl Service for Quiet {
    async fn call(
        self: Arc<Self>,
        method: String,
        _params: Option<Box<RawValue>>,
    ) -> Result<Box<RawValue>, RpcError> {
        Err(RpcError::method_not_found(&method))
    }

    fn notify(&self, _method: &str, _params: Option<Box<RawValue>>) {}
}

/// The tool Codex calls, on the relay's MCP server.
struct CodexTools {
    relay: HostLink,
}

impl crate::mcp::Tools for CodexTools {
    const INSTRUCTIONS: &'static str = INSTRUCTIONS;

    fn list(&self) -> Value {
        json!([send_file_tool()])
    }

    async fn call(&self, name: &str, args: Value) -> Option<Value> {
        if name != "send_file" {
            return None;
        }
        Some(tool_result(self.send_file(args).await))
    }
}

impl CodexTools {
    async fn send_file(&self, args: Value) -> Result<String, String> {
        let params = send_file_params(args)?;
        let sent: Result<SendFileResult, _> = self
            .relay
            .request(method::FILE_SEND, &params, SEND_FILE_WAIT)
            .await;
        match sent {
            Ok(sent) => Ok(sent_text(&params, &sent)),
            Err(OutboundError::Rpc { message, .. }) => Err(format!("Not sent: {message}")),
            Err(OutboundError::Closed) => {
                Err("Not sent: the relay beside this Codex is gone.".into())
            }
            Err(e) => Err(format!("Not sent: {e}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codexs_command_line_names_the_server_in_toml_whatever_the_paths_hold() {
        let exe = Path::new("/opt/my \"tools\"/agent-relay");
        let socket = Path::new("/run/user/1000/agent-relay/codex-7/tools.sock");
        let args = codex_args(exe, socket);
        let mut overrides = toml::Table::new();
        for pair in args.chunks(2) {
            assert_eq!(pair[0], "-c");
            let (key, value) = pair[1].split_once('=').unwrap();
            let key = key.strip_prefix("mcp_servers.agent_relay.").unwrap();
            let parsed: toml::Table = toml::from_str(&format!("v = {value}")).unwrap();
            overrides.insert(key.to_string(), parsed["v"].clone());
        }
        assert_eq!(overrides["command"].as_str(), Some(exe.to_str().unwrap()));
        let args: Vec<&str> = overrides["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(args, ["codex-tools", socket.to_str().unwrap()]);
        assert_eq!(
            overrides["default_tools_approval_mode"].as_str(),
            Some("approve")
        );
        assert_eq!(overrides["tool_timeout_sec"].as_integer(), Some(15));
    }

    #[test]
    fn a_launch_id_that_is_no_plain_name_gets_no_folder() {
        let home = tempfile::tempdir().unwrap();
        let paths = crate::paths::Paths::under(home.path());
        assert!(Offer::make(&paths, "../escape").is_none());
        assert!(Offer::make(&paths, "").is_none());
        assert!(!home.path().join("escape").exists());
    }
}

//! `agent-relay opencode [args…]`: the user's OpenCode TUI, with the relay
//! beside it on the same server (docs/OPENCODE.md).
//!
//! The wrapper starts a private `opencode serve` on 127.0.0.1, on a free
//! port, behind a password of its own making (`OPENCODE_SERVER_PASSWORD`,
//! which both OpenCode commands read), connects to it as a client of its
//! own (the bridge, which joins the bus as the session's member), then runs
//! `opencode attach <url> --dir <here> [args…]` in the foreground with the
//! terminal: the user sees plain OpenCode, and its exit code is the
//! wrapper's. The session gets its topic when the TUI works in a session.
//!
//! Nothing it starts outlives it, as with `agent-relay codex` (whose
//! foreground handling this shares, `crate::codex::wrapper`): the server
//! runs in a process group of its own and is stopped with the TUI; both
//! children get a signal from the kernel should the wrapper die first;
//! SIGINT, SIGTERM and SIGHUP go on to the TUI. Neither child gets the
//! relay's own variables (the bot token).
//!
//! Without a usable configuration OpenCode runs as it is, without the
//! relay, after one line on stderr saying why.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt as _;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, Command};

use super::{Mode, Server, ServerError};
use crate::codex::wrapper::{Terminal, exit_code, stop_app_server, wait_tui};
use crate::config::{Config, ConfigError};
use crate::paths::{Missing, Paths, UntrustedPath};

/// How long `opencode serve` may take to listen.
const LISTEN_WAIT: Duration = Duration::from_secs(60);
/// What `opencode serve` prints once it listens, before its URL.
const LISTENING: &str = "opencode server listening on ";

#[derive(Debug, thiserror::Error)]
pub enum WrapperError {
    #[error("cannot make the relay's folder: {0}")]
    Folder(#[from] UntrustedPath),
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot find a free port: {0}")]
    Port(#[source] io::Error),
    #[error("`opencode serve` did not listen within {} s", LISTEN_WAIT.as_secs())]
    NotListening,
    #[error("`opencode serve` exited before it listened")]
    ServerExited,
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    Codex(#[from] crate::codex::wrapper::WrapperError),
}

/// Runs OpenCode's TUI with `args` beside the relay; the TUI's exit code.
pub async fn run(
    paths: Paths,
    config: Result<Config, ConfigError>,
    program: &Path,
    args: &[OsString],
) -> Result<i32, WrapperError> {
    let usable = match &config {
        Ok(c) if c.token.is_some() => None,
        Ok(c) => Some(format!(
            "Telegram is not configured (set bot_token in {} or run agent-relay setup)",
            c.file.display()
        )),
        Err(e) => Some(e.to_string()),
    };
    if let Some(why) = usable {
        eprintln!(
            "agent-relay: {}; OpenCode runs without the relay.",
            crate::redact::redact(&why)
        );
        let terminal = Terminal::save();
        let mut tui = spawn(opencode(program).args(args), program)?;
        let status = wait_tui(&mut tui).await?;
        if status.signal().is_some() {
            terminal.restore();
        }
        return Ok(exit_code(status));
    }
    let folder = paths
        .runtime_dir
        .join(format!("opencode-{}", std::process::id()));
    paths.check_own_dir(&folder, Missing::Create)?;
    let outcome = beside(paths, config, program, args, &folder).await;
    let _ = std::fs::remove_file(folder.join(crate::codex::tools::SOCKET));
    if let Err(e) = std::fs::remove_dir(&folder)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!("cannot remove {}: {e}", folder.display());
    }
    outcome
}

/// The server, the relay on it, and the TUI until it quits.
async fn beside(
    paths: Paths,
    config: Result<Config, ConfigError>,
    program: &Path,
    args: &[OsString],
    folder: &Path,
) -> Result<i32, WrapperError> {
    let here = std::env::current_dir()
        .map_err(WrapperError::Port)?
        .display()
        .to_string();
    let password = super::new_password();
    let (mut server, url) = start_server(program, &password).await?;
    let client = match Server::new(&url, Some(password.clone()), &here) {
        Ok(client) => client,
        Err(e) => {
            stop_app_server(&mut server).await;
            return Err(e.into());
        }
    };
    let relay = super::start(client, paths, config, Mode::BesideTui, None);
    let tool = super::offer_tool(folder, relay.bridge()).await;
    let terminal = Terminal::save();
    let tui = spawn(
        opencode(program)
            .arg("attach")
            .arg(&url)
            .arg("--dir")
            .arg(&here)
            .args(args)
            .env(super::PASSWORD_ENV, &password),
        program,
    );
    let status = match tui {
        Ok(mut tui) => wait_tui(&mut tui).await.map_err(WrapperError::from),
        Err(e) => Err(e),
    };
    if status.as_ref().is_ok_and(|s| s.signal().is_some()) {
        terminal.restore();
    }
    // The session sends what it still has for the topic while the server
    // leaves: it needs the server no more.
    if let Some(tool) = tool {
        tool.abort();
    }
    tokio::join!(relay.stop(), stop_app_server(&mut server));
    status.map(exit_code)
}

/// Starts `opencode serve` on a free port of 127.0.0.1 behind `password`,
/// in a process group of its own; once it listens, the process and its
/// URL. Its stderr goes to the relay's log.
async fn start_server(program: &Path, password: &str) -> Result<(Child, String), WrapperError> {
    let port = free_port().map_err(WrapperError::Port)?;
    let mut server = spawn(
        opencode(program)
            .args(serve_args(port))
            .env(super::PASSWORD_ENV, password)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0),
        program,
    )?;
    log_lines(server.stderr.take());
    let stdout = server.stdout.take();
    let listened = match stdout {
        Some(stdout) => tokio::time::timeout(LISTEN_WAIT, listening(stdout))
            .await
            .unwrap_or(Err(WrapperError::NotListening)),
        None => Err(WrapperError::ServerExited),
    };
    match listened {
        Ok(url) => Ok((server, url)),
        Err(e) => {
            stop_app_server(&mut server).await;
            Err(e)
        }
    }
}

/// What `opencode` gets to serve on 127.0.0.1 at `port`.
pub fn serve_args(port: u16) -> [String; 5] {
    [
        "serve".into(),
        "--hostname".into(),
        "127.0.0.1".into(),
        "--port".into(),
        port.to_string(),
    ]
}

/// Reads the server's stdout until it says where it listens (its URL);
/// the rest of it goes to the log.
pub async fn listening(
    stdout: impl tokio::io::AsyncRead + Unpin + Send + 'static,
) -> Result<String, WrapperError> {
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(url) = line.trim().strip_prefix(LISTENING) {
            let url = url.trim().to_string();
            crate::tasks::spawn(async move {
                while let Ok(Some(line)) = lines.next_line().await {
                    tracing::info!(target: "opencode", "{line}");
                }
            });
            return Ok(url);
        }
        tracing::info!(target: "opencode", "{line}");
    }
    Err(WrapperError::ServerExited)
}

/// A port of 127.0.0.1 nobody listens on now. (`--port 0` would take
/// OpenCode's default, 4096, when it is free: the user's own `opencode
/// serve` expects it.)
pub fn free_port() -> io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}

/// An OpenCode command with the user's environment less the relay's own,
/// and a signal should the wrapper die first.
fn opencode(program: &Path) -> Command {
    let mut command = Command::new(program);
    command
        .env_clear()
        .envs(crate::config::child_env(std::env::vars_os()))
        .kill_on_drop(true);
    crate::sys::dies_with_parent(&mut command);
    command
}

fn spawn(command: &mut Command, program: &Path) -> Result<Child, WrapperError> {
    command.spawn().map_err(|source| WrapperError::Spawn {
        program: program.display().to_string(),
        source,
    })
}

/// A child's output goes to the relay's log: the terminal is the TUI's.
fn log_lines(output: Option<tokio::process::ChildStderr>) {
    let Some(output) = output else { return };
    crate::tasks::spawn(async move {
        let mut lines = tokio::io::BufReader::new(output).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::info!(target: "opencode", "{line}");
        }
    });
}

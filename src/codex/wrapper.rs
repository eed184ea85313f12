//! `agent-relay codex [codex args…]`: the user's Codex TUI, with the relay
//! beside it on the same thread (docs/DESIGN.md, "Codex").
//!
//! The wrapper starts a private `codex app-server --listen unix://<dir>/app.sock`
//! in a 0700 folder of the relay's (`<runtime>/codex-<pid>/`), connects to it
//! as a client of its own (the bridge, which joins the bus as the session's
//! member), then runs `codex --remote unix://… [args…]` in the foreground
//! with the terminal: the user sees plain Codex, and its exit code is the
//! wrapper's. The session gets its topic when the TUI's thread exists.
//!
//! Nothing it starts outlives it: the app-server runs in a process group of
//! its own (the terminal's Ctrl-C is the TUI's business, and the group is
//! what is stopped at the end), both children get a signal from the kernel
//! should the wrapper die without cleaning up (`PR_SET_PDEATHSIG`), and
//! SIGINT, SIGTERM and SIGHUP sent to the wrapper go on to the TUI. Codex's
//! TUI has no handler for them and dies at once, leaving the terminal raw,
//! so the wrapper puts the terminal back as it found it ([`Terminal`]).
//! After the TUI, the session sends what it still had for the topic, the app-server gets SIGTERM (SIGKILL after
//! [`STOP_WAIT`]) and the folder goes. Neither child gets the relay's own
//! variables (the bot token): commands the model runs inherit the
//! app-server's environment.
//!
//! Without a usable configuration Codex runs as it is, without the relay,
//! after one line on stderr saying why.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncBufReadExt as _;
use tokio::process::{Child, Command};
use tokio::signal::unix::{SignalKind, signal};
use tokio::time::Instant;

use super::{AppServer, AppServerError, Mode};
use crate::backoff::Backoff;
use crate::config::{Config, ConfigError};
use crate::paths::{Missing, Paths, UntrustedPath};
use crate::sys;

/// How long Codex's app-server may take to listen.
const LISTEN_WAIT: Duration = Duration::from_secs(30);
/// The first wait before connecting again to an app-server not listening
/// yet; the waits double up to eight times that.
const LISTEN_RETRY: Duration = Duration::from_millis(50);
/// How long the TUI has to quit after a signal went on to it, and the
/// app-server after SIGTERM, before SIGKILL.
pub const STOP_WAIT: Duration = Duration::from_secs(10);
/// The environment variable naming the Codex program to run (default
/// `codex` on `PATH`).
pub const CODEX_BIN: &str = "AGENT_RELAY_CODEX_BIN";
/// The socket's name in the wrapper's folder.
const SOCKET: &str = "app.sock";

#[derive(Debug, thiserror::Error)]
pub enum WrapperError {
    #[error("cannot make the app-server's folder: {0}")]
    Folder(#[from] UntrustedPath),
    #[error("cannot start {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("Codex's app-server did not listen on {} within {} s", socket.display(), LISTEN_WAIT.as_secs())]
    NotListening { socket: PathBuf },
    #[error("Codex's app-server exited before it listened ({status})")]
    AppServerExited { status: String },
    #[error(transparent)]
    AppServer(#[from] AppServerError),
    #[error("cannot watch signals: {0}")]
    Signals(#[source] io::Error),
}

/// The Codex program: [`CODEX_BIN`], else `codex` on `PATH`.
pub fn program() -> PathBuf {
    std::env::var_os(CODEX_BIN)
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("codex"), PathBuf::from)
}

/// Runs Codex's TUI with `args` beside the relay; the TUI's exit code.
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
            "agent-relay: {}; Codex runs without the relay.",
            crate::redact::redact(&why)
        );
        let terminal = Terminal::save();
        let mut tui = spawn(codex(program).args(args), program)?;
        let status = wait_tui(&mut tui).await?;
        if status.signal().is_some() {
            terminal.restore();
        }
        return Ok(exit_code(status));
    }
    clean_stale_folders(&paths.runtime_dir);
    let folder = paths
        .runtime_dir
        .join(format!("codex-{}", std::process::id()));
    paths.check_own_dir(&folder, Missing::Create)?;
    let outcome = beside(paths, config, program, args, &folder).await;
    remove_folder(&folder);
    outcome
}

/// The app-server, the relay on it, and the TUI until it quits.
async fn beside(
    paths: Paths,
    config: Result<Config, ConfigError>,
    program: &Path,
    args: &[OsString],
    folder: &Path,
) -> Result<i32, WrapperError> {
    let socket = folder.join(SOCKET);
    let url = format!("unix://{}", socket.display());
    let tools = super::tools::offer(folder);
    let mut server = spawn(
        codex(program)
            .args(
                tools
                    .as_ref()
                    .map(|(_, args)| args.as_slice())
                    .unwrap_or_default(),
            )
            .arg("app-server")
            .arg("--listen")
            .arg(&url)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            // Its hooks (plain codex's, if installed too) leave the
            // session to the bridge.
            .env(super::hook::WRAPPED, std::process::id().to_string())
            .process_group(0),
        program,
    )?;
    log_stderr(&mut server);
    let relay = match connect(&mut server, &socket).await {
        Ok((codex, incoming)) => Some(super::start(
            codex,
            incoming,
            paths,
            config,
            Mode::BesideTui,
        )),
        Err(e) => {
            stop_app_server(&mut server).await;
            return Err(e);
        }
    };
    let serving_tools = relay
        .as_ref()
        .zip(tools)
        .map(|(relay, (listener, _))| super::tools::serve(listener, relay.bridge().clone()));
    let terminal = Terminal::save();
    let tui = spawn(codex(program).arg("--remote").arg(&url).args(args), program);
    let status = match tui {
        Ok(mut tui) => wait_tui(&mut tui).await,
        Err(e) => Err(e),
    };
    if status.as_ref().is_ok_and(|s| s.signal().is_some()) {
        terminal.restore();
    }
    if let Some(relay) = relay {
        relay.stop().await;
    }
    if let Some(serving) = serving_tools {
        serving.abort();
    }
    stop_app_server(&mut server).await;
    status.map(exit_code)
}

/// A Codex command with the user's environment less the relay's own, and
/// a signal should the wrapper die first.
fn codex(program: &Path) -> Command {
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

/// The app-server's stderr goes to the relay's log: the terminal is the
/// TUI's.
fn log_stderr(server: &mut Child) {
    let Some(stderr) = server.stderr.take() else {
        return;
    };
    crate::tasks::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::info!(target: "codex", "{line}");
        }
    });
}

/// Connects once the app-server listens.
async fn connect(
    server: &mut Child,
    socket: &Path,
) -> Result<
    (
        AppServer,
        tokio::sync::mpsc::UnboundedReceiver<super::Incoming>,
    ),
    WrapperError,
> {
    let deadline = Instant::now() + LISTEN_WAIT;
    let mut retry = Backoff::new(LISTEN_RETRY, LISTEN_RETRY * 8);
    loop {
        if let Ok(Some(status)) = server.try_wait() {
            return Err(WrapperError::AppServerExited {
                status: status.to_string(),
            });
        }
        match AppServer::connect(socket).await {
            Ok((codex, incoming)) => {
                codex.initialize("agent-relay").await?;
                return Ok((codex, incoming));
            }
            Err(AppServerError::Connect { .. }) if Instant::now() < deadline => {
                // Not listening yet: Codex binds the socket after its
                // start-up (a fraction of a second).
                tokio::time::sleep(retry.step()).await;
            }
            Err(AppServerError::Connect { .. }) => {
                return Err(WrapperError::NotListening {
                    socket: socket.to_path_buf(),
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits for the TUI, passing on the signals the wrapper gets; a TUI that
/// does not quit within [`STOP_WAIT`] of one is killed.
pub(crate) async fn wait_tui(tui: &mut Child) -> Result<std::process::ExitStatus, WrapperError> {
    let mut terminate = signal(SignalKind::terminate()).map_err(WrapperError::Signals)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(WrapperError::Signals)?;
    let mut hangup = signal(SignalKind::hangup()).map_err(WrapperError::Signals)?;
    let mut kill_at: Option<Instant> = None;
    loop {
        let passed = tokio::select! {
            status = tui.wait() => {
                return status.map_err(|source| WrapperError::Spawn { program: "codex".into(), source });
            }
            _ = terminate.recv() => sys::SIGTERM,
            _ = interrupt.recv() => sys::SIGINT,
            _ = hangup.recv() => sys::SIGHUP,
            () = sleep_until(kill_at) => {
                tracing::warn!("Codex did not quit after a signal; killing it");
                let _ = tui.start_kill();
                kill_at = None;
                continue;
            }
        };
        tracing::info!(signal = passed, "passing a signal on to Codex");
        if let Some(pid) = tui.id() {
            sys::signal(pid, passed);
        }
        kill_at.get_or_insert(Instant::now() + STOP_WAIT);
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// SIGTERM to the app-server's process group (it and what it runs), then
/// SIGKILL if it is still there after [`STOP_WAIT`].
pub(crate) async fn stop_app_server(server: &mut Child) {
    let Some(pid) = server.id() else {
        return;
    };
    sys::signal_group(pid, sys::SIGTERM);
    if tokio::time::timeout(STOP_WAIT, server.wait())
        .await
        .is_err()
    {
        tracing::warn!("Codex's app-server did not stop; killing it");
        sys::signal_group(pid, sys::SIGKILL);
        let _ = server.wait().await;
    }
}

/// The terminal as it was before the TUI took it, to put back when the TUI
/// died without doing so itself.
pub(crate) struct Terminal {
    mode: Option<sys::TerminalMode>,
}

/// What Codex's TUI (0.171) switches on, switched off again: the kitty
/// keyboard flags it pushed, mouse reporting, focus events, bracketed
/// paste, the alternate screen; and the cursor shown.
const TERMINAL_RESET: &str = "\x1b[<u\x1b[?1000l\x1b[?1002l\x1b[?1003l\x1b[?1006l\x1b[?1004l\x1b[?2004l\x1b[?1049l\x1b[?25h\r\n";

impl Terminal {
    pub(crate) fn save() -> Self {
        Self {
            mode: sys::TerminalMode::save(),
        }
    }

    pub(crate) fn restore(&self) {
        let Some(mode) = &self.mode else {
            return;
        };
        mode.apply();
        if sys::stdout_is_terminal() {
            use std::io::Write as _;
            let mut stdout = std::io::stdout();
            let _ = stdout.write_all(TERMINAL_RESET.as_bytes());
            let _ = stdout.flush();
        }
    }
}

/// A TUI's exit status as a shell reports it: its code, or 128 + the
/// signal that ended it.
pub(crate) fn exit_code(status: std::process::ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Removes the wrapper's folder. Codex keeps the socket itself under its
/// own folder and leaves a link to it where it was asked to listen; a
/// socket an app-server killed outright could not remove goes too, with
/// its lock.
fn remove_folder(folder: &Path) {
    let link = folder.join(SOCKET);
    if let Ok(target) = std::fs::read_link(&link) {
        use std::os::unix::fs::FileTypeExt as _;
        let is_socket = std::fs::symlink_metadata(&target).is_ok_and(|m| m.file_type().is_socket());
        if is_socket {
            let _ = std::fs::remove_file(&target);
            let mut lock = target.into_os_string();
            lock.push(".lock");
            let _ = std::fs::remove_file(PathBuf::from(lock));
        }
    }
    let _ = std::fs::remove_file(&link);
    let _ = std::fs::remove_file(folder.join(super::tools::SOCKET));
    if let Err(e) = std::fs::remove_dir(folder)
        && e.kind() != io::ErrorKind::NotFound
    {
        tracing::warn!("cannot remove {}: {e}", folder.display());
    }
}

/// Folders of wrappers that died without cleaning up (SIGKILL).
fn clean_stale_folders(runtime: &Path) {
    let Ok(entries) = std::fs::read_dir(runtime) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("codex-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !sys::exists(pid) {
            remove_folder(&entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_code_is_the_tuis_or_the_signal_that_ended_it() {
        assert_eq!(exit_code(std::process::ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(
            exit_code(std::process::ExitStatus::from_raw(sys::SIGTERM)),
            128 + sys::SIGTERM
        );
    }

    #[test]
    fn a_dead_wrappers_folder_goes_and_a_live_ones_stays() {
        let runtime = tempfile::tempdir().unwrap();
        let mine = runtime.path().join(format!("codex-{}", std::process::id()));
        // No process has pid 2^22 + 1 (above Linux's pid_max).
        let dead = runtime.path().join("codex-4194305");
        for folder in [&mine, &dead] {
            std::fs::create_dir(folder).unwrap();
        }
        let socket_dir = tempfile::tempdir().unwrap();
        let socket = socket_dir.path().join("s");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        std::fs::write(socket_dir.path().join("s.lock"), "").unwrap();
        std::os::unix::fs::symlink(&socket, dead.join(SOCKET)).unwrap();
        clean_stale_folders(runtime.path());
        assert!(mine.exists());
        assert!(!dead.exists());
        assert!(!socket.exists() && !socket_dir.path().join("s.lock").exists());
    }
}

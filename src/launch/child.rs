//! An agent's process: spawned as `serve`'s child in its own process
//! group, with exactly the environment it is given, its stdin and stdout
//! piped as JSON lines, the tail of its stderr kept (a crash is reported
//! with it), and ended politely, then less so — and with it its whole
//! group: what it started and left behind is ended after it ([`end_group`]),
//! and `serve`'s watcher (`watcher.rs`) ends the group if `serve` is
//! killed first.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio::sync::mpsc;
use tokio_util::codec::FramedRead;

use super::engine::{EngineError, Exit};
use crate::framing::{Frame, LineCodec};
use crate::sys;

/// The umask agents get: the one `serve` was started with, not the
/// relay's own 077 (an agent's files are the project's, not the relay's).
static AGENT_UMASK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0o022);

/// Records the umask `serve` was started with, for its agents.
pub fn set_agent_umask(mask: u32) {
    AGENT_UMASK.store(mask, std::sync::atomic::Ordering::Relaxed);
}

/// How long an agent has to leave after its input closed.
const LEAVE: Duration = Duration::from_secs(10);
/// How long after `SIGTERM` before `SIGKILL`.
const TERM: Duration = Duration::from_secs(5);
/// How long what an agent started has to leave by itself once the agent
/// ended (pi's sidecar hands over its last words) before its group is ended.
const LINGER: Duration = Duration::from_secs(2);
/// How often a group is looked at while it is given time to leave.
const LOOK_EVERY: Duration = Duration::from_millis(50);
/// The stderr lines a crash report keeps.
const STDERR_LINES: usize = 20;
/// The most of one stderr line kept.
const STDERR_LINE: usize = 400;

/// A spawned agent process.
pub(super) struct Spawned {
    pub child: Child,
    pub pid: u32,
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
    pub stderr: StderrTail,
}

/// The last lines of a process's stderr.
#[derive(Clone, Default)]
pub(super) struct StderrTail(Arc<Mutex<VecDeque<String>>>);

impl StderrTail {
    pub fn text(&self) -> String {
        let lines = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    fn push(&self, line: String) {
        let mut lines = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        lines.push_back(crate::policy::clip(&line, STDERR_LINE));
        if lines.len() > STDERR_LINES {
            lines.pop_front();
        }
    }
}

/// Spawns `argv` in `folder` with exactly `env`.
pub(super) fn spawn(
    argv: &[String],
    folder: &Path,
    env: &[(OsString, OsString)],
) -> Result<Spawned, EngineError> {
    let program = argv.first().cloned().unwrap_or_default();
    let failed = |message: String| EngineError::Spawn {
        program: program.clone(),
        message,
    };
    let mut command = tokio::process::Command::new(&program);
    command
        .args(&argv[1..])
        .current_dir(folder)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        // A safety net: `serve` ends its agents itself before it drops them.
        .kill_on_drop(true)
        // Its own group: Ctrl-C at `serve`'s terminal is `serve`'s to
        // handle, and ending an agent reaches what it started.
        .process_group(0);
    sys::with_umask(
        &mut command,
        AGENT_UMASK.load(std::sync::atomic::Ordering::Relaxed),
    );
    // Dies with `serve`: the thread that forks is serve's one runtime
    // thread (serve runs a current-thread runtime), so the signal follows
    // the process, not a worker thread.
    sys::dies_with_parent(&mut command);
    let mut child = command.spawn().map_err(|e| failed(e.to_string()))?;
    let pid = child.id().unwrap_or_default();
    let (Some(stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err(failed("its pipes were not set up".into()));
    };
    // The group is the agent's pid: the watcher ends it if `serve` dies.
    super::watcher::watch(pid);
    let tail = StderrTail::default();
    let kept = tail.clone();
    crate::tasks::spawn(async move {
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            tracing::debug!(pid, "agent stderr: {line}");
            kept.push(line);
        }
    });
    Ok(Spawned {
        child,
        pid,
        stdin,
        stdout,
        stderr: tail,
    })
}

/// The agent's input: JSON lines, one writer task, closed on purpose.
#[derive(Clone)]
pub(super) struct Input {
    lines: mpsc::UnboundedSender<Value>,
    close: tokio_util::sync::CancellationToken,
}

impl Input {
    /// Queues one line; false once the input is closed.
    pub fn send(&self, value: Value) -> bool {
        !self.close.is_cancelled() && self.lines.send(value).is_ok()
    }

    /// Closes the agent's input (what it reads as its end), after the
    /// lines already queued.
    pub fn close(&self) {
        self.close.cancel();
    }
}

/// Writes JSON lines to `stdin`.
pub(super) fn writer(mut stdin: ChildStdin) -> Input {
    let (lines, mut outgoing) = mpsc::unbounded_channel::<Value>();
    let close = tokio_util::sync::CancellationToken::new();
    let closed = close.clone();
    crate::tasks::spawn(async move {
        loop {
            let value = tokio::select! {
                biased;
                value = outgoing.recv() => value,
                () = closed.cancelled() => None,
            };
            let Some(value) = value else { break };
            let mut line = value.to_string();
            line.push('\n');
            if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                break;
            }
        }
        // Dropping stdin closes it.
    });
    Input { lines, close }
}

/// Reads the agent's stdout as JSON lines (split on `\n` only, as pi's RPC
/// framing asks); a line that is not JSON is logged and skipped.
pub(super) fn reader(stdout: ChildStdout) -> mpsc::UnboundedReceiver<Value> {
    let (tx, rx) = mpsc::unbounded_channel();
    crate::tasks::spawn(async move {
        let mut frames = FramedRead::new(stdout, LineCodec::default());
        while let Some(Ok(frame)) = frames.next().await {
            let Frame::Line(line) = frame else {
                tracing::debug!("an agent wrote an oversized or non-UTF-8 line");
                continue;
            };
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Value>(&line) {
                Ok(value) => {
                    if tx.send(value).is_err() {
                        break;
                    }
                }
                Err(_) => tracing::debug!(
                    "agent stdout, not JSON: {}",
                    crate::policy::clip(&line, 200)
                ),
            }
        }
    });
    rx
}

/// How the process ended.
pub(super) async fn exit_of(child: &mut Child, stderr: &StderrTail) -> Exit {
    use std::os::unix::process::ExitStatusExt;
    let status = child.wait().await;
    // Its stderr may still be draining; a moment is enough for the last line.
    tokio::time::sleep(Duration::from_millis(50)).await;
    match status {
        Ok(status) => Exit {
            code: status.code(),
            signal: status.signal(),
            stderr: stderr.text(),
        },
        Err(e) => Exit {
            code: None,
            signal: None,
            stderr: format!("cannot wait for the process: {e}"),
        },
    }
}

/// Ends an agent whose input was just closed: it has [`LEAVE`] to go by
/// itself, then its group gets `SIGTERM`, then `SIGKILL`.
pub(super) async fn end(child: &mut Child, pid: u32, stderr: &StderrTail) -> Exit {
    if let Ok(exit) = tokio::time::timeout(LEAVE, exit_of(child, stderr)).await {
        return exit;
    }
    sys::signal_group(pid, sys::SIGTERM);
    if let Ok(exit) = tokio::time::timeout(TERM, exit_of(child, stderr)).await {
        return exit;
    }
    sys::signal_group(pid, sys::SIGKILL);
    exit_of(child, stderr).await
}

/// Ends what is left of an agent's process group once the agent itself
/// ended: [`LINGER`] to leave by itself, then `SIGTERM`, [`TERM`], then
/// `SIGKILL`; then the watcher forgets the group. The group keeps the
/// agent's pid while any of it lives, so the number names nothing else.
pub(super) async fn end_group(pid: u32) {
    if !left_within(pid, LINGER).await {
        tracing::debug!(
            pid,
            "what the agent started outlives it: its group is ended"
        );
        sys::signal_group(pid, sys::SIGTERM);
        if !left_within(pid, TERM).await {
            sys::signal_group(pid, sys::SIGKILL);
        }
    }
    super::watcher::forget(pid);
}

/// Whether process group `pid` is gone within `within`.
async fn left_within(pid: u32, within: Duration) -> bool {
    let until = tokio::time::Instant::now() + within;
    while sys::signal_group(pid, 0) {
        if tokio::time::Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
    true
}

//! A lean scripted host: spawns one `agent-relay stdio` and speaks NDJSON
//! JSON-RPC with it as a coding agent would. It accepts every relayed
//! prompt (`agent/sendUserMessage`) and stamps it the moment its line is
//! read, so latency figures end where a real host would see the prompt.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdout, Command};
use tokio::sync::{mpsc, oneshot, watch};

/// How long a request to the sidecar may take before the bench gives up.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// A prompt the relay handed to this host.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub text: String,
    pub at: Instant,
}

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>;

/// One sidecar process and the host end of its stdio. Dropping it kills
/// the process, so a panicking or interrupted bench leaves nothing behind.
pub struct Host {
    child: Child,
    pid: u32,
    lines: mpsc::UnboundedSender<String>,
    waiters: Waiters,
    status: watch::Receiver<Option<String>>,
    prompts: mpsc::UnboundedReceiver<Prompt>,
    next_id: u64,
    /// The session's identity, so a replacement can take over its topic.
    pub cwd: String,
    pub name: String,
}

impl Host {
    /// Spawns `relay stdio` with exactly `env` (plus `PATH`).
    pub fn spawn(
        relay: &Path,
        env: &[(String, String)],
        cwd: &str,
        name: &str,
    ) -> anyhow::Result<Host> {
        let mut command = Command::new(relay);
        command
            .arg("stdio")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .with_context(|| format!("spawning {}", relay.display()))?;
        let pid = child.id().context("the sidecar exited at once")?;
        let mut stdin = child.stdin.take().context("no stdin")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (lines, mut outgoing) = mpsc::unbounded_channel::<String>();
        tokio::spawn(async move {
            while let Some(mut line) = outgoing.recv().await {
                line.push('\n');
                if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
        });
        let waiters: Waiters = Arc::default();
        let (status_tx, status) = watch::channel(None);
        let (prompts_tx, prompts) = mpsc::unbounded_channel();
        tokio::spawn(read_stdout(
            stdout,
            lines.clone(),
            waiters.clone(),
            status_tx,
            prompts_tx,
        ));
        Ok(Host {
            child,
            pid,
            lines,
            waiters,
            status,
            prompts,
            next_id: 0,
            cwd: cwd.into(),
            name: name.into(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends a request and waits for its `result`.
    pub async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let (tx, rx) = oneshot::channel();
        self.waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, tx);
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let answer = tokio::time::timeout(ANSWER_TIMEOUT, rx)
            .await
            .map_err(|_| anyhow!("{method}: no answer within {ANSWER_TIMEOUT:?}"))?
            .map_err(|_| anyhow!("{method}: the sidecar closed its stdout"))?;
        if let Some(error) = answer.get("error") {
            bail!("{method} failed: {error}");
        }
        Ok(answer["result"].clone())
    }

    pub fn notify(&self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    fn send(&self, message: Value) {
        // A dead sidecar shows up as a missing answer, with its own timeout.
        let _ = self.lines.send(message.to_string());
    }

    pub async fn initialize(&mut self) -> anyhow::Result<Value> {
        let params = json!({
            "protocolVersion": 1,
            "host": {"name": "relay-bench", "version": env!("CARGO_PKG_VERSION")},
            "pid": std::process::id(),
            "cwd": self.cwd,
            "session": {"id": format!("bench-{}", self.name), "name": self.name},
            "hasUI": false
        });
        self.call("initialize", params).await
    }

    /// `initialize` + `initialized`: a configured sidecar then joins the bus.
    pub async fn handshake(&mut self) -> anyhow::Result<()> {
        self.initialize().await?;
        self.notify("initialized", json!({}));
        Ok(())
    }

    /// `command/execute`; returns `(ok, message)`.
    pub async fn command(&mut self, name: &str, args: &str) -> anyhow::Result<(bool, String)> {
        let result = self
            .call("command/execute", json!({"name": name, "args": args}))
            .await?;
        let ok = result["ok"].as_bool().unwrap_or(false);
        let message = result["message"].as_str().unwrap_or_default().to_string();
        Ok((ok, message))
    }

    /// Waits until the latest status line satisfies `pred`.
    pub async fn wait_status(
        &mut self,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> anyhow::Result<String> {
        let pid = self.pid;
        // Owned before matching: the borrow of the watch ends here.
        let outcome = tokio::time::timeout(
            timeout,
            self.status.wait_for(|s| s.as_deref().is_some_and(&pred)),
        )
        .await
        .map(|matched| matched.map(|text| text.clone().unwrap_or_default()));
        match outcome {
            Ok(Ok(text)) => Ok(text),
            Ok(Err(_)) => bail!("sidecar {pid} exited"),
            Err(_) => bail!(
                "status of sidecar {pid} stayed {:?} for {timeout:?}",
                self.status.borrow().clone()
            ),
        }
    }

    /// The next prompt containing `marker` (a session may decorate the
    /// text), skipping others such as redeliveries; `None` after `timeout`.
    pub async fn prompt(&mut self, marker: &str, timeout: Duration) -> Option<Prompt> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.prompts.recv()).await {
                Ok(Some(p)) if p.text.contains(marker) => return Some(p),
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return None,
            }
        }
    }

    /// Waits for `count` prompts containing `marker`; returns when the
    /// last arrived, or `Err(received)` at `deadline`.
    pub async fn prompts_with(
        &mut self,
        marker: &str,
        count: usize,
        deadline: tokio::time::Instant,
    ) -> Result<Instant, usize> {
        let mut received = 0;
        loop {
            match tokio::time::timeout_at(deadline, self.prompts.recv()).await {
                Ok(Some(p)) if p.text.contains(marker) => {
                    received += 1;
                    if received == count {
                        return Ok(p.at);
                    }
                }
                Ok(Some(_)) => continue,
                Ok(None) | Err(_) => return Err(received),
            }
        }
    }

    /// Forgets prompts received so far.
    pub fn drain_prompts(&mut self) {
        while self.prompts.try_recv().is_ok() {}
    }

    /// Sends SIGKILL; returns the instant it was sent. Reap with [`Host::reap`].
    pub fn sigkill(&self) -> Instant {
        let at = Instant::now();
        // SAFETY: kill(2) on a child we spawned and have not reaped yet.
        unsafe {
            libc::kill(self.pid as i32, libc::SIGKILL);
        }
        at
    }

    /// Waits (bounded) for the process to exit.
    pub async fn reap(&mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
    }
}

/// Responses to their waiters, requests answered, status lines kept.
async fn read_stdout(
    stdout: ChildStdout,
    lines: mpsc::UnboundedSender<String>,
    waiters: Waiters,
    status: watch::Sender<Option<String>>,
    prompts: mpsc::UnboundedSender<Prompt>,
) {
    let mut reader = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = reader.next_line().await {
        let at = Instant::now();
        let Ok(message) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let method = message.get("method").and_then(Value::as_str);
        match (message.get("id"), method) {
            (Some(id), Some(method)) => {
                let answer = match method {
                    "agent/sendUserMessage" => {
                        let text = message["params"]["text"].as_str().unwrap_or_default();
                        let _ = prompts.send(Prompt {
                            text: text.to_string(),
                            at,
                        });
                        json!({"result": {"accepted": true}})
                    }
                    "ui/confirm" => json!({"result": {"confirmed": true}}),
                    _ => {
                        json!({"error": {"code": -32601, "message": "not offered by relay-bench"}})
                    }
                };
                let mut answer = answer;
                answer["jsonrpc"] = json!("2.0");
                answer["id"] = id.clone();
                let _ = lines.send(answer.to_string());
            }
            (None, Some("ui/setStatus")) => {
                let text = message["params"]["text"].as_str().map(String::from);
                status.send_replace(text);
            }
            (Some(id), None) => {
                let waiter = id.as_u64().and_then(|id| {
                    waiters
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&id)
                });
                if let Some(waiter) = waiter {
                    let _ = waiter.send(message);
                }
            }
            _ => {}
        }
    }
}

/// Resident memory of a process, from `/proc/<pid>/status`.
pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmRSS in {path}"))
}

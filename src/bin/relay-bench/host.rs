//! A lean scripted host on the crate's one host client: it accepts every
//! relayed prompt (`agent/sendUserMessage`) and keeps the instant its line
//! was read, so latency figures end where a real host would see the prompt.

use std::path::Path;
use std::time::{Duration, Instant};

use agent_relay::host_client::{FromSidecar, Link, Said, Sidecar};
use anyhow::{Context as _, anyhow, bail};
use serde_json::{Value, json};
use tokio::process::Command;
use tokio::sync::{mpsc, watch};

/// How long a request to the sidecar may take before the bench gives up.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// A status line the sidecar set, and when the host read it.
#[derive(Debug, Clone)]
pub struct Status {
    pub text: String,
    pub at: Instant,
}

/// A prompt the relay handed to this host.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub text: String,
    pub at: Instant,
}

/// One sidecar process and the host end of its stdio. Dropping it kills
/// the process, so a panicking or interrupted bench leaves nothing behind.
pub struct Host {
    sidecar: Sidecar,
    pid: u32,
    link: Link,
    status: watch::Receiver<Option<Status>>,
    prompts: mpsc::UnboundedReceiver<Prompt>,
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
            .stderr(std::process::Stdio::null());
        let (sidecar, incoming) =
            Sidecar::spawn(command).with_context(|| format!("spawning {}", relay.display()))?;
        let pid = sidecar.pid().context("the sidecar exited at once")?;
        let link = sidecar.link().clone();
        let (status_tx, status) = watch::channel(None);
        let (prompts_tx, prompts) = mpsc::unbounded_channel();
        tokio::spawn(play(incoming, link.clone(), status_tx, prompts_tx));
        Ok(Host {
            sidecar,
            pid,
            link,
            status,
            prompts,
            cwd: cwd.into(),
            name: name.into(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends a request and waits for its `result`.
    pub async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.link
            .request(method, params, ANSWER_TIMEOUT)
            .await
            .map_err(|e| anyhow!("{e}"))
    }

    pub fn notify(&self, method: &str, params: Value) {
        // A dead sidecar shows up as a missing answer, with its own timeout.
        let _ = self.link.notify(method, params);
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
            self.status
                .wait_for(|s| s.as_ref().is_some_and(|s| pred(&s.text))),
        )
        .await
        .map(|matched| matched.map(|s| s.as_ref().map(|s| s.text.clone()).unwrap_or_default()));
        match outcome {
            Ok(Ok(text)) => Ok(text),
            Ok(Err(_)) => bail!("sidecar {pid} exited"),
            Err(_) => bail!(
                "status of sidecar {pid} stayed {:?} for {timeout:?}",
                self.status.borrow().as_ref().map(|s| s.text.clone())
            ),
        }
    }

    /// When the status line, set after `after`, first satisfied `pred`.
    /// Shared, so several hosts can be watched while the world is in use.
    pub async fn status_since(
        &self,
        after: Instant,
        timeout: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> anyhow::Result<Instant> {
        let pid = self.pid;
        let mut status = self.status.clone();
        let outcome = tokio::time::timeout(
            timeout,
            status.wait_for(|s| s.as_ref().is_some_and(|s| s.at > after && pred(&s.text))),
        )
        .await
        .map(|matched| matched.map(|s| s.as_ref().map_or(after, |s| s.at)));
        match outcome {
            Ok(Ok(at)) => Ok(at),
            Ok(Err(_)) => bail!("sidecar {pid} exited"),
            Err(_) => bail!(
                "status of sidecar {pid} stayed {:?} for {timeout:?}",
                self.status.borrow().as_ref().map(|s| s.text.clone())
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
        self.sidecar.signal(libc::SIGKILL);
        at
    }

    /// Waits (bounded) for the process to exit.
    pub async fn reap(&mut self) {
        let _ = self.sidecar.wait_exit(Duration::from_secs(10)).await;
    }
}

/// The host's side of the conversation: prompts accepted and stamped,
/// confirmations granted, status lines kept.
async fn play(
    mut incoming: mpsc::UnboundedReceiver<Said>,
    link: Link,
    status: watch::Sender<Option<Status>>,
    prompts: mpsc::UnboundedSender<Prompt>,
) {
    while let Some(Said { message, at }) = incoming.recv().await {
        match message {
            FromSidecar::Request { id, method, params } => {
                let _ = match method.as_str() {
                    "agent/sendUserMessage" => {
                        let text = params["text"].as_str().unwrap_or_default();
                        let _ = prompts.send(Prompt {
                            text: text.to_string(),
                            at,
                        });
                        link.respond(id, json!({"accepted": true}))
                    }
                    "ui/confirm" => link.respond(id, json!({"confirmed": true})),
                    _ => link.respond_error(id, -32601, "not offered by relay-bench"),
                };
            }
            FromSidecar::Notification { method, params } if method == "ui/setStatus" => {
                status.send_replace(params["text"].as_str().map(|text| Status {
                    text: text.to_string(),
                    at,
                }));
            }
            FromSidecar::Notification { .. }
            | FromSidecar::Response(_)
            | FromSidecar::NotJson(_) => {}
        }
    }
}

/// Resident memory of a process, from `/proc/<pid>/status`.
/// The memory only `pid` holds (`Private_Clean` + `Private_Dirty` in
/// `smaps_rollup`): what one more sidecar adds, its code pages being shared
/// with every other sidecar.
pub fn private_kib(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/smaps_rollup");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("no {name} in {path}"))
    };
    Ok(field("Private_Clean:")? + field("Private_Dirty:")?)
}

pub fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmRSS in {path}"))
}

//! OpenCode as an engine: `opencode serve` on 127.0.0.1 behind a password
//! of the relay's, `serve`'s child, with the relay as its only client
//! (docs/OPENCODE.md; checked against the pinned OpenCode by
//! `tests/opencode/launch.test.mjs`).
//!
//! OpenCode runs no relay extension: its session is the one `agent-relay
//! opencode` runs beside the TUI, in `serve`'s process, its host played by
//! the same bridge (`crate::opencode`) alone on the server — one mapping of
//! OpenCode's sessions, parts and asks for both. A prompt from the topic is
//! a prompt to the OpenCode session (one sent while a turn runs goes into
//! it, so the session sends one then only to steer), `/stop` aborts it,
//! permission asks and questions go to
//! the phone. The engine keeps what `serve` asks of it: the session to
//! resume by (its id: OpenCode keeps its sessions in its own store), the
//! models (OpenCode's providers and theirs, as its model picker lists
//! them), the model prompts name after `/model`, and the end (`SIGTERM`:
//! the server does not read its input). OpenCode gets the relay's
//! `send_file` as the wrapper's does.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::oneshot;

use crate::launch::engine::{Agent, Context, EngineError, Models, Start};
use crate::launch::starting::{Driver, Started, Starting};
use crate::opencode::{ModelRef, OpenCodeBridge, Opening, Server};
use crate::protocol::host::method;

/// How long OpenCode has to listen and open or resume the session.
const STARTUP: Duration = Duration::from_secs(60);

/// Starts `opencode serve` and the session on it (see the module docs).
pub(crate) async fn start(start: Start, ctx: &Context) -> Result<Agent, EngineError> {
    let password = crate::opencode::new_password();
    let port = crate::opencode::wrapper::free_port().map_err(|e| EngineError::Spawn {
        program: "opencode".into(),
        message: format!("no free port: {e}"),
    })?;
    let mut argv = start.command.clone();
    argv.extend(crate::opencode::wrapper::serve_args(port));
    let mut with_password = start.clone();
    with_password.env.push((
        crate::opencode::PASSWORD_ENV.into(),
        password.clone().into(),
    ));
    let (mut agent, _stdin, stdout) = Starting::spawn("opencode", &argv, &with_password)?;
    // It reads no input: it is asked to leave.
    let pid = agent.pid();
    agent.on_close(move || {
        crate::sys::signal(pid, crate::sys::SIGTERM);
    });
    let url = match tokio::time::timeout(STARTUP, crate::opencode::wrapper::listening(stdout)).await
    {
        Ok(Ok(url)) => url,
        Ok(Err(e)) => return Err(agent.failed(e).await),
        Err(_) => {
            let why = format!("did not listen within {} s", STARTUP.as_secs());
            return Err(agent.failed(why).await);
        }
    };
    let folder = start.folder.display().to_string();
    let server = match Server::new(&url, Some(password), &folder) {
        Ok(server) => server,
        Err(e) => return Err(agent.failed(e).await),
    };
    let running = crate::opencode::launched(
        server,
        ctx.paths.clone(),
        ctx.config.clone(),
        opening(&start),
        start.launch_id.clone(),
    );
    let bridge = running.bridge().clone();
    agent.after(async move { running.stop().await });
    let opened = match tokio::time::timeout(STARTUP, bridge.opened()).await {
        Ok(Ok(opened)) => opened,
        Ok(Err(why)) => return Err(agent.failed(why).await),
        Err(_) => {
            let why = format!("opened no session within {} s", STARTUP.as_secs());
            return Err(agent.failed(why).await);
        }
    };
    bridge.set_model(start.model.as_deref().and_then(ModelRef::parse));
    if let Err(e) = join(&bridge).await {
        let why = format!("its relay session did not start: {e}");
        return Err(agent.failed(why).await);
    }
    let tool = offer_tool(&ctx.paths, &start.launch_id, &bridge).await;
    agent.after(async move { drop(tool) });
    let started = Started {
        resume_id: Some(opened),
        model: start.model.clone(),
        activity: bridge.activity(),
    };
    let launched = Launched {
        bridge,
        current: start.model.clone(),
    };
    Ok(agent.serve(launched, started))
}

/// How the session gets its OpenCode session: the one to resume, or a new
/// one in the folder.
fn opening(start: &Start) -> Opening {
    match &start.resume {
        Some(session_id) => Opening::Resume {
            session_id: session_id.clone(),
        },
        None => Opening::Start,
    }
}

/// Has the session join the relay. Idempotent: joins when `auto_connect`
/// is off too, and waits for the registration, as the hosted session of
/// Claude Code does; joined without a topic is said in the log.
async fn join(bridge: &OpenCodeBridge) -> Result<(), crate::host_client::HostError> {
    let answer = bridge
        .ask_session(
            method::COMMAND_EXECUTE,
            json!({"name": "telegram-connect", "args": ""}),
        )
        .await?;
    if answer["ok"].as_bool() != Some(true) {
        tracing::warn!(
            "a launched OpenCode session joined without its topic: {}",
            answer["message"].as_str().unwrap_or_default()
        );
    }
    Ok(())
}

/// The relay's `send_file`, its socket in a 0700 folder of its own under
/// the relay's runtime directory; the folder goes when it is dropped.
struct Tool {
    folder: std::path::PathBuf,
    serving: Option<tokio::task::JoinHandle<()>>,
}

async fn offer_tool(
    paths: &crate::paths::Paths,
    launch_id: &str,
    bridge: &Arc<OpenCodeBridge>,
) -> Option<Tool> {
    if launch_id.is_empty() || !launch_id.chars().all(|c| c.is_ascii_alphanumeric()) {
        tracing::warn!("OpenCode runs without the relay's send_file tool: an odd launch id");
        return None;
    }
    let folder = paths
        .runtime_dir
        .join(format!("opencode-launch-{launch_id}"));
    if let Err(e) = paths.check_own_dir(&folder, crate::paths::Missing::Create) {
        tracing::warn!("OpenCode runs without the relay's send_file tool: {e}");
        return None;
    }
    let serving = crate::opencode::offer_tool(&folder, bridge).await;
    Some(Tool { folder, serving })
}

impl Drop for Tool {
    fn drop(&mut self) {
        if let Some(serving) = self.serving.take() {
            serving.abort();
        }
        let _ = std::fs::remove_file(self.folder.join(crate::codex::tools::SOCKET));
        let _ = std::fs::remove_dir(&self.folder);
    }
}

/// A launched OpenCode, as `serve` asks it about models: OpenCode's
/// providers through the bridge, and the model prompts from the phone name.
struct Launched {
    bridge: Arc<OpenCodeBridge>,
    current: Option<String>,
}

impl Driver for Launched {
    fn models(&mut self, reply: oneshot::Sender<Result<Models, String>>) {
        let bridge = self.bridge.clone();
        let current = self.current.clone();
        crate::tasks::spawn(async move {
            let listed = bridge.models().await.map_err(|e| e.to_string());
            let _ = reply.send(listed.map(|(list, configured)| (list, current.or(configured))));
        });
    }

    fn set_model(&mut self, model: String, reply: oneshot::Sender<Result<String, String>>) {
        let Some(named) = ModelRef::parse(&model) else {
            let _ = reply.send(Err(format!(
                "{model} is no OpenCode model (they read provider/model)"
            )));
            return;
        };
        self.bridge.set_model(Some(named));
        self.current = Some(model.clone());
        let _ = reply.send(Ok(model));
    }
}

//! Codex as an engine: `codex app-server` on stdio, `serve`'s child, with
//! the relay as its only client (docs/DESIGN.md, *Launching*; the methods
//! are checked against the pinned Codex by `tests/codex/launch.test.mjs`).
//!
//! Codex runs no relay extension: its session is the one `agent-relay
//! codex` runs beside the TUI, in `serve`'s process, its host played by the
//! same bridge (`crate::codex::bridge`) alone on the app-server — one
//! mapping of Codex's threads, turns, items and requests for both. A
//! prompt from the topic is `turn/start` (joining a turn that runs, as
//! Codex does), `/stop` is `turn/interrupt`, approvals and questions go to
//! the phone with Allow / Deny / for the session. The engine keeps what
//! `serve` asks of it: the thread to resume by (its id: `thread/resume`
//! in a new app-server finds the turns Codex keeps under `CODEX_HOME`), the
//! models (`model/list`, Codex's own catalogue, offline too), the model
//! turns start with after `/model` (`turn/start`'s `model`), and the end
//! (the app-server's input closed: it leaves). Codex gets the relay's
//! `send_file` tool as the wrapper's Codex does (`crate::codex::tools`).

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::oneshot;

use crate::codex::{AppServer, CodexBridge, Opening, Transport};
use crate::launch::engine::{Agent, Context, EngineError, Models, Start};
use crate::launch::starting::{Driver, Started, Starting};
use crate::protocol::host::method;

/// How long Codex has to answer `initialize` and open or resume the thread.
const STARTUP: Duration = Duration::from_secs(60);

/// Starts Codex's app-server and the session on it (see the module docs).
pub(crate) async fn start(start: Start, ctx: &Context) -> Result<Agent, EngineError> {
    // The relay's tool, `send_file`: Codex runs it as an MCP server named
    // on its command line (`crate::codex::tools`).
    let mut tools = crate::codex::tools::Offer::make(&ctx.paths, &start.launch_id);
    let mut argv = start.command.clone();
    argv.extend(tools.iter().flat_map(|t| t.args.iter().cloned()));
    argv.push("app-server".into());
    let (mut agent, stdin, stdout) = Starting::spawn("codex", &argv, &start)?;
    let (codex, incoming) = AppServer::start(Transport::stdio(stdout, stdin));
    // Its input closed: the app-server leaves.
    let closing = codex.clone();
    agent.on_close(move || closing.close());
    if let Err(e) = codex.initialize("agent-relay").await {
        return Err(agent.failed(e).await);
    }
    let running = crate::codex::launched(
        codex,
        incoming,
        ctx.paths.clone(),
        ctx.config.clone(),
        opening(&start),
        start.launch_id.clone(),
    );
    let bridge = running.bridge().clone();
    if let Some(tools) = &mut tools {
        tools.serve(bridge.clone());
    }
    agent.after(async move {
        running.stop().await;
        drop(tools);
    });
    let opened = match tokio::time::timeout(STARTUP, bridge.opened()).await {
        Ok(Ok(opened)) => opened,
        Ok(Err(why)) => return Err(agent.failed(why).await),
        Err(_) => {
            let why = format!("opened no thread within {} s", STARTUP.as_secs());
            return Err(agent.failed(why).await);
        }
    };
    if start.resume.is_some() && start.model.is_some() {
        // A resumed thread keeps its own model; the one `/model` chose
        // before goes on with the turns from the phone.
        bridge.set_model(start.model.clone());
    }
    if let Err(e) = join(&bridge).await {
        let why = format!("its relay session did not start: {e}");
        return Err(agent.failed(why).await);
    }
    let model = start.model.clone().or(opened.model);
    let started = Started {
        resume_id: Some(opened.thread_id),
        model: model.clone(),
        activity: bridge.activity(),
    };
    let launched = Launched {
        bridge,
        current: model,
    };
    Ok(agent.serve(launched, started))
}

/// How the session gets its thread: the one to resume, or a new one in
/// the folder.
fn opening(start: &Start) -> Opening {
    match &start.resume {
        Some(thread_id) => Opening::Resume {
            thread_id: thread_id.clone(),
        },
        None => Opening::Start {
            cwd: start.folder.display().to_string(),
            model: start.model.clone(),
        },
    }
}

/// Has the session join the relay. Idempotent: joins when `auto_connect`
/// is off too, and waits for the registration, as the hosted session of
/// Claude Code does; joined without a topic is said in the log.
async fn join(bridge: &CodexBridge) -> Result<(), crate::host_client::HostError> {
    let answer = bridge
        .ask_session(
            method::COMMAND_EXECUTE,
            json!({"name": "telegram-connect", "args": ""}),
        )
        .await?;
    if answer["ok"].as_bool() != Some(true) {
        tracing::warn!(
            "a launched Codex session joined without its topic: {}",
            answer["message"].as_str().unwrap_or_default()
        );
    }
    Ok(())
}

/// A launched Codex, as `serve` asks it about models: Codex's catalogue
/// through the bridge, and the model the turns from the phone start with.
struct Launched {
    bridge: Arc<CodexBridge>,
    current: Option<String>,
}

impl Driver for Launched {
    fn models(&mut self, reply: oneshot::Sender<Result<Models, String>>) {
        let bridge = self.bridge.clone();
        let current = self.current.clone();
        crate::tasks::spawn(async move {
            let listed = bridge.models().await.map_err(|e| e.to_string());
            let _ = reply.send(listed.map(|list| (list, current)));
        });
    }

    fn set_model(&mut self, model: String, reply: oneshot::Sender<Result<String, String>>) {
        self.bridge.set_model(Some(model.clone()));
        self.current = Some(model.clone());
        let _ = reply.send(Ok(model));
    }
}

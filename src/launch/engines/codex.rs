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

use std::time::Duration;

use serde_json::json;
use tokio::sync::{mpsc, oneshot};

use crate::codex::{AppServer, Opening, Running, Transport};
use crate::launch::child::{self, Spawned};
use crate::launch::engine::{Agent, Context, Control, EngineError, Exit, Start};
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
    let Spawned {
        mut child,
        pid,
        stdin,
        stdout,
        stderr,
    } = child::spawn(&argv, &start.folder, &start.env)?;
    let (codex, incoming) = AppServer::start(Transport::stdio(stdout, stdin));
    let failed = |message: String| EngineError::Startup {
        engine: "codex",
        message,
    };
    if let Err(e) = codex.initialize("agent-relay").await {
        codex.close();
        let exit = child::end(&mut child, pid, &stderr).await;
        return Err(failed(with_stderr(&e.to_string(), &exit)));
    }
    let opening = match &start.resume {
        Some(thread_id) => Opening::Resume {
            thread_id: thread_id.clone(),
        },
        None => Opening::Start {
            cwd: start.folder.display().to_string(),
            model: start.model.clone(),
        },
    };
    let running = crate::codex::launched(
        codex.clone(),
        incoming,
        ctx.paths.clone(),
        ctx.config.clone(),
        opening,
        start.launch_id.clone(),
    );
    let bridge = running.bridge().clone();
    if let Some(tools) = &mut tools {
        tools.serve(bridge.clone());
    }
    let opened = match tokio::time::timeout(STARTUP, bridge.opened()).await {
        Ok(Ok(opened)) => opened,
        failure => {
            let why = match failure {
                Ok(Err(why)) => why,
                _ => format!("opened no thread within {} s", STARTUP.as_secs()),
            };
            let exit = end(running, &codex, &mut child, pid, &stderr).await;
            return Err(failed(with_stderr(&why, &exit)));
        }
    };
    if start.resume.is_some() && start.model.is_some() {
        // A resumed thread keeps its own model; the one `/model` chose
        // before goes on with the turns from the phone.
        bridge.set_model(start.model.clone());
    }
    // Idempotent: joins when `auto_connect` is off too, and waits for the
    // registration, as the hosted session of Claude Code does.
    let connected = bridge
        .ask_session(
            method::COMMAND_EXECUTE,
            json!({"name": "telegram-connect", "args": ""}),
        )
        .await;
    match connected {
        Ok(answer) if answer["ok"].as_bool() == Some(true) => {}
        Ok(answer) => tracing::warn!(
            "a launched Codex session joined without its topic: {}",
            answer["message"].as_str().unwrap_or_default()
        ),
        Err(e) => {
            let exit = end(running, &codex, &mut child, pid, &stderr).await;
            return Err(failed(with_stderr(
                &format!("its relay session did not start: {e}"),
                &exit,
            )));
        }
    }
    let model = start.model.clone().or(opened.model);
    let (control, controls) = mpsc::channel(16);
    let (exit_tx, exited) = oneshot::channel();
    let activity = bridge.activity();
    let current = model.clone();
    crate::tasks::spawn(async move {
        let exit = serve(
            &running, &codex, current, controls, &mut child, pid, &stderr,
        )
        .await;
        running.stop().await;
        drop(tools);
        let _ = exit_tx.send(exit);
    });
    Ok(Agent {
        pid,
        resume_id: Some(opened.thread_id),
        model,
        control,
        exited,
        activity,
    })
}

/// Ends a Codex that is starting: the session leaves, the app-server's
/// input closes, and the process goes.
async fn end(
    running: Running,
    codex: &AppServer,
    child: &mut tokio::process::Child,
    pid: u32,
    stderr: &child::StderrTail,
) -> Exit {
    running.stop().await;
    codex.close();
    child::end(child, pid, stderr).await
}

fn with_stderr(why: &str, exit: &Exit) -> String {
    format!(
        "{why}; its stderr: {}",
        crate::policy::clip(&exit.stderr, 800)
    )
}

/// Serves `serve`'s controls until Codex ends.
async fn serve(
    running: &Running,
    codex: &AppServer,
    mut current: Option<String>,
    mut controls: mpsc::Receiver<Control>,
    child: &mut tokio::process::Child,
    pid: u32,
    stderr: &child::StderrTail,
) -> Exit {
    loop {
        let control = tokio::select! {
            exit = child::exit_of(child, stderr) => return exit,
            control = controls.recv() => control,
        };
        match control {
            Some(Control::Models(reply)) => {
                let bridge = running.bridge().clone();
                let current = current.clone();
                crate::tasks::spawn(async move {
                    let listed = bridge.models().await.map_err(|e| e.to_string());
                    let _ = reply.send(listed.map(|list| (list, current)));
                });
            }
            Some(Control::SetModel(model, reply)) => {
                running.bridge().set_model(Some(model.clone()));
                current = Some(model.clone());
                let _ = reply.send(Ok(model));
            }
            Some(Control::End(done)) => {
                codex.close();
                let exit = child::end(child, pid, stderr).await;
                let _ = done.send(());
                return exit;
            }
            None => {
                codex.close();
                return child::end(child, pid, stderr).await;
            }
        }
    }
}

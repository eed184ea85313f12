//! pi as an engine (RPC mode, as pi-coding-agent's own docs in its npm
//! package describe it; docs/DESIGN.md, *Launching*): `pi --mode rpc`, its
//! commands and their responses as JSON lines on stdin and stdout. The
//! relay's extension inside it (`scripts/pi-extension.ts`, loaded from the
//! installed package or `-e` in `[launch.commands]`) spawns the session's
//! sidecar, which registers as the launch (its environment names it), so
//! prompts, approvals, `ask_user` and `telegram_send_file` work as in a
//! keyboard session. `serve` keeps the RPC side: which session file pi
//! writes (to resume it with `--session`), the models (`get_available_models`,
//! `set_model`), `abort`, and the end (its input closed). Nobody sits at a
//! terminal: pi's dialogs (`extension_ui_request`) are dismissed at once,
//! and the relay's own questions go to the phone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

use crate::launch::child::{self, Spawned};
use crate::launch::engine::{Agent, Context, Control, EngineError, Start};
use crate::protocol::launch::ModelChoice;

/// How long pi has to load its extensions and answer `get_state`.
const STARTUP: Duration = Duration::from_secs(60);
/// How long a command may take.
const COMMAND: Duration = Duration::from_secs(30);

type Waiting = Arc<Mutex<HashMap<String, oneshot::Sender<Value>>>>;

/// pi's RPC side: commands with ids, answered by `response` lines.
#[derive(Clone)]
struct Rpc {
    lines: child::Input,
    waiting: Waiting,
    next: Arc<std::sync::atomic::AtomicU64>,
}

impl Rpc {
    async fn call(&self, mut command: Value) -> Result<Value, String> {
        let id = format!(
            "relay-{}",
            self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        command["id"] = id.clone().into();
        let (tx, rx) = oneshot::channel();
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.clone(), tx);
        if !self.lines.send(command) {
            return Err("pi's input is closed".into());
        }
        let answer = tokio::time::timeout(COMMAND, rx).await;
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
        let response = answer
            .map_err(|_| format!("pi did not answer within {} s", COMMAND.as_secs()))?
            .map_err(|_| "pi ended".to_string())?;
        if response["success"].as_bool() == Some(true) {
            Ok(response["data"].clone())
        } else {
            Err(response["error"]
                .as_str()
                .unwrap_or("pi refused the command")
                .to_string())
        }
    }
}

/// Starts pi (see the module docs).
pub(crate) async fn start(start: Start, _ctx: &Context) -> Result<Agent, EngineError> {
    let mut argv = start.command.clone();
    argv.extend(["--mode".into(), "rpc".into()]);
    if let Some(file) = &start.resume {
        argv.extend(["--session".into(), file.clone()]);
    }
    if let Some(model) = &start.model {
        argv.extend(["--model".into(), model.clone()]);
    }
    let Spawned {
        mut child,
        pid,
        stdin,
        stdout,
        stderr,
    } = child::spawn(&argv, &start.folder, &start.env)?;
    let rpc = Rpc {
        lines: child::writer(stdin),
        waiting: Arc::default(),
        next: Arc::default(),
    };
    let (activity_tx, activity) = watch::channel(Instant::now());
    let events = child::reader(stdout);
    crate::tasks::spawn(read(events, rpc.clone(), activity_tx));
    let state = tokio::time::timeout(STARTUP, rpc.call(json!({"type": "get_state"}))).await;
    let state = match state {
        Ok(Ok(state)) => state,
        failed => {
            let why = match failed {
                Ok(Err(e)) => e,
                _ => format!("did not answer within {} s", STARTUP.as_secs()),
            };
            rpc.lines.close();
            let exit = child::end(&mut child, pid, &stderr).await;
            return Err(EngineError::Startup {
                engine: "pi",
                message: format!(
                    "{why}; its stderr: {}",
                    crate::policy::clip(&exit.stderr, 800)
                ),
            });
        }
    };
    let (control, controls) = mpsc::channel(16);
    let (exit_tx, exited) = oneshot::channel();
    let model = model_id(&state["model"]);
    crate::tasks::spawn(async move {
        let exit = serve(rpc, controls, &mut child, pid, &stderr).await;
        let _ = exit_tx.send(exit);
    });
    Ok(Agent {
        pid,
        resume_id: state["sessionFile"].as_str().map(str::to_string),
        model,
        control,
        exited,
        activity,
    })
}

/// Reads pi's stdout: responses to whoever waits, dialogs dismissed,
/// turns counted as activity.
async fn read(
    mut events: mpsc::UnboundedReceiver<Value>,
    rpc: Rpc,
    activity: watch::Sender<Instant>,
) {
    while let Some(event) = events.recv().await {
        match event["type"].as_str() {
            Some("response") => {
                let id = event["id"].as_str().unwrap_or_default().to_string();
                let waiter = rpc
                    .waiting
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&id);
                if let Some(waiter) = waiter {
                    let _ = waiter.send(event);
                }
            }
            Some("extension_ui_request") => {
                let dialog = matches!(
                    event["method"].as_str(),
                    Some("select" | "confirm" | "input" | "editor")
                );
                if dialog {
                    rpc.lines.send(json!({
                        "type": "extension_ui_response",
                        "id": event["id"],
                        "cancelled": true,
                    }));
                }
            }
            Some("agent_start" | "agent_end") => {
                activity.send_replace(Instant::now());
            }
            _ => {}
        }
    }
}

/// Serves `serve`'s controls until pi ends.
async fn serve(
    rpc: Rpc,
    mut controls: mpsc::Receiver<Control>,
    child: &mut tokio::process::Child,
    pid: u32,
    stderr: &child::StderrTail,
) -> crate::launch::engine::Exit {
    loop {
        let control = tokio::select! {
            exit = child::exit_of(child, stderr) => return exit,
            control = controls.recv() => control,
        };
        match control {
            Some(Control::Models(reply)) => {
                let rpc = rpc.clone();
                crate::tasks::spawn(async move {
                    let _ = reply.send(models(&rpc).await);
                });
            }
            Some(Control::SetModel(model, reply)) => {
                let rpc = rpc.clone();
                crate::tasks::spawn(async move {
                    let _ = reply.send(set_model(&rpc, &model).await);
                });
            }
            Some(Control::End(done)) => {
                // Its input closed: pi leaves, and its extension stops the sidecar.
                rpc.lines.close();
                let exit = child::end(child, pid, stderr).await;
                let _ = done.send(());
                return exit;
            }
            None => {
                rpc.lines.close();
                return child::end(child, pid, stderr).await;
            }
        }
    }
}

/// `provider/id`, as `--model` and `/model` name a model.
fn model_id(model: &Value) -> Option<String> {
    Some(format!(
        "{}/{}",
        model["provider"].as_str()?,
        model["id"].as_str()?
    ))
}

async fn models(rpc: &Rpc) -> Result<(Vec<ModelChoice>, Option<String>), String> {
    let state = rpc.call(json!({"type": "get_state"})).await?;
    let available = rpc.call(json!({"type": "get_available_models"})).await?;
    let models = available["models"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let id = model_id(m)?;
            let name = m["name"].as_str().unwrap_or_default();
            let label = if name.is_empty() || id.ends_with(name) {
                id.clone()
            } else {
                format!("{name} ({id})")
            };
            Some(ModelChoice { id, label })
        })
        .collect();
    Ok((models, model_id(&state["model"])))
}

async fn set_model(rpc: &Rpc, model: &str) -> Result<String, String> {
    let (provider, id) = model
        .split_once('/')
        .ok_or_else(|| format!("{model:?} is not provider/model"))?;
    let set = rpc
        .call(json!({"type": "set_model", "provider": provider, "modelId": id}))
        .await?;
    Ok(model_id(&set).unwrap_or_else(|| model.to_string()))
}

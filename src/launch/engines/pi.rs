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

use crate::launch::child;
use crate::launch::engine::{Agent, Context, EngineError, Models, Start};
use crate::launch::starting::{Driver, Started, Starting};
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
    let (mut agent, stdin, stdout) = Starting::spawn("pi", &argv, &start)?;
    let rpc = Rpc {
        lines: child::writer(stdin),
        waiting: Arc::default(),
        next: Arc::default(),
    };
    // Its input closed: pi leaves, and its extension stops the sidecar.
    let lines = rpc.lines.clone();
    agent.on_close(move || lines.close());
    let (activity_tx, activity) = watch::channel(Instant::now());
    crate::tasks::spawn(read(child::reader(stdout), rpc.clone(), activity_tx));
    let state = match tokio::time::timeout(STARTUP, rpc.call(json!({"type": "get_state"}))).await {
        Ok(Ok(state)) => state,
        Ok(Err(why)) => return Err(agent.failed(why).await),
        Err(_) => {
            let why = format!("did not answer within {} s", STARTUP.as_secs());
            return Err(agent.failed(why).await);
        }
    };
    let started = Started {
        resume_id: state["sessionFile"].as_str().map(str::to_string),
        model: model_id(&state["model"]),
        activity,
    };
    Ok(agent.serve(rpc, started))
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

impl Driver for Rpc {
    fn models(&mut self, reply: oneshot::Sender<Result<Models, String>>) {
        let rpc = self.clone();
        crate::tasks::spawn(async move {
            let _ = reply.send(models(&rpc).await);
        });
    }

    fn set_model(&mut self, model: String, reply: oneshot::Sender<Result<String, String>>) {
        let rpc = self.clone();
        crate::tasks::spawn(async move {
            let _ = reply.send(set_model(&rpc, &model).await);
        });
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

async fn models(rpc: &Rpc) -> Result<Models, String> {
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

//! pi as an engine (RPC mode, as pi-coding-agent's own docs in its npm
//! package describe it; docs/DESIGN.md, *Launching*): `pi --mode rpc`, its
//! commands and their responses as JSON lines on stdin and stdout. The
//! relay's extension inside it (`scripts/pi-extension.ts`: the installed
//! package, `-e` in `[launch.commands]`, or else the copy this binary
//! carries, `extension.rs`) spawns the session's
//! sidecar, which registers as the launch (its environment names it), so
//! prompts, approvals, `ask_user` and `telegram_send_file` work as in a
//! keyboard session. `serve` keeps the RPC side: which session file pi
//! writes (to resume it with `--session`), the models (`get_available_models`,
//! `set_model`), `abort`, and the end (its input closed). Nobody sits at a
//! terminal: pi's dialogs (`extension_ui_request`) are dismissed at once,
//! and the relay's own questions go to the phone.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

use crate::launch::child;
use crate::launch::engine::{Agent, Context, EngineError, Models, Start};
use crate::launch::starting::{Driver, Started, Starting};
use crate::protocol::launch::ModelChoice;

mod extension;

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

/// Starts pi (see the module docs), with the relay's extension when pi
/// does not load the relay's package itself; a pi that turns out to load
/// no copy after all is started again with it.
pub(crate) async fn start(mut start: Start, ctx: &Context) -> Result<Agent, EngineError> {
    let places = extension::PiPlaces::new(&start.folder, &start.env);
    let own = match places.loads_relay(&start.command) {
        Some(from) => {
            tracing::debug!(launch = %start.launch_id, "pi loads the relay's extension itself: {from}");
            None
        }
        None => Some(bring(ctx, &mut start)?),
    };
    let pi = match run(&start, own.as_deref()).await? {
        Ran::Relayed(pi) => return Ok(pi),
        Ran::Unrelayed(pi) => pi,
    };
    if own.is_some() {
        return Err(pi
            .failed("it did not load the relay's extension given with -e")
            .await);
    }
    tracing::info!(
        launch = %start.launch_id,
        "pi's settings name the relay's package but it loaded no copy of it: starting it again with the relay's own"
    );
    drop(pi.failed("started again").await);
    let own = bring(ctx, &mut start)?;
    match run(&start, Some(&own)).await? {
        Ran::Relayed(pi) => Ok(pi),
        Ran::Unrelayed(pi) => Err(pi
            .failed("it did not load the relay's extension given with -e")
            .await),
    }
}

/// The extension this binary carries, written for pi; the agent's sidecar
/// is then this very binary (`AGENT_RELAY_BIN`, unless set already), the
/// build the extension came with.
fn bring(ctx: &Context, start: &mut Start) -> Result<PathBuf, EngineError> {
    let path = extension::bring(&ctx.paths).map_err(|message| EngineError::Startup {
        engine: "pi",
        message: format!("it needs the relay's extension, which cannot be written: {message}"),
    })?;
    let set = start.env.iter().any(|(k, _)| k == "AGENT_RELAY_BIN");
    if let Some(binary) = std::env::current_exe().ok().filter(|b| b.is_file())
        && !set
    {
        start.env.push(("AGENT_RELAY_BIN".into(), binary.into()));
    }
    Ok(path)
}

/// A pi that answers, with or without the relay's extension in it.
enum Ran {
    Relayed(Agent),
    Unrelayed(Starting),
}

/// Spawns pi with `extension` (if any) and waits until it answers; pi that
/// loaded no copy of the relay's extension is handed back to be ended.
async fn run(start: &Start, extension: Option<&Path>) -> Result<Ran, EngineError> {
    let mut argv = start.command.clone();
    if let Some(extension) = extension {
        argv.extend(["-e".into(), extension.display().to_string()]);
    }
    argv.extend(["--mode".into(), "rpc".into()]);
    if let Some(file) = &start.resume {
        argv.extend(["--session".into(), file.clone()]);
    }
    if let Some(model) = &start.model {
        argv.extend(["--model".into(), model.clone()]);
    }
    let (mut agent, stdin, stdout) = Starting::spawn("pi", &argv, start)?;
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
        Ok(Ok(state)) => {
            crate::logging::milestone("agent-answered", i64::from(agent.pid()));
            state
        }
        Ok(Err(why)) => return Err(agent.failed(why).await),
        Err(_) => {
            let why = format!("did not answer within {} s", STARTUP.as_secs());
            return Err(agent.failed(why).await);
        }
    };
    match rpc.call(json!({"type": "get_commands"})).await {
        Ok(commands) => match extension::loaded_copies(&commands) {
            0 => return Ok(Ran::Unrelayed(agent)),
            1 => {}
            copies => tracing::warn!(
                launch = %start.launch_id,
                copies,
                "pi loaded the relay's extension more than once: a sidecar each; load it one way only (pi's settings, or -e in [launch.commands])"
            ),
        },
        Err(why) => return Err(agent.failed(why).await),
    }
    let started = Started {
        resume_id: state["sessionFile"].as_str().map(str::to_string),
        model: model_id(&state["model"]),
        activity,
    };
    Ok(Ran::Relayed(agent.serve(rpc, started)))
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

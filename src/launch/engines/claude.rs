//! Claude Code as an engine: headless and kept running between turns —
//! `claude -p --input-format stream-json --output-format stream-json
//! --verbose --permission-prompt-tool stdio` — one process, one session id
//! for every turn (docs/DESIGN.md, *Launching*; the flags are checked
//! against the pinned Claude Code by `tests/claude/launch.test.mjs`).
//!
//! Claude Code runs no relay extension here: its session is hosted in
//! `serve` (`hosted.rs`) and this engine plays its host. A prompt from the
//! topic (`agent/sendUserMessage`) becomes a `user` line on Claude Code's
//! stdin; one sent while a turn runs goes into that turn — the pinned
//! Claude Code hands it to the model with the next tool result, "The user
//! sent a new message while you were working" (docs/DESIGN.md, "Steering a
//! running turn") — so the engine says `canSteer`, and the session sends
//! such a line only to steer. Its `assistant`, `user` (tool results) and `result`
//! lines become the session's turn and tool events; a `can_use_tool`
//! control request becomes `approval/request` — the usual approval on the
//! phone — and its `control_response`. `/stop` is an `interrupt`, `/model`
//! the `initialize` answer's models and `set_model`. A new session gets
//! `--session-id <uuid>`; resuming is `--resume <uuid>`, whose turns
//! Claude Code keeps in its own store. The profile is Claude Code's
//! (`claude-code:<id>`), so a launched session resumed at a keyboard finds
//! its topic too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot, watch};

use crate::host_client::{FromSidecar, Link, Said};
use crate::launch::child::{self, Input};
use crate::launch::engine::{Agent, Context, EngineError, Models, Start};
use crate::launch::hosted::{Hosted, Identity};
use crate::launch::starting::{Driver, Started, Starting};
use crate::protocol::host::{ApprovalResult, Decision, method};
use crate::protocol::launch::ModelChoice;

/// How long Claude Code has to answer its `initialize`.
const STARTUP: Duration = Duration::from_secs(60);
/// How long a control request may take.
const COMMAND: Duration = Duration::from_secs(30);
/// How long an approval may wait for the phone (the session's policy
/// decides sooner).
const PERSON: Duration = Duration::from_secs(24 * 3600);

#[derive(Default)]
struct State {
    /// Control requests of ours waiting for their `control_response`.
    waiting: HashMap<String, oneshot::Sender<Value>>,
    next: u64,
    /// The models `initialize` named.
    models: Vec<(ModelChoice, Option<String>)>,
    /// The model the last turn ran with.
    model: Option<String>,
    /// A turn runs.
    busy: bool,
    /// Prompts written while it ran: Claude Code makes them its next turn.
    queued: usize,
}

/// The engine's view of one Claude Code process.
struct Claude {
    input: Input,
    link: Link,
    state: Mutex<State>,
    activity: watch::Sender<Instant>,
}

impl Claude {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A control request to Claude Code; answers its `response`.
    async fn control(&self, request: Value) -> Result<Value, String> {
        let (id, rx) = {
            let mut state = self.state();
            state.next += 1;
            let id = format!("relay-{}", state.next);
            let (tx, rx) = oneshot::channel();
            state.waiting.insert(id.clone(), tx);
            (id, rx)
        };
        let sent = self.input.send(json!({
            "type": "control_request",
            "request_id": id,
            "request": request,
        }));
        if !sent {
            self.state().waiting.remove(&id);
            return Err("Claude Code's input is closed".into());
        }
        let answer = tokio::time::timeout(COMMAND, rx).await;
        self.state().waiting.remove(&id);
        let response = answer
            .map_err(|_| format!("Claude Code did not answer within {} s", COMMAND.as_secs()))?
            .map_err(|_| "Claude Code ended".to_string())?;
        match response["subtype"].as_str() {
            Some("success") => Ok(response["response"].clone()),
            _ => Err(response["error"]
                .as_str()
                .unwrap_or("Claude Code refused the request")
                .to_string()),
        }
    }

    fn tell(&self, method: &str, params: Value) {
        if let Err(e) = self.link.notify(method, params) {
            tracing::debug!(method, "the hosted session is gone: {e}");
        }
    }
}

/// Starts Claude Code (see the module docs).
pub(crate) async fn start(start: Start, ctx: &Context) -> Result<Agent, EngineError> {
    let session_id = start
        .resume
        .clone()
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let (mut agent, stdin, stdout) = Starting::spawn("claude", &argv(&start, &session_id), &start)?;
    let input = child::writer(stdin);
    let closing = input.clone();
    agent.on_close(move || closing.close());
    let cwd = start.folder.display().to_string();
    let identity = Identity {
        launch_id: &start.launch_id,
        cwd: &cwd,
        session_id: &session_id,
        session_file: &format!("claude-code:{session_id}"),
        host: "claude-code",
        // A `user` line written while a turn runs goes into it (see `prompt`).
        can_steer: true,
    };
    let mut hosted = match Hosted::start(ctx, identity).await {
        Ok(hosted) => hosted,
        Err(why) => {
            let why = format!("its relay session did not start: {why}");
            return Err(agent.failed(why).await);
        }
    };
    let (activity_tx, activity) = watch::channel(Instant::now());
    let claude = Arc::new(Claude {
        input,
        link: hosted.link.clone(),
        state: Mutex::default(),
        activity: activity_tx,
    });
    crate::tasks::spawn(read(child::reader(stdout), claude.clone()));
    let from_session = std::mem::replace(&mut hosted.from_session, mpsc::unbounded_channel().1);
    crate::tasks::spawn(answer_session(from_session, claude.clone()));
    agent.after(async move { hosted.close().await });
    let init = claude.control(json!({"subtype": "initialize"}));
    match tokio::time::timeout(STARTUP, init).await {
        Ok(Ok(init)) => claude.state().models = models_of(&init),
        Ok(Err(why)) => return Err(agent.failed(why).await),
        Err(_) => {
            let why = format!("did not answer within {} s", STARTUP.as_secs());
            return Err(agent.failed(why).await);
        }
    }
    let started = Started {
        resume_id: Some(session_id),
        model: start.model,
        activity,
    };
    Ok(agent.serve(claude, started))
}

/// Claude Code's command line: headless, stream-json both ways, its
/// permission questions on stdio, the session by its id.
fn argv(start: &Start, session_id: &str) -> Vec<String> {
    let mut argv = start.command.clone();
    argv.extend(
        [
            "-p",
            "--input-format",
            "stream-json",
            "--output-format",
            "stream-json",
            "--verbose",
            "--permission-prompt-tool",
            "stdio",
        ]
        .map(String::from),
    );
    let flag = if start.resume.is_some() {
        "--resume"
    } else {
        "--session-id"
    };
    argv.extend([flag.to_string(), session_id.to_string()]);
    if let Some(model) = &start.model {
        argv.extend(["--model".into(), model.clone()]);
    }
    argv
}

/// The models `initialize` answers: what switches to each, what it shows,
/// and the model it stands for.
fn models_of(init: &Value) -> Vec<(ModelChoice, Option<String>)> {
    init["models"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let id = m["value"].as_str()?.to_string();
            let label = m["displayName"].as_str().unwrap_or(&id).to_string();
            let resolved = m["resolvedModel"].as_str().map(str::to_string);
            Some((ModelChoice { id, label }, resolved))
        })
        .collect()
}

/// Claude Code's output: answers to our control requests, its own
/// requests (`can_use_tool`), and the turn as host events.
async fn read(mut events: mpsc::UnboundedReceiver<Value>, claude: Arc<Claude>) {
    while let Some(event) = events.recv().await {
        match event["type"].as_str() {
            Some("control_response") => {
                let response = event["response"].clone();
                let id = response["request_id"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                if let Some(waiter) = claude.state().waiting.remove(&id) {
                    let _ = waiter.send(response);
                }
            }
            Some("control_request") => {
                let request = event["request"].clone();
                let id = event["request_id"].clone();
                if request["subtype"].as_str() == Some("can_use_tool") {
                    crate::tasks::spawn(approve(claude.clone(), id, request));
                } else {
                    claude
                        .input
                        .send(json!({"type": "control_response", "response": {
                            "subtype": "error", "request_id": id,
                            "error": "agent-relay does not take this request",
                        }}));
                }
            }
            Some("system") if event["subtype"].as_str() == Some("init") => {
                claude.state().model = event["model"].as_str().map(str::to_string);
            }
            // Claude Code's line for a failed API call, not an answer: the
            // `result` after its last try says the failure.
            Some("assistant") if event["is_api_error_message"].as_bool() == Some(true) => {}
            Some("assistant") => assistant(&claude, &event["message"]),
            Some("user") => tool_results(&claude, &event["message"]),
            Some("result") => turn_ended(&claude, &event),
            _ => {}
        }
    }
}

/// One `assistant` line: its text as the turn's answer, its tool calls as
/// the progress message.
fn assistant(claude: &Claude, message: &Value) {
    let mut text = String::new();
    for block in message["content"].as_array().into_iter().flatten() {
        match block["type"].as_str() {
            Some("text") => text.push_str(block["text"].as_str().unwrap_or_default()),
            Some("tool_use") => claude.tell(
                method::TOOL_STARTED,
                json!({"toolName": block["name"], "toolCallId": block["id"], "args": block["input"]}),
            ),
            _ => {}
        }
    }
    if !text.trim().is_empty() {
        claude.tell(method::TURN_ENDED, json!({"assistantText": text}));
    }
}

/// The tool results of a `user` line.
fn tool_results(claude: &Claude, message: &Value) {
    for block in message["content"].as_array().into_iter().flatten() {
        if block["type"].as_str() == Some("tool_result") {
            claude.tell(
                method::TOOL_ENDED,
                json!({"toolCallId": block["tool_use_id"], "isError": block["is_error"].as_bool().unwrap_or(false)}),
            );
        }
    }
}

/// A `result` line ends the turn; prompts written meanwhile are its next.
/// A turn Claude Code gave up on after its own retries (`is_error`,
/// `terminal_reason: "api_error"` and `api_error_status`, its `result` the
/// error line, as 2.1.332 writes it) ended failed: its line is the error,
/// never an answer.
fn turn_ended(claude: &Claude, result: &Value) {
    let aborted = result["subtype"].as_str() == Some("error_during_execution");
    let failed = result["is_error"].as_bool() == Some(true)
        && (result["terminal_reason"].as_str() == Some("api_error")
            || !result["api_error_status"].is_null());
    let ended = if failed {
        let said = result["result"]
            .as_str()
            .unwrap_or("the model's API failed");
        json!({"error": crate::claude::api_error(said)})
    } else {
        json!({"lastAssistantText": result["result"], "aborted": aborted})
    };
    claude.tell(method::AGENT_ENDED, ended);
    claude.activity.send_replace(Instant::now());
    let next = {
        let mut state = claude.state();
        let next = state.queued > 0;
        state.queued = 0;
        state.busy = next;
        next
    };
    if next {
        claude.tell(method::AGENT_STARTED, json!({}));
    }
}

/// Asks the session (its `[approvals]` policy, the phone) whether a tool
/// call may run, and answers Claude Code. Every turn came from Telegram:
/// nobody sits at this Claude Code. A call the policy leaves to the host
/// is denied, as the print mode's permission tool does: nobody else could
/// allow it.
async fn approve(claude: Arc<Claude>, id: Value, request: Value) {
    let tool = request["tool_name"].as_str().unwrap_or("tool").to_string();
    let input = request["input"].clone();
    let asked = claude
        .link
        .request(
            method::APPROVAL_REQUEST,
            json!({
                "toolCallId": request["tool_use_id"].as_str().unwrap_or_default(),
                "tool": tool,
                "input": input,
                "fromTelegram": true,
            }),
            PERSON,
        )
        .await;
    let decided: Result<ApprovalResult, String> = asked
        .map_err(|e| e.to_string())
        .and_then(|v| serde_json::from_value(v).map_err(|e| e.to_string()));
    let behavior = match decided {
        Ok(ApprovalResult {
            decision: Decision::Allow,
            ..
        }) => json!({"behavior": "allow", "updatedInput": input}),
        Ok(ApprovalResult {
            decision: Decision::Deny,
            reason,
            ..
        }) => {
            json!({"behavior": "deny", "message": reason.unwrap_or_else(|| "Denied from Telegram.".into())})
        }
        Ok(ApprovalResult {
            decision: Decision::Defer,
            ..
        }) => {
            json!({"behavior": "deny", "message": format!("agent-relay's [approvals] policy does not ask about {tool}, and nobody else can allow it here; add it to [approvals] tools to be asked on the phone.")})
        }
        Err(why) => {
            json!({"behavior": "deny", "message": format!("Denied: the relay could not ask ({why}).")})
        }
    };
    claude
        .input
        .send(json!({"type": "control_response", "response": {
            "subtype": "success", "request_id": id, "response": behavior,
        }}));
}

/// What the hosted session asks of its host: prompts, and `/stop`.
async fn answer_session(mut from: mpsc::UnboundedReceiver<Said>, claude: Arc<Claude>) {
    while let Some(Said { message, .. }) = from.recv().await {
        let FromSidecar::Request { id, method, params } = message else {
            continue;
        };
        let answer = match method.as_str() {
            method::AGENT_SEND_USER_MESSAGE => Ok(prompt(&claude, &params)),
            method::AGENT_ABORT => claude
                .control(json!({"subtype": "interrupt"}))
                .await
                .map(|_| json!({}))
                .map_err(|why| (-32000, why)),
            other => Err((-32601, format!("Method not found: {other}"))),
        };
        let sent = match answer {
            Ok(result) => claude.link.respond(id, result),
            Err((code, why)) => claude.link.respond_error(id, code, &why),
        };
        if sent.is_err() {
            break;
        }
    }
}

/// A prompt from the topic as a `user` line; a turn starts unless one runs.
/// A steer goes into the turn that runs, which makes no turn of its own.
fn prompt(claude: &Claude, params: &Value) -> Value {
    let text = params["text"].as_str().unwrap_or_default();
    let steer = params["deliverAs"].as_str() == Some("steer");
    // Busy before the line goes: its `result` (read by another task) must
    // never come before the turn's start, or the session would wait for
    // an end that came already.
    let starts = {
        let mut state = claude.state();
        if state.busy {
            if !steer {
                state.queued += 1;
            }
            false
        } else {
            state.busy = true;
            true
        }
    };
    if starts {
        claude.activity.send_replace(Instant::now());
        claude.tell(method::AGENT_STARTED, json!({}));
    }
    let sent = claude.input.send(json!({
        "type": "user",
        "message": {"role": "user", "content": text},
    }));
    if !sent {
        if starts {
            claude.state().busy = false;
            claude.tell(method::AGENT_ENDED, json!({}));
        } else if !steer {
            let mut state = claude.state();
            state.queued = state.queued.saturating_sub(1);
        }
        return json!({"accepted": false});
    }
    json!({"accepted": true})
}

impl Driver for Arc<Claude> {
    /// Answered from what `initialize` named and the model in use.
    fn models(&mut self, reply: oneshot::Sender<Result<Models, String>>) {
        let state = self.state();
        let current = state.model.clone().map(|model| {
            state
                .models
                .iter()
                .find(|(m, resolved)| m.id == model || resolved.as_deref() == Some(&model))
                .map_or(model, |(m, _)| m.id.clone())
        });
        let models = state.models.iter().map(|(m, _)| m.clone()).collect();
        let _ = reply.send(Ok((models, current)));
    }

    fn set_model(&mut self, model: String, reply: oneshot::Sender<Result<String, String>>) {
        let claude = self.clone();
        crate::tasks::spawn(async move {
            let set = claude
                .control(json!({"subtype": "set_model", "model": model}))
                .await
                .map(|r| r["model"].as_str().unwrap_or(&model).to_string());
            if let Ok(set) = &set {
                claude.state().model = Some(set.clone());
            }
            let _ = reply.send(set);
        });
    }
}

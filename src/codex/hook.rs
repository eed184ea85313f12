//! The hooks for plain `codex`, without the wrapper (`agent-relay install
//! codex` writes them; docs/DESIGN.md, "Codex"). Each event is one run of
//! `agent-relay hook --host codex <event>` with Codex's hook input on
//! stdin. There is no process of the relay's beside Codex then, so the hook
//! runs the session itself, in process, for as long as the event takes:
//! it joins the relay under the thread's profile key (`file:codex:<thread
//! id>`, the wrapper's too, so a thread keeps its topic either way), does
//! what the event asks, and leaves; the binding stays.
//!
//! * `SessionStart` binds the session's topic;
//! * `Stop` posts the turn's final answer (`last_assistant_message`);
//! * `PermissionRequest` asks the phone when the `[approvals]` policy says
//!   so, and otherwise decides nothing, so Codex asks at its terminal.
//!   Every turn of plain `codex` comes from its terminal, so with the
//!   default `only_from_telegram = true` the policy never asks, and the
//!   hook answers at once without joining.
//!
//! What this mode cannot do is start a turn from the phone: a message
//! written in the topic reaches the hook's session only while a hook runs,
//! and is refused with a notice saying how to drive the session from the
//! phone (`agent-relay codex resume <id>`).
//!
//! Under `agent-relay codex` the wrapper's bridge is the session already:
//! its app-server tells its hooks so ([`WRAPPED`]), and they do nothing,
//! or there would be a second live session under the same key.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::{Config, ConfigError};
use crate::host_client::{FromSidecar, Said};
use crate::paths::Paths;
use crate::protocol::host::*;

/// Set in the environment of the wrapper's app-server, so its hooks know.
pub const WRAPPED: &str = "RELAYED_BY_AGENT_RELAY";
/// The events the hooks use, and how long each may take (seconds): a
/// permission waits for a person (the relay's own timeout denies first, at
/// `[approvals] timeout_s`, 300 by default), an answer for Telegram's
/// pacing (a group takes 20 messages a minute).
pub const HOOKS: [(&str, u32); 3] = [
    ("SessionStart", 30),
    ("PermissionRequest", 3600),
    ("Stop", 330),
];

/// Requests to the session that answer at once.
const QUICK: Duration = Duration::from_secs(30);
/// `/telegram-connect` waits 15 s for the registration; a little more.
const CONNECT: Duration = Duration::from_secs(20);
/// Waits for a person, or for Telegram's pacing (the session applies its
/// own timeouts).
const LONG: Duration = Duration::from_secs(3600);

/// The fields of Codex's hook input the relay reads (every event has the
/// first two); unknown ones are ignored.
#[derive(Debug, Default, Deserialize)]
struct Input {
    #[serde(default)]
    session_id: String,
    #[serde(default)]
    cwd: String,
    #[serde(default)]
    turn_id: Option<String>,
    /// Stop: the turn's final text.
    #[serde(default)]
    last_assistant_message: Option<String>,
    /// PermissionRequest: `Bash`.
    #[serde(default)]
    tool_name: Option<String>,
    /// PermissionRequest: `{command, description}`.
    #[serde(default)]
    tool_input: Option<Value>,
}

/// What the hook prints for Codex (a decision) and says on stderr.
#[derive(Debug, Default, PartialEq)]
pub struct Answer {
    pub output: Option<String>,
    pub note: Option<String>,
}

fn note(text: impl Into<String>) -> Answer {
    Answer {
        output: None,
        note: Some(text.into()),
    }
}

/// Handles one hook event. Never fails: a hook that decides nothing lets
/// Codex go on as without the relay.
pub async fn run(
    event: &str,
    input: &[u8],
    paths: Paths,
    config: Result<Config, ConfigError>,
    wrapped: bool,
) -> Answer {
    if wrapped {
        return note("agent-relay: agent-relay codex relays this session already");
    }
    if !matches!(event, "SessionStart" | "Stop" | "PermissionRequest") {
        return note(format!(
            "agent-relay: the {event} hook is not one the relay uses"
        ));
    }
    let input: Input = match serde_json::from_slice(input) {
        Ok(input) => input,
        Err(e) => return note(format!("agent-relay: unreadable hook input: {e}")),
    };
    if input.session_id.is_empty() {
        return note("agent-relay: the hook input names no session");
    }
    let config = match config {
        Ok(config) if config.token.is_some() && config.auto_connect => config,
        Ok(config) if config.token.is_none() => {
            return note(format!(
                "agent-relay: Telegram is not configured (bot_token in {})",
                config.file.display()
            ));
        }
        Ok(_) => return note("agent-relay: auto_connect is off; nothing relayed"),
        Err(e) => return note(format!("agent-relay: {e}")),
    };
    let tool = input.tool_name.as_deref().unwrap_or("bash").to_lowercase();
    let tool_input = input.tool_input.clone().unwrap_or(Value::Null);
    if event == "PermissionRequest" && !phone_may_be_asked(&config, &tool, &tool_input, &input.cwd)
    {
        // The terminal asks, as it would without the relay.
        return Answer::default();
    }
    let session = crate::session::InProcess::start(paths, Ok(config));
    let link = session.link.clone();
    spawn_refusals(link.clone(), session.from_session, input.session_id.clone());
    let answer = act(event, &input, &link, tool, tool_input).await;
    crate::session::InProcess::close(&session.session).await;
    answer
}

/// Whether the policy could ask the phone about this call: the hook's
/// turns come from the terminal, so `only_from_telegram` leaves it to the
/// terminal.
fn phone_may_be_asked(config: &Config, tool: &str, input: &Value, cwd: &str) -> bool {
    let policy = &config.approvals;
    policy.mode != crate::policy::Mode::Off
        && !policy.only_from_telegram
        && policy.needs_approval(tool, input, Path::new(cwd)).is_some()
}

/// Joins the relay as the session and does what `event` asks.
async fn act(
    event: &str,
    input: &Input,
    session: &crate::host_client::Link,
    tool: String,
    tool_input: Value,
) -> Answer {
    let connected = match join(input, session).await {
        Ok(connected) => connected,
        Err(why) => return note(format!("agent-relay: {why}")),
    };
    match event {
        "SessionStart" => note(format!("agent-relay: {connected}")),
        "Stop" => {
            let Some(text) = input
                .last_assistant_message
                .as_deref()
                .filter(|t| !t.trim().is_empty())
            else {
                return Answer::default();
            };
            match session
                .request(method::TOPIC_SEND, json!({"text": text}), LONG)
                .await
            {
                Ok(sent) if sent["sent"].as_bool() == Some(true) => Answer::default(),
                Ok(sent) => note(format!(
                    "agent-relay: the answer did not reach the topic: {}",
                    sent["reason"].as_str().unwrap_or("no reason given")
                )),
                Err(e) => note(format!(
                    "agent-relay: the answer did not reach the topic: {e}"
                )),
            }
        }
        _ => {
            let params = ApprovalParams {
                tool_call_id: input.turn_id.clone().unwrap_or_default(),
                tool,
                input: tool_input,
                from_telegram: false,
            };
            let decided = match serde_json::to_value(&params) {
                Ok(params) => session
                    .request(method::APPROVAL_REQUEST, params, LONG)
                    .await
                    .ok()
                    .and_then(|v| serde_json::from_value::<ApprovalResult>(v).ok()),
                Err(_) => None,
            };
            permission_output(decided)
        }
    }
}

/// Initializes the session as Codex's `input.session_id` and has it join
/// the relay; where it went, or why not.
async fn join(input: &Input, session: &crate::host_client::Link) -> Result<String, String> {
    let params = json!({
        "protocolVersion": PROTOCOL_VERSION,
        "host": {"name": "codex", "version": ""},
        "pid": std::os::unix::process::parent_id(),
        "cwd": input.cwd,
        "session": {"id": input.session_id, "file": super::session_file(&input.session_id)},
        "hasUI": false,
    });
    session
        .request(method::INITIALIZE, params, QUICK)
        .await
        .map_err(|e| e.to_string())?;
    let _ = session.notify(method::INITIALIZED, json!({}));
    let result = session
        .request(
            method::COMMAND_EXECUTE,
            json!({"name": "telegram-connect", "args": ""}),
            CONNECT,
        )
        .await
        .map_err(|e| e.to_string())?;
    if result["ok"].as_bool() == Some(true) {
        Ok(result["message"].as_str().unwrap_or_default().to_string())
    } else {
        Err(result["message"]
            .as_str()
            .unwrap_or("not connected")
            .to_string())
    }
}

/// What Codex's PermissionRequest hook prints for a decision: nothing
/// (Codex asks at its terminal) unless the relay decided.
fn permission_output(decided: Option<ApprovalResult>) -> Answer {
    let decision = match decided {
        Some(ApprovalResult {
            decision: Decision::Allow,
            ..
        }) => json!({"behavior": "allow"}),
        Some(ApprovalResult {
            decision: Decision::Deny,
            by,
            reason,
            ..
        }) if by != DecidedBy::Unavailable => json!({
            "behavior": "deny",
            "message": reason.unwrap_or_else(|| "Denied from Telegram.".into()),
        }),
        _ => return Answer::default(),
    };
    Answer {
        output: Some(
            json!({"hookSpecificOutput": {
                "hookEventName": "PermissionRequest",
                "decision": decision,
            }})
            .to_string(),
        ),
        note: None,
    }
}

/// What the session asks of its host while the hook runs: a message from
/// the topic cannot start a turn of plain `codex`, and the topic is told
/// how to drive the session from there.
fn spawn_refusals(
    session: crate::host_client::Link,
    mut from: tokio::sync::mpsc::UnboundedReceiver<Said>,
    thread_id: String,
) {
    crate::tasks::spawn(async move {
        while let Some(Said { message, .. }) = from.recv().await {
            let FromSidecar::Request { id, method, .. } = message else {
                continue;
            };
            let sent = if method == method::AGENT_SEND_USER_MESSAGE {
                let _ = session.notify(
                    method::AGENT_NOTICE,
                    json!({"text": format!(
                        "📵 This Codex session runs without agent-relay codex, so a message from here cannot reach it. To drive it from here, quit Codex and run: agent-relay codex resume {thread_id}"
                    )}),
                );
                session.respond(id, json!({"accepted": false}))
            } else {
                session.respond_error(id, -32601, "plain codex cannot do that from Telegram")
            };
            if sent.is_err() {
                break;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_is_printed_only_when_the_relay_decided() {
        let decided = |decision, by| {
            Some(ApprovalResult {
                decision,
                reason: Some("The user denied this bash call by P on the phone.".into()),
                by,
                for_session: false,
            })
        };
        let allow = permission_output(decided(Decision::Allow, DecidedBy::Phone));
        assert_eq!(
            allow.output.as_deref(),
            Some(
                r#"{"hookSpecificOutput":{"hookEventName":"PermissionRequest","decision":{"behavior":"allow"}}}"#
            )
        );
        let deny = permission_output(decided(Decision::Deny, DecidedBy::Timeout));
        assert!(
            deny.output.as_deref().is_some_and(
                |o| o.contains(r#""behavior":"deny""#) && o.contains("denied this bash call")
            ),
            "{deny:?}"
        );
        for (decision, by) in [
            (Decision::Defer, DecidedBy::Policy),
            (Decision::Deny, DecidedBy::Unavailable),
        ] {
            assert_eq!(
                permission_output(decided(decision, by)),
                Answer::default(),
                "{decision:?} by {by:?}: the terminal asks"
            );
        }
        assert_eq!(permission_output(None), Answer::default());
    }
}

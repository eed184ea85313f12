//! Codex's notifications, as the session's events: a turn started and
//! ended, what was typed at the terminal, each tool call for the progress
//! message, the turn's answer, and a request answered elsewhere.

use serde_json::{Value, json};

use super::{BASH, CodexBridge, EDIT, FROM_PHONE, Forwarded, key};
use crate::codex::wire::{self, Item, method as codex};
use crate::protocol::host::method;

/// How many completed turns the bridge remembers (see `completed`).
const COMPLETED_KEPT: usize = 16;

impl CodexBridge {
    pub(super) async fn on_notification(&self, method: &str, params: Value) {
        match method {
            codex::THREAD_STARTED => match serde_json::from_value::<wire::WithThread>(params) {
                Ok(started) if self.beside_tui() => self.adopt(started.thread, "new").await,
                Ok(_) => {}
                Err(e) => tracing::debug!("unreadable thread/started: {e}"),
            },
            codex::THREAD_STATUS_CHANGED => {
                let Ok(changed) = serde_json::from_value::<wire::ThreadStatusChanged>(params)
                else {
                    return;
                };
                if self.ours(&changed.thread_id) {
                    self.try_subscribe.notify_one();
                } else {
                    self.consider(&changed.thread_id).await;
                }
            }
            codex::TURN_STARTED => {
                if let Ok(turn) = serde_json::from_value::<wire::TurnEvent>(params)
                    && self.ours(&turn.thread_id)
                {
                    self.turn_started(&turn.turn.id);
                }
            }
            codex::TURN_COMPLETED => {
                if let Ok(turn) = serde_json::from_value::<wire::TurnEvent>(params)
                    && self.ours(&turn.thread_id)
                {
                    self.turn_completed(turn.turn);
                }
            }
            codex::ITEM_STARTED | codex::ITEM_COMPLETED => {
                match serde_json::from_value::<wire::ItemEvent>(params) {
                    Ok(event) if self.ours(&event.thread_id) => {
                        self.on_item(event.item, method == codex::ITEM_STARTED);
                    }
                    Ok(_) => {}
                    Err(e) => tracing::debug!(method, "unreadable item: {e}"),
                }
            }
            codex::SERVER_REQUEST_RESOLVED => {
                if let Ok(resolved) = serde_json::from_value::<wire::ServerRequestResolved>(params)
                {
                    self.resolved(&resolved.request_id);
                }
            }
            _ => {}
        }
    }

    /// A turn began (seen, or started by the bridge itself before it could
    /// see the thread): the session is busy until it completes.
    pub(super) fn turn_started(&self, turn_id: &str) {
        {
            let mut state = self.state();
            if state.turn.as_deref() == Some(turn_id)
                || state.completed.iter().any(|done| done == turn_id)
            {
                return;
            }
            state.turn = Some(turn_id.to_string());
            state.answer = None;
        }
        self.activity.send_replace(std::time::Instant::now());
        self.tell_session(method::AGENT_STARTED, json!({}));
    }

    fn turn_completed(&self, turn: wire::Turn) {
        self.activity.send_replace(std::time::Instant::now());
        let answer = {
            let mut state = self.state();
            state.phone_turns.remove(&turn.id);
            state.changes.clear();
            state.turn = None;
            if state.completed.len() == COMPLETED_KEPT {
                state.completed.pop_front();
            }
            state.completed.push_back(turn.id.clone());
            state.answer.take()
        };
        if turn.status == wire::TurnStatus::Failed {
            // Failed for good: Codex tried the model again itself first
            // (`error` notifications with `willRetry`, which say nothing
            // of the turn's end and are not told), and no answer comes of
            // it, whatever the turn had written.
            let why = turn
                .error
                .map(|e| e.message)
                .filter(|m| !m.trim().is_empty())
                .unwrap_or_else(|| "no reason given".into());
            self.tell_session(method::AGENT_ENDED, json!({"error": why}));
            return;
        }
        self.tell_session(
            method::AGENT_ENDED,
            json!({
                "lastAssistantText": answer,
                "aborted": turn.status == wire::TurnStatus::Interrupted,
            }),
        );
    }

    fn on_item(&self, item: Item, started: bool) {
        match item {
            Item::UserMessage {
                content, client_id, ..
            } if started => {
                // What the phone sent is not echoed back; what was typed
                // at the terminal is mirrored so the topic reads whole.
                let from_phone = client_id.is_some_and(|id| id.starts_with(FROM_PHONE));
                let text: Vec<String> = content
                    .into_iter()
                    .filter_map(|part| match part {
                        wire::UserInput::Text { text } => Some(text),
                        _ => None,
                    })
                    .collect();
                let source = if from_phone {
                    "extension"
                } else {
                    "interactive"
                };
                self.tell_session(
                    method::INPUT_RECEIVED,
                    json!({"text": text.join("\n"), "source": source}),
                );
            }
            Item::AgentMessage { text, .. } if !started && !text.trim().is_empty() => {
                self.state().answer = Some(text);
            }
            Item::CommandExecution {
                id,
                command,
                status,
            } => {
                let args = json!({"command": inner_command(&command)});
                self.tool(started, BASH, &id, args, status);
            }
            Item::FileChange {
                id,
                changes,
                status,
            } => {
                let args =
                    json!({"path": changes.first().map(|c| c.path.clone()).unwrap_or_default()});
                if started {
                    self.state().changes.insert(id.clone(), changes);
                }
                self.tool(started, EDIT, &id, args, status);
            }
            Item::McpToolCall {
                id,
                server,
                tool,
                arguments,
            } => {
                let name = format!("{server}.{tool}");
                self.tool(started, &name, &id, arguments, wire::ItemStatus::Other);
            }
            Item::DynamicToolCall {
                id,
                tool,
                arguments,
            } => self.tool(started, &tool, &id, arguments, wire::ItemStatus::Other),
            Item::WebSearch { id, query } => self.tool(
                started,
                "web_search",
                &id,
                json!({"query": query}),
                wire::ItemStatus::Other,
            ),
            _ => {}
        }
    }

    fn tool(&self, started: bool, name: &str, id: &str, args: Value, status: wire::ItemStatus) {
        if started {
            self.tell_session(
                method::TOOL_STARTED,
                json!({"toolName": name, "toolCallId": id, "args": args}),
            );
        } else {
            let failed = matches!(
                status,
                wire::ItemStatus::Failed | wire::ItemStatus::Declined
            );
            self.tell_session(
                method::TOOL_ENDED,
                json!({"toolName": name, "toolCallId": id, "isError": failed}),
            );
        }
    }

    /// A request of Codex's was answered, by the relay or another client
    /// (the TUI), or withdrawn (the turn ended): a question the phone still
    /// shows for it closes.
    fn resolved(&self, request_id: &Value) {
        let Some(forwarded) = self.state().forwarded.remove(&key(request_id)) else {
            return;
        };
        match forwarded {
            Forwarded::Approval { tool_call_id } => self.tell_session(
                method::APPROVAL_RESOLVED,
                json!({"toolCallId": tool_call_id}),
            ),
            Forwarded::Questions { ids } => {
                for id in ids {
                    self.tell_session(method::QUESTION_RESOLVED, json!({"id": id}));
                }
            }
        }
    }
}

/// The command a person would read: Codex runs every command as
/// `/bin/bash -lc '<command>'`, and the policy's patterns (`^git push`)
/// are about what is inside.
pub(super) fn inner_command(command: &str) -> String {
    let Some(words) = shlex::split(command) else {
        return command.to_string();
    };
    match words.as_slice() {
        [shell, flag, inner]
            if ["bash", "sh", "zsh"]
                .contains(&shell.rsplit('/').next().unwrap_or(shell.as_str()))
                && flag.starts_with('-')
                && flag.ends_with('c') =>
        {
            inner.clone()
        }
        _ => command.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_shown_is_the_one_inside_codexs_shell() {
        assert_eq!(
            inner_command("/bin/bash -lc 'touch made && echo made'"),
            "touch made && echo made"
        );
        assert_eq!(
            inner_command(r#"/bin/bash -lc 'echo '"'"'hi'"'"''"#),
            "echo 'hi'"
        );
        assert_eq!(
            inner_command("git push origin main"),
            "git push origin main"
        );
        assert_eq!(inner_command("/bin/bash -lc"), "/bin/bash -lc");
        assert_eq!(inner_command("unbalanced 'quote"), "unbalanced 'quote");
    }
}

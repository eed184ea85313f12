//! OpenCode's asks, as questions on the phone: a permission ask (a tool
//! call that waits for a person), shown to the `[approvals]` policy as that
//! tool call and answered `once`, `always` or `reject`; and the model's
//! questions to its user, one at a time. Beside the TUI an ask the relay
//! did not decide is left to the TUI, and one answered there closes on the
//! phone.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::{Forwarded, OpenCodeBridge, QUICK};
use crate::opencode::wire::{self, event};
use crate::protocol::host::{
    ApprovalParams, ApprovalResult, DecidedBy, Decision, QuestionParams, QuestionResult, method,
};

/// Requests to the session that wait for a person (the session applies
/// its own timeout).
const PERSON: Duration = Duration::from_secs(24 * 3600);

impl OpenCodeBridge {
    /// The events of asks: a new one is asked on the phone in a task of its
    /// own (the events go on meanwhile); one answered elsewhere closes.
    pub(super) fn on_ask_event(self: &Arc<Self>, kind: &str, properties: Value) {
        match kind {
            event::PERMISSION_ASKED => {
                if let Ok(asked) = serde_json::from_value::<wire::PermissionAsked>(properties) {
                    let me = self.clone();
                    crate::tasks::spawn(async move { me.permission(asked).await });
                }
            }
            event::QUESTION_ASKED => {
                if let Ok(asked) = serde_json::from_value::<wire::QuestionAsked>(properties) {
                    let me = self.clone();
                    crate::tasks::spawn(async move { me.questions(asked).await });
                }
            }
            event::PERMISSION_REPLIED | event::QUESTION_REPLIED | event::QUESTION_REJECTED => {
                if let Ok(replied) = serde_json::from_value::<wire::Replied>(properties) {
                    self.resolved(&replied.request_id);
                }
            }
            _ => {}
        }
    }

    /// A permission ask of our session (or a sub-agent's): the policy and
    /// perhaps the phone decide, unless the answer is not the relay's to
    /// give.
    async fn permission(&self, asked: wire::PermissionAsked) {
        let tool_call_id = asked
            .tool
            .as_ref()
            .map_or_else(|| asked.id.clone(), |t| t.call_id.clone());
        let from_telegram = {
            let mut state = self.state();
            if !state.concerns(&asked.session_id) {
                return;
            }
            state.forwarded.insert(
                asked.id.clone(),
                Forwarded::Approval {
                    tool_call_id: tool_call_id.clone(),
                },
            );
            !self.beside_tui() || state.turn.as_ref().is_some_and(|t| t.from_phone)
        };
        let params = ApprovalParams {
            tool_call_id,
            tool: asked.permission.clone(),
            input: permission_input(&asked),
            from_telegram,
        };
        let decided = self.ask_approval(params).await;
        if !self.answers(&asked.id, decided.decision, decided.by) {
            return;
        }
        let answer = permission_answer(&decided, self.beside_tui());
        let route = format!("{}/{}/reply", wire::route::PERMISSION, asked.id);
        let sent: Result<Value, _> = self.server.post(&route, Some(&answer), QUICK).await;
        if let Err(e) = sent {
            tracing::warn!(
                request = asked.id,
                "cannot answer OpenCode's permission ask: {e}"
            );
        }
    }

    /// `approval/request` to the session; a refusal when it cannot ask.
    async fn ask_approval(&self, params: ApprovalParams) -> ApprovalResult {
        let asked = match serde_json::to_value(&params) {
            Ok(params) => self
                .session
                .request(method::APPROVAL_REQUEST, params, PERSON)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        asked
            .and_then(|v| serde_json::from_value::<ApprovalResult>(v).map_err(|e| e.to_string()))
            .unwrap_or_else(|why| ApprovalResult {
                decision: Decision::Deny,
                reason: Some(format!("the relay could not ask ({why})")),
                by: DecidedBy::Unavailable,
                for_session: false,
            })
    }

    /// Whether the relay answers an ask it forwarded and got `by` back: not
    /// once it was answered elsewhere, and beside the TUI not when the
    /// relay did not decide (the TUI asks it already).
    fn answers(&self, id: &str, decision: Decision, by: DecidedBy) -> bool {
        let still_open = self.state().forwarded.remove(id).is_some();
        let undecided = decision == Decision::Defer || by == DecidedBy::Unavailable;
        still_open && !(undecided && self.beside_tui())
    }

    /// The model asks its user: each question on the phone in turn, then
    /// the answers together (or, alone, a refusal when one was not
    /// answered: the model goes on without).
    async fn questions(&self, asked: wire::QuestionAsked) {
        let ids: Vec<String> = (0..asked.questions.len())
            .map(|n| format!("{}:{n}", asked.id))
            .collect();
        {
            let mut state = self.state();
            if !state.concerns(&asked.session_id) {
                return;
            }
            let questions = Forwarded::Questions { ids: ids.clone() };
            state.forwarded.insert(asked.id.clone(), questions);
        }
        let mut answer = wire::QuestionAnswer::default();
        for (question, id) in asked.questions.iter().zip(ids) {
            match self.ask_question(question, id).await {
                Some(said) => answer.answers.push(vec![said]),
                None => break,
            }
            if !self.state().forwarded.contains_key(&asked.id) {
                // Answered at the terminal meanwhile.
                return;
            }
        }
        let open = self.state().forwarded.remove(&asked.id).is_some();
        let whole = answer.answers.len() == asked.questions.len();
        let route = match (open, whole, self.beside_tui()) {
            (false, _, _) | (true, false, true) => return,
            (true, true, _) => format!("{}/{}/reply", wire::route::QUESTION, asked.id),
            (true, false, false) => format!("{}/{}/reject", wire::route::QUESTION, asked.id),
        };
        let body = whole.then_some(&answer);
        let sent: Result<Value, _> = self.server.post(&route, body, QUICK).await;
        if let Err(e) = sent {
            tracing::warn!(request = asked.id, "cannot answer OpenCode's question: {e}");
        }
    }

    /// One question on the phone: its options as buttons (each one's
    /// description in the text); the answer, if there was one.
    async fn ask_question(&self, question: &wire::Question, id: String) -> Option<String> {
        let options: Vec<String> = question.options.iter().map(|o| o.label.clone()).collect();
        let mut text = match question.header.trim() {
            "" => question.question.clone(),
            header => format!("{header}: {}", question.question),
        };
        for option in &question.options {
            if !option.description.trim().is_empty() {
                text.push_str(&format!("\n• {}: {}", option.label, option.description));
            }
        }
        let params = QuestionParams {
            question: text,
            allow_text: question.custom || options.is_empty(),
            options,
            timeout_ms: None,
            id: Some(id),
        };
        let params = serde_json::to_value(&params).ok()?;
        let said = self
            .session
            .request(method::QUESTION_ASK, params, PERSON)
            .await
            .ok()?;
        serde_json::from_value::<QuestionResult>(said).ok()?.answer
    }

    /// An ask of OpenCode's was answered by another client (the TUI), or
    /// withdrawn (the turn was stopped): the phone's message for it closes.
    fn resolved(&self, request_id: &str) {
        let Some(forwarded) = self.state().forwarded.remove(request_id) else {
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

/// A permission ask as the policy and the phone read it: what OpenCode
/// says of the call (a command, a file and its diff…), the command spelled
/// out for `bash` and the file as `path` (the policy's patterns and
/// `outside_project` read those), and what "always" would allow.
fn permission_input(asked: &wire::PermissionAsked) -> Value {
    let mut input = match &asked.metadata {
        Value::Object(fields) => Value::Object(fields.clone()),
        _ => json!({}),
    };
    if asked.permission == "bash" && input.get("command").is_none() {
        input["command"] = asked.patterns.join(" && ").into();
    }
    let file = ["filepath", "filePath", "path"]
        .into_iter()
        .find_map(|key| input.get(key).and_then(Value::as_str).map(str::to_string))
        .or_else(|| {
            (asked.permission != "bash")
                .then(|| asked.patterns.first().cloned())
                .flatten()
        });
    if let Some(file) = file {
        input["path"] = file.into();
    }
    if !asked.always.is_empty() {
        input["always"] = asked.always.join(", ").into();
    }
    input
}

/// How the session's decision goes back to OpenCode. Beside the TUI an ask
/// the relay did not decide is never answered (see
/// [`OpenCodeBridge::answers`]); alone, "no approval needed" lets it run and
/// nobody to ask refuses it. "Allow for 30 min" is `once` too: the session
/// keeps that grant itself and allows the next asks while it lasts, where
/// OpenCode's `always` would keep allowing after it ran out. A refusal says
/// why: OpenCode hands that to the model, which goes on.
fn permission_answer(decided: &ApprovalResult, beside_tui: bool) -> wire::PermissionAnswer {
    let reply = match (decided.decision, decided.by) {
        (Decision::Allow, _) => wire::PermissionReply::Once,
        (Decision::Defer, by) if by != DecidedBy::Unavailable && !beside_tui => {
            wire::PermissionReply::Once
        }
        _ => wire::PermissionReply::Reject,
    };
    let message = (reply == wire::PermissionReply::Reject).then(|| {
        decided
            .reason
            .clone()
            .filter(|r| !r.trim().is_empty())
            .unwrap_or_else(|| "The user refused this on Telegram.".into())
    });
    wire::PermissionAnswer { reply, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decided(decision: Decision, by: DecidedBy, for_session: bool) -> ApprovalResult {
        ApprovalResult {
            decision,
            reason: None,
            by,
            for_session,
        }
    }

    #[test]
    fn the_three_buttons_are_opencodes_replies() {
        use wire::PermissionReply::*;
        let phone = DecidedBy::Phone;
        let reply = |d: &ApprovalResult, beside| permission_answer(d, beside).reply;
        assert_eq!(reply(&decided(Decision::Allow, phone, false), true), Once);
        // The grant for 30 minutes is the session's, not OpenCode's `always`.
        assert_eq!(reply(&decided(Decision::Allow, phone, true), true), Once);
        let denied = permission_answer(&decided(Decision::Deny, phone, false), true);
        assert_eq!(denied.reply, Reject);
        assert!(denied.message.is_some(), "the model is told why");
        // Alone, no approval needed runs it and nobody to ask refuses it.
        let policy = DecidedBy::Policy;
        assert_eq!(reply(&decided(Decision::Defer, policy, false), false), Once);
        let nobody = DecidedBy::Unavailable;
        assert_eq!(
            reply(&decided(Decision::Deny, nobody, false), false),
            Reject
        );
    }

    #[test]
    fn a_permission_ask_reads_as_the_tool_call_it_is() {
        let asked = |permission: &str, metadata: Value, patterns: &[&str]| wire::PermissionAsked {
            id: "per_1".into(),
            session_id: "ses_1".into(),
            permission: permission.into(),
            patterns: patterns.iter().map(|p| p.to_string()).collect(),
            metadata,
            always: vec!["git push *".into()],
            tool: None,
        };
        let bash = permission_input(&asked(
            "bash",
            json!({"command": "git push"}),
            &["git push"],
        ));
        assert_eq!(bash["command"], "git push");
        assert_eq!(bash["always"], "git push *");
        assert!(bash.get("path").is_none());
        let bare = permission_input(&asked("bash", json!(null), &["a", "b"]));
        assert_eq!(bare["command"], "a && b");
        let edit = permission_input(&asked(
            "edit",
            json!({"filepath": "/p/a.rs", "diff": "+a"}),
            &["a.rs"],
        ));
        assert_eq!(
            (&edit["path"], &edit["diff"]),
            (&json!("/p/a.rs"), &json!("+a"))
        );
        let outside = permission_input(&asked("external_directory", json!({}), &["/etc/*"]));
        assert_eq!(outside["path"], "/etc/*");
    }
}

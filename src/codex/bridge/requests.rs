//! Codex's requests to its clients, as questions on the phone: the three
//! approvals (a command, a change to files, more permissions), each shown
//! to the `[approvals]` policy as a tool call and answered in its own
//! shape; and the model's questions to its user, one at a time. Beside the
//! TUI a request the relay did not decide is left to the TUI, and one
//! answered there closes on the phone (`events.rs`).

use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use super::{BASH, CodexBridge, EDIT, Forwarded, Mode, PERMISSIONS, key};
use crate::codex::app_server::AppServerError;
use crate::codex::wire::{self, method as codex};
use crate::protocol::host::{
    ApprovalParams, ApprovalResult, DecidedBy, Decision, QuestionParams, QuestionResult, method,
};

/// Requests to the session that wait for a person (the session applies
/// its own timeout).
const PERSON: Duration = Duration::from_secs(24 * 3600);

/// One of Codex's three approval requests, as the policy sees it.
struct CodexApproval {
    asked: wire::ApprovalAsked,
    /// The tool the policy knows it by.
    tool: &'static str,
    input: Value,
    /// What a permissions request asks for (granted as it is); none for a
    /// command or a file change.
    permissions: Option<Value>,
}

/// What goes back to Codex for an approval.
#[derive(Serialize)]
#[serde(untagged)]
enum ApprovalReply {
    Decision(wire::ApprovalAnswer),
    Permissions(wire::PermissionsAnswer),
}

impl CodexBridge {
    pub(super) async fn on_request(&self, id: Value, method: &str, params: Value) {
        let answered = match method {
            codex::USER_INPUT => self.user_input(&id, params).await,
            _ => match read_approval(method, params, |item| self.changes_of(item)) {
                Some(approval) => self.approve(&id, approval).await,
                None => {
                    tracing::debug!(method, "a request of Codex's the relay leaves alone");
                    return;
                }
            },
        };
        if let Err(e) = answered {
            tracing::warn!(method, "cannot answer Codex: {e}");
        }
    }

    /// Asks the session about a call of our thread and answers Codex,
    /// unless the answer is not the relay's to give ([`Self::answers`]).
    async fn approve(&self, id: &Value, approval: CodexApproval) -> Result<(), AppServerError> {
        if !self.ours(&approval.asked.thread_id) {
            return Ok(());
        }
        let Some(decided) = self.ask_approval(id, &approval).await else {
            return Ok(());
        };
        let answer = approval_answer(approval.permissions, &decided, self.beside_tui());
        self.codex.respond(id, &answer)
    }

    /// The changes of a file-change item, as its `item/started` had them.
    fn changes_of(&self, item_id: &str) -> Vec<wire::FileUpdate> {
        self.state()
            .changes
            .get(item_id)
            .cloned()
            .unwrap_or_default()
    }

    /// `approval/request` to the session; what it decided, if the relay
    /// answers.
    async fn ask_approval(&self, id: &Value, approval: &CodexApproval) -> Option<ApprovalResult> {
        let asked = &approval.asked;
        let mut input = approval.input.clone();
        // Codex's own words for why it asks reach the phone as the call's
        // description.
        if let Some(reason) = asked.reason.as_ref().filter(|r| !r.trim().is_empty()) {
            input["description"] = reason.clone().into();
        }
        let from_telegram = match &self.mode {
            Mode::Alone(_) => true,
            Mode::BesideTui => self.state().phone_turns.contains(&asked.turn_id),
        };
        self.state().forwarded.insert(
            key(id),
            Forwarded::Approval {
                tool_call_id: asked.item_id.clone(),
            },
        );
        let params = ApprovalParams {
            tool_call_id: asked.item_id.clone(),
            tool: approval.tool.to_string(),
            input,
            from_telegram,
        };
        let asked = match serde_json::to_value(&params) {
            Ok(params) => self
                .session
                .request(method::APPROVAL_REQUEST, params, PERSON)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        let decided = asked
            .and_then(|v| serde_json::from_value::<ApprovalResult>(v).map_err(|e| e.to_string()))
            .unwrap_or_else(|why| ApprovalResult {
                decision: Decision::Deny,
                reason: Some(format!("the relay could not ask ({why})")),
                by: DecidedBy::Unavailable,
                for_session: false,
            });
        self.answers(id, decided.decision, decided.by)
            .then_some(decided)
    }

    /// Whether the relay answers a request it forwarded and got `by` back:
    /// not once it was resolved elsewhere, and beside the TUI not when the
    /// relay did not decide (the TUI asks it already).
    fn answers(&self, id: &Value, decision: Decision, by: DecidedBy) -> bool {
        let still_open = self.state().forwarded.remove(&key(id)).is_some();
        if !still_open {
            return false;
        }
        let undecided = decision == Decision::Defer || by == DecidedBy::Unavailable;
        !(undecided && self.beside_tui())
    }

    /// The model asks its user: each question on the phone (not a secret
    /// one), in turn.
    async fn user_input(&self, id: &Value, params: Value) -> Result<(), AppServerError> {
        let Ok(asked) = serde_json::from_value::<wire::UserInputRequest>(params) else {
            return Ok(());
        };
        if !self.ours(&asked.thread_id) {
            return Ok(());
        }
        let ids: Vec<String> = asked
            .questions
            .iter()
            .map(|q| format!("{}:{}", key(id), q.id))
            .collect();
        self.state()
            .forwarded
            .insert(key(id), Forwarded::Questions { ids: ids.clone() });
        let mut answer = wire::UserInputAnswer::default();
        let mut unanswered = false;
        for (question, question_id) in asked.questions.iter().zip(ids) {
            let said = if question.is_secret {
                None
            } else {
                self.ask_question(question, question_id).await
            };
            match said {
                Some(text) => {
                    answer.answers.insert(
                        question.id.clone(),
                        wire::Answers {
                            answers: vec![text],
                        },
                    );
                }
                None => unanswered = true,
            }
            if !self.state().forwarded.contains_key(&key(id)) {
                // Answered at the terminal meanwhile.
                return Ok(());
            }
        }
        if self.state().forwarded.remove(&key(id)).is_none() || (unanswered && self.beside_tui()) {
            return Ok(());
        }
        self.codex.respond(id, &answer)
    }

    /// One question on the phone: its options as buttons (each one's
    /// description in the text); the answer, if there was one.
    async fn ask_question(&self, question: &wire::UserQuestion, id: String) -> Option<String> {
        let options: Vec<String> = question
            .options
            .iter()
            .flatten()
            .map(|o| o.label.clone())
            .collect();
        let mut text = match question.header.trim() {
            "" => question.question.clone(),
            header => format!("{header}: {}", question.question),
        };
        for option in question.options.iter().flatten() {
            if !option.description.trim().is_empty() {
                text.push_str(&format!("\n• {}: {}", option.label, option.description));
            }
        }
        let params = QuestionParams {
            question: text,
            allow_text: question.is_other || options.is_empty(),
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
}

/// An approval request read, if `method` is one and it reads; `changes`
/// gives a file-change item's changes.
fn read_approval(
    method: &str,
    params: Value,
    changes: impl FnOnce(&str) -> Vec<wire::FileUpdate>,
) -> Option<CodexApproval> {
    let approval = match method {
        codex::COMMAND_APPROVAL => {
            let asked: wire::CommandApproval = serde_json::from_value(params).ok()?;
            let command = command_of(&asked);
            CodexApproval {
                asked: asked.asked,
                tool: BASH,
                input: json!({"command": command}),
                permissions: None,
            }
        }
        codex::FILE_CHANGE_APPROVAL => {
            let asked: wire::FileChangeApproval = serde_json::from_value(params).ok()?;
            let changes = changes(&asked.asked.item_id);
            CodexApproval {
                input: change_input(&changes, asked.grant_root.as_deref()),
                asked: asked.asked,
                tool: EDIT,
                permissions: None,
            }
        }
        codex::PERMISSIONS_APPROVAL => {
            let asked: wire::PermissionsApproval = serde_json::from_value(params).ok()?;
            CodexApproval {
                asked: asked.asked,
                tool: PERMISSIONS,
                input: json!({"permissions": asked.permissions.clone()}),
                permissions: Some(asked.permissions),
            }
        }
        _ => return None,
    };
    Some(approval)
}

/// The answer in the approval's own shape: Codex's decision, or for a
/// permissions request what is granted (nothing, refused) and how long.
fn approval_answer(
    permissions: Option<Value>,
    decided: &ApprovalResult,
    beside_tui: bool,
) -> ApprovalReply {
    let decision = codex_decision(decided, beside_tui);
    let Some(permissions) = permissions else {
        return ApprovalReply::Decision(wire::ApprovalAnswer { decision });
    };
    ApprovalReply::Permissions(wire::PermissionsAnswer {
        // Nothing granted is a refusal.
        permissions: if decision == wire::ApprovalDecision::Decline {
            json!({})
        } else {
            permissions
        },
        scope: if decided.for_session {
            "session"
        } else {
            "turn"
        },
    })
}

/// The command a command approval is about, as a person reads it.
fn command_of(asked: &wire::CommandApproval) -> String {
    asked
        .command
        .as_deref()
        .map(super::events::inner_command)
        .or_else(|| {
            (!asked.command_actions.is_empty()).then(|| {
                asked
                    .command_actions
                    .iter()
                    .map(|a| a.command.as_str())
                    .collect::<Vec<_>>()
                    .join(" && ")
            })
        })
        .unwrap_or_default()
}

/// How the session's decision goes back to Codex. Beside the TUI a request
/// the relay did not decide is never answered (see [`CodexBridge::answers`]);
/// alone, "no approval needed" lets it run and nobody to ask refuses it.
fn codex_decision(decided: &ApprovalResult, beside_tui: bool) -> wire::ApprovalDecision {
    match (decided.decision, decided.by) {
        (Decision::Allow, _) if decided.for_session => wire::ApprovalDecision::AcceptForSession,
        (Decision::Allow, _) => wire::ApprovalDecision::Accept,
        (Decision::Defer, by) if by != DecidedBy::Unavailable && !beside_tui => {
            wire::ApprovalDecision::Accept
        }
        _ => wire::ApprovalDecision::Decline,
    }
}

/// A file change as the approval shows it: the first path outside the
/// project if any (the policy's `outside_project` reads `path`), and every
/// file's diff.
fn change_input(changes: &[wire::FileUpdate], grant_root: Option<&str>) -> Value {
    let path = changes
        .iter()
        .map(|c| c.path.clone())
        .next()
        .or_else(|| grant_root.map(str::to_string))
        .unwrap_or_default();
    let diff: Vec<String> = changes
        .iter()
        .map(|c| format!("{}\n{}", c.path, c.diff.trim_end()))
        .collect();
    let mut input = json!({"path": path, "diff": diff.join("\n")});
    if let Some(root) = grant_root {
        input["grantRoot"] = root.into();
    }
    input
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
    fn the_three_buttons_are_codexs_three_decisions() {
        use wire::ApprovalDecision::*;
        let phone = DecidedBy::Phone;
        assert_eq!(
            codex_decision(&decided(Decision::Allow, phone, false), true),
            Accept
        );
        assert_eq!(
            codex_decision(&decided(Decision::Allow, phone, true), true),
            AcceptForSession
        );
        assert_eq!(
            codex_decision(&decided(Decision::Deny, phone, false), true),
            Decline
        );
        // Alone, no approval needed runs it and nobody to ask refuses it.
        let policy = DecidedBy::Policy;
        assert_eq!(
            codex_decision(&decided(Decision::Defer, policy, false), false),
            Accept
        );
        let nobody = DecidedBy::Unavailable;
        assert_eq!(
            codex_decision(&decided(Decision::Deny, nobody, false), false),
            Decline
        );
    }

    #[test]
    fn a_file_change_shows_every_diff_and_the_path_the_policy_reads() {
        let changes = vec![
            wire::FileUpdate {
                path: "/p/a.rs".into(),
                diff: "@@ -1 +1 @@\n-a\n+b\n".into(),
            },
            wire::FileUpdate {
                path: "/p/b.rs".into(),
                diff: "+c".into(),
            },
        ];
        let input = change_input(&changes, None);
        assert_eq!(input["path"], "/p/a.rs");
        assert_eq!(input["diff"], "/p/a.rs\n@@ -1 +1 @@\n-a\n+b\n/p/b.rs\n+c");
    }

    #[test]
    fn the_three_approvals_read_as_tool_calls_and_answer_in_their_own_shape() {
        let asked = json!({"threadId": "t", "turnId": "u", "itemId": "i", "reason": "why"});
        let with = |extra: Value| {
            let mut params = asked.clone();
            params
                .as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            params
        };
        let no_changes = |_: &str| Vec::new();
        let command = with(json!({"command": "/bin/bash -lc 'git push'"}));
        let command = read_approval(codex::COMMAND_APPROVAL, command, no_changes).unwrap();
        assert_eq!(
            (command.tool, &command.input),
            (BASH, &json!({"command": "git push"}))
        );
        assert_eq!(command.asked.item_id, "i");
        assert_eq!(command.asked.reason.as_deref(), Some("why"));
        let changes = |item: &str| {
            assert_eq!(item, "i");
            vec![wire::FileUpdate {
                path: "/p/a".into(),
                diff: "+a".into(),
            }]
        };
        let edit = read_approval(codex::FILE_CHANGE_APPROVAL, asked.clone(), changes).unwrap();
        assert_eq!((edit.tool, &edit.input["path"]), (EDIT, &json!("/p/a")));
        let wanted = json!({"network": {"enabled": true}});
        let more = with(json!({"permissions": wanted}));
        let more = read_approval(codex::PERMISSIONS_APPROVAL, more, no_changes).unwrap();
        assert_eq!(more.tool, PERMISSIONS);
        assert_eq!(more.permissions.as_ref(), Some(&wanted));
        assert!(read_approval(codex::USER_INPUT, asked.clone(), no_changes).is_none());
        assert!(read_approval(codex::COMMAND_APPROVAL, json!({}), no_changes).is_none());

        let allowed = decided(Decision::Allow, DecidedBy::Phone, true);
        let answer = |permissions, decided: &ApprovalResult| {
            serde_json::to_value(approval_answer(permissions, decided, true)).unwrap()
        };
        assert_eq!(
            answer(None, &allowed),
            json!({"decision": "acceptForSession"})
        );
        assert_eq!(
            answer(Some(wanted.clone()), &allowed),
            json!({"permissions": wanted, "scope": "session"})
        );
        let denied = decided(Decision::Deny, DecidedBy::Phone, false);
        assert_eq!(
            answer(Some(wanted), &denied),
            json!({"permissions": {}, "scope": "turn"})
        );
    }
}

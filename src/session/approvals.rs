//! The host asks before a tool call runs (`approval/request`) and the agent
//! asks its user a question (`question/ask`). The `[approvals]` policy
//! decides whether a person must be asked; [`Session::ask_person`] asks.
//!
//! An approval is a deny unless somebody allows it: no answer within the
//! policy's timeout, no topic, no relay and no terminal all deny, each
//! with its reason for the agent. "Allow for this session" grants the tool
//! for the policy's grant time; `/telegram-status` lists the grants.
//! Every decision is written to the log as an audit line.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::FutureExt;

use super::Session;
use super::dialog::{Answer, Options, Question, Terminal, Who};
use super::outbound::{ApprovalStep, Asked, ToTopic};
use crate::policy::{self, Mode, Reason};
use crate::protocol::bus::{Concerns, FileSource, MAX_INLINE_FILE, SendAs, SendFile, TopicOp};
use crate::protocol::host::*;
use crate::render;
use crate::visible::reveal;

/// How long the agent's own question waits when it names no timeout.
const QUESTION_TIMEOUT: Duration = Duration::from_secs(600);

/// What a person may answer an approval: its buttons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Approval {
    Allow,
    Deny,
    /// Allow, and grant the tool for the policy's grant time.
    AllowForSession,
}

/// Who a phone turn is for: whose message started it, and whether that
/// was a scheduled firing rather than a person.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Requester {
    pub user: i64,
    pub scheduled: bool,
}

/// Whose phone messages the host has, to know whom the turn under way
/// concerns (`[approvals] by`, `[schedules] approvals`).
#[derive(Debug, Default)]
pub(super) struct Requesters {
    /// Messages the host holds for a later turn, oldest first (bounded).
    waiting: std::collections::VecDeque<(i64, Requester)>,
    /// The turn under way's, when a phone message started it.
    current: Option<Requester>,
}

impl Requesters {
    /// How many held messages are remembered.
    const WAITING: usize = 64;

    /// The host has update `update_id` from `requester`: it starts the next
    /// turn (`starts` when the agent was idle) or waits for one.
    pub fn handed(&mut self, update_id: i64, requester: Requester, starts: bool) {
        if starts {
            self.current = Some(requester);
            return;
        }
        self.waiting.push_back((update_id, requester));
        if self.waiting.len() > Self::WAITING {
            self.waiting.pop_front();
        }
    }

    /// A turn took these held messages: the first one's writer is whom the
    /// turn concerns.
    pub fn took(&mut self, update_ids: &[i64]) {
        let mut first = None;
        self.waiting.retain(|(id, requester)| {
            let taken = update_ids.contains(id);
            if taken && first.is_none() {
                first = Some(*requester);
            }
            !taken
        });
        if first.is_some() {
            self.current = first;
        }
    }

    pub fn current(&self) -> Option<Requester> {
        self.current
    }
}

/// "Allow for this session" grants: tool (lower case) → until when.
#[derive(Debug, Default)]
pub(super) struct Grants(HashMap<String, Instant>);

impl Grants {
    fn holds(&mut self, tool: &str) -> bool {
        let now = Instant::now();
        self.0.retain(|_, until| *until > now);
        self.0.contains_key(&tool.to_lowercase())
    }

    fn grant(&mut self, tool: &str, span: Duration) {
        self.0.insert(tool.to_lowercase(), Instant::now() + span);
    }

    /// The live grants and the minutes each has left, for `/telegram-status`.
    pub fn describe(&mut self) -> Option<String> {
        let now = Instant::now();
        self.0.retain(|_, until| *until > now);
        if self.0.is_empty() {
            return None;
        }
        let mut grants: Vec<String> = self
            .0
            .iter()
            .map(|(tool, until)| {
                let minutes = until.duration_since(now).as_secs().div_ceil(60);
                format!("{tool} ({minutes} min left)")
            })
            .collect();
        grants.sort();
        Some(grants.join(", "))
    }
}

/// The progress's line for `request`'s call, at step `asked`.
fn step_of(request: &ApprovalParams, asked: Asked) -> ToTopic {
    ToTopic::Approval(ApprovalStep {
        call_id: request.tool_call_id.clone(),
        name: request.tool.clone(),
        argument: super::in_short(&request.input),
        asked,
    })
}

impl Session {
    /// `approval/request`: whether a tool call may run.
    pub(super) async fn approve(&self, request: ApprovalParams) -> ApprovalResult {
        let decided = self.decide(&request).await;
        tracing::info!(
            target: "audit",
            tool = %request.tool,
            tool_call = %request.tool_call_id,
            decision = ?decided.decision,
            by = ?decided.by,
            reason = decided.reason.as_deref().unwrap_or(""),
            "tool call decision"
        );
        decided
    }

    async fn decide(&self, request: &ApprovalParams) -> ApprovalResult {
        let result = |decision, by, reason: Option<String>| ApprovalResult {
            decision,
            reason,
            by,
            for_session: false,
        };
        let Ok(config) = &self.config else {
            return result(Decision::Defer, DecidedBy::Policy, None);
        };
        let policy = &config.approvals;
        if policy.mode == Mode::Off || (policy.only_from_telegram && !request.from_telegram) {
            return result(Decision::Defer, DecidedBy::Policy, None);
        }
        let cwd = self.cwd();
        let Some(reason) = policy.needs_approval(&request.tool, &request.input, Path::new(&cwd))
        else {
            return result(Decision::Defer, DecidedBy::Policy, None);
        };
        if self.grants().holds(&request.tool) {
            return result(Decision::Allow, DecidedBy::Grant, None);
        }
        // A call of a turn from the keyboard concerns whoever is there.
        let requester = request
            .from_telegram
            .then(|| self.requesters().current())
            .flatten();
        if requester.is_some_and(|r| r.scheduled) && policy.scheduled == policy::Scheduled::Deny {
            self.send_out(step_of(request, Asked::Denied));
            return result(
                Decision::Deny,
                DecidedBy::Policy,
                Some(
                    "A scheduled turn decides without a person ([schedules] approvals = \"deny\"): denied."
                        .into(),
                ),
            );
        }
        let question = self
            .approval_question(request, policy, &reason, requester.map(|r| r.user))
            .await;
        // The progress shows the call as waiting, not running, until the
        // person (or the timeout) decides; the approval message asks.
        let step = |asked| step_of(request, asked);
        self.send_out(step(Asked::Waiting));
        let decided = self
            .ask_person_to_approve(request, question, policy.grant)
            .await;
        self.send_out(step(match decided.decision {
            Decision::Deny => Asked::Denied,
            // The host's own dialog decides a deferred call: it shows as
            // running until the host says how it ended.
            Decision::Allow | Decision::Defer => Asked::Allowed,
        }));
        decided
    }

    /// The question about `request`, asked because of `reason`: the call
    /// shown as its bytes are, Allow / Deny / Allow for a while, and the
    /// host's own dialog as the answer elsewhere.
    async fn approval_question(
        &self,
        request: &ApprovalParams,
        policy: &policy::Policy,
        reason: &Reason,
        requester: Option<i64>,
    ) -> Question<Approval> {
        let wait = span(policy.timeout);
        let grant_minutes = policy.grant.as_secs() / 60;
        // Whatever the agent named is shown as its bytes are (see
        // `visible`): the tool, the path, the call.
        let tool = reveal(&request.tool).into_owned();
        let why = match reason {
            Reason::Tool => String::new(),
            Reason::Command(pattern) => format!(
                " (the command matches <code>{}</code>)",
                render::escape(&reveal(pattern))
            ),
            Reason::OutsideProject(path) => format!(
                " (<code>{}</code> is outside the project)",
                render::escape(&reveal(&path.display().to_string()))
            ),
        };
        let preview = policy::preview(&request.input);
        let cut = match &preview.whole {
            Some(whole) => self.show_whole(&tool, whole).await,
            None => String::new(),
        };
        Question {
            title: format!("Allow {tool}?"),
            html: format!(
                "🔐 <b>{}</b> wants to run{why}:\n<pre>{}</pre>{cut}\nNo answer in {wait} denies it.",
                render::escape(&tool),
                render::escape(&preview.text)
            ),
            detail: Some(preview.text),
            options: Options::new([
                (Approval::Allow, "✅ Allow".into()),
                (Approval::Deny, "❌ Deny".into()),
                (
                    Approval::AllowForSession,
                    format!("⏱ Allow {tool} for {grant_minutes} min"),
                ),
            ]),
            free_text: false,
            timeout: policy.timeout,
            terminal: if policy.mode == Mode::Both {
                Terminal::Select
            } else {
                Terminal::No
            },
            timeout_outcome: format!("⌛ No answer within {wait}: denied"),
            elsewhere: Some(Box::pin(
                self.answered_elsewhere(format!("approval:{}", request.tool_call_id))
                    .map(|decision| match decision {
                        Some(Decision::Allow) => Some(Approval::Allow),
                        Some(Decision::Deny) => Some(Approval::Deny),
                        Some(Decision::Defer) | None => None,
                    }),
            )),
            concerns: Concerns::Approval { requester },
        }
    }

    /// Asks `question` about `request` and makes the person's answer the
    /// host's decision; "Allow for this session" grants the tool for
    /// `grant`.
    async fn ask_person_to_approve(
        &self,
        request: &ApprovalParams,
        question: Question<Approval>,
        grant: Duration,
    ) -> ApprovalResult {
        let result = |decision, by, reason: Option<String>| ApprovalResult {
            decision,
            reason,
            by,
            for_session: false,
        };
        let grant_minutes = grant.as_secs() / 60;
        match self.ask_person(question).await {
            Answer::Choice { choice, by } => {
                let by_whom = who(&by);
                // Who denied, said so that it cannot read as whose call it was.
                let denied = match &by {
                    Who::Phone { name, user } => {
                        format!(
                            "{name} (user {user}) denied this {} call on the phone.",
                            request.tool
                        )
                    }
                    Who::Terminal => {
                        format!(
                            "The user denied this {} call at the terminal.",
                            request.tool
                        )
                    }
                };
                let by = decided_by(&by);
                match choice {
                    Approval::Allow => {
                        result(Decision::Allow, by, Some(format!("allowed {by_whom}")))
                    }
                    Approval::AllowForSession => {
                        self.grants().grant(&request.tool, grant);
                        ApprovalResult {
                            for_session: true,
                            ..result(
                                Decision::Allow,
                                by,
                                Some(format!("allowed for {grant_minutes} min {by_whom}")),
                            )
                        }
                    }
                    Approval::Deny => result(Decision::Deny, by, Some(denied)),
                }
            }
            Answer::Text { by, .. } => result(
                Decision::Deny,
                decided_by(&by),
                Some("a written answer to an approval denies".into()),
            ),
            Answer::Dismissed => result(
                Decision::Deny,
                DecidedBy::Terminal,
                Some("The user dismissed the approval dialog.".into()),
            ),
            // The host's own dialog decided; the host knows what.
            Answer::Elsewhere(choice) => result(
                match choice {
                    Some(Approval::Deny) => Decision::Deny,
                    Some(Approval::Allow | Approval::AllowForSession) => Decision::Allow,
                    None => Decision::Defer,
                },
                DecidedBy::Terminal,
                Some("answered at the terminal".into()),
            ),
            Answer::Nothing(by, why) => result(
                Decision::Deny,
                by,
                Some(format!("Denied: {why} (no approval, no tool call).")),
            ),
        }
    }

    /// Sends the whole of a call whose preview is cut into the topic, as a
    /// file, right before the question: what the preview leaves out is one
    /// tap away. Returns the line the question then adds under its preview.
    async fn show_whole(&self, tool: &str, whole: &policy::Whole) -> String {
        let Some(member) = self.member() else {
            // Nobody can be asked on the phone either; the terminal, if it
            // is asked, has the host's own view of the call.
            return String::new();
        };
        let mut text = whole.text.clone();
        if text.len() > MAX_INLINE_FILE {
            let mut end = MAX_INLINE_FILE;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
        }
        let clipped = text.len() < whole.text.len();
        let op = TopicOp::SendFile(SendFile {
            source: FileSource::Text {
                name: whole.file_name.into(),
                text,
            },
            caption: Some(format!(
                "📄 The whole {} of the {tool} call waiting below ({}){}.",
                whole.what,
                whole.size,
                if clipped { ", its first 512 KB" } else { "" }
            )),
            send_as: Some(SendAs::Document),
        });
        match member.topic_within(op, crate::member::UPLOAD_TIMEOUT).await {
            Ok(_) => format!(
                "\n📄 Cut to its start and end: {} in all, the whole {} is in the file above.",
                whole.size, whole.what
            ),
            Err(e) => {
                tracing::warn!("cannot send the whole {} as a file: {e}", whole.what);
                format!(
                    "\n⚠️ Cut to its start and end: {} in all, and the whole {} could not be sent as a file ({}). Deny it if you are unsure.",
                    whole.size,
                    whole.what,
                    render::escape(&e.to_string())
                )
            }
        }
    }

    /// `question/ask`: the agent's own question to its user.
    pub(super) async fn question(&self, request: QuestionParams) -> QuestionResult {
        let mut html = format!("❓ {}", render::escape(&reveal(&request.question)));
        if request.allow_text {
            html.push_str(if request.options.is_empty() {
                "\n<i>Reply to this message to answer.</i>"
            } else {
                "\n<i>Or reply to this message with your own answer.</i>"
            });
        }
        let timeout = request
            .timeout_ms
            .map_or(QUESTION_TIMEOUT, Duration::from_millis);
        let question = Question {
            title: reveal(&request.question).into_owned(),
            html,
            detail: None,
            // The agent's own options, shown as the bytes they are: each
            // is its position.
            options: Options::new(
                (0u32..).zip(
                    request
                        .options
                        .iter()
                        .map(|option| reveal(option).into_owned()),
                ),
            ),
            free_text: request.allow_text || request.options.is_empty(),
            timeout,
            terminal: Terminal::Select,
            timeout_outcome: "⌛ No answer in time".into(),
            elsewhere: request.id.as_ref().map(|id| {
                let answered: super::dialog::Elsewhere<u32> = Box::pin(
                    self.answered_elsewhere(format!("question:{id}"))
                        .map(|_| None),
                );
                answered
            }),
            concerns: Concerns::Anyone,
        };
        let answered = self.ask_person(question).await;
        tracing::info!(target: "audit", question = %request.question, answer = ?answered, "question answered");
        match answered {
            Answer::Choice { choice, by } => QuestionResult {
                choice: Some(choice),
                answer: request.options.get(choice as usize).cloned(),
                by: decided_by(&by),
                reason: None,
            },
            Answer::Text { text, by } => QuestionResult {
                choice: None,
                answer: Some(text),
                by: decided_by(&by),
                reason: None,
            },
            Answer::Dismissed | Answer::Elsewhere(_) => QuestionResult {
                choice: None,
                answer: None,
                by: DecidedBy::Terminal,
                reason: None,
            },
            Answer::Nothing(by, why) => QuestionResult {
                choice: None,
                answer: None,
                by,
                reason: Some(why),
            },
        }
    }
}

fn decided_by(who: &Who) -> DecidedBy {
    match who {
        Who::Phone { .. } => DecidedBy::Phone,
        Who::Terminal => DecidedBy::Terminal,
    }
}

fn who(by: &Who) -> String {
    match by {
        Who::Phone { name, user } => format!("by {name} (user {user}) on the phone"),
        Who::Terminal => "at the terminal".into(),
    }
}

/// A timeout as a person reads it: "45 s", "5 min", "1 min 30 s".
fn span(d: Duration) -> String {
    match (d.as_secs() / 60, d.as_secs() % 60) {
        (0, s) => format!("{s} s"),
        (m, 0) => format!("{m} min"),
        (m, s) => format!("{m} min {s} s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_hold_for_their_tool_until_they_run_out() {
        let mut grants = Grants::default();
        grants.grant("Bash", Duration::from_secs(600));
        assert!(grants.holds("bash") && grants.holds("BASH"));
        assert!(!grants.holds("edit"));
        assert_eq!(grants.describe().as_deref(), Some("bash (10 min left)"));
        grants.grant("edit", Duration::ZERO);
        assert!(!grants.holds("edit"), "an expired grant holds nothing");
    }

    #[test]
    fn timeouts_read_as_a_person_says_them() {
        assert_eq!(span(Duration::from_secs(5)), "5 s");
        assert_eq!(span(Duration::from_secs(300)), "5 min");
        assert_eq!(span(Duration::from_secs(90)), "1 min 30 s");
    }
}

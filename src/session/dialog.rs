//! A question to the person, asked where they are: on the phone (an ask in
//! the session's topic, answered by a button or, when free text is welcome,
//! by replying to it) and, where the host has a UI and the caller wants it,
//! at the terminal (`ui/select`). The first answer wins; the other side is
//! closed and shows how it ended. Tool approvals, the agent's own questions
//! and the relay's confirmations all go through [`Session::ask_person`].
//!
//! A host may also ask at its own terminal, in a dialog the relay does not
//! open (Codex's TUI shows every approval itself): its answer reaches the
//! question as [`Question::elsewhere`], and counts like the terminal's.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::Session;
use crate::member::{Member, MemberError};
use crate::protocol::bus::*;
use crate::protocol::host::{
    ANSWER_WITHIN, ConfirmParams, ConfirmResult, DecidedBy, Decision, SelectParams, SelectResult,
    method,
};

/// What the terminal gets on top of the phone's timeout, so the host's own
/// timer, not ours, closes its dialog.
const TERMINAL_GRACE: Duration = Duration::from_secs(5);
/// The leader keeps an ask open a little longer than its asker waits, so
/// the asker's own close (with its outcome) is what the person sees.
const LEADER_GRACE: Duration = Duration::from_secs(60);

/// A question's buttons, each with the choice it stands for. What travels
/// is a button's position (the bus's `AskAnswer.choice`, the terminal's
/// `SelectResult.choice`, both generic for any question); it is read back
/// into the choice here, and nowhere else.
#[derive(Debug, Clone)]
pub(super) struct Options<C> {
    buttons: Vec<(C, String)>,
}

impl<C: Copy + PartialEq> Options<C> {
    /// The buttons in the order they are shown: each choice and its label.
    pub fn new(buttons: impl IntoIterator<Item = (C, String)>) -> Self {
        Self {
            buttons: buttons.into_iter().collect(),
        }
    }

    fn labels(&self) -> Vec<String> {
        self.buttons
            .iter()
            .map(|(_, label)| label.clone())
            .collect()
    }

    /// The choice of the button at `position`, as posted.
    fn at(&self, position: u32) -> Option<C> {
        self.buttons
            .get(position as usize)
            .map(|(choice, _)| *choice)
    }

    pub fn label(&self, choice: C) -> Option<&str> {
        self.buttons
            .iter()
            .find(|(c, _)| *c == choice)
            .map(|(_, label)| label.as_str())
    }
}

pub(super) struct Question<C> {
    /// One line: the terminal dialog's title.
    pub title: String,
    /// What the phone shows, Telegram HTML.
    pub html: String,
    /// What the terminal shows under the title, plain text.
    pub detail: Option<String>,
    pub options: Options<C>,
    pub free_text: bool,
    pub timeout: Duration,
    /// How to ask at the terminal too (when the host has a UI).
    pub terminal: Terminal,
    /// What the phone's message shows when nobody answered in time.
    pub timeout_outcome: String,
    /// The answer of the host's own dialog for this question, if it has
    /// one (see the module doc).
    pub elsewhere: Option<Elsewhere<C>>,
    /// Who may answer it on the phone, besides the owners.
    pub concerns: Concerns,
}

/// The host's own dialog, answered: the choice it stands for, or `None`
/// when the host knows that it was answered but not how.
pub(super) type Elsewhere<C> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<C>> + Send + Sync>>;

/// The terminal's side of a question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Terminal {
    /// Only the phone is asked.
    No,
    /// `ui/select` with the options.
    Select,
    /// `ui/confirm`: yes is the first button, no the second.
    Confirm,
}

/// Who answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Who {
    Phone { name: String, user: i64 },
    Terminal,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Answer<C> {
    Choice {
        choice: C,
        by: Who,
    },
    Text {
        text: String,
        by: Who,
    },
    /// The terminal's dialog was dismissed.
    Dismissed,
    /// The host's own dialog was answered first ([`Question::elsewhere`]):
    /// with this choice, or in a way the host did not say.
    Elsewhere(Option<C>),
    /// Nobody answered (`Timeout`) or nobody could be asked (`Unavailable`).
    Nothing(DecidedBy, String),
}

/// Answers given in the host's own dialogs (`approval/resolved`,
/// `question/resolved`), by key, for the questions waiting for them. One
/// that comes before its question is asked (the host's dialog was quick)
/// is kept for it, among the last [`EARLY`].
#[derive(Default)]
pub(super) struct Resolutions {
    waiting: HashMap<String, oneshot::Sender<Option<Decision>>>,
    early: VecDeque<(String, Option<Decision>)>,
}

/// Early answers kept, at most: one per request the host may have open.
const EARLY: usize = 64;

impl Resolutions {
    pub fn resolve(&mut self, key: String, decision: Option<Decision>) {
        match self.waiting.remove(&key) {
            Some(waiting) => {
                let _ = waiting.send(decision);
            }
            None => {
                self.early.push_back((key, decision));
                if self.early.len() > EARLY {
                    self.early.pop_front();
                }
            }
        }
    }

    fn wait(&mut self, key: String) -> oneshot::Receiver<Option<Decision>> {
        let (tx, rx) = oneshot::channel();
        match self.early.iter().position(|(k, _)| *k == key) {
            Some(at) => {
                if let Some((_, decision)) = self.early.remove(at) {
                    let _ = tx.send(decision);
                }
            }
            None => {
                self.waiting.insert(key, tx);
            }
        }
        rx
    }
}

/// Takes a key out of [`Resolutions`] when its question is done.
struct Forget {
    session: std::sync::Weak<Session>,
    key: String,
}

impl Drop for Forget {
    fn drop(&mut self) {
        if let Some(session) = self.session.upgrade() {
            session.resolutions().waiting.remove(&self.key);
        }
    }
}

impl Session {
    /// The answer of the host's own dialog `key`, when it comes (never,
    /// if it does not). Listens from now on.
    pub(super) fn answered_elsewhere(
        &self,
        key: String,
    ) -> impl std::future::Future<Output = Option<Decision>> + Send + Sync + 'static {
        let answered = self.resolutions().wait(key.clone());
        let forget = Forget {
            session: self.this.clone(),
            key,
        };
        async move {
            let _forget = forget;
            match answered.await {
                Ok(decision) => decision,
                Err(_) => std::future::pending().await,
            }
        }
    }
}

/// A question on the phone, once posted.
#[derive(Clone)]
pub(super) struct Posted {
    token: String,
    message_id: i64,
    ask: Ask,
}

/// A dialog at the terminal, its answer as a selection.
type TerminalDialog = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<SelectResult, crate::host::OutboundError>> + Send>,
>;

struct OpenDialog {
    id: u64,
    said: TerminalDialog,
}

impl Session {
    /// Opens the terminal's side of `question`, if it has one.
    async fn ask_terminal<C: Copy + PartialEq>(
        &self,
        question: &Question<C>,
    ) -> Option<OpenDialog> {
        let timeout_ms = Some(question.timeout.as_millis() as u64);
        let wait = question.timeout + TERMINAL_GRACE;
        let opened = match question.terminal {
            Terminal::No => return None,
            Terminal::Select => self
                .host
                .start_request::<_, SelectResult>(
                    method::UI_SELECT,
                    &SelectParams {
                        title: question.title.clone(),
                        message: question.detail.clone(),
                        options: question.options.labels(),
                        allow_text: question.free_text,
                        timeout_ms,
                    },
                    wait,
                )
                .await
                .map(|p| OpenDialog {
                    id: p.id,
                    said: Box::pin(p),
                }),
            Terminal::Confirm => self
                .host
                .start_request::<_, ConfirmResult>(
                    method::UI_CONFIRM,
                    &ConfirmParams {
                        title: question.title.clone(),
                        message: question.detail.clone().unwrap_or_default(),
                        timeout_ms,
                    },
                    wait,
                )
                .await
                .map(|p| OpenDialog {
                    id: p.id,
                    said: Box::pin(async move {
                        p.await.map(|c| SelectResult {
                            choice: Some(if c.confirmed { 0 } else { 1 }),
                            text: None,
                        })
                    }),
                }),
        };
        opened
            .map_err(|e| tracing::warn!("cannot ask at the terminal: {e}"))
            .ok()
    }

    /// Asks `question` on the phone and, if wanted and possible, at the
    /// terminal; returns the first answer. The terminal's dialog opens at
    /// once, whatever the phone's message waits for (the chat's budget may
    /// hold it a minute), and the deadline decides on time: a phone message
    /// still on its way then is closed when it is out, by a task of its own.
    pub(super) async fn ask_person<C: Copy + PartialEq>(&self, question: Question<C>) -> Answer<C> {
        let mut asking = Asking::start(self, question).await;
        loop {
            let happened = asking.next().await;
            if let Some(answer) = asking.decide(happened).await {
                return answer;
            }
        }
    }
}

/// One question on its way to the person: the phone's message (being
/// posted, then waited for), the terminal's dialog and the host's own
/// (`elsewhere`), raced against the deadline.
struct Asking<'s, C> {
    session: &'s Session,
    options: Options<C>,
    timeout_outcome: String,
    deadline: Instant,
    member: Option<Arc<Member>>,
    /// The phone's message on its way out.
    posting: Option<tokio::task::JoinHandle<Result<Posted, MemberError>>>,
    /// The phone's message, out, and its answer awaited.
    phone: Option<(Posted, PhoneAnswer)>,
    terminal: Option<OpenDialog>,
    elsewhere: Option<Elsewhere<C>>,
    /// Why the phone cannot be asked, once that is known.
    why_not_phone: Option<String>,
    /// When to look again whether Telegram answers, while the phone's
    /// message is on its way.
    look_again: Instant,
}

/// What happened next to a question.
enum Happened<C> {
    Posted(Result<Result<Posted, MemberError>, tokio::task::JoinError>),
    PhoneAnswered(Result<AskAnswer, MemberError>),
    TerminalSaid(Result<SelectResult, crate::host::OutboundError>),
    Elsewhere(Option<C>),
    /// The phone's message is still on its way: time to look whether
    /// Telegram answers at all.
    PhoneLate,
    Deadline,
    /// Nothing is left that could answer.
    NobodyLeft,
}

impl<'s, C: Copy + PartialEq> Asking<'s, C> {
    /// Starts posting on the phone and opens the terminal's dialog.
    async fn start(session: &'s Session, mut question: Question<C>) -> Self {
        let deadline = Instant::now() + question.timeout;
        let member = session.member();
        let posting = member.clone().map(|member| {
            let ask = ask_of(&question);
            crate::tasks::spawn(async move { post(&member, ask, deadline).await })
        });
        let terminal = if session.has_ui() {
            session.ask_terminal(&question).await
        } else {
            None
        };
        Self {
            session,
            deadline,
            why_not_phone: member
                .is_none()
                .then(|| "this session is not on the relay".to_string()),
            member,
            posting,
            phone: None,
            terminal,
            elsewhere: question.elsewhere.take(),
            options: question.options,
            timeout_outcome: question.timeout_outcome,
            look_again: Instant::now() + ANSWER_WITHIN,
        }
    }

    /// Waits for the next thing to happen to the question.
    async fn next(&mut self) -> Happened<C> {
        let Self {
            posting,
            phone,
            terminal,
            elsewhere,
            deadline,
            look_again,
            ..
        } = self;
        if posting.is_none() && phone.is_none() && terminal.is_none() {
            return Happened::NobodyLeft;
        }
        tokio::select! {
            posted = async { posting.as_mut().expect("guarded").await }, if posting.is_some() => {
                Happened::Posted(posted)
            }
            answered = async { (&mut phone.as_mut().expect("guarded").1).await }, if phone.is_some() => {
                Happened::PhoneAnswered(answered)
            }
            said = async { (&mut terminal.as_mut().expect("guarded").said).await }, if terminal.is_some() => {
                Happened::TerminalSaid(said)
            }
            resolved = async { elsewhere.as_mut().expect("guarded").await }, if elsewhere.is_some() => {
                Happened::Elsewhere(resolved)
            }
            () = tokio::time::sleep_until(*look_again), if posting.is_some() => Happened::PhoneLate,
            () = tokio::time::sleep_until(*deadline) => Happened::Deadline,
        }
    }

    /// What `happened` decides: the answer, once there is one.
    async fn decide(&mut self, happened: Happened<C>) -> Option<Answer<C>> {
        match happened {
            Happened::Posted(posted) => {
                self.posting = None;
                match posted {
                    Ok(Ok(posted)) => {
                        let waiting = wait_phone_owned(self.member.clone(), &posted, self.deadline);
                        self.phone = Some((posted, waiting));
                    }
                    Ok(Err(e)) => {
                        self.why_not_phone = Some(format!("the phone cannot be asked: {e}"))
                    }
                    Err(e) => self.why_not_phone = Some(format!("the phone cannot be asked: {e}")),
                }
                None
            }
            Happened::PhoneAnswered(Ok(answer)) => {
                self.cancel_terminal();
                Some(from_phone(&self.options, answer))
            }
            // The phone's side failed for good; the terminal may still
            // answer.
            Happened::PhoneAnswered(Err(e)) => {
                tracing::warn!("waiting for the phone's answer failed: {e}");
                self.phone = None;
                self.why_not_phone = Some(e.to_string());
                None
            }
            Happened::TerminalSaid(said) => self.said_at_terminal(said).await,
            Happened::Elsewhere(resolved) => {
                self.cancel_terminal();
                let outcome = match resolved.and_then(|c| self.options.label(c)) {
                    Some(label) => format!("⌨️ {label} — at the terminal"),
                    None => "⌨️ Answered at the terminal".to_string(),
                };
                Some(self.closed(outcome, Answer::Elsewhere(resolved)).await)
            }
            Happened::PhoneLate => self.phone_late().await,
            Happened::Deadline => {
                self.cancel_terminal();
                let outcome = self.timeout_outcome.clone();
                let nobody = match (&self.posting, self.unreachable()) {
                    // Asked nobody: the question never reached the phone,
                    // Telegram not answering (one held by the chat's
                    // budget simply was not answered in time).
                    (Some(_), Some(why)) => Answer::Nothing(
                        DecidedBy::Unavailable,
                        format!("the question did not reach the phone in time: {why}"),
                    ),
                    _ => Answer::Nothing(DecidedBy::Timeout, "nobody answered in time".into()),
                };
                Some(self.closed(outcome, nobody).await)
            }
            Happened::NobodyLeft => {
                let why = self.why_not_phone.take().unwrap_or_default();
                Some(Answer::Nothing(DecidedBy::Unavailable, why))
            }
        }
    }

    /// The phone's message has not gone out yet. When Telegram is known not
    /// to answer and nobody else can answer, the asker hears so now, not at
    /// the deadline (the message, if it goes out later, is closed saying
    /// so); else it waits on (the chat's budget may hold a message a
    /// minute), and looks again a little later.
    async fn phone_late(&mut self) -> Option<Answer<C>> {
        self.look_again = Instant::now() + ANSWER_WITHIN;
        if self.terminal.is_some() || self.elsewhere.is_some() {
            return None;
        }
        let why = self.unreachable()?;
        let nobody = Answer::Nothing(
            DecidedBy::Unavailable,
            format!("the question cannot reach the phone: {why}"),
        );
        let outcome = "⚠️ Not asked: Telegram did not answer".to_string();
        Some(self.closed(outcome, nobody).await)
    }

    /// Why Telegram does not answer the relay now, when it is known not to.
    fn unreachable(&self) -> Option<String> {
        let state = self.member.as_ref()?.watch().borrow().clone();
        if !state.role.is_connected() {
            return Some(format!(
                "the relay is not reachable ({})",
                state.role.describe()
            ));
        }
        match state.telegram {
            Health::Offline { reason } => Some(format!("Telegram is not answering ({reason})")),
            Health::Unauthorized => Some("Telegram refuses the bot's token".into()),
            _ => None,
        }
    }

    /// The terminal's dialog answered; if it could not be asked after all,
    /// the phone alone is waited for.
    async fn said_at_terminal(
        &mut self,
        said: Result<SelectResult, crate::host::OutboundError>,
    ) -> Option<Answer<C>> {
        self.terminal = None;
        let at_terminal = from_terminal(&self.options, said, self.deadline);
        let outcome = match &at_terminal {
            Answer::Nothing(..) => return None,
            Answer::Choice { choice, .. } => format!(
                "{} — at the terminal",
                self.options.label(*choice).unwrap_or("?")
            ),
            Answer::Text { text, .. } => format!("“{text}” — at the terminal"),
            _ => "✖ Dismissed at the terminal".to_string(),
        };
        Some(self.closed(outcome, at_terminal).await)
    }

    fn cancel_terminal(&mut self) {
        if let Some(dialog) = self.terminal.take() {
            self.session.host.cancel(dialog.id);
        }
    }

    /// Closes the phone's message with `outcome`, now if it is out, else by
    /// a task of its own once it is. The phone may have answered a moment
    /// earlier: then its answer stands, and the close says so; else
    /// `answer` does.
    async fn closed(&mut self, outcome: String, answer: Answer<C>) -> Answer<C> {
        let Some(member) = self.member.clone() else {
            return answer;
        };
        if let Some((posted, _)) = self.phone.take() {
            return match close(&member, &posted, &outcome).await {
                Some(phone) => from_phone(&self.options, phone),
                None => answer,
            };
        }
        if let Some(posting) = self.posting.take() {
            crate::tasks::spawn(async move {
                if let Ok(Ok(posted)) = posting.await {
                    close(&member, &posted, &outcome).await;
                }
            });
        }
        answer
    }
}

/// The phone's answer to a posted question, awaited.
type PhoneAnswer =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<AskAnswer, MemberError>> + Send>>;

fn wait_phone_owned(
    member: Option<Arc<Member>>,
    posted: &Posted,
    deadline: Instant,
) -> PhoneAnswer {
    let posted = posted.clone();
    Box::pin(async move {
        let member = member.ok_or(MemberError::NotConnected)?;
        wait_phone(&member, &posted, deadline).await
    })
}

/// The ask that posts `question` on the phone: a fresh token each time.
fn ask_of<C: Copy + PartialEq>(question: &Question<C>) -> Ask {
    Ask {
        // 128 bits from the OS's CSPRNG: a tap must not be guessable.
        token: uuid::Uuid::new_v4().simple().to_string(),
        text: question.html.clone(),
        options: question.options.labels(),
        free_text: question.free_text,
        expires_in_ms: (question.timeout + LEADER_GRACE).as_millis() as u64,
        concerns: question.concerns,
    }
}

/// How long a question waits for the relay to come back when the
/// connection broke while posting it (a failover takes milliseconds).
const RECONNECT_WAIT: Duration = Duration::from_secs(10);

/// Posts the question: only when on the relay now (a session that is not
/// cannot ask, and says so at once). A connection lost meanwhile may or may
/// not have posted it: it is asked again with the same token, which finds
/// the message if it was.
pub(super) async fn post(
    member: &Member,
    ask: Ask,
    deadline: Instant,
) -> Result<Posted, MemberError> {
    if !member.watch().borrow().role.is_connected() {
        return Err(MemberError::NotConnected);
    }
    loop {
        match member.topic(TopicOp::Ask(ask.clone())).await {
            Ok(TopicDone {
                message_id: Some(message_id),
                ..
            }) => {
                return Ok(Posted {
                    token: ask.token.clone(),
                    message_id,
                    ask,
                });
            }
            Ok(_) => {
                return Err(MemberError::Refused(BusError::new(
                    BusErrorCode::Internal,
                    "the leader posted the question without its id",
                )));
            }
            Err(MemberError::NotConnected) if Instant::now() < deadline => {
                let left = deadline.saturating_duration_since(Instant::now());
                let state = member.wait_registered(left.min(RECONNECT_WAIT)).await;
                if !state.role.is_connected() {
                    return Err(MemberError::NotConnected);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Waits for the phone's answer until `deadline`, across reconnects: after
/// a failover the new leader adopts the question from the next request.
pub(super) async fn wait_phone(
    member: &Member,
    posted: &Posted,
    deadline: Instant,
) -> Result<AskAnswer, MemberError> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let wait = TopicOp::AwaitAnswer(AwaitAnswer {
            token: posted.token.clone(),
            message_id: posted.message_id,
            ask: posted.ask.clone(),
        });
        match member.topic_within(wait, left + LEADER_GRACE).await {
            Ok(TopicDone {
                answer: Some(answer),
                ..
            }) => return Ok(answer),
            Ok(_) => {
                return Err(MemberError::Refused(BusError::new(
                    BusErrorCode::Internal,
                    "the leader answered without an answer",
                )));
            }
            Err(MemberError::NotConnected) if !left.is_zero() => {
                // Between leaders: wait to be back, then ask again.
                member.wait_registered(left).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Closes the question with `outcome`; the phone's answer when it came
/// first.
pub(super) async fn close(member: &Member, posted: &Posted, outcome: &str) -> Option<AskAnswer> {
    let close = TopicOp::CloseAsk(CloseAsk {
        token: posted.token.clone(),
        message_id: posted.message_id,
        outcome: outcome.to_string(),
    });
    match member.topic(close).await {
        Ok(done) => done.answer,
        Err(e) => {
            tracing::warn!("cannot close the question on the phone: {e}");
            None
        }
    }
}

/// A button's position that is none of the question's: the asker's own
/// answer, whoever gave it, decides nothing.
fn unknown<C>(by: &Who, position: u32) -> Answer<C> {
    let by = match by {
        Who::Phone { .. } => DecidedBy::Phone,
        Who::Terminal => DecidedBy::Terminal,
    };
    Answer::Nothing(by, format!("answer {position} is none of the options"))
}

fn from_phone<C: Copy + PartialEq>(options: &Options<C>, answer: AskAnswer) -> Answer<C> {
    let by = Who::Phone {
        name: answer.user_name,
        user: answer.user_id,
    };
    match (answer.choice, answer.text) {
        (Some(position), _) => match options.at(position) {
            Some(choice) => Answer::Choice { choice, by },
            None => unknown(&by, position),
        },
        (None, Some(text)) => Answer::Text { text, by },
        (None, None) => Answer::Dismissed,
    }
}

fn from_terminal<C: Copy + PartialEq>(
    options: &Options<C>,
    said: Result<SelectResult, crate::host::OutboundError>,
    deadline: Instant,
) -> Answer<C> {
    match said {
        Ok(SelectResult {
            choice: Some(position),
            ..
        }) => match options.at(position) {
            Some(choice) => Answer::Choice {
                choice,
                by: Who::Terminal,
            },
            None => unknown(&Who::Terminal, position),
        },
        Ok(SelectResult {
            text: Some(text), ..
        }) => Answer::Text {
            text,
            by: Who::Terminal,
        },
        // The host's dialog ran out of time on its own: that is a timeout.
        Ok(_) if Instant::now() >= deadline => {
            Answer::Nothing(DecidedBy::Timeout, "nobody answered in time".into())
        }
        Ok(_) => Answer::Dismissed,
        Err(e) => Answer::Nothing(
            DecidedBy::Unavailable,
            format!("the terminal cannot be asked: {e}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Pick {
        Yes,
        No,
    }

    fn options() -> Options<Pick> {
        Options::new([(Pick::Yes, "Yes".into()), (Pick::No, "No".into())])
    }

    fn tapped(choice: Option<u32>) -> AskAnswer {
        AskAnswer {
            choice,
            text: None,
            user_id: 1,
            user_name: "P".into(),
            at_ms: 0,
        }
    }

    #[test]
    fn a_buttons_position_is_read_back_as_the_choice_it_was_posted_for() {
        let by = Who::Phone {
            name: "P".into(),
            user: 1,
        };
        assert_eq!(
            from_phone(&options(), tapped(Some(1))),
            Answer::Choice {
                choice: Pick::No,
                by
            }
        );
        assert!(matches!(
            from_phone(&options(), tapped(Some(2))),
            Answer::Nothing(DecidedBy::Phone, _)
        ));
        let at_terminal = from_terminal(
            &options(),
            Ok(SelectResult {
                choice: Some(0),
                text: None,
            }),
            Instant::now() + Duration::from_secs(60),
        );
        assert_eq!(
            at_terminal,
            Answer::Choice {
                choice: Pick::Yes,
                by: Who::Terminal
            }
        );
        assert_eq!(options().labels(), ["Yes", "No"]);
        assert_eq!(options().label(Pick::No), Some("No"));
    }
}

//! Deliveries from the leader to the host: each user message in this
//! session's topic becomes an `agent/sendUserMessage` request, once
//! (deduplicated by `update_id`), acknowledged only after the host took it.
//! `/status`, `/stop`, `/resend` and `/steer` typed in the topic are
//! answered here.
//!
//! Prompts are pipelined: up to [`WINDOW`] go out in journal order without
//! waiting for each answer, so a burst costs one round trip, not one per
//! message. The ordering rule:
//!
//! * The host receives prompts in journal order, always.
//! * A prompt the host refuses (`accepted: false`) is settled, and its topic
//!   is told: a refusal is an answer, so the order of what the host took
//!   stays the order of the journal.
//! * A prompt the host fails to answer (an error, a timeout) stays in the
//!   journal and comes again after the next reconnect, in order with what is
//!   still pending; prompts sent after it may have been taken already, so
//!   that one prompt may reach the host after later ones. Hosts drop
//!   repeats by `origin.updateId`.
//! * A command waits until the prompts before it were answered, so
//!   `/stop` stops what came before it.
//! * A message with files waits until they are fetched (and a voice note
//!   transcribed), and an album until all its parts came (`media.rs`): the
//!   parts make one prompt, settled together once the host took it.
//!
//! Steer or queue (docs/DESIGN.md, "Steering a running turn"): for a host
//! that can take a prompt into its running turn (`canSteer`), a message
//! written while a turn runs *waits here* for the next turn, unacknowledged
//! in the journal (a crash loses nothing), and the topic's progress offers
//! ⚡ Steer now. When the run ends, what waited goes as one prompt, in
//! journal order, and starts the next turn; `/steer` (or the button) sends
//! it into the running turn instead (`deliverAs: steer`), and `/steer
//! <text>` sends its text there. Either way each message reaches the host
//! once: the host never holds a follow-up the relay could also steer. A
//! host that cannot steer gets a mid-turn message as a follow-up at once,
//! as before, and `/steer` says why it cannot.

use std::collections::{HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesOrdered;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Session;
use super::media::{self, ALBUM_WAIT, Prepared};
use super::outbound::ToTopic;
use crate::host::OutboundError;
use crate::ids::RecentUpdates;
use crate::member::Member;
use crate::phone::PhoneCommand;
use crate::protocol::bus::Deliver;
use crate::protocol::host::{
    Attachment, DeliverAs, MessageOrigin, SendUserMessageParams, SendUserMessageResult,
};

/// How long the host may take to accept a prompt.
const HOST_TIMEOUT: Duration = Duration::from_secs(30);
/// Prompts handed to the host and not answered yet, at most. They go out
/// in journal order without waiting for each answer (see the module docs).
const WINDOW: usize = 64;

/// A prompt on its way, with the deliveries it was made of, and what the
/// host's answer made of it.
type Answered = Pin<Box<dyn Future<Output = (Vec<Deliver>, Taken)> + Send>>;

/// A prompt that waits for the next turn (see the module docs).
struct Waiting {
    parts: Vec<Deliver>,
    text: String,
    attachments: Vec<Attachment>,
}

/// Prompts that waited, as one: their texts in order, a blank line apart,
/// with all their files.
fn joined(waiting: Vec<Waiting>) -> Waiting {
    let mut all = Waiting {
        parts: Vec::new(),
        text: String::new(),
        attachments: Vec::new(),
    };
    for one in waiting {
        if !all.text.is_empty() {
            all.text.push_str("\n\n");
        }
        all.text.push_str(&one.text);
        all.parts.extend(one.parts);
        all.attachments.extend(one.attachments);
    }
    all
}

/// What `/steer` says to a session whose host cannot steer.
const CANNOT_STEER: &str = "⚠️ This agent cannot take a message into a turn that runs";

/// What the host's answer to a prompt means for its deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// Taken (or refused for good, and the topic told): settled.
    Yes,
    /// Accepted, waiting for a turn to take it: settled when one does.
    Queued,
    /// No answer: it stays in the journal and comes again.
    No,
}

pub async fn run(
    session: Weak<Session>,
    member: Arc<Member>,
    deliveries: mpsc::Receiver<Deliver>,
    stop: CancellationToken,
) {
    Inbound {
        session,
        member,
        deliveries,
        stop,
        seen: RecentUpdates::default(),
        in_flight: FuturesOrdered::new(),
        on_the_way: HashSet::new(),
        held: VecDeque::new(),
        waiting: Vec::new(),
    }
    .run()
    .await;
}

/// The session's deliveries on their way to its host (see the module
/// docs).
struct Inbound {
    session: Weak<Session>,
    member: Arc<Member>,
    deliveries: mpsc::Receiver<Deliver>,
    stop: CancellationToken,
    /// What the host took, by update id: a repeat is dropped.
    seen: RecentUpdates,
    /// Prompts handed to the host, waiting for its answer, in order.
    in_flight: FuturesOrdered<Answered>,
    /// The update ids of those prompts.
    on_the_way: HashSet<i64>,
    /// A delivery read ahead while an album waited for its parts.
    held: VecDeque<Deliver>,
    /// Prompts written while a turn ran, waiting for the next turn (their
    /// update ids are `on_the_way`).
    waiting: Vec<Waiting>,
}

/// What came of one delivery.
enum Step {
    Next,
    End,
}

impl Inbound {
    async fn run(mut self) {
        loop {
            let next = async {
                match self.held.pop_front() {
                    Some(deliver) => Some(deliver),
                    None => self.deliveries.recv().await,
                }
            };
            let step = tokio::select! {
                () = self.stop.cancelled() => Step::End,
                Some(answered) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.settle(answered);
                    Step::Next
                }
                next = next, if self.in_flight.len() < WINDOW => match next {
                    Some(deliver) => self.deliver(deliver).await,
                    None => Step::End,
                },
                () = run_ended(&self.session), if !self.waiting.is_empty() => {
                    self.release().await;
                    Step::Next
                }
            };
            if let Step::End = step {
                break;
            }
        }
    }

    /// Settles what the host's answer made of `parts`.
    fn settle(&mut self, (parts, taken): (Vec<Deliver>, Taken)) {
        for deliver in parts {
            self.on_the_way.remove(&deliver.update_id);
            match taken {
                Taken::Yes => {
                    self.seen.insert(deliver.update_id);
                    self.member.ack_delivery(deliver.delivery_id);
                }
                // Acknowledged when a turn takes it (`agent/taken`).
                Taken::Queued => {
                    self.seen.insert(deliver.update_id);
                    if let Some(session) = self.session.upgrade() {
                        session.awaits_turn(deliver.update_id, deliver.delivery_id);
                    }
                }
                Taken::No => {}
            }
        }
    }

    /// One delivery (with the rest of its album) to the host: a command
    /// run, or a prompt handed over.
    async fn deliver(&mut self, deliver: Deliver) -> Step {
        let mut parts = vec![deliver];
        if let Some(group) = parts[0].message.media_group_id.clone() {
            gather_album(&group, &mut parts, &mut self.held, &mut self.deliveries).await;
        }
        self.drop_repeats(&mut parts);
        if parts.is_empty() {
            return Step::Next;
        }
        let Some(session) = self.session.upgrade() else {
            return Step::End;
        };
        let has_files = parts.iter().any(|d| !d.message.attachments.is_empty());
        let command = (!has_files)
            .then(|| PhoneCommand::delivered(&parts[0].message.text))
            .flatten();
        if let Some(command) = command {
            // A command acts on what came before it: the prompts on their
            // way are answered first.
            while let Some(answered) = self.in_flight.next().await {
                self.settle(answered);
            }
            if let PhoneCommand::Steer(text) = command {
                self.steer(session, parts, text).await;
                return Step::Next;
            }
            run_command(&session, &parts[0]).await;
            self.settle((parts, Taken::Yes));
            return Step::Next;
        }
        let (text, attachments) = if has_files {
            let prepared = tokio::select! {
                () = self.stop.cancelled() => return Step::End,
                prepared = media::prepare(&session, &self.member, &parts) => prepared,
            };
            match prepared {
                Prepared::Prompt { text, attachments } => (text, attachments),
                Prepared::Nothing => {
                    self.settle((parts, Taken::Yes));
                    return Step::Next;
                }
                Prepared::Later => return Step::Next,
            }
        } else {
            (parts[0].message.text.clone(), Vec::new())
        };
        if session.can_steer() && (session.is_busy() || !self.waiting.is_empty()) {
            self.wait_for_turn(
                &session,
                Waiting {
                    parts,
                    text,
                    attachments,
                },
            );
            // The run ended while this was read: what waited goes now,
            // this with it.
            if !session.is_busy() {
                self.release().await;
            }
            return Step::Next;
        }
        let deliver_as = session.is_busy().then_some(DeliverAs::FollowUp);
        self.hand_over(session, parts, text, attachments, deliver_as)
            .await;
        Step::Next
    }

    /// Keeps a prompt for the next turn; the topic's progress says how many
    /// wait (and offers to steer them in).
    fn wait_for_turn(&mut self, session: &Session, waiting: Waiting) {
        self.on_the_way
            .extend(waiting.parts.iter().map(|d| d.update_id));
        self.waiting.push(waiting);
        session.send_out(ToTopic::Waiting(self.waiting.len()));
    }

    /// The run ended: what waited for it goes to the host as one prompt,
    /// which starts the next turn. Nothing while a run is under way (a
    /// stale wake-up).
    async fn release(&mut self) {
        let Some(session) = self.session.upgrade() else {
            return;
        };
        if session.is_busy() || self.waiting.is_empty() {
            return;
        }
        let all = joined(std::mem::take(&mut self.waiting));
        session.send_out(ToTopic::Waiting(0));
        self.hand_over(session, all.parts, all.text, all.attachments, None)
            .await;
    }

    /// `/steer [text]` (`parts`: its delivery), or ⚡ Steer now: the text,
    /// else what waits for the next turn, goes into the running turn. With
    /// no run under way it is simply a prompt (what waited goes with the
    /// run's end anyway); a host that cannot steer gets the text as a
    /// follow-up, and the topic hears why.
    async fn steer(&mut self, session: Arc<Session>, parts: Vec<Deliver>, text: String) {
        let busy = session.is_busy();
        if !session.can_steer() {
            if text.is_empty() {
                session.send_out(ToTopic::Plain(format!(
                    "{CANNOT_STEER}: what you write while it works waits for its next turn."
                )));
                self.settle((parts, Taken::Yes));
                return;
            }
            session.send_out(ToTopic::Plain(format!(
                "{CANNOT_STEER}: it gets this message with its next turn."
            )));
            let deliver_as = busy.then_some(DeliverAs::FollowUp);
            self.hand_over(session, parts, text, Vec::new(), deliver_as)
                .await;
            return;
        }
        let deliver_as = busy.then_some(DeliverAs::Steer);
        if !text.is_empty() {
            self.hand_over(session, parts, text, Vec::new(), deliver_as)
                .await;
            return;
        }
        // The bare command names no message of its own: settled here; the
        // messages it steers are settled by the host's answer.
        self.settle((parts, Taken::Yes));
        if self.waiting.is_empty() {
            session.send_out(ToTopic::Plain(
                "Nothing waits for the next turn. /steer <text> gives the running turn a message."
                    .into(),
            ));
            return;
        }
        let all = joined(std::mem::take(&mut self.waiting));
        session.send_out(ToTopic::Waiting(0));
        self.hand_over(session, all.parts, all.text, all.attachments, deliver_as)
            .await;
    }

    /// Drops repeats: settled ones are acknowledged again (but for one
    /// still waiting for a turn), ones the host has not answered yet are
    /// settled by that answer.
    fn drop_repeats(&self, parts: &mut Vec<Deliver>) {
        let waiting = self
            .session
            .upgrade()
            .map(|s| s.awaiting_turn())
            .unwrap_or_default();
        parts.retain(|deliver| {
            if self.seen.contains(deliver.update_id) {
                if !waiting.contains(&deliver.update_id) {
                    self.member.ack_delivery(deliver.delivery_id);
                }
                return false;
            }
            !self.on_the_way.contains(&deliver.update_id)
        });
    }

    /// Hands a prompt to the host; its answer settles it later, in order.
    async fn hand_over(
        &mut self,
        session: Arc<Session>,
        parts: Vec<Deliver>,
        text: String,
        attachments: Vec<Attachment>,
        deliver_as: Option<DeliverAs>,
    ) {
        // Whom the turn it starts concerns (`[approvals] by`): the writer
        // of what starts one.
        let first = &parts[0];
        session.requesters().handed(
            first.update_id,
            super::approvals::Requester {
                user: first.message.user_id,
                scheduled: first.message.scheduled,
            },
            deliver_as.is_none(),
        );
        let params = prompt(&parts[0], text, attachments, deliver_as);
        match session.host.send_user_message(&params, HOST_TIMEOUT).await {
            Ok(answer) => {
                self.on_the_way.extend(parts.iter().map(|d| d.update_id));
                self.in_flight.push_back(Box::pin(async move {
                    let settled = accepted(&session, &parts[0], answer.await);
                    (parts, settled)
                }));
            }
            Err(e) => {
                // It stays in the journal and comes again.
                for deliver in &parts {
                    self.on_the_way.remove(&deliver.update_id);
                }
                tracing::warn!(
                    update_id = parts[0].update_id,
                    "the host did not take a message: {e}"
                );
            }
        }
    }
}

/// Gathers the parts of album `group` that follow its first: Telegram sends
/// each as an update of its own, one after another. The first delivery of
/// something else is kept for later.
async fn gather_album(
    group: &str,
    parts: &mut Vec<Deliver>,
    held: &mut VecDeque<Deliver>,
    deliveries: &mut mpsc::Receiver<Deliver>,
) {
    loop {
        let next = match held.pop_front() {
            Some(deliver) => Some(deliver),
            None => tokio::time::timeout(ALBUM_WAIT, deliveries.recv())
                .await
                .ok()
                .flatten(),
        };
        match next {
            Some(deliver) if deliver.message.media_group_id.as_deref() == Some(group) => {
                parts.push(deliver);
            }
            Some(other) => {
                held.push_front(other);
                return;
            }
            None => return,
        }
    }
}

/// Resolves when the session's run ends (at once when it ended since the
/// last time); never when the session is gone.
async fn run_ended(session: &Weak<Session>) {
    match session.upgrade() {
        Some(session) => session.run_ended.notified().await,
        None => std::future::pending().await,
    }
}

/// The prompt for a delivery (the first of an album), as the host should
/// take it while it works: a follow-up, a steer, or (none) a prompt.
fn prompt(
    first: &Deliver,
    text: String,
    attachments: Vec<Attachment>,
    deliver_as: Option<DeliverAs>,
) -> SendUserMessageParams {
    let message = &first.message;
    SendUserMessageParams {
        text,
        deliver_as,
        origin: MessageOrigin {
            chat_id: message.chat_id,
            thread_id: message.thread_id,
            user_id: message.user_id,
            update_id: first.update_id,
            message_id: Some(message.message_id),
        },
        attachments,
    }
}

/// What the host's answer makes of a delivery: taken, or refused for good
/// (the topic is told); waiting for a turn; or, on an error, left in the
/// journal.
fn accepted(
    session: &Session,
    deliver: &Deliver,
    answer: Result<SendUserMessageResult, OutboundError>,
) -> Taken {
    match answer {
        Ok(result) if result.accepted && result.queued => Taken::Queued,
        Ok(result) if result.accepted => Taken::Yes,
        Ok(_) => {
            session.send_out(ToTopic::Plain(
                "⚠️ The session did not accept this message.".into(),
            ));
            Taken::Yes
        }
        Err(e) => {
            tracing::warn!(
                update_id = deliver.update_id,
                "the host did not take a message: {e}"
            );
            Taken::No
        }
    }
}

/// Runs a command typed in the topic. Whatever it came to, the person
/// hears of it in the topic, so the command is settled once it ran.
async fn run_command(session: &Session, deliver: &Deliver) {
    match PhoneCommand::delivered(&deliver.message.text) {
        Some(PhoneCommand::Status) => {
            let report = session.status_report(false).await;
            session.send_out(ToTopic::Plain(report));
        }
        Some(PhoneCommand::Stop) => {
            let reply = match session.host.abort(HOST_TIMEOUT).await {
                Ok(()) => {
                    session.stopped_by_user();
                    "⏹ Stopped.".to_string()
                }
                Err(e) => format!("⚠️ Could not stop the agent: {e}"),
            };
            session.send_out(ToTopic::Plain(reply));
        }
        Some(PhoneCommand::Resend) => match session.resend().await {
            Ok(0) => session.send_out(ToTopic::Plain(
                "Nothing to send again: every answer arrived.".into(),
            )),
            Ok(_) => {}
            Err(e) => session.send_out(ToTopic::Plain(format!(
                "⚠️ Could not send the answers again: {e}"
            ))),
        },
        _ => {}
    }
}

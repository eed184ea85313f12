//! Deliveries from the leader to the host: each user message in this
//! session's topic becomes an `agent/sendUserMessage` request, in order, once
//! (deduplicated by `update_id`), acknowledged only after the host took it.
//! `/status` and `/stop` typed in the topic are answered here.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Session;
use super::outbound::Outgoing;
use crate::bus::Member;
use crate::protocol::bus::{AnswerCallback, Deliver, Inbound, TopicOp};
use crate::protocol::host::{DeliverAs, MessageOrigin, SendUserMessageParams};

/// How long the host may take to accept a prompt.
const HOST_TIMEOUT: Duration = Duration::from_secs(30);
/// How many delivered update ids are remembered for deduplication.
const SEEN: usize = 4096;

/// A bounded set of recently delivered update ids.
struct Seen {
    order: VecDeque<i64>,
    set: HashSet<i64>,
}

impl Seen {
    fn new() -> Self {
        Self {
            order: VecDeque::with_capacity(SEEN),
            set: HashSet::with_capacity(SEEN),
        }
    }

    fn contains(&self, id: i64) -> bool {
        self.set.contains(&id)
    }

    fn insert(&mut self, id: i64) {
        if self.set.insert(id) {
            self.order.push_back(id);
            if self.order.len() > SEEN
                && let Some(old) = self.order.pop_front()
            {
                self.set.remove(&old);
            }
        }
    }
}

/// A command typed in the topic, as Telegram sends it in groups too
/// (`/stop@relay_bot`).
fn topic_command(text: &str) -> Option<&str> {
    let word = text.trim().strip_prefix('/')?;
    let word = word.split_whitespace().next()?;
    let word = word.split('@').next()?;
    matches!(word, "status" | "stop").then_some(word)
}

pub async fn run(
    session: Weak<Session>,
    member: Arc<Member>,
    mut deliveries: mpsc::Receiver<Deliver>,
    stop: CancellationToken,
) {
    let mut seen = Seen::new();
    loop {
        let deliver = tokio::select! {
            () = stop.cancelled() => break,
            next = deliveries.recv() => match next {
                Some(d) => d,
                None => break,
            },
        };
        if seen.contains(deliver.update_id) {
            member.ack_delivery(deliver.delivery_id);
            continue;
        }
        let Some(session) = session.upgrade() else {
            break;
        };
        if handle(&session, &member, &deliver).await {
            seen.insert(deliver.update_id);
            member.ack_delivery(deliver.delivery_id);
        }
    }
}

/// Hands one delivery to the host. True when it is settled (delivered, or
/// refused for good); false leaves it in the journal for a later attempt.
async fn handle(session: &Session, member: &Member, deliver: &Deliver) -> bool {
    let message = match &deliver.item {
        Inbound::Message(message) => message,
        Inbound::Callback(tap) => {
            // No button of this session waits for a tap yet: say so, so the
            // phone stops its spinner.
            let answer = TopicOp::AnswerCallback(AnswerCallback {
                callback_id: tap.callback_id.clone(),
                text: Some("This button has expired.".into()),
                alert: false,
            });
            if let Err(e) = member.topic(answer).await {
                tracing::debug!("cannot answer a tap: {e}");
            }
            return true;
        }
    };
    match topic_command(&message.text) {
        Some("status") => {
            let report = session.status_report(false).await;
            session.send_out(Outgoing::Plain(report));
            return true;
        }
        Some("stop") => {
            let reply = match session.host.abort(HOST_TIMEOUT).await {
                Ok(()) => "⏹ Stopped.".to_string(),
                Err(e) => format!("⚠️ Could not stop the agent: {e}"),
            };
            session.send_out(Outgoing::Plain(reply));
            return true;
        }
        _ => {}
    }
    let params = SendUserMessageParams {
        text: message.text.clone(),
        deliver_as: session.is_busy().then_some(DeliverAs::FollowUp),
        origin: MessageOrigin {
            chat_id: message.chat_id,
            thread_id: message.thread_id,
            user_id: message.user_id,
            update_id: deliver.update_id,
        },
    };
    match session.host.send_user_message(&params, HOST_TIMEOUT).await {
        Ok(result) if result.accepted => true,
        Ok(_) => {
            session.send_out(Outgoing::Plain(
                "⚠️ The session did not accept this message.".into(),
            ));
            true
        }
        Err(e) => {
            tracing::warn!(
                update_id = deliver.update_id,
                "the host did not take a message: {e}"
            );
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_commands_are_recognised_with_or_without_the_bot_name() {
        assert_eq!(topic_command("/stop"), Some("stop"));
        assert_eq!(topic_command(" /status@relay_bot "), Some("status"));
        assert_eq!(topic_command("/stopper"), None);
        assert_eq!(topic_command("please /stop"), None);
        assert_eq!(topic_command("/start abc"), None);
    }

    #[test]
    fn seen_is_bounded_and_forgets_the_oldest() {
        let mut seen = Seen::new();
        for id in 0..(SEEN as i64 + 10) {
            seen.insert(id);
        }
        assert!(!seen.contains(0));
        assert!(seen.contains(SEEN as i64 + 9));
        assert_eq!(seen.set.len(), SEEN);
    }
}

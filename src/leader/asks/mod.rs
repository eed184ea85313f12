//! Questions to the phone and the taps that answer them: a message with
//! buttons (and, when free text is allowed, a reply to it as the answer),
//! answered once, by an allowed person, in the topic it was asked in.
//!
//! The leader owns them, not the session that asks: taps go to the leader
//! anyway, every callback query must be answered within seconds, and a
//! short-lived asker (a Claude Code hook) has no deliveries to receive a
//! tap with. An asker posts (`ask`), waits (`awaitAnswer`) and may close
//! (`closeAsk`) when the terminal answered first or its time is up. Each ask
//! has a single-use token of 128 random bits, chosen by the asker; a
//! button's callback data is `a:<token>:<option>`, so a forged, replayed
//! or stale tap names no open ask and changes nothing. The store remembers
//! which message asks which token, so an asker that lost its leader while
//! posting asks again with the same token and gets the same message; a
//! leader that takes over adopts an ask from the asker's next request, and
//! a tap in the few milliseconds between is told the question is not open,
//! and the person taps again.
//!
//! [`open::Asks`] keeps the open asks; the flows that post, wait, close,
//! take a tap or a reply and show how a question ended are here.

mod open;

use std::sync::Arc;

pub(super) use open::Asks;
use open::{Key, Taken};

use super::failure::FailureKind;
use super::outbox::Pace;
use super::replies::Refusal;
use super::triage::Entry;
use super::{Leader, now_ms, store_error};
use crate::protocol::bus::*;
use crate::render;
use crate::store::{EntryKind, Lane, NewOutboxEntry};
use crate::telegram::CallbackQuery;

/// How much of the outcome the disabled button of a settled question
/// shows; the whole is in the message's text.
const SETTLED_LABEL: usize = 60;

/// The time of day, as shown under an answered question.
fn clock() -> String {
    let secs = now_ms() / 1000;
    format!("{:02}:{:02} UTC", secs / 3600 % 24, secs / 60 % 60)
}

impl Leader {
    /// Posts a question with its buttons and opens it; asked again with the
    /// same token (the asker lost its leader while posting), it finds the
    /// message instead of posting another.
    pub(super) async fn ask(
        &self,
        profile: &str,
        target: Target,
        ask: &Ask,
    ) -> Result<TopicDone, BusError> {
        let buttons = self.asks.buttons(ask)?;
        let posted = self.store().asked(&ask.token).map_err(store_error)?;
        if let Some((chat_id, message_id, owner)) = posted {
            if owner != profile || chat_id != target.chat_id {
                return Err(BusError::new(
                    BusErrorCode::Forbidden,
                    "that token is another question's",
                ));
            }
            self.asks.insert(profile, target, message_id, ask.clone());
            return Ok(TopicDone {
                message_id: Some(message_id),
                ..TopicDone::default()
            });
        }
        let send = super::topic::send_message(
            target,
            &SendText {
                text: ask.text.clone(),
                format: TextFormat::Html,
                buttons: Some(buttons),
                reply_to: None,
            },
        );
        let done = self.outbox.call(send, Pace::high()).await;
        if let Err(e) = &done
            && e.kind == FailureKind::TopicGone
        {
            self.mark_stale(profile);
        }
        let message_id = done?.reply.message_id().ok_or_else(|| {
            BusError::new(
                BusErrorCode::Internal,
                "the question was posted without an id",
            )
        })?;
        if let Err(e) =
            self.store()
                .record_sent(target.chat_id, message_id, profile, Some(&ask.token))
        {
            tracing::warn!("cannot remember who asked message {message_id}: {e}");
        }
        self.asks.insert(profile, target, message_id, ask.clone());
        Ok(TopicDone {
            message_id: Some(message_id),
            ..TopicDone::default()
        })
    }

    /// Waits for the answer to an ask of the session's; one asked of a
    /// predecessor is adopted first, if its message is the session's.
    pub(super) async fn await_answer(
        &self,
        profile: &str,
        target: Target,
        wait: &AwaitAnswer,
    ) -> Result<TopicDone, BusError> {
        if !self.asks.knows(&wait.token) {
            self.own_message(profile, target, wait.message_id)?;
            self.asks
                .insert(profile, target, wait.message_id, wait.ask.clone());
        }
        let answer = self.asks.wait(&wait.token, profile)?;
        match answer.await {
            Ok(Ok(answer)) => Ok(TopicDone {
                answer: Some(answer),
                ..TopicDone::default()
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(BusError::new(
                BusErrorCode::Unavailable,
                "the leader is stepping down",
            )),
        }
    }

    /// Closes an ask answered elsewhere (or not at all) and shows its
    /// outcome; when the phone answered first, that answer comes back.
    pub(super) async fn close_ask(
        &self,
        profile: &str,
        target: Target,
        close: &CloseAsk,
    ) -> Result<TopicDone, BusError> {
        let closed = if self.asks.knows(&close.token) {
            self.asks.close(&close.token, profile, &close.outcome)?
        } else {
            self.own_message(profile, target, close.message_id)?;
            Ok((target, close.message_id, String::new()))
        };
        match closed {
            Err(answer) => Ok(TopicDone {
                answer: Some(answer),
                ..TopicDone::default()
            }),
            Ok((target, message_id, text)) => {
                self.settle_ask(
                    target,
                    message_id,
                    &text,
                    &render::escape(&close.outcome),
                    &close.outcome,
                )
                .await;
                Ok(TopicDone::default())
            }
        }
    }

    /// Shows how a question ended (`outcome`, HTML) under its text, and
    /// puts one disabled button in place of its buttons that says so in
    /// short (`label`, plain text), so the keyboard does not vanish without
    /// a word: handed to the outbox (`courier.rs`), so it happens even when
    /// this process ends next, and nobody waits for the chat's budget
    /// meanwhile. The decision stands either way.
    async fn settle_ask(
        &self,
        target: Target,
        message_id: i64,
        text: &str,
        outcome: &str,
        label: &str,
    ) {
        let body = if text.is_empty() {
            outcome.to_string()
        } else {
            format!("{text}\n\n{outcome}")
        };
        let edit = NewOutboxEntry {
            lane: Lane::Fixed(target.into()),
            kind: EntryKind::Edit {
                message_id,
                settled: Some(crate::policy::clip(label.trim(), SETTLED_LABEL)),
            },
            body,
            html: true,
            origin: None,
        };
        if let Err(e) = self.hand_over(vec![edit]).await {
            tracing::warn!(message_id, "cannot show how a question ended: {e}");
        }
    }

    /// Whether `entry` is a reply that answers an open free-text ask; the
    /// answer is shown on the question then.
    pub(super) fn answers_ask(self: &Arc<Self>, entry: &Entry) -> bool {
        let update = &entry.update;
        let Some(message_id) = entry.detail.reply_to else {
            return false;
        };
        let key = Key::Reply {
            message_id,
            text: &update.text,
        };
        let name = entry
            .detail
            .from
            .clone()
            .unwrap_or_else(|| format!("user {}", update.user_id));
        match self
            .asks
            .take(key, update.chat_id, update.thread_id, update.user_id, &name)
        {
            Taken::Answered {
                target,
                message_id,
                text,
                label,
                ..
            } => {
                self.show_answer(target, &[message_id], text, label, name, None);
                true
            }
            Taken::Settled | Taken::Unknown => false,
        }
    }

    /// A tap on a button: asks are the only buttons there are.
    pub(super) fn tap(self: &Arc<Self>, query: &CallbackQuery) {
        let replies = &self.router.replies;
        if query.from.is_bot || !self.access.is_allowed(query.from.id) {
            // Every tap is answered, or the phone shows a spinner; a
            // stranger's taps at most once a window.
            if replies.admit(query.from.id, Refusal::Tap) {
                replies.answer_tap(
                    self,
                    query.id.clone(),
                    "You are not allowed to use these buttons.",
                );
            }
            return;
        }
        let button = query.data.as_deref().and_then(open::parse_button);
        let taken = match (button, &query.message) {
            (Some((token, choice)), Some(message)) => self.asks.take(
                Key::Tap {
                    token,
                    message_id: message.message_id,
                    choice,
                },
                message.chat.id,
                message.topic(),
                query.from.id,
                &query.from.first_name,
            ),
            _ => Taken::Unknown,
        };
        match taken {
            Taken::Answered {
                target,
                message_id,
                copy,
                text,
                label,
            } => {
                tracing::info!(
                    target: "audit",
                    user = query.from.id,
                    message_id,
                    answer = %label,
                    "a question was answered from the phone"
                );
                let messages: Vec<i64> = std::iter::once(message_id).chain(copy).collect();
                self.show_answer(
                    target,
                    &messages,
                    text,
                    label,
                    query.from.first_name.clone(),
                    Some(query.id.clone()),
                );
            }
            Taken::Settled => replies.answer_tap(self, query.id.clone(), "Already answered."),
            Taken::Unknown => {
                replies.answer_tap(self, query.id.clone(), "This question is no longer open.")
            }
        }
    }

    /// Shows who answered a question, with what and when, and answers the
    /// tap, off the routing path.
    fn show_answer(
        self: &Arc<Self>,
        target: Target,
        messages: &[i64],
        text: String,
        label: String,
        who: String,
        tap: Option<String>,
    ) {
        let leader = self.clone();
        let outcome = format!(
            "<b>{}</b> — {}, {}",
            render::escape(&label),
            render::escape(&who),
            clock()
        );
        let button = format!("{label} · {who}");
        let messages = messages.to_vec();
        crate::tasks::spawn(async move {
            if let Some(tap) = tap
                && let Err(e) = leader.outbox.answer_tap(&tap, Some(&label)).await
            {
                tracing::debug!("cannot answer a tap: {e}");
            }
            for message_id in messages {
                leader
                    .settle_ask(target, message_id, &text, &outcome, &button)
                    .await;
            }
        });
    }

    /// Closes the asks past their expiry and shows it on their messages.
    pub(super) fn expire_asks(self: &Arc<Self>) {
        for (target, message_id, text) in self.asks.sweep() {
            let leader = self.clone();
            crate::tasks::spawn(async move {
                leader
                    .settle_ask(
                        target,
                        message_id,
                        &text,
                        "⌛ <i>Expired: nobody answered.</i>",
                        "⌛ Expired",
                    )
                    .await;
            });
        }
    }
}

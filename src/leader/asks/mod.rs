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
//! [`open::OpenAsks`] keeps the open asks; [`Asks`], the flow that posts,
//! waits, closes, takes a tap or a reply and shows how a question ended,
//! is here.

mod open;

use std::sync::Arc;

use open::{Key, OpenAsks, Taken};

use super::context::Context;
use super::errands::Refusal;
use super::failure::FailureKind;
use super::failure::store_error;
use super::now_ms;
use super::speaker::Say;
use super::triage::Entry;
use crate::config::Role;
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

/// The questions open on the phone, and what they do (see the module docs).
pub(super) struct Asks {
    cx: Arc<Context>,
    open: OpenAsks,
}

impl Asks {
    pub fn new(cx: Arc<Context>) -> Self {
        Self {
            cx,
            open: OpenAsks::default(),
        }
    }

    /// Posts a question with its buttons and opens it; asked again with the
    /// same token (the asker lost its leader while posting), it finds the
    /// message instead of posting another.
    pub async fn ask(
        &self,
        profile: &str,
        target: Target,
        ask: &Ask,
    ) -> Result<TopicDone, BusError> {
        let buttons = self.open.buttons(ask)?;
        let posted = self.cx.store().asked(&ask.token).map_err(store_error)?;
        if let Some((chat_id, message_id, owner)) = posted {
            if owner != profile || chat_id != target.chat_id {
                return Err(BusError::new(
                    BusErrorCode::Forbidden,
                    "that token is another question's",
                ));
            }
            self.open.insert(profile, target, message_id, ask.clone());
            return Ok(TopicDone {
                message_id: Some(message_id),
                ..TopicDone::default()
            });
        }
        let say = Say::html(ask.text.clone()).with(Some(buttons));
        let posted = self.cx.speaker.now(target.into(), say).await;
        if let Err(e) = &posted
            && e.kind == FailureKind::TopicGone
        {
            self.cx.mark_stale(profile);
        }
        let message_id = posted?;
        if message_id == 0 {
            return Err(BusError::new(
                BusErrorCode::Internal,
                "the question was posted without an id",
            ));
        }
        if let Err(e) =
            self.cx
                .store()
                .record_sent(target.chat_id, message_id, profile, Some(&ask.token))
        {
            tracing::warn!("cannot remember who asked message {message_id}: {e}");
        }
        self.open.insert(profile, target, message_id, ask.clone());
        Ok(TopicDone {
            message_id: Some(message_id),
            ..TopicDone::default()
        })
    }

    /// Waits for the answer to an ask of the session's; one asked of a
    /// predecessor is adopted first, if its message is the session's.
    pub async fn await_answer(
        &self,
        profile: &str,
        target: Target,
        wait: &AwaitAnswer,
    ) -> Result<TopicDone, BusError> {
        if !self.open.knows(&wait.token) {
            self.cx.own_message(profile, target, wait.message_id)?;
            self.open
                .insert(profile, target, wait.message_id, wait.ask.clone());
        }
        let answer = self.open.wait(&wait.token, profile)?;
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

    /// Waits for the answer to an ask of the leader's own (a notice's
    /// button, `courier.rs`): whether it was answered. `None` when it is
    /// not open.
    pub async fn answered(&self, token: &str, profile: &str) -> Option<bool> {
        let answer = self.open.wait(token, profile).ok()?;
        Some(matches!(answer.await, Ok(Ok(_))))
    }

    /// Closes an ask answered elsewhere (or not at all) and shows its
    /// outcome; when the phone answered first, that answer comes back.
    pub async fn close_ask(
        &self,
        profile: &str,
        target: Target,
        close: &CloseAsk,
    ) -> Result<TopicDone, BusError> {
        let closed = if self.open.knows(&close.token) {
            self.open.close(&close.token, profile, &close.outcome)?
        } else {
            self.cx.own_message(profile, target, close.message_id)?;
            Ok((target, close.message_id, String::new()))
        };
        match closed {
            Err(answer) => Ok(TopicDone {
                answer: Some(answer),
                ..TopicDone::default()
            }),
            Ok((target, message_id, text)) => {
                settle(
                    &self.cx,
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

    /// Whether `entry` is a reply that answers an open free-text ask; the
    /// answer is shown on the question then.
    pub fn answers(&self, entry: &Entry) -> bool {
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
            .open
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

    /// A tap on a question's button (`a:…`).
    pub fn tap(&self, query: &CallbackQuery) {
        let cx = &self.cx;
        if query.from.is_bot || !cx.access.is_allowed(query.from.id) {
            // Every tap is answered, or the phone shows a spinner; a
            // stranger's taps at most once a window.
            if cx.errands.admit(query.from.id, Refusal::Tap) {
                toast(cx, &query.id, "You are not allowed to use these buttons.");
            }
            return;
        }
        let button = query.data.as_deref().and_then(open::parse_button);
        if let Some(why) = button.and_then(|(token, _)| self.not_theirs(token, query.from.id)) {
            tracing::info!(
                target: "audit",
                user = query.from.id,
                "a tap on a question that is not theirs changed nothing"
            );
            toast(cx, &query.id, why);
            return;
        }
        let taken = match (button, &query.message) {
            (Some((token, choice)), Some(message)) => self.open.take(
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
            Taken::Settled => toast(cx, &query.id, "Already answered."),
            Taken::Unknown => toast(cx, &query.id, "This question is no longer open."),
        }
    }

    /// Why `user` may not answer the ask `token` opens, if not: a viewer,
    /// or an approval that concerns someone else (`[approvals] by`).
    fn not_theirs(&self, token: &str, user: i64) -> Option<&'static str> {
        let (profile, concerns) = self.open.concerning(token)?;
        let cx = &self.cx;
        let launcher = || {
            let launch = cx.store().launch_by_profile(&profile);
            launch.ok().flatten().map(|launch| launch.by_user)
        };
        if cx.access.may_answer(user, concerns, launcher) {
            return None;
        }
        Some(match (cx.access.role(user), concerns) {
            (Some(Role::Viewer), _) => "You can read here, not answer: you are a viewer.",
            (_, Concerns::Owners) => "Not yours: only an owner can answer this.",
            _ => "Not yours: this approval is for whoever started the turn, or an owner.",
        })
    }

    /// Shows who answered a question, with what and when, and answers the
    /// tap, off the routing path.
    fn show_answer(
        &self,
        target: Target,
        messages: &[i64],
        text: String,
        label: String,
        who: String,
        tap: Option<String>,
    ) {
        let cx = self.cx.clone();
        let outcome = format!(
            "<b>{}</b> — {}, {}",
            render::escape(&label),
            render::escape(&who),
            clock()
        );
        let button = format!("{label} · {who}");
        let messages = messages.to_vec();
        crate::tasks::spawn(async move {
            if let Some(tap) = tap {
                cx.speaker.toast(&tap, &label).await;
            }
            for message_id in messages {
                settle(&cx, target, message_id, &text, &outcome, &button).await;
            }
        });
    }

    /// Closes the asks past their expiry and shows it on their messages.
    pub fn expire(&self) {
        for (target, message_id, text) in self.open.sweep() {
            let cx = self.cx.clone();
            crate::tasks::spawn(async move {
                settle(
                    &cx,
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

/// Answers a tap with `text` as its toast, off the caller's path.
fn toast(cx: &Arc<Context>, callback_id: &str, text: &'static str) {
    let (speaker, id) = (cx.speaker.clone(), callback_id.to_string());
    cx.errands
        .run(async move { speaker.toast(&id, text).await });
}

/// Shows how a question ended (`outcome`, HTML) under its text, and puts
/// one disabled button in place of its buttons that says so in short
/// (`label`, plain text), so the keyboard does not vanish without a word:
/// handed to the outbox of record, so it happens even when this process
/// ends next, and nobody waits for the chat's budget meanwhile. The
/// decision stands either way.
async fn settle(
    cx: &Context,
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
    if let Err(e) = cx.speaker.hand_over(vec![edit]).await {
        tracing::warn!(message_id, "cannot show how a question ended: {e}");
    }
}

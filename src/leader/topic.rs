//! A session's request in its own topic ([`TopicOp`]): the one place a
//! request becomes what the leader does for it — a Bot API call made by
//! the outbox, a question (`asks/`), or a file (`files.rs`). The target
//! comes from the session's registration; a message to edit or reply to
//! must be one the session posted.

use std::sync::Arc;
use std::time::Duration;

use super::asks::Asks;
use super::context::Context;
use super::files::Files;
use super::outbox::Pace;
use super::registry::ConnId;
use super::speaker::markup;
use crate::protocol::bus::*;
use crate::telegram::call::{ChatAction, SendChatAction, SendMessageDraft};
use crate::telegram::types::{
    EditMessageReplyMarkup, EditMessageText, LinkPreviewOptions, ParseMode, ReplyParameters,
    SendMessage,
};
use crate::telegram::{BotCall, Priority};

/// Longest `callback_data` Telegram accepts, in bytes.
const MAX_BUTTON_DATA: usize = 64;

/// A session's requests in its own topic.
pub(super) struct Topics {
    cx: Arc<Context>,
    asks: Arc<Asks>,
    files: Arc<Files>,
}

impl Topics {
    pub fn new(cx: Arc<Context>, asks: Arc<Asks>, files: Arc<Files>) -> Self {
        Self { cx, asks, files }
    }

    /// Does what a session asked in its own topic. Long because it is the
    /// one match over [`TopicOp`]: each request's checks, its call and its
    /// rank stand side by side.
    pub async fn request(&self, conn: ConnId, req: &TopicRequest) -> Result<TopicDone, BusError> {
        let session = self.cx.registry.session(conn, req.generation)?;
        let profile = &session.route.profile_key;
        let target = session
            .route
            .target
            .ok_or_else(|| BusError::new(BusErrorCode::NoTopic, "this session has no topic yet"))?;
        let own = |message_id| self.cx.own_message(profile, target, message_id);
        // What a person waits for goes first; an edit after; what a later
        // request supersedes never waits.
        let (call, priority) = match &req.op {
            TopicOp::SendText(send) => {
                if let Some(reply_to) = send.reply_to {
                    own(reply_to)?;
                }
                check_buttons(send.buttons.as_ref())?;
                (send_message(target, send), Priority::High)
            }
            TopicOp::EditText(edit) => {
                own(edit.message_id)?;
                check_buttons(edit.buttons.as_ref())?;
                (edit_text(target, edit), Priority::Normal)
            }
            TopicOp::EditButtons(edit) => {
                own(edit.message_id)?;
                check_buttons(edit.buttons.as_ref())?;
                (edit_buttons(target, edit), Priority::Normal)
            }
            TopicOp::Typing => (typing(target), Priority::Normal),
            TopicOp::Draft(draft) => (message_draft(target, draft)?, Priority::Normal),
            TopicOp::SendFile(send) => {
                return self
                    .files
                    .send_file(profile, &session.cwd, target, send)
                    .await;
            }
            TopicOp::Ask(ask) => return self.asks.ask(profile, target, ask).await,
            TopicOp::AwaitAnswer(wait) => {
                return self.asks.await_answer(profile, target, wait).await;
            }
            TopicOp::CloseAsk(close) => return self.asks.close_ask(profile, target, close).await,
        };
        let priority = if req.background {
            Priority::Background
        } else {
            priority
        };
        let waiting = |wait: Duration| {
            self.cx.registry.send(
                conn,
                FromLeader::Paced(Paced {
                    id: req.id,
                    wait_ms: wait.as_millis() as u64,
                }),
            );
        };
        let pace = Pace {
            waiting: &waiting,
            ..Pace::of(priority)
        };
        let done = self.cx.outbox.call(call, pace).await;
        self.cx.record(profile, target, done.as_ref());
        let performed = done?;
        Ok(TopicDone {
            message_id: performed.reply.message_id(),
            plain: performed.plain,
            ..TopicDone::default()
        })
    }
}

/// Telegram's HTML mode for a text of `format`.
fn parse_mode(format: TextFormat) -> Option<ParseMode> {
    (format == TextFormat::Html).then_some(ParseMode::Html)
}

/// A message into `target`.
fn send_message(target: Target, send: &SendText) -> BotCall {
    BotCall::SendMessage(SendMessage {
        chat_id: target.chat_id,
        message_thread_id: Some(target.thread_id),
        text: send.text.clone(),
        parse_mode: parse_mode(send.format),
        reply_markup: send.buttons.as_ref().map(markup),
        reply_parameters: send.reply_to.map(|message_id| ReplyParameters {
            message_id,
            allow_sending_without_reply: true,
        }),
        // An agent's answer quoting a URL should not grow a card.
        link_preview_options: Some(LinkPreviewOptions::default()),
    })
}

/// A new text (and buttons) for a message of `target`'s chat.
fn edit_text(target: Target, edit: &EditText) -> BotCall {
    BotCall::EditMessageText(EditMessageText {
        chat_id: target.chat_id,
        message_id: edit.message_id,
        text: edit.text.clone(),
        parse_mode: parse_mode(edit.format),
        reply_markup: edit.buttons.as_ref().map(markup),
        link_preview_options: Some(LinkPreviewOptions::default()),
    })
}

fn edit_buttons(target: Target, edit: &EditButtons) -> BotCall {
    BotCall::EditMessageReplyMarkup(EditMessageReplyMarkup {
        chat_id: target.chat_id,
        message_id: edit.message_id,
        reply_markup: edit.buttons.as_ref().map(markup),
    })
}

/// A draft in `target`: Telegram shows drafts in private chats only, and
/// needs a draft id that is not 0.
fn message_draft(target: Target, draft: &Draft) -> Result<BotCall, BusError> {
    if target.chat_id <= 0 {
        return Err(BusError::new(
            BusErrorCode::Forbidden,
            "drafts are shown in private chats only",
        ));
    }
    if draft.draft_id == 0 {
        return Err(BusError::new(
            BusErrorCode::BadFrame,
            "a draft id is never 0",
        ));
    }
    Ok(BotCall::SendMessageDraft(SendMessageDraft {
        chat_id: target.chat_id,
        message_thread_id: Some(target.thread_id),
        draft_id: draft.draft_id,
        text: draft.text.clone(),
        parse_mode: parse_mode(draft.format),
        can_stop: draft.can_stop,
    }))
}

fn typing(target: Target) -> BotCall {
    BotCall::SendChatAction(SendChatAction {
        chat_id: target.chat_id,
        message_thread_id: Some(target.thread_id),
        action: ChatAction::Typing,
    })
}

/// Refuses a session's buttons Telegram would refuse, before anything is
/// sent.
fn check_buttons(keyboard: Option<&Keyboard>) -> Result<(), BusError> {
    let bad = keyboard
        .into_iter()
        .flat_map(|k| k.rows.iter().flatten())
        .find(|b| b.data.is_empty() || b.data.len() > MAX_BUTTON_DATA || b.text.trim().is_empty());
    match bad {
        Some(b) => Err(BusError::new(
            BusErrorCode::BadFrame,
            format!(
                "button {:?}: a button needs text and 1-{MAX_BUTTON_DATA} bytes of data",
                b.text
            ),
        )),
        None => Ok(()),
    }
}

//! The one way the leader says something of its own ([`Speaker`]): a
//! notice in a topic, the answer to a command, the control place's lists.
//! Two ways to go, chosen by what the caller needs:
//!
//! * **now** ([`Speaker::now`], [`Speaker::edit`]): the call is made at
//!   once and the caller gets the message's id, to edit it later (a list
//!   turned to its next page, "⏳ Starting…" becoming "▶ started"). Lost with
//!   a leader that dies meanwhile; the person asks again.
//! * **durably** ([`Speaker::post`], [`Speaker::later`],
//!   [`Speaker::hand_over`]): written to the outbox of record, on disk,
//!   and sent from there by the courier (`courier.rs`) in order with
//!   everything else for that place — by the next leader if this one ends
//!   first. What the leader tells a person about their messages goes this
//!   way: nothing of theirs may vanish without a word.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use super::failure::Failure;
use super::failure::store_error;
use super::outbox::{Outbox, Pace};
use crate::ids::Place;
use crate::protocol::bus::*;
use crate::redact::{redact, redact_html};
use crate::render;
use crate::store::{EntryKind, Lane, NewOutboxEntry, Store};
use crate::telegram::types::{
    EditMessageText, InlineKeyboardButton, InlineKeyboardMarkup, LinkPreviewOptions, ParseMode,
    SendMessage,
};
use crate::telegram::{BotCall, Priority};

/// What the leader says: a text, HTML or plain, with buttons or none.
pub(super) struct Say {
    pub text: String,
    pub html: bool,
    pub buttons: Option<Keyboard>,
}

impl Say {
    pub fn html(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            html: true,
            buttons: None,
        }
    }

    pub fn plain(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            html: false,
            buttons: None,
        }
    }

    /// The same, with `buttons` (none when `None`).
    pub fn with(self, buttons: Option<Keyboard>) -> Self {
        Self { buttons, ..self }
    }

    fn parse_mode(&self) -> Option<ParseMode> {
        self.html.then_some(ParseMode::Html)
    }

    /// The same, within what Telegram takes in one message: a text that
    /// does not fit (a folder of thousands of characters named in "⏳
    /// Starting…", a long list) goes as its readable text, clipped, so the
    /// person always gets an answer.
    fn fitted(self) -> Self {
        let shown = if self.html {
            render::to_plain(&self.text)
        } else {
            self.text.clone()
        };
        if shown.encode_utf16().count() <= render::MESSAGE_LIMIT {
            return self;
        }
        // Clipped by characters to leave room for any that take two UTF-16
        // units, and for the ellipsis.
        let text = crate::policy::clip(&shown, render::MESSAGE_LIMIT / 2 - 1);
        Self {
            text,
            html: false,
            ..self
        }
    }
}

/// See the module docs.
#[derive(Clone)]
pub(super) struct Speaker {
    outbox: Arc<Outbox>,
    store: Arc<Mutex<Store>>,
    /// Woken when something was handed over: the courier sends it.
    handed_over: Arc<Notify>,
}

impl Speaker {
    pub fn new(outbox: Arc<Outbox>, store: Arc<Mutex<Store>>) -> Self {
        Self {
            outbox,
            store,
            handed_over: Arc::default(),
        }
    }

    /// What the courier waits on: something was handed over, or a place
    /// may be reachable again.
    pub fn handed_over(&self) -> &Notify {
        &self.handed_over
    }

    /// Posts `say` in `place` at once, first in line; answers the
    /// message's id.
    pub async fn now(&self, place: Place, say: Say) -> Result<i64, Failure> {
        self.send(place, say, Pace::high()).await
    }

    /// [`Speaker::now`] for a line of status (a session back after its
    /// launcher restarted): when the chat's budget is short, after what
    /// people wait for, as edits.
    pub async fn notice(&self, place: Place, say: Say) -> Result<i64, Failure> {
        self.send(place, say, Pace::of(Priority::Normal)).await
    }

    async fn send(&self, place: Place, say: Say, pace: Pace<'_>) -> Result<i64, Failure> {
        let say = say.fitted();
        let call = BotCall::SendMessage(SendMessage {
            chat_id: place.chat_id,
            message_thread_id: place.thread_id,
            parse_mode: say.parse_mode(),
            reply_markup: say.buttons.as_ref().map(markup),
            text: say.text,
            reply_parameters: None,
            link_preview_options: Some(LinkPreviewOptions::default()),
        });
        let done = self.outbox.call(call, pace).await?;
        Ok(done.reply.message_id().unwrap_or_default())
    }

    /// Replaces the text and buttons of message `message_id` of `place`.
    pub async fn edit(&self, place: Place, message_id: i64, say: Say) -> Result<(), Failure> {
        let say = say.fitted();
        let call = BotCall::EditMessageText(EditMessageText {
            chat_id: place.chat_id,
            message_id,
            parse_mode: say.parse_mode(),
            reply_markup: say.buttons.as_ref().map(markup),
            text: say.text,
            link_preview_options: Some(LinkPreviewOptions::default()),
        });
        self.outbox
            .call(call, Pace::of(Priority::Normal))
            .await
            .map(drop)
    }

    /// Posts `say` in `place`, or edits message `message_id` to it.
    pub async fn now_or_edit(
        &self,
        place: Place,
        message_id: Option<i64>,
        say: Say,
    ) -> Result<i64, Failure> {
        match message_id {
            Some(id) => self.edit(place, id, say).await.map(|()| id),
            None => self.now(place, say).await,
        }
    }

    /// Hands a plain `text` for `place` to the outbox of record: on disk
    /// when this returns.
    pub async fn post(&self, place: Place, text: String) -> Result<(), BusError> {
        let notice = NewOutboxEntry {
            lane: Lane::Fixed(place),
            kind: EntryKind::Text {
                reply_to: None,
                merge: false,
            },
            body: text,
            html: false,
            origin: None,
        };
        self.hand_over(vec![notice]).await.map(drop)
    }

    /// [`Speaker::post`], for a caller that may not wait (the routing
    /// path): not cancelled with the leader, the hand-over takes a moment.
    pub fn later(&self, place: Place, text: String) {
        let speaker = self.clone();
        crate::tasks::spawn(async move {
            if let Err(e) = speaker.post(place, text).await {
                let chat = place.chat_id;
                tracing::warn!(chat, "cannot answer: {e}");
            }
        });
    }

    /// Writes entries to the outbox of record, on disk (on a blocking
    /// thread: it waits for the disk), and wakes the courier; their ids.
    /// A token in them is masked first: what reaches the disk is what
    /// Telegram would be shown (`telegram/client.rs` masks every text too).
    pub async fn hand_over(&self, mut entries: Vec<NewOutboxEntry>) -> Result<Vec<i64>, BusError> {
        for entry in &mut entries {
            redact_entry(entry);
        }
        let store = self.store.clone();
        let ids = tokio::task::spawn_blocking(move || {
            store
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .post(&entries)
        })
        .await
        .map_err(|e| BusError::new(BusErrorCode::Internal, e.to_string()))?
        .map_err(store_error)?;
        self.handed_over.notify_one();
        Ok(ids)
    }

    /// Ends a tap's spinner, with `text` as its toast.
    pub async fn toast(&self, callback_id: &str, text: &str) {
        if let Err(e) = self.outbox.answer_tap(callback_id, Some(text)).await {
            tracing::debug!("cannot answer a tap: {e}");
        }
    }
}

/// `entry` with every token masked: its text (as HTML where it is HTML),
/// a document's caption, a settled question's label.
fn redact_entry(entry: &mut NewOutboxEntry) {
    let masked = |text: &str, html: bool| {
        if html {
            redact_html(text).into_owned()
        } else {
            redact(text).into_owned()
        }
    };
    entry.body = masked(&entry.body, entry.html);
    match &mut entry.kind {
        EntryKind::Document {
            caption: Some(caption),
            ..
        } => *caption = masked(caption, false),
        EntryKind::Edit {
            settled: Some(label),
            ..
        } => *label = masked(label, false),
        _ => {}
    }
}

/// The ◀ ▶ row of a list of `pages` pages shown at `page`: buttons whose
/// data is `c:<verb>:<page>`. None for a list of one page.
pub(super) fn paging(verb: &str, page: usize, pages: usize) -> Option<Vec<Button>> {
    if pages < 2 {
        return None;
    }
    let mut row = Vec::new();
    if page > 0 {
        row.push(Button {
            text: "◀".into(),
            data: format!("c:{verb}:{}", page - 1),
        });
    }
    if page + 1 < pages {
        row.push(Button {
            text: "▶".into(),
            data: format!("c:{verb}:{}", page + 1),
        });
    }
    Some(row)
}

/// Buttons as Telegram takes them.
pub(super) fn markup(keyboard: &Keyboard) -> InlineKeyboardMarkup {
    InlineKeyboardMarkup {
        inline_keyboard: keyboard
            .rows
            .iter()
            .map(|row| {
                row.iter()
                    .map(|b| InlineKeyboardButton::callback(b.text.clone(), b.data.clone()))
                    .collect()
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_telegram_would_refuse_as_too_long_is_clipped_to_fit() {
        let folder = "a".repeat(5000);
        let say = Say::html(format!("⏳ Starting pi in <code>/tmp/{folder}</code>…")).fitted();
        assert!(!say.html, "its readable text");
        assert!(
            say.text.starts_with("⏳ Starting pi in /tmp/aaa"),
            "{}",
            say.text
        );
        assert!(say.text.encode_utf16().count() <= render::MESSAGE_LIMIT);
        assert!(say.text.ends_with('…'), "marked as cut");
        let emoji = Say::plain("🧠".repeat(3000)).fitted();
        assert!(emoji.text.encode_utf16().count() <= render::MESSAGE_LIMIT);
        let short = Say::html("<b>fits</b>").fitted();
        assert!(short.html && short.text == "<b>fits</b>", "left alone");
    }
}

//! Questions with buttons as the tests see them in the fake: waiting for
//! one, reading its buttons, tapping one and reading the bot's answer to
//! the tap.

use agent_relay::fake_bot_api::{CallbackInject, FakeServer, SentMessage};

use super::{CHAT, WAIT};

/// Waits for the message with buttons in `thread` of the forum whose text
/// has `needle`.
pub async fn question(fake: &FakeServer, thread: i64, needle: &str) -> SentMessage {
    question_in(fake, CHAT, thread, needle).await
}

/// [`question`] in `chat`.
pub async fn question_in(fake: &FakeServer, chat: i64, thread: i64, needle: &str) -> SentMessage {
    fake.api()
        .wait_until(
            |api| {
                api.messages(chat, Some(thread))
                    .into_iter()
                    .find(|m| has_buttons(m) && m.plain_text.contains(needle))
            },
            WAIT,
        )
        .await
        .unwrap_or_else(|_| {
            let texts: Vec<String> = fake
                .api()
                .messages(chat, Some(thread))
                .into_iter()
                .map(|m| m.plain_text)
                .collect();
            panic!("no question with {needle:?} in thread {thread}: {texts:?}")
        })
}

/// Whether `message` has a button one can press.
pub fn has_buttons(message: &SentMessage) -> bool {
    buttons(message)
        .iter()
        .any(|b| b.get("callback_data").is_some())
}

/// Whether a question is settled: its buttons gave way to one disabled
/// button that says how it was settled (Bot API 10.3).
pub fn is_settled(message: &SentMessage) -> bool {
    settled_label(message).is_some()
}

/// The label of a settled question's one disabled button.
pub fn settled_label(message: &SentMessage) -> Option<String> {
    match buttons(message).as_slice() {
        [only] if only.get("disabled").is_some() && only.get("callback_data").is_none() => {
            only["text"].as_str().map(String::from)
        }
        _ => None,
    }
}

fn buttons(message: &SentMessage) -> Vec<serde_json::Value> {
    message
        .reply_markup
        .as_ref()
        .and_then(|markup| markup["inline_keyboard"].as_array())
        .into_iter()
        .flatten()
        .flat_map(|row| row.as_array().cloned().unwrap_or_default())
        .collect()
}

/// The callback data of the button whose label contains `label`, as the
/// message was sent (a settled question has lost its buttons).
pub fn button(message: &SentMessage, label: &str) -> String {
    let rows = message.reply_markup.as_ref().expect("buttons")["inline_keyboard"]
        .as_array()
        .expect("rows")
        .clone();
    rows.iter()
        .flat_map(|row| row.as_array().cloned().unwrap_or_default())
        .find(|b| b["text"].as_str().is_some_and(|t| t.contains(label)))
        .and_then(|b| b["callback_data"].as_str().map(String::from))
        .unwrap_or_else(|| panic!("no button {label:?} in {rows:?}"))
}

/// The callback data of the first button.
pub fn first_button(message: &SentMessage) -> String {
    message.reply_markup.as_ref().expect("buttons")["inline_keyboard"][0][0]["callback_data"]
        .as_str()
        .expect("callback data")
        .to_string()
}

/// `user` taps the button with callback `data` under `message` in
/// `thread` of the forum; returns the tap's callback query id.
pub fn tap(fake: &FakeServer, message: &SentMessage, thread: i64, user: i64, data: &str) -> String {
    tap_in(fake, CHAT, message, thread, user, data)
}

/// [`tap`] in `chat`.
pub fn tap_in(
    fake: &FakeServer,
    chat: i64,
    message: &SentMessage,
    thread: i64,
    user: i64,
    data: &str,
) -> String {
    fake.api()
        .inject_callback_query(CallbackInject {
            chat_id: chat,
            thread_id: Some(thread),
            user_id: user,
            message_id: message.message_id,
            data: data.into(),
        })
        .1
}

/// The bot's answer to the tap `id`, once it answered.
pub async fn tap_answer(fake: &FakeServer, id: &str) -> String {
    fake.api()
        .wait_until(
            |api| {
                api.callback_queries()
                    .into_iter()
                    .find(|q| q.callback_query_id == id)
                    .and_then(|q| q.answer)
                    .map(|a| a.text.unwrap_or_default())
            },
            WAIT,
        )
        .await
        .unwrap_or_else(|_| panic!("the tap {id} was never answered"))
}

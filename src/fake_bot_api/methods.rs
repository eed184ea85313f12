//! The Bot API methods: parameters in, Telegram's `result` or error out.

use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use super::FakeBotApi;
use super::html::{self, utf16_len};
use super::state::{
    ActivePoll, Author, Chat, ChatKind, GENERAL_THREAD_ID, ICON_COLORS, Inner, StoredMessage,
    Topic, unix_now,
};

/// An error answer: `{"ok":false,"error_code":code,"description":…}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ApiError {
    pub code: u16,
    pub description: String,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(code: u16, description: impl Into<String>) -> Self {
        Self {
            code,
            description: description.into(),
            retry_after: None,
        }
    }

    pub fn bad_request(what: impl std::fmt::Display) -> Self {
        Self::new(400, format!("Bad Request: {what}"))
    }

    pub fn too_many_requests(retry_after: u64) -> Self {
        Self {
            code: 429,
            description: format!("Too Many Requests: retry after {retry_after}"),
            retry_after: Some(retry_after),
        }
    }

    pub fn conflict() -> Self {
        Self::new(
            409,
            "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
        )
    }

    pub fn json(&self) -> Value {
        let mut body =
            json!({"ok": false, "error_code": self.code, "description": self.description});
        if let Some(retry_after) = self.retry_after {
            body["parameters"] = json!({"retry_after": retry_after});
        }
        body
    }
}

type Answer = Result<Value, ApiError>;

/// Every method the fake implements, in Telegram's spelling.
const METHODS: [&str; 17] = [
    "getMe",
    "deleteWebhook",
    "getUpdates",
    "sendMessage",
    "editMessageText",
    "sendChatAction",
    "answerCallbackQuery",
    "getChat",
    "getChatMember",
    "setMyCommands",
    "getMyCommands",
    "deleteMyCommands",
    "createForumTopic",
    "editForumTopic",
    "closeForumTopic",
    "reopenForumTopic",
    "deleteForumTopic",
];

/// Telegram matches method names case-insensitively.
pub(super) fn canonical(method: &str) -> Option<&'static str> {
    METHODS.into_iter().find(|m| m.eq_ignore_ascii_case(method))
}

pub(super) async fn dispatch(api: &FakeBotApi, method: &'static str, params: &Value) -> Answer {
    if method == "getUpdates" {
        return get_updates(api, params).await;
    }
    api.mutate(|inner| match method {
        "getMe" => Ok(get_me(inner)),
        "deleteWebhook" => delete_webhook(inner, params),
        "sendMessage" => send_message(inner, params),
        "editMessageText" => edit_message_text(inner, params),
        "sendChatAction" => send_chat_action(inner, params),
        "answerCallbackQuery" => answer_callback_query(inner, params),
        "getChat" => Ok(chat(inner, params)?.json()),
        "getChatMember" => get_chat_member(inner, params),
        "setMyCommands" => set_my_commands(inner, params),
        "getMyCommands" => Ok(inner.commands.clone()),
        "deleteMyCommands" => {
            inner.commands = json!([]);
            Ok(json!(true))
        }
        "createForumTopic" => create_forum_topic(inner, params),
        "editForumTopic" => edit_forum_topic(inner, params),
        "closeForumTopic" => set_topic_closed(inner, params, true),
        "reopenForumTopic" => set_topic_closed(inner, params, false),
        "deleteForumTopic" => delete_forum_topic(inner, params),
        _ => Err(ApiError::new(404, "Not Found")),
    })
}

// ---- parameters (JSON values, or strings from a query string / form) ----

fn int(params: &Value, key: &str) -> Result<Option<i64>, ApiError> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| ApiError::bad_request(format!("invalid {key} specified"))),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("invalid {key} specified"))),
        Some(_) => Err(ApiError::bad_request(format!("invalid {key} specified"))),
    }
}

fn required_int(params: &Value, key: &str) -> Result<i64, ApiError> {
    int(params, key)?.ok_or_else(|| ApiError::bad_request(format!("{key} is empty")))
}

fn string(params: &Value, key: &str) -> Option<String> {
    match params.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn boolean(params: &Value, key: &str) -> bool {
    match params.get(key) {
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => matches!(s.as_str(), "true" | "True" | "1"),
        Some(Value::Number(n)) => n.as_i64().is_some_and(|n| n != 0),
        _ => false,
    }
}

/// Arrays arrive as JSON, or JSON-encoded inside a string in forms and queries.
fn list(params: &Value, key: &str) -> Result<Option<Vec<Value>>, ApiError> {
    match params.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items.clone())),
        Some(Value::String(s)) => match serde_json::from_str(s) {
            Ok(Value::Array(items)) => Ok(Some(items)),
            _ => Err(ApiError::bad_request(format!(
                "can't parse {key} JSON array"
            ))),
        },
        Some(_) => Err(ApiError::bad_request(format!(
            "can't parse {key} JSON array"
        ))),
    }
}

fn chat_id(params: &Value) -> Result<i64, ApiError> {
    match params.get("chat_id") {
        None | Some(Value::Null) => Err(ApiError::bad_request("chat_id is empty")),
        // `@username` addresses public chats; the fake has none.
        Some(Value::String(s)) if s.starts_with('@') => {
            Err(ApiError::bad_request("chat not found"))
        }
        _ => required_int(params, "chat_id"),
    }
}

fn chat<'a>(inner: &'a mut Inner, params: &Value) -> Result<&'a mut Chat, ApiError> {
    let id = chat_id(params)?;
    inner
        .chats
        .get_mut(&id)
        .ok_or_else(|| ApiError::bad_request("chat not found"))
}

fn thread_not_found() -> ApiError {
    ApiError::bad_request("message thread not found")
}

/// Checks that a send or chat action may target `thread_id` in `chat`.
fn check_thread_for_send(
    chat: &Chat,
    thread_id: Option<i64>,
    bot_has_topics: bool,
) -> Result<(), ApiError> {
    let Some(thread_id) = thread_id else {
        return Ok(());
    };
    if !chat.has_topics(bot_has_topics) || thread_id == GENERAL_THREAD_ID {
        return Err(thread_not_found());
    }
    match chat.topics.get(&thread_id) {
        Some(topic) if topic.deleted => Err(thread_not_found()),
        // Admins who manage topics may still write in closed ones.
        Some(topic) if topic.closed && !chat.is_private() && !chat.rights.can_manage_topics => {
            Err(ApiError::bad_request("TOPIC_CLOSED"))
        }
        Some(_) => Ok(()),
        None => Err(thread_not_found()),
    }
}

/// The live topic a topic method addresses.
fn live_topic<'a>(chat: &'a mut Chat, params: &Value) -> Result<(i64, &'a mut Topic), ApiError> {
    let thread_id = required_int(params, "message_thread_id")?;
    if thread_id == GENERAL_THREAD_ID {
        return Err(ApiError::bad_request("TOPIC_ID_INVALID"));
    }
    match chat.topics.get_mut(&thread_id) {
        Some(topic) if !topic.deleted => Ok((thread_id, topic)),
        _ => Err(thread_not_found()),
    }
}

// ---- methods ----

fn get_me(inner: &Inner) -> Value {
    let mut me = inner.bot_user_json();
    let extra = json!({
        "can_join_groups": true,
        "can_read_all_group_messages": false,
        "supports_inline_queries": false,
        "can_connect_to_business": false,
        "has_main_web_app": false,
        "has_topics_enabled": inner.config.has_topics_enabled,
    });
    if let (Some(me), Value::Object(extra)) = (me.as_object_mut(), extra) {
        me.extend(extra);
    }
    me
}

fn delete_webhook(inner: &mut Inner, params: &Value) -> Answer {
    if boolean(params, "drop_pending_updates") {
        inner.updates.clear();
    }
    Ok(json!(true))
}

async fn get_updates(api: &FakeBotApi, params: &Value) -> Answer {
    let offset = int(params, "offset")?.unwrap_or(0);
    let limit = usize::try_from(int(params, "limit")?.unwrap_or(100).clamp(1, 100)).unwrap_or(100);
    let timeout = int(params, "timeout")?.unwrap_or(0).clamp(0, 3600);
    let allowed = list(params, "allowed_updates")?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout.unsigned_abs());
    let mut changed = api.shared.changed.subscribe();
    let (terminate, mut terminated) = oneshot::channel();
    let poll_id = api.mutate(|inner| {
        if let Some(kinds) = allowed {
            let kinds: Vec<String> = kinds
                .iter()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .collect();
            // An empty list means "the default set" again.
            inner.allowed_updates = (!kinds.is_empty()).then_some(kinds);
        }
        inner.confirm(offset);
        if let Some(older) = inner.active_poll.take() {
            // The receiver may be gone if that poll already answered; nothing to do then.
            let _ = older.terminate.send(());
        }
        let id = inner.next_poll_id;
        inner.next_poll_id += 1;
        inner.active_poll = Some(ActivePoll { id, terminate });
        id
    });
    let shutdown = api.shared.shutdown.clone();
    loop {
        changed.borrow_and_update();
        let batch = {
            let mut inner = api.lock();
            let batch: Vec<Value> = inner
                .updates
                .iter()
                .filter(|(id, _)| offset <= 0 || *id >= offset)
                .take(limit)
                .map(|(_, update)| update.clone())
                .collect();
            let done = !batch.is_empty()
                || tokio::time::Instant::now() >= deadline
                || shutdown.is_cancelled();
            if done && inner.active_poll.as_ref().is_some_and(|p| p.id == poll_id) {
                inner.active_poll = None;
            }
            done.then_some(batch)
        };
        if let Some(batch) = batch {
            return Ok(Value::Array(batch));
        }
        tokio::select! {
            _ = &mut terminated => return Err(ApiError::conflict()),
            _ = changed.changed() => {}
            () = tokio::time::sleep_until(deadline) => {}
            () = shutdown.cancelled() => {}
        }
    }
}

/// Validates text and parse mode as Telegram does; returns (text, entities).
fn parse_text(params: &Value) -> Result<(String, Option<String>, html::Parsed), ApiError> {
    let raw = string(params, "text").unwrap_or_default();
    let parse_mode = string(params, "parse_mode").filter(|m| !m.is_empty());
    let parsed = match parse_mode.as_deref() {
        None => html::Parsed {
            text: raw.clone(),
            entities: Vec::new(),
        },
        Some(mode) if mode.eq_ignore_ascii_case("html") => html::parse_html(&raw)
            .map_err(|e| ApiError::bad_request(format!("can't parse entities: {e}")))?,
        // The relay only sends HTML; Markdown modes are accepted but not parsed.
        Some(mode)
            if mode.eq_ignore_ascii_case("markdown") || mode.eq_ignore_ascii_case("markdownv2") =>
        {
            html::Parsed {
                text: raw.clone(),
                entities: Vec::new(),
            }
        }
        Some(_) => return Err(ApiError::bad_request("unsupported parse_mode")),
    };
    if parsed.text.trim().is_empty() {
        return Err(ApiError::bad_request("message text is empty"));
    }
    if utf16_len(&parsed.text) > 4096 {
        return Err(ApiError::bad_request("message is too long"));
    }
    Ok((raw, parse_mode, parsed))
}

fn send_message(inner: &mut Inner, params: &Value) -> Answer {
    let bot_has_topics = inner.config.has_topics_enabled;
    let rate_limits = inner.config.rate_limits;
    let chat_id = chat_id(params)?;
    let thread_id = int(params, "message_thread_id")?;
    let (raw, parse_mode, parsed) = parse_text(params)?;
    let bot = inner.bot_user_json();
    let chat = inner
        .chats
        .get_mut(&chat_id)
        .ok_or_else(|| ApiError::bad_request("chat not found"))?;
    check_thread_for_send(chat, thread_id, bot_has_topics)?;
    if rate_limits {
        admit_send(&mut inner.sends, chat)?;
    }
    let message = StoredMessage {
        message_id: chat.allocate_message_id(),
        thread_id,
        author: Author::Bot,
        raw_text: raw,
        parse_mode,
        text: parsed.text,
        entities: parsed.entities,
        date: unix_now(),
        edited: false,
        reply_markup: params.get("reply_markup").cloned(),
        service: None,
    };
    let answer = chat.message_json(&message, &bot, &inner.users);
    chat.messages.push(message);
    Ok(answer)
}

/// Telegram's send limits: 1/s per private chat, 20/min per group, 30/s overall.
/// A refused send does not count against any of them.
fn admit_send(
    global: &mut std::collections::VecDeque<Instant>,
    chat: &mut Chat,
) -> Result<(), ApiError> {
    let now = Instant::now();
    let (window, max) = if chat.is_private() {
        (Duration::from_secs(1), 1)
    } else {
        (Duration::from_secs(60), 20)
    };
    let wait_for = |log: &mut std::collections::VecDeque<Instant>, window: Duration, max: usize| {
        while log
            .front()
            .is_some_and(|t| now.duration_since(*t) >= window)
        {
            log.pop_front();
        }
        if log.len() < max {
            return None;
        }
        let oldest = *log.front()?;
        let remaining = window.saturating_sub(now.duration_since(oldest));
        Some(remaining.as_millis().div_ceil(1000).max(1))
    };
    let refusal = wait_for(global, Duration::from_secs(1), 30)
        .or_else(|| wait_for(&mut chat.sends, window, max));
    if let Some(seconds) = refusal {
        return Err(ApiError::too_many_requests(
            u64::try_from(seconds).unwrap_or(u64::MAX),
        ));
    }
    global.push_back(now);
    chat.sends.push_back(now);
    Ok(())
}

fn edit_message_text(inner: &mut Inner, params: &Value) -> Answer {
    if params.get("inline_message_id").is_some() {
        return Err(ApiError::bad_request(
            "inline messages are not supported by the fake",
        ));
    }
    let chat_id = chat_id(params)?;
    let message_id = required_int(params, "message_id")?;
    let (raw, parse_mode, parsed) = parse_text(params)?;
    let bot = inner.bot_user_json();
    let chat = inner
        .chats
        .get_mut(&chat_id)
        .ok_or_else(|| ApiError::bad_request("chat not found"))?;
    let index = chat
        .messages
        .iter()
        .position(|m| m.message_id == message_id && m.service.is_none())
        .ok_or_else(|| ApiError::bad_request("message to edit not found"))?;
    let message = &chat.messages[index];
    if let Some(thread_id) = message.thread_id
        && chat.topics.get(&thread_id).is_none_or(|t| t.deleted)
    {
        return Err(thread_not_found());
    }
    if !matches!(message.author, Author::Bot) {
        return Err(ApiError::bad_request("message can't be edited"));
    }
    let reply_markup = params.get("reply_markup").cloned();
    if message.text == parsed.text
        && message.entities == parsed.entities
        && message.reply_markup == reply_markup
    {
        return Err(ApiError::bad_request(
            "message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message",
        ));
    }
    let message = &mut chat.messages[index];
    message.raw_text = raw;
    message.parse_mode = parse_mode;
    message.text = parsed.text;
    message.entities = parsed.entities;
    message.reply_markup = reply_markup;
    message.edited = true;
    let message = chat.messages[index].clone();
    Ok(chat.message_json(&message, &bot, &inner.users))
}

const CHAT_ACTIONS: [&str; 11] = [
    "typing",
    "upload_photo",
    "record_video",
    "upload_video",
    "record_voice",
    "upload_voice",
    "upload_document",
    "choose_sticker",
    "find_location",
    "record_video_note",
    "upload_video_note",
];

fn send_chat_action(inner: &mut Inner, params: &Value) -> Answer {
    let bot_has_topics = inner.config.has_topics_enabled;
    let thread_id = int(params, "message_thread_id")?;
    let action = string(params, "action").unwrap_or_default();
    let chat = chat(inner, params)?;
    if !CHAT_ACTIONS.contains(&action.as_str()) {
        return Err(ApiError::bad_request("wrong parameter action in request"));
    }
    check_thread_for_send(chat, thread_id, bot_has_topics)?;
    Ok(json!(true))
}

fn answer_callback_query(inner: &mut Inner, params: &Value) -> Answer {
    let id = string(params, "callback_query_id").unwrap_or_default();
    if id.is_empty() {
        return Err(ApiError::bad_request("callback_query_id is empty"));
    }
    if !inner.callback_query_ids.remove(&id) {
        return Err(ApiError::bad_request(
            "query is too old and response timeout expired or query ID is invalid",
        ));
    }
    Ok(json!(true))
}

fn get_chat_member(inner: &mut Inner, params: &Value) -> Answer {
    let user_id = required_int(params, "user_id")?;
    let bot_id = inner.bot_id;
    let bot = inner.bot_user_json();
    let known_user = inner.users.contains_key(&user_id);
    let user = super::state::user_json(user_id, &inner.users);
    let chat = chat(inner, params)?;
    if user_id == bot_id {
        let rights = chat.rights;
        if chat.is_private() || (!rights.can_manage_topics && !rights.can_delete_messages) {
            return Ok(json!({"status": "member", "user": bot}));
        }
        return Ok(json!({
            "status": "administrator",
            "user": bot,
            "can_be_edited": false,
            "is_anonymous": false,
            "can_manage_chat": true,
            "can_delete_messages": rights.can_delete_messages,
            "can_manage_video_chats": false,
            "can_restrict_members": false,
            "can_promote_members": false,
            "can_change_info": false,
            "can_invite_users": true,
            "can_post_stories": false,
            "can_edit_stories": false,
            "can_delete_stories": false,
            "can_pin_messages": false,
            "can_manage_topics": rights.can_manage_topics,
        }));
    }
    if chat.id == user_id || known_user {
        return Ok(json!({"status": "member", "user": user}));
    }
    Err(ApiError::bad_request("user not found"))
}

fn set_my_commands(inner: &mut Inner, params: &Value) -> Answer {
    let commands =
        list(params, "commands")?.ok_or_else(|| ApiError::bad_request("commands is empty"))?;
    let mut accepted = Vec::with_capacity(commands.len());
    for entry in commands {
        let command = entry["command"].as_str().unwrap_or_default();
        let description = entry["description"].as_str().unwrap_or_default();
        let command_ok = (1..=32).contains(&command.len())
            && command
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !command_ok {
            return Err(ApiError::bad_request("BOT_COMMAND_INVALID"));
        }
        if !(1..=256).contains(&description.chars().count()) {
            return Err(ApiError::bad_request("BOT_COMMAND_DESCRIPTION_INVALID"));
        }
        accepted.push(json!({"command": command, "description": description}));
    }
    inner.commands = Value::Array(accepted);
    Ok(json!(true))
}

fn topic_name(params: &Value, required: bool) -> Result<Option<String>, ApiError> {
    let name = string(params, "name").filter(|n| !n.is_empty());
    match name {
        None if required => Err(ApiError::bad_request("name is empty")),
        Some(name) if name.chars().count() > 128 => {
            Err(ApiError::bad_request("TOPIC_NAME_INVALID"))
        }
        name => Ok(name),
    }
}

fn push_service(chat: &mut Chat, thread_id: i64, kind: &'static str, payload: Value) {
    let message_id = chat.allocate_message_id();
    chat.messages
        .push(service_message(message_id, thread_id, kind, payload));
}

fn service_message(
    message_id: i64,
    thread_id: i64,
    kind: &'static str,
    payload: Value,
) -> StoredMessage {
    StoredMessage {
        message_id,
        thread_id: Some(thread_id),
        author: Author::Bot,
        raw_text: String::new(),
        parse_mode: None,
        text: String::new(),
        entities: Vec::new(),
        date: unix_now(),
        edited: false,
        reply_markup: None,
        service: Some((kind, payload)),
    }
}

fn create_forum_topic(inner: &mut Inner, params: &Value) -> Answer {
    let bot_has_topics = inner.config.has_topics_enabled;
    let name = topic_name(params, true)?.unwrap_or_default();
    let icon_color = int(params, "icon_color")?;
    let chat = chat(inner, params)?;
    if !chat.has_topics(bot_has_topics) {
        return Err(ApiError::bad_request("the chat is not a forum"));
    }
    if !chat.is_private() && !chat.rights.can_manage_topics {
        return Err(ApiError::bad_request("not enough rights to create a topic"));
    }
    let icon_color = match icon_color {
        Some(color) if ICON_COLORS.contains(&color) => color,
        Some(_) => return Err(ApiError::bad_request("TOPIC_ICON_COLOR_INVALID")),
        // Telegram picks a colour; rotating keeps neighbouring topics apart.
        None => ICON_COLORS[chat.topics.len() % ICON_COLORS.len()],
    };
    // The topic's thread id is the id of its creation message.
    let thread_id = chat.allocate_message_id();
    chat.topics.insert(
        thread_id,
        Topic {
            name: name.clone(),
            icon_color,
            closed: false,
            deleted: false,
        },
    );
    chat.messages.push(service_message(
        thread_id,
        thread_id,
        "forum_topic_created",
        json!({"name": name, "icon_color": icon_color}),
    ));
    Ok(json!({"message_thread_id": thread_id, "name": name, "icon_color": icon_color}))
}

fn edit_forum_topic(inner: &mut Inner, params: &Value) -> Answer {
    let name = topic_name(params, false)?;
    let icon_emoji = string(params, "icon_custom_emoji_id");
    let chat = chat(inner, params)?;
    let (thread_id, topic) = live_topic(chat, params)?;
    let renamed = name.as_ref().is_some_and(|n| *n != topic.name);
    if !renamed && icon_emoji.is_none() {
        return Err(ApiError::bad_request("TOPIC_NOT_MODIFIED"));
    }
    let mut payload = Map::new();
    if let Some(name) = name.filter(|_| renamed) {
        topic.name = name.clone();
        payload.insert("name".to_owned(), json!(name));
    }
    if let Some(emoji) = icon_emoji {
        payload.insert("icon_custom_emoji_id".to_owned(), json!(emoji));
    }
    push_service(
        chat,
        thread_id,
        "forum_topic_edited",
        Value::Object(payload),
    );
    Ok(json!(true))
}

fn set_topic_closed(inner: &mut Inner, params: &Value, closed: bool) -> Answer {
    let chat = chat(inner, params)?;
    let (thread_id, topic) = live_topic(chat, params)?;
    if topic.closed == closed {
        return Err(ApiError::bad_request("TOPIC_NOT_MODIFIED"));
    }
    topic.closed = closed;
    let kind = if closed {
        "forum_topic_closed"
    } else {
        "forum_topic_reopened"
    };
    push_service(chat, thread_id, kind, json!({}));
    Ok(json!(true))
}

fn delete_forum_topic(inner: &mut Inner, params: &Value) -> Answer {
    let chat = chat(inner, params)?;
    if matches!(chat.kind, ChatKind::Supergroup { .. }) && !chat.rights.can_delete_messages {
        return Err(ApiError::bad_request("not enough rights to delete a topic"));
    }
    let (_, topic) = live_topic(chat, params)?;
    topic.deleted = true;
    Ok(json!(true))
}

//! The Bot API methods: parameters in, Telegram's `result` or error out.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use super::error::ApiError;
use super::files::{self, NewFile, Upload};
use super::html::{self, utf16_len};
use super::markup;
use super::state::{
    ActivePoll, Author, Chat, ChatKind, GENERAL_THREAD_ID, ICON_COLORS, Inner, Media,
    StoredMessage, Text, Topic,
};
use super::{CallbackAnswer, DraftRecord, FakeBotApi, MediaKind};

type Answer = Result<Value, ApiError>;

/// File parts of a multipart request, by part name.
pub(super) type Uploads = HashMap<String, Upload>;

/// Every method the fake implements, in Telegram's spelling.
const METHODS: [&str; 27] = [
    "getMe",
    "setWebhook",
    "deleteWebhook",
    "getWebhookInfo",
    "getUpdates",
    "sendMessage",
    "editMessageText",
    "editMessageReplyMarkup",
    "sendPhoto",
    "sendDocument",
    "sendVoice",
    "sendAudio",
    "getFile",
    "sendChatAction",
    "sendMessageDraft",
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
    "setMessageReaction",
];

/// Telegram matches method names case-insensitively.
pub(super) fn canonical(method: &str) -> Option<&'static str> {
    METHODS.into_iter().find(|m| m.eq_ignore_ascii_case(method))
}

pub(super) async fn dispatch(
    api: &FakeBotApi,
    method: &'static str,
    params: &Value,
    uploads: &Uploads,
) -> Answer {
    if method == "getUpdates" {
        return get_updates(api, params, Hearing::Normal).await;
    }
    let lacks = api.mutate(|inner| inner.config.lacking.iter().any(|m| m == method));
    if lacks {
        // What telegram-bot-api answers for a method it does not know.
        return Err(ApiError::new(404, "Not Found: method not found"));
    }
    api.mutate(|inner| match method {
        "getMe" => Ok(get_me(inner)),
        "setWebhook" => set_webhook(inner, params),
        "deleteWebhook" => delete_webhook(inner, params),
        "getWebhookInfo" => Ok(json!({
            "url": inner.webhook.clone().unwrap_or_default(),
            "has_custom_certificate": false,
            "pending_update_count": inner.updates.len(),
        })),
        "sendMessage" => send_message(inner, params),
        "editMessageText" => edit_message_text(inner, params),
        "editMessageReplyMarkup" => edit_message_reply_markup(inner, params),
        "sendPhoto" => send_media(inner, method, params, uploads, MediaKind::Photo),
        "sendDocument" => send_media(inner, method, params, uploads, MediaKind::Document),
        "sendVoice" => send_media(inner, method, params, uploads, MediaKind::Voice),
        "sendAudio" => send_media(inner, method, params, uploads, MediaKind::Audio),
        "getFile" => get_file(inner, params),
        "sendChatAction" => send_chat_action(inner, params),
        "sendMessageDraft" => send_message_draft(inner, params),
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
        "setMessageReaction" => set_message_reaction(inner, params),
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
    find_chat(&mut inner.chats, chat_id(params)?)
}

fn find_chat(chats: &mut BTreeMap<i64, Chat>, chat_id: i64) -> Result<&mut Chat, ApiError> {
    chats
        .get_mut(&chat_id)
        .ok_or_else(|| ApiError::bad_request("chat not found"))
}

fn thread_not_found() -> ApiError {
    ApiError::bad_request("message thread not found")
}

/// Checks that a send or chat action may target `thread_id` in `chat`. Thread 1
/// is the General topic only in supergroups; a private chat has none, so there it
/// is just a thread that does not exist.
fn check_thread_for_send(
    chat: &Chat,
    thread_id: Option<i64>,
    bot_has_topics: bool,
) -> Result<(), ApiError> {
    let Some(thread_id) = thread_id else {
        return Ok(());
    };
    if !chat.has_topics(bot_has_topics) || (!chat.is_private() && thread_id == GENERAL_THREAD_ID) {
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
    if !chat.is_private() && thread_id == GENERAL_THREAD_ID {
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
        "allows_users_to_create_topics": inner.config.allows_users_to_create_topics,
    });
    if let (Some(me), Value::Object(extra)) = (me.as_object_mut(), extra) {
        me.extend(extra);
    }
    me
}

/// Another program's webhook: while one is set, `getUpdates` is refused.
/// An empty `url` removes it, as Telegram's does; any other must be HTTPS.
fn set_webhook(inner: &mut Inner, params: &Value) -> Answer {
    let url = string(params, "url").unwrap_or_default();
    if url.is_empty() {
        return delete_webhook(inner, params);
    }
    if !url.starts_with("https://") {
        return Err(ApiError::bad_request(
            "bad webhook: An HTTPS URL must be provided for webhook",
        ));
    }
    inner.webhook = Some(url);
    if boolean(params, "drop_pending_updates") {
        inner.updates.clear();
    }
    Ok(json!(true))
}

fn delete_webhook(inner: &mut Inner, params: &Value) -> Answer {
    inner.webhook = None;
    if boolean(params, "drop_pending_updates") {
        inner.updates.clear();
    }
    Ok(json!(true))
}

/// Whether `getUpdates` hears the queue. A deaf poll (the `Deaf` fault) answers
/// an empty list and confirms nothing, so updates pile up while the poller looks
/// alive; it still counts as a poll and still conflicts with others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hearing {
    Normal,
    /// Empty after the requested timeout.
    Deaf,
    /// Empty at once.
    DeafAtOnce,
}

pub(super) async fn get_updates(api: &FakeBotApi, params: &Value, hearing: Hearing) -> Answer {
    if api.mutate(|inner| inner.webhook.is_some()) {
        return Err(ApiError::new(
            409,
            "Conflict: can't use getUpdates method while webhook is active; \
             use deleteWebhook to delete the webhook first",
        ));
    }
    let offset = int(params, "offset")?.unwrap_or(0);
    let limit = usize::try_from(int(params, "limit")?.unwrap_or(100).clamp(1, 100)).unwrap_or(100);
    let mut timeout = int(params, "timeout")?.unwrap_or(0).clamp(0, 3600);
    let allowed = list(params, "allowed_updates")?;
    let short_poll = timeout == 0;
    if hearing == Hearing::DeafAtOnce {
        timeout = 0;
    }
    let deaf = hearing != Hearing::Normal;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout.unsigned_abs());
    let mut changed = api.shared.changed.subscribe();
    let (terminate, mut terminated) = oneshot::channel();
    let poll_id = api.mutate(|inner| {
        if !deaf {
            if let Some(kinds) = allowed {
                let kinds: Vec<String> = kinds
                    .iter()
                    .filter_map(|k| k.as_str().map(str::to_owned))
                    .collect();
                // An empty list means "the default set" again.
                inner.allowed_updates = (!kinds.is_empty()).then_some(kinds);
            }
            inner.confirm(offset);
        }
        inner.start_poll(terminate, short_poll)
    });
    // Ends the poll's registration however this call ends, also when the client
    // hangs up and the server drops this future mid-wait.
    let mut registration = PollRegistration {
        api,
        id: poll_id,
        open: true,
    };
    let shutdown = api.shared.shutdown.clone();
    loop {
        changed.borrow_and_update();
        let batch = {
            let mut inner = api.lock();
            let batch: Vec<Value> = if deaf {
                Vec::new()
            } else {
                inner
                    .updates
                    .iter()
                    .filter(|(id, _)| offset <= 0 || *id >= offset)
                    .take(limit)
                    .map(|(_, update)| update.clone())
                    .collect()
            };
            let done = !batch.is_empty()
                || tokio::time::Instant::now() >= deadline
                || shutdown.is_cancelled();
            if done {
                // Under the same lock as the check: a poll arriving after this
                // answer was decided does not count as overlapping it.
                inner.end_poll(poll_id);
                registration.open = false;
            }
            done.then_some(batch)
        };
        if let Some(batch) = batch {
            api.notify();
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

struct PollRegistration<'a> {
    api: &'a FakeBotApi,
    id: u64,
    open: bool,
}

impl Drop for PollRegistration<'_> {
    fn drop(&mut self) {
        if self.open {
            self.api.mutate(|inner| inner.end_poll(self.id));
        }
    }
}

impl Inner {
    /// What this server knows of buttons.
    fn server(&self) -> markup::Server {
        markup::Server {
            disabled_buttons: self.config.disabled_buttons,
        }
    }

    /// Registers a poll as the one poller, terminating an older one (an overlap).
    fn start_poll(&mut self, terminate: oneshot::Sender<()>, short_poll: bool) -> u64 {
        self.polls.polls += 1;
        if let Some(older) = self.active_poll.take() {
            self.polls.overlaps += 1;
            if short_poll {
                self.polls.short_poll_overlaps += 1;
            }
            // The receiver may be gone if that poll already answered; nothing to do then.
            let _ = older.terminate.send(());
        }
        self.polls.open_now += 1;
        self.polls.max_open = self.polls.max_open.max(self.polls.open_now);
        let id = self.next_poll_id;
        self.next_poll_id += 1;
        self.active_poll = Some(ActivePoll { id, terminate });
        id
    }

    fn end_poll(&mut self, id: u64) {
        self.polls.open_now = self.polls.open_now.saturating_sub(1);
        if self.active_poll.as_ref().is_some_and(|p| p.id == id) {
            self.active_poll = None;
        }
    }
}

/// Text or a caption, validated and parsed as Telegram does. Captions may be
/// empty; texts may not.
fn parse_text(params: &Value, key: &str) -> Result<Text, ApiError> {
    let caption = key == "caption";
    let raw = string(params, key).unwrap_or_default();
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
    if caption {
        if utf16_len(&parsed.text) > MAX_CAPTION {
            return Err(ApiError::bad_request("message caption is too long"));
        }
    } else if parsed.text.trim().is_empty() {
        return Err(ApiError::bad_request("message text is empty"));
    } else if utf16_len(&parsed.text) > MAX_TEXT {
        return Err(ApiError::bad_request("message is too long"));
    }
    Ok(Text {
        raw,
        parse_mode,
        plain: parsed.text,
        entities: parsed.entities,
    })
}

/// Longest text and caption, in UTF-16 units after entity parsing.
pub(super) const MAX_TEXT: usize = 4096;
pub(super) const MAX_CAPTION: usize = 1024;

/// Where a new bot message goes, checked: a known chat, a usable thread, and the
/// message it replies to.
struct Target {
    chat_id: i64,
    thread_id: Option<i64>,
    reply_to: Option<i64>,
}

fn send_target(inner: &Inner, params: &Value) -> Result<Target, ApiError> {
    let chat_id = chat_id(params)?;
    let mut thread_id = int(params, "message_thread_id")?;
    let chat = inner
        .chats
        .get(&chat_id)
        .ok_or_else(|| ApiError::bad_request("chat not found"))?;
    let (reply_to, allow_without) = match params.get("reply_parameters") {
        Some(Value::String(s)) if !s.is_empty() => {
            let reply: Value = serde_json::from_str(s)
                .map_err(|_| ApiError::bad_request("can't parse reply parameters JSON object"))?;
            (
                int(&reply, "message_id")?,
                boolean(&reply, "allow_sending_without_reply"),
            )
        }
        Some(reply @ Value::Object(_)) => (
            int(reply, "message_id")?,
            boolean(reply, "allow_sending_without_reply"),
        ),
        _ => (
            int(params, "reply_to_message_id")?,
            boolean(params, "allow_sending_without_reply"),
        ),
    };
    let replied = reply_to.and_then(|id| chat.message(id));
    let reply_to = match (reply_to, replied) {
        (Some(_), None) if !allow_without => {
            return Err(ApiError::bad_request("message to be replied not found"));
        }
        (_, replied) => replied.map(|m| m.message_id),
    };
    // A reply goes into the topic of the message it answers.
    if thread_id.is_none() && chat.has_topics(inner.config.has_topics_enabled) {
        thread_id = replied.and_then(|m| m.thread_id);
    }
    check_thread_for_send(chat, thread_id, inner.config.has_topics_enabled)?;
    Ok(Target {
        chat_id,
        thread_id,
        reply_to,
    })
}

/// Telegram's send limits: 1/s per private chat, 20/min per group, 30/s overall;
/// edits spend the same budgets. A refused call does not count against any.
fn pace(global: &mut VecDeque<Instant>, chat: &mut Chat, enforce: bool) -> Result<(), ApiError> {
    if !enforce {
        return Ok(());
    }
    let now = Instant::now();
    let (window, max) = if chat.is_private() {
        (Duration::from_secs(1), 1)
    } else {
        (Duration::from_secs(60), 20)
    };
    let wait_for = |log: &mut VecDeque<Instant>, window: Duration, max: usize| {
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
        chat.counters.rate_limited += 1;
        return Err(ApiError::too_many_requests(
            u64::try_from(seconds).unwrap_or(u64::MAX),
        ));
    }
    global.push_back(now);
    chat.sends.push_back(now);
    Ok(())
}

/// The file a new bot message carries.
enum Attachment {
    None,
    New(NewFile),
    /// Sent again by `file_id`: the same files, photo sizes and all.
    Reused(Media),
}

/// Stores a new bot message at `target` once pacing admits it; answers its
/// message object.
fn deliver(
    inner: &mut Inner,
    target: &Target,
    mut message: StoredMessage,
    attachment: Attachment,
    method: &str,
) -> Answer {
    let enforce = inner.config.rate_limits;
    let now_ms = inner.now_ms();
    let bot = inner.bot_user_json();
    let message_id = {
        let Inner { chats, sends, .. } = &mut *inner;
        let chat = find_chat(chats, target.chat_id)?;
        pace(sends, chat, enforce)?;
        chat.counters.sent += 1;
        chat.next_message_id
    };
    message.media = match attachment {
        Attachment::None => None,
        Attachment::New(file) => Some(inner.add_media(file, true, target.chat_id, message_id)),
        Attachment::Reused(media) => Some(media),
    };
    message.thread_id = target.thread_id;
    message.reply_to = target.reply_to;
    message.record_version(method, now_ms);
    let Inner { chats, users, .. } = &mut *inner;
    let chat = find_chat(chats, target.chat_id)?;
    Ok(chat.post(message, &bot, users).1)
}

fn send_message(inner: &mut Inner, params: &Value) -> Answer {
    let text = parse_text(params, "text")?;
    let reply_markup = markup::reply_markup(params, inner.server())?;
    let target = send_target(inner, params)?;
    let mut message = StoredMessage::new(Author::Bot, target.thread_id);
    message.text = text;
    message.reply_markup = reply_markup;
    let sent = deliver(inner, &target, message, Attachment::None, "sendMessage")?;
    // The message a draft was the preview of takes its place.
    if let Some(message_id) = sent.get("message_id").and_then(Value::as_i64) {
        for draft in inner.drafts.iter_mut().filter(|d| {
            d.chat_id == target.chat_id
                && d.thread_id == target.thread_id
                && d.replaced_by.is_none()
        }) {
            draft.replaced_by = Some(message_id);
        }
    }
    Ok(sent)
}

/// `sendMessageDraft`: a partial message, in a private chat only (its
/// topics included); `draft_id` not 0; the text 0–4096 units after
/// parsing, "" showing "Thinking…". The same id in the same thread
/// changes the draft it names; a stopped one stays stopped.
fn send_message_draft(inner: &mut Inner, params: &Value) -> Answer {
    let bot_has_topics = inner.config.has_topics_enabled;
    let thread_id = int(params, "message_thread_id")?;
    let draft_id = int(params, "draft_id")?.unwrap_or(0);
    let can_stop = boolean(params, "can_stop");
    let empty = string(params, "text").unwrap_or_default().is_empty();
    let text = if empty {
        String::new()
    } else {
        parse_text(params, "text")?.plain
    };
    let chat_id = {
        let chat = chat(inner, params)?;
        if !chat.is_private() {
            return Err(ApiError::bad_request(
                "draft can be sent only to private chats",
            ));
        }
        check_thread_for_send(chat, thread_id, bot_has_topics)?;
        chat.id
    };
    if draft_id == 0 {
        return Err(ApiError::bad_request("draft_id must be non-zero"));
    }
    let now_ms = inner.now_ms();
    let same = |d: &&mut DraftRecord| {
        d.chat_id == chat_id
            && d.thread_id == thread_id
            && d.draft_id == draft_id
            && d.replaced_by.is_none()
    };
    match inner.drafts.iter_mut().rev().find(same) {
        Some(draft) => {
            draft.texts.push(text);
            draft.can_stop = can_stop;
            draft.updated_ms = now_ms;
        }
        None => inner.drafts.push(DraftRecord {
            chat_id,
            thread_id,
            draft_id,
            texts: vec![text],
            can_stop,
            updated_ms: now_ms,
            stopped: false,
            replaced_by: None,
        }),
    }
    Ok(json!(true))
}

/// `sendPhoto`, `sendDocument`, `sendVoice`, `sendAudio`: the file comes as a
/// multipart part with a file name (named like the parameter, or
/// `attach://<part>`), or as the `file_id` of a file Telegram already has.
fn send_media(
    inner: &mut Inner,
    method: &str,
    params: &Value,
    uploads: &Uploads,
    kind: MediaKind,
) -> Answer {
    let field = kind.field();
    let missing = || ApiError::bad_request(format!("there is no {field} in the request"));
    let reference = params
        .get(field)
        .and_then(Value::as_str)
        .unwrap_or_default();
    let upload = match reference.strip_prefix("attach://") {
        Some(part) => Some(uploads.get(part).ok_or_else(missing)?),
        None if reference.is_empty() => uploads.get(field),
        None => None,
    };
    // The size limit is enforced in front of the API, before anything is read.
    if upload.is_some_and(|u| u.bytes.len() as u64 > kind.upload_limit()) {
        return Err(ApiError::too_large());
    }
    let caption = parse_text(params, "caption")?;
    let reply_markup = markup::reply_markup(params, inner.server())?;
    let target = send_target(inner, params)?;
    let attachment = if let Some(upload) = upload {
        if kind == MediaKind::Photo && !files::looks_like_image(&upload.bytes) {
            return Err(ApiError::bad_request("IMAGE_PROCESS_FAILED"));
        }
        let duration = int(params, "duration")?.and_then(|d| u32::try_from(d).ok());
        Attachment::New(NewFile::uploaded(kind, upload.clone(), duration))
    } else if reference.starts_with("http://") || reference.starts_with("https://") {
        // Telegram would fetch it; the fake reaches nothing outside.
        return Err(ApiError::bad_request("failed to get HTTP URL content"));
    } else if !reference.is_empty() {
        Attachment::Reused(reused_media(inner, reference, kind)?)
    } else {
        return Err(missing());
    };
    let mut message = StoredMessage::new(Author::Bot, target.thread_id);
    message.text = caption;
    message.reply_markup = reply_markup;
    deliver(inner, &target, message, attachment, method)
}

/// The media of the message that first carried `file_id`.
fn reused_media(inner: &Inner, file_id: &str, kind: MediaKind) -> Result<Media, ApiError> {
    let unknown = || ApiError::bad_request("wrong file identifier/HTTP URL specified");
    let file = inner.file(file_id).ok_or_else(unknown)?;
    if file.kind != kind {
        return Err(ApiError::bad_request("type of file mismatch"));
    }
    inner
        .chats
        .get(&file.chat_id)
        .and_then(|chat| chat.message(file.message_id))
        .and_then(|message| message.media.clone())
        .ok_or_else(unknown)
}

fn get_file(inner: &mut Inner, params: &Value) -> Answer {
    let file_id = string(params, "file_id").unwrap_or_default();
    if file_id.is_empty() {
        return Err(ApiError::bad_request("file_id is empty"));
    }
    let invalid = || ApiError::bad_request("invalid file_id");
    if inner.file(&file_id).ok_or_else(invalid)?.file_size > files::DOWNLOAD_MAX {
        return Err(ApiError::bad_request("file is too big"));
    }
    let file = inner.file_with_path(&file_id).ok_or_else(invalid)?;
    Ok(json!({
        "file_id": file.file_id,
        "file_unique_id": file.file_unique_id,
        "file_size": file.file_size,
        "file_path": file.file_path,
    }))
}

/// Applies an edit to the bot's own message (in a chat and thread that still
/// exist) once pacing admits it; `change` refuses what Telegram would refuse.
fn edit(
    inner: &mut Inner,
    params: &Value,
    method: &str,
    change: impl FnOnce(&mut StoredMessage) -> Result<(), ApiError>,
) -> Answer {
    if params.get("inline_message_id").is_some() {
        return Err(ApiError::bad_request(
            "inline messages are not supported by the fake",
        ));
    }
    let chat_id = chat_id(params)?;
    let message_id = required_int(params, "message_id")?;
    let enforce = inner.config.rate_limits;
    let now_ms = inner.now_ms();
    let bot = inner.bot_user_json();
    let Inner {
        chats,
        sends,
        users,
        ..
    } = &mut *inner;
    let chat = find_chat(chats, chat_id)?;
    let index = chat
        .message_index(message_id)
        .filter(|i| chat.messages[*i].service.is_none())
        .ok_or_else(|| ApiError::bad_request("message to edit not found"))?;
    let mut message = chat.messages[index].clone();
    if let Some(thread_id) = message.thread_id
        && chat.topics.get(&thread_id).is_none_or(|t| t.deleted)
    {
        return Err(thread_not_found());
    }
    if !matches!(message.author, Author::Bot) {
        return Err(ApiError::bad_request("message can't be edited"));
    }
    change(&mut message)?;
    pace(sends, chat, enforce)?;
    chat.counters.edited += 1;
    message.edited = true;
    message.record_version(method, now_ms);
    chat.messages[index] = message;
    Ok(chat.message_json(&chat.messages[index], &bot, users))
}

fn not_modified() -> ApiError {
    ApiError::bad_request(
        "message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message",
    )
}

/// Replaces the text; the buttons become what the call carries, so an edit
/// without `reply_markup` removes them, as on Telegram.
fn edit_message_text(inner: &mut Inner, params: &Value) -> Answer {
    let text = parse_text(params, "text")?;
    let reply_markup = markup::inline_markup_for_edit(params, inner.server())?;
    edit(inner, params, "editMessageText", |message| {
        if message.media.is_some() {
            return Err(ApiError::bad_request(
                "there is no text in the message to edit",
            ));
        }
        if message.text.plain == text.plain
            && message.text.entities == text.entities
            && message.reply_markup == reply_markup
        {
            return Err(not_modified());
        }
        message.text = text;
        message.reply_markup = reply_markup;
        Ok(())
    })
}

fn edit_message_reply_markup(inner: &mut Inner, params: &Value) -> Answer {
    let reply_markup = markup::inline_markup_for_edit(params, inner.server())?;
    edit(inner, params, "editMessageReplyMarkup", |message| {
        if message.reply_markup == reply_markup {
            return Err(not_modified());
        }
        message.reply_markup = reply_markup;
        Ok(())
    })
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

/// Longest `answerCallbackQuery` text.
const MAX_CALLBACK_ANSWER: usize = 200;

/// The emoji a bot may react with: Telegram's fixed list (Bot API
/// `ReactionTypeEmoji`), as far as the relay and its tests use it.
const REACTIONS: [&str; 12] = [
    "👍", "👎", "❤", "🔥", "🎉", "🤔", "👀", "👌", "💔", "🤷", "✍", "😢",
];

/// `setMessageReaction`: the bot's one reaction on a message (bots set at
/// most one; an empty list takes it away). A message of a media group is
/// reacted to on the group's first message, as Telegram does; service
/// messages cannot be reacted to.
fn set_message_reaction(inner: &mut Inner, params: &Value) -> Answer {
    let chat_id = chat_id(params)?;
    let message_id = params
        .get("message_id")
        .and_then(Value::as_i64)
        .ok_or_else(|| ApiError::bad_request("message_id is required"))?;
    let reaction = match params.get("reaction") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(list)) => list.clone(),
        Some(_) => {
            return Err(ApiError::bad_request(
                "can't parse reaction types JSON object",
            ));
        }
    };
    if reaction.len() > 1 {
        return Err(ApiError::bad_request("REACTIONS_TOO_MANY"));
    }
    let emoji = match reaction.first() {
        None => None,
        Some(r) if r.get("type").and_then(Value::as_str) == Some("emoji") => {
            let emoji = r.get("emoji").and_then(Value::as_str).unwrap_or_default();
            if !REACTIONS.contains(&emoji) {
                return Err(ApiError::bad_request("REACTION_INVALID"));
            }
            Some(emoji.to_string())
        }
        Some(_) => return Err(ApiError::bad_request("REACTION_INVALID")),
    };
    let chat = inner
        .chats
        .get_mut(&chat_id)
        .ok_or_else(|| ApiError::bad_request("chat not found"))?;
    let first_of_group = chat
        .message(message_id)
        .and_then(|m| m.media_group_id.clone())
        .and_then(|group| {
            chat.messages
                .iter()
                .find(|m| m.media_group_id.as_deref() == Some(group.as_str()))
                .map(|m| m.message_id)
        });
    let index = chat
        .message_index(first_of_group.unwrap_or(message_id))
        .ok_or_else(|| ApiError::bad_request("message to react not found"))?;
    let message = &mut chat.messages[index];
    if message.service.is_some() {
        return Err(ApiError::bad_request("MESSAGE_NOT_MODIFIED"));
    }
    message.reactions.push(emoji);
    Ok(json!(true))
}

fn answer_callback_query(inner: &mut Inner, params: &Value) -> Answer {
    let id = string(params, "callback_query_id").unwrap_or_default();
    if id.is_empty() {
        return Err(ApiError::bad_request("callback_query_id is empty"));
    }
    let text = string(params, "text").filter(|t| !t.is_empty());
    let show_alert = boolean(params, "show_alert");
    let url = string(params, "url").filter(|u| !u.is_empty());
    let answered_ms = inner.now_ms();
    // Unknown and already answered ids read the same: Telegram forgets a query
    // once it is answered.
    let query = inner
        .callback_queries
        .iter_mut()
        .find(|q| q.callback_query_id == id && q.answer.is_none())
        .ok_or_else(|| {
            ApiError::bad_request(
                "query is too old and response timeout expired or query ID is invalid",
            )
        })?;
    if text
        .as_ref()
        .is_some_and(|t| t.chars().count() > MAX_CALLBACK_ANSWER)
    {
        return Err(ApiError::bad_request("MESSAGE_TOO_LONG"));
    }
    query.answer = Some(CallbackAnswer {
        text,
        show_alert,
        url,
        answered_ms,
    });
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
    let thread_id = chat.open_topic(&name, icon_color, Author::Bot);
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
    chat.push_service(thread_id, "forum_topic_edited", Value::Object(payload));
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
    chat.push_service(thread_id, kind, json!({}));
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

//! The simulated Telegram side: chats, topics, messages, the update queue, the
//! fault plan and the call record. Everything lives behind one mutex that is never
//! held across an `.await`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};
use tokio::sync::oneshot;

use super::{
    BotRights, CallRecord, CallbackQueryRecord, ChatCounters, DownloadRecord, DraftRecord,
    FakeConfig, Fault, FileRecord, MediaKind, MessageVersion, PollStats, SentMedia, SentMessage,
    TopicInfo,
};

/// Icon colours Telegram accepts for forum topics.
pub(super) const ICON_COLORS: [i64; 6] =
    [0x6FB9F0, 0xFFD67E, 0xCB86DB, 0x8EEE98, 0xFF93B2, 0xFB6F5F];

/// The thread id of the General topic in a forum supergroup.
pub(super) const GENERAL_THREAD_ID: i64 = 1;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ChatKind {
    Private { first_name: String },
    Supergroup { title: String, is_forum: bool },
}

#[derive(Debug, Clone)]
pub(super) struct Topic {
    pub name: String,
    pub icon_color: i64,
    pub closed: bool,
    pub deleted: bool,
}

#[derive(Debug, Clone)]
pub(super) enum Author {
    Bot,
    User(i64),
}

/// Text as Telegram stores it: what the sender wrote and what it parsed into.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct Text {
    /// The text as the sender wrote it (markup included).
    pub raw: String,
    pub parse_mode: Option<String>,
    pub plain: String,
    pub entities: Vec<Value>,
}

/// The file(s) a message carries.
#[derive(Debug, Clone)]
pub(super) struct Media {
    pub kind: MediaKind,
    /// Smallest first: a photo has several sizes, every other kind one file.
    pub file_ids: Vec<String>,
    /// The fields the message object carries (`photo`, or `document`, …).
    pub fields: Map<String, Value>,
}

#[derive(Debug, Clone)]
pub(super) struct StoredMessage {
    pub message_id: i64,
    pub thread_id: Option<i64>,
    pub author: Author,
    /// The text, or the caption of a message with `media`.
    pub text: Text,
    pub date: i64,
    pub edited: bool,
    /// Only inline keyboards appear in the message object; other markup (a
    /// `force_reply`, a reply keyboard) is kept for inspection.
    pub reply_markup: Option<Value>,
    pub reply_to: Option<i64>,
    pub media: Option<Media>,
    pub media_group_id: Option<String>,
    /// Service messages (`forum_topic_created`, …) carry their payload here.
    pub service: Option<(&'static str, Value)>,
    /// The bot's messages: every version, oldest first.
    pub history: Vec<MessageVersion>,
    /// The bot's reaction on it (bots set at most one), and every one it
    /// set, oldest first.
    pub reactions: Vec<Option<String>>,
}

impl StoredMessage {
    /// An empty message; the chat assigns its id when it is stored.
    pub fn new(author: Author, thread_id: Option<i64>) -> Self {
        Self {
            message_id: 0,
            thread_id,
            author,
            text: Text::default(),
            date: unix_now(),
            edited: false,
            reply_markup: None,
            reply_to: None,
            media: None,
            media_group_id: None,
            service: None,
            history: Vec::new(),
            reactions: Vec::new(),
        }
    }

    /// Appends the current state to the history (bot messages only).
    pub fn record_version(&mut self, method: &str, at_ms: u64) {
        self.history.push(MessageVersion {
            method: method.to_owned(),
            text: self.text.raw.clone(),
            plain_text: self.text.plain.clone(),
            reply_markup: self.reply_markup.clone(),
            at_ms,
        });
    }
}

#[derive(Debug)]
pub(super) struct Chat {
    pub id: i64,
    pub kind: ChatKind,
    pub rights: BotRights,
    /// Telegram numbers messages per chat; a topic's thread id is the id of its
    /// `forum_topic_created` message, so both come from this counter.
    pub next_message_id: i64,
    pub topics: BTreeMap<i64, Topic>,
    /// In id order (ids are allocated and stored together), so lookups can
    /// binary-search.
    pub messages: Vec<StoredMessage>,
    /// Bot sends and edits accepted in this chat, for the rate limiter.
    pub sends: VecDeque<Instant>,
    pub counters: ChatCounters,
}

impl Chat {
    pub fn new(id: i64, kind: ChatKind, rights: BotRights) -> Self {
        Self {
            id,
            kind,
            rights,
            // Message 1 is the chat's creation; it keeps topic ids clear of the
            // General topic's id 1.
            next_message_id: 2,
            topics: BTreeMap::new(),
            messages: Vec::new(),
            sends: VecDeque::new(),
            counters: ChatCounters {
                chat_id: id,
                ..ChatCounters::default()
            },
        }
    }

    /// Gives `message` the next id and stores it; returns the id.
    pub fn store(&mut self, mut message: StoredMessage) -> i64 {
        let id = self.next_message_id;
        self.next_message_id += 1;
        message.message_id = id;
        self.messages.push(message);
        id
    }

    /// Opens a topic; its thread id is the id of its `forum_topic_created`
    /// message, which is why thread ids are never 1 (the General topic).
    pub fn open_topic(&mut self, name: &str, icon_color: i64, author: Author) -> i64 {
        let thread_id = self.next_message_id;
        self.topics.insert(
            thread_id,
            Topic {
                name: name.to_owned(),
                icon_color,
                closed: false,
                deleted: false,
            },
        );
        let mut created = StoredMessage::new(author, Some(thread_id));
        created.service = Some((
            "forum_topic_created",
            json!({"name": name, "icon_color": icon_color}),
        ));
        self.store(created)
    }

    /// A service message of the bot's (`forum_topic_closed`, …) in a topic.
    pub fn push_service(&mut self, thread_id: i64, kind: &'static str, payload: Value) {
        let mut message = StoredMessage::new(Author::Bot, Some(thread_id));
        message.service = Some((kind, payload));
        self.store(message);
    }

    /// Stores `message` under the next id; returns the id and its message object.
    pub fn post(
        &mut self,
        message: StoredMessage,
        bot: &Value,
        users: &HashMap<i64, String>,
    ) -> (i64, Value) {
        let id = self.store(message);
        let json = self
            .messages
            .last()
            .map_or(Value::Null, |stored| self.message_json(stored, bot, users));
        (id, json)
    }

    pub fn message_index(&self, message_id: i64) -> Option<usize> {
        self.messages
            .binary_search_by_key(&message_id, |m| m.message_id)
            .ok()
    }

    pub fn message(&self, message_id: i64) -> Option<&StoredMessage> {
        self.message_index(message_id).map(|i| &self.messages[i])
    }

    /// Whether topics can exist here: a forum supergroup, or a private chat when
    /// the bot has topics enabled.
    pub fn has_topics(&self, bot_has_topics: bool) -> bool {
        match &self.kind {
            ChatKind::Private { .. } => bot_has_topics,
            ChatKind::Supergroup { is_forum, .. } => *is_forum,
        }
    }

    pub fn is_private(&self) -> bool {
        matches!(self.kind, ChatKind::Private { .. })
    }

    pub fn json(&self) -> Value {
        match &self.kind {
            ChatKind::Private { first_name } => {
                json!({"id": self.id, "type": "private", "first_name": first_name})
            }
            ChatKind::Supergroup { title, is_forum } => {
                let mut chat = json!({"id": self.id, "type": "supergroup", "title": title});
                if *is_forum {
                    chat["is_forum"] = json!(true);
                }
                chat
            }
        }
    }

    /// The `Message` object Telegram sends for `message`, with the message it
    /// replies to nested one level deep (as Telegram does).
    pub fn message_json(
        &self,
        message: &StoredMessage,
        bot: &Value,
        users: &HashMap<i64, String>,
    ) -> Value {
        let mut out = self.message_json_flat(message, bot, users);
        let replied = message.reply_to.and_then(|id| self.message(id));
        if let Some(replied) = replied {
            out["reply_to_message"] = self.message_json_flat(replied, bot, users);
        } else if let Some(thread_id) = message.thread_id
            && message.service.is_none()
            && let Some(topic) = self.topics.get(&thread_id)
        {
            // Telegram shows a topic message as a reply to the topic's creation
            // unless it replies to something else.
            out["reply_to_message"] = json!({
                "message_id": thread_id,
                "from": bot,
                "chat": self.json(),
                "date": message.date,
                "message_thread_id": thread_id,
                "forum_topic_created": {"name": topic.name, "icon_color": topic.icon_color},
                "is_topic_message": true,
            });
        }
        out
    }

    fn message_json_flat(
        &self,
        message: &StoredMessage,
        bot: &Value,
        users: &HashMap<i64, String>,
    ) -> Value {
        let from = match message.author {
            Author::Bot => bot.clone(),
            Author::User(id) => user_json(id, users),
        };
        let mut out = json!({
            "message_id": message.message_id,
            "from": from,
            "chat": self.json(),
            "date": message.date,
        });
        if let Some(thread_id) = message.thread_id {
            out["message_thread_id"] = json!(thread_id);
            out["is_topic_message"] = json!(true);
        }
        if let Some(group) = &message.media_group_id {
            out["media_group_id"] = json!(group);
        }
        let text = &message.text;
        if let Some((kind, payload)) = &message.service {
            out[*kind] = payload.clone();
        } else if let Some(media) = &message.media {
            for (field, value) in &media.fields {
                out[field] = value.clone();
            }
            if !text.plain.is_empty() {
                out["caption"] = json!(text.plain);
            }
            if !text.entities.is_empty() {
                out["caption_entities"] = json!(text.entities);
            }
        } else {
            out["text"] = json!(text.plain);
            if !text.entities.is_empty() {
                out["entities"] = json!(text.entities);
            }
        }
        if message.edited {
            out["edit_date"] = json!(message.date);
        }
        if let Some(markup) = message
            .reply_markup
            .as_ref()
            .filter(|m| m.get("inline_keyboard").is_some())
        {
            out["reply_markup"] = markup.clone();
        }
        out
    }

    pub fn topic_info(&self) -> Vec<TopicInfo> {
        self.topics
            .iter()
            .map(|(&thread_id, t)| TopicInfo {
                thread_id,
                name: t.name.clone(),
                icon_color: t.icon_color,
                closed: t.closed,
                deleted: t.deleted,
            })
            .collect()
    }

    pub fn sent_messages(&self, thread_id: Option<i64>) -> Vec<SentMessage> {
        self.messages
            .iter()
            .filter(|m| m.thread_id == thread_id)
            .filter_map(sent_message)
            .collect()
    }
}

/// The record of a message the bot sent; `None` for users' and service messages.
pub(super) fn sent_message(m: &StoredMessage) -> Option<SentMessage> {
    if !matches!(m.author, Author::Bot) || m.service.is_some() {
        return None;
    }
    Some(SentMessage {
        message_id: m.message_id,
        thread_id: m.thread_id,
        text: m.text.raw.clone(),
        parse_mode: m.text.parse_mode.clone(),
        plain_text: m.text.plain.clone(),
        entities: m.text.entities.clone(),
        date: m.date,
        edited: m.edited,
        reply_markup: m.reply_markup.clone(),
        reply_to_message_id: m.reply_to,
        media: m.media.as_ref().and_then(|media| {
            Some(SentMedia {
                kind: media.kind,
                file_id: media.file_ids.last()?.clone(),
            })
        }),
        history: m.history.clone(),
    })
}

pub(super) fn user_json(id: i64, users: &HashMap<i64, String>) -> Value {
    let first_name = users
        .get(&id)
        .cloned()
        .unwrap_or_else(|| format!("User {id}"));
    json!({"id": id, "is_bot": false, "first_name": first_name})
}

pub(super) fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The long poll currently waiting inside `getUpdates`; a newer poll fires
/// `terminate` so the older one answers 409, as Telegram does.
pub(super) struct ActivePoll {
    pub id: u64,
    pub terminate: oneshot::Sender<()>,
}

pub(super) struct PlannedFault {
    /// Lower-case method name, or `*` for every method.
    pub method: String,
    pub fault: Fault,
    /// `None`: until cleared.
    pub remaining: Option<u32>,
}

pub(super) struct Inner {
    pub config: FakeConfig,
    pub bot_id: i64,
    /// The zero of every `*_ms` time the fake reports.
    pub epoch: Instant,
    pub chats: BTreeMap<i64, Chat>,
    pub users: HashMap<i64, String>,
    /// Unconfirmed updates, oldest first: (update_id, update).
    pub updates: VecDeque<(i64, Value)>,
    pub next_update_id: i64,
    pub allowed_updates: Option<Vec<String>>,
    /// The webhook another program set (`setWebhook`), if any.
    pub webhook: Option<String>,
    pub active_poll: Option<ActivePoll>,
    pub next_poll_id: u64,
    pub polls: PollStats,
    pub faults: Vec<PlannedFault>,
    pub calls: Vec<CallRecord>,
    pub commands: Value,
    pub callback_queries: Vec<CallbackQueryRecord>,
    /// Every draft streamed, in the order it began.
    pub drafts: Vec<DraftRecord>,
    /// In the order they were made (few enough for linear look-ups).
    pub files: Vec<FileRecord>,
    /// Numbers file ids and download paths.
    pub next_file_number: u64,
    pub downloads: Vec<DownloadRecord>,
    /// Accepted bot sends and edits across all chats, for the 30/s limit.
    pub sends: VecDeque<Instant>,
}

/// Update kinds Telegram leaves out while `allowed_updates` is unset or empty.
const OPT_IN_KINDS: [&str; 4] = [
    "chat_member",
    "message_reaction",
    "message_reaction_count",
    "stopped_message_generation",
];

impl Inner {
    pub fn new(config: FakeConfig) -> Self {
        let bot_id = bot_id_of(&config.token).unwrap_or(0);
        Self {
            config,
            bot_id,
            epoch: Instant::now(),
            chats: BTreeMap::new(),
            users: HashMap::new(),
            updates: VecDeque::new(),
            // Update ids are not small integers in real life; starting high and
            // unpredictably catches code that assumes they start at 1.
            next_update_id: 100_000_000 + fastrand::i64(0..100_000_000),
            allowed_updates: None,
            webhook: None,
            active_poll: None,
            next_poll_id: 1,
            polls: PollStats::default(),
            faults: Vec::new(),
            calls: Vec::new(),
            commands: json!([]),
            callback_queries: Vec::new(),
            drafts: Vec::new(),
            files: Vec::new(),
            next_file_number: 1,
            downloads: Vec::new(),
            sends: VecDeque::new(),
        }
    }

    pub fn file(&self, file_id: &str) -> Option<&FileRecord> {
        self.files.iter().find(|f| f.file_id == file_id)
    }

    pub fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub fn bot_user_json(&self) -> Value {
        json!({
            "id": self.bot_id,
            "is_bot": true,
            "first_name": self.config.bot_first_name,
            "username": self.config.bot_username,
        })
    }

    /// Queues an update unless `allowed_updates` excludes its kind (Telegram
    /// filters when an update is created, not when it is fetched). The id is
    /// spent either way, so ids still reveal that something happened.
    pub fn push_update(&mut self, mut update: Value) -> i64 {
        let update_id = self.next_update_id;
        self.next_update_id += 1;
        let kind = update
            .as_object()
            .and_then(|o| o.keys().find(|k| *k != "update_id").cloned())
            .unwrap_or_default();
        let allowed = match &self.allowed_updates {
            Some(list) => list.contains(&kind),
            None => !OPT_IN_KINDS.contains(&kind.as_str()),
        };
        if allowed {
            update["update_id"] = json!(update_id);
            self.updates.push_back((update_id, update));
        }
        update_id
    }

    /// Applies `getUpdates`' offset: a positive offset confirms (forgets) every
    /// lower id; a negative one keeps only the last |offset| updates.
    pub fn confirm(&mut self, offset: i64) {
        if offset > 0 {
            while self.updates.front().is_some_and(|(id, _)| *id < offset) {
                self.updates.pop_front();
            }
        } else if offset < 0 {
            let keep = usize::try_from(offset.unsigned_abs()).unwrap_or(usize::MAX);
            while self.updates.len() > keep {
                self.updates.pop_front();
            }
        }
    }

    pub fn take_fault(&mut self, method: &str) -> Option<Fault> {
        let lower = method.to_ascii_lowercase();
        self.take_planned(|planned| planned == lower || planned == "*")
    }

    /// The next fault planned for file downloads (method `"download"`
    /// only: a `"*"` fault is for Bot API calls).
    pub fn take_download_fault(&mut self) -> Option<Fault> {
        self.take_planned(|planned| planned == "download")
    }

    fn take_planned(&mut self, matches: impl Fn(&str) -> bool) -> Option<Fault> {
        let index = self.faults.iter().position(|f| matches(&f.method))?;
        let planned = &mut self.faults[index];
        let fault = planned.fault.clone();
        if let Some(remaining) = &mut planned.remaining {
            *remaining = remaining.saturating_sub(1);
            if *remaining == 0 {
                self.faults.remove(index);
            }
        }
        Some(fault)
    }

    /// A file id and its `file_unique_id`, shaped like Telegram's (opaque,
    /// URL-safe, long) so code that assumes short or numeric ids fails here.
    pub fn new_file_ids(&mut self, kind: MediaKind) -> (String, String) {
        let n = self.next_file_number;
        self.next_file_number += 1;
        let salt = fastrand::u64(..);
        let prefix = match kind {
            MediaKind::Photo => "AgACAgIAAxkB",
            MediaKind::Voice => "AwACAgIAAxkB",
            MediaKind::Audio => "CQACAgIAAxkB",
            MediaKind::Video => "BAACAgIAAxkB",
            MediaKind::VideoNote => "DQACAgIAAxkB",
            MediaKind::Animation => "CgACAgIAAxkB",
            MediaKind::Sticker => "CAACAgIAAxkB",
            MediaKind::Document => "BQACAgIAAxkB",
        };
        (
            format!("{prefix}{n:08x}{salt:016x}_fake"),
            format!("AgAD{n:06x}{:04x}", salt & 0xffff),
        )
    }
}

/// The chat a user writes in; one the fake did not know is registered as Telegram
/// would already know it (private if `chat_id > 0`, else a plain supergroup).
pub(super) fn chat_entry<'a>(
    chats: &'a mut BTreeMap<i64, Chat>,
    users: &HashMap<i64, String>,
    chat_id: i64,
    user_id: i64,
) -> &'a mut Chat {
    chats.entry(chat_id).or_insert_with(|| {
        Chat::new(
            chat_id,
            implied_kind(users, chat_id, user_id),
            BotRights::default(),
        )
    })
}

/// The kind of a chat the fake was not told about: private if `chat_id > 0`.
pub(super) fn implied_kind(users: &HashMap<i64, String>, chat_id: i64, user_id: i64) -> ChatKind {
    if chat_id > 0 {
        let first_name = users
            .get(&user_id)
            .cloned()
            .unwrap_or_else(|| format!("User {user_id}"));
        ChatKind::Private { first_name }
    } else {
        ChatKind::Supergroup {
            title: format!("Group {chat_id}"),
            is_forum: false,
        }
    }
}

/// The bot's user id is the digits before the colon of its token.
pub(super) fn bot_id_of(token: &str) -> Option<i64> {
    token.split_once(':')?.0.parse().ok()
}

//! What tests hand the fake (users' messages, taps, files) and what they read back
//! (calls, messages and their history, files, answers, counters). Every type here
//! is also the JSON of a control route, so the field names are part of that API.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A text message a user writes, to become a `message` update. For replies,
/// media, captions and albums use [`UserMessage`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inject {
    pub chat_id: i64,
    #[serde(default)]
    pub thread_id: Option<i64>,
    pub user_id: i64,
    pub text: String,
}

/// Anything a user can post: text, or a file with an optional caption; possibly a
/// reply, possibly part of an album. Build it with `..Default::default()`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UserMessage {
    pub chat_id: i64,
    #[serde(default)]
    pub thread_id: Option<i64>,
    pub user_id: i64,
    /// The text, or the caption when `media` is set (then it may be empty).
    #[serde(default)]
    pub text: String,
    /// `entities` (or `caption_entities`) exactly as Telegram would send them.
    /// Left empty, a leading `/command` still gets its `bot_command` entity.
    #[serde(default)]
    pub entities: Vec<Value>,
    /// The message this one answers; it must exist in the same chat. The update
    /// then carries it, whole, as `reply_to_message`.
    #[serde(default)]
    pub reply_to_message_id: Option<i64>,
    #[serde(default)]
    pub media: Option<MediaInject>,
    /// Shared by every message of one album (each is its own update).
    #[serde(default)]
    pub media_group_id: Option<String>,
}

impl From<Inject> for UserMessage {
    fn from(inject: Inject) -> Self {
        Self {
            chat_id: inject.chat_id,
            thread_id: inject.thread_id,
            user_id: inject.user_id,
            text: inject.text,
            ..Self::default()
        }
    }
}

/// The kinds of file a message can carry, by the field Telegram puts it in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MediaKind {
    Photo,
    #[default]
    Document,
    Voice,
    Audio,
    Video,
    VideoNote,
    Animation,
    Sticker,
}

/// A file a user sends. The fake keeps `bytes` and serves them on download.
/// Over the control route the bytes travel as `data_base64`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MediaInject {
    pub kind: MediaKind,
    #[serde(default, with = "base64_bytes", rename = "data_base64")]
    pub bytes: Bytes,
    /// The size Telegram reports instead of `bytes.len()`: lets a test offer a
    /// 30 MB file without building one (only the declared size matters for
    /// `getFile`'s 20 MB limit).
    #[serde(default)]
    pub declared_size: Option<u64>,
    #[serde(default)]
    pub file_name: Option<String>,
    #[serde(default)]
    pub mime_type: Option<String>,
    /// Seconds, for voice, audio, video, video notes and animations.
    #[serde(default)]
    pub duration: Option<u32>,
    /// Pixels of the largest photo size, video or sticker (nominal defaults).
    #[serde(default)]
    pub width: Option<u32>,
    #[serde(default)]
    pub height: Option<u32>,
}

/// What an injected user message became.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Injected {
    pub update_id: i64,
    pub message_id: i64,
    /// The files the message carries (photo sizes smallest first).
    pub file_ids: Vec<String>,
}

/// A button press on one of the bot's messages, to become a `callback_query`
/// update. The message need not exist (a forged tap): the update's `message` is
/// then made of what is given here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackInject {
    pub chat_id: i64,
    #[serde(default)]
    pub thread_id: Option<i64>,
    pub user_id: i64,
    pub message_id: i64,
    pub data: String,
}

/// How long Telegram shows a draft after its last change.
pub const DRAFT_LIFETIME_MS: u64 = 30_000;

/// One draft the bot streamed (`sendMessageDraft`), with every text it
/// showed. Times are milliseconds since the server started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DraftRecord {
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub draft_id: i64,
    /// The texts shown, oldest first (after entity parsing; "" shows
    /// "Thinking…").
    pub texts: Vec<String>,
    /// Whether its last change offered the stop button.
    pub can_stop: bool,
    pub updated_ms: u64,
    /// The person pressed the stop button: Telegram shows it no more.
    pub stopped: bool,
    /// The message the bot sent in its place (in the same thread), which
    /// ends the preview.
    pub replaced_by: Option<i64>,
}

impl DraftRecord {
    /// Whether the person sees it at `now_ms`: not stopped, not replaced
    /// by a message, and changed within [`DRAFT_LIFETIME_MS`].
    pub fn shown_at(&self, now_ms: u64) -> bool {
        !self.stopped
            && self.replaced_by.is_none()
            && now_ms.saturating_sub(self.updated_ms) < DRAFT_LIFETIME_MS
    }

    /// The last text shown.
    pub fn text(&self) -> &str {
        self.texts.last().map_or("", String::as_str)
    }
}

/// One injected callback query and the bot's answer to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackQueryRecord {
    pub callback_query_id: String,
    pub update_id: i64,
    pub user_id: i64,
    pub chat_id: i64,
    pub message_id: i64,
    pub data: String,
    pub injected_ms: u64,
    /// `None` until `answerCallbackQuery` succeeds for it.
    pub answer: Option<CallbackAnswer>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackAnswer {
    pub text: Option<String>,
    pub show_alert: bool,
    pub url: Option<String>,
    pub answered_ms: u64,
}

/// One Bot API call as the fake saw it. Times are milliseconds since the server
/// started, on a monotonic clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    pub seq: u64,
    /// Canonical spelling (`sendMessage`) for known methods, as sent otherwise.
    pub method: String,
    /// The parameters; an uploaded file part appears as
    /// `{"upload": {"file_name", "content_type", "size"}}`.
    pub params: Value,
    pub started_ms: u64,
    /// `None` while the call has not been answered (or never will be: `Hang`).
    pub finished_ms: Option<u64>,
    pub status: Option<u16>,
    /// The `ok` field of the answer; false for unparseable answers.
    pub ok: bool,
    /// The fault applied to this call, if any (its `Debug` form).
    pub fault: Option<String>,
}

/// A forum topic as the fake knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicInfo {
    pub thread_id: i64,
    pub name: String,
    pub icon_color: i64,
    pub closed: bool,
    pub deleted: bool,
}

/// A message the bot sent: text, or a file with its caption (service messages
/// and users' messages excluded).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SentMessage {
    pub message_id: i64,
    pub thread_id: Option<i64>,
    /// The text (or caption) as the bot sent it, markup included (after the
    /// last edit).
    pub text: String,
    pub parse_mode: Option<String>,
    /// The text as Telegram displays it, after entity parsing.
    pub plain_text: String,
    pub entities: Vec<Value>,
    pub date: i64,
    pub edited: bool,
    /// The buttons (or other markup) the message has now; `None` once removed.
    #[serde(default)]
    pub reply_markup: Option<Value>,
    #[serde(default)]
    pub reply_to_message_id: Option<i64>,
    #[serde(default)]
    pub media: Option<SentMedia>,
    /// Every version, oldest first: the send, then each accepted edit.
    #[serde(default)]
    pub history: Vec<MessageVersion>,
}

/// One state of a bot message: as sent, or after an edit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageVersion {
    /// The call that produced it (`sendMessage`, `editMessageReplyMarkup`, …).
    pub method: String,
    pub text: String,
    pub plain_text: String,
    pub reply_markup: Option<Value>,
    pub at_ms: u64,
}

/// The file a bot message carries (for photos: the largest size).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentMedia {
    pub kind: MediaKind,
    pub file_id: String,
}

/// A file the fake holds: uploaded by the bot or sent by a user.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileRecord {
    pub file_id: String,
    pub file_unique_id: String,
    pub kind: MediaKind,
    /// As Telegram reports it (a declared size for files injected without bytes).
    pub file_size: u64,
    pub file_name: Option<String>,
    pub mime_type: Option<String>,
    /// Set by the first successful `getFile`.
    pub file_path: Option<String>,
    pub from_bot: bool,
    pub chat_id: i64,
    pub message_id: i64,
    /// The content; over HTTP it is served by `GET control/file_content`.
    #[serde(skip)]
    pub bytes: Bytes,
}

/// One request to `{url}/file/bot<token>/<file_path>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadRecord {
    pub file_path: String,
    /// The file served, if the path named one.
    pub file_id: Option<String>,
    pub status: u16,
    pub at_ms: u64,
}

/// What one chat received from the bot, for pacing tests and the benchmark.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatCounters {
    pub chat_id: i64,
    /// Messages accepted (text and files).
    pub sent: u64,
    /// Edits accepted (`editMessageText`, `editMessageReplyMarkup`).
    pub edited: u64,
    /// Sends and edits refused with 429 by the rate limiter (not by faults).
    pub rate_limited: u64,
}

/// How `getUpdates` calls overlapped. An overlap is a `getUpdates` arriving
/// while another one is still open; the older is then terminated with 409.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PollStats {
    /// `getUpdates` calls that reached the poll logic (faults other than
    /// `Deaf` answer before it and are not counted).
    pub polls: u64,
    pub overlaps: u64,
    /// The overlaps whose newcomer was a short poll (`timeout` 0): the kind a
    /// stepping-down leader makes to confirm its offset on hand-over.
    pub short_poll_overlaps: u64,
    pub open_now: u32,
    pub max_open: u32,
}

/// Everything counted, in one answer (`GET control/stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FakeStats {
    pub polls: PollStats,
    /// Updates not yet confirmed (`getWebhookInfo.pending_update_count`).
    pub pending_update_count: usize,
    /// One entry per chat the bot sent to or was refused in, by chat id.
    pub chats: Vec<ChatCounters>,
}

/// Bytes as standard base64 in JSON (the control routes' wire form of files).
mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use bytes::Bytes;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Bytes, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&STANDARD.encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Bytes, D::Error> {
        let text = String::deserialize(deserializer)?;
        STANDARD
            .decode(text)
            .map(Bytes::from)
            .map_err(serde::de::Error::custom)
    }
}

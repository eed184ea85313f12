//! The parts of the Bot API's objects the relay reads.
//!
//! Every struct ignores fields it does not name: Telegram adds fields with
//! every Bot API release, and an old relay must keep decoding new answers.
//! Updates are decoded one at a time ([`Update::decode`]) so one odd update
//! never poisons the batch it came in.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One entry of a `getUpdates` answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Update {
    pub update_id: i64,
    pub kind: UpdateKind,
}

/// What an update carries. Kinds the relay does not handle are kept as
/// [`UpdateKind::Unknown`] so the caller can confirm and skip them.
#[derive(Debug, Clone, PartialEq)]
pub enum UpdateKind {
    Message(Message),
    EditedMessage(Message),
    CallbackQuery(CallbackQuery),
    /// The person pressed the stop button of a draft (`can_stop`): Telegram
    /// stops showing it; the bot must stop the work itself.
    GenerationStopped(MessageGenerationStopped),
    /// The field names the update carried besides `update_id`, e.g.
    /// `["chat_member"]`.
    Unknown {
        kinds: Vec<String>,
    },
}

/// Why one update could not be decoded. The update id is kept when it was
/// readable: the poller must still advance its offset past a broken update,
/// or it would be fetched again forever.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("update is not JSON: {0}")]
    NotJson(String),
    #[error("update is not an object with a numeric update_id")]
    MissingUpdateId,
    #[error("update {update_id}: malformed {kind}: {message}")]
    Malformed {
        update_id: i64,
        kind: &'static str,
        message: String,
    },
}

impl Update {
    /// Decodes one update from the bytes it travels as (Telegram's JSON, as
    /// the cluster's stream and a forgotten machine's backlog carry it).
    pub fn from_slice(bytes: &[u8]) -> Result<Update, DecodeError> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| DecodeError::NotJson(e.to_string()))?;
        Self::decode(&value)
    }

    /// Decodes one raw update. Unknown kinds are not an error; a known kind
    /// whose payload does not match its shape is.
    pub fn decode(value: &Value) -> Result<Update, DecodeError> {
        let object = value.as_object().ok_or(DecodeError::MissingUpdateId)?;
        let update_id = object
            .get("update_id")
            .and_then(Value::as_i64)
            .ok_or(DecodeError::MissingUpdateId)?;
        let malformed = |kind: &'static str, error: serde_json::Error| DecodeError::Malformed {
            update_id,
            kind,
            message: error.to_string(),
        };
        let kind = if let Some(payload) = object.get("message") {
            UpdateKind::Message(Message::deserialize(payload).map_err(|e| malformed("message", e))?)
        } else if let Some(payload) = object.get("edited_message") {
            UpdateKind::EditedMessage(
                Message::deserialize(payload).map_err(|e| malformed("edited_message", e))?,
            )
        } else if let Some(payload) = object.get("callback_query") {
            UpdateKind::CallbackQuery(
                CallbackQuery::deserialize(payload).map_err(|e| malformed("callback_query", e))?,
            )
        } else if let Some(payload) = object.get("stopped_message_generation") {
            UpdateKind::GenerationStopped(
                MessageGenerationStopped::deserialize(payload)
                    .map_err(|e| malformed("stopped_message_generation", e))?,
            )
        } else {
            UpdateKind::Unknown {
                kinds: object
                    .keys()
                    .filter(|key| key.as_str() != "update_id")
                    .cloned()
                    .collect(),
            }
        };
        Ok(Update { update_id, kind })
    }
}

/// `stopped_message_generation`: a stop button pressed on a draft. The
/// chat is the private chat the draft was shown in, so its id is the
/// person's.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct MessageGenerationStopped {
    pub chat: Chat,
    #[serde(default)]
    pub message_thread_id: Option<i64>,
    pub draft_id: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct User {
    pub id: i64,
    pub is_bot: bool,
    pub first_name: String,
    #[serde(default)]
    pub username: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatKind {
    Private,
    Group,
    Supergroup,
    Channel,
    /// A chat type newer than this relay.
    #[serde(other)]
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Chat {
    pub id: i64,
    #[serde(rename = "type")]
    pub kind: ChatKind,
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub username: Option<String>,
    /// A private chat's user.
    #[serde(default)]
    pub first_name: Option<String>,
    /// Telegram omits the field unless it is true (and only `getChat`
    /// reports it reliably).
    #[serde(default)]
    pub is_forum: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Message {
    pub message_id: i64,
    #[serde(default)]
    pub from: Option<User>,
    pub chat: Chat,
    /// Unix time; 0 for a message the bot can no longer access.
    pub date: i64,
    #[serde(default)]
    pub edit_date: Option<i64>,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub message_thread_id: Option<i64>,
    #[serde(default)]
    pub is_topic_message: bool,
    #[serde(default)]
    pub forum_topic_created: Option<ForumTopicCreated>,
    #[serde(default)]
    pub forum_topic_edited: Option<ForumTopicEdited>,
    #[serde(default)]
    pub forum_topic_closed: Option<ForumTopicClosed>,
    #[serde(default)]
    pub forum_topic_reopened: Option<ForumTopicReopened>,
    /// The message this one replies to (Telegram sends it one level deep).
    #[serde(default)]
    pub reply_to_message: Option<Box<Message>>,
    /// The text of a message that carries a file.
    #[serde(default)]
    pub caption: Option<String>,
    /// A photo in every size Telegram made of it, smallest first.
    #[serde(default)]
    pub photo: Vec<FileRef>,
    #[serde(default)]
    pub document: Option<FileRef>,
    #[serde(default)]
    pub voice: Option<FileRef>,
    #[serde(default)]
    pub audio: Option<FileRef>,
    #[serde(default)]
    pub video: Option<FileRef>,
    #[serde(default)]
    pub video_note: Option<FileRef>,
    /// A GIF or silent video; Telegram also sends it as `document`.
    #[serde(default)]
    pub animation: Option<FileRef>,
    #[serde(default)]
    pub sticker: Option<FileRef>,
    /// Shared by the messages of one album, each of which is its own update.
    #[serde(default)]
    pub media_group_id: Option<String>,
}

impl Message {
    /// The topic this message belongs to. A `message_thread_id` without
    /// `is_topic_message` is a reply thread in a non-forum chat, not a topic.
    pub fn topic(&self) -> Option<i64> {
        self.message_thread_id.filter(|_| self.is_topic_message)
    }

    /// The file the message carries, if any: a photo's largest size, an
    /// animation as itself (not as the `document` Telegram adds for old
    /// clients).
    pub fn media(&self) -> Option<(MediaKind, &FileRef)> {
        if let Some(largest) = self.photo.last() {
            return Some((MediaKind::Photo, largest));
        }
        let kinds = [
            (MediaKind::Animation, &self.animation),
            (MediaKind::Document, &self.document),
            (MediaKind::Voice, &self.voice),
            (MediaKind::Audio, &self.audio),
            (MediaKind::Video, &self.video),
            (MediaKind::VideoNote, &self.video_note),
            (MediaKind::Sticker, &self.sticker),
        ];
        kinds
            .into_iter()
            .find_map(|(kind, file)| file.as_ref().map(|f| (kind, f)))
    }
}

/// Which field of a message carried a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaKind {
    Photo,
    Document,
    Voice,
    Audio,
    Video,
    VideoNote,
    Animation,
    Sticker,
}

/// A file as a message carries it (`PhotoSize`, `Document`, `Voice`, …):
/// the fields those objects share; the rest is ignored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FileRef {
    /// For `getFile`; valid for this bot only.
    pub file_id: String,
    /// The same for every bot and over time.
    pub file_unique_id: String,
    /// Telegram may leave it out.
    #[serde(default)]
    pub file_size: Option<u64>,
    /// The sender's name for a document, audio, video or animation.
    #[serde(default)]
    pub file_name: Option<String>,
    #[serde(default)]
    pub mime_type: Option<String>,
    /// Seconds, for voice, audio, video and video notes.
    #[serde(default)]
    pub duration: Option<u32>,
}

/// The answer of `getFile`: where to download the file from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct TelegramFile {
    pub file_id: String,
    pub file_unique_id: String,
    #[serde(default)]
    pub file_size: Option<u64>,
    /// `<api>/file/bot<token>/<file_path>`, valid for an hour; absent when
    /// the file cannot be downloaded.
    #[serde(default)]
    pub file_path: Option<String>,
}

/// Service message: a topic was created (an observation, not proof that it
/// still exists).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ForumTopicCreated {
    pub name: String,
    #[serde(default)]
    pub icon_color: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ForumTopicEdited {
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ForumTopicClosed {}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ForumTopicReopened {}

/// The answer of `createForumTopic`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ForumTopic {
    pub message_thread_id: i64,
    pub name: String,
    pub icon_color: u32,
}

/// The answer of `getWebhookInfo`: what matters to a poller.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct WebhookInfo {
    #[serde(default)]
    pub url: String,
    /// Updates Telegram holds that nobody confirmed yet.
    #[serde(default)]
    pub pending_update_count: u32,
}

/// The answer of `getMe`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BotInfo {
    pub id: i64,
    pub first_name: String,
    /// Every bot has one; the deep link `t.me/<username>` is built from it.
    pub username: String,
    /// Bot API 9.4: the bot may create topics in private chats.
    #[serde(default)]
    pub has_topics_enabled: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChatMemberStatus {
    Creator,
    Administrator,
    Member,
    Restricted,
    Left,
    Kicked,
    #[serde(other)]
    Other,
}

/// The answer of `getChatMember`; only the rights the relay depends on.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ChatMember {
    pub status: ChatMemberStatus,
    pub user: User,
    #[serde(default)]
    pub can_manage_topics: Option<bool>,
    #[serde(default)]
    pub can_delete_messages: Option<bool>,
}

impl ChatMember {
    /// The creator holds every right without Telegram listing them.
    pub fn may_manage_topics(&self) -> bool {
        self.status == ChatMemberStatus::Creator
            || (self.status == ChatMemberStatus::Administrator
                && self.can_manage_topics == Some(true))
    }

    pub fn may_delete_messages(&self) -> bool {
        self.status == ChatMemberStatus::Creator
            || (self.status == ChatMemberStatus::Administrator
                && self.can_delete_messages == Some(true))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct CallbackQuery {
    pub id: String,
    pub from: User,
    /// The message with the button; Telegram sends an "inaccessible" stub
    /// (date 0) for old ones, which still decodes here.
    #[serde(default)]
    pub message: Option<Message>,
    #[serde(default)]
    pub data: Option<String>,
}

/// How Telegram should read a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ParseMode {
    #[serde(rename = "HTML")]
    Html,
}

/// `sendMessage` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendMessage {
    pub chat_id: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_thread_id: Option<i64>,
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parse_mode: Option<ParseMode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_markup: Option<InlineKeyboardMarkup>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_parameters: Option<ReplyParameters>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_preview_options: Option<LinkPreviewOptions>,
}

/// `editMessageText` parameters. Without `reply_markup` Telegram removes
/// the message's buttons.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EditMessageText {
    pub chat_id: i64,
    pub message_id: i64,
    pub text: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parse_mode: Option<ParseMode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_markup: Option<InlineKeyboardMarkup>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_preview_options: Option<LinkPreviewOptions>,
}

/// `editMessageReplyMarkup` parameters; no markup removes the buttons.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EditMessageReplyMarkup {
    pub chat_id: i64,
    pub message_id: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reply_markup: Option<InlineKeyboardMarkup>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InlineKeyboardMarkup {
    pub inline_keyboard: Vec<Vec<InlineKeyboardButton>>,
}

/// A button that sends `callback_data` back as a `callback_query`, or a
/// disabled one (Bot API 10.3) that only shows its text: exactly one of
/// the two is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InlineKeyboardButton {
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disabled: Option<DisabledButton>,
}

impl InlineKeyboardButton {
    pub fn callback(text: impl Into<String>, data: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            callback_data: Some(data.into()),
            disabled: None,
        }
    }

    /// A button that does nothing when pressed: what a settled question
    /// keeps to say how it was settled.
    pub fn disabled(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            callback_data: None,
            disabled: Some(DisabledButton {}),
        }
    }
}

/// `DisabledButton`: holds no information yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DisabledButton {}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyParameters {
    pub message_id: i64,
    /// Send anyway when the replied-to message is gone.
    pub allow_sending_without_reply: bool,
}

/// Link previews; the relay turns them off.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkPreviewOptions {
    pub is_disabled: bool,
}

impl Default for LinkPreviewOptions {
    fn default() -> Self {
        Self { is_disabled: true }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn topic_message() -> Value {
        json!({
            "update_id": 900,
            "message": {
                "message_id": 17,
                "from": {"id": 42, "is_bot": false, "first_name": "Ada", "language_code": "en"},
                "chat": {"id": -1001, "type": "supergroup", "title": "agents", "is_forum": true},
                "date": 1_700_000_000,
                "message_thread_id": 5,
                "is_topic_message": true,
                "text": "run the tests",
                "entities": [{"type": "bold", "offset": 0, "length": 3}]
            }
        })
    }

    #[test]
    fn an_update_decodes_from_its_bytes_and_bytes_that_are_not_json_say_so() {
        let bytes = br#"{"update_id": 9, "message": {"message_id": 1, "date": 1, "chat": {"id": 5, "type": "private"}, "text": "hi"}}"#;
        let update = Update::from_slice(bytes).unwrap();
        assert_eq!(update.update_id, 9);
        assert!(
            matches!(update.kind, UpdateKind::Message(ref m) if m.text.as_deref() == Some("hi"))
        );
        assert!(matches!(
            Update::from_slice(b"{not json"),
            Err(DecodeError::NotJson(_))
        ));
        assert_eq!(
            Update::from_slice(b"\"text\""),
            Err(DecodeError::MissingUpdateId)
        );
    }

    #[test]
    fn decodes_a_topic_message_ignoring_unknown_fields() {
        let update = Update::decode(&topic_message()).unwrap();
        assert_eq!(update.update_id, 900);
        let UpdateKind::Message(message) = &update.kind else {
            panic!("{update:?}")
        };
        assert_eq!(message.text.as_deref(), Some("run the tests"));
        assert_eq!(message.topic(), Some(5));
        assert_eq!(message.chat.kind, ChatKind::Supergroup);
        assert!(message.chat.is_forum);
        assert_eq!(message.from.as_ref().map(|u| u.id), Some(42));
    }

    #[test]
    fn edited_messages_and_service_messages_decode() {
        let raw = json!({
            "update_id": 1,
            "edited_message": {
                "message_id": 3, "date": 5, "edit_date": 6,
                "chat": {"id": 7, "type": "private", "first_name": "Ada"},
                "message_thread_id": 9, "is_topic_message": true,
                "forum_topic_created": {"name": "A · api", "icon_color": 7_322_096},
                "forum_topic_closed": {}
            }
        });
        let update = Update::decode(&raw).unwrap();
        let UpdateKind::EditedMessage(message) = &update.kind else {
            panic!("{update:?}")
        };
        assert_eq!(message.chat.kind, ChatKind::Private);
        assert_eq!(
            message
                .forum_topic_created
                .as_ref()
                .map(|c| c.name.as_str()),
            Some("A · api")
        );
        assert!(message.forum_topic_closed.is_some());
        assert!(message.forum_topic_reopened.is_none());
    }

    #[test]
    fn a_reply_thread_outside_a_forum_is_not_a_topic() {
        let mut raw = topic_message();
        raw["message"]["is_topic_message"] = json!(false);
        let update = Update::decode(&raw).unwrap();
        let UpdateKind::Message(message) = &update.kind else {
            panic!("{update:?}")
        };
        assert_eq!(message.topic(), None);
    }

    #[test]
    fn callback_queries_decode_with_an_inaccessible_message() {
        let raw = json!({
            "update_id": 2,
            "callback_query": {
                "id": "abc", "chat_instance": "x", "data": "approve:1",
                "from": {"id": 42, "is_bot": false, "first_name": "Ada"},
                "message": {"message_id": 4, "date": 0, "chat": {"id": 42, "type": "private"}}
            }
        });
        let UpdateKind::CallbackQuery(query) = Update::decode(&raw).unwrap().kind else {
            panic!("not a callback query")
        };
        assert_eq!(query.data.as_deref(), Some("approve:1"));
        assert_eq!(query.message.map(|m| m.date), Some(0));
    }

    #[test]
    fn unknown_kinds_are_reported_not_fatal() {
        let raw = json!({"update_id": 3, "message_reaction": {"whatever": true}});
        let update = Update::decode(&raw).unwrap();
        assert_eq!(
            update.kind,
            UpdateKind::Unknown {
                kinds: vec!["message_reaction".into()]
            }
        );
    }

    #[test]
    fn a_broken_known_kind_keeps_its_update_id() {
        let raw = json!({"update_id": 4, "message": {"message_id": "not a number"}});
        let error = Update::decode(&raw).unwrap_err();
        assert!(
            matches!(error, DecodeError::Malformed { update_id: 4, .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("message"), "{error}");
    }

    #[test]
    fn an_update_without_an_id_is_an_error() {
        for raw in [json!([]), json!({"message": {}}), json!({"update_id": "7"})] {
            assert_eq!(Update::decode(&raw), Err(DecodeError::MissingUpdateId));
        }
    }

    #[test]
    fn new_chat_types_and_member_statuses_do_not_fail() {
        let chat: Chat = serde_json::from_value(json!({"id": 1, "type": "monoforum"})).unwrap();
        assert_eq!(chat.kind, ChatKind::Other);
        let member: ChatMember = serde_json::from_value(json!({
            "status": "administrator",
            "user": {"id": 8, "is_bot": true, "first_name": "relay"},
            "can_manage_topics": true
        }))
        .unwrap();
        assert!(member.may_manage_topics());
        assert!(!member.may_delete_messages());
    }

    #[test]
    fn media_messages_decode_with_their_files() {
        let raw = json!({
            "update_id": 5,
            "message": {
                "message_id": 8, "date": 1, "media_group_id": "13",
                "chat": {"id": -1001, "type": "supergroup", "is_forum": true},
                "from": {"id": 42, "is_bot": false, "first_name": "Ada"},
                "message_thread_id": 5, "is_topic_message": true,
                "caption": "the bug",
                "photo": [
                    {"file_id": "s", "file_unique_id": "us", "file_size": 900, "width": 90, "height": 67},
                    {"file_id": "l", "file_unique_id": "ul", "file_size": 91_000, "width": 1280, "height": 960}
                ]
            }
        });
        let UpdateKind::Message(message) = Update::decode(&raw).unwrap().kind else {
            panic!("not a message")
        };
        let (kind, file) = message.media().unwrap();
        assert_eq!(kind, MediaKind::Photo);
        assert_eq!((file.file_id.as_str(), file.file_size), ("l", Some(91_000)));
        assert_eq!(message.caption.as_deref(), Some("the bug"));
        assert_eq!(message.media_group_id.as_deref(), Some("13"));
        assert_eq!(message.text, None);

        let animation = json!({
            "message_id": 9, "date": 1, "chat": {"id": 7, "type": "private"},
            "animation": {"file_id": "a", "file_unique_id": "ua", "file_name": "x.mp4", "duration": 2},
            "document": {"file_id": "a", "file_unique_id": "ua", "file_name": "x.mp4"}
        });
        let message: Message = serde_json::from_value(animation).unwrap();
        assert_eq!(message.media().map(|(k, _)| k), Some(MediaKind::Animation));
        let voice = json!({
            "message_id": 10, "date": 1, "chat": {"id": 7, "type": "private"},
            "voice": {"file_id": "v", "file_unique_id": "uv", "duration": 7, "mime_type": "audio/ogg"}
        });
        let message: Message = serde_json::from_value(voice).unwrap();
        let (kind, file) = message.media().unwrap();
        assert_eq!(
            (kind, file.duration, file.file_size),
            (MediaKind::Voice, Some(7), None)
        );
    }

    #[test]
    fn bot_info_defaults_topics_to_disabled() {
        let info: BotInfo = serde_json::from_value(json!({
            "id": 8, "is_bot": true, "first_name": "relay", "username": "relay_bot"
        }))
        .unwrap();
        assert!(!info.has_topics_enabled);
    }
}

//! Every Bot API call the relay makes, as one type: [`BotCall`] names the
//! method with its typed parameters, [`BotReply`] is what it answered.
//!
//! The leader's outbox paces, retries and decides about failures for a
//! `BotCall` whatever it is, and a machine of a cluster hands one to the
//! machine that polls as it is (it serializes as
//! `{"method":"sendMessage","params":{…}}`). Adding a Bot API method is a
//! variant here (with its reply in [`BotCall::reply`]), its fallbacks in
//! the outbox (`leader::outbox::recover`), and the method in the fake.
//!
//! Reads that only `setup` and `doctor` make (`getChat`, `getChatMember`),
//! the long poll and file transfers keep methods of their own on
//! [`super::BotApi`]: they are not made for sessions, paced, or forwarded.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::TelegramError;
use super::types::{
    BotInfo, EditMessageReplyMarkup, EditMessageText, ForumTopic, Message, SendMessage,
};

/// One Bot API call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "method", content = "params", rename_all = "camelCase")]
pub enum BotCall {
    SendMessage(SendMessage),
    EditMessageText(EditMessageText),
    EditMessageReplyMarkup(EditMessageReplyMarkup),
    SendChatAction(SendChatAction),
    SendMessageDraft(SendMessageDraft),
    AnswerCallbackQuery(AnswerCallbackQuery),
    CreateForumTopic(CreateForumTopic),
    CloseForumTopic(InTopic),
    ReopenForumTopic(InTopic),
    DeleteForumTopic(InTopic),
    SetMessageReaction(SetMessageReaction),
    GetMe,
}

/// `sendChatAction` parameters (the relay only ever shows "typing").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendChatAction {
    pub chat_id: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_thread_id: Option<i64>,
    pub action: ChatAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatAction {
    Typing,
}

/// `sendMessageDraft` parameters: a partial message shown while it is
/// written, in a private chat only. The same `draft_id` (never 0) animates
/// the change; Telegram shows a draft for about 30 s after its last
/// change and keeps none of it: the finished text is a `sendMessage`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendMessageDraft {
    pub chat_id: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_thread_id: Option<i64>,
    pub draft_id: i64,
    /// Empty shows "Thinking…".
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parse_mode: Option<super::types::ParseMode>,
    /// Shows the person a button to stop the generation; a press comes
    /// back as `stopped_message_generation`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub can_stop: bool,
}

/// `answerCallbackQuery` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnswerCallbackQuery {
    pub callback_query_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub show_alert: bool,
}

/// `setMessageReaction` parameters: the bot's one reaction on a message
/// (an empty list takes it away). Not a message: it spends no chat's
/// message budget.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetMessageReaction {
    pub chat_id: i64,
    pub message_id: i64,
    pub reaction: Vec<ReactionType>,
}

/// A reaction: one of Telegram's fixed emoji.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ReactionType {
    Emoji { emoji: String },
}

/// `createForumTopic` parameters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateForumTopic {
    pub chat_id: i64,
    pub name: String,
}

/// The topic a topic-management call acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InTopic {
    pub chat_id: i64,
    pub message_thread_id: i64,
}

/// What a call answered, as much of it as the relay uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "camelCase")]
pub enum BotReply {
    /// `True`, or an edited message nobody needs.
    Done,
    /// The message a send posted.
    Posted { message_id: i64 },
    /// The topic `createForumTopic` made.
    Topic { message_thread_id: i64 },
    /// `getMe`.
    Bot(BotInfo),
}

impl BotReply {
    /// The message a send posted.
    pub fn message_id(&self) -> Option<i64> {
        match self {
            Self::Posted { message_id } => Some(*message_id),
            _ => None,
        }
    }
}

impl BotCall {
    /// The Bot API's name of the method.
    pub fn method(&self) -> &'static str {
        match self {
            Self::SendMessage(_) => "sendMessage",
            Self::EditMessageText(_) => "editMessageText",
            Self::EditMessageReplyMarkup(_) => "editMessageReplyMarkup",
            Self::SendChatAction(_) => "sendChatAction",
            Self::SendMessageDraft(_) => "sendMessageDraft",
            Self::AnswerCallbackQuery(_) => "answerCallbackQuery",
            Self::CreateForumTopic(_) => "createForumTopic",
            Self::CloseForumTopic(_) => "closeForumTopic",
            Self::ReopenForumTopic(_) => "reopenForumTopic",
            Self::DeleteForumTopic(_) => "deleteForumTopic",
            Self::SetMessageReaction(_) => "setMessageReaction",
            Self::GetMe => "getMe",
        }
    }

    /// The chat whose message budget the call spends, if any: a tap's
    /// answer and `getMe` are no messages.
    pub fn chat(&self) -> Option<i64> {
        match self {
            Self::SendMessage(p) => Some(p.chat_id),
            Self::EditMessageText(p) => Some(p.chat_id),
            Self::EditMessageReplyMarkup(p) => Some(p.chat_id),
            Self::SendChatAction(p) => Some(p.chat_id),
            Self::SendMessageDraft(p) => Some(p.chat_id),
            Self::CreateForumTopic(p) => Some(p.chat_id),
            Self::CloseForumTopic(t) | Self::ReopenForumTopic(t) | Self::DeleteForumTopic(t) => {
                Some(t.chat_id)
            }
            Self::SetMessageReaction(p) => Some(p.chat_id),
            Self::AnswerCallbackQuery(_) | Self::GetMe => None,
        }
    }

    /// The call's parameters as the Bot API takes them.
    pub fn params(&self) -> Value {
        match serde_json::to_value(self) {
            Ok(Value::Object(mut call)) => call
                .remove("params")
                .unwrap_or_else(|| Value::Object(Default::default())),
            // A call is plain data: it always serializes to an object.
            _ => Value::Object(Default::default()),
        }
    }

    /// Reads what Telegram answered to this call.
    pub fn reply(&self, result: Value) -> Result<BotReply, TelegramError> {
        let malformed = |e: serde_json::Error| TelegramError::Malformed {
            message: format!("unexpected {} result: {e}", self.method()),
            commit_unknown: !super::error::is_idempotent(self.method()),
        };
        Ok(match self {
            Self::SendMessage(_) => {
                let message: Message = serde_json::from_value(result).map_err(malformed)?;
                BotReply::Posted {
                    message_id: message.message_id,
                }
            }
            Self::CreateForumTopic(_) => {
                let topic: ForumTopic = serde_json::from_value(result).map_err(malformed)?;
                BotReply::Topic {
                    message_thread_id: topic.message_thread_id,
                }
            }
            Self::GetMe => BotReply::Bot(serde_json::from_value(result).map_err(malformed)?),
            // The edited message (or `true`), or `true`: nothing to keep.
            Self::EditMessageText(_)
            | Self::EditMessageReplyMarkup(_)
            | Self::SendChatAction(_)
            | Self::SendMessageDraft(_)
            | Self::AnswerCallbackQuery(_)
            | Self::CloseForumTopic(_)
            | Self::ReopenForumTopic(_)
            | Self::DeleteForumTopic(_)
            | Self::SetMessageReaction(_) => BotReply::Done,
        })
    }

    /// Whether a call that got no answer may have taken effect: a message
    /// or a topic that may exist. Such a call is never made again blindly.
    pub fn may_have_happened(&self) -> bool {
        !super::error::is_idempotent(self.method())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_call_is_its_method_and_the_bot_apis_parameters() {
        let call = BotCall::SendChatAction(SendChatAction {
            chat_id: -100,
            message_thread_id: Some(7),
            action: ChatAction::Typing,
        });
        assert_eq!(call.method(), "sendChatAction");
        assert_eq!(
            call.params(),
            json!({"chat_id": -100, "message_thread_id": 7, "action": "typing"})
        );
        let wire = serde_json::to_value(&call).unwrap();
        assert_eq!(wire["method"], "sendChatAction");
        assert_eq!(serde_json::from_value::<BotCall>(wire).unwrap(), call);
        assert_eq!(BotCall::GetMe.params(), json!({}));
        assert_eq!(
            serde_json::from_value::<BotCall>(serde_json::to_value(BotCall::GetMe).unwrap())
                .unwrap(),
            BotCall::GetMe
        );
    }

    #[test]
    fn replies_keep_what_the_relay_uses() {
        let topic = BotCall::CreateForumTopic(CreateForumTopic {
            chat_id: 1,
            name: "A · api".into(),
        });
        let reply = topic
            .reply(json!({"message_thread_id": 42, "name": "A · api", "icon_color": 0}))
            .unwrap();
        assert_eq!(
            reply,
            BotReply::Topic {
                message_thread_id: 42
            }
        );
        let broken = topic.reply(json!({"name": "no id"})).unwrap_err();
        assert!(broken.commit_unknown(), "a topic may exist: {broken}");
        let typing = BotCall::SendChatAction(SendChatAction {
            chat_id: 1,
            message_thread_id: None,
            action: ChatAction::Typing,
        });
        assert_eq!(typing.reply(json!(true)).unwrap(), BotReply::Done);
        assert!(!typing.may_have_happened());
        assert!(topic.may_have_happened());
    }
}

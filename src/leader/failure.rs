//! What a Bot API call came to, decided once, by the outbox that made it
//! (`outbox.rs`), and carried as it was decided: to the flow that asked,
//! to a session as a [`BusError`], or to another machine of a cluster
//! (`cluster/calls.rs`). Nobody downstream looks at a [`TelegramError`]
//! again.

use serde::{Deserialize, Serialize};

use crate::protocol::bus::{BusError, BusErrorCode};
use crate::store::StoreError;
use crate::telegram::{BotReply, TelegramError};

/// A call that was made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Performed {
    pub reply: BotReply,
    /// Telegram refused the HTML, so the text went out plain.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plain: bool,
}

/// A call that failed for good, and what that means.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "camelCase")]
#[error("{message}")]
pub(crate) struct Failure {
    pub kind: FailureKind,
    /// Telegram's words (redacted), for people and logs.
    pub message: String,
}

/// Every decision a caller branches on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) enum FailureKind {
    /// The topic is gone: provision a new one.
    TopicGone,
    /// It may or may not have happened: never made again blindly.
    CommitUnknown,
    /// Telegram stayed unreachable (or kept answering 429) past the call's
    /// deadline, or no machine that polls answered: nothing happened.
    Unavailable,
    /// A background call found the chat's budget spent: not made.
    Paced,
    /// Over Telegram's file limits.
    FileTooBig,
    /// 401: the bot token is rejected.
    TokenRejected,
    /// The bot may not manage topics in the chat.
    NoTopicRights,
    /// The chat has no topics.
    NotAForum,
    /// The chat does not exist, or the bot is not in it (or blocked).
    ChatUnreachable,
    /// The Bot API server lacks the method (or the feature): a server that
    /// lags behind Telegram. Not made, and not asked for again.
    Unsupported,
    /// Refused for good for another reason (the message says which).
    Refused,
}

impl Failure {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
}

/// The one decision of what a failed call means.
pub(crate) fn decide(e: &TelegramError) -> Failure {
    let kind = match e {
        TelegramError::ThreadGone { .. } => FailureKind::TopicGone,
        TelegramError::FileTooBig { .. } => FailureKind::FileTooBig,
        TelegramError::MethodMissing { .. } => FailureKind::Unsupported,
        TelegramError::Unauthorized => FailureKind::TokenRejected,
        TelegramError::NotEnoughRights { .. } => FailureKind::NoTopicRights,
        TelegramError::NotAForum { .. } => FailureKind::NotAForum,
        TelegramError::ChatNotFound { .. } | TelegramError::Forbidden { .. } => {
            FailureKind::ChatUnreachable
        }
        _ if e.commit_unknown() => FailureKind::CommitUnknown,
        _ if e.is_transient() => FailureKind::Unavailable,
        _ => FailureKind::Refused,
    };
    Failure::new(kind, e.to_string())
}

/// A store failure as a session hears it.
pub(super) fn store_error(e: StoreError) -> BusError {
    BusError::new(BusErrorCode::Internal, format!("relay database: {e}"))
}

impl From<Failure> for BusError {
    fn from(f: Failure) -> Self {
        let code = match f.kind {
            FailureKind::TopicGone => BusErrorCode::TopicGone,
            FailureKind::CommitUnknown => BusErrorCode::CommitUnknown,
            FailureKind::Unavailable => BusErrorCode::Unavailable,
            FailureKind::Paced => BusErrorCode::Paced,
            FailureKind::FileTooBig => BusErrorCode::FileTooBig,
            FailureKind::Unsupported => BusErrorCode::Unsupported,
            FailureKind::TokenRejected
            | FailureKind::NoTopicRights
            | FailureKind::NotAForum
            | FailureKind::ChatUnreachable
            | FailureKind::Refused => BusErrorCode::Telegram,
        };
        BusError::new(code, f.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decision_survives_the_trip_to_another_machine() {
        let cases = [
            (
                TelegramError::ThreadGone {
                    description: "gone".into(),
                },
                FailureKind::TopicGone,
            ),
            (TelegramError::Unauthorized, FailureKind::TokenRejected),
            (
                TelegramError::NotEnoughRights {
                    description: "no".into(),
                },
                FailureKind::NoTopicRights,
            ),
            (
                TelegramError::Timeout {
                    commit_unknown: true,
                },
                FailureKind::CommitUnknown,
            ),
            (
                TelegramError::Network {
                    message: "reset".into(),
                    commit_unknown: false,
                },
                FailureKind::Unavailable,
            ),
            (
                TelegramError::BadRequest {
                    description: "nope".into(),
                },
                FailureKind::Refused,
            ),
        ];
        for (error, kind) in cases {
            let decided = decide(&error);
            assert_eq!(decided.kind, kind, "{error}");
            let wire = serde_json::to_string(&decided).unwrap();
            assert_eq!(serde_json::from_str::<Failure>(&wire).unwrap(), decided);
        }
        assert_eq!(
            BusError::from(decide(&TelegramError::Unauthorized)).code,
            BusErrorCode::Telegram
        );
    }
}

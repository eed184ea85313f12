//! The one place that decides what a failed Bot API call means.
//!
//! Callers branch on the variant (retry, mark a topic stale, fall back to
//! plain text, refuse to replay), so every answer Telegram can give and
//! every way the transport can fail ends up here, and nowhere else. Every
//! text stored in an error has passed through [`redact`]: Telegram puts the
//! token in each request URL, and transport errors love quoting URLs.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::redact::redact;

/// How long to wait after a 429 whose answer names no `retry_after`.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TelegramError {
    /// 409: another `getUpdates` consumer or a webhook. Transient after a
    /// restart while the old long poll drains; never a reason to give up.
    #[error("conflict with another bot instance: {description}")]
    Conflict { description: String },
    /// 429: wait `retry_after`, for this chat or globally.
    #[error("rate limited: retry after {}s", retry_after.as_secs_f64())]
    RateLimited { retry_after: Duration },
    /// 5xx (or a non-JSON answer with a 5xx status).
    #[error("server error {status}: {description}")]
    Server {
        status: u16,
        description: String,
        commit_unknown: bool,
    },
    /// The topic was deleted (or never existed): provision a new one.
    #[error("topic is gone: {description}")]
    ThreadGone { description: String },
    /// The topic exists but is closed; it is not gone.
    #[error("topic is closed: {description}")]
    TopicClosed { description: String },
    #[error("the bot lacks rights: {description}")]
    NotEnoughRights { description: String },
    #[error("the chat is not a forum: {description}")]
    NotAForum { description: String },
    /// The HTML was rejected: resend the chunk as plain text.
    #[error("Telegram could not parse the message entities: {description}")]
    ParseEntities { description: String },
    /// An edit that changes nothing; callers treat it as success.
    #[error("not modified: {description}")]
    NotModified { description: String },
    #[error("chat not found: {description}")]
    ChatNotFound { description: String },
    /// The group became a supergroup with a new id.
    #[error("the chat moved to {to_chat_id}")]
    ChatMigrated { to_chat_id: i64 },
    /// 403: blocked by the user, removed from the group, …
    #[error("forbidden: {description}")]
    Forbidden { description: String },
    /// Over Telegram's limits for files: `getFile` past 20 MB ("file is
    /// too big"), an upload past 50 MB (413).
    #[error("the file is too big for the Bot API: {description}")]
    FileTooBig { description: String },
    #[error("bad request: {description}")]
    BadRequest { description: String },
    /// 404: the server knows no such method. Telegram's knows every method
    /// the relay calls; a self-hosted Bot API server or a proxy that lags
    /// behind may not (`sendMessageDraft`, Bot API 9.3).
    #[error("the Bot API server lacks this method: {description}")]
    MethodMissing { description: String },
    /// 401: the token is wrong or revoked.
    #[error("unauthorized: the bot token was rejected")]
    Unauthorized,
    /// Any other error code Telegram answers with.
    #[error("Telegram error {code}: {description}")]
    Api { code: i64, description: String },
    #[error("network error: {message}")]
    Network {
        message: String,
        commit_unknown: bool,
    },
    #[error("request timed out")]
    Timeout { commit_unknown: bool },
    /// A body that is not a Bot API answer: garbage, truncated, wrong shape.
    #[error("malformed answer: {message}")]
    Malformed {
        message: String,
        commit_unknown: bool,
    },
    /// The client refused to send the call at all (nothing reached Telegram).
    #[error("refused before sending: {reason}")]
    Refused { reason: &'static str },
    /// A download whose length is not what `getFile` announced: a body cut
    /// short (or padded) that HTTP itself did not flag. Not transient for
    /// the outbox's backoff: the downloader tries it again a few times
    /// itself, then gives up and the topic is told.
    #[error("the download brought {received} bytes where Telegram announced {announced}")]
    Incomplete { received: u64, announced: u64 },
}

impl TelegramError {
    /// True when the cause is temporary: the same call may succeed later.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Conflict { .. }
                | Self::RateLimited { .. }
                | Self::Server { .. }
                | Self::Network { .. }
                | Self::Timeout { .. }
                | Self::Malformed { .. }
        )
    }

    /// True when the call may simply be sent again (after [`retry_after`] or
    /// a backoff): the cause is temporary and the first attempt cannot have
    /// taken effect, or taking effect twice does no harm.
    ///
    /// [`retry_after`]: Self::retry_after
    pub fn is_retryable(&self) -> bool {
        self.is_transient() && !self.commit_unknown()
    }

    /// True when a non-idempotent call failed in a way that leaves open
    /// whether Telegram performed it (the message may have been sent, the
    /// topic may exist). Such a call must be reconciled, never replayed blindly.
    pub fn commit_unknown(&self) -> bool {
        match self {
            Self::Server { commit_unknown, .. }
            | Self::Network { commit_unknown, .. }
            | Self::Timeout { commit_unknown }
            | Self::Malformed { commit_unknown, .. } => *commit_unknown,
            _ => false,
        }
    }

    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { retry_after } => Some(*retry_after),
            _ => None,
        }
    }

    /// Classifies an HTTP answer. `Ok` is the `result` of a successful call.
    pub fn classify_response(method: &str, status: u16, body: &[u8]) -> Result<Value, Self> {
        let ambiguous = !is_idempotent(method);
        let answer: Answer = match serde_json::from_slice(body) {
            Ok(answer) => answer,
            // A proxy's HTML error page: the status is all there is.
            Err(_) if status >= 500 => {
                return Err(Self::Server {
                    status,
                    description: "non-JSON answer".into(),
                    commit_unknown: ambiguous,
                });
            }
            Err(_) if status == 429 => {
                return Err(Self::RateLimited {
                    retry_after: DEFAULT_RETRY_AFTER,
                });
            }
            Err(error) => {
                return Err(Self::Malformed {
                    message: redacted(&format!("HTTP {status}: {error}")),
                    commit_unknown: ambiguous,
                });
            }
        };
        if answer.ok {
            return answer.result.ok_or_else(|| Self::Malformed {
                message: "ok answer without a result".into(),
                commit_unknown: ambiguous,
            });
        }
        let code = answer.error_code.unwrap_or(i64::from(status));
        let description = redacted(answer.description.as_deref().unwrap_or(""));
        let parameters = answer.parameters.unwrap_or_default();
        Err(Self::from_api_error(
            method,
            code,
            description,
            parameters.retry_after,
            parameters.migrate_to_chat_id,
        ))
    }

    fn from_api_error(
        method: &str,
        code: i64,
        description: String,
        retry_after: Option<u64>,
        migrate_to_chat_id: Option<i64>,
    ) -> Self {
        match code {
            401 => return Self::Unauthorized,
            413 => return Self::FileTooBig { description },
            409 => return Self::Conflict { description },
            404 => return Self::MethodMissing { description },
            429 => {
                let retry_after = retry_after
                    .or_else(|| retry_after_from_text(&description))
                    .map_or(DEFAULT_RETRY_AFTER, Duration::from_secs);
                return Self::RateLimited { retry_after };
            }
            500..=599 => {
                return Self::Server {
                    status: u16::try_from(code).unwrap_or(500),
                    description,
                    commit_unknown: !is_idempotent(method),
                };
            }
            _ => {}
        }
        if let Some(to_chat_id) = migrate_to_chat_id {
            return Self::ChatMigrated { to_chat_id };
        }
        // Descriptions are matched case-insensitively and by substring:
        // Telegram prefixes them ("Bad Request: ") and mixes prose with
        // upper-case codes, and neither is a stable contract.
        let lower = description.to_ascii_lowercase();
        let has = |needle: &str| lower.contains(needle);
        if has("message thread not found") || has("topic_id_invalid") || has("topic_deleted") {
            Self::ThreadGone { description }
        } else if has("topic_closed") {
            Self::TopicClosed { description }
        } else if has("not modified") || has("not_modified") {
            // "message is not modified", "TOPIC_NOT_MODIFIED"
            Self::NotModified { description }
        } else if has("can't parse entities") {
            Self::ParseEntities { description }
        } else if has("not enough rights") {
            Self::NotEnoughRights { description }
        } else if has("chat is not a forum") {
            Self::NotAForum { description }
        } else if has("chat not found") {
            Self::ChatNotFound { description }
        } else if has("file is too big") {
            Self::FileTooBig { description }
        } else {
            match code {
                400 => Self::BadRequest { description },
                403 => Self::Forbidden { description },
                _ => Self::Api { code, description },
            }
        }
    }

    /// Classifies a failure of the HTTP exchange itself.
    pub fn classify_transport(method: &str, error: reqwest::Error) -> Self {
        // A refused or failed connection never reached Telegram; anything
        // later (reset, timeout while waiting, truncated body) may have.
        let sent = !error.is_connect();
        let commit_unknown = sent && !is_idempotent(method);
        if error.is_timeout() {
            return Self::Timeout { commit_unknown };
        }
        let is_body = error.is_body() || error.is_decode();
        let message = describe(error.without_url());
        if is_body {
            Self::Malformed {
                message,
                commit_unknown,
            }
        } else {
            Self::Network {
                message,
                commit_unknown,
            }
        }
    }
}

/// True for Bot API methods that can be sent twice without a second effect:
/// reads, settings, chat actions, and edits/deletes whose replay answers
/// "not modified" or "thread not found". Unknown methods count as not
/// idempotent, so a new method is never replayed by accident.
pub fn is_idempotent(method: &str) -> bool {
    method.starts_with("get")
        || matches!(
            method,
            "deleteWebhook"
                | "setWebhook"
                | "logOut"
                | "setMyCommands"
                | "deleteMyCommands"
                | "setMyName"
                | "setMyDescription"
                | "sendChatAction"
                | "sendMessageDraft"
                | "setMessageReaction"
                | "answerCallbackQuery"
                | "editMessageText"
                | "editForumTopic"
                | "closeForumTopic"
                | "reopenForumTopic"
                | "deleteForumTopic"
                | "deleteMessage"
        )
}

/// The envelope of every Bot API answer.
#[derive(Deserialize)]
struct Answer {
    ok: bool,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error_code: Option<i64>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<ResponseParameters>,
}

#[derive(Deserialize, Default)]
struct ResponseParameters {
    #[serde(default)]
    retry_after: Option<u64>,
    #[serde(default)]
    migrate_to_chat_id: Option<i64>,
}

/// "Too Many Requests: retry after 7" when `parameters` is missing.
fn retry_after_from_text(description: &str) -> Option<u64> {
    let lower = description.to_ascii_lowercase();
    let tail = &lower[lower.find("retry after ")? + "retry after ".len()..];
    let digits: String = tail.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The error with its causes: reqwest's own message ("error sending
/// request") says nothing about what went wrong.
fn describe(error: reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    redacted(&text)
}

fn redacted(text: &str) -> String {
    redact(text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(method: &str, status: u16, body: &str) -> TelegramError {
        TelegramError::classify_response(method, status, body.as_bytes()).unwrap_err()
    }

    fn bad_request(description: &str) -> String {
        format!(r#"{{"ok":false,"error_code":400,"description":"{description}"}}"#)
    }

    #[test]
    fn ok_answers_yield_their_result() {
        let result =
            TelegramError::classify_response("getMe", 200, br#"{"ok":true,"result":{"id":1}}"#);
        assert_eq!(result, Ok(serde_json::json!({"id": 1})));
    }

    #[test]
    fn bad_request_descriptions_map_to_causes() {
        type Expectation = fn(&TelegramError) -> bool;
        let table: &[(&str, Expectation)] = &[
            ("Bad Request: message thread not found", |e| {
                matches!(e, TelegramError::ThreadGone { .. })
            }),
            ("Bad Request: TOPIC_ID_INVALID", |e| {
                matches!(e, TelegramError::ThreadGone { .. })
            }),
            ("Bad Request: TOPIC_DELETED", |e| {
                matches!(e, TelegramError::ThreadGone { .. })
            }),
            ("Bad Request: TOPIC_CLOSED", |e| {
                matches!(e, TelegramError::TopicClosed { .. })
            }),
            ("Bad Request: not enough rights to create a topic", |e| {
                matches!(e, TelegramError::NotEnoughRights { .. })
            }),
            ("Bad Request: the chat is not a forum", |e| {
                matches!(e, TelegramError::NotAForum { .. })
            }),
            (
                "Bad Request: can't parse entities: Unsupported start tag \\\"foo\\\" at byte offset 0",
                |e| matches!(e, TelegramError::ParseEntities { .. }),
            ),
            (
                "Bad Request: message is not modified: specified new message content and reply markup are exactly the same",
                |e| matches!(e, TelegramError::NotModified { .. }),
            ),
            ("Bad Request: TOPIC_NOT_MODIFIED", |e| {
                matches!(e, TelegramError::NotModified { .. })
            }),
            ("Bad Request: chat not found", |e| {
                matches!(e, TelegramError::ChatNotFound { .. })
            }),
            ("Bad Request: file is too big", |e| {
                matches!(e, TelegramError::FileTooBig { .. })
            }),
            ("Bad Request: message text is empty", |e| {
                matches!(e, TelegramError::BadRequest { .. })
            }),
        ];
        for (description, expected) in table {
            let classified = error("sendMessage", 400, &bad_request(description));
            assert!(expected(&classified), "{description} → {classified:?}");
            assert!(!classified.is_transient(), "{classified:?}");
            assert!(!classified.commit_unknown(), "{classified:?}");
        }
    }

    #[test]
    fn conflict_is_transient_and_safe_to_retry() {
        let body = r#"{"ok":false,"error_code":409,"description":"Conflict: terminated by other getUpdates request; make sure that only one bot instance is running"}"#;
        let classified = error("getUpdates", 409, body);
        assert!(matches!(classified, TelegramError::Conflict { .. }));
        assert!(classified.is_retryable());
    }

    #[test]
    fn rate_limits_carry_retry_after() {
        let body = r#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 7","parameters":{"retry_after":7}}"#;
        let classified = error("sendMessage", 429, body);
        assert_eq!(classified.retry_after(), Some(Duration::from_secs(7)));
        // A 429 is a refusal: nothing was sent, so even a send may be retried.
        assert!(classified.is_retryable());

        let without_parameters =
            r#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 12"}"#;
        assert_eq!(
            error("sendMessage", 429, without_parameters).retry_after(),
            Some(Duration::from_secs(12))
        );
        assert_eq!(
            error("sendMessage", 429, "<html>slow down</html>").retry_after(),
            Some(DEFAULT_RETRY_AFTER),
            "a proxy's 429 page still means wait"
        );
        let bare = r#"{"ok":false,"error_code":429,"description":"Too Many Requests"}"#;
        assert_eq!(
            error("sendMessage", 429, bare).retry_after(),
            Some(DEFAULT_RETRY_AFTER)
        );
    }

    #[test]
    fn server_errors_are_ambiguous_only_for_non_idempotent_calls() {
        let body = r#"{"ok":false,"error_code":502,"description":"Bad Gateway"}"#;
        let send = error("sendMessage", 502, body);
        assert!(matches!(send, TelegramError::Server { status: 502, .. }));
        assert!(send.commit_unknown());
        assert!(send.is_transient() && !send.is_retryable());

        let poll = error("getUpdates", 502, body);
        assert!(!poll.commit_unknown() && poll.is_retryable());

        let html = error("createForumTopic", 504, "<html>gateway timeout</html>");
        assert!(matches!(html, TelegramError::Server { status: 504, .. }));
        assert!(html.commit_unknown());
    }

    #[test]
    fn garbage_and_truncated_bodies_are_malformed() {
        for body in [
            "<html>",
            r#"{"ok":true,"result":{"message_id":"#,
            r#"{"ok":true}"#,
            "",
        ] {
            let send = error("sendMessage", 200, body);
            assert!(
                matches!(
                    send,
                    TelegramError::Malformed {
                        commit_unknown: true,
                        ..
                    }
                ),
                "{body:?} → {send:?}"
            );
            let read = error("getChat", 200, body);
            assert!(read.is_retryable(), "{body:?} → {read:?}");
        }
    }

    #[test]
    fn other_codes() {
        let unauthorized = error(
            "getMe",
            401,
            r#"{"ok":false,"error_code":401,"description":"Unauthorized"}"#,
        );
        assert_eq!(unauthorized, TelegramError::Unauthorized);
        assert!(!unauthorized.is_transient());

        let blocked = error(
            "sendMessage",
            403,
            r#"{"ok":false,"error_code":403,"description":"Forbidden: bot was blocked by the user"}"#,
        );
        assert!(matches!(blocked, TelegramError::Forbidden { .. }));

        let migrated = error(
            "sendMessage",
            400,
            r#"{"ok":false,"error_code":400,"description":"Bad Request: group chat was upgraded to a supergroup chat","parameters":{"migrate_to_chat_id":-1009}}"#,
        );
        assert_eq!(migrated, TelegramError::ChatMigrated { to_chat_id: -1009 });

        let not_found = error(
            "nosuchMethod",
            404,
            r#"{"ok":false,"error_code":404,"description":"Not Found"}"#,
        );
        assert!(matches!(not_found, TelegramError::MethodMissing { .. }));
    }

    #[test]
    fn descriptions_are_redacted() {
        let body = bad_request("odd echo of 123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_");
        let text = error("sendMessage", 400, &body).to_string();
        assert!(
            !text.contains("AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_"),
            "{text}"
        );
        assert!(text.contains("123456789:<redacted>"), "{text}");
    }

    #[test]
    fn idempotence_table() {
        for method in [
            "getUpdates",
            "getMe",
            "getChatMember",
            "deleteWebhook",
            "sendChatAction",
            "editForumTopic",
            "deleteForumTopic",
            "setMyCommands",
        ] {
            assert!(is_idempotent(method), "{method}");
        }
        for method in [
            "sendMessage",
            "createForumTopic",
            "sendPhoto",
            "copyMessage",
            "someNewMethod",
        ] {
            assert!(!is_idempotent(method), "{method}");
        }
    }
}

//! An error answer as the Bot API writes it, for every method, the
//! `reply_markup` checks and the HTTP routes alike.

use serde_json::{Value, json};

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

    /// An upload over its limit (Telegram's front end answers before the API).
    pub fn too_large() -> Self {
        Self::new(413, "Request Entity Too Large")
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

//! What one line from the host is: the demultiplexer's classification.
//!
//! This is pure: a [`Frame`] goes in, an [`Incoming`] comes out, and nothing
//! here can fail or panic on any input. Everything the host could send that
//! is not a well-formed request, notification or response becomes a
//! [`Rejection`], which the transport answers with a JSON-RPC error.

use serde_json::{Map, Value, json};

use crate::framing::Frame;

pub(crate) const PARSE_ERROR: i32 = -32700;
pub(crate) const INVALID_REQUEST: i32 = -32600;
pub(crate) const INTERNAL_ERROR: i32 = -32603;
/// A request beyond [`super::MAX_IN_FLIGHT`]: JSON-RPC's range for
/// implementation-defined server errors.
pub(crate) const SERVER_BUSY: i32 = -32000;

/// One classified line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Incoming {
    /// A call the host expects an answer to; `id` is exactly what it sent.
    Request {
        id: Value,
        method: String,
        params: Option<Value>,
    },
    /// A call without an id: never answered.
    Notification {
        method: String,
        params: Option<Value>,
    },
    /// The host's answer to one of our own requests.
    Response {
        id: Value,
        outcome: Result<Value, Value>,
    },
    /// Not a valid message: answered with this error.
    Rejection(Rejection),
}

/// A JSON-RPC error answer to a line we could not accept.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Rejection {
    /// The offending message's id when it had a valid one, else `null`.
    pub id: Value,
    pub code: i32,
    pub message: String,
}

impl Rejection {
    fn new(id: Value, code: i32, message: impl Into<String>) -> Self {
        Self {
            id,
            code,
            message: message.into(),
        }
    }

    /// The error response line.
    pub fn to_line(&self) -> String {
        error_line(&self.id, self.code, &self.message)
    }
}

/// A JSON-RPC error response as one line.
pub(crate) fn error_line(id: &Value, code: i32, message: &str) -> String {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": { "code": code, "message": message },
    })
    .to_string()
}

/// Classifies one frame read from the host.
pub(crate) fn classify(frame: Frame) -> Incoming {
    let line = match frame {
        Frame::Line(line) => line,
        // A line too long to read is the host's mistake, not ours, so it is
        // an Invalid Request rather than a server error; the message says why.
        Frame::Oversized { len } => {
            return Incoming::Rejection(Rejection::new(
                Value::Null,
                INVALID_REQUEST,
                format!("Invalid Request: line of {len} bytes exceeds the 1 MiB limit"),
            ));
        }
        Frame::NotUtf8 => {
            return Incoming::Rejection(Rejection::new(
                Value::Null,
                PARSE_ERROR,
                "Parse error: line is not valid UTF-8",
            ));
        }
    };
    match serde_json::from_str::<Value>(&line) {
        Ok(Value::Object(object)) => classify_object(object),
        Ok(Value::Array(items)) => {
            let why = if items.is_empty() {
                "Invalid Request: empty batch"
            } else {
                "Invalid Request: batches are not supported"
            };
            Incoming::Rejection(Rejection::new(Value::Null, INVALID_REQUEST, why))
        }
        Ok(_) => Incoming::Rejection(Rejection::new(
            Value::Null,
            INVALID_REQUEST,
            "Invalid Request: not an object",
        )),
        Err(e) => Incoming::Rejection(Rejection::new(
            Value::Null,
            PARSE_ERROR,
            format!("Parse error: {e}"),
        )),
    }
}

/// Whether `id` is an id JSON-RPC allows (string, number or null).
fn is_valid_id(id: &Value) -> bool {
    matches!(id, Value::String(_) | Value::Number(_) | Value::Null)
}

fn classify_object(mut object: Map<String, Value>) -> Incoming {
    let id = object.remove("id");
    let echo = match &id {
        Some(id) if is_valid_id(id) => id.clone(),
        _ => Value::Null,
    };
    let invalid = |why: &str| {
        Incoming::Rejection(Rejection::new(
            echo.clone(),
            INVALID_REQUEST,
            format!("Invalid Request: {why}"),
        ))
    };

    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return invalid("\"jsonrpc\" must be \"2.0\"");
    }
    if id.as_ref().is_some_and(|id| !is_valid_id(id)) {
        return invalid("\"id\" must be a string, a number or null");
    }

    if let Some(method) = object.remove("method") {
        let Value::String(method) = method else {
            return invalid("\"method\" must be a string");
        };
        let params = object.remove("params");
        return match id {
            Some(id) => Incoming::Request { id, method, params },
            None => Incoming::Notification { method, params },
        };
    }

    match (id, object.remove("error"), object.remove("result")) {
        // A response must not carry both; if it does, the error is the more
        // cautious reading.
        (Some(id), Some(error), _) => Incoming::Response {
            id,
            outcome: Err(error),
        },
        (Some(id), None, Some(result)) => Incoming::Response {
            id,
            outcome: Ok(result),
        },
        (Some(_), None, None) => invalid("neither \"method\" nor \"result\"/\"error\""),
        (None, ..) => invalid("no \"method\" and no \"id\""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(text: &str) -> Incoming {
        classify(Frame::Line(text.to_owned()))
    }

    fn rejection(incoming: Incoming) -> Rejection {
        match incoming {
            Incoming::Rejection(r) => r,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn requests_notifications_and_responses() {
        assert_eq!(
            line(r#"{"jsonrpc":"2.0","id":-7,"method":"m","params":{"a":1},"extra":true}"#),
            Incoming::Request {
                id: json!(-7),
                method: "m".into(),
                params: Some(json!({"a":1})),
            }
        );
        assert_eq!(
            line(r#"{"jsonrpc":"2.0","method":"n"}"#),
            Incoming::Notification {
                method: "n".into(),
                params: None,
            }
        );
        assert_eq!(
            line(r#"{"jsonrpc":"2.0","id":3,"result":{"ok":1}}"#),
            Incoming::Response {
                id: json!(3),
                outcome: Ok(json!({"ok":1})),
            }
        );
        assert_eq!(
            line(r#"{"jsonrpc":"2.0","id":3,"result":1,"error":{"code":1}}"#),
            Incoming::Response {
                id: json!(3),
                outcome: Err(json!({"code":1})),
            }
        );
    }

    #[test]
    fn parse_errors_and_batches_answer_with_null_id() {
        for (text, code) in [
            ("not json", PARSE_ERROR),
            (r#"{"jsonrpc":"2.0","id":1"#, PARSE_ERROR),
            ("[]", INVALID_REQUEST),
            (
                r#"[{"jsonrpc":"2.0","id":1,"method":"m"}]"#,
                INVALID_REQUEST,
            ),
            ("42", INVALID_REQUEST),
            ("null", INVALID_REQUEST),
        ] {
            let r = rejection(line(text));
            assert_eq!((r.id, r.code), (Value::Null, code), "{text}");
        }
        let r = rejection(classify(Frame::NotUtf8));
        assert_eq!((r.id, r.code), (Value::Null, PARSE_ERROR));
        let r = rejection(classify(Frame::Oversized { len: 2_000_000 }));
        assert_eq!((r.id, r.code), (Value::Null, INVALID_REQUEST));
        assert!(r.message.contains("1 MiB"), "{}", r.message);
    }

    #[test]
    fn invalid_requests_echo_only_valid_ids() {
        for (text, id) in [
            (r#"{"jsonrpc":"1.0","id":"a","method":"m"}"#, json!("a")),
            (r#"{"id":5,"method":"m"}"#, json!(5)),
            (r#"{"jsonrpc":"2.0","id":5,"method":7}"#, json!(5)),
            (r#"{"jsonrpc":"2.0","id":{},"method":"m"}"#, Value::Null),
            (r#"{"jsonrpc":"2.0","id":[1],"method":"m"}"#, Value::Null),
            (r#"{"jsonrpc":"2.0","id":true,"method":"m"}"#, Value::Null),
            (r#"{"jsonrpc":"2.0","id":9}"#, json!(9)),
            (r#"{"jsonrpc":"2.0"}"#, Value::Null),
        ] {
            let r = rejection(line(text));
            assert_eq!((r.id, r.code), (id, INVALID_REQUEST), "{text}");
        }
    }

    #[test]
    fn error_line_is_a_jsonrpc_error_response() {
        let value: Value = serde_json::from_str(&error_line(&json!("x"), -1, "m")).unwrap();
        assert_eq!(
            value,
            json!({"jsonrpc":"2.0","id":"x","error":{"code":-1,"message":"m"}})
        );
    }
}

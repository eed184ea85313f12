//! What one line from the host is: the demultiplexer's classification.
//!
//! This is pure: a [`Frame`] goes in, a [`FromHost`] comes out, and nothing
//! here can fail or panic on any input. Everything the host could send that
//! is not a well-formed request, notification or response becomes a
//! [`Rejection`], which the transport answers with a JSON-RPC error.
//!
//! A line is parsed once, into its members. A request's id and params stay
//! the host's own text ([`RawValue`]): the id is echoed byte for byte, and
//! the params are parsed once more only into the type of the method they
//! are for.

use std::collections::HashMap;

use serde::Serialize;
use serde::de::IgnoredAny;
use serde_json::Value;
use serde_json::value::RawValue;

use crate::framing::Frame;

pub(crate) const PARSE_ERROR: i32 = -32700;
pub(crate) const INVALID_REQUEST: i32 = -32600;
pub(crate) const INTERNAL_ERROR: i32 = -32603;
/// A request beyond [`super::MAX_IN_FLIGHT`]: JSON-RPC's range for
/// implementation-defined server errors.
pub(crate) const SERVER_BUSY: i32 = -32000;

/// One classified line from the host.
#[derive(Debug, Clone)]
pub(crate) enum FromHost {
    /// A call the host expects an answer to; `id` is exactly what it sent.
    Request {
        id: Box<RawValue>,
        method: String,
        params: Option<Box<RawValue>>,
    },
    /// A call without an id: never answered.
    Notification {
        method: String,
        params: Option<Box<RawValue>>,
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
#[derive(Debug, Clone)]
pub(crate) struct Rejection {
    /// The offending message's id when it had a valid one, else `null`.
    pub id: Box<RawValue>,
    pub code: i32,
    pub message: String,
}

impl Rejection {
    fn new(id: &RawValue, code: i32, message: impl Into<String>) -> Self {
        Self {
            id: id.to_owned(),
            code,
            message: message.into(),
        }
    }

    /// The error response line.
    pub fn to_line(&self) -> String {
        error_line(&self.id, self.code, &self.message)
    }
}

/// An answer on the wire: the id and the result are written as they are.
#[derive(Serialize)]
struct Success<'a> {
    jsonrpc: &'static str,
    id: &'a RawValue,
    result: &'a RawValue,
}

#[derive(Serialize)]
struct Failure<'a> {
    jsonrpc: &'static str,
    id: &'a RawValue,
    error: ErrorObject<'a>,
}

#[derive(Serialize)]
struct ErrorObject<'a> {
    code: i32,
    message: &'a str,
}

/// A JSON-RPC result response as one line.
pub(crate) fn result_line(id: &RawValue, result: &RawValue) -> String {
    serde_json::to_string(&Success {
        jsonrpc: "2.0",
        id,
        result,
    })
    .unwrap_or_else(|e| error_line(id, INTERNAL_ERROR, &format!("Internal error: {e}")))
}

/// A JSON-RPC error response as one line.
pub(crate) fn error_line(id: &RawValue, code: i32, message: &str) -> String {
    let failure = Failure {
        jsonrpc: "2.0",
        id,
        error: ErrorObject { code, message },
    };
    // Strings, an integer and text that is JSON already: nothing here can
    // fail to serialize.
    serde_json::to_string(&failure).unwrap_or_default()
}

/// Classifies one frame read from the host.
pub(crate) fn classify(frame: Frame) -> FromHost {
    let null = RawValue::NULL;
    let line = match frame {
        Frame::Line(line) => line,
        // A line too long to read is the host's mistake, not ours, so it is
        // an Invalid Request rather than a server error; the message says why.
        Frame::Oversized { len } => {
            return FromHost::Rejection(Rejection::new(
                null,
                INVALID_REQUEST,
                format!("Invalid Request: line of {len} bytes exceeds the 1 MiB limit"),
            ));
        }
        Frame::NotUtf8 => {
            return FromHost::Rejection(Rejection::new(
                null,
                PARSE_ERROR,
                "Parse error: line is not valid UTF-8",
            ));
        }
    };
    let parse_error = |e: serde_json::Error| {
        FromHost::Rejection(Rejection::new(
            null,
            PARSE_ERROR,
            format!("Parse error: {e}"),
        ))
    };
    // The first character says what the line can be, so it is parsed once,
    // as that.
    match line
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .as_bytes()
        .first()
    {
        Some(b'{') => match serde_json::from_str::<HashMap<String, &RawValue>>(&line) {
            Ok(members) => classify_object(members),
            Err(e) => parse_error(e),
        },
        Some(b'[') => match serde_json::from_str::<Vec<IgnoredAny>>(&line) {
            Ok(items) => {
                let why = if items.is_empty() {
                    "Invalid Request: empty batch"
                } else {
                    "Invalid Request: batches are not supported"
                };
                FromHost::Rejection(Rejection::new(null, INVALID_REQUEST, why))
            }
            Err(e) => parse_error(e),
        },
        _ => match serde_json::from_str::<IgnoredAny>(&line) {
            Ok(_) => FromHost::Rejection(Rejection::new(
                null,
                INVALID_REQUEST,
                "Invalid Request: not an object",
            )),
            Err(e) => parse_error(e),
        },
    }
}

/// Whether `id` is an id JSON-RPC allows (string, number or null).
fn is_valid_id(id: &RawValue) -> bool {
    matches!(
        id.get().as_bytes().first(),
        Some(b'"' | b'-' | b'0'..=b'9' | b'n')
    )
}

/// A member's value, when it is a string.
fn string(raw: &RawValue) -> Option<String> {
    serde_json::from_str::<String>(raw.get()).ok()
}

/// A member's value as a tree (a response's result or error, which are
/// read once, as whatever their request expects).
fn tree(raw: &RawValue) -> Value {
    serde_json::from_str(raw.get()).unwrap_or(Value::Null)
}

fn classify_object(mut object: HashMap<String, &RawValue>) -> FromHost {
    let id = object.remove("id");
    let echo = match id {
        Some(id) if is_valid_id(id) => id,
        _ => RawValue::NULL,
    };
    let invalid = |why: &str| {
        FromHost::Rejection(Rejection::new(
            echo,
            INVALID_REQUEST,
            format!("Invalid Request: {why}"),
        ))
    };

    if object.get("jsonrpc").and_then(|v| string(v)).as_deref() != Some("2.0") {
        return invalid("\"jsonrpc\" must be \"2.0\"");
    }
    if id.is_some_and(|id| !is_valid_id(id)) {
        return invalid("\"id\" must be a string, a number or null");
    }

    if let Some(method) = object.remove("method") {
        let Some(method) = string(method) else {
            return invalid("\"method\" must be a string");
        };
        let params = object.remove("params").map(ToOwned::to_owned);
        return match id {
            Some(id) => FromHost::Request {
                id: id.to_owned(),
                method,
                params,
            },
            None => FromHost::Notification { method, params },
        };
    }

    match (id, object.remove("error"), object.remove("result")) {
        // A response must not carry both; if it does, the error is the more
        // cautious reading.
        (Some(id), Some(error), _) => FromHost::Response {
            id: tree(id),
            outcome: Err(tree(error)),
        },
        (Some(id), None, Some(result)) => FromHost::Response {
            id: tree(id),
            outcome: Ok(tree(result)),
        },
        (Some(_), None, None) => invalid("neither \"method\" nor \"result\"/\"error\""),
        (None, ..) => invalid("no \"method\" and no \"id\""),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn line(text: &str) -> FromHost {
        classify(Frame::Line(text.to_owned()))
    }

    fn rejection(classified: FromHost) -> Rejection {
        match classified {
            FromHost::Rejection(r) => r,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    fn raw(value: Option<Box<RawValue>>) -> Option<String> {
        value.map(|v| v.get().to_string())
    }

    #[test]
    fn requests_notifications_and_responses() {
        let FromHost::Request { id, method, params } = line(
            r#"{"jsonrpc":"2.0","id":-7.50,"method":"m","params":{ "a" : 1e3 },"extra":true}"#,
        ) else {
            panic!("a request");
        };
        // The host's own text, byte for byte.
        assert_eq!(id.get(), "-7.50");
        assert_eq!(method, "m");
        assert_eq!(raw(params).as_deref(), Some(r#"{ "a" : 1e3 }"#));
        let FromHost::Notification { method, params } = line(r#" {"jsonrpc":"2.0","method":"n"}"#)
        else {
            panic!("a notification");
        };
        assert_eq!((method.as_str(), raw(params)), ("n", None));
        let FromHost::Response { id, outcome } =
            line(r#"{"jsonrpc":"2.0","id":3,"result":{"ok":1}}"#)
        else {
            panic!("a response");
        };
        assert_eq!((id, outcome), (json!(3), Ok(json!({"ok":1}))));
        let FromHost::Response { id, outcome } =
            line(r#"{"jsonrpc":"2.0","id":3,"result":1,"error":{"code":1}}"#)
        else {
            panic!("a response");
        };
        assert_eq!((id, outcome), (json!(3), Err(json!({"code":1}))));
    }

    #[test]
    fn parse_errors_and_batches_answer_with_null_id() {
        for (text, code) in [
            ("not json", PARSE_ERROR),
            (r#"{"jsonrpc":"2.0","id":1"#, PARSE_ERROR),
            (r#"{"jsonrpc":"2.0","id":1} x"#, PARSE_ERROR),
            ("[1,", PARSE_ERROR),
            ("", PARSE_ERROR),
            ("[]", INVALID_REQUEST),
            (
                r#"[{"jsonrpc":"2.0","id":1,"method":"m"}]"#,
                INVALID_REQUEST,
            ),
            ("42", INVALID_REQUEST),
            ("null", INVALID_REQUEST),
        ] {
            let r = rejection(line(text));
            assert_eq!((r.id.get(), r.code), ("null", code), "{text}");
        }
        let r = rejection(classify(Frame::NotUtf8));
        assert_eq!((r.id.get(), r.code), ("null", PARSE_ERROR));
        let r = rejection(classify(Frame::Oversized { len: 2_000_000 }));
        assert_eq!((r.id.get(), r.code), ("null", INVALID_REQUEST));
        assert!(r.message.contains("1 MiB"), "{}", r.message);
    }

    #[test]
    fn invalid_requests_echo_only_valid_ids() {
        for (text, id) in [
            (r#"{"jsonrpc":"1.0","id":"a","method":"m"}"#, r#""a""#),
            (r#"{"id":5,"method":"m"}"#, "5"),
            (r#"{"jsonrpc":"2.0","id":5,"method":7}"#, "5"),
            (r#"{"jsonrpc":"2.0","id":{},"method":"m"}"#, "null"),
            (r#"{"jsonrpc":"2.0","id":[1],"method":"m"}"#, "null"),
            (r#"{"jsonrpc":"2.0","id":true,"method":"m"}"#, "null"),
            (r#"{"jsonrpc":"2.0","id":9}"#, "9"),
            (r#"{"jsonrpc":"2.0"}"#, "null"),
        ] {
            let r = rejection(line(text));
            assert_eq!((r.id.get(), r.code), (id, INVALID_REQUEST), "{text}");
        }
    }

    #[test]
    fn answers_write_the_id_and_the_result_as_they_are() {
        let id = RawValue::from_string("1E2".into()).unwrap();
        let value: Value = serde_json::from_str(&error_line(&id, -1, "m")).unwrap();
        assert_eq!(
            value,
            json!({"jsonrpc":"2.0","id":100.0,"error":{"code":-1,"message":"m"}})
        );
        let result = RawValue::from_string(r#"{ "a" : 1e3 }"#.into()).unwrap();
        assert_eq!(
            result_line(&id, &result),
            r#"{"jsonrpc":"2.0","id":1E2,"result":{ "a" : 1e3 }}"#
        );
    }
}

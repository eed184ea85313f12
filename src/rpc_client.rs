//! The calling end of a JSON-RPC connection, as the host's end of the host
//! protocol (`host_client.rs`) and Codex's client (`codex/app_server.rs`)
//! both are: our requests waiting for their responses by id, and what
//! every other message from the other end is.
//!
//! Lenient where the serving end (`src/host/`) is strict: a message is
//! read for its `method` and `id` only, with or without `"jsonrpc"` (Codex
//! leaves it out). A message with a method and an id (not `null`) is a
//! request to us, one with a method only a notification, one without a
//! method a response. Our ids are numbers from 1 up, so a response with
//! any other id (`null`: the other end could not read a line of ours) is
//! one no request waits for.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde_json::Value;
use tokio::sync::oneshot;

/// A message from the other end that no request of ours took.
#[derive(Debug, Clone, PartialEq)]
pub enum Unasked {
    /// A request to us; the answer names this `id`.
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// A response no request waits for: to a line the other end could not
    /// read (id `null`), or after its request timed out.
    Response(Value),
}

/// Our requests waiting for their responses (the whole response message),
/// by id. Closed once the other end is gone: every request waiting learns
/// it, and a request made after that fails at once instead of waiting out
/// its timeout.
#[derive(Debug)]
pub struct Waiters {
    waiting: Mutex<ById>,
    next_id: AtomicU64,
}

#[derive(Debug, Default)]
struct ById {
    by_id: HashMap<u64, oneshot::Sender<Value>>,
    closed: bool,
}

impl Default for Waiters {
    fn default() -> Self {
        Self {
            waiting: Mutex::default(),
            // A peer echoing `0` for "unknown" never settles a request.
            next_id: AtomicU64::new(1),
        }
    }
}

impl Waiters {
    /// A new request's id, and where its response arrives; `None` once the
    /// other end is gone.
    pub fn start(&self) -> Option<(u64, oneshot::Receiver<Value>)> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let mut waiting = self.lock();
        if waiting.closed {
            return None;
        }
        waiting.by_id.insert(id, tx);
        Some((id, rx))
    }

    /// Stops waiting for a request's response (it timed out, or was never
    /// sent).
    pub fn forget(&self, id: u64) {
        self.lock().by_id.remove(&id);
    }

    /// The other end is gone.
    pub fn close(&self) {
        let mut waiting = self.lock();
        waiting.closed = true;
        waiting.by_id.clear();
    }

    /// Settles a response with the request waiting for it; anything else
    /// is returned, as what the other end said on its own.
    pub fn take(&self, message: Value) -> Option<Unasked> {
        let method = message.get("method").and_then(Value::as_str);
        let id = message.get("id").filter(|id| !id.is_null());
        let params = || message.get("params").cloned().unwrap_or(Value::Null);
        match (method, id) {
            (Some(method), Some(id)) => Some(Unasked::Request {
                id: id.clone(),
                method: method.to_owned(),
                params: params(),
            }),
            (Some(method), None) => Some(Unasked::Notification {
                method: method.to_owned(),
                params: params(),
            }),
            (None, id) => {
                let waiter = id
                    .and_then(Value::as_u64)
                    .and_then(|id| self.lock().by_id.remove(&id));
                match waiter {
                    Some(waiter) => {
                        // A request that gave up meanwhile drops it.
                        let _ = waiter.send(message);
                        None
                    }
                    None => Some(Unasked::Response(message)),
                }
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, ById> {
        // Every critical section is one map operation: a panic elsewhere
        // leaves the map whole, and must not take every later request down.
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A response's outcome: its `result` (`null` when it has none), or its
/// error's code and message.
pub fn outcome(response: &Value) -> Result<Value, (i64, String)> {
    match response.get("error") {
        Some(error) => Err((
            error.get("code").and_then(Value::as_i64).unwrap_or(0),
            error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        )),
        None => Ok(response.get("result").cloned().unwrap_or(Value::Null)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_message_is_read_by_its_method_and_id_with_or_without_jsonrpc() {
        let waiters = Waiters::default();
        let request = json!({"id": "a", "method": "m", "params": [1]});
        assert_eq!(
            waiters.take(request),
            Some(Unasked::Request {
                id: json!("a"),
                method: "m".into(),
                params: json!([1])
            })
        );
        for notification in [
            json!({"jsonrpc": "2.0", "method": "n"}),
            json!({"method": "n", "id": null}),
        ] {
            assert_eq!(
                waiters.take(notification),
                Some(Unasked::Notification {
                    method: "n".into(),
                    params: Value::Null
                })
            );
        }
    }

    #[test]
    fn a_response_settles_its_request_once_and_only_ours() {
        let waiters = Waiters::default();
        let (id, mut answer) = waiters.start().unwrap();
        assert_eq!(id, 1, "ids start at 1");
        let response = json!({"id": id, "result": 7});
        assert_eq!(waiters.take(response.clone()), None);
        assert_eq!(answer.try_recv().unwrap(), response);
        assert_eq!(
            waiters.take(response.clone()),
            Some(Unasked::Response(response)),
            "a second answer is nobody's"
        );
        for stray in [
            json!({"id": null, "error": {}}),
            json!({"id": -1, "result": 0}),
        ] {
            assert_eq!(waiters.take(stray.clone()), Some(Unasked::Response(stray)));
        }
    }

    #[test]
    fn once_closed_waiting_requests_fail_and_new_ones_are_refused() {
        let waiters = Waiters::default();
        let (_, mut answer) = waiters.start().unwrap();
        waiters.close();
        assert!(matches!(
            answer.try_recv(),
            Err(oneshot::error::TryRecvError::Closed)
        ));
        assert!(waiters.start().is_none());
    }

    #[test]
    fn an_outcome_is_the_result_or_the_errors_code_and_message() {
        assert_eq!(outcome(&json!({"id": 1, "result": [2]})), Ok(json!([2])));
        assert_eq!(outcome(&json!({"id": 1})), Ok(Value::Null));
        assert_eq!(
            outcome(&json!({"id": 1, "error": {"code": -32601, "message": "no"}})),
            Err((-32601, "no".into()))
        );
    }
}

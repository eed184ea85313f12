//! A minimal JSON-RPC host: the side of the host protocol a coding agent
//! plays. It spawns a sidecar, sends requests and matches their responses by
//! id, sends notifications, and hands everything the sidecar says on its own
//! (notifications and its requests to the host) to one channel so the caller
//! decides how to answer.
//!
//! The demo drives its simulated agents with it; anything else that needs to
//! play host to a real sidecar process can too. It reads stdout with the
//! crate's one line codec, so it frames exactly as the sidecar does.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::FramedRead;

use crate::framing::{Frame, LineCodec};

/// What the sidecar says without being asked.
#[derive(Debug, Clone, PartialEq)]
pub enum FromSidecar {
    Notification {
        method: String,
        params: Value,
    },
    /// A request to the host; answer it with [`Link::respond`] (or
    /// [`Link::respond_error`]) and this `id`.
    Request {
        id: Value,
        method: String,
        params: Value,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot spawn the sidecar: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("the sidecar closed its stdio")]
    Closed,
    #[error("the sidecar did not answer {method} within {} s", after.as_secs_f64())]
    Timeout { method: String, after: Duration },
    #[error("the sidecar answered {method} with error {code}: {message}")]
    Rpc {
        method: String,
        code: i64,
        message: String,
    },
}

/// A response as it came: `result`, or the error's code and message.
type Answer = Result<Value, (i64, String)>;

/// Requests waiting for their response. `closed` once stdout ended, so a
/// request sent after that fails at once instead of waiting out its timeout.
#[derive(Debug, Default)]
struct Waiters {
    by_id: HashMap<u64, oneshot::Sender<Answer>>,
    closed: bool,
}

type Pending = Arc<Mutex<Waiters>>;

/// A spawned sidecar. Dropping it kills the process (SIGKILL) and closes its
/// stdin.
#[derive(Debug)]
pub struct Sidecar {
    child: Child,
    link: Link,
}

/// The sending half of a sidecar's stdio; clones share it, so a task that
/// answers the sidecar's requests needs no access to the process.
#[derive(Debug, Clone)]
pub struct Link {
    lines: mpsc::UnboundedSender<String>,
    pending: Pending,
    next_id: Arc<AtomicU64>,
}

impl Sidecar {
    /// Spawns `command` with piped stdin and stdout (stderr is left as the
    /// command has it) and starts reading. The receiver yields what the
    /// sidecar says on its own and ends when its stdout closes.
    pub fn spawn(
        mut command: Command,
    ) -> Result<(Self, mpsc::UnboundedReceiver<FromSidecar>), HostError> {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(HostError::Spawn)?;
        let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.start_kill();
            return Err(HostError::Spawn(std::io::Error::other(
                "the child has no stdio pipes",
            )));
        };

        let (lines, mut outgoing) = mpsc::unbounded_channel::<String>();
        // One task owns stdin so that answering never waits on reading; it
        // ends, closing stdin, when every `Link` is gone.
        tokio::spawn(async move {
            while let Some(mut line) = outgoing.recv().await {
                line.push('\n');
                if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
        });

        let pending: Pending = Arc::default();
        let (events, incoming) = mpsc::unbounded_channel();
        let waiting = pending.clone();
        tokio::spawn(async move {
            let mut frames = FramedRead::new(stdout, LineCodec::default());
            while let Some(Ok(frame)) = frames.next().await {
                // stdout carries protocol only; anything else is the
                // sidecar's bug, not something a host could act on.
                let Frame::Line(line) = frame else { continue };
                let Ok(message) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if let Some(event) = route(message, &waiting) {
                    // Nobody listening is fine: responses still matter.
                    let _ = events.send(event);
                }
            }
            // Every request still waiting learns the sidecar is gone.
            let mut waiters = lock(&waiting);
            waiters.closed = true;
            waiters.by_id.clear();
        });

        let link = Link {
            lines,
            pending,
            next_id: Arc::new(AtomicU64::new(1)),
        };
        Ok((Self { child, link }, incoming))
    }

    pub fn link(&self) -> &Link {
        &self.link
    }

    /// The process id, while the process has not been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Sends SIGKILL (no goodbye: what a crash looks like to the others).
    pub fn kill(&mut self) -> std::io::Result<()> {
        self.child.start_kill()
    }

    /// Waits up to `timeout` for the process to exit; `false` if it did not.
    pub async fn wait_exit(&mut self, timeout: Duration) -> bool {
        matches!(
            tokio::time::timeout(timeout, self.child.wait()).await,
            Ok(Ok(_))
        )
    }
}

/// Settles a response with its waiter, or turns the message into an event.
fn route(message: Value, pending: &Pending) -> Option<FromSidecar> {
    let method = message.get("method").and_then(Value::as_str);
    match (method, message.get("id")) {
        (Some(method), Some(id)) if !id.is_null() => Some(FromSidecar::Request {
            id: id.clone(),
            method: method.to_owned(),
            params: message.get("params").cloned().unwrap_or(Value::Null),
        }),
        (Some(method), _) => Some(FromSidecar::Notification {
            method: method.to_owned(),
            params: message.get("params").cloned().unwrap_or(Value::Null),
        }),
        (None, id) => {
            let waiter = id
                .and_then(Value::as_u64)
                .and_then(|id| lock(pending).by_id.remove(&id))?;
            let answer = match message.get("error") {
                Some(error) => Err((
                    error.get("code").and_then(Value::as_i64).unwrap_or(0),
                    error
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                )),
                None => Ok(message.get("result").cloned().unwrap_or(Value::Null)),
            };
            let _ = waiter.send(answer);
            None
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panicked reader must not take every later request down with it.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Link {
    /// Sends a request and waits up to `timeout` for its `result`.
    pub async fn request(
        &self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, HostError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut waiters = lock(&self.pending);
            if waiters.closed {
                return Err(HostError::Closed);
            }
            waiters.by_id.insert(id, tx);
        }
        let sent =
            self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        if let Err(e) = sent {
            lock(&self.pending).by_id.remove(&id);
            return Err(e);
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(result))) => Ok(result),
            Ok(Ok(Err((code, message)))) => Err(HostError::Rpc {
                method: method.to_owned(),
                code,
                message,
            }),
            Ok(Err(_)) => Err(HostError::Closed),
            Err(_) => {
                lock(&self.pending).by_id.remove(&id);
                Err(HostError::Timeout {
                    method: method.to_owned(),
                    after: timeout,
                })
            }
        }
    }

    pub fn notify(&self, method: &str, params: Value) -> Result<(), HostError> {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }

    /// Answers one of the sidecar's requests.
    pub fn respond(&self, id: Value, result: Value) -> Result<(), HostError> {
        self.send(json!({"jsonrpc": "2.0", "id": id, "result": result}))
    }

    /// Refuses one of the sidecar's requests.
    pub fn respond_error(&self, id: Value, code: i64, message: &str) -> Result<(), HostError> {
        self.send(json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {"code": code, "message": message},
        }))
    }

    fn send(&self, message: Value) -> Result<(), HostError> {
        self.lines
            .send(message.to_string())
            .map_err(|_| HostError::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(text: &str) -> Command {
        let mut command = Command::new("sh");
        command.arg("-c").arg(text);
        command
    }

    const WAIT: Duration = Duration::from_secs(10);

    #[tokio::test]
    async fn responses_reach_their_request_and_the_rest_is_an_event() {
        // A stand-in sidecar: says something on its own, asks the host a
        // question, then answers the first request it reads, out of order
        // with a stray response nobody waits for.
        let (sidecar, mut incoming) = Sidecar::spawn(script(
            r#"echo '{"jsonrpc":"2.0","method":"ui/setStatus","params":{"text":"hi"}}'
               echo 'not json'
               echo '{"jsonrpc":"2.0","id":"q1","method":"ui/confirm","params":{}}'
               read request
               echo '{"jsonrpc":"2.0","id":99,"result":"stray"}'
               echo '{"jsonrpc":"2.0","id":1,"result":{"ok":true}}'
               read answer"#,
        ))
        .unwrap();
        let result = sidecar
            .link()
            .request("initialize", json!({}), WAIT)
            .await
            .unwrap();
        assert_eq!(result, json!({"ok": true}));
        assert_eq!(
            incoming.recv().await,
            Some(FromSidecar::Notification {
                method: "ui/setStatus".into(),
                params: json!({"text": "hi"}),
            })
        );
        let Some(FromSidecar::Request { id, method, .. }) = incoming.recv().await else {
            panic!("expected the sidecar's request");
        };
        assert_eq!((id.clone(), method.as_str()), (json!("q1"), "ui/confirm"));
        sidecar
            .link()
            .respond(id, json!({"confirmed": true}))
            .unwrap();
        assert_eq!(
            incoming.recv().await,
            None,
            "stdout closed after the script"
        );
    }

    #[tokio::test]
    async fn an_error_answer_and_a_dead_sidecar_are_errors_not_hangs() {
        let (sidecar, _incoming) = Sidecar::spawn(script(
            r#"read request
               echo '{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"no such method"}}'
               read request"#,
        ))
        .unwrap();
        let link = sidecar.link().clone();
        let refused = link.request("nope", json!({}), WAIT).await;
        assert!(
            matches!(refused, Err(HostError::Rpc { code: -32601, .. })),
            "{refused:?}"
        );
        // The script exits after reading this one without answering.
        let orphaned = link.request("initialize", json!({}), WAIT).await;
        assert!(matches!(orphaned, Err(HostError::Closed)), "{orphaned:?}");
    }

    #[tokio::test]
    async fn a_silent_sidecar_times_out_and_kill_ends_it() {
        let (mut sidecar, _incoming) = Sidecar::spawn(script("sleep 30")).unwrap();
        let silent = sidecar
            .link()
            .request("initialize", json!({}), Duration::from_millis(50))
            .await;
        assert!(
            matches!(silent, Err(HostError::Timeout { .. })),
            "{silent:?}"
        );
        sidecar.kill().unwrap();
        assert!(sidecar.wait_exit(WAIT).await);
    }
}

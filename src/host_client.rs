//! The host's end of the host protocol: the side a coding agent plays. It
//! spawns a sidecar, sends requests and matches their responses by id,
//! sends notifications, and hands everything the sidecar says on its own
//! (its notifications and its requests to the host) to one channel, each
//! stamped with the instant its line was read, so the caller decides how to
//! answer and can measure when a prompt arrived.
//!
//! The demo, the benchmark and the integration tests all play host with
//! it; each adds only what it needs on top (an inbox and auto-answers for
//! the tests, prompt timestamps for the benchmark). It frames stdout with
//! the crate's one line codec, exactly as the sidecar frames it.

use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot};
use tokio_util::codec::FramedRead;

use crate::framing::{Frame, LineCodec};
use crate::rpc_client::{Unasked, Waiters};

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
    /// A response no request of ours waits for: the error answering a line
    /// the sidecar could not read (id `null`), or an answer after its
    /// request timed out.
    Response(Value),
    /// A line on stdout that is not JSON: the sidecar's bug (stdout
    /// carries protocol only), reported so tests can assert there is none.
    NotJson(String),
}

/// One thing the sidecar said, and when its line was read.
#[derive(Debug, Clone)]
pub struct Said {
    pub message: FromSidecar,
    pub at: Instant,
}

/// Which way a recorded message went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    ToSidecar,
    FromSidecar,
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

type Traffic = Arc<Mutex<Vec<(Direction, Value)>>>;

enum Out {
    Line(String),
    /// Close stdin, as a host does when it goes away.
    Close,
}

/// A spawned sidecar. Dropping it kills the process (SIGKILL, after a
/// SIGCONT in case a test stopped it) and closes its stdin.
#[derive(Debug)]
pub struct Sidecar {
    child: Child,
    link: Link,
}

/// The sending half of a sidecar's stdio; clones share it, so a task that
/// answers the sidecar's requests needs no access to the process.
#[derive(Debug, Clone)]
pub struct Link {
    lines: mpsc::UnboundedSender<Out>,
    /// Our requests waiting; closed once stdout ended.
    calls: Arc<Waiters>,
    traffic: Option<Traffic>,
}

impl std::fmt::Debug for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Out::Line(line) => write!(f, "Line({line:?})"),
            Out::Close => write!(f, "Close"),
        }
    }
}

impl Sidecar {
    /// Spawns `command` with piped stdin and stdout (stderr is left as the
    /// command has it) and starts reading. The receiver yields what the
    /// sidecar says on its own and ends when its stdout closes.
    pub fn spawn(command: Command) -> Result<(Self, mpsc::UnboundedReceiver<Said>), HostError> {
        Self::spawn_with(command, false)
    }

    /// Like [`Sidecar::spawn`]; with `record`, every message both ways is
    /// kept for [`Link::traffic`] (tests check it against the schemas).
    pub fn spawn_with(
        mut command: Command,
        record: bool,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Said>), HostError> {
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true);
        let mut child = command.spawn().map_err(HostError::Spawn)?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.start_kill();
            return Err(HostError::Spawn(std::io::Error::other(
                "the child has no stdio pipes",
            )));
        };

        let (link, incoming) = Link::over(stdout, stdin, record);
        Ok((Self { child, link }, incoming))
    }

    pub fn link(&self) -> &Link {
        &self.link
    }

    /// The process id, while the process has not been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Whether the process still runs (it is reaped when it has exited).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends `signal` to the process (false when it is gone).
    pub fn signal(&self, signal: i32) -> bool {
        self.child
            .id()
            .is_some_and(|pid| crate::sys::signal(pid, signal))
    }

    /// Sends SIGKILL (no goodbye: what a crash looks like to the others).
    pub fn kill(&mut self) -> std::io::Result<()> {
        self.child.start_kill()
    }

    /// Waits up to `timeout` for the process to exit; its exit code, or
    /// `None` (killed by a signal); `Err(())` when it did not exit in time.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<Option<i32>, ()> {
        match tokio::time::timeout(timeout, self.child.wait()).await {
            Ok(Ok(status)) => Ok(status.code()),
            _ => Err(()),
        }
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        // A SIGSTOPped child must be continued to die promptly.
        self.signal(crate::sys::SIGCONT);
        let _ = self.child.start_kill();
    }
}

impl Link {
    /// The host's end over any pair of pipes: `output` is what the sidecar
    /// writes (its stdout), `stdin` what it reads. A sidecar served in the
    /// same process (the MCP server's session) is driven this way.
    pub fn over<R, W>(
        output: R,
        mut stdin: W,
        record: bool,
    ) -> (Link, mpsc::UnboundedReceiver<Said>)
    where
        R: tokio::io::AsyncRead + Unpin + Send + 'static,
        W: tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (lines, mut outgoing) = mpsc::unbounded_channel::<Out>();
        // One task owns stdin so that answering never waits on reading; it
        // ends, closing stdin, when every `Link` is gone or on `Close`.
        crate::tasks::spawn(async move {
            while let Some(Out::Line(mut line)) = outgoing.recv().await {
                line.push('\n');
                if stdin.write_all(line.as_bytes()).await.is_err() || stdin.flush().await.is_err() {
                    break;
                }
            }
        });

        let calls = Arc::new(Waiters::default());
        let traffic: Option<Traffic> = record.then(Traffic::default);
        let (events, incoming) = mpsc::unbounded_channel();
        let waiting = calls.clone();
        let recorded = traffic.clone();
        crate::tasks::spawn(async move {
            let mut frames = FramedRead::new(output, LineCodec::default());
            while let Some(Ok(frame)) = frames.next().await {
                let at = Instant::now();
                let line = match frame {
                    Frame::Line(line) => line,
                    Frame::NotUtf8 => String::from("<not UTF-8>"),
                    Frame::Oversized { .. } => String::from("<oversized line>"),
                };
                let message = match serde_json::from_str::<Value>(&line) {
                    Ok(message) => message,
                    Err(_) => {
                        let _ = events.send(Said {
                            message: FromSidecar::NotJson(line),
                            at,
                        });
                        continue;
                    }
                };
                if let Some(traffic) = &recorded {
                    lock(traffic).push((Direction::FromSidecar, message.clone()));
                }
                if let Some(unasked) = waiting.take(message) {
                    let message = match unasked {
                        Unasked::Request { id, method, params } => {
                            FromSidecar::Request { id, method, params }
                        }
                        Unasked::Notification { method, params } => {
                            FromSidecar::Notification { method, params }
                        }
                        Unasked::Response(response) => FromSidecar::Response(response),
                    };
                    // Nobody listening is fine: responses still matter.
                    let _ = events.send(Said { message, at });
                }
            }
            // Every request still waiting learns the sidecar is gone.
            waiting.close();
        });

        let link = Link {
            lines,
            calls,
            traffic,
        };
        (link, incoming)
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
        let response = self.request_message(method, params, timeout).await?;
        crate::rpc_client::outcome(&response).map_err(|(code, message)| HostError::Rpc {
            method: method.to_owned(),
            code,
            message,
        })
    }

    /// Sends a request and waits up to `timeout` for the whole response.
    pub async fn request_message(
        &self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, HostError> {
        let answer = self.request_later(method, params)?;
        tokio::time::timeout(timeout, answer)
            .await
            .map_err(|_| HostError::Timeout {
                method: method.to_owned(),
                after: timeout,
            })?
            .map_err(|_| HostError::Closed)
    }

    /// Sends a request now; its whole response arrives on the receiver, so
    /// several requests may overlap.
    pub fn request_later(
        &self,
        method: &str,
        params: Value,
    ) -> Result<oneshot::Receiver<Value>, HostError> {
        let (id, rx) = self.calls.start().ok_or(HostError::Closed)?;
        let sent =
            self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        if let Err(e) = sent {
            self.calls.forget(id);
            return Err(e);
        }
        Ok(rx)
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

    /// Answers what the sidecar asks of the host a bridge plays in process,
    /// until it is gone: each request with `answer`'s result, on a task of
    /// its own (a prompt may wait on the agent); its notifications (the
    /// status line, notices) go to the log, such a host having no place
    /// for them.
    pub fn answer_requests<F, Fut>(&self, mut from: mpsc::UnboundedReceiver<Said>, answer: F)
    where
        F: Fn(String, Value) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Result<Value, (i64, String)>> + Send + 'static,
    {
        let link = self.clone();
        crate::tasks::spawn(async move {
            while let Some(Said { message, .. }) = from.recv().await {
                match message {
                    FromSidecar::Request { id, method, params } => {
                        let (link, answered) = (link.clone(), answer(method, params));
                        crate::tasks::spawn(async move {
                            let sent = match answered.await {
                                Ok(result) => link.respond(id, result),
                                Err((code, why)) => link.respond_error(id, code, &why),
                            };
                            if let Err(e) = sent {
                                tracing::debug!("the session is gone: {e}");
                            }
                        });
                    }
                    FromSidecar::Notification { method, params } => {
                        tracing::debug!(method, %params, "from the session");
                    }
                    FromSidecar::Response(_) | FromSidecar::NotJson(_) => {}
                }
            }
        });
    }

    /// Writes one line as it is (tests send broken ones on purpose).
    pub fn send_line(&self, line: &str) -> Result<(), HostError> {
        if let (Some(traffic), Ok(value)) = (&self.traffic, serde_json::from_str::<Value>(line)) {
            lock(traffic).push((Direction::ToSidecar, value));
        }
        self.lines
            .send(Out::Line(line.to_owned()))
            .map_err(|_| HostError::Closed)
    }

    /// Closes the sidecar's stdin, as a host does when it goes away.
    pub fn close(&self) {
        let _ = self.lines.send(Out::Close);
    }

    /// Every message both ways so far (empty unless spawned recording).
    pub fn traffic(&self) -> Vec<(Direction, Value)> {
        self.traffic
            .as_ref()
            .map(|t| lock(t).clone())
            .unwrap_or_default()
    }

    fn send(&self, message: Value) -> Result<(), HostError> {
        self.send_line(&message.to_string())
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
        let (sidecar, mut incoming) = Sidecar::spawn_with(
            script(
                r#"echo '{"jsonrpc":"2.0","method":"ui/setStatus","params":{"text":"hi"}}'
               echo 'not json'
               echo '{"jsonrpc":"2.0","id":"q1","method":"ui/confirm","params":{}}'
               read request
               echo '{"jsonrpc":"2.0","id":99,"result":"stray"}'
               echo '{"jsonrpc":"2.0","id":1,"result":{"ok":true}}'
               read answer"#,
            ),
            true,
        )
        .unwrap();
        let result = sidecar
            .link()
            .request("initialize", json!({}), WAIT)
            .await
            .unwrap();
        assert_eq!(result, json!({"ok": true}));
        let mut next = async || incoming.recv().await.map(|i| i.message);
        assert_eq!(
            next().await,
            Some(FromSidecar::Notification {
                method: "ui/setStatus".into(),
                params: json!({"text": "hi"}),
            })
        );
        assert_eq!(next().await, Some(FromSidecar::NotJson("not json".into())));
        let Some(FromSidecar::Request { id, method, .. }) = next().await else {
            panic!("expected the sidecar's request");
        };
        assert_eq!((id.clone(), method.as_str()), (json!("q1"), "ui/confirm"));
        sidecar
            .link()
            .respond(id, json!({"confirmed": true}))
            .unwrap();
        assert_eq!(
            next().await,
            Some(FromSidecar::Response(
                json!({"jsonrpc":"2.0","id":99,"result":"stray"})
            ))
        );
        assert_eq!(next().await, None, "stdout closed after the script");
        let directions: Vec<Direction> = sidecar.link().traffic().iter().map(|(d, _)| *d).collect();
        assert_eq!(directions.len(), 6, "{directions:?}");
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
    async fn a_silent_sidecar_times_out_closing_stdin_ends_it_and_kill_ends_it() {
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
        assert!(sidecar.wait_exit(WAIT).await.is_ok());

        let (mut reader, _incoming) = Sidecar::spawn(script("cat >/dev/null")).unwrap();
        reader.link().close();
        assert_eq!(reader.wait_exit(WAIT).await, Ok(Some(0)), "EOF ends cat");
    }
}

//! A client of Codex's app-server: JSON-RPC 2.0 as Codex speaks it (no
//! `"jsonrpc"` member), over either of the app-server's transports —
//! WebSocket on the unix socket of `codex app-server --listen unix://PATH`
//! (one message per text frame), or the stdio of `codex app-server` (one
//! object per line).
//!
//! Transport apart from meaning, as `src/host/` does it: the transport is a
//! stream of incoming texts and a sink of outgoing ones ([`Transport`]),
//! joined to the rest by two loops — a writer that owns the sink and a
//! reader that settles each response with the request waiting for it and
//! hands everything else (the app-server's notifications and its requests
//! to its clients) to one channel; each message is classified as the
//! host's end of the host protocol classifies the sidecar's
//! (`crate::rpc_client`). What a message *means* is the bridge's
//! business; this file never looks past `method` and `id`.
//!
//! A message over [`MAX_MESSAGE`] is dropped (logged): the largest the relay
//! reads is an item with a command's whole output.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Sink, SinkExt, Stream, StreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;
use tokio_util::codec::{FramedRead, FramedWrite};

use super::wire;
use crate::framing::{Frame, LineCodec};
use crate::rpc_client::{Unasked, Waiters};

/// The largest message read or written, either transport.
pub const MAX_MESSAGE: usize = 16 << 20;

/// How long `initialize` may take: the app-server answers it at once.
const INITIALIZE_WAIT: Duration = Duration::from_secs(20);

/// What the app-server says without being asked.
#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    Notification {
        method: String,
        params: Value,
    },
    /// A request to its clients (an approval, a question); answer it with
    /// [`AppServer::respond`] and this `id`, or leave it to another client.
    Request {
        id: Value,
        method: String,
        params: Value,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum AppServerError {
    #[error("cannot reach Codex's app-server at {}: {source}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("Codex's app-server refused the WebSocket handshake: {0}")]
    Handshake(String),
    #[error("the connection to Codex's app-server is closed")]
    Closed,
    #[error("Codex's app-server did not answer {method} within {} s", after.as_secs())]
    Timeout { method: String, after: Duration },
    #[error("Codex's app-server answered {method} with error {code}: {message}")]
    Rpc {
        method: String,
        code: i64,
        message: String,
    },
    #[error("Codex's app-server answered {method} with something unreadable: {message}")]
    Decode { method: String, message: String },
}

/// Incoming texts and the sink for outgoing ones: all the two loops need
/// of a transport.
pub struct Transport {
    incoming: Pin<Box<dyn Stream<Item = io::Result<String>> + Send>>,
    outgoing: Pin<Box<dyn Sink<String, Error = io::Error> + Send>>,
}

impl Transport {
    /// WebSocket over the app-server's unix socket. The handshake names
    /// `ws://localhost/`, as Codex's own TUI does with `--remote unix://`.
    pub async fn unix_websocket(socket: &Path) -> Result<Self, AppServerError> {
        let stream = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|source| AppServerError::Connect {
                path: socket.to_path_buf(),
                source,
            })?;
        let config = tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        let (socket, _response) =
            tokio_tungstenite::client_async_with_config("ws://localhost/", stream, Some(config))
                .await
                .map_err(|e| AppServerError::Handshake(e.to_string()))?;
        let (sink, stream) = socket.split();
        let outgoing = sink
            .sink_map_err(io::Error::other)
            .with(|text: String| futures::future::ready(Ok(Message::text(text))));
        // Pings are answered by the WebSocket layer; only text carries
        // messages, and a close frame ends the stream.
        let incoming = stream
            .take_while(|frame| futures::future::ready(!matches!(frame, Ok(Message::Close(_)))))
            .filter_map(|frame| {
                futures::future::ready(match frame {
                    Ok(Message::Text(text)) => Some(Ok(text.as_str().to_owned())),
                    Ok(_) => None,
                    Err(e) => Some(Err(io::Error::other(e))),
                })
            });
        Ok(Self {
            incoming: Box::pin(incoming),
            outgoing: Box::pin(outgoing),
        })
    }

    /// Lines over a child's stdio: `output` is what `codex app-server`
    /// writes (its stdout), `input` what it reads.
    pub fn stdio<R, W>(output: R, input: W) -> Self
    where
        R: AsyncRead + Send + 'static,
        W: AsyncWrite + Send + 'static,
    {
        let incoming = FramedRead::new(output, LineCodec::new(MAX_MESSAGE)).filter_map(|frame| {
            futures::future::ready(match frame {
                Ok(Frame::Line(line)) => Some(Ok(line)),
                Ok(Frame::Oversized { len }) => {
                    tracing::warn!(
                        len,
                        "a message from Codex's app-server was too long; dropped"
                    );
                    None
                }
                Ok(Frame::NotUtf8) => {
                    tracing::warn!("a message from Codex's app-server was not UTF-8; dropped");
                    None
                }
                Err(e) => Some(Err(e)),
            })
        });
        Self {
            incoming: Box::pin(incoming),
            outgoing: Box::pin(FramedWrite::new(input, LineCodec::new(MAX_MESSAGE))),
        }
    }
}

/// The relay's end of one app-server connection. Clones share it; the
/// connection closes when the last clone is dropped, or for every clone at
/// [`AppServer::close`].
#[derive(Clone)]
pub struct AppServer {
    outgoing: mpsc::UnboundedSender<String>,
    /// Our requests waiting; closed once the transport ended.
    calls: Arc<Waiters>,
    closing: tokio_util::sync::CancellationToken,
}

impl std::fmt::Debug for AppServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppServer").finish_non_exhaustive()
    }
}

impl AppServer {
    /// Starts the two loops on `transport`. The receiver yields what the
    /// app-server says on its own and ends when the connection does.
    pub fn start(transport: Transport) -> (Self, mpsc::UnboundedReceiver<Incoming>) {
        let Transport {
            mut incoming,
            mut outgoing,
        } = transport;
        let (lines, mut to_send) = mpsc::unbounded_channel::<String>();
        let closing = tokio_util::sync::CancellationToken::new();
        let closed = closing.clone();
        crate::tasks::spawn(async move {
            loop {
                let line = tokio::select! {
                    biased;
                    line = to_send.recv() => line,
                    () = closed.cancelled() => None,
                };
                let Some(line) = line else { break };
                if let Err(e) = outgoing.send(line).await {
                    tracing::debug!("writing to Codex's app-server failed: {e}");
                    break;
                }
            }
            let _ = outgoing.close().await;
        });
        let calls = Arc::new(Waiters::default());
        let waiting = calls.clone();
        let (events, received) = mpsc::unbounded_channel();
        crate::tasks::spawn(async move {
            while let Some(text) = incoming.next().await {
                let text = match text {
                    Ok(text) => text,
                    Err(e) => {
                        tracing::debug!("reading from Codex's app-server failed: {e}");
                        break;
                    }
                };
                match serde_json::from_str::<Value>(&text) {
                    Ok(message) => {
                        let event = match waiting.take(message) {
                            None => continue,
                            Some(Unasked::Request { id, method, params }) => {
                                Incoming::Request { id, method, params }
                            }
                            Some(Unasked::Notification { method, params }) => {
                                Incoming::Notification { method, params }
                            }
                            Some(Unasked::Response(response)) => {
                                tracing::debug!(%response, "an answer nobody waits for (late)");
                                continue;
                            }
                        };
                        // Nobody listening is fine: responses still matter.
                        let _ = events.send(event);
                    }
                    Err(e) => tracing::warn!("Codex's app-server sent something not JSON: {e}"),
                }
            }
            waiting.close();
        });
        let server = Self {
            outgoing: lines,
            calls,
            closing,
        };
        (server, received)
    }

    /// Closes the connection for every clone, after what was already sent:
    /// on stdio the app-server reads the end of its input, and leaves.
    pub fn close(&self) {
        self.closing.cancel();
    }

    /// Connects to `codex app-server --listen unix://<socket>`.
    pub async fn connect(
        socket: &Path,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Incoming>), AppServerError> {
        Ok(Self::start(Transport::unix_websocket(socket).await?))
    }

    /// `initialize` then `initialized`, as `client` (the name Codex shows
    /// for this connection), leaving out the notifications the relay
    /// never reads.
    pub async fn initialize(&self, client: &str) -> Result<(), AppServerError> {
        let params = wire::InitializeParams {
            client_info: wire::ClientInfo {
                name: client.into(),
                title: "agent-relay".into(),
                version: env!("CARGO_PKG_VERSION").into(),
            },
            capabilities: wire::Capabilities {
                opt_out_notification_methods: wire::method::NOT_READ
                    .iter()
                    .map(|m| m.to_string())
                    .collect(),
            },
        };
        let _: Value = self
            .request(wire::method::INITIALIZE, &params, INITIALIZE_WAIT)
            .await?;
        self.notify(wire::method::INITIALIZED, &json!({}))
    }

    /// Sends a request and waits up to `timeout` for its result.
    pub async fn request<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &str,
        params: &P,
        timeout: Duration,
    ) -> Result<R, AppServerError> {
        let (id, rx) = self.calls.start().ok_or(AppServerError::Closed)?;
        if let Err(e) = self.send(json!({"id": id, "method": method, "params": params})) {
            self.calls.forget(id);
            return Err(e);
        }
        let answer = tokio::time::timeout(timeout, rx).await;
        self.calls.forget(id);
        let response = answer
            .map_err(|_| AppServerError::Timeout {
                method: method.into(),
                after: timeout,
            })?
            .map_err(|_| AppServerError::Closed)?;
        let result = crate::rpc_client::outcome(&response).map_err(|(code, message)| {
            AppServerError::Rpc {
                method: method.into(),
                code,
                message,
            }
        })?;
        serde_json::from_value(result).map_err(|e| AppServerError::Decode {
            method: method.into(),
            message: e.to_string(),
        })
    }

    pub fn notify<P: Serialize>(&self, method: &str, params: &P) -> Result<(), AppServerError> {
        self.send(json!({"method": method, "params": params}))
    }

    /// Answers one of the app-server's requests.
    pub fn respond<R: Serialize>(&self, id: &Value, result: &R) -> Result<(), AppServerError> {
        self.send(json!({"id": id, "result": result}))
    }

    fn send(&self, message: Value) -> Result<(), AppServerError> {
        self.outgoing
            .send(message.to_string())
            .map_err(|_| AppServerError::Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in app-server on the other end of an in-memory pipe,
    /// speaking lines.
    fn pipe() -> (
        AppServer,
        mpsc::UnboundedReceiver<Incoming>,
        tokio::io::DuplexStream,
    ) {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let (read, write) = tokio::io::split(ours);
        let (server, incoming) = AppServer::start(Transport::stdio(read, write));
        (server, incoming, theirs)
    }

    async fn read_line(stream: &mut tokio::io::DuplexStream) -> Value {
        use tokio::io::AsyncBufReadExt;
        let mut reader = tokio::io::BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line).await.unwrap();
        serde_json::from_str(&line).unwrap()
    }

    #[tokio::test]
    async fn answers_reach_their_request_and_the_rest_is_an_event() {
        use tokio::io::AsyncWriteExt;
        let (server, mut incoming, mut theirs) = pipe();
        let asked = {
            let server = server.clone();
            crate::tasks::spawn(async move {
                server
                    .request::<_, Value>("thread/loaded/list", &json!({}), Duration::from_secs(5))
                    .await
            })
        };
        let request = read_line(&mut theirs).await;
        assert_eq!(request["method"], "thread/loaded/list");
        assert!(
            request.get("jsonrpc").is_none(),
            "Codex's dialect: {request}"
        );
        let id = request["id"].clone();
        let said = format!(
            "{}\n{}\n{}\n",
            json!({"method": "thread/started", "params": {"thread": {"id": "t"}}}),
            json!({"id": 0, "method": "item/commandExecution/requestApproval", "params": {}}),
            json!({"id": id, "result": {"data": ["t"]}}),
        );
        theirs.write_all(said.as_bytes()).await.unwrap();
        let result = asked.await.unwrap().unwrap();
        assert_eq!(result, json!({"data": ["t"]}));
        assert!(matches!(
            incoming.recv().await,
            Some(Incoming::Notification { method, .. }) if method == "thread/started"
        ));
        assert!(matches!(
            incoming.recv().await,
            Some(Incoming::Request { id, .. }) if id == json!(0)
        ));
        server
            .respond(&json!(0), &json!({"decision": "accept"}))
            .unwrap();
        let answer = read_line(&mut theirs).await;
        assert_eq!(answer, json!({"id": 0, "result": {"decision": "accept"}}));
    }

    #[tokio::test]
    async fn close_ends_the_app_servers_input_while_clones_live_after_what_was_sent() {
        use tokio::io::AsyncReadExt;
        let (server, _incoming, mut theirs) = pipe();
        let kept = server.clone();
        server.notify("initialized", &json!({})).unwrap();
        kept.close();
        let mut rest = String::new();
        tokio::time::timeout(Duration::from_secs(5), theirs.read_to_string(&mut rest))
            .await
            .expect("the input ends")
            .unwrap();
        assert_eq!(
            rest.lines().collect::<Vec<_>>(),
            [json!({"method": "initialized", "params": {}}).to_string()]
        );
    }

    #[tokio::test]
    async fn an_error_and_a_closed_connection_are_errors_not_hangs() {
        use tokio::io::AsyncWriteExt;
        let (server, _incoming, mut theirs) = pipe();
        let asked = {
            let server = server.clone();
            crate::tasks::spawn(async move {
                server
                    .request::<_, Value>("thread/resume", &json!({}), Duration::from_secs(5))
                    .await
            })
        };
        let request = read_line(&mut theirs).await;
        let refusal =
            json!({"id": request["id"], "error": {"code": -32600, "message": "no rollout found"}});
        theirs
            .write_all(format!("{refusal}\n").as_bytes())
            .await
            .unwrap();
        let refused = asked.await.unwrap();
        assert!(
            matches!(&refused, Err(AppServerError::Rpc { code: -32600, message, .. }) if message == "no rollout found"),
            "{refused:?}"
        );
        drop(theirs);
        let closed = server
            .request::<_, Value>("turn/start", &json!({}), Duration::from_secs(5))
            .await;
        assert!(matches!(closed, Err(AppServerError::Closed)), "{closed:?}");
    }
}

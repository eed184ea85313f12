//! A client of one `opencode serve`: its HTTP routes (JSON in, JSON out,
//! each for the folder the session works in: `?directory=`), and its event
//! stream (`GET /event`, server-sent events) read by one task that
//! reconnects while the server lives.
//!
//! The server listens on 127.0.0.1 with a password of the relay's making
//! (HTTP basic auth, user `opencode`), so no other user of the machine can
//! drive it; its traffic never goes through a proxy.

use std::time::Duration;

use futures::StreamExt as _;
use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::wire::{self, Event};
use crate::backoff::Backoff;

/// The user name OpenCode's basic auth expects.
const USER: &str = "opencode";
/// How long an event stream may say nothing before it is taken for dead
/// (OpenCode sends a heartbeat every 10 s).
const SILENCE: Duration = Duration::from_secs(30);
/// The longest event line kept (a tool's whole output may ride in one).
const MAX_EVENT: usize = 8 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot reach OpenCode: {0}")]
    Http(String),
    #[error("OpenCode answered {status}: {message}")]
    Refused { status: u16, message: String },
    #[error("OpenCode answered something unreadable: {0}")]
    Unreadable(String),
    #[error("OpenCode did not answer within {} s", .0.as_secs())]
    Timeout(Duration),
}

impl ServerError {
    fn http(e: reqwest::Error) -> Self {
        Self::Http(crate::redact::redact(&e.without_url().to_string()).into_owned())
    }
}

/// One OpenCode server, for one folder. Cheap to clone.
#[derive(Clone)]
pub struct Server {
    http: reqwest::Client,
    /// `http://127.0.0.1:<port>`.
    base: String,
    password: Option<String>,
    directory: String,
}

impl Server {
    pub fn new(base: &str, password: Option<String>, directory: &str) -> Result<Self, ServerError> {
        // reqwest builds a TLS configuration even for plain http: a
        // provider must be there (as for the Bot API's client).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .user_agent(concat!("agent-relay/", env!("CARGO_PKG_VERSION")))
            .no_proxy()
            .build()
            .map_err(ServerError::http)?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            password,
            directory: directory.to_string(),
        })
    }

    /// The folder the session works in.
    pub fn directory(&self) -> &str {
        &self.directory
    }

    fn request(&self, method: Method, route: &str) -> reqwest::RequestBuilder {
        let request = self
            .http
            .request(method, format!("{}{route}", self.base))
            .query(&[("directory", self.directory.as_str())]);
        match &self.password {
            Some(password) => request.basic_auth(USER, Some(password)),
            None => request,
        }
    }

    /// `GET route`.
    pub async fn get<T: DeserializeOwned>(
        &self,
        route: &str,
        wait: Duration,
    ) -> Result<T, ServerError> {
        self.call(self.request(Method::GET, route), wait).await
    }

    /// `POST route` with `body` (none: no body at all).
    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        route: &str,
        body: Option<&B>,
        wait: Duration,
    ) -> Result<T, ServerError> {
        let mut request = self.request(Method::POST, route);
        if let Some(body) = body {
            request = request.json(body);
        }
        self.call(request, wait).await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        request: reqwest::RequestBuilder,
        wait: Duration,
    ) -> Result<T, ServerError> {
        let answered = tokio::time::timeout(wait, async {
            let response = request.send().await.map_err(ServerError::http)?;
            let status = response.status();
            let body = response.bytes().await.map_err(ServerError::http)?;
            Ok::<_, ServerError>((status, body))
        })
        .await
        .map_err(|_| ServerError::Timeout(wait))??;
        let (status, body) = answered;
        if !status.is_success() {
            return Err(ServerError::Refused {
                status: status.as_u16(),
                message: refusal(&body),
            });
        }
        // 204: no content, read as `null`.
        let body: &[u8] = if body.is_empty() { b"null" } else { &body };
        serde_json::from_slice(body).map_err(|e| ServerError::Unreadable(e.to_string()))
    }

    /// Reads the event stream until `stop`, connecting again whenever it
    /// drops; `connected` is told each time it is (re)connected, so the
    /// reader can catch up on what it missed.
    pub fn events(
        &self,
        stop: CancellationToken,
    ) -> (mpsc::UnboundedReceiver<Event>, mpsc::UnboundedReceiver<()>) {
        let (events, received) = mpsc::unbounded_channel();
        let (connected, connections) = mpsc::unbounded_channel();
        let server = self.clone();
        crate::tasks::spawn(async move {
            let mut retry = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
            loop {
                let read = tokio::select! {
                    () = stop.cancelled() => return,
                    read = server.read_events(&events, &connected) => read,
                };
                if events.is_closed() {
                    return;
                }
                match read {
                    Ok(()) => retry.reset(),
                    Err(e) => tracing::debug!("OpenCode's event stream: {e}"),
                }
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(retry.step()) => {}
                }
            }
        });
        (received, connections)
    }

    /// One connection of the event stream, until it ends.
    async fn read_events(
        &self,
        events: &mpsc::UnboundedSender<Event>,
        connected: &mpsc::UnboundedSender<()>,
    ) -> Result<(), ServerError> {
        let response = self
            .request(Method::GET, wire::route::EVENTS)
            .header("accept", "text/event-stream")
            .send()
            .await
            .map_err(ServerError::http)?;
        if !response.status().is_success() {
            return Err(ServerError::Refused {
                status: response.status().as_u16(),
                message: String::new(),
            });
        }
        let _ = connected.send(());
        let mut body = response.bytes_stream();
        let mut lines = EventLines::default();
        loop {
            let chunk = match tokio::time::timeout(SILENCE, body.next()).await {
                Err(_) => return Err(ServerError::Timeout(SILENCE)),
                Ok(None) => return Ok(()),
                Ok(Some(chunk)) => chunk.map_err(ServerError::http)?,
            };
            for data in lines.push(&chunk) {
                match serde_json::from_str::<Event>(&data) {
                    Ok(event) => {
                        if events.send(event).is_err() {
                            return Ok(());
                        }
                    }
                    Err(e) => tracing::debug!("an unreadable OpenCode event: {e}"),
                }
            }
        }
    }
}

/// What a refusal says: OpenCode's `message` (or `data.message`), else the
/// body as it is.
fn refusal(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let said = serde_json::from_str::<Value>(&text).ok().and_then(|v| {
        v["message"]
            .as_str()
            .or_else(|| v["data"]["message"].as_str())
            .map(str::to_string)
    });
    crate::policy::clip(said.as_deref().unwrap_or(&text), 300)
}

/// Server-sent events, cut out of the bytes as they come: the `data` of
/// each event (its lines joined with `\n`), comments and other fields
/// left out. OpenCode sends one `data:` line an event.
#[derive(Default)]
struct EventLines {
    /// Bytes of a line not yet ended.
    partial: Vec<u8>,
    /// The data lines of the event being read.
    data: Vec<String>,
}

impl EventLines {
    /// Takes `chunk`; the data of each event it completed.
    fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        let mut done = Vec::new();
        for &byte in chunk {
            if byte != b'\n' {
                if self.partial.len() < MAX_EVENT {
                    self.partial.push(byte);
                }
                continue;
            }
            let mut line = std::mem::take(&mut self.partial);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            let line = String::from_utf8_lossy(&line).into_owned();
            if line.is_empty() {
                if !self.data.is_empty() {
                    done.push(std::mem::take(&mut self.data).join("\n"));
                }
            } else if let Some(data) = line.strip_prefix("data:") {
                self.data
                    .push(data.strip_prefix(' ').unwrap_or(data).to_string());
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_cut_out_of_the_stream_wherever_the_chunks_end() {
        let stream = b": heartbeat\n\ndata: {\"type\":\"a\"}\n\nevent: x\r\ndata: one\r\ndata:two\r\n\r\ndata: {\"type\":\"b\"}\n\n";
        let mut whole = EventLines::default();
        let at_once = whole.push(stream);
        assert_eq!(
            at_once,
            ["{\"type\":\"a\"}", "one\ntwo", "{\"type\":\"b\"}"]
        );
        let mut bytewise = EventLines::default();
        let mut one_by_one = Vec::new();
        for byte in stream {
            one_by_one.extend(bytewise.push(std::slice::from_ref(byte)));
        }
        assert_eq!(one_by_one, at_once);
        assert!(bytewise.push(b"data: not ended yet").is_empty());
    }

    #[test]
    fn a_refusal_says_what_opencode_said() {
        assert_eq!(
            refusal(
                br#"{"_tag":"PermissionNotFoundError","message":"Permission request not found"}"#
            ),
            "Permission request not found"
        );
        assert_eq!(refusal(br#"{"name":"X","data":{"message":"bad"}}"#), "bad");
        assert_eq!(refusal(b"plain"), "plain");
    }
}

//! The host side: JSON-RPC 2.0 over NDJSON on stdio (docs/DESIGN.md, *The host protocol*).
//!
//! Transport apart from meaning: a reader loop turns lines into messages, a
//! writer loop turns messages into lines, and a demultiplexer sends requests
//! and notifications to a [`Service`] and responses to the table of our own
//! pending outbound requests. The host protocol's service is a [`Handler`]
//! (the session), each request's params parsed once into its method's type
//! and each answer serialized once (`dispatch.rs`), its notifications typed
//! as [`HostEvent`]s ([`serve`]); the MCP server Claude Code talks to is
//! another service on the same transport ([`serve_service`]). Neither sees
//! bytes.
//!
//! Lines that are not valid messages are answered, never fatal: not JSON or
//! not UTF-8 → -32700; a batch, a wrong `jsonrpc`, an id or method of the
//! wrong type → -32600, echoing the id only when it is a valid one; a line
//! over 1 MiB → -32600 with id `null` (the host sent it, so it is an invalid
//! request rather than a server error). A handler that panics answers
//! -32603. Notifications are never answered, whatever they hold.
//!
//! What waits for the host is bounded. The outbound queue holds at most
//! [`outbound::QUEUE_BYTES`]; when it is full the reader stops taking lines
//! from the host until the host reads (backpressure; see [`outbound`] for
//! what happens to each kind of line). At most [`MAX_IN_FLIGHT`] requests
//! are answered at once; another one is answered at once with
//! [`message::SERVER_BUSY`] instead of waiting, since the reader must keep
//! reading the host's answers that running requests may wait for.

mod dispatch;
mod message;
mod outbound;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::task::{JoinError, JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::codec::{FramedRead, FramedWrite};

use crate::framing::{Frame, LineCodec};
use crate::protocol::host::*;
pub use dispatch::encode_result;
use message::{FromHost, SERVER_BUSY, error_line};
use outbound::{PendingEntry, ToHost};

/// Requests from the host answered at the same time, at most.
pub const MAX_IN_FLIGHT: usize = 256;

/// What the sidecar does with the host's messages.
pub trait Handler: Send + Sync + 'static {
    /// `initialize`. An error becomes the JSON-RPC error of the response.
    fn initialize(
        &self,
        params: InitializeParams,
    ) -> impl Future<Output = Result<InitializeResult, RpcError>> + Send;

    /// `command/execute`. May run long and may call back into the host.
    fn execute(&self, params: ExecuteParams) -> impl Future<Output = ExecuteResult> + Send;

    /// A notification from the host. Must not block.
    fn notify(&self, event: HostEvent);

    /// `agent/ended` sent as a request (a host about to exit waits for
    /// it): by default the notification, answered at once.
    fn agent_ended(&self, params: AgentEndedParams) -> impl Future<Output = ()> + Send {
        self.notify(HostEvent::AgentEnded(params));
        std::future::ready(())
    }

    /// `shutdown`: leave cleanly; the host closes stdin next.
    fn shutdown(&self, params: ShutdownParams) -> impl Future<Output = ()> + Send;

    /// `approval/request`. A handler without approvals leaves the decision
    /// to the host.
    fn approve(&self, params: ApprovalParams) -> impl Future<Output = ApprovalResult> + Send {
        let _ = params;
        std::future::ready(ApprovalResult {
            decision: Decision::Defer,
            reason: None,
            by: DecidedBy::Policy,
            for_session: false,
        })
    }

    /// `file/send`. A handler that cannot send files refuses.
    fn send_file(
        &self,
        params: SendFileParams,
    ) -> impl Future<Output = Result<SendFileResult, RpcError>> + Send {
        let _ = params;
        std::future::ready(Err(RpcError {
            code: FILE_NOT_SENT,
            message: "this sidecar sends no files".into(),
        }))
    }

    /// `topic/send`. A handler without a topic sends nothing.
    fn send_text(&self, params: TopicSendParams) -> impl Future<Output = TopicSendResult> + Send {
        let _ = params;
        std::future::ready(TopicSendResult {
            sent: false,
            messages: 0,
            reason: Some("this sidecar has no topic".into()),
            kept: false,
        })
    }

    /// `question/ask`. A handler that cannot ask answers nothing.
    fn ask(&self, params: QuestionParams) -> impl Future<Output = QuestionResult> + Send {
        let _ = params;
        std::future::ready(QuestionResult {
            choice: None,
            answer: None,
            by: DecidedBy::Unavailable,
            reason: None,
        })
    }
}

/// What one JSON-RPC peer serves on this transport: the requests it answers
/// and the notifications it takes. Each request runs in a task of its own.
///
/// Params come as the peer wrote them, for the service to parse once into
/// what it expects; a result goes back serialized once ([`encode_result`]).
pub trait Service: Send + Sync + 'static {
    /// Answers a request; an error becomes the JSON-RPC error response.
    fn call(
        self: Arc<Self>,
        method: String,
        params: Option<Box<RawValue>>,
    ) -> impl Future<Output = Result<Box<RawValue>, RpcError>> + Send;

    /// Takes a notification. Must not block; unknown ones are ignored.
    fn notify(&self, method: &str, params: Option<Box<RawValue>>);
}

/// The host protocol as a [`Service`]: requests to the [`Handler`]'s
/// methods, notifications as typed [`HostEvent`]s.
struct HostService<H: Handler> {
    handler: Arc<H>,
}

impl<H: Handler> Service for HostService<H> {
    async fn call(
        self: Arc<Self>,
        method: String,
        params: Option<Box<RawValue>>,
    ) -> Result<Box<RawValue>, RpcError> {
        dispatch::call(&*self.handler, &method, params.as_deref()).await
    }

    fn notify(&self, method: &str, params: Option<Box<RawValue>>) {
        match HostEvent::from_notification(method, params.as_deref()) {
            Ok(Some(event)) => self.handler.notify(event),
            Ok(None) => tracing::trace!(method, "unknown notification ignored"),
            Err(e) => tracing::warn!(method, "notification with unreadable params dropped: {e}"),
        }
    }
}

/// A JSON-RPC error object we answer with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} ({code})")]
pub struct RpcError {
    pub code: i32,
    pub message: String,
}

impl RpcError {
    /// JSON-RPC's -32601: a method this end does not offer.
    pub fn method_not_found(method: &str) -> Self {
        Self {
            code: jsonrpsee::types::ErrorCode::MethodNotFound.code(),
            message: format!("Method not found: {method}"),
        }
    }

    /// JSON-RPC's -32602: params this end cannot take, and why.
    pub fn invalid_params(why: impl Into<String>) -> Self {
        Self {
            code: jsonrpsee::types::ErrorCode::InvalidParams.code(),
            message: why.into(),
        }
    }
}

/// The host's notifications, typed. Unknown ones never get here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEvent {
    Initialized,
    SessionStarted(SessionStartedParams),
    SessionShutdown(SessionShutdownParams),
    AgentStarted,
    AgentEnded(AgentEndedParams),
    TurnStarted,
    TurnEnded(TurnEndedParams),
    TurnText(TurnTextParams),
    ToolStarted(ToolParams),
    ToolEnded(ToolParams),
    InputReceived(InputReceivedParams),
    Notice(NoticeParams),
    ApprovalResolved(ApprovalResolvedParams),
    QuestionResolved(QuestionResolvedParams),
    Taken(TakenParams),
}

/// Why an outbound request to the host failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutboundError {
    #[error("the host did not answer {method} within {timeout:?}")]
    Timeout { method: String, timeout: Duration },
    #[error("the host connection is closed")]
    Closed,
    #[error("the host answered {method} with error {code}: {message}")]
    Rpc {
        method: String,
        code: i64,
        message: String,
    },
    #[error("the host's answer to {method} is malformed: {message}")]
    Decode { method: String, message: String },
    /// Our own params did not serialize; a bug on our side, never the host's.
    #[error("the params of {method} cannot be encoded: {message}")]
    Encode { method: String, message: String },
}

impl HostEvent {
    /// The typed event for a notification from the host; `Ok(None)` when the
    /// method is not one we know (newer hosts may send more).
    fn from_notification(
        method: &str,
        params: Option<&RawValue>,
    ) -> serde_json::Result<Option<Self>> {
        // Absent and `null` params mean "nothing to say"; every params type
        // whose fields are all optional then still parses.
        let params = match params.map(RawValue::get) {
            None | Some("null") => "{}",
            Some(params) => params,
        };
        Ok(Some(match method {
            method::INITIALIZED => Self::Initialized,
            method::SESSION_STARTED => Self::SessionStarted(serde_json::from_str(params)?),
            method::SESSION_SHUTDOWN => Self::SessionShutdown(serde_json::from_str(params)?),
            method::AGENT_STARTED => Self::AgentStarted,
            method::AGENT_ENDED => Self::AgentEnded(serde_json::from_str(params)?),
            method::TURN_STARTED => Self::TurnStarted,
            method::TURN_ENDED => Self::TurnEnded(serde_json::from_str(params)?),
            method::TURN_TEXT => Self::TurnText(serde_json::from_str(params)?),
            method::TOOL_STARTED => Self::ToolStarted(serde_json::from_str(params)?),
            method::TOOL_ENDED => Self::ToolEnded(serde_json::from_str(params)?),
            method::INPUT_RECEIVED => Self::InputReceived(serde_json::from_str(params)?),
            method::AGENT_NOTICE => Self::Notice(serde_json::from_str(params)?),
            method::APPROVAL_RESOLVED => Self::ApprovalResolved(serde_json::from_str(params)?),
            method::QUESTION_RESOLVED => Self::QuestionResolved(serde_json::from_str(params)?),
            method::AGENT_TAKEN => Self::Taken(serde_json::from_str(params)?),
            _ => return Ok(None),
        }))
    }
}

/// A request on its way to the host: its id (to cancel it) and the wait for
/// its answer. Dropping it cancels the wait.
pub struct Pending<R> {
    pub id: u64,
    answer: std::pin::Pin<Box<dyn Future<Output = Result<R, OutboundError>> + Send>>,
}

impl<R> Future for Pending<R> {
    type Output = Result<R, OutboundError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        self.answer.as_mut().poll(cx)
    }
}

/// A cheap, cloneable handle for talking to the host.
#[derive(Clone)]
pub struct HostLink {
    outbox: Arc<ToHost>,
}

impl std::fmt::Debug for HostLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostLink").finish_non_exhaustive()
    }
}

impl HostLink {
    /// Sends a notification. Never blocks: a status update replaces the one
    /// of the same key still queued; another notification is dropped when
    /// the queue is full (see [`outbound`]), and once the host is gone.
    pub fn notify<P: Serialize>(&self, method: &str, params: &P) {
        let params = match serde_json::to_value(params) {
            Ok(params) => params,
            Err(e) => {
                tracing::error!(method, "notification params cannot be encoded: {e}");
                return;
            }
        };
        let key = (method == method::UI_SET_STATUS).then(|| {
            let key = params
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or_default();
            format!("{method} {key}")
        });
        let line = json!({ "jsonrpc": "2.0", "method": method, "params": params }).to_string();
        if !self.outbox.notify(line, key) {
            tracing::debug!(
                method,
                "the host is gone or not reading; notification dropped"
            );
        }
    }

    /// Sends a request and waits for the answer, at most `timeout`.
    /// Dropping the returned future cancels it (the pending entry is removed).
    pub async fn request<P: Serialize, R: DeserializeOwned + Send + 'static>(
        &self,
        method: &str,
        params: &P,
        timeout: Duration,
    ) -> Result<R, OutboundError> {
        self.start_request(method, params, timeout).await?.await
    }

    /// Sends a request and returns the wait for its answer. When this
    /// returns the line is queued, so requests started one after another
    /// reach the host in that order while their answers are awaited
    /// together. `timeout` covers both the wait for room (a host that does
    /// not read does not answer either) and the wait for the answer;
    /// dropping the returned future cancels the request.
    pub async fn start_request<P: Serialize, R: DeserializeOwned + Send + 'static>(
        &self,
        method: &str,
        params: &P,
        timeout: Duration,
    ) -> Result<Pending<R>, OutboundError> {
        let deadline = Instant::now() + timeout;
        let params = serde_json::to_value(params).map_err(|e| OutboundError::Encode {
            method: method.to_owned(),
            message: e.to_string(),
        })?;
        let (id, answer) = self
            .outbox
            .register()
            .map_err(|outbound::Closed| OutboundError::Closed)?;
        let entry = PendingEntry {
            outbox: Arc::clone(&self.outbox),
            id,
        };
        let line =
            json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params }).to_string();
        let method = method.to_owned();
        let timed_out = move |method: String| OutboundError::Timeout { method, timeout };
        match tokio::time::timeout_at(deadline, self.outbox.send(line)).await {
            Err(_elapsed) => return Err(timed_out(method)),
            Ok(false) => return Err(OutboundError::Closed),
            Ok(true) => {}
        }
        let answered = async move {
            let _entry = entry;
            let answer = match tokio::time::timeout_at(deadline, answer).await {
                Err(_elapsed) => return Err(timed_out(method)),
                // The sender was dropped: the transport closed under us.
                Ok(Err(_)) => return Err(OutboundError::Closed),
                Ok(Ok(answer)) => answer,
            };
            match answer {
                Ok(result) => serde_json::from_value(result).map_err(|e| OutboundError::Decode {
                    method,
                    message: e.to_string(),
                }),
                Err(error) => Err(rpc_error(&method, &error)),
            }
        };
        Ok(Pending {
            id,
            answer: Box::pin(answered),
        })
    }

    /// Tells the host that request `id` is no longer wanted (a dialog the
    /// phone answered first); the host may close it.
    pub fn cancel(&self, id: u64) {
        self.notify(method::CANCEL_REQUEST, &CancelParams { id });
    }

    /// `ui/setStatus`.
    pub fn set_status(&self, params: &SetStatusParams) {
        self.notify(method::UI_SET_STATUS, params);
    }

    /// `ui/notify`: a message shown to the user in the host.
    pub fn notify_user(&self, params: &NotifyParams) {
        self.notify(method::UI_NOTIFY, params);
    }

    /// `ui/confirm`. `timeout` bounds our wait and should exceed the dialog's
    /// own `timeoutMs`, if any, so the host's answer to an expired dialog is
    /// still heard.
    pub async fn confirm(
        &self,
        params: &ConfirmParams,
        timeout: Duration,
    ) -> Result<ConfirmResult, OutboundError> {
        self.request(method::UI_CONFIRM, params, timeout).await
    }

    /// `agent/sendUserMessage`: hands a relayed prompt to the agent. The
    /// prompt is on its way when this returns (see [`HostLink::start_request`]).
    pub async fn send_user_message(
        &self,
        params: &SendUserMessageParams,
        timeout: Duration,
    ) -> Result<Pending<SendUserMessageResult>, OutboundError> {
        self.start_request(method::AGENT_SEND_USER_MESSAGE, params, timeout)
            .await
    }

    /// `agent/abort`: stops the agent's current turn.
    pub async fn abort(&self, timeout: Duration) -> Result<(), OutboundError> {
        // The result carries nothing; any shape (`{}`, `null`) is accepted.
        self.request::<_, Value>(method::AGENT_ABORT, &AbortParams {}, timeout)
            .await
            .map(drop)
    }

    #[cfg(test)]
    fn pending_len(&self) -> usize {
        self.outbox.pending_len()
    }
}

/// The host's `error` object as an [`OutboundError`].
fn rpc_error(method: &str, error: &Value) -> OutboundError {
    let code = error.get("code").and_then(Value::as_i64);
    let message = error.get("message").and_then(Value::as_str);
    match (code, message) {
        (Some(code), message) => OutboundError::Rpc {
            method: method.to_owned(),
            code,
            message: message.unwrap_or_default().to_owned(),
        },
        (None, _) => OutboundError::Decode {
            method: method.to_owned(),
            message: format!("error object without an integer code: {error}"),
        },
    }
}

/// How long, after the host closed stdin, answers still being computed may
/// take before they are abandoned, and queued lines may take to be written.
/// Long enough for an answer that is already on its way, short enough that a
/// host waiting for us to exit does not notice.
const DRAIN_GRACE: Duration = Duration::from_secs(1);

/// Serves one host on `input`/`output` until `input` reaches EOF.
///
/// At EOF (with or without a `shutdown` first) outbound requests still
/// waiting fail with [`OutboundError::Closed`], answers in flight get
/// [`DRAIN_GRACE`] to be computed and written, and the function returns
/// `Ok(())`. A read error ends serving the same way and is returned.
pub async fn serve<H, R, W>(
    input: R,
    output: W,
    make_handler: impl FnOnce(HostLink) -> Arc<H>,
) -> std::io::Result<()>
where
    H: Handler,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    serve_service(input, output, move |link| {
        Arc::new(HostService {
            handler: make_handler(link),
        })
    })
    .await
}

/// Serves any [`Service`] on `input`/`output`, with everything [`serve`]
/// promises about framing, errors, backpressure and the end at EOF.
pub async fn serve_service<S, R, W>(
    input: R,
    output: W,
    make_service: impl FnOnce(HostLink) -> Arc<S>,
) -> std::io::Result<()>
where
    S: Service,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let outbox = Arc::new(ToHost::new());
    let service = make_service(HostLink {
        outbox: Arc::clone(&outbox),
    });
    let writer = crate::tasks::spawn(write_lines(output, Arc::clone(&outbox)));
    let mut demux = Demultiplexer {
        service,
        outbox: Arc::clone(&outbox),
        requests: JoinSet::new(),
    };

    let mut frames = FramedRead::new(input, LineCodec::default());
    let outcome = loop {
        // Backpressure: no new line while the host leaves our output unread.
        outbox.wait_for_room().await;
        match frames.next().await {
            Some(Ok(frame)) => demux.route(frame).await,
            None => break Ok(()),
            Some(Err(e)) => {
                tracing::warn!("reading from the host failed: {e}");
                break Err(e);
            }
        }
    };
    tracing::debug!("host input closed");
    drop(frames);
    demux.drain(writer).await;
    outcome
}

/// Routes each classified line to where it belongs.
struct Demultiplexer<S: Service> {
    service: Arc<S>,
    outbox: Arc<ToHost>,
    /// Requests being answered, each in a task of its own so a long
    /// `command/execute` holds up neither other requests nor the answers to
    /// our own requests that it may be waiting for.
    requests: JoinSet<()>,
}

impl<S: Service> Demultiplexer<S> {
    async fn route(&mut self, frame: Frame) {
        while let Some(done) = self.requests.try_join_next() {
            log_join(done);
        }
        match message::classify(frame) {
            FromHost::Request { id, .. } if self.requests.len() >= MAX_IN_FLIGHT => {
                tracing::warn!(
                    id = id.get(),
                    "{MAX_IN_FLIGHT} requests in flight; answering busy"
                );
                let busy = format!(
                    "Server busy: {MAX_IN_FLIGHT} requests are being answered; retry later"
                );
                self.outbox.send(error_line(&id, SERVER_BUSY, &busy)).await;
            }
            FromHost::Request { id, method, params } => {
                tracing::trace!(id = id.get(), method, "request");
                self.requests.spawn(crate::tasks::boxed(dispatch::answer(
                    Arc::clone(&self.service),
                    Arc::clone(&self.outbox),
                    id,
                    method,
                    params,
                )));
            }
            FromHost::Notification { method, params } => self.notification(&method, params),
            FromHost::Response { id, outcome } => {
                if !self.outbox.complete(&id, outcome) {
                    tracing::debug!(%id, "answer to no pending request (late or unknown); ignored");
                }
            }
            FromHost::Rejection(rejection) => {
                tracing::debug!(
                    code = rejection.code,
                    "rejected a line: {}",
                    rejection.message
                );
                self.outbox.send(rejection.to_line()).await;
            }
        }
    }

    fn notification(&self, method: &str, params: Option<Box<RawValue>>) {
        // A panicking handler must not take the transport down with it.
        let service = &self.service;
        if std::panic::catch_unwind(AssertUnwindSafe(|| service.notify(method, params))).is_err() {
            tracing::error!(method, "the handler panicked on a notification");
        }
    }

    /// The end after EOF: see [`serve`].
    async fn drain(mut self, mut writer: JoinHandle<()>) {
        self.outbox.close_pending();
        let deadline = Instant::now() + DRAIN_GRACE;
        let finished = tokio::time::timeout_at(deadline, async {
            while let Some(done) = self.requests.join_next().await {
                log_join(done);
            }
        })
        .await;
        if finished.is_err() {
            tracing::info!(
                abandoned = self.requests.len(),
                "host closed input; abandoning unanswered requests"
            );
            self.requests.abort_all();
        }
        // The writer ends once the queue is closed and empty.
        self.outbox.close_lines();
        if tokio::time::timeout_at(deadline, &mut writer)
            .await
            .is_err()
        {
            tracing::warn!("output not drained in time; remaining lines dropped");
            writer.abort();
        }
    }
}

fn log_join(done: Result<(), JoinError>) {
    if let Err(e) = done
        && e.is_panic()
    {
        tracing::error!("a request task panicked: {e}");
    }
}

/// The writer loop: lines from the queue to `output`, one flush per burst.
async fn write_lines<W: AsyncWrite + Unpin>(output: W, outbox: Arc<ToHost>) {
    let mut sink: FramedWrite<W, LineCodec> = FramedWrite::new(output, LineCodec::default());
    while let Some((batch, bytes)) = outbox.next_batch().await {
        let mut written = Ok(());
        for line in batch {
            if written.is_ok() {
                written = sink.feed(line).await;
            }
        }
        let written = match written {
            Ok(()) => SinkExt::<String>::flush(&mut sink).await,
            Err(e) => Err(e),
        };
        outbox.written(bytes);
        if let Err(e) = written {
            tracing::warn!("writing to the host failed; output stops: {e}");
            outbox.abandon();
            return;
        }
    }
    if let Err(e) = SinkExt::<String>::close(&mut sink).await {
        tracing::debug!("closing the host output failed: {e}");
    }
}

//! The host side: JSON-RPC 2.0 over NDJSON on stdio (DESIGN §3).
//!
//! Transport apart from meaning: a reader loop turns lines into messages, a
//! writer loop turns messages into lines, and a demultiplexer sends requests
//! to the jsonrpsee `RpcModule`, notifications to [`Handler::notify`] as a
//! typed [`HostEvent`], and responses to the table of our own pending
//! outbound requests. The [`Handler`] (the session) never sees bytes.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::protocol::host::*;

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

    /// `shutdown`: leave cleanly; the host closes stdin next.
    fn shutdown(&self, params: ShutdownParams) -> impl Future<Output = ()> + Send;
}

/// A JSON-RPC error object we answer with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} ({code})")]
pub struct RpcError {
    pub code: i32,
    pub message: String,
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
    ToolStarted(ToolParams),
    ToolEnded(ToolParams),
    InputReceived(InputReceivedParams),
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
}

/// A cheap, cloneable handle for talking to the host.
#[derive(Clone)]
pub struct HostLink {
    _private: (),
}

impl HostLink {
    /// Sends a notification. Never blocks; dropped silently once the host is gone.
    pub fn notify<P: Serialize>(&self, _method: &str, _params: &P) {
        unimplemented!("host transport")
    }

    /// Sends a request and waits for the answer, at most `timeout`.
    /// Dropping the returned future cancels it (the pending entry is removed).
    pub async fn request<P: Serialize, R: DeserializeOwned>(
        &self,
        _method: &str,
        _params: &P,
        _timeout: Duration,
    ) -> Result<R, OutboundError> {
        unimplemented!("host transport")
    }
}

/// Serves one host on `input`/`output` until `input` reaches EOF.
pub async fn serve<H, R, W>(
    _input: R,
    _output: W,
    _make_handler: impl FnOnce(HostLink) -> Arc<H>,
) -> std::io::Result<()>
where
    H: Handler,
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    unimplemented!("host transport")
}

//! Requests from the host: the host protocol's methods, each request's
//! params parsed once (by jsonrpsee's [`Params`], straight from the host's
//! text) into the method's type and its answer serialized once; and the
//! task that answers one request of any [`Service`].
//!
//! jsonrpsee's `RpcModule` is not used: its only ways in take a whole
//! request as text and give back a whole response as text, with ids of its
//! own type (no negative or fractional numbers), so using it meant
//! printing the request again and parsing its answer back
//! (docs/decisions/0003-host-dispatch.md).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use jsonrpsee::types::{ErrorObjectOwned, Params};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

use super::message::{INTERNAL_ERROR, error_line, result_line};
use super::outbound::ToHost;
use super::{Handler, RpcError, Service};
use crate::protocol::host::method;

/// The empty answer of a request that only says it is done.
#[derive(Serialize)]
struct Ack {}

impl From<ErrorObjectOwned> for RpcError {
    fn from(error: ErrorObjectOwned) -> Self {
        RpcError {
            code: error.code(),
            message: error.message().to_string(),
        }
    }
}

/// A result as it goes on the wire, serialized once.
pub fn encode_result<T: Serialize>(result: &T) -> Result<Box<RawValue>, RpcError> {
    serde_json::value::to_raw_value(result).map_err(|e| {
        tracing::error!("a result cannot be encoded: {e}");
        RpcError {
            code: INTERNAL_ERROR,
            message: "Internal error: the result cannot be encoded".into(),
        }
    })
}

/// Runs one method: `params` parsed into its type (-32602 when they do not
/// parse), the handler's answer serialized.
async fn run<P, R, Answered>(
    params: &Params<'_>,
    handler: impl FnOnce(P) -> Answered,
) -> Result<Box<RawValue>, RpcError>
where
    P: DeserializeOwned,
    R: Serialize,
    Answered: Future<Output = Result<R, RpcError>>,
{
    let params = params.parse::<P>()?;
    encode_result(&handler(params).await?)
}

/// Params that may be left out entirely (`shutdown` has nothing required).
fn or_default<P: DeserializeOwned + Default>(params: &Params<'_>) -> Result<P, RpcError> {
    match params.as_str() {
        None => Ok(P::default()),
        Some(_) => Ok(params.parse::<P>()?),
    }
}

/// Calls `method` of the host protocol on `handler`. Unknown methods are
/// -32601; params that do not parse, -32602.
pub(crate) async fn call<H: Handler>(
    handler: &H,
    method: &str,
    params: Option<&RawValue>,
) -> Result<Box<RawValue>, RpcError> {
    // Absent and `null` params are the same: nothing given.
    let params = Params::new(params.map(RawValue::get).filter(|p| *p != "null"));
    match method {
        method::INITIALIZE => run(&params, |p| handler.initialize(p)).await,
        method::COMMAND_EXECUTE => run(&params, |p| handler.execute(p).map(Ok)).await,
        method::APPROVAL_REQUEST => run(&params, |p| handler.approve(p).map(Ok)).await,
        method::QUESTION_ASK => run(&params, |p| handler.ask(p).map(Ok)).await,
        method::FILE_SEND => run(&params, |p| handler.send_file(p)).await,
        method::TOPIC_SEND => run(&params, |p| handler.send_text(p).map(Ok)).await,
        // Usually a notification; as a request, answered once the turn's
        // answer is the relay's (a host that exits next waits for it).
        method::AGENT_ENDED => run(&params, |p| handler.agent_ended(p).map(|()| Ok(Ack {}))).await,
        method::SHUTDOWN => {
            handler.shutdown(or_default(&params)?).await;
            encode_result(&())
        }
        _ => Err(RpcError::method_not_found(method)),
    }
}

/// Answers one request and queues the answer for the writer.
pub(crate) async fn answer<S: Service>(
    service: Arc<S>,
    outbox: Arc<ToHost>,
    id: Box<RawValue>,
    method: String,
    params: Option<Box<RawValue>>,
) {
    let call = AssertUnwindSafe(service.call(method.clone(), params))
        .catch_unwind()
        .await;
    let line = match call {
        Ok(Ok(result)) => result_line(&id, &result),
        Ok(Err(e)) => error_line(&id, e.code, &e.message),
        Err(_) => {
            tracing::error!(method, "the handler panicked");
            error_line(&id, INTERNAL_ERROR, "Internal error: the handler failed")
        }
    };
    if !outbox.send(line).await {
        tracing::debug!(method, "the host is gone; answer dropped");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use serde::{Deserialize, Deserializer, Serializer};

    use super::*;

    static PARSED: AtomicUsize = AtomicUsize::new(0);
    static WRITTEN: AtomicUsize = AtomicUsize::new(0);

    /// Params and result that count how often serde reads and writes them.
    struct Counted(u32);

    impl<'de> Deserialize<'de> for Counted {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
            PARSED.fetch_add(1, Ordering::SeqCst);
            u32::deserialize(deserializer).map(Counted)
        }
    }

    impl Serialize for Counted {
        fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            WRITTEN.fetch_add(1, Ordering::SeqCst);
            serializer.serialize_u32(self.0)
        }
    }

    #[tokio::test]
    async fn params_are_parsed_once_and_the_result_written_once() {
        let result = run(&Params::new(Some("41")), |p: Counted| async move {
            Ok(Counted(p.0 + 1))
        })
        .await
        .unwrap();
        assert_eq!(result.get(), "42");
        assert_eq!(PARSED.load(Ordering::SeqCst), 1);
        assert_eq!(WRITTEN.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn params_reach_the_method_as_the_host_wrote_them() {
        // A round trip through a tree on the way would have reformatted
        // them (`1e3` → `1000.0`, the spaces gone).
        let sent = r#"{ "a" : 1e3, "b": [ 1.50 ] }"#;
        let result = run(
            &Params::new(Some(sent)),
            |p: Box<RawValue>| async move { Ok(p) },
        )
        .await
        .unwrap();
        assert_eq!(result.get(), sent);
    }

    #[tokio::test]
    async fn bad_params_are_32602_and_an_unencodable_result_32603() {
        let refused = run(&Params::new(Some(r#""x""#)), |p: u32| async move { Ok(p) })
            .await
            .unwrap_err();
        assert_eq!(refused.code, -32602);
        let mut odd = std::collections::HashMap::new();
        odd.insert(vec![1], 1);
        let unencodable = run(&Params::new(None), |(): ()| async move { Ok(odd) })
            .await
            .unwrap_err();
        assert_eq!(unencodable.code, INTERNAL_ERROR);
    }
}

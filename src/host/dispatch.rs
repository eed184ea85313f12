//! Requests from the host: the jsonrpsee [`RpcModule`] that parses params and
//! calls the [`Handler`], and the task that answers one request of any
//! [`Service`].

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use jsonrpsee::RpcModule;
use jsonrpsee::types::{ErrorObjectOwned, Params};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::message::{INTERNAL_ERROR, error_line};
use super::outbound::Outbox;
use super::{Handler, RpcError, Service};
use crate::protocol::host::{
    ApprovalParams, ExecuteParams, InitializeParams, QuestionParams, SendFileParams,
    ShutdownParams, TopicSendParams, method,
};

impl From<RpcError> for ErrorObjectOwned {
    fn from(error: RpcError) -> Self {
        ErrorObjectOwned::owned(error.code, error.message, None::<()>)
    }
}

/// Params that may be left out entirely (`shutdown` has nothing required).
fn parse_or_default<T: DeserializeOwned + Default>(
    params: &Params<'_>,
) -> Result<T, ErrorObjectOwned> {
    match params.as_str() {
        None => Ok(T::default()),
        Some(_) => params.parse::<T>(),
    }
}

/// The methods the host may call. jsonrpsee answers unknown methods with
/// -32601 and params that do not parse with -32602.
pub(crate) fn rpc_module<H: Handler>(handler: Arc<H>) -> RpcModule<H> {
    let mut module = RpcModule::from_arc(handler);
    // Registration fails only for a duplicate name; the names are distinct
    // constants, so these cannot fail at run time.
    module
        .register_async_method(method::INITIALIZE, |params, handler, _| async move {
            let params: InitializeParams = params.parse()?;
            handler
                .initialize(params)
                .await
                .map_err(ErrorObjectOwned::from)
        })
        .expect("method names are distinct");
    module
        .register_async_method(method::COMMAND_EXECUTE, |params, handler, _| async move {
            let params: ExecuteParams = params.parse()?;
            Ok::<_, ErrorObjectOwned>(handler.execute(params).await)
        })
        .expect("method names are distinct");
    module
        .register_async_method(method::APPROVAL_REQUEST, |params, handler, _| async move {
            let params: ApprovalParams = params.parse()?;
            Ok::<_, ErrorObjectOwned>(handler.approve(params).await)
        })
        .expect("method names are distinct");
    module
        .register_async_method(method::QUESTION_ASK, |params, handler, _| async move {
            let params: QuestionParams = params.parse()?;
            Ok::<_, ErrorObjectOwned>(handler.ask(params).await)
        })
        .expect("method names are distinct");
    module
        .register_async_method(method::FILE_SEND, |params, handler, _| async move {
            let params: SendFileParams = params.parse()?;
            handler
                .send_file(params)
                .await
                .map_err(ErrorObjectOwned::from)
        })
        .expect("method names are distinct");
    module
        .register_async_method(method::TOPIC_SEND, |params, handler, _| async move {
            let params: TopicSendParams = params.parse()?;
            Ok::<_, ErrorObjectOwned>(handler.send_text(params).await)
        })
        .expect("method names are distinct");
    module
        .register_async_method(method::SHUTDOWN, |params, handler, _| async move {
            let params: ShutdownParams = parse_or_default(&params)?;
            handler.shutdown(params).await;
            Ok::<_, ErrorObjectOwned>(())
        })
        .expect("method names are distinct");
    module
}

/// Answers one request and queues the answer for the writer.
pub(crate) async fn answer<S: Service>(
    service: Arc<S>,
    outbox: Arc<Outbox>,
    id: Value,
    method: String,
    params: Option<Value>,
) {
    let call = AssertUnwindSafe(service.call(method.clone(), params))
        .catch_unwind()
        .await;
    let line = match call {
        Ok(Ok(result)) => json!({ "jsonrpc": "2.0", "id": id, "result": result }).to_string(),
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

/// Calls `method` of the host protocol's module: its result, or the error
/// jsonrpsee answered (-32601 unknown method, -32602 bad params, …).
pub(crate) async fn call<H: Handler>(
    module: &RpcModule<H>,
    method: &str,
    params: Option<Value>,
) -> Result<Value, RpcError> {
    // jsonrpsee only knows unsigned integer and string ids, but JSON-RPC allows
    // any number: the module sees a fixed id, and the transport answers with
    // the host's own id, byte for byte as the host sent it.
    let mut request = json!({ "jsonrpc": "2.0", "id": 0, "method": method });
    if let Some(params) = params.filter(|p| !p.is_null()) {
        request["params"] = params;
    }
    let internal = || RpcError {
        code: INTERNAL_ERROR,
        message: "Internal error".into(),
    };
    let (response, _subscription) = module
        .raw_json_request(&request.to_string(), 1)
        .await
        .map_err(|e| {
            tracing::error!(method, "jsonrpsee refused a request we built: {e}");
            internal()
        })?;
    let mut response: Map<String, Value> = serde_json::from_str(response.get()).map_err(|e| {
        tracing::error!("jsonrpsee produced an unreadable response: {e}");
        internal()
    })?;
    if let Some(error) = response.remove("error") {
        return Err(RpcError {
            code: error
                .get("code")
                .and_then(Value::as_i64)
                .map_or(INTERNAL_ERROR, |c| c as i32),
            message: error
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        });
    }
    Ok(response.remove("result").unwrap_or(Value::Null))
}

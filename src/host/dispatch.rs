//! Requests from the host: the jsonrpsee [`RpcModule`] that parses params and
//! calls the [`Handler`], and the task that answers one request.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use jsonrpsee::RpcModule;
use jsonrpsee::types::{ErrorObjectOwned, Params};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::message::{INTERNAL_ERROR, error_line};
use super::outbound::Outbox;
use super::{Handler, RpcError};
use crate::protocol::host::{
    ApprovalParams, ExecuteParams, InitializeParams, QuestionParams, SendFileParams,
    ShutdownParams, method,
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
        .register_async_method(method::SHUTDOWN, |params, handler, _| async move {
            let params: ShutdownParams = parse_or_default(&params)?;
            handler.shutdown(params).await;
            Ok::<_, ErrorObjectOwned>(())
        })
        .expect("method names are distinct");
    module
}

/// Answers one request and queues the answer for the writer.
pub(crate) async fn answer<H: Handler>(
    module: Arc<RpcModule<H>>,
    outbox: Arc<Outbox>,
    id: Value,
    method: String,
    params: Option<Value>,
) {
    let line = respond(&module, &id, &method, params).await;
    if !outbox.send(line).await {
        tracing::debug!(method, "the host is gone; answer dropped");
    }
}

async fn respond<H: Handler>(
    module: &RpcModule<H>,
    id: &Value,
    method: &str,
    params: Option<Value>,
) -> String {
    // jsonrpsee only knows unsigned integer and string ids, but JSON-RPC allows
    // any number. The module therefore sees a fixed id and the host's own id is
    // put back into the answer, byte for byte as the host sent it.
    let mut request = json!({ "jsonrpc": "2.0", "id": 0, "method": method });
    if let Some(params) = params.filter(|p| !p.is_null()) {
        request["params"] = params;
    }
    let call = AssertUnwindSafe(module.raw_json_request(&request.to_string(), 1))
        .catch_unwind()
        .await;
    match call {
        Ok(Ok((response, _subscription))) => with_id(response.get(), id),
        Ok(Err(e)) => {
            tracing::error!(method, "jsonrpsee refused a request we built: {e}");
            error_line(id, INTERNAL_ERROR, "Internal error")
        }
        Err(_) => {
            tracing::error!(method, "the handler panicked");
            error_line(id, INTERNAL_ERROR, "Internal error: the handler failed")
        }
    }
}

fn with_id(response: &str, id: &Value) -> String {
    match serde_json::from_str::<Map<String, Value>>(response) {
        Ok(mut response) => {
            response.insert("id".to_owned(), id.clone());
            Value::Object(response).to_string()
        }
        Err(e) => {
            tracing::error!("jsonrpsee produced an unreadable response: {e}");
            error_line(id, INTERNAL_ERROR, "Internal error")
        }
    }
}

//! The HTTP face of the fake: Bot API calls (with faults and the call record) and
//! the control routes for tests in other processes.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, FromRequest, Multipart, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::error::ApiError;
use super::files::{self, Upload};
use super::methods::{self, Hearing, Uploads};
use super::{
    BotRights, CallRecord, CallbackInject, DownloadRecord, FakeBotApi, FakeError, Fault,
    UserMessage,
};

/// Bodies bigger than this are refused with 413: the largest upload Telegram
/// takes (50 MB) plus room for the other parts, so an upload just over its limit
/// still reaches the per-kind check.
const MAX_BODY: usize = files::UPLOAD_MAX as usize + 1024 * 1024;

pub(super) fn router(api: FakeBotApi) -> Router {
    Router::new()
        .route("/control/inject_message", post(inject_message))
        .route("/control/inject_update", post(inject_update))
        .route(
            "/control/inject_callback_query",
            post(inject_callback_query),
        )
        .route("/control/inject_topic", post(inject_topic))
        .route("/control/press_stop", post(press_stop))
        .route("/control/drafts", get(drafts))
        .route("/control/fault", post(fault))
        .route("/control/clear_faults", post(clear_faults))
        .route("/control/bot_settings", post(bot_settings))
        .route("/control/calls", get(calls))
        .route("/control/topics", get(topics))
        .route("/control/messages", get(messages))
        .route("/control/message", get(message))
        .route("/control/wait_messages", get(wait_messages))
        .route("/control/callback_queries", get(callback_queries))
        .route("/control/uploads", get(uploads))
        .route("/control/file", get(file))
        .route("/control/file_content", get(file_content))
        .route("/control/downloads", get(downloads))
        .route("/control/stats", get(stats))
        .route("/control/delete_topic", post(delete_topic))
        .route("/control/chat", post(add_chat))
        .route("/file/{bot_token}/{*file_path}", get(download))
        .route("/{bot_token}/{method}", any(bot_call))
        .fallback(|| async { telegram_answer(Err(ApiError::new(404, "Not Found"))).0 })
        // `read_params` enforces its own limit; the multipart reader must not
        // apply axum's 2 MB default on top.
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(api)
}

// ---- Bot API ----

/// Answers with Telegram's envelope; also returns what goes into the call record.
fn telegram_answer(answer: Result<Value, ApiError>) -> (Response, u16, bool) {
    let (status, ok, body, retry_after) = match answer {
        Ok(result) => (200, true, json!({"ok": true, "result": result}), None),
        Err(error) => (error.code, false, error.json(), error.retry_after),
    };
    let mut response = raw_answer(status, "application/json", body.to_string());
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    (response, status, ok)
}

fn raw_answer(status: u16, content_type: &'static str, body: String) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn bot_call(
    State(api): State<FakeBotApi>,
    Path((bot_token, method)): Path<(String, String)>,
    request: Request,
) -> Response {
    let started_ms = api.now_ms();
    let params = read_params(request).await;
    let canonical = methods::canonical(&method);
    let recorded = match &params {
        Ok((fields, uploads)) => recorded_params(fields, uploads),
        Err(_) => Value::Null,
    };
    let seq = api.mutate(|inner| {
        let seq = inner.calls.len() as u64 + 1;
        inner.calls.push(CallRecord {
            seq,
            method: canonical.map_or_else(|| method.clone(), str::to_owned),
            params: recorded,
            started_ms,
            finished_ms: None,
            status: None,
            ok: false,
            fault: None,
        });
        seq
    });
    let (response, status, ok) = answer_bot_call(&api, seq, &bot_token, canonical, params).await;
    let finished_ms = api.now_ms();
    api.mutate(|inner| {
        if let Some(record) = usize::try_from(seq - 1)
            .ok()
            .and_then(|i| inner.calls.get_mut(i))
        {
            record.finished_ms = Some(finished_ms);
            record.status = Some(status);
            record.ok = ok;
        }
    });
    response
}

async fn answer_bot_call(
    api: &FakeBotApi,
    seq: u64,
    bot_token: &str,
    method: Option<&'static str>,
    params: Result<(Value, Uploads), ApiError>,
) -> (Response, u16, bool) {
    if bot_token.strip_prefix("bot") != Some(api.token().as_str()) {
        return telegram_answer(Err(ApiError::new(401, "Unauthorized")));
    }
    let Some(method) = method else {
        return telegram_answer(Err(ApiError::new(404, "Not Found")));
    };
    let (params, uploads) = match params {
        Ok(params) => params,
        Err(error) => return telegram_answer(Err(error)),
    };
    match take_fault(api, seq, method) {
        None => telegram_answer(methods::dispatch(api, method, &params, &uploads).await),
        Some(fault) => answer_with_fault(api, fault, method, &params, &uploads).await,
    }
}

/// The fault set for the next `method` call, if any, noted on call `seq`'s
/// record.
fn take_fault(api: &FakeBotApi, seq: u64, method: &str) -> Option<Fault> {
    api.mutate(|inner| {
        let fault = inner.take_fault(method);
        if let (Some(fault), Some(record)) = (
            &fault,
            usize::try_from(seq - 1)
                .ok()
                .and_then(|i| inner.calls.get_mut(i)),
        ) {
            record.fault = Some(format!("{fault:?}"));
        }
        fault
    })
}

/// A call answered as `fault` says: an error, a delay, a hang, a broken
/// body, or the answer cut in half.
async fn answer_with_fault(
    api: &FakeBotApi,
    fault: Fault,
    method: &'static str,
    params: &Value,
    uploads: &Uploads,
) -> (Response, u16, bool) {
    let shutdown = api.shared.shutdown.clone();
    match fault {
        Fault::TooManyRequests { retry_after } => {
            telegram_answer(Err(ApiError::too_many_requests(retry_after)))
        }
        Fault::ServerError { code } => {
            let description = match code {
                502 => "Bad Gateway",
                503 => "Service Unavailable",
                504 => "Gateway Timeout",
                _ => "Internal Server Error",
            };
            telegram_answer(Err(ApiError::new(code, description)))
        }
        Fault::Delay(delay) => {
            tokio::select! {
                () = tokio::time::sleep(delay) => telegram_answer(methods::dispatch(api, method, params, uploads).await),
                () = shutdown.cancelled() => telegram_answer(Err(ApiError::new(503, "Service Unavailable"))),
            }
        }
        Fault::Hang => {
            // Hangs until the client gives up; the server's shutdown must still
            // be able to finish, so it ends the hang.
            shutdown.cancelled().await;
            telegram_answer(Err(ApiError::new(503, "Service Unavailable")))
        }
        Fault::GarbageBody => (
            raw_answer(
                200,
                "text/html",
                "<html><body><h1>502 Bad Gateway</h1></body></html>".to_owned(),
            ),
            200,
            false,
        ),
        Fault::TruncatedJson => {
            let (status, body) = match methods::dispatch(api, method, params, uploads).await {
                Ok(result) => (200, json!({"ok": true, "result": result})),
                Err(error) => (error.code, error.json()),
            };
            let text = body.to_string();
            let mut cut = text.len() / 2;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            (
                raw_answer(status, "application/json", text[..cut].to_owned()),
                status,
                false,
            )
        }
        Fault::Conflict => telegram_answer(Err(ApiError::conflict())),
        Fault::BadRequest { description } => telegram_answer(Err(ApiError::new(400, description))),
        Fault::Deaf { immediately } if method == "getUpdates" => {
            let hearing = if immediately {
                Hearing::DeafAtOnce
            } else {
                Hearing::Deaf
            };
            telegram_answer(methods::get_updates(api, params, hearing).await)
        }
        Fault::Deaf { .. } => {
            telegram_answer(methods::dispatch(api, method, params, uploads).await)
        }
    }
}

/// The call record's view of the parameters: file parts by their description.
fn recorded_params(fields: &Value, uploads: &Uploads) -> Value {
    let mut recorded = fields.clone();
    for (name, upload) in uploads {
        recorded[name] = json!({"upload": {
            "file_name": upload.file_name,
            "content_type": upload.content_type,
            "size": upload.bytes.len(),
        }});
    }
    recorded
}

/// Merges query-string and body parameters into one JSON object, body winning,
/// as Telegram accepts either; multipart file parts (those with a file name) come
/// back apart.
async fn read_params(request: Request) -> Result<(Value, Uploads), ApiError> {
    let mut params = Map::new();
    let mut uploads = Uploads::new();
    let (parts, body) = request.into_parts();
    if parts.uri.query().is_some() {
        let Query(pairs) = Query::<Vec<(String, String)>>::try_from_uri(&parts.uri)
            .map_err(|_| ApiError::bad_request("can't parse query string"))?;
        params.extend(pairs.into_iter().map(|(k, v)| (k, Value::String(v))));
    }
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let bytes = axum::body::to_bytes(body, MAX_BODY)
        .await
        .map_err(|_| ApiError::too_large())?;
    if bytes.is_empty() {
        return Ok((Value::Object(params), uploads));
    }
    if content_type.starts_with("application/x-www-form-urlencoded") {
        let request = Request::from_parts(parts, Body::from(bytes));
        let axum::Form(pairs) = axum::Form::<Vec<(String, String)>>::from_request(request, &())
            .await
            .map_err(|_| ApiError::bad_request("can't parse form body"))?;
        params.extend(pairs.into_iter().map(|(k, v)| (k, Value::String(v))));
    } else if content_type.starts_with("multipart/form-data") {
        let unreadable = |_| ApiError::bad_request("can't parse multipart body");
        let request = Request::from_parts(parts, Body::from(bytes));
        let mut multipart = Multipart::from_request(request, &())
            .await
            .map_err(|_| ApiError::bad_request("can't parse multipart body"))?;
        while let Some(field) = multipart.next_field().await.map_err(unreadable)? {
            let name = field.name().unwrap_or_default().to_owned();
            let file_name = field.file_name().map(str::to_owned);
            let part_type = field.content_type().map(str::to_owned);
            let content = field.bytes().await.map_err(unreadable)?;
            if file_name.is_some() {
                uploads.insert(
                    name,
                    Upload {
                        file_name,
                        content_type: part_type,
                        bytes: content,
                    },
                );
            } else {
                let text = String::from_utf8_lossy(&content).into_owned();
                params.insert(name, Value::String(text));
            }
        }
    } else {
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(body)) => params.extend(body),
            _ => return Err(ApiError::bad_request("can't parse JSON object")),
        }
    }
    Ok((Value::Object(params), uploads))
}

/// `GET /file/bot<token>/<file_path>`: a file's bytes, once `getFile` gave its path.
async fn download(
    State(api): State<FakeBotApi>,
    Path((bot_token, file_path)): Path<(String, String)>,
) -> Response {
    let at_ms = api.now_ms();
    let authorized = bot_token.strip_prefix("bot") == Some(api.token().as_str());
    let found = api.mutate(|inner| {
        let found = inner
            .files
            .iter()
            .find(|f| authorized && f.file_path.as_deref() == Some(file_path.as_str()))
            .map(|f| (f.file_id.clone(), f.bytes.clone()));
        let status = match (&found, authorized) {
            (_, false) => 401,
            (None, true) => 404,
            (Some(_), true) => 200,
        };
        inner.downloads.push(DownloadRecord {
            file_path: file_path.clone(),
            file_id: found.as_ref().map(|(id, _)| id.clone()),
            status,
            at_ms,
        });
        found
    });
    let bytes = match (found, authorized) {
        (_, false) => return telegram_answer(Err(ApiError::new(401, "Unauthorized"))).0,
        (None, true) => return telegram_answer(Err(ApiError::new(404, "Not Found"))).0,
        (Some((_, bytes)), true) => bytes,
    };
    let fault = api.mutate(|inner| inner.take_download_fault());
    let shutdown = api.shared.shutdown.clone();
    let whole = |bytes: bytes::Bytes| {
        (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/octet-stream")],
            bytes,
        )
            .into_response()
    };
    match fault {
        None => whole(bytes),
        Some(Fault::Delay(delay)) => {
            tokio::select! {
                () = tokio::time::sleep(delay) => whole(bytes),
                () = shutdown.cancelled() => telegram_answer(Err(ApiError::new(503, "Service Unavailable"))).0,
            }
        }
        Some(Fault::Hang) => {
            // Headers and the first half of the file, then nothing: a
            // connection that stalls mid-download, until the client leaves
            // (or the server shuts down).
            let half = bytes.slice(..bytes.len() / 2);
            let first = futures::stream::once(async move { Ok::<_, std::io::Error>(half) });
            let stall = futures::stream::once(async move {
                shutdown.cancelled().await;
                Err(std::io::Error::other("the fake shut down"))
            });
            let mut response =
                Body::from_stream(futures::StreamExt::chain(first, stall)).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            if let Ok(length) = HeaderValue::from_str(&bytes.len().to_string()) {
                response
                    .headers_mut()
                    .insert(header::CONTENT_LENGTH, length);
            }
            response
        }
        Some(Fault::TooManyRequests { retry_after }) => {
            telegram_answer(Err(ApiError::too_many_requests(retry_after))).0
        }
        Some(Fault::ServerError { code }) => {
            telegram_answer(Err(ApiError::new(code, "Internal Server Error"))).0
        }
        Some(_) => telegram_answer(Err(ApiError::new(500, "Internal Server Error"))).0,
    }
}

// ---- control ----

fn control_error(error: impl std::fmt::Display) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({"error": error.to_string()})),
    )
        .into_response()
}

fn control_answer<T: serde::Serialize>(answer: Result<T, FakeError>) -> Response {
    match answer {
        Ok(found) => axum::Json(found).into_response(),
        Err(error) => control_error(error),
    }
}

fn not_found(what: &str) -> Response {
    (
        StatusCode::NOT_FOUND,
        axum::Json(json!({"error": format!("no such {what}")})),
    )
        .into_response()
}

async fn inject_message(
    State(api): State<FakeBotApi>,
    axum::Json(message): axum::Json<UserMessage>,
) -> Response {
    control_answer(api.inject_user_message(message))
}

async fn inject_update(
    State(api): State<FakeBotApi>,
    axum::Json(update): axum::Json<Value>,
) -> Response {
    if !update.is_object() {
        return control_error("an update must be a JSON object");
    }
    let update_id = api.inject_raw_update(update);
    axum::Json(json!({"update_id": update_id})).into_response()
}

async fn inject_callback_query(
    State(api): State<FakeBotApi>,
    axum::Json(press): axum::Json<CallbackInject>,
) -> Response {
    let (update_id, callback_query_id) = api.inject_callback_query(press);
    axum::Json(json!({"update_id": update_id, "callback_query_id": callback_query_id}))
        .into_response()
}

#[derive(Deserialize)]
struct StopPress {
    chat_id: i64,
    thread_id: Option<i64>,
    draft_id: i64,
}

async fn press_stop(
    State(api): State<FakeBotApi>,
    axum::Json(press): axum::Json<StopPress>,
) -> Response {
    control_answer(
        api.press_stop(press.chat_id, press.thread_id, press.draft_id)
            .map(|update_id| json!({ "update_id": update_id })),
    )
}

async fn drafts(State(api): State<FakeBotApi>) -> Response {
    axum::Json(api.drafts()).into_response()
}

#[derive(Deserialize)]
struct TopicRequest {
    chat_id: i64,
    user_id: i64,
    name: String,
}

async fn inject_topic(
    State(api): State<FakeBotApi>,
    axum::Json(request): axum::Json<TopicRequest>,
) -> Response {
    control_answer(
        api.inject_topic(request.chat_id, request.user_id, &request.name)
            .map(|(thread_id, update_id)| json!({"thread_id": thread_id, "update_id": update_id})),
    )
}

/// The wire form of [`Fault`] (a `Duration` has no natural JSON spelling).
#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum FaultSpec {
    TooManyRequests {
        retry_after: u64,
    },
    ServerError {
        code: u16,
    },
    Delay {
        ms: u64,
    },
    Hang,
    GarbageBody,
    TruncatedJson,
    Conflict,
    BadRequest {
        description: String,
    },
    Deaf {
        #[serde(default)]
        immediately: bool,
    },
}

impl From<FaultSpec> for Fault {
    fn from(spec: FaultSpec) -> Self {
        match spec {
            FaultSpec::TooManyRequests { retry_after } => Self::TooManyRequests { retry_after },
            FaultSpec::ServerError { code } => Self::ServerError { code },
            FaultSpec::Delay { ms } => Self::Delay(Duration::from_millis(ms)),
            FaultSpec::Hang => Self::Hang,
            FaultSpec::GarbageBody => Self::GarbageBody,
            FaultSpec::TruncatedJson => Self::TruncatedJson,
            FaultSpec::Conflict => Self::Conflict,
            FaultSpec::BadRequest { description } => Self::BadRequest { description },
            FaultSpec::Deaf { immediately } => Self::Deaf { immediately },
        }
    }
}

#[derive(Deserialize)]
struct FaultRequest {
    method: String,
    fault: FaultSpec,
    #[serde(default = "one")]
    times: u32,
    /// Every call until `clear_faults`; `times` is then ignored.
    #[serde(default)]
    until_cleared: bool,
}

fn one() -> u32 {
    1
}

async fn fault(
    State(api): State<FakeBotApi>,
    axum::Json(request): axum::Json<FaultRequest>,
) -> Response {
    if request.until_cleared {
        api.inject_fault_until_cleared(&request.method, request.fault.into());
    } else {
        api.inject_fault(&request.method, request.fault.into(), request.times);
    }
    axum::Json(json!({})).into_response()
}

async fn clear_faults(State(api): State<FakeBotApi>) -> Response {
    api.clear_faults();
    axum::Json(json!({})).into_response()
}

#[derive(Deserialize)]
struct BotSettings {
    has_topics_enabled: Option<bool>,
    allows_users_to_create_topics: Option<bool>,
}

async fn bot_settings(
    State(api): State<FakeBotApi>,
    axum::Json(settings): axum::Json<BotSettings>,
) -> Response {
    if let Some(enabled) = settings.has_topics_enabled {
        api.set_has_topics_enabled(enabled);
    }
    if let Some(allowed) = settings.allows_users_to_create_topics {
        api.set_allows_users_to_create_topics(allowed);
    }
    axum::Json(json!({})).into_response()
}

async fn calls(State(api): State<FakeBotApi>) -> Response {
    axum::Json(api.calls()).into_response()
}

#[derive(Deserialize)]
struct ChatQuery {
    chat_id: i64,
    thread_id: Option<i64>,
}

async fn topics(State(api): State<FakeBotApi>, Query(query): Query<ChatQuery>) -> Response {
    axum::Json(api.topics(query.chat_id)).into_response()
}

async fn messages(State(api): State<FakeBotApi>, Query(query): Query<ChatQuery>) -> Response {
    axum::Json(api.messages(query.chat_id, query.thread_id)).into_response()
}

#[derive(Deserialize)]
struct MessageQuery {
    chat_id: i64,
    message_id: i64,
}

async fn message(State(api): State<FakeBotApi>, Query(query): Query<MessageQuery>) -> Response {
    match api.message(query.chat_id, query.message_id) {
        Some(found) => axum::Json(found).into_response(),
        None => not_found("message"),
    }
}

#[derive(Deserialize)]
struct CallbackQueriesQuery {
    #[serde(default)]
    unanswered: bool,
}

async fn callback_queries(
    State(api): State<FakeBotApi>,
    Query(query): Query<CallbackQueriesQuery>,
) -> Response {
    if query.unanswered {
        axum::Json(api.unanswered_callback_queries()).into_response()
    } else {
        axum::Json(api.callback_queries()).into_response()
    }
}

async fn uploads(State(api): State<FakeBotApi>) -> Response {
    axum::Json(api.uploads()).into_response()
}

#[derive(Deserialize)]
struct FileQuery {
    file_id: String,
}

async fn file(State(api): State<FakeBotApi>, Query(query): Query<FileQuery>) -> Response {
    match api.file(&query.file_id) {
        Some(found) => axum::Json(found).into_response(),
        None => not_found("file"),
    }
}

async fn file_content(State(api): State<FakeBotApi>, Query(query): Query<FileQuery>) -> Response {
    match api.file(&query.file_id) {
        Some(found) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/octet-stream")],
            found.bytes,
        )
            .into_response(),
        None => not_found("file"),
    }
}

async fn downloads(State(api): State<FakeBotApi>) -> Response {
    axum::Json(api.downloads()).into_response()
}

async fn stats(State(api): State<FakeBotApi>) -> Response {
    axum::Json(api.stats()).into_response()
}

#[derive(Deserialize)]
struct WaitQuery {
    chat_id: i64,
    thread_id: Option<i64>,
    count: usize,
    timeout_ms: u64,
}

async fn wait_messages(State(api): State<FakeBotApi>, Query(query): Query<WaitQuery>) -> Response {
    let timeout = Duration::from_millis(query.timeout_ms);
    match api
        .wait_for_messages(query.chat_id, query.thread_id, query.count, timeout)
        .await
    {
        Ok(found) => axum::Json(found).into_response(),
        Err(error) => (
            StatusCode::REQUEST_TIMEOUT,
            axum::Json(json!({"error": error.to_string()})),
        )
            .into_response(),
    }
}

#[derive(Deserialize)]
struct TopicRef {
    chat_id: i64,
    thread_id: i64,
}

async fn delete_topic(
    State(api): State<FakeBotApi>,
    axum::Json(topic): axum::Json<TopicRef>,
) -> Response {
    control_answer(
        api.delete_topic_externally(topic.chat_id, topic.thread_id)
            .map(|()| json!({})),
    )
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum ChatSpec {
    ForumSupergroup {
        chat_id: i64,
        title: String,
        #[serde(flatten)]
        rights: BotRights,
    },
    Supergroup {
        chat_id: i64,
        title: String,
        #[serde(flatten)]
        rights: BotRights,
    },
    Private {
        user_id: i64,
        first_name: String,
    },
}

async fn add_chat(
    State(api): State<FakeBotApi>,
    axum::Json(spec): axum::Json<ChatSpec>,
) -> Response {
    match spec {
        ChatSpec::ForumSupergroup {
            chat_id,
            title,
            rights,
        } => api.add_forum_supergroup(chat_id, &title, rights),
        ChatSpec::Supergroup {
            chat_id,
            title,
            rights,
        } => api.add_supergroup(chat_id, &title, rights),
        ChatSpec::Private {
            user_id,
            first_name,
        } => api.add_private_chat(user_id, &first_name),
    }
    axum::Json(json!({})).into_response()
}

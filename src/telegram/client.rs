//! A thin Bot API client: one POST per call, JSON in, `result` out, every
//! failure classified by [`TelegramError`].
//!
//! It does no retrying and no pacing of its own: the leader's outbox decides
//! when a call may go ([`super::RateLimiter`]) and whether a failed one may
//! be sent again ([`TelegramError::is_retryable`]), so both happen in one
//! place for every session.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::call::{BotCall, BotReply};
use super::error::{TelegramError, is_idempotent};
use super::types::{
    BotInfo, Chat, ChatMember, Message, ParseMode, SendMessage, TelegramFile, WebhookInfo,
};
use super::upload::{Unsent, file_body};
use crate::config::BotToken;
use crate::redact::redact;

/// Per-request deadline for everything but long polls.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);

/// How much longer than its own `timeout` a long poll may take before the
/// client gives up on it: Telegram answers at the poll timeout, plus latency.
const POLL_GRACE: Duration = Duration::from_secs(10);

/// The General topic of a forum supergroup; the relay never writes there.
const GENERAL_THREAD: i64 = 1;

/// The update kinds the relay reads. Sent with every poll because Telegram
/// otherwise keeps whatever a previous consumer asked for.
const ALLOWED_UPDATES: [&str; 4] = [
    "message",
    "edited_message",
    "callback_query",
    // A draft's stop button (docs/DESIGN.md, *Drafts*). Telegram's default
    // list has it; it is named because this list is explicit, and an
    // explicit list without it would keep it away.
    "stopped_message_generation",
];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    #[error("invalid Bot API base URL {url:?}: {reason}")]
    BaseUrl { url: String, reason: &'static str },
    #[error("cannot build the HTTP client: {message}")]
    Http { message: String },
}

#[derive(Clone)]
pub struct BotApi {
    http: reqwest::Client,
    /// `{base}/bot{token}/`: holds the secret, so `Debug` prints only the base.
    endpoint: String,
    /// `{base}/file/bot{token}/`, where `getFile`'s paths are downloaded
    /// from; holds the secret too.
    files: String,
    base: String,
    timeout: Duration,
}

/// What an upload carries: a file read from disk as it is sent, or bytes
/// the relay made itself (a long answer sent as a file).
#[derive(Debug)]
pub enum UploadSource {
    /// An open file and how many of its bytes to send, from the start.
    File {
        file: std::fs::File,
        len: u64,
    },
    Bytes(Vec<u8>),
}

impl UploadSource {
    /// How many bytes go.
    pub fn size(&self) -> u64 {
        match self {
            Self::File { len, .. } => *len,
            Self::Bytes(bytes) => bytes.len() as u64,
        }
    }
}

/// `sendPhoto` or `sendDocument` parameters; the file itself is an
/// [`UploadSource`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SendFile {
    pub chat_id: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_thread_id: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caption: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parse_mode: Option<ParseMode>,
    /// `sendPhoto` (Telegram recompresses it and shows it inline) rather
    /// than `sendDocument` (sent as it is).
    #[serde(skip)]
    pub as_photo: bool,
    /// The name the file shows on the phone.
    #[serde(skip)]
    pub file_name: String,
}

/// Why a download did not complete.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    #[error(transparent)]
    Telegram(#[from] TelegramError),
    /// Writing what arrived failed (a full disk, say).
    #[error("cannot write the file: {0}")]
    Write(std::io::Error),
}

impl fmt::Debug for BotApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BotApi")
            .field("base", &self.base)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl BotApi {
    /// `base_url` is `https://api.telegram.org` in production, the fake's
    /// `http://127.0.0.1:<port>` in tests.
    pub fn new(base_url: &str, token: &BotToken) -> Result<Self, SetupError> {
        let base = base_url.trim().trim_end_matches('/').to_string();
        let invalid = |reason| SetupError::BaseUrl {
            url: redact(base_url).into_owned(),
            reason,
        };
        let parsed = reqwest::Url::parse(&base).map_err(|_| invalid("not a URL"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(invalid("the scheme must be http or https"));
        }
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(invalid(
                "a query or fragment cannot be extended with a path",
            ));
        }
        Ok(Self {
            http: http_client()?,
            endpoint: format!("{base}/bot{}/", token.expose()),
            files: format!("{base}/file/bot{}/", token.expose()),
            base,
            timeout: DEFAULT_TIMEOUT,
        })
    }

    /// The same bot over fresh connections: a poll that hears nothing may
    /// hang on a connection that a proxy on the way broke.
    pub fn reconnected(&self) -> Result<Self, SetupError> {
        Ok(Self {
            http: http_client()?,
            ..self.clone()
        })
    }

    /// Replaces the per-request deadline of ordinary calls.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Calls `method` with `params` (a JSON object) and returns its `result`.
    ///
    /// Calls addressed to the General topic (`message_thread_id` 1) and
    /// `getUpdates` with a negative offset (which silently drops the backlog)
    /// are refused without a request.
    pub async fn call(&self, method: &str, params: &Value) -> Result<Value, TelegramError> {
        self.call_with_timeout(method, params, self.timeout).await
    }

    async fn call_with_timeout(
        &self,
        method: &str,
        params: &Value,
        timeout: Duration,
    ) -> Result<Value, TelegramError> {
        check(method, params)?;
        let params = shown(params);
        self.post(method, |request| request.json(&params), timeout)
            .await
    }

    /// POSTs `method` with the body `body` puts on the request, and
    /// classifies what came back: the one path of every call.
    async fn post(
        &self,
        method: &str,
        body: impl FnOnce(reqwest::RequestBuilder) -> reqwest::RequestBuilder,
        timeout: Duration,
    ) -> Result<Value, TelegramError> {
        let request = self.http.post(format!("{}{method}", self.endpoint));
        let response = body(request)
            .timeout(timeout)
            .send()
            .await
            .map_err(|error| TelegramError::classify_transport(method, error))?;
        let status = response.status().as_u16();
        let body = response
            .bytes()
            .await
            .map_err(|error| TelegramError::classify_transport(method, error))?;
        TelegramError::classify_response(method, status, &body)
    }

    async fn call_as<T: DeserializeOwned>(
        &self,
        method: &str,
        params: &Value,
    ) -> Result<T, TelegramError> {
        let result = self.call(method, params).await?;
        parse_result(method, result)
    }

    /// Makes one [`BotCall`] and reads its answer: the one way every call of
    /// that type is made.
    pub async fn perform(&self, call: &BotCall) -> Result<BotReply, TelegramError> {
        let result = self.call(call.method(), &call.params()).await?;
        call.reply(result)
    }

    pub async fn get_me(&self) -> Result<BotInfo, TelegramError> {
        match self.perform(&BotCall::GetMe).await? {
            BotReply::Bot(bot) => Ok(bot),
            other => Err(TelegramError::Malformed {
                message: format!("getMe answered {other:?}"),
                commit_unknown: false,
            }),
        }
    }

    /// Posts a message; answers its id.
    pub async fn send_message(&self, params: SendMessage) -> Result<i64, TelegramError> {
        let reply = self.perform(&BotCall::SendMessage(params)).await?;
        reply.message_id().ok_or_else(|| TelegramError::Malformed {
            message: "sendMessage answered no message".into(),
            commit_unknown: true,
        })
    }

    /// Polling and a webhook exclude each other; `drop_pending` is false in
    /// every relay path (the backlog is the user's messages).
    pub async fn delete_webhook(&self, drop_pending: bool) -> Result<(), TelegramError> {
        self.call(
            "deleteWebhook",
            &json!({"drop_pending_updates": drop_pending}),
        )
        .await
        .map(drop)
    }

    /// One long poll. The updates come back raw: the caller journals them
    /// and decodes each with [`super::Update::decode`].
    pub async fn get_updates(
        &self,
        offset: Option<i64>,
        timeout_s: u32,
        limit: u8,
    ) -> Result<Vec<Value>, TelegramError> {
        let mut params = json!({
            "timeout": timeout_s,
            "limit": limit.clamp(1, 100),
            "allowed_updates": ALLOWED_UPDATES,
        });
        if let Some(offset) = offset {
            params["offset"] = json!(offset);
        }
        let deadline = Duration::from_secs(u64::from(timeout_s)) + POLL_GRACE;
        let result = self
            .call_with_timeout("getUpdates", &params, deadline)
            .await?;
        parse_result("getUpdates", result)
    }

    /// How many updates wait at Telegram, unconfirmed.
    pub async fn get_webhook_info(&self) -> Result<WebhookInfo, TelegramError> {
        self.call_as("getWebhookInfo", &json!({})).await
    }

    /// Where a file can be downloaded from (`file_path`), for an hour.
    pub async fn get_file(&self, file_id: &str) -> Result<TelegramFile, TelegramError> {
        self.call_as("getFile", &json!({"file_id": file_id})).await
    }

    /// Streams the file at `file_path` (from [`BotApi::get_file`]) into
    /// `out`, at most `limit` bytes: a longer one is
    /// [`TelegramError::FileTooBig`]. A file of another length than
    /// `announced` (`getFile`'s `file_size`) is
    /// [`TelegramError::Incomplete`]: a server or proxy that ends the body
    /// early without an HTTP error must not make a short file look whole.
    /// Returns how many bytes were written.
    pub async fn download(
        &self,
        file_path: &str,
        limit: u64,
        announced: Option<u64>,
        timeout: Duration,
        out: &mut (impl tokio::io::AsyncWrite + Unpin),
    ) -> Result<u64, DownloadError> {
        use tokio::io::AsyncWriteExt as _;
        // The path comes from Telegram; it still never leaves the file route.
        let plain = !file_path.is_empty()
            && file_path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-/".contains(c))
            && !file_path
                .split('/')
                .any(|part| part.is_empty() || part == "..");
        if !plain {
            return Err(TelegramError::Refused {
                reason: "a file path from getFile that is not a plain relative path",
            }
            .into());
        }
        // Reads are idempotent: classified as getFile is.
        let transport = |error| TelegramError::classify_transport("getFile", error);
        let mut response = self
            .http
            .get(format!("{}{file_path}", self.files))
            .timeout(timeout)
            .send()
            .await
            .map_err(transport)?;
        let status = response.status().as_u16();
        if status != 200 {
            let body = response.bytes().await.map_err(transport)?;
            let error = TelegramError::classify_response("getFile", status, &body)
                .err()
                .unwrap_or_else(|| TelegramError::Malformed {
                    message: format!("HTTP {status} for a file download"),
                    commit_unknown: false,
                });
            return Err(error.into());
        }
        if response
            .content_length()
            .is_some_and(|length| length > limit)
        {
            return Err(too_big(limit).into());
        }
        let mut written = 0u64;
        while let Some(chunk) = response.chunk().await.map_err(transport)? {
            written += chunk.len() as u64;
            if written > limit {
                return Err(too_big(limit).into());
            }
            out.write_all(&chunk).await.map_err(DownloadError::Write)?;
        }
        out.flush().await.map_err(DownloadError::Write)?;
        match announced {
            Some(announced) if announced != written => Err(TelegramError::Incomplete {
                received: written,
                announced,
            }
            .into()),
            _ => Ok(written),
        }
    }

    /// `sendPhoto` or `sendDocument` as a multipart upload: the parameters
    /// as text fields, the file as a part read while it is sent. `timeout`
    /// covers the whole upload.
    pub async fn send_file(
        &self,
        params: &SendFile,
        source: &UploadSource,
        timeout: Duration,
    ) -> Result<Message, TelegramError> {
        let (method, field) = if params.as_photo {
            ("sendPhoto", "photo")
        } else {
            ("sendDocument", "document")
        };
        let fields = serde_json::to_value(params).map_err(|_| TelegramError::Refused {
            reason: "parameters do not serialize",
        })?;
        check(method, &fields)?;
        let fields = shown(&fields);
        let mut form = reqwest::multipart::Form::new();
        for (key, value) in fields.as_object().into_iter().flatten() {
            let text = match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            form = form.text(key.clone(), text);
        }
        let mut unsent = None;
        let part = match source {
            // A text the relay made (an answer's code, a whole command) is
            // a message like any other: no token leaves in it. A file from
            // disk goes byte for byte; which files may go is decided
            // before (`paths::open_sendable`).
            UploadSource::Bytes(bytes) => match std::str::from_utf8(bytes).map(redact) {
                Ok(std::borrow::Cow::Owned(masked)) => {
                    reqwest::multipart::Part::bytes(masked.into_bytes())
                }
                _ => reqwest::multipart::Part::bytes(bytes.clone()),
            },
            UploadSource::File { file, len } => {
                // Every attempt reads the file from its start; a file no
                // longer as checked fails the body before its end.
                let read = file_body(file, *len).map_err(|_| TelegramError::Refused {
                    reason: Unsent::Unreadable.as_reason(),
                })?;
                unsent = Some(read.failed);
                reqwest::multipart::Part::stream_with_length(read.body, *len)
            }
        };
        let file_name = shown_text(&params.file_name, false).into_owned();
        let form = form.part(field, part.file_name(file_name));
        crate::logging::milestone("upload-start", 0);
        let result = self
            .post(method, |request| request.multipart(form), timeout)
            .await;
        crate::logging::milestone("upload-answered", 0);
        // A body cut off by its own reading never completed: nothing was
        // posted, and the reason is the file's, not the network's.
        if let Some(why) = unsent.as_ref().and_then(|failed| failed.get()) {
            return Err(TelegramError::Refused {
                reason: why.as_reason(),
            });
        }
        parse_result(method, result?)
    }

    pub async fn get_chat(&self, chat: i64) -> Result<Chat, TelegramError> {
        self.call_as("getChat", &json!({"chat_id": chat})).await
    }

    pub async fn get_chat_member(
        &self,
        chat: i64,
        user_id: i64,
    ) -> Result<ChatMember, TelegramError> {
        self.call_as(
            "getChatMember",
            &json!({"chat_id": chat, "user_id": user_id}),
        )
        .await
    }
}

fn http_client() -> Result<reqwest::Client, SetupError> {
    let tls = tls().map_err(|message| SetupError::Http {
        message: message.clone(),
    })?;
    reqwest::Client::builder()
        .user_agent(concat!("agent-relay/", env!("CARGO_PKG_VERSION")))
        .tls_backend_preconfigured(rustls::ClientConfig::clone(tls))
        .build()
        .map_err(|error| SetupError::Http {
            message: redact(&error.without_url().to_string()).into_owned(),
        })
}

/// Reads the system's TLS roots now, on a thread of their own, so that a
/// [`BotApi`] made later (a follower elected leader) does not wait for them.
pub fn prepare_tls() {
    if TLS.get().is_none() {
        std::thread::spawn(|| {
            let _ = tls();
        });
    }
}

/// What every client of this process trusts: the platform's verifier,
/// which reads the system's roots when made (milliseconds of CPU), so it is
/// made once. The same settings reqwest makes for itself (TLS 1.2 and 1.3,
/// ring, HTTP/1.1 by ALPN); a system whose roots cannot be read fails every
/// client alike, with why.
fn tls() -> Result<&'static Arc<rustls::ClientConfig>, &'static String> {
    TLS.get_or_init(|| {
        // reqwest is built without a bundled crypto provider: ring, for
        // the relay and for any client it builds itself. Losing the race to
        // another installer is fine: any provider will do.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls_platform_verifier::Verifier::new(provider.clone())
            .map_err(|e| format!("cannot read the system's TLS roots: {e}"))?;
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS settings: {e}"))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    })
    .as_ref()
}

static TLS: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();

/// Refusals that must hold for every call, including the ones followers
/// proxy through the leader with arbitrary parameters.
fn check(method: &str, params: &Value) -> Result<(), TelegramError> {
    if method.is_empty() || !method.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(TelegramError::Refused {
            reason: "a method name is letters and digits only",
        });
    }
    let Some(params) = params.as_object() else {
        return Err(TelegramError::Refused {
            reason: "parameters must be a JSON object",
        });
    };
    let thread = params.get("message_thread_id");
    if thread.and_then(Value::as_i64) == Some(GENERAL_THREAD)
        || thread.and_then(Value::as_str).map(str::trim) == Some("1")
    {
        return Err(TelegramError::Refused {
            reason: "message_thread_id 1 is the General topic",
        });
    }
    if method == "getUpdates"
        && params
            .get("offset")
            .and_then(Value::as_i64)
            .is_some_and(|offset| offset < 0)
    {
        return Err(TelegramError::Refused {
            reason: "a negative getUpdates offset drops the backlog",
        });
    }
    Ok(())
}

/// The parameters as a person will read them. Every text shown on the
/// phone — a message's `text`, a `caption`, a topic's `name`, a button's
/// label, a tap's answer — passes [`redact`] (no token or seed leaves in a
/// message, whoever wrote it: an agent's answer, an approval's preview of
/// `curl …/bot<token>/getMe`) and has its hidden characters revealed
/// ([`crate::visible`]). Every call goes through here, so no path can
/// forget either; the paths that shape a text (the renderer, previews,
/// questions) reveal first themselves, so what they measure is what goes.
fn shown(params: &Value) -> Value {
    let mut params = params.clone();
    let Some(object) = params.as_object_mut() else {
        return params;
    };
    let html = object
        .get("parse_mode")
        .and_then(Value::as_str)
        .is_some_and(|mode| mode.eq_ignore_ascii_case("html"));
    for (key, value) in object.iter_mut() {
        match (key.as_str(), value) {
            ("text" | "caption", Value::String(text)) => {
                *text = shown_text(text, html).into_owned();
            }
            ("name", Value::String(text)) => *text = shown_text(text, false).into_owned(),
            ("reply_markup", markup) => {
                let rows = markup
                    .get_mut("inline_keyboard")
                    .and_then(Value::as_array_mut);
                for button in rows
                    .into_iter()
                    .flatten()
                    .flat_map(|row| row.as_array_mut().into_iter().flatten())
                {
                    if let Some(Value::String(label)) = button.get_mut("text") {
                        *label = shown_text(label, false).into_owned();
                    }
                }
            }
            _ => {}
        }
    }
    params
}

/// One text as a person will read it: see [`shown`].
fn shown_text(text: &str, html: bool) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    let revealed = if html {
        crate::visible::reveal_html(text)
    } else {
        crate::visible::reveal(text)
    };
    let redacted = match if html {
        crate::redact::redact_html(&revealed)
    } else {
        redact(&revealed)
    } {
        Cow::Owned(masked) => Some(masked),
        Cow::Borrowed(_) => None,
    };
    redacted.map_or(revealed, Cow::Owned)
}

fn parse_result<T: DeserializeOwned>(method: &str, result: Value) -> Result<T, TelegramError> {
    serde_json::from_value(result).map_err(|error| TelegramError::Malformed {
        message: redact(&format!("unexpected {method} result: {error}")).into_owned(),
        commit_unknown: !is_idempotent(method),
    })
}

fn too_big(limit: u64) -> TelegramError {
    TelegramError::FileTooBig {
        description: format!("more than {limit} bytes"),
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::extract::State;
    use axum::http::{StatusCode, Uri};
    use axum::response::{IntoResponse, Response};
    use bytes::Bytes;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::telegram::call::{ChatAction, CreateForumTopic, InTopic, SendChatAction};
    use crate::telegram::types::ParseMode;

    const TOKEN: &str = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_";
    const SECRET: &str = "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_";
    /// Bounds every test against a hung server or client.
    const TEST_DEADLINE: Duration = Duration::from_secs(10);

    fn message(chat: i64, thread: Option<i64>, text: &str, mode: Option<ParseMode>) -> SendMessage {
        SendMessage {
            chat_id: chat,
            message_thread_id: thread,
            text: text.into(),
            parse_mode: mode,
            reply_markup: None,
            reply_parameters: None,
            link_preview_options: Some(Default::default()),
        }
    }

    enum Reply {
        Answer(StatusCode, &'static str),
        Hang,
    }

    type Script = fn(&str) -> Reply;

    #[derive(Clone)]
    struct Server {
        script: Script,
        calls: Arc<Mutex<Vec<(String, Value)>>>,
    }

    impl Server {
        fn calls(&self) -> Vec<(String, Value)> {
            self.calls.lock().unwrap().clone()
        }
    }

    async fn answer(State(server): State<Server>, uri: Uri, body: Bytes) -> Response {
        let Some(method) = uri.path().strip_prefix(&format!("/bot{TOKEN}/")) else {
            return (StatusCode::NOT_FOUND, "wrong path").into_response();
        };
        let params = serde_json::from_slice(&body).unwrap_or(Value::Null);
        server
            .calls
            .lock()
            .unwrap()
            .push((method.to_string(), params));
        match (server.script)(method) {
            Reply::Answer(status, body) => (status, body).into_response(),
            Reply::Hang => std::future::pending().await,
        }
    }

    async fn start(script: Script) -> (BotApi, Server) {
        let server = Server {
            script,
            calls: Arc::default(),
        };
        let router = Router::new().fallback(answer).with_state(server.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        crate::tasks::spawn(async move { axum::serve(listener, router).await });
        (api(addr), server)
    }

    fn api(addr: SocketAddr) -> BotApi {
        let token = BotToken::parse(TOKEN).unwrap();
        BotApi::new(&format!("http://{addr}/"), &token).unwrap()
    }

    async fn within<T>(future: impl Future<Output = T>) -> T {
        tokio::time::timeout(TEST_DEADLINE, future)
            .await
            .expect("test deadline")
    }

    fn assert_redacted(error: &TelegramError) {
        let text = format!("{error} {error:?}");
        assert!(!text.contains(SECRET), "{text}");
    }

    fn script(method: &str) -> Reply {
        match method {
            "getMe" => Reply::Answer(
                StatusCode::OK,
                r#"{"ok":true,"result":{"id":123456789,"is_bot":true,"first_name":"Relay","username":"relay_bot","has_topics_enabled":true}}"#,
            ),
            "sendMessage" => Reply::Answer(
                StatusCode::OK,
                r#"{"ok":true,"result":{"message_id":5,"date":1,"chat":{"id":-100,"type":"supergroup"},"message_thread_id":9,"is_topic_message":true,"text":"hi"}}"#,
            ),
            "getUpdates" => Reply::Answer(
                StatusCode::OK,
                r#"{"ok":true,"result":[{"update_id":1,"poll":{}},{"update_id":2,"message":{"message_id":1,"date":1,"chat":{"id":5,"type":"private"}}}]}"#,
            ),
            "createForumTopic" => Reply::Answer(
                StatusCode::OK,
                r#"{"ok":true,"result":{"message_thread_id":77,"name":"A · api","icon_color":7322096}}"#,
            ),
            "deleteForumTopic" => Reply::Answer(
                StatusCode::BAD_REQUEST,
                r#"{"ok":false,"error_code":400,"description":"Bad Request: message thread not found"}"#,
            ),
            "getChat" => Reply::Answer(StatusCode::OK, "<html>surprise</html>"),
            "getChatMember" => Reply::Answer(StatusCode::OK, r#"{"ok":true,"result":{"status":"#),
            "sendChatAction" => Reply::Answer(
                StatusCode::TOO_MANY_REQUESTS,
                r#"{"ok":false,"error_code":429,"description":"Too Many Requests: retry after 3","parameters":{"retry_after":3}}"#,
            ),
            _ => Reply::Hang,
        }
    }

    #[tokio::test]
    async fn typed_calls_send_the_right_parameters() {
        let (api, server) = start(script).await;
        let me = within(api.get_me()).await.unwrap();
        assert_eq!(me.username, "relay_bot");
        assert!(me.has_topics_enabled);

        let sent =
            within(api.send_message(message(-100, Some(9), "<b>hi</b>", Some(ParseMode::Html))))
                .await
                .unwrap();
        assert_eq!(sent, 5);

        let create = BotCall::CreateForumTopic(CreateForumTopic {
            chat_id: -100,
            name: "A · api".into(),
        });
        let topic = within(api.perform(&create)).await.unwrap();
        assert_eq!(
            topic,
            BotReply::Topic {
                message_thread_id: 77
            }
        );

        let calls = server.calls();
        assert_eq!(calls[1].0, "sendMessage");
        assert_eq!(
            calls[1].1,
            json!({
                "chat_id": -100, "message_thread_id": 9, "text": "<b>hi</b>",
                "parse_mode": "HTML", "link_preview_options": {"is_disabled": true}
            })
        );
        assert_eq!(calls[2].1, json!({"chat_id": -100, "name": "A · api"}));
    }

    /// The one funnel: whatever path made a text, a token in it is masked
    /// and a hidden character revealed before it leaves, in HTML and plain
    /// text, captions, topic names and button labels alike.
    #[tokio::test]
    async fn every_text_a_person_reads_is_redacted_and_revealed_on_the_way_out() {
        let (api, server) = start(script).await;
        let curl = format!("curl https://api.telegram.org/bot{TOKEN}/getMe");
        let mut html = message(
            -100,
            Some(9),
            &format!("<pre>$ {curl} \u{202E}x</pre>"),
            None,
        );
        html.parse_mode = Some(ParseMode::Html);
        within(api.send_message(html)).await.unwrap();
        within(api.send_message(message(5, None, &format!("{curl}\u{200B}"), None)))
            .await
            .unwrap();
        let create = BotCall::CreateForumTopic(CreateForumTopic {
            chat_id: -100,
            name: "A · ev\u{202E}il".into(),
        });
        within(api.perform(&create)).await.unwrap();
        within(api.call(
            "sendMessage",
            &json!({"chat_id": 5, "text": "?", "reply_markup": {"inline_keyboard": [[
                {"text": format!("Allow {TOKEN}\u{2066}"), "callback_data": "a:1:0"}
            ]]}}),
        ))
        .await
        .unwrap();
        let calls = server.calls();
        let sent = serde_json::to_string(&calls).unwrap();
        assert!(!sent.contains(SECRET), "{sent}");
        assert_eq!(
            calls[0].1["text"],
            "<pre>$ curl https://api.telegram.org/bot123456789:&lt;redacted&gt;/getMe &lt;U+202E&gt;x</pre>"
        );
        assert_eq!(
            calls[1].1["text"],
            "curl https://api.telegram.org/bot123456789:<redacted>/getMe<U+200B>"
        );
        assert_eq!(calls[2].1["name"], "A · ev<U+202E>il");
        let button = &calls[3].1["reply_markup"]["inline_keyboard"][0][0];
        assert_eq!(button["text"], "Allow 123456789:<redacted><U+2066>");
        assert_eq!(button["callback_data"], "a:1:0", "data is no text");
    }

    #[tokio::test]
    async fn updates_come_back_raw_and_the_poll_asks_for_our_kinds() {
        let (api, server) = start(script).await;
        let updates = within(api.get_updates(Some(41), 0, 100)).await.unwrap();
        assert_eq!(updates.len(), 2);
        assert_eq!(
            server.calls()[0].1,
            json!({"offset": 41, "timeout": 0, "limit": 100,
                   "allowed_updates": ["message", "edited_message", "callback_query",
                                       "stopped_message_generation"]})
        );
    }

    #[tokio::test]
    async fn api_errors_are_classified() {
        let (api, _server) = start(script).await;
        let delete = BotCall::DeleteForumTopic(InTopic {
            chat_id: -100,
            message_thread_id: 9,
        });
        let gone = within(api.perform(&delete)).await.unwrap_err();
        assert!(matches!(gone, TelegramError::ThreadGone { .. }), "{gone:?}");

        let typing = BotCall::SendChatAction(SendChatAction {
            chat_id: 5,
            message_thread_id: None,
            action: ChatAction::Typing,
        });
        let limited = within(api.perform(&typing)).await.unwrap_err();
        assert_eq!(limited.retry_after(), Some(Duration::from_secs(3)));
    }

    #[tokio::test]
    async fn garbage_and_truncated_json_are_malformed() {
        let (api, _server) = start(script).await;
        for error in [
            within(api.get_chat(-100)).await.unwrap_err(),
            within(api.get_chat_member(-100, 1)).await.unwrap_err(),
        ] {
            assert!(
                matches!(
                    error,
                    TelegramError::Malformed {
                        commit_unknown: false,
                        ..
                    }
                ),
                "{error:?}"
            );
            assert_redacted(&error);
        }
    }

    #[tokio::test]
    async fn a_send_that_times_out_is_commit_unknown_and_redacted() {
        let (api, _server) = start(|_| Reply::Hang).await;
        let api = api.with_timeout(Duration::from_millis(200));
        let error = within(api.send_message(message(5, None, "hi", None)))
            .await
            .unwrap_err();
        assert_eq!(
            error,
            TelegramError::Timeout {
                commit_unknown: true
            }
        );
        assert!(!error.is_retryable());
        assert_redacted(&error);

        let error = within(api.get_me()).await.unwrap_err();
        assert!(error.is_retryable(), "{error:?}");
    }

    #[tokio::test]
    async fn a_refused_connection_was_never_sent() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let error = within(api(addr).send_message(message(5, None, "hi", None)))
            .await
            .unwrap_err();
        assert!(
            matches!(
                error,
                TelegramError::Network {
                    commit_unknown: false,
                    ..
                }
            ),
            "{error:?}"
        );
        assert_redacted(&error);
    }

    /// A body cut short of its Content-Length: the send may have happened.
    #[tokio::test]
    async fn a_truncated_body_is_malformed_and_commit_unknown() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        crate::tasks::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            read_request(&mut stream).await;
            let head =
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n";
            stream.write_all(head.as_bytes()).await.unwrap();
            stream.write_all(br#"{"ok":true,"res"#).await.unwrap();
            stream.shutdown().await.unwrap();
        });
        let error = within(api(addr).send_message(message(5, None, "hi", None)))
            .await
            .unwrap_err();
        assert!(error.commit_unknown(), "{error:?}");
        assert!(
            matches!(error, TelegramError::Malformed { .. }),
            "{error:?}"
        );
        assert_redacted(&error);
    }

    /// Reads one request (head and a Content-Length body) so the reply is
    /// only written once the client has finished sending.
    async fn read_request(stream: &mut tokio::net::TcpStream) {
        let mut buffer = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let read = stream.read(&mut chunk).await.unwrap();
            assert!(read > 0, "client closed early");
            buffer.extend_from_slice(&chunk[..read]);
            let text = String::from_utf8_lossy(&buffer).to_ascii_lowercase();
            let Some(head_end) = text.find("\r\n\r\n") else {
                continue;
            };
            let length: usize = text
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|value| value.trim().parse().ok())
                .unwrap_or(0);
            if buffer.len() >= head_end + 4 + length {
                return;
            }
        }
    }

    #[tokio::test]
    async fn the_general_topic_and_negative_offsets_are_refused_without_a_request() {
        let (api, server) = start(script).await;
        let general = within(api.send_message(message(-100, Some(1), "hi", None)))
            .await
            .unwrap_err();
        assert!(matches!(general, TelegramError::Refused { .. }));
        let proxied = within(api.call(
            "sendChatAction",
            &json!({"chat_id": -100, "message_thread_id": "1", "action": "typing"}),
        ))
        .await
        .unwrap_err();
        assert!(matches!(proxied, TelegramError::Refused { .. }));
        let backlog = within(api.get_updates(Some(-1), 0, 100)).await.unwrap_err();
        assert!(matches!(backlog, TelegramError::Refused { .. }));
        let path = within(api.call("../getMe", &json!({}))).await.unwrap_err();
        assert!(matches!(path, TelegramError::Refused { .. }));
        assert!(server.calls().is_empty());
    }

    /// A file that is no longer as its checks found it (another length,
    /// or rewritten) is refused, and the upload never completes: nothing
    /// of it reaches the topic, neither cut short nor garbled.
    #[tokio::test]
    async fn a_file_that_changed_since_its_check_is_refused_and_never_posted() {
        use std::io::Write as _;

        use crate::fake_bot_api::{DEFAULT_FORUM_CHAT_ID, FakeBotApi, FakeConfig};

        let fake = FakeBotApi::start(FakeConfig::default()).await.unwrap();
        fake.api().add_default_chats();
        let token = BotToken::parse(&fake.api().token()).unwrap();
        let api = BotApi::new(&fake.url(), &token).unwrap();
        let params = SendFile {
            chat_id: DEFAULT_FORUM_CHAT_ID,
            message_thread_id: None,
            caption: None,
            parse_mode: None,
            as_photo: false,
            file_name: "report.bin".into(),
        };
        let len = 3 * 1024 * 1024 + 17;
        let bytes: Vec<u8> = (0..len).map(|i| (i % 253) as u8).collect();
        let send = |file: std::fs::File| {
            let source = UploadSource::File {
                file,
                len: len as u64,
            };
            let api = api.clone();
            let params = params.clone();
            async move { within(api.send_file(&params, &source, TEST_DEADLINE)).await }
        };
        let written = || {
            let mut file = tempfile::tempfile().unwrap();
            file.write_all(&bytes).unwrap();
            file
        };

        send(written()).await.expect("a file as checked goes");
        let uploads = fake.api().uploads();
        assert_eq!(uploads.len(), 1);
        assert!(uploads[0].bytes[..] == bytes[..], "sent other than written");

        let shrunk = written();
        shrunk.set_len(len as u64 - 1).unwrap();
        let mut grown = written();
        grown.write_all(b"more").unwrap();
        for changed in [shrunk, grown] {
            let refused = send(changed).await.unwrap_err();
            assert!(
                matches!(refused, TelegramError::Refused { reason } if reason.contains("changed")),
                "{refused:?}"
            );
        }
        assert_eq!(fake.api().uploads().len(), 1, "a changed file was posted");
    }

    #[test]
    fn setup_rejects_bad_base_urls_and_debug_hides_the_token() {
        let token = BotToken::parse(TOKEN).unwrap();
        for base in ["api.telegram.org", "ftp://x", "http://x/?q=1"] {
            assert!(BotApi::new(base, &token).is_err(), "{base}");
        }
        let api = BotApi::new("https://api.telegram.org", &token).unwrap();
        let debug = format!("{api:?}");
        assert!(!debug.contains(SECRET), "{debug}");
    }
}

//! A faithful simulator of the Telegram Bot API, for tests, `agent-relay demo` and
//! the benchmark. Production paths never depend on it, and it depends on nothing
//! else in the crate: it speaks Telegram's JSON itself.
//!
//! It is a real HTTP server (axum, on 127.0.0.1) so the relay's client is exercised
//! end to end. Start one in-process with [`FakeBotApi::start`], or run the
//! `fake-bot-api` binary and drive it from another process over the control routes.
//! The Telegram facts it reproduces are listed below; those the relay relies
//! on are in docs/DESIGN.md, *Telegram*.
//!
//! Layout: `methods` (the Bot API methods), `error` (their error answers),
//! `markup` (`reply_markup`), `files` (media in and out), `html` (HTML parse
//! mode), `state` (chats, messages, the update queue), `http` (routes,
//! faults, uploads, downloads), `records` (what tests inject and read back).
//!
//! # Bot API (`{url}/bot<token>/<method>`, GET or POST; JSON, form, query or multipart)
//!
//! Wrong token → 401 `Unauthorized`; unknown method → 404 `Not Found`; HTTP status
//! always equals `error_code`. Method names are case-insensitive, as on Telegram.
//! Implemented: `getMe`, `setWebhook`, `deleteWebhook`, `getWebhookInfo`, `getUpdates`,
//! `sendMessage`, `editMessageText`, `editMessageReplyMarkup`, `sendPhoto`,
//! `sendDocument`, `sendVoice`, `sendAudio`, `getFile`, `sendChatAction`,
//! `sendMessageDraft`, `answerCallbackQuery`, `getChat`, `getChatMember`, `setMyCommands`,
//! `getMyCommands`, `deleteMyCommands`, `createForumTopic`, `editForumTopic`,
//! `closeForumTopic`, `reopenForumTopic`, `deleteForumTopic`.
//! Files: `GET {url}/file/bot<token>/<file_path>` (wrong token → 401, unknown path → 404).
//!
//! Semantics worth knowing:
//! * `getUpdates`: a positive `offset` forgets every lower update id, a negative one
//!   keeps only the last |offset| updates; `limit` is clamped to 1–100; `timeout`
//!   long-polls and answers as soon as an update arrives; `allowed_updates` is
//!   remembered and filters updates when they are *created*.
//! * Only one poller: when a `getUpdates` arrives while another is still open, the
//!   **older** one is terminated with 409 `Conflict: terminated by other
//!   getUpdates request; …` and the newer one proceeds. Such overlaps are counted
//!   ([`PollStats`]); one whose newcomer is a short poll (`timeout` 0, a stepping-down
//!   leader confirming its offset) is also counted apart.
//! * `getWebhookInfo` → `{url, has_custom_certificate: false,
//!   pending_update_count}` (updates not yet confirmed).
//! * While a webhook is set (`setWebhook` with an HTTPS `url`, as another program
//!   would), `getUpdates` → 409 `Conflict: can't use getUpdates method while
//!   webhook is active; use deleteWebhook to delete the webhook first`, Telegram's
//!   words; `deleteWebhook` (or `setWebhook` with an empty `url`) removes it.
//! * Thread ids are message ids of the `forum_topic_created` service message, so they
//!   are never 1. In supergroups thread 1 is the General topic: sending, acting or
//!   editing there, or in a deleted or never existing thread → 400 `Bad Request:
//!   message thread not found`. A private chat has no General topic (thread 1 is
//!   just a thread that does not exist there).
//! * Private chats have topics while the bot has them enabled (`getMe` →
//!   `has_topics_enabled`, switchable at runtime); otherwise `createForumTopic`
//!   there → 400 `Bad Request: the chat is not a forum` (what Telegram answers for
//!   any chat without topics; the exact text for this case is not documented).
//!   In supergroups `createForumTopic` needs `can_manage_topics` (400 `Bad
//!   Request: not enough rights to create a topic`), `deleteForumTopic`
//!   `can_delete_messages`.
//! * HTML parse mode is validated (the tags the Bot API documents, and their
//!   documented synonyms); 4096 (text) and 1024 (caption) are counted in UTF-16
//!   units after parsing (`message is too long`, `message caption is too long`).
//! * `reply_markup` (object, or JSON in a string) is validated as the Bot API server
//!   does (see `markup`): `callback_data` 1–64 bytes (`BUTTON_DATA_INVALID`), a
//!   button with `url` and `callback_data` keeps the url, unparsable JSON → `can't
//!   parse reply keyboard markup JSON object`. The markup is stored with the
//!   message. `editMessageText` without `reply_markup` removes the buttons;
//!   `editMessageReplyMarkup` without it (or with `{"inline_keyboard":[]}`)
//!   removes them too; an edit that changes nothing → `message is not modified: …`.
//! * Replies: `reply_parameters` (or `reply_to_message_id`) must name a message of
//!   the chat (`message to be replied not found` unless
//!   `allow_sending_without_reply`); a reply lands in the topic of the message it
//!   answers; the message object carries `reply_to_message`, one level deep.
//! * `answerCallbackQuery`: an unknown id, or one already answered → 400 `Bad
//!   Request: query is too old and response timeout expired or query ID is invalid`.
//! * Files: uploads as multipart parts with a file name (named like the parameter,
//!   or `attach://<part>`; a part without a file name is a plain field, as for
//!   Telegram's HTTP reader) or a known `file_id`. Photos ≤ 10 MB, others ≤ 50 MB, else
//!   HTTP 413 `Request Entity Too Large`; a photo that is no JPEG/PNG/GIF/WebP/BMP →
//!   `IMAGE_PROCESS_FAILED`; another kind's `file_id` → `type of file mismatch`; an
//!   unknown one → `wrong file identifier/HTTP URL specified`. `getFile`: unknown
//!   → `invalid file_id`, over 20 MB → `file is too big`. The fake never
//!   transcodes: the largest photo size is the uploaded bytes (see `files`).
//!   Every request to `/file/…` is recorded ([`DownloadRecord`]); reading a file
//!   over the control routes is not.
//! * With [`FakeConfig::rate_limits`], every send and edit beyond 1/s per private
//!   chat, 20/min per group or 30/s overall answers 429 with
//!   `parameters.retry_after` and a `Retry-After` header. Sends, edits and refusals
//!   are counted per chat either way ([`ChatCounters`]).
//! * `sendMessageDraft` (Bot API 9.3–10.3): private chats only (a group → 400 `Bad
//!   Request: draft can be sent only to private chats`; Telegram's exact text is not
//!   documented), their topics as for a send, `draft_id` not 0 (→ 400), text 0–4096
//!   units after parsing ("" shows "Thinking…"). A draft is shown for
//!   [`DRAFT_LIFETIME_MS`] after its last change, until the bot sends a message in
//!   its thread (which takes its place) or the person presses its stop button
//!   (`can_stop`; [`FakeBotApi::press_stop`]), which queues
//!   `stopped_message_generation` `{chat, message_thread_id?, draft_id}`, an update
//!   delivered only when `allowed_updates` names it. Drafts are no messages: they
//!   are not counted against the rate limits. Every text is kept ([`DraftRecord`]).
//! * Inline buttons may be `disabled` (`{"text": …, "disabled": {}}`, Bot API 10.3).
//! * `setMessageReaction`: at most one reaction (`REACTIONS_TOO_MANY`), an emoji of
//!   Telegram's list (`REACTION_INVALID`), a message that exists; a message of an
//!   album is reacted to on the album's first, as Telegram does. Reactions are no
//!   messages: not counted against the rate limits ([`FakeBotApi::reactions`]).
//! * A server that lags behind Telegram ([`FakeBotApi::set_lagging`]): the methods
//!   it lacks answer 404 `Not Found: method not found`; without `disabled` buttons
//!   such a button is a text button, refused.
//! * A deleted topic keeps its messages for inspection (Telegram would delete them).
//! * Accepted connections get `TCP_NODELAY` (see [`FakeBotApi::start`]).
//!
//! # Faults
//!
//! [`FakeBotApi::inject_fault`] queues a [`Fault`] for the next `times` calls of a
//! method (`"*"` = any method), consumed before normal handling;
//! [`FakeBotApi::inject_fault_until_cleared`] keeps it until
//! [`FakeBotApi::clear_faults`]. `TruncatedJson` *performs* the call and cuts its
//! answer (a connection dying mid-response: the side effect happened but the
//! client cannot know); `Deaf` makes `getUpdates` answer `[]` while updates pile
//! up (other methods are unaffected); every other fault except `Delay` answers
//! without performing the call. Method `"download"` (and only it, not `"*"`)
//! faults file downloads: `Hang` sends the headers and half the file, then
//! stalls until the client gives up; `Delay`, `TooManyRequests` and
//! `ServerError` act as for calls.
//!
//! # In-process API ([`FakeBotApi`])
//!
//! * World: `add_forum_supergroup`, `add_supergroup`, `add_private_chat`,
//!   `add_default_chats`, `set_bot_rights`, `set_has_topics_enabled`,
//!   `set_allows_users_to_create_topics`, `set_lagging`.
//! * Users act: `inject_message` (text), `inject_user_message` (replies, files,
//!   captions, albums), `inject_callback_query` (taps, also forged ones),
//!   `inject_topic` (a user opens a topic), `press_stop` (a draft's stop
//!   button), `inject_edit` (a user edits a message), `inject_raw_update`,
//!   `delete_topic_externally`.
//! * Faults: `inject_fault`, `inject_fault_until_cleared`, `clear_faults`.
//! * Read back: `calls`, `topics`, `messages` (per thread), `message` (one, by id,
//!   with its markup and edit history), `pending_update_ids`, `callback_queries`,
//!   `unanswered_callback_queries`, `drafts`, `reactions`, `file`, `uploads`,
//!   `downloads`, `stats`.
//! * Wait: `wait_until`, `wait_for_messages`, `wait_for_call`, `wait_for_poller`.
//!
//! # Control routes (`{url}/control/…`, JSON), for tests in other processes
//!
//! | route | body / query | answer |
//! |---|---|---|
//! | `POST inject_message` | [`UserMessage`]: `{chat_id, thread_id?, user_id, text?, entities?, reply_to_message_id?, media_group_id?, media?: {kind: "photo"\|"document"\|"voice"\|"audio"\|"video"\|"video_note"\|"animation"\|"sticker", data_base64?, declared_size?, file_name?, mime_type?, duration?, width?, height?}}` | [`Injected`] `{update_id, message_id, file_ids}` or 400 |
//! | `POST inject_update` | any update object without `update_id` | `{update_id}` |
//! | `POST inject_callback_query` | `{chat_id, thread_id?, user_id, message_id, data}` | `{update_id, callback_query_id}` |
//! | `POST inject_topic` | `{chat_id, user_id, name}` | `{thread_id, update_id}` or 400 |
//! | `POST press_stop` | `{chat_id, thread_id?, draft_id}` | `{update_id}` or 400 |
//! | `GET drafts` | | `[DraftRecord]` |
//! | `POST fault` | `{method, times?, until_cleared?, fault:{kind:"too_many_requests",retry_after} \| {kind:"server_error",code} \| {kind:"delay",ms} \| {kind:"hang"} \| {kind:"garbage_body"} \| {kind:"truncated_json"} \| {kind:"conflict"} \| {kind:"bad_request",description} \| {kind:"deaf",immediately?}}` | `{}` |
//! | `POST clear_faults` | `{}` | `{}` |
//! | `POST bot_settings` | `{has_topics_enabled?, allows_users_to_create_topics?}` | `{}` |
//! | `GET calls` | | `[CallRecord]` |
//! | `GET topics?chat_id=` | | `[TopicInfo]` |
//! | `GET messages?chat_id=&thread_id=` | `thread_id` omitted = outside topics | `[SentMessage]` |
//! | `GET message?chat_id=&message_id=` | | [`SentMessage`] (with `reply_markup`, `history`) or 404 |
//! | `GET wait_messages?chat_id=&thread_id=&count=&timeout_ms=` | | `[SentMessage]` or 408 |
//! | `GET callback_queries?unanswered=` | `unanswered=true`: only those | `[CallbackQueryRecord]` |
//! | `GET uploads` | | `[FileRecord]` the bot uploaded (without bytes) |
//! | `GET file?file_id=` | | [`FileRecord`] (without bytes) or 404 |
//! | `GET file_content?file_id=` | | the file's bytes or 404 |
//! | `GET downloads` | | `[DownloadRecord]` |
//! | `GET stats` | | [`FakeStats`] `{polls, pending_update_count, chats}` |
//! | `POST delete_topic` | `{chat_id, thread_id}` | `{}` or 400 |
//! | `POST chat` | `{kind:"forum_supergroup"\|"supergroup", chat_id, title, can_manage_topics, can_delete_messages}` or `{kind:"private", user_id, first_name}` | `{}` |

mod error;
mod files;
mod html;
mod http;
mod markup;
mod methods;
mod records;
mod state;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use axum::serve::ListenerExt as _;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use records::*;
use state::{Author, Chat, Inner, PlannedFault, StoredMessage, Text};

/// The forum supergroup created by [`FakeBotApi::add_default_chats`].
pub const DEFAULT_FORUM_CHAT_ID: i64 = -1_001_000_000_001;
/// The user (with a private chat) created by [`FakeBotApi::add_default_chats`].
pub const DEFAULT_USER_ID: i64 = 1001;

/// How the fake bot presents itself and which of Telegram's limits it enforces.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    pub token: String,
    pub bot_username: String,
    pub bot_first_name: String,
    /// `getMe.has_topics_enabled`: whether topics work in private chats.
    pub has_topics_enabled: bool,
    /// `getMe.allows_users_to_create_topics`: whether users may open topics in
    /// their private chat with the bot ([`FakeBotApi::inject_topic`]).
    pub allows_users_to_create_topics: bool,
    /// Answer 429 beyond Telegram's send limits.
    pub rate_limits: bool,
    /// Methods this server lacks, answered 404 "Not Found: method not
    /// found" as a self-hosted Bot API server (or a proxy) that lags behind
    /// Telegram answers them (e.g. `sendMessageDraft`).
    pub lacking: Vec<String>,
    /// Whether the server knows `disabled` buttons (Bot API 10.3); one that
    /// does not takes such a button for a text button, and refuses it.
    pub disabled_buttons: bool,
    pub addr: SocketAddr,
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            token: "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_".to_owned(),
            bot_username: "relay_test_bot".to_owned(),
            bot_first_name: "Relay Test Bot".to_owned(),
            has_topics_enabled: true,
            allows_users_to_create_topics: true,
            rate_limits: false,
            lacking: Vec::new(),
            disabled_buttons: true,
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        }
    }
}

/// The bot's administrator rights in a supergroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BotRights {
    #[serde(default)]
    pub can_manage_topics: bool,
    #[serde(default)]
    pub can_delete_messages: bool,
}

impl BotRights {
    pub const FULL: Self = Self {
        can_manage_topics: true,
        can_delete_messages: true,
    };
}

/// A misbehaviour of Telegram (or of the network in front of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// 429 with `parameters.retry_after` and a `Retry-After` header.
    TooManyRequests { retry_after: u64 },
    /// A 5xx (or any) status with a Telegram-shaped error body.
    ServerError { code: u16 },
    /// Wait, then handle the call normally.
    Delay(Duration),
    /// Never answer (until the server shuts down).
    Hang,
    /// 200 with an HTML body, as a misbehaving proxy sends.
    GarbageBody,
    /// Perform the call, then answer with a prefix of its JSON.
    TruncatedJson,
    /// 409 as if another poller were running.
    Conflict,
    /// 400 with this description (use Telegram's `Bad Request: …` wording).
    BadRequest { description: String },
    /// `getUpdates` answers `[]` (after its `timeout`, or `immediately`) and
    /// confirms nothing, while updates keep piling up: a poller that is alive but
    /// not receiving. Plan it for `getUpdates`: another method meeting it is
    /// handled normally (and uses up one of its `times`).
    Deaf { immediately: bool },
}

/// Errors of the in-process and control API (not Bot API answers).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FakeError {
    #[error("the fake knows no chat {0}")]
    UnknownChat(i64),
    #[error("chat {chat_id} has no live topic {thread_id}")]
    UnknownTopic { chat_id: i64, thread_id: i64 },
    #[error("chat {chat_id} has no message {message_id}")]
    UnknownMessage { chat_id: i64, message_id: i64 },
    /// What a Telegram client would not let a user send.
    #[error("a user could not send this: {0}")]
    Refused(String),
    #[error("timed out after {0:?} waiting for the fake Bot API")]
    Timeout(Duration),
}

struct Shared {
    inner: Mutex<Inner>,
    /// Bumped after every change of `inner`: long polls and test waits watch it,
    /// and a `watch` (unlike a bare `Notify`) cannot lose a wake-up that happens
    /// between checking a condition and starting to wait.
    changed: watch::Sender<u64>,
    shutdown: CancellationToken,
}

/// A cheap handle to the fake's state; clones share it.
#[derive(Clone)]
pub struct FakeBotApi {
    shared: Arc<Shared>,
}

/// A running fake server; it stops when dropped or on [`FakeServer::shutdown`].
pub struct FakeServer {
    api: FakeBotApi,
    addr: SocketAddr,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl FakeServer {
    /// Base URL to configure as `AGENT_RELAY_API_URL`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `{url}/bot{token}`: append `/{method}` to call the Bot API.
    pub fn bot_url(&self) -> String {
        format!("{}/bot{}", self.url(), self.api.token())
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn api(&self) -> FakeBotApi {
        self.api.clone()
    }

    /// Stops accepting, ends hanging and long-polling calls, and waits for the
    /// server task to finish.
    pub async fn shutdown(mut self) -> std::io::Result<()> {
        self.api.shared.shutdown.cancel();
        match self.task.take() {
            Some(task) => task.await.map_err(std::io::Error::other)?,
            None => Ok(()),
        }
    }
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.api.shared.shutdown.cancel();
    }
}

/// Disables Nagle's algorithm on an accepted connection. hyper may write an
/// answer's head and body separately; with Nagle on, the second small write waits
/// for the client's delayed ACK (~40 ms on Linux) and every call looks slow.
fn configure_accepted(stream: &mut tokio::net::TcpStream) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "fake Bot API: could not set TCP_NODELAY");
    }
}

impl FakeBotApi {
    /// Binds `config.addr` and serves the Bot API and the control routes, with
    /// `TCP_NODELAY` on every accepted connection.
    ///
    /// A token without Telegram's shape (`<digits>:<30+ of [A-Za-z0-9_-]>`) is
    /// refused: the relay's redaction relies on that shape, and a test with an
    /// odd token would prove nothing about leaks.
    pub async fn start(config: FakeConfig) -> std::io::Result<FakeServer> {
        if !has_token_shape(&config.token) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the fake's token must look like <digits>:<30+ of [A-Za-z0-9_-]>",
            ));
        }
        let listener = tokio::net::TcpListener::bind(config.addr).await?;
        let addr = listener.local_addr()?;
        let listener = listener.tap_io(configure_accepted);
        let api = Self::new(config);
        let router = http::router(api.clone());
        let shutdown = api.shared.shutdown.clone();
        let task = crate::tasks::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        });
        Ok(FakeServer {
            api,
            addr,
            task: Some(task),
        })
    }

    fn new(config: FakeConfig) -> Self {
        let (changed, _) = watch::channel(0);
        Self {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner::new(config)),
                changed,
                shutdown: CancellationToken::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere must not turn every later test assertion into a
        // poison error: the state stays usable.
        self.shared
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the state and wakes everything watching it.
    fn mutate<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        let out = f(&mut self.lock());
        self.notify();
        out
    }

    /// Wakes everything watching the state, after a change made under `lock`.
    fn notify(&self) {
        self.shared
            .changed
            .send_modify(|generation| *generation += 1);
    }

    fn now_ms(&self) -> u64 {
        self.lock().now_ms()
    }

    pub fn token(&self) -> String {
        self.lock().config.token.clone()
    }

    pub fn bot_id(&self) -> i64 {
        self.lock().bot_id
    }

    // ---- the world ----

    pub fn add_forum_supergroup(&self, chat_id: i64, title: &str, rights: BotRights) {
        self.add_chat(
            chat_id,
            state::ChatKind::Supergroup {
                title: title.to_owned(),
                is_forum: true,
            },
            rights,
        );
    }

    /// A supergroup without topics (for "the chat is not a forum").
    pub fn add_supergroup(&self, chat_id: i64, title: &str, rights: BotRights) {
        self.add_chat(
            chat_id,
            state::ChatKind::Supergroup {
                title: title.to_owned(),
                is_forum: false,
            },
            rights,
        );
    }

    /// The private chat between the bot and a user (its chat id is the user id).
    pub fn add_private_chat(&self, user_id: i64, first_name: &str) {
        self.mutate(|inner| inner.users.insert(user_id, first_name.to_owned()));
        self.add_chat(
            user_id,
            state::ChatKind::Private {
                first_name: first_name.to_owned(),
            },
            BotRights::default(),
        );
    }

    /// The usual test world: forum supergroup [`DEFAULT_FORUM_CHAT_ID`] where the
    /// bot has full rights, and user [`DEFAULT_USER_ID`] with a private chat.
    pub fn add_default_chats(&self) {
        self.add_forum_supergroup(DEFAULT_FORUM_CHAT_ID, "Relay Test Forum", BotRights::FULL);
        self.add_private_chat(DEFAULT_USER_ID, "Alice");
    }

    fn add_chat(&self, chat_id: i64, kind: state::ChatKind, rights: BotRights) {
        self.mutate(|inner| {
            inner
                .chats
                .insert(chat_id, Chat::new(chat_id, kind, rights));
        });
    }

    /// A group's administrator changes the bot's rights there (in a private
    /// chat rights mean nothing).
    pub fn set_bot_rights(&self, chat_id: i64, rights: BotRights) -> Result<(), FakeError> {
        self.mutate(|inner| {
            let chat = inner
                .chats
                .get_mut(&chat_id)
                .ok_or(FakeError::UnknownChat(chat_id))?;
            chat.rights = rights;
            Ok(())
        })
    }

    /// The owner switches topics in private chats on or off in @BotFather
    /// (`getMe.has_topics_enabled`), possibly while the relay runs. Topics made
    /// while it was on stay, but cannot be used while it is off.
    pub fn set_has_topics_enabled(&self, enabled: bool) {
        self.mutate(|inner| inner.config.has_topics_enabled = enabled);
    }

    /// The server lags behind Telegram: it lacks `methods` (404 "Not Found:
    /// method not found") and, unless `disabled_buttons`, knows no
    /// disabled button.
    pub fn set_lagging(&self, methods: &[&str], disabled_buttons: bool) {
        self.mutate(|inner| {
            inner.config.lacking = methods.iter().map(|m| (*m).to_string()).collect();
            inner.config.disabled_buttons = disabled_buttons;
        });
    }

    /// `getMe.allows_users_to_create_topics`.
    pub fn set_allows_users_to_create_topics(&self, allowed: bool) {
        self.mutate(|inner| inner.config.allows_users_to_create_topics = allowed);
    }

    // ---- users act ----

    /// A user writes `text`; returns the update id. A chat the fake does not know
    /// is registered implicitly (private if `chat_id > 0`, else a plain supergroup).
    /// The update is dropped if the poller's `allowed_updates` excludes messages.
    pub fn inject_message(&self, inject: Inject) -> i64 {
        self.mutate(|inner| post_user_message(inner, inject.into()).update_id)
    }

    /// A user posts anything a client lets them: text, a file with a caption, a
    /// reply, part of an album. Refused (as a client would refuse it): an empty
    /// text, a text over 4096 or a caption over 1024 UTF-16 units, a reply to a
    /// message the chat does not have.
    pub fn inject_user_message(&self, message: UserMessage) -> Result<Injected, FakeError> {
        let length = html::utf16_len(&message.text);
        if message.media.is_some() && length > methods::MAX_CAPTION {
            return Err(FakeError::Refused(format!("a caption of {length} units")));
        }
        if message.media.is_none() && (message.text.is_empty() || length > methods::MAX_TEXT) {
            return Err(FakeError::Refused(format!("a text of {length} units")));
        }
        self.mutate(|inner| {
            if let Some(message_id) = message.reply_to_message_id {
                let chat_id = message.chat_id;
                let known = inner
                    .chats
                    .get(&chat_id)
                    .is_some_and(|chat| chat.message(message_id).is_some());
                if !known {
                    return Err(FakeError::UnknownMessage {
                        chat_id,
                        message_id,
                    });
                }
            }
            Ok(post_user_message(inner, message))
        })
    }

    /// The user who wrote message `message_id` of `chat_id` edits it to `text`:
    /// an `edited_message` update with the message as it is now (its
    /// `edit_date` set). Returns the update id.
    pub fn inject_edit(&self, chat_id: i64, message_id: i64, text: &str) -> Result<i64, FakeError> {
        self.mutate(|inner| {
            let bot = inner.bot_user_json();
            let Inner { chats, users, .. } = &mut *inner;
            let chat = chats
                .get_mut(&chat_id)
                .ok_or(FakeError::UnknownChat(chat_id))?;
            let index = chat
                .message_index(message_id)
                .filter(|&i| matches!(chat.messages[i].author, Author::User(_)))
                .ok_or(FakeError::UnknownMessage {
                    chat_id,
                    message_id,
                })?;
            let stored = &mut chat.messages[index];
            stored.text = Text {
                raw: text.to_string(),
                parse_mode: None,
                plain: text.to_string(),
                entities: command_entities(text),
            };
            stored.edited = true;
            let mut json = chat.message_json(&chat.messages[index], &bot, users);
            json["edit_date"] = json!(json["date"].as_i64().unwrap_or_default() + 1);
            Ok(inner.push_update(json!({ "edited_message": json })))
        })
    }

    /// Queues any update (e.g. of a kind the relay does not know); `update_id` is
    /// assigned by the fake. Returns the update id.
    pub fn inject_raw_update(&self, update: Value) -> i64 {
        self.mutate(|inner| inner.push_update(update))
    }

    /// A user presses a button on message `message_id`; returns (update id,
    /// callback query id). The update's `message` is the stored message, with its
    /// topic; for a message the chat does not have (a forged tap) it is made of
    /// what `press` says. The query is recorded until answered
    /// ([`Self::unanswered_callback_queries`]).
    pub fn inject_callback_query(&self, press: CallbackInject) -> (i64, String) {
        self.mutate(|inner| {
            let id = format!(
                "{}",
                4_000_000_000_000_000_000u64 + inner.callback_queries.len() as u64 + 1
            );
            let from = state::user_json(press.user_id, &inner.users);
            let bot = inner.bot_user_json();
            let stored = inner.chats.get(&press.chat_id).and_then(|chat| {
                let message = chat.message(press.message_id)?;
                Some(chat.message_json(message, &bot, &inner.users))
            });
            let message = stored.unwrap_or_else(|| {
                let chat = match inner.chats.get(&press.chat_id) {
                    Some(chat) => chat.json(),
                    None => Chat::new(
                        press.chat_id,
                        state::implied_kind(&inner.users, press.chat_id, press.user_id),
                        BotRights::default(),
                    )
                    .json(),
                };
                let mut message = json!({
                    "message_id": press.message_id,
                    "from": bot,
                    "chat": chat,
                    "date": state::unix_now(),
                });
                if let Some(thread_id) = press.thread_id {
                    message["message_thread_id"] = json!(thread_id);
                    message["is_topic_message"] = json!(true);
                }
                message
            });
            let update_id = inner.push_update(json!({"callback_query": {
                "id": id,
                "from": from,
                "message": message,
                "chat_instance": chat_instance(press.chat_id),
                "data": press.data,
            }}));
            let injected_ms = inner.now_ms();
            inner.callback_queries.push(CallbackQueryRecord {
                callback_query_id: id.clone(),
                update_id,
                user_id: press.user_id,
                chat_id: press.chat_id,
                message_id: press.message_id,
                data: press.data,
                injected_ms,
                answer: None,
            });
            (update_id, id)
        })
    }

    /// The person presses the stop button of draft `draft_id` in
    /// `chat_id` (and `thread_id`): Telegram stops showing it and sends
    /// `stopped_message_generation` (delivered only when `allowed_updates`
    /// names it). Refused when no such draft is shown with the button.
    /// Returns the update id.
    pub fn press_stop(
        &self,
        chat_id: i64,
        thread_id: Option<i64>,
        draft_id: i64,
    ) -> Result<i64, FakeError> {
        self.mutate(|inner| {
            let now_ms = inner.now_ms();
            let draft = inner
                .drafts
                .iter_mut()
                .rev()
                .find(|d| {
                    d.chat_id == chat_id && d.thread_id == thread_id && d.draft_id == draft_id
                })
                .filter(|d| d.shown_at(now_ms) && d.can_stop)
                .ok_or_else(|| {
                    FakeError::Refused(format!("no draft {draft_id} with a stop button is shown"))
                })?;
            draft.stopped = true;
            let chat = inner
                .chats
                .get(&chat_id)
                .ok_or(FakeError::UnknownChat(chat_id))?
                .json();
            let mut stopped = json!({"chat": chat, "draft_id": draft_id});
            if let Some(thread_id) = thread_id {
                stopped["message_thread_id"] = json!(thread_id);
            }
            Ok(inner.push_update(json!({ "stopped_message_generation": stopped })))
        })
    }

    /// Every draft the bot streamed, in the order each began.
    pub fn drafts(&self) -> Vec<DraftRecord> {
        self.lock().drafts.clone()
    }

    /// A user opens a topic named `name` (in a forum, or in their private chat
    /// when the bot allows it); returns (thread id, update id of the
    /// `forum_topic_created` message).
    pub fn inject_topic(
        &self,
        chat_id: i64,
        user_id: i64,
        name: &str,
    ) -> Result<(i64, i64), FakeError> {
        self.mutate(|inner| {
            let bot = inner.bot_user_json();
            let has_topics = inner.config.has_topics_enabled;
            let users_may = inner.config.allows_users_to_create_topics;
            let Inner { chats, users, .. } = &mut *inner;
            let chat = chats
                .get_mut(&chat_id)
                .ok_or(FakeError::UnknownChat(chat_id))?;
            if !chat.has_topics(has_topics) || (chat.is_private() && !users_may) {
                return Err(FakeError::Refused(format!(
                    "chat {chat_id} lets no user open topics"
                )));
            }
            let color = state::ICON_COLORS[chat.topics.len() % state::ICON_COLORS.len()];
            let thread_id = chat.open_topic(name, color, Author::User(user_id));
            let json = chat
                .message(thread_id)
                .map(|created| chat.message_json(created, &bot, users));
            let update_id = inner.push_update(json!({ "message": json }));
            Ok((thread_id, update_id))
        })
    }

    /// The next `times` calls of `method` (case-insensitive; `"*"` = any method)
    /// meet `fault` before normal handling.
    pub fn inject_fault(&self, method: &str, fault: Fault, times: u32) {
        if times > 0 {
            self.plan_fault(method, fault, Some(times));
        }
    }

    /// Every call of `method` meets `fault` until [`Self::clear_faults`].
    pub fn inject_fault_until_cleared(&self, method: &str, fault: Fault) {
        self.plan_fault(method, fault, None);
    }

    /// Forgets every planned fault.
    pub fn clear_faults(&self) {
        self.mutate(|inner| inner.faults.clear());
    }

    fn plan_fault(&self, method: &str, fault: Fault, remaining: Option<u32>) {
        self.mutate(|inner| {
            inner.faults.push(PlannedFault {
                method: method.to_ascii_lowercase(),
                fault,
                remaining,
            });
        });
    }

    /// Another program sets a webhook for the bot (`setWebhook`): polls
    /// are refused with 409 until it is deleted.
    pub fn set_webhook_externally(&self, url: &str) {
        self.mutate(|inner| inner.webhook = Some(url.to_owned()));
    }

    /// A user deletes a topic in the Telegram app.
    pub fn delete_topic_externally(&self, chat_id: i64, thread_id: i64) -> Result<(), FakeError> {
        self.mutate(|inner| {
            let chat = inner
                .chats
                .get_mut(&chat_id)
                .ok_or(FakeError::UnknownChat(chat_id))?;
            match chat.topics.get_mut(&thread_id) {
                Some(topic) if !topic.deleted => {
                    topic.deleted = true;
                    Ok(())
                }
                _ => Err(FakeError::UnknownTopic { chat_id, thread_id }),
            }
        })
    }

    // ---- read back ----

    pub fn calls(&self) -> Vec<CallRecord> {
        self.lock().calls.clone()
    }

    /// Every topic ever created in the chat, deleted ones included.
    pub fn topics(&self, chat_id: i64) -> Vec<TopicInfo> {
        self.lock()
            .chats
            .get(&chat_id)
            .map(Chat::topic_info)
            .unwrap_or_default()
    }

    /// Messages the bot sent in `thread_id` (`None`: outside any topic).
    pub fn messages(&self, chat_id: i64, thread_id: Option<i64>) -> Vec<SentMessage> {
        self.lock()
            .chats
            .get(&chat_id)
            .map(|chat| chat.sent_messages(thread_id))
            .unwrap_or_default()
    }

    /// One message the bot sent, as it is now (markup included) with its history.
    pub fn message(&self, chat_id: i64, message_id: i64) -> Option<SentMessage> {
        let inner = self.lock();
        state::sent_message(inner.chats.get(&chat_id)?.message(message_id)?)
    }

    /// The bot's reaction on message `message_id` of `chat_id` now, and
    /// every one it set, oldest first (`None`: taken away).
    pub fn reactions(&self, chat_id: i64, message_id: i64) -> Vec<Option<String>> {
        let inner = self.lock();
        inner
            .chats
            .get(&chat_id)
            .and_then(|c| c.message(message_id))
            .map(|m| m.reactions.clone())
            .unwrap_or_default()
    }

    /// Updates not yet confirmed by a `getUpdates` offset.
    pub fn pending_update_ids(&self) -> Vec<i64> {
        self.lock().updates.iter().map(|(id, _)| *id).collect()
    }

    /// Every injected callback query, in order, with the bot's answer if any.
    pub fn callback_queries(&self) -> Vec<CallbackQueryRecord> {
        self.lock().callback_queries.clone()
    }

    /// The callback queries the bot has not answered (the client still spins).
    pub fn unanswered_callback_queries(&self) -> Vec<CallbackQueryRecord> {
        let inner = self.lock();
        inner
            .callback_queries
            .iter()
            .filter(|q| q.answer.is_none())
            .cloned()
            .collect()
    }

    /// A file the fake holds, bytes included.
    pub fn file(&self, file_id: &str) -> Option<FileRecord> {
        self.lock().file(file_id).cloned()
    }

    /// The files the bot uploaded, in upload order, bytes included (a photo
    /// appears once per size, smallest first; the largest is the uploaded bytes).
    pub fn uploads(&self) -> Vec<FileRecord> {
        let inner = self.lock();
        inner.files.iter().filter(|f| f.from_bot).cloned().collect()
    }

    /// Every request for a file's content, served or not.
    pub fn downloads(&self) -> Vec<DownloadRecord> {
        self.lock().downloads.clone()
    }

    /// Poll overlaps, the pending update count and per-chat counters.
    pub fn stats(&self) -> FakeStats {
        let inner = self.lock();
        FakeStats {
            polls: inner.polls,
            pending_update_count: inner.updates.len(),
            chats: inner
                .chats
                .values()
                .map(|chat| chat.counters)
                .filter(|c| c.sent + c.edited + c.rate_limited > 0)
                .collect(),
        }
    }

    // ---- waiting ----

    /// Waits until `check` yields a value, re-checking after every state change.
    pub async fn wait_until<T>(
        &self,
        mut check: impl FnMut(&FakeBotApi) -> Option<T>,
        timeout: Duration,
    ) -> Result<T, FakeError> {
        let mut changed = self.shared.changed.subscribe();
        let wait = async {
            loop {
                // Subscribed before checking, so a change between the check and
                // the wait still wakes us.
                changed.borrow_and_update();
                if let Some(found) = check(self) {
                    return Some(found);
                }
                if changed.changed().await.is_err() {
                    return None;
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(Some(found)) => Ok(found),
            Ok(None) | Err(_) => Err(FakeError::Timeout(timeout)),
        }
    }

    /// Waits until the bot has sent at least `count` messages in the thread.
    pub async fn wait_for_messages(
        &self,
        chat_id: i64,
        thread_id: Option<i64>,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<SentMessage>, FakeError> {
        self.wait_until(
            |api| {
                let messages = api.messages(chat_id, thread_id);
                (messages.len() >= count).then_some(messages)
            },
            timeout,
        )
        .await
    }

    /// Waits for the first answered call matching `predicate`.
    pub async fn wait_for_call(
        &self,
        predicate: impl Fn(&CallRecord) -> bool,
        timeout: Duration,
    ) -> Result<CallRecord, FakeError> {
        self.wait_until(
            |api| {
                api.lock()
                    .calls
                    .iter()
                    .find(|c| c.finished_ms.is_some() && predicate(c))
                    .cloned()
            },
            timeout,
        )
        .await
    }

    /// Waits until a `getUpdates` is registered as the poller, so that what a
    /// test does next (inject, start a rival poll) cannot overtake it.
    pub async fn wait_for_poller(&self, timeout: Duration) -> Result<(), FakeError> {
        self.wait_until(
            |api| api.lock().active_poll.is_some().then_some(()),
            timeout,
        )
        .await
    }
}

fn has_token_shape(token: &str) -> bool {
    let Some((id, secret)) = token.split_once(':') else {
        return false;
    };
    !id.is_empty()
        && id.chars().all(|c| c.is_ascii_digit())
        && id.parse::<i64>().is_ok()
        && secret.len() >= 30
        && secret
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Stores a user's message and queues its update (no checks: see
/// [`FakeBotApi::inject_user_message`] for what a client would refuse).
fn post_user_message(inner: &mut Inner, message: UserMessage) -> Injected {
    let chat_id = message.chat_id;
    let message_id = {
        let Inner { chats, users, .. } = &mut *inner;
        state::chat_entry(chats, users, chat_id, message.user_id).next_message_id
    };
    let media = message
        .media
        .as_ref()
        .map(|media| inner.add_media(files::NewFile::injected(media), false, chat_id, message_id));
    let entities = if message.entities.is_empty() && media.is_none() {
        command_entities(&message.text)
    } else {
        message.entities
    };
    let mut stored = StoredMessage::new(Author::User(message.user_id), message.thread_id);
    stored.text = Text {
        raw: message.text.clone(),
        parse_mode: None,
        plain: message.text,
        entities,
    };
    stored.reply_to = message.reply_to_message_id;
    stored.media_group_id = message.media_group_id;
    let file_ids = media
        .as_ref()
        .map(|m| m.file_ids.clone())
        .unwrap_or_default();
    stored.media = media;
    let bot = inner.bot_user_json();
    let Inner { chats, users, .. } = &mut *inner;
    let chat = state::chat_entry(chats, users, chat_id, message.user_id);
    let (message_id, json) = chat.post(stored, &bot, users);
    let update_id = inner.push_update(json!({ "message": json }));
    Injected {
        update_id,
        message_id,
        file_ids,
    }
}

/// The `bot_command` entity Telegram attaches to a leading `/command`, so
/// clients need not parse commands.
fn command_entities(text: &str) -> Vec<Value> {
    if !text.starts_with('/') {
        return Vec::new();
    }
    let command = text.split_whitespace().next().unwrap_or(text);
    let length = html::utf16_len(command);
    vec![json!({"type": "bot_command", "offset": 0, "length": length})]
}

/// A callback query's `chat_instance`: stable per chat, but not its id (code
/// that mistakes one for the other fails against the fake too).
fn chat_instance(chat_id: i64) -> String {
    let mixed = u64::from_ne_bytes(chat_id.to_ne_bytes()).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    i64::from_ne_bytes(mixed.to_ne_bytes()).to_string()
}

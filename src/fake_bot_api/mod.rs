//! A faithful simulator of the Telegram Bot API, for tests, `agent-relay demo` and
//! the benchmark. Production paths never depend on it, and it depends on nothing
//! else in the crate: it speaks Telegram's JSON itself.
//!
//! It is a real HTTP server (axum, on 127.0.0.1) so the relay's client is exercised
//! end to end. Start one in-process with [`FakeBotApi::start`], or run the
//! `fake-bot-api` binary and drive it from another process over the control routes.
//!
//! # Bot API (`{url}/bot<token>/<method>`, GET or POST, JSON / form / query params)
//!
//! Wrong token → 401 `Unauthorized`; unknown method → 404 `Not Found`; HTTP status
//! always equals `error_code`. Method names are case-insensitive, as on Telegram.
//! Implemented: `getMe`, `deleteWebhook`, `getUpdates`, `sendMessage`,
//! `editMessageText`, `sendChatAction`, `answerCallbackQuery`, `getChat`,
//! `getChatMember`, `setMyCommands`, `getMyCommands`, `deleteMyCommands`,
//! `createForumTopic`, `editForumTopic`, `closeForumTopic`, `reopenForumTopic`,
//! `deleteForumTopic`.
//!
//! Semantics worth knowing:
//! * `getUpdates`: a positive `offset` forgets every lower update id, a negative one
//!   keeps only the last |offset| updates; `limit` is clamped to 1–100; `timeout`
//!   long-polls and answers as soon as an update arrives; `allowed_updates` is
//!   remembered and filters updates when they are *created*.
//! * Only one poller: when a `getUpdates` arrives while another is still waiting,
//!   the **older** one is terminated with 409 `Conflict: terminated by other
//!   getUpdates request; …` and the newer one proceeds.
//! * Thread ids are message ids of the `forum_topic_created` service message, so they
//!   are never 1 (the General topic). Sending, acting or editing in a deleted, never
//!   existing or General thread → 400 `Bad Request: message thread not found`.
//! * HTML parse mode is validated (the tags of TELEGRAM.md plus their documented
//!   synonyms); the 4096 limit is counted in UTF-16 units after parsing.
//! * With [`FakeConfig::rate_limits`], `sendMessage` beyond 1/s per private chat,
//!   20/min per group or 30/s overall answers 429 with `parameters.retry_after`.
//! * A deleted topic keeps its messages for inspection (Telegram would delete them).
//!
//! # Faults
//!
//! [`FakeBotApi::inject_fault`] queues a [`Fault`] for the next `times` calls of a
//! method (`"*"` = any method), consumed before normal handling. `TruncatedJson`
//! *performs* the call and cuts its answer (a connection dying mid-response: the
//! side effect happened but the client cannot know); every other fault except
//! `Delay` answers without performing it.
//!
//! # Control routes (`{url}/control/…`, JSON), for tests in other processes
//!
//! | route | body / query | answer |
//! |---|---|---|
//! | `POST inject_message` | `{chat_id, thread_id?, user_id, text}` | `{update_id}` |
//! | `POST inject_update` | any update object without `update_id` | `{update_id}` |
//! | `POST inject_callback_query` | `{chat_id, thread_id?, user_id, message_id, data}` | `{update_id, callback_query_id}` |
//! | `POST fault` | `{method, times, fault:{kind:"too_many_requests",retry_after} \| {kind:"server_error",code} \| {kind:"delay",ms} \| {kind:"hang"} \| {kind:"garbage_body"} \| {kind:"truncated_json"} \| {kind:"conflict"} \| {kind:"bad_request",description}}` | `{}` |
//! | `GET calls` | | `[CallRecord]` |
//! | `GET topics?chat_id=` | | `[TopicInfo]` |
//! | `GET messages?chat_id=&thread_id=` | `thread_id` omitted = outside topics | `[SentMessage]` |
//! | `GET wait_messages?chat_id=&thread_id=&count=&timeout_ms=` | | `[SentMessage]` or 408 |
//! | `POST delete_topic` | `{chat_id, thread_id}` | `{}` or 400 |
//! | `POST chat` | `{kind:"forum_supergroup"\|"supergroup", chat_id, title, can_manage_topics, can_delete_messages}` or `{kind:"private", user_id, first_name}` | `{}` |

mod html;
mod http;
mod methods;
mod state;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use state::{Author, Chat, ChatKind, Inner, PlannedFault, StoredMessage};

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
    /// Answer 429 beyond Telegram's send limits.
    pub rate_limits: bool,
    pub addr: SocketAddr,
}

impl Default for FakeConfig {
    fn default() -> Self {
        Self {
            token: "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_".to_owned(),
            bot_username: "relay_test_bot".to_owned(),
            bot_first_name: "Relay Test Bot".to_owned(),
            has_topics_enabled: true,
            rate_limits: false,
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

/// A message a user writes, to become a `message` update.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inject {
    pub chat_id: i64,
    #[serde(default)]
    pub thread_id: Option<i64>,
    pub user_id: i64,
    pub text: String,
}

/// A button press on one of the bot's messages, to become a `callback_query` update.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallbackInject {
    pub chat_id: i64,
    #[serde(default)]
    pub thread_id: Option<i64>,
    pub user_id: i64,
    pub message_id: i64,
    pub data: String,
}

/// A misbehaviour of Telegram (or of the network in front of it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// 429 with `parameters.retry_after`.
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
}

/// One Bot API call as the fake saw it. Times are milliseconds since the server
/// started, on a monotonic clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallRecord {
    pub seq: u64,
    /// Canonical spelling (`sendMessage`) for known methods, as sent otherwise.
    pub method: String,
    pub params: Value,
    pub started_ms: u64,
    /// `None` while the call has not been answered (or never will be: `Hang`).
    pub finished_ms: Option<u64>,
    pub status: Option<u16>,
    /// The `ok` field of the answer; false for unparseable answers.
    pub ok: bool,
    /// The fault applied to this call, if any (its `Debug` form).
    pub fault: Option<String>,
}

/// A forum topic as the fake knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicInfo {
    pub thread_id: i64,
    pub name: String,
    pub icon_color: i64,
    pub closed: bool,
    pub deleted: bool,
}

/// A text message the bot sent (service messages and users' messages excluded).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SentMessage {
    pub message_id: i64,
    pub thread_id: Option<i64>,
    /// The text as the bot sent it, markup included (after the last edit).
    pub text: String,
    pub parse_mode: Option<String>,
    /// The text as Telegram displays it, after entity parsing.
    pub plain_text: String,
    pub entities: Vec<Value>,
    pub date: i64,
    pub edited: bool,
}

/// Errors of the in-process and control API (not Bot API answers).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FakeError {
    #[error("the fake knows no chat {0}")]
    UnknownChat(i64),
    #[error("chat {chat_id} has no live topic {thread_id}")]
    UnknownTopic { chat_id: i64, thread_id: i64 },
    #[error("timed out after {0:?} waiting for the fake Bot API")]
    Timeout(Duration),
}

struct Shared {
    inner: Mutex<Inner>,
    /// Bumped after every change of `inner`: long polls and test waits watch it,
    /// and a `watch` (unlike a bare `Notify`) cannot lose a wake-up that happens
    /// between checking a condition and starting to wait.
    changed: watch::Sender<u64>,
    epoch: Instant,
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

impl FakeBotApi {
    /// Binds `config.addr` and serves the Bot API and the control routes.
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
        let api = Self::new(config);
        let router = http::router(api.clone());
        let shutdown = api.shared.shutdown.clone();
        let task = tokio::spawn(async move {
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
                epoch: Instant::now(),
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
        self.shared
            .changed
            .send_modify(|generation| *generation += 1);
        out
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.shared.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub fn token(&self) -> String {
        self.lock().config.token.clone()
    }

    pub fn bot_id(&self) -> i64 {
        self.lock().bot_id
    }

    // ---- chats ----

    pub fn add_forum_supergroup(&self, chat_id: i64, title: &str, rights: BotRights) {
        self.add_chat(
            chat_id,
            ChatKind::Supergroup {
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
            ChatKind::Supergroup {
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
            ChatKind::Private {
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

    fn add_chat(&self, chat_id: i64, kind: ChatKind, rights: BotRights) {
        self.mutate(|inner| {
            inner
                .chats
                .insert(chat_id, Chat::new(chat_id, kind, rights));
        });
    }

    // ---- injection ----

    /// A user writes `text`; returns the update id. A chat the fake does not know
    /// is registered implicitly (private if `chat_id > 0`, else a plain supergroup).
    /// The update is dropped if the poller's `allowed_updates` excludes messages.
    pub fn inject_message(&self, inject: Inject) -> i64 {
        self.mutate(|inner| {
            let bot = inner.bot_user_json();
            let date = state::unix_now();
            let Inner { chats, users, .. } = &mut *inner;
            let chat = state::chat_entry(chats, users, inject.chat_id, inject.user_id);
            let message = StoredMessage {
                message_id: chat.allocate_message_id(),
                thread_id: inject.thread_id,
                author: Author::User(inject.user_id),
                raw_text: inject.text.clone(),
                parse_mode: None,
                text: inject.text,
                entities: Vec::new(),
                date,
                edited: false,
                reply_markup: None,
                service: None,
            };
            // Telegram marks commands so clients need not parse them.
            let json = with_command_entity(chat.message_json(&message, &bot, users));
            chat.messages.push(message);
            inner.push_update(json!({ "message": json }))
        })
    }

    /// Queues any update (e.g. of a kind the relay does not know); `update_id` is
    /// assigned by the fake. Returns the update id.
    pub fn inject_raw_update(&self, update: Value) -> i64 {
        self.mutate(|inner| inner.push_update(update))
    }

    /// A user presses a button on message `message_id`; returns (update id,
    /// callback query id). Answering an unknown query id is a 400, as on Telegram.
    pub fn inject_callback_query(&self, press: CallbackInject) -> (i64, String) {
        self.mutate(|inner| {
            let id = format!(
                "{}",
                4_000_000_000_000_000_000u64 + inner.next_callback_query_id
            );
            inner.next_callback_query_id += 1;
            inner.callback_query_ids.insert(id.clone());
            let from = state::user_json(press.user_id, &inner.users);
            let bot = inner.bot_user_json();
            let Inner { chats, users, .. } = &mut *inner;
            let chat = state::chat_entry(chats, users, press.chat_id, press.user_id);
            let mut message = json!({
                "message_id": press.message_id,
                "from": bot,
                "chat": chat.json(),
                "date": state::unix_now(),
            });
            if let Some(stored) = chat
                .messages
                .iter()
                .find(|m| m.message_id == press.message_id)
            {
                message = chat.message_json(stored, &bot, users);
            } else if let Some(thread_id) = press.thread_id {
                message["message_thread_id"] = json!(thread_id);
                message["is_topic_message"] = json!(true);
            }
            let update = json!({"callback_query": {
                "id": id,
                "from": from,
                "message": message,
                "chat_instance": format!("{}", press.chat_id.unsigned_abs()),
                "data": press.data,
            }});
            (inner.push_update(update), id)
        })
    }

    /// The next `times` calls of `method` (case-insensitive; `"*"` = any method)
    /// meet `fault` before normal handling.
    pub fn inject_fault(&self, method: &str, fault: Fault, times: u32) {
        if times == 0 {
            return;
        }
        self.mutate(|inner| {
            inner.faults.push(PlannedFault {
                method: method.to_ascii_lowercase(),
                fault,
                remaining: times,
            });
        });
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

    // ---- inspection ----

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

    /// Text messages the bot sent in `thread_id` (`None`: outside any topic).
    pub fn messages(&self, chat_id: i64, thread_id: Option<i64>) -> Vec<SentMessage> {
        self.lock()
            .chats
            .get(&chat_id)
            .map(|chat| chat.sent_messages(thread_id))
            .unwrap_or_default()
    }

    /// Updates not yet confirmed by a `getUpdates` offset.
    pub fn pending_update_ids(&self) -> Vec<i64> {
        self.lock().updates.iter().map(|(id, _)| *id).collect()
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

/// Adds the `bot_command` entity Telegram attaches to a leading `/command`.
fn with_command_entity(mut message: Value) -> Value {
    let Some(text) = message["text"].as_str() else {
        return message;
    };
    if !text.starts_with('/') {
        return message;
    }
    let command = text.split_whitespace().next().unwrap_or(text);
    let length = html::utf16_len(command);
    message["entities"] = json!([{"type": "bot_command", "offset": 0, "length": length}]);
    message
}

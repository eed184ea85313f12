//! The leader's Telegram side: every Bot API call it makes, for a session
//! or for itself, is a [`BotCall`] made by [`Outbox::call`]: paced by one
//! [`RateLimiter`], retried, and every failure decided here, once
//! ([`super::failure::decide`]).
//!
//! | Telegram said | the outbox does | the caller gets |
//! |---|---|---|
//! | 429 `retry_after` | waits (for that chat, or all) and calls again | the result, later |
//! | a transient failure that cannot have taken effect | backs off and calls again | the result, later |
//! | can't parse entities (HTML) | sends the text again as plain text | `Performed { plain: true }` |
//! | message is not modified (an edit, a close, a reopen) | nothing | success |
//! | the topic is gone (deleting it) | nothing | success |
//! | the topic is closed | reopens it (the bot made it) and calls again | the result |
//! | a photo Telegram cannot process, sent as chosen by the relay | sends it again as a document | the result |
//! | the chat's budget is spent, for a background call | nothing | `Paced` |
//! | anything else | nothing | the [`Failure`] that decides it |
//!
//! One choice decides where a call is made ([`Outbox::call`]): here, or,
//! when the relay spans machines and another machine holds the bot-wide
//! lease, by that machine's outbox (`cluster/calls.rs`), whose decision
//! comes back as it was made. Files are the exception: their bytes are on
//! this machine, so downloads and uploads are always made here.
//!
//! Pacing puts what people wait for first ([`Priority`]): answers and
//! questions before edits; a background call (typing, a progress edit a
//! later one supersedes) never waits. Whoever asked hears how long a call
//! waits ([`Pace::waiting`]), so the session can show it.
//!
//! It never touches the store: the leader records what it needs from the
//! results (a stale topic, who posted which message).

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::cluster::{self, ClusterNode};
use super::failure::{Failure, FailureKind, Performed, decide};
use super::inbox::FileInbox;
use crate::backoff::Backoff;
use crate::config::Config;
use crate::files::DOWNLOAD_MAX;
use crate::protocol::bus::{FETCH_DEADLINE, SendAs, TOPIC_DEADLINE, Target, UPLOAD_DEADLINE};
use crate::render;
use crate::telegram::call::{
    AnswerCallbackQuery, ChatAction, CreateForumTopic, InTopic, SendChatAction,
};
use crate::telegram::types::InlineKeyboardMarkup;
use crate::telegram::{
    BotApi, BotCall, BotInfo, BotReply, ChatBudget, DownloadError, Priority, RateLimiter, SendFile,
    SetupError, TelegramError, UploadSource,
};

/// Topic management (create, delete, reopen, probe) gives up sooner: a
/// person waits for it at the terminal.
pub(crate) const MANAGE_DEADLINE: Duration = Duration::from_secs(30);

/// A tap's spinner: Telegram forgets the query soon, so it is answered
/// within seconds or not at all.
const TAP_DEADLINE: Duration = Duration::from_secs(10);

/// Downloads of one file that came back shorter (or longer) than Telegram
/// announced, before the file counts as failed.
const DOWNLOAD_TRIES: u32 = 3;

/// Longest caption Telegram takes, in UTF-16 units.
const MAX_CAPTION: usize = 1024;

/// Shorter waits for the budget are not worth telling anybody.
const TELL_WAIT: Duration = Duration::from_secs(1);

/// One attempt at moving `bytes` to or from Telegram: a minute, plus a
/// second for every 128 KiB (a slow uplink still gets 50 MB through).
fn transfer_timeout(bytes: u64) -> Duration {
    Duration::from_secs(60 + bytes / (128 * 1024))
}

/// A file on its way to a topic, its bytes checked and opened by the
/// leader (`files.rs`).
#[derive(Debug)]
pub(super) struct Upload {
    pub source: UploadSource,
    pub file_name: String,
    pub caption: Option<String>,
    pub send_as: SendAs,
    /// The relay chose `send_as`: a photo Telegram cannot process goes
    /// again as a document.
    pub chosen: bool,
}

/// How a call is paced: its rank, how long it may take, and who hears
/// about a wait for the chat's budget.
#[derive(Clone, Copy)]
pub(super) struct Pace<'a> {
    pub priority: Priority,
    pub deadline: Duration,
    pub waiting: &'a (dyn Fn(Duration) + Sync),
    /// Called just before the request leaves for Telegram (or for the
    /// machine that makes it): from then on, it may have been posted.
    pub departing: &'a (dyn Fn() + Sync),
}

fn nobody(_: Duration) {}

fn unwatched() {}

impl Pace<'static> {
    /// The leader's own messages: first in line, nobody to tell.
    pub fn high() -> Self {
        Self::of(Priority::High)
    }

    /// A call in a session's topic at `priority`.
    pub fn of(priority: Priority) -> Self {
        Pace {
            priority,
            deadline: TOPIC_DEADLINE,
            waiting: &nobody,
            departing: &unwatched,
        }
    }

    /// Topic management: first in line, and given up sooner.
    pub fn manage() -> Self {
        Pace {
            priority: Priority::High,
            deadline: MANAGE_DEADLINE,
            waiting: &nobody,
            departing: &unwatched,
        }
    }
}

/// `getMe`'s answer, kept while it says the bot has topics in private
/// chats (until then it is asked again: the user may switch them on in
/// @BotFather while sessions wait, and nobody should need a restart).
#[derive(Default)]
struct BotCache(Mutex<Option<BotInfo>>);

impl BotCache {
    fn get(&self) -> Option<BotInfo> {
        let cached = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        cached.clone().filter(|b| b.has_topics_enabled)
    }

    fn set(&self, bot: &BotInfo) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(bot.clone());
    }
}

/// What the Bot API server was found to lack, from its own answers: a
/// self-hosted server or a proxy that lags behind Telegram. Each is said
/// once at warn, shown in `/relay status`, and never asked for again by
/// this leader: a call that needs it fails at once ([`FailureKind::Unsupported`])
/// and its caller does without (drafts become an edited message, a settled
/// question loses its buttons instead of keeping a disabled one).
#[derive(Default)]
struct Lacking(Mutex<std::collections::BTreeSet<&'static str>>);

/// What [`Lacking`] calls disabled buttons (Bot API 10.3).
const DISABLED_BUTTONS: &str = "disabled buttons";

impl Lacking {
    fn has(&self, what: &str) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(what)
    }

    fn learn(&self, what: &'static str, api_url: &str) {
        let new = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(what);
        if new {
            tracing::warn!(
                "the Bot API server at {api_url} lacks {what}, which Telegram's has: the relay does without it (see /relay status)"
            );
        }
    }

    fn list(&self) -> Vec<String> {
        let lacking = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        lacking
            .iter()
            .map(|what| match *what {
                "sendMessageDraft" => "sendMessageDraft (drafts show as an edited message)".into(),
                DISABLED_BUTTONS => {
                    "disabled buttons (settled questions lose their buttons)".into()
                }
                other => (*other).to_string(),
            })
            .collect()
    }
}

pub(super) struct Outbox {
    api: BotApi,
    /// Where the server is, for what the relay says about it.
    api_url: String,
    limiter: RateLimiter,
    bot: BotCache,
    lacking: Lacking,
    /// This machine in the cluster, when the relay spans machines.
    cluster: Option<Arc<ClusterNode>>,
}

impl Outbox {
    pub fn new(config: &Config, cluster: Option<Arc<ClusterNode>>) -> Result<Self, SetupError> {
        let token = config.token.as_ref().ok_or(SetupError::Http {
            message: "no bot token".into(),
        })?;
        // Benchmarks measure the relay itself, not Telegram's pacing.
        let limiter = if std::env::var_os("AGENT_RELAY_UNLIMITED").is_some_and(|v| v == "1") {
            RateLimiter::unlimited()
        } else {
            RateLimiter::new()
        };
        Ok(Self {
            api: BotApi::new(&config.api_url, token)?,
            api_url: config.api_url.clone(),
            limiter,
            bot: BotCache::default(),
            lacking: Lacking::default(),
            cluster,
        })
    }

    /// The client, for the poller (which runs only where the lease is).
    pub fn api(&self) -> &BotApi {
        &self.api
    }

    /// What this machine's limiter spent, for the next leader.
    pub fn spent(&self) -> crate::telegram::Spent {
        self.limiter.spent()
    }

    /// Goes on from what the last leader's limiter spent.
    pub fn go_on_from(&self, spent: &crate::telegram::Spent) {
        self.limiter.go_on_from(spent);
    }

    /// What the Bot API server was found to lack, for `/relay status`.
    pub fn lacking(&self) -> Vec<String> {
        self.lacking.list()
    }

    /// The chats' message budgets of this machine's limiter.
    pub fn budgets(&self) -> Vec<ChatBudget> {
        self.limiter.snapshot()
    }

    /// Makes `call`: here, or through the machine that holds the bot-wide
    /// lease when another one does. The one place that chooses.
    pub async fn call(&self, call: BotCall, pace: Pace<'_>) -> Result<Performed, Failure> {
        if let Some(node) = &self.cluster {
            // Whether it goes through another machine is known only once it
            // went: count it as leaving now.
            (pace.departing)();
            match cluster::calls::through(node, &call, pace.priority, pace.deadline).await {
                cluster::calls::Where::Here => {}
                cluster::calls::Where::There(answer) => return answer,
            }
        }
        self.call_here(call, pace).await
    }

    /// Makes a call another machine sent to this one, which holds the
    /// bot-wide lease: paced at the caller's priority, within its deadline.
    /// A wait for the chat's budget is told to nobody: the session that
    /// asked is on the other machine.
    pub async fn call_for_another_machine(
        &self,
        call: BotCall,
        priority: Priority,
        deadline: Duration,
    ) -> Result<Performed, Failure> {
        let pace = Pace {
            deadline,
            ..Pace::of(priority)
        };
        self.call_here(call, pace).await
    }

    /// Makes `call` with this machine's client and limiter, with the
    /// retries and fallbacks of the module's table.
    async fn call_here(&self, mut call: BotCall, pace: Pace<'_>) -> Result<Performed, Failure> {
        let deadline = Instant::now() + pace.deadline;
        let mut plain = false;
        let mut reopened = false;
        if self.lacking.has(call.method()) {
            return Err(Failure::new(
                FailureKind::Unsupported,
                format!("the Bot API server lacks {}", call.method()),
            ));
        }
        if self.lacking.has(DISABLED_BUTTONS) {
            call = without_disabled_buttons(call);
        }
        loop {
            let error = match self
                .paced(call.method(), call.chat(), &pace, deadline, || {
                    self.api.perform(&call)
                })
                .await
            {
                Ok(reply) => return Ok(Performed { reply, plain }),
                Err(e) => e,
            };
            match recover(&call, &error, pace.priority) {
                Recovery::Done => {
                    return Ok(Performed {
                        reply: BotReply::Done,
                        plain,
                    });
                }
                Recovery::Plain if !plain => {
                    tracing::info!("Telegram refused the markup ({error}); sending plain text");
                    call = as_plain(call);
                    plain = true;
                }
                Recovery::Reopen(topic) if !reopened => {
                    reopened = true;
                    tracing::info!(
                        thread = topic.message_thread_id,
                        "the topic is closed; reopening it"
                    );
                    Box::pin(self.call_here(BotCall::ReopenForumTopic(topic), Pace::manage()))
                        .await?;
                }
                Recovery::WithoutDisabled if !self.lacking.has(DISABLED_BUTTONS) => {
                    self.lacking.learn(DISABLED_BUTTONS, &self.api_url);
                    call = without_disabled_buttons(call);
                }
                Recovery::Fail(failure) => {
                    if failure.kind == FailureKind::Unsupported {
                        self.lacking.learn(call.method(), &self.api_url);
                    }
                    return Err(failure);
                }
                Recovery::Plain | Recovery::Reopen(_) | Recovery::WithoutDisabled => {
                    return Err(decide(&error));
                }
            }
        }
    }

    /// Ends a tap's spinner, with `text` as a toast. Not paced per chat: an
    /// answer is no message, and a spinner that waits behind a long answer
    /// helps nobody.
    pub async fn answer_tap(&self, callback_id: &str, text: Option<&str>) -> Result<(), Failure> {
        let call = BotCall::AnswerCallbackQuery(AnswerCallbackQuery {
            callback_query_id: callback_id.to_string(),
            text: text.map(String::from),
            show_alert: false,
        });
        let pace = Pace {
            deadline: TAP_DEADLINE,
            ..Pace::high()
        };
        self.call(call, pace).await.map(drop)
    }

    pub async fn create_topic(&self, chat: i64, name: &str) -> Result<Target, Failure> {
        let call = BotCall::CreateForumTopic(CreateForumTopic {
            chat_id: chat,
            name: name.to_string(),
        });
        match self.call(call, Pace::manage()).await?.reply {
            BotReply::Topic { message_thread_id } => Ok(Target {
                chat_id: chat,
                thread_id: message_thread_id,
            }),
            other => Err(Failure::new(
                FailureKind::CommitUnknown,
                format!("createForumTopic answered {other:?}"),
            )),
        }
    }

    /// Deletes a topic; one that is gone already counts as deleted.
    pub async fn delete_topic(&self, target: Target) -> Result<(), Failure> {
        let call = BotCall::DeleteForumTopic(in_topic(target));
        self.call(call, Pace::manage()).await.map(drop)
    }

    /// Closes a topic; one closed already counts as closed.
    pub async fn close_topic(&self, target: Target) -> Result<(), Failure> {
        let call = BotCall::CloseForumTopic(in_topic(target));
        self.call(call, Pace::manage()).await.map(drop)
    }

    /// Reopens a topic; one open already counts as open.
    pub async fn reopen_topic(&self, target: Target) -> Result<(), Failure> {
        let call = BotCall::ReopenForumTopic(in_topic(target));
        self.call(call, Pace::manage()).await.map(drop)
    }

    /// Probes a stored topic with a chat action: `Ok(true)` it exists,
    /// `Ok(false)` it is gone, `Err` the answer was ambiguous.
    pub async fn probe(&self, target: Target) -> Result<bool, Failure> {
        let call = BotCall::SendChatAction(SendChatAction {
            chat_id: target.chat_id,
            message_thread_id: Some(target.thread_id),
            action: ChatAction::Typing,
        });
        match self.call(call, Pace::manage()).await {
            Ok(_) => Ok(true),
            Err(f) if f.kind == FailureKind::TopicGone => Ok(false),
            Err(f) => Err(f),
        }
    }

    /// `getMe`, asked once per leader — and each time again while the bot
    /// has no topics in private chats (see [`BotCache`]).
    pub async fn bot(&self) -> Result<BotInfo, Failure> {
        if let Some(bot) = self.bot.get() {
            return Ok(bot);
        }
        match self.call(BotCall::GetMe, Pace::manage()).await?.reply {
            BotReply::Bot(bot) => {
                self.bot.set(&bot);
                Ok(bot)
            }
            other => Err(Failure::new(
                FailureKind::Unavailable,
                format!("getMe answered {other:?}"),
            )),
        }
    }

    /// Sends a file into `target` from this machine: a multipart upload,
    /// paced like any message, with the fallbacks of the module's table
    /// (a photo Telegram refuses goes as a document; a closed topic is
    /// reopened), which is what makes it long.
    /// Answers how it went: as a photo, or as a document.
    pub async fn send_file(
        &self,
        target: Target,
        upload: &Upload,
    ) -> Result<(Performed, SendAs), Failure> {
        let deadline = Instant::now() + UPLOAD_DEADLINE;
        // A file is something somebody waits for, like an answer.
        let pace = &Pace::high();
        let timeout = transfer_timeout(upload.source.size());
        let send = |send_as: SendAs| {
            let params = SendFile {
                chat_id: target.chat_id,
                message_thread_id: Some(target.thread_id),
                caption: upload.caption.as_deref().map(clip_caption),
                parse_mode: None,
                as_photo: send_as == SendAs::Photo,
                file_name: upload.file_name.clone(),
            };
            let method = if params.as_photo {
                "sendPhoto"
            } else {
                "sendDocument"
            };
            async move {
                self.paced(method, Some(target.chat_id), pace, deadline, || {
                    self.api.send_file(&params, &upload.source, timeout)
                })
                .await
            }
        };
        let mut reopened = false;
        loop {
            let sent = match send(upload.send_as).await {
                Err(TelegramError::BadRequest { description })
                    if upload.chosen
                        && upload.send_as == SendAs::Photo
                        && photo_refused(&description) =>
                {
                    tracing::info!(
                        "Telegram cannot show the picture ({description}); sending it as a document"
                    );
                    send(SendAs::Document).await.map(|m| (m, SendAs::Document))
                }
                other => other.map(|m| (m, upload.send_as)),
            };
            match sent {
                Ok((message, sent_as)) => {
                    let performed = Performed {
                        reply: BotReply::Posted {
                            message_id: message.message_id,
                        },
                        plain: false,
                    };
                    return Ok((performed, sent_as));
                }
                Err(TelegramError::TopicClosed { .. }) if !reopened => {
                    reopened = true;
                    self.reopen_topic(target).await?;
                }
                Err(e) => return Err(decide(&e)),
            }
        }
    }

    /// Downloads a file users sent into `dir` as `name`: `getFile`, then the
    /// file streamed into a part file that is synced and renamed once
    /// complete. Returns its size.
    pub async fn download(&self, file_id: &str, dir: &Path, name: &str) -> Result<u64, Failure> {
        let deadline = Instant::now() + FETCH_DEADLINE;
        let pace = &Pace::high();
        let file = self
            .paced("getFile", None, pace, deadline, || {
                self.api.get_file(file_id)
            })
            .await
            .map_err(|e| decide(&e))?;
        // `None`: the download passed the limit, its size untold.
        let too_big = |size: Option<u64>| {
            let (size, limit) = match size {
                Some(size) => crate::files::describe_against(size, DOWNLOAD_MAX),
                None => {
                    let limit = crate::files::describe_size(DOWNLOAD_MAX);
                    (format!("more than {limit}"), limit)
                }
            };
            Failure::new(
                FailureKind::FileTooBig,
                format!("the file is {size}; bots can download at most {limit} from Telegram"),
            )
        };
        if let Some(size) = file.file_size.filter(|size| *size > DOWNLOAD_MAX) {
            return Err(too_big(Some(size)));
        }
        let Some(file_path) = file.file_path else {
            return Err(Failure::new(
                FailureKind::Refused,
                "Telegram gave no path to download the file from",
            ));
        };
        let timeout = transfer_timeout(file.file_size.unwrap_or(DOWNLOAD_MAX));
        let mut tries = 0;
        let downloaded = loop {
            tries += 1;
            let attempt = self
                .paced("getFile", None, pace, deadline, || {
                    self.save(&file_path, file.file_size, dir, name, timeout)
                })
                .await;
            // A file shorter than announced is tried again a few times,
            // then reported: never saved as if it were whole.
            match attempt {
                Err(TelegramError::Incomplete { .. }) if tries < DOWNLOAD_TRIES => {}
                attempt => break attempt,
            }
        };
        match downloaded {
            Ok(Ok(written)) => Ok(written),
            Ok(Err(e)) => Err(Failure::new(
                FailureKind::Refused,
                format!("cannot save the file in the inbox: {e}"),
            )),
            Err(TelegramError::FileTooBig { .. }) => Err(too_big(None)),
            Err(e) => Err(decide(&e)),
        }
    }

    /// One attempt at streaming Telegram's `file_path` into `dir` as `name`:
    /// into a part file, synced before it gets its name (a name is a whole
    /// file); one of another length than `announced` is `Incomplete`. `Ok(Err)`: the inbox could not take it, which no retry mends.
    async fn save(
        &self,
        file_path: &str,
        announced: Option<u64>,
        dir: &Path,
        name: &str,
        timeout: Duration,
    ) -> Result<std::io::Result<u64>, TelegramError> {
        let (part, opened) = match FileInbox::part_file(dir, name) {
            Ok(opened) => opened,
            Err(e) => return Ok(Err(e)),
        };
        let mut out = tokio::fs::File::from_std(opened);
        let written = match self
            .api
            .download(file_path, DOWNLOAD_MAX, announced, timeout, &mut out)
            .await
        {
            Ok(written) => written,
            Err(DownloadError::Telegram(e)) => {
                let _ = tokio::fs::remove_file(&part).await;
                return Err(e);
            }
            Err(DownloadError::Write(e)) => return Ok(Err(e)),
        };
        let done = match out.sync_all().await {
            Ok(()) => tokio::fs::rename(&part, dir.join(name)).await,
            Err(e) => Err(e),
        };
        if done.is_err() {
            let _ = tokio::fs::remove_file(&part).await;
        }
        Ok(done.map(|()| written))
    }

    /// One call, paced; a 429 holds back the chat (or every call) and the
    /// call goes again, as does a transient failure that cannot have taken
    /// effect, until `deadline`.
    async fn paced<T, F, Fut>(
        &self,
        method: &'static str,
        chat: Option<i64>,
        pace: &Pace<'_>,
        deadline: Instant,
        call: F,
    ) -> Result<T, TelegramError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, TelegramError>>,
    {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
        loop {
            let booked = match self
                .limiter
                .book_until(chat, method, deadline, pace.priority, |wait| {
                    if wait >= TELL_WAIT {
                        (pace.waiting)(wait);
                    }
                })
                .await
            {
                Ok(booked) => booked,
                Err(wait) => return Err(TelegramError::RateLimited { retry_after: wait }),
            };
            (pace.departing)();
            let answered = call().await;
            self.limiter.answered(chat, method, booked);
            let error = match answered {
                Ok(value) => return Ok(value),
                Err(e) => e,
            };
            let wait = match error.retry_after() {
                Some(wait) => {
                    self.limiter.penalize(chat, wait);
                    if pace.priority == Priority::Background {
                        return Err(error);
                    }
                    wait
                }
                None if error.is_retryable() => backoff.step(),
                None => return Err(error),
            };
            if Instant::now() + wait > deadline {
                return Err(error);
            }
            if error.retry_after().is_none() {
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// What is left to do after `call` failed with `error`: the fallbacks of
/// the module's table. The one place a Bot API method's own rules live.
enum Recovery {
    /// It counts as done.
    Done,
    /// Send it again as plain text.
    Plain,
    /// Reopen the topic and make it again.
    Reopen(InTopic),
    /// The server knows no disabled button: make it again without.
    WithoutDisabled,
    Fail(Failure),
}

fn recover(call: &BotCall, error: &TelegramError, priority: Priority) -> Recovery {
    use BotCall as C;
    use TelegramError as E;
    match (call, error) {
        (_, E::RateLimited { retry_after }) if priority == Priority::Background => {
            Recovery::Fail(Failure::new(
                FailureKind::Paced,
                format!(
                    "not sent: the chat's message budget is spent for {} s",
                    retry_after.as_secs_f64().ceil()
                ),
            ))
        }
        (
            C::EditMessageText(_)
            | C::EditMessageReplyMarkup(_)
            | C::CloseForumTopic(_)
            | C::ReopenForumTopic(_),
            E::NotModified { .. },
        )
        | (C::DeleteForumTopic(_), E::ThreadGone { .. }) => Recovery::Done,
        (C::EditMessageText(p), E::BadRequest { description })
            if has_disabled_buttons(p.reply_markup.as_ref())
                && description.contains("inline keyboard button") =>
        {
            Recovery::WithoutDisabled
        }
        (C::SendMessage(p), E::ParseEntities { .. }) if p.parse_mode.is_some() => Recovery::Plain,
        (C::EditMessageText(p), E::ParseEntities { .. }) if p.parse_mode.is_some() => {
            Recovery::Plain
        }
        (C::SendMessage(p), E::TopicClosed { .. }) => match p.message_thread_id {
            Some(thread) => Recovery::Reopen(InTopic {
                chat_id: p.chat_id,
                message_thread_id: thread,
            }),
            None => Recovery::Fail(decide(error)),
        },
        (C::SendChatAction(p), E::TopicClosed { .. }) => match p.message_thread_id {
            Some(thread) => Recovery::Reopen(InTopic {
                chat_id: p.chat_id,
                message_thread_id: thread,
            }),
            None => Recovery::Fail(decide(error)),
        },
        _ => Recovery::Fail(decide(error)),
    }
}

/// Whether a keyboard has a button that cannot be pressed (Bot API 10.3).
fn has_disabled_buttons(markup: Option<&InlineKeyboardMarkup>) -> bool {
    markup.is_some_and(|m| {
        m.inline_keyboard
            .iter()
            .flatten()
            .any(|b| b.disabled.is_some())
    })
}

/// The call without its disabled buttons, for a server that knows none: a
/// keyboard of nothing else is no keyboard (Telegram then removes the
/// buttons a message had).
fn without_disabled_buttons(call: BotCall) -> BotCall {
    match call {
        BotCall::EditMessageText(mut p) if has_disabled_buttons(p.reply_markup.as_ref()) => {
            if let Some(markup) = &mut p.reply_markup {
                for row in &mut markup.inline_keyboard {
                    row.retain(|b| b.disabled.is_none());
                }
                markup.inline_keyboard.retain(|row| !row.is_empty());
            }
            if p.reply_markup
                .as_ref()
                .is_some_and(|m| m.inline_keyboard.is_empty())
            {
                p.reply_markup = None;
            }
            BotCall::EditMessageText(p)
        }
        other => other,
    }
}

/// The call again, its HTML turned into the text a person would read.
fn as_plain(call: BotCall) -> BotCall {
    match call {
        BotCall::SendMessage(mut p) => {
            p.text = render::to_plain(&p.text);
            p.parse_mode = None;
            BotCall::SendMessage(p)
        }
        BotCall::EditMessageText(mut p) => {
            p.text = render::to_plain(&p.text);
            p.parse_mode = None;
            BotCall::EditMessageText(p)
        }
        other => other,
    }
}

fn in_topic(target: Target) -> InTopic {
    InTopic {
        chat_id: target.chat_id,
        message_thread_id: target.thread_id,
    }
}

/// Telegram's refusals of a picture it cannot show as a photo (too large a
/// side, an odd ratio, a format it cannot read).
fn photo_refused(description: &str) -> bool {
    let upper = description.to_ascii_uppercase();
    upper.contains("IMAGE_PROCESS_FAILED")
        || upper.contains("PHOTO_INVALID_DIMENSIONS")
        || upper.contains("PHOTO_SAVE_FILE_INVALID")
        || upper.contains("PHOTO_EXT_INVALID")
}

/// A caption cut to what Telegram takes, marked when cut.
fn clip_caption(caption: &str) -> String {
    if caption.encode_utf16().count() <= MAX_CAPTION {
        return caption.to_string();
    }
    let mut out = String::new();
    let mut units = 0;
    for c in caption.chars() {
        if units + c.len_utf16() > MAX_CAPTION - 1 {
            break;
        }
        units += c.len_utf16();
        out.push(c);
    }
    out.push('…');
    out
}

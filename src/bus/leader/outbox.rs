//! The leader's Telegram side: every Bot API call it makes goes through
//! here, typed, paced by one [`RateLimiter`], and every failure is decided
//! here, once.
//!
//! [`Outbox::perform`] runs a session's [`TopicOp`] in its topic and turns
//! what Telegram answered into what the session should do:
//!
//! | Telegram said | the outbox does | the session gets |
//! |---|---|---|
//! | 429 `retry_after` | waits (for that chat, or all) and sends again | the result, later |
//! | a transient failure that cannot have posted anything | backs off and sends again | the result, later |
//! | can't parse entities (HTML) | sends the text again as plain text | `TopicDone { plain: true }` |
//! | message is not modified (an edit) | nothing | success |
//! | the topic is closed | reopens it (the bot made it) and sends again | the result |
//! | the topic is gone | nothing | `TopicGone`: register again for a new topic |
//! | a send that may or may not have happened | never replays it | `CommitUnknown` |
//! | a photo Telegram cannot process, sent as chosen by the relay | sends it again as a document | the result |
//! | a file over Telegram's limits | nothing | `FileTooBig` |
//! | the chat's budget is spent, for a background request | nothing | `Paced` |
//! | anything else | nothing | `Telegram` with the reason |
//!
//! Files go through here too: downloads (`getFile`, then the file streamed
//! to disk) and uploads (a multipart `sendPhoto`/`sendDocument` streamed
//! from disk), paced and retried like every other call, as tasks of their
//! own so no other session waits for them.
//!
//! Pacing puts what people wait for first ([`Priority`]): answers and
//! questions before edits; a background request (typing, a progress edit a
//! later one supersedes) never waits. Whoever asked hears how long a request
//! waits (`waiting`), so the session can show it.
//!
//! It never touches the store: the leader records what it needs from the
//! results (a stale topic, who posted which message).

use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::inbox::Inbox;
use crate::backoff::Backoff;
use crate::config::Config;
use crate::files::DOWNLOAD_MAX;
use crate::protocol::bus::*;
use crate::render;
use crate::telegram::types::{
    EditMessageReplyMarkup, EditMessageText, InlineKeyboardButton, InlineKeyboardMarkup, ParseMode,
    ReplyParameters, SendMessage,
};
use crate::telegram::{
    BotApi, BotInfo, ChatBudget, DownloadError, Priority, RateLimiter, SendFile, SetupError,
    TelegramError, UploadSource,
};

/// How long a session's request may wait for pacing and retries before
/// the outbox gives up on it (the member waits a little longer).
pub(crate) const TOPIC_DEADLINE: Duration = Duration::from_secs(240);

/// Topic management (create, delete, reopen, probe) gives up sooner: a
/// person waits for it at the terminal.
pub(super) const MANAGE_DEADLINE: Duration = Duration::from_secs(30);

/// Longest `callback_data` Telegram accepts, in bytes.
const MAX_BUTTON_DATA: usize = 64;

/// How long fetching one file may take, retries included.
pub(crate) const FETCH_DEADLINE: Duration = Duration::from_secs(240);

/// Downloads of one file that came back shorter (or longer) than Telegram
/// announced, before the file counts as failed.
const DOWNLOAD_TRIES: u32 = 3;

/// How long sending a file may take, pacing and retries included (the
/// member waits a little longer).
pub(crate) const UPLOAD_DEADLINE: Duration = Duration::from_secs(600);

/// Longest caption Telegram takes, in UTF-16 units.
const MAX_CAPTION: usize = 1024;

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

/// Shorter waits for the budget are not worth telling anybody.
const TELL_WAIT: Duration = Duration::from_secs(1);

/// How a call is paced: its chat, its rank, and who hears about a wait.
struct Pace<'a> {
    chat: Option<i64>,
    priority: Priority,
    waiting: &'a (dyn Fn(Duration) + Sync),
}

impl Pace<'static> {
    /// The leader's own calls: nobody to tell, and first in line.
    fn high(chat: Option<i64>) -> Self {
        Pace {
            chat,
            priority: Priority::High,
            waiting: &nobody,
        }
    }
}

fn nobody(_: Duration) {}

/// `getMe`'s answer, kept while it says the bot has topics in private
/// chats (until then it is asked again: the user may switch them on in
/// @BotFather while sessions wait, and nobody should need a restart).
#[derive(Default)]
pub(super) struct BotCache(Mutex<Option<BotInfo>>);

impl BotCache {
    pub async fn get<F, Fut>(&self, ask: F) -> Result<BotInfo, TelegramError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<BotInfo, TelegramError>>,
    {
        let cached = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(bot) = cached.filter(|b| b.has_topics_enabled) {
            return Ok(bot);
        }
        let bot = ask().await?;
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(bot.clone());
        Ok(bot)
    }
}

pub(super) struct Outbox {
    api: BotApi,
    limiter: RateLimiter,
    /// `getMe`'s answer.
    bot: BotCache,
}

impl Outbox {
    pub fn new(config: &Config) -> Result<Self, SetupError> {
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
            limiter,
            bot: BotCache::default(),
        })
    }

    pub fn api(&self) -> &BotApi {
        &self.api
    }

    /// The chats' message budgets, for `/relay status`.
    pub fn budgets(&self) -> Vec<ChatBudget> {
        self.limiter.snapshot()
    }

    /// `getMe`, asked once per leader — and each time again while the bot
    /// has no topics in private chats: the user may switch them on in
    /// @BotFather while sessions wait, and nobody should need a restart.
    pub async fn bot(&self) -> Result<BotInfo, TelegramError> {
        self.bot.get(|| self.api.get_me()).await
    }

    /// Runs a session's request in `target`, with pacing, retries and the
    /// fallbacks of the table above. `waiting` hears how long it waits for
    /// the chat's budget, when it has to.
    pub async fn perform(
        &self,
        target: Target,
        op: &TopicOp,
        priority: Priority,
        waiting: impl Fn(Duration) + Sync,
    ) -> Result<TopicDone, BusError> {
        check_buttons(op)?;
        let pace = Pace {
            chat: Some(target.chat_id),
            priority,
            waiting: &waiting,
        };
        let deadline = Instant::now() + TOPIC_DEADLINE;
        self.with_fallbacks(target, is_html(op), priority, |plain| {
            self.attempt(target, op, plain, &pace, deadline)
        })
        .await
    }

    async fn attempt(
        &self,
        target: Target,
        op: &TopicOp,
        plain: bool,
        pace: &Pace<'_>,
        deadline: Instant,
    ) -> Result<TopicDone, TelegramError> {
        match op {
            TopicOp::SendText(send) => {
                let params = send_message(target, send, plain);
                self.paced("sendMessage", pace, deadline, || {
                    self.api.send_message(&params)
                })
                .await
                .map(|m| TopicDone {
                    message_id: Some(m.message_id),
                    plain,
                    ..TopicDone::default()
                })
            }
            TopicOp::EditText(edit) => {
                let params = EditMessageText {
                    chat_id: target.chat_id,
                    message_id: edit.message_id,
                    text: text_for(&edit.text, edit.format, plain),
                    parse_mode: parse_mode(edit.format, plain),
                    reply_markup: edit.buttons.as_ref().map(markup),
                    link_preview_options: Some(Default::default()),
                };
                self.paced("editMessageText", pace, deadline, || {
                    self.api.edit_message_text(&params)
                })
                .await
                .map(|()| TopicDone::default())
            }
            TopicOp::EditButtons(edit) => {
                let params = EditMessageReplyMarkup {
                    chat_id: target.chat_id,
                    message_id: edit.message_id,
                    reply_markup: edit.buttons.as_ref().map(markup),
                };
                self.paced("editMessageReplyMarkup", pace, deadline, || {
                    self.api.edit_message_reply_markup(&params)
                })
                .await
                .map(|()| TopicDone::default())
            }
            TopicOp::Typing => self
                .paced("sendChatAction", pace, deadline, || {
                    self.api
                        .send_chat_action(target.chat_id, Some(target.thread_id), "typing")
                })
                .await
                .map(|()| TopicDone::default()),
            // The leader keeps asks itself (`asks.rs`) and opens files before
            // it sends them (`files.rs`); neither gets here.
            TopicOp::Ask(_)
            | TopicOp::AwaitAnswer(_)
            | TopicOp::CloseAsk(_)
            | TopicOp::SendFile(_) => Err(TelegramError::Refused {
                reason: "asks and files are the leader's, not one Bot API call",
            }),
        }
    }

    /// Sends a file into `target`: a multipart upload, paced like any
    /// message, with the fallbacks of the table above.
    pub async fn send_file(&self, target: Target, upload: &Upload) -> Result<TopicDone, BusError> {
        let deadline = Instant::now() + UPLOAD_DEADLINE;
        // A file is something somebody waits for, like an answer.
        let pace = &Pace::high(Some(target.chat_id));
        let timeout = transfer_timeout(upload.source.size());
        let params = |send_as: SendAs| SendFile {
            chat_id: target.chat_id,
            message_thread_id: Some(target.thread_id),
            caption: upload.caption.as_deref().map(clip_caption),
            parse_mode: None,
            as_photo: send_as == SendAs::Photo,
            file_name: upload.file_name.clone(),
        };
        let send = |send_as: SendAs| {
            let params = params(send_as);
            let method = if params.as_photo {
                "sendPhoto"
            } else {
                "sendDocument"
            };
            async move {
                self.paced(method, pace, deadline, || {
                    self.api.send_file(&params, &upload.source, timeout)
                })
                .await
                .map(|m| TopicDone {
                    message_id: Some(m.message_id),
                    sent_as: Some(send_as),
                    size: Some(upload.source.size()),
                    ..TopicDone::default()
                })
            }
        };
        self.with_fallbacks(target, false, Priority::High, |_| async {
            match send(upload.send_as).await {
                Err(TelegramError::BadRequest { description })
                    if upload.chosen
                        && upload.send_as == SendAs::Photo
                        && photo_refused(&description) =>
                {
                    tracing::info!(
                        "Telegram cannot show the picture ({description}); sending it as a document"
                    );
                    send(SendAs::Document).await
                }
                other => other,
            }
        })
        .await
    }

    /// Downloads a file users sent into `dir` as `name`: `getFile`, then the
    /// file streamed into a part file that is synced and renamed once
    /// complete. Returns its size.
    pub async fn download(&self, file_id: &str, dir: &Path, name: &str) -> Result<u64, BusError> {
        let deadline = Instant::now() + FETCH_DEADLINE;
        let file = self
            .paced("getFile", &Pace::high(None), deadline, || {
                self.api.get_file(file_id)
            })
            .await
            .map_err(decide)?;
        // `None`: the download passed the limit, its size untold.
        let too_big = |size: Option<u64>| {
            let (size, limit) = match size {
                Some(size) => crate::files::describe_against(size, DOWNLOAD_MAX),
                None => {
                    let limit = crate::files::describe_size(DOWNLOAD_MAX);
                    (format!("more than {limit}"), limit)
                }
            };
            BusError::new(
                BusErrorCode::FileTooBig,
                format!("the file is {size}; bots can download at most {limit} from Telegram"),
            )
        };
        if let Some(size) = file.file_size.filter(|size| *size > DOWNLOAD_MAX) {
            return Err(too_big(Some(size)));
        }
        let Some(file_path) = file.file_path else {
            return Err(BusError::new(
                BusErrorCode::Telegram,
                "Telegram gave no path to download the file from",
            ));
        };
        let timeout = transfer_timeout(file.file_size.unwrap_or(DOWNLOAD_MAX));
        let mut tries = 0;
        let downloaded = loop {
            tries += 1;
            let attempt = self
                .paced("getFile", &Pace::high(None), deadline, || async {
                    let (part, opened) = match Inbox::part_file(dir, name) {
                        Ok(opened) => opened,
                        Err(e) => return Ok(Err(e)),
                    };
                    let mut out = tokio::fs::File::from_std(opened);
                    let written = match self
                        .api
                        .download(&file_path, DOWNLOAD_MAX, file.file_size, timeout, &mut out)
                        .await
                    {
                        Ok(written) => written,
                        Err(DownloadError::Telegram(e)) => {
                            let _ = tokio::fs::remove_file(&part).await;
                            return Err(e);
                        }
                        Err(DownloadError::Write(e)) => return Ok(Err(e)),
                    };
                    // Synced before it gets its name: a name is a whole file.
                    let done = match out.sync_all().await {
                        Ok(()) => tokio::fs::rename(&part, dir.join(name)).await,
                        Err(e) => Err(e),
                    };
                    if done.is_err() {
                        let _ = tokio::fs::remove_file(&part).await;
                    }
                    Ok(done.map(|()| written))
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
            Ok(Err(e)) => Err(BusError::new(
                BusErrorCode::Internal,
                format!("cannot save the file in the inbox: {e}"),
            )),
            Err(TelegramError::FileTooBig { .. }) => Err(too_big(None)),
            Err(e) => Err(decide(e)),
        }
    }

    /// Runs `attempt` until it succeeds or fails for good, applying the
    /// fallbacks of the module's table: plain text after refused HTML (for
    /// `html` requests), a reopened topic after a closed one.
    async fn with_fallbacks<F, Fut>(
        &self,
        target: Target,
        html: bool,
        priority: Priority,
        attempt: F,
    ) -> Result<TopicDone, BusError>
    where
        F: Fn(bool) -> Fut,
        Fut: std::future::Future<Output = Result<TopicDone, TelegramError>>,
    {
        let mut reopened = false;
        let mut plain = false;
        loop {
            match attempt(plain).await {
                Ok(done) => return Ok(done),
                Err(TelegramError::NotModified { .. }) => return Ok(TopicDone::default()),
                Err(TelegramError::RateLimited { retry_after })
                    if priority == Priority::Background =>
                {
                    return Err(BusError::new(
                        BusErrorCode::Paced,
                        format!(
                            "not sent: the chat's message budget is spent for {} s",
                            retry_after.as_secs_f64().ceil()
                        ),
                    ));
                }
                Err(TelegramError::ParseEntities { description }) if !plain && html => {
                    tracing::info!(
                        "Telegram refused the markup ({description}); sending plain text"
                    );
                    plain = true;
                }
                Err(TelegramError::TopicClosed { .. }) if !reopened => {
                    reopened = true;
                    tracing::info!(
                        thread = target.thread_id,
                        "the topic is closed; reopening it"
                    );
                    if let Err(e) = self.reopen_topic(target).await {
                        return Err(decide(e));
                    }
                }
                Err(e) => return Err(decide(e)),
            }
        }
    }

    /// Sends plain text into a topic, or outside topics when `thread` is None:
    /// the leader's own notices.
    pub async fn say(
        &self,
        chat: i64,
        thread: Option<i64>,
        text: &str,
    ) -> Result<(), TelegramError> {
        let params = SendMessage {
            chat_id: chat,
            message_thread_id: thread,
            text: text.to_string(),
            parse_mode: None,
            reply_markup: None,
            reply_parameters: None,
            link_preview_options: Some(Default::default()),
        };
        let deadline = Instant::now() + TOPIC_DEADLINE;
        self.paced("sendMessage", &Pace::high(Some(chat)), deadline, || {
            self.api.send_message(&params)
        })
        .await
        .map(drop)
    }

    pub async fn answer_callback(
        &self,
        callback_id: &str,
        text: Option<&str>,
        alert: bool,
    ) -> Result<(), TelegramError> {
        // Not paced per chat: an answer is no message, and a spinner that
        // waits behind a long answer helps nobody.
        let deadline = Instant::now() + Duration::from_secs(10);
        self.paced("answerCallbackQuery", &Pace::high(None), deadline, || {
            self.api.answer_callback_query(callback_id, text, alert)
        })
        .await
    }

    pub async fn create_topic(&self, chat: i64, name: &str) -> Result<Target, TelegramError> {
        let deadline = Instant::now() + MANAGE_DEADLINE;
        let topic = self
            .paced(
                "createForumTopic",
                &Pace::high(Some(chat)),
                deadline,
                || self.api.create_forum_topic(chat, name, None),
            )
            .await?;
        Ok(Target {
            chat_id: chat,
            thread_id: topic.message_thread_id,
        })
    }

    /// Deletes a topic; one that is gone already counts as deleted.
    pub async fn delete_topic(&self, target: Target) -> Result<(), TelegramError> {
        let deadline = Instant::now() + MANAGE_DEADLINE;
        match self
            .paced(
                "deleteForumTopic",
                &Pace::high(Some(target.chat_id)),
                deadline,
                || {
                    self.api
                        .delete_forum_topic(target.chat_id, target.thread_id)
                },
            )
            .await
        {
            Ok(()) | Err(TelegramError::ThreadGone { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Closes a topic; one closed already counts as closed.
    pub async fn close_topic(&self, target: Target) -> Result<(), TelegramError> {
        let deadline = Instant::now() + MANAGE_DEADLINE;
        match self
            .paced(
                "closeForumTopic",
                &Pace::high(Some(target.chat_id)),
                deadline,
                || self.api.close_forum_topic(target.chat_id, target.thread_id),
            )
            .await
        {
            Ok(()) | Err(TelegramError::NotModified { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Reopens a topic; one open already counts as open.
    pub async fn reopen_topic(&self, target: Target) -> Result<(), TelegramError> {
        let deadline = Instant::now() + MANAGE_DEADLINE;
        match self
            .paced(
                "reopenForumTopic",
                &Pace::high(Some(target.chat_id)),
                deadline,
                || {
                    self.api
                        .reopen_forum_topic(target.chat_id, target.thread_id)
                },
            )
            .await
        {
            Ok(()) | Err(TelegramError::NotModified { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Probes a stored topic with a chat action: `Ok(true)` it exists,
    /// `Ok(false)` it is gone, `Err` the answer was ambiguous.
    pub async fn probe(&self, target: Target) -> Result<bool, TelegramError> {
        let deadline = Instant::now() + MANAGE_DEADLINE;
        match self
            .paced(
                "sendChatAction",
                &Pace::high(Some(target.chat_id)),
                deadline,
                || {
                    self.api
                        .send_chat_action(target.chat_id, Some(target.thread_id), "typing")
                },
            )
            .await
        {
            Ok(()) => Ok(true),
            Err(TelegramError::ThreadGone { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// One call, paced; a 429 holds back the chat (or every call) and the
    /// call goes again, as does a transient failure that cannot have taken
    /// effect, until `deadline`.
    async fn paced<T, F, Fut>(
        &self,
        method: &'static str,
        pace: &Pace<'_>,
        deadline: Instant,
        call: F,
    ) -> Result<T, TelegramError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, TelegramError>>,
    {
        let chat = pace.chat;
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

/// The one place that decides what a failed Telegram call means for the
/// session that asked (see the module docs).
pub(super) fn decide(e: TelegramError) -> BusError {
    let code = match &e {
        TelegramError::ThreadGone { .. } => BusErrorCode::TopicGone,
        TelegramError::FileTooBig { .. } => BusErrorCode::FileTooBig,
        _ if e.commit_unknown() => BusErrorCode::CommitUnknown,
        _ if e.is_transient() => BusErrorCode::Unavailable,
        _ => BusErrorCode::Telegram,
    };
    BusError::new(code, e.to_string())
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

fn is_html(op: &TopicOp) -> bool {
    match op {
        TopicOp::SendText(s) => s.format == TextFormat::Html,
        TopicOp::EditText(e) => e.format == TextFormat::Html,
        _ => false,
    }
}

fn parse_mode(format: TextFormat, plain: bool) -> Option<ParseMode> {
    (format == TextFormat::Html && !plain).then_some(ParseMode::Html)
}

fn text_for(text: &str, format: TextFormat, plain: bool) -> String {
    if format == TextFormat::Html && plain {
        render::to_plain(text)
    } else {
        text.to_string()
    }
}

fn send_message(target: Target, send: &SendText, plain: bool) -> SendMessage {
    SendMessage {
        chat_id: target.chat_id,
        message_thread_id: Some(target.thread_id),
        text: text_for(&send.text, send.format, plain),
        parse_mode: parse_mode(send.format, plain),
        reply_markup: send.buttons.as_ref().map(markup),
        reply_parameters: send.reply_to.map(|message_id| ReplyParameters {
            message_id,
            allow_sending_without_reply: true,
        }),
        // An agent's answer quoting a URL should not grow a card.
        link_preview_options: Some(Default::default()),
    }
}

fn markup(keyboard: &Keyboard) -> InlineKeyboardMarkup {
    InlineKeyboardMarkup {
        inline_keyboard: keyboard
            .rows
            .iter()
            .map(|row| {
                row.iter()
                    .map(|b| InlineKeyboardButton {
                        text: b.text.clone(),
                        callback_data: b.data.clone(),
                    })
                    .collect()
            })
            .collect(),
    }
}

/// Refuses buttons Telegram would refuse, before anything is sent.
fn check_buttons(op: &TopicOp) -> Result<(), BusError> {
    let keyboard = match op {
        TopicOp::SendText(s) => s.buttons.as_ref(),
        TopicOp::EditText(e) => e.buttons.as_ref(),
        TopicOp::EditButtons(e) => e.buttons.as_ref(),
        _ => None,
    };
    let bad = keyboard
        .into_iter()
        .flat_map(|k| k.rows.iter().flatten())
        .find(|b| b.data.is_empty() || b.data.len() > MAX_BUTTON_DATA || b.text.trim().is_empty());
    match bad {
        Some(b) => Err(BusError::new(
            BusErrorCode::BadFrame,
            format!(
                "button {:?}: a button needs text and 1-{MAX_BUTTON_DATA} bytes of data",
                b.text
            ),
        )),
        None => Ok(()),
    }
}

//! What the agent sends with a tool of its own — a file (`file/send`: pi's
//! `telegram_send_file`, the MCP servers' `send_file`) or a message
//! (`topic/send`: Claude Code's `reply`) — answered within
//! [`ANSWER_WITHIN`] whatever Telegram does, with what is true: it is in
//! the topic; or it is kept, and goes when Telegram answers; or why it will
//! not go. An agent's turn never waits on Telegram.
//!
//! A message is the leader's once it is handed over (the outbox of record,
//! on disk): it goes when Telegram answers, whichever process leads then.
//! It counts as sent when Telegram answers the leader right after the
//! hand-over (the courier, woken by it, sends it within moments); else it
//! is kept, and the answer says why it waits.
//!
//! A file's bytes never cross the bus: the leader uploads it from its path
//! while the session's request waits (docs/DESIGN.md, *Files*). So an
//! upload Telegram has not answered in time goes on as a task of the
//! session's, up to the leader's upload deadline; one that then fails, or
//! is still under way when the session ends, is said in the topic (handed
//! over, so it reaches the topic when Telegram is back) and to the host.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::Session;
use super::outbound::ToTopic;
use crate::host::RpcError;
use crate::member::{Member, MemberError, MemberState};
use crate::protocol::bus::{BusErrorCode, FileSource, Health, SendFile, TopicDone, TopicOp};
use crate::protocol::host::{
    ANSWER_WITHIN, FILE_NOT_SENT, NotifyLevel, NotifyParams, SendAs, SendFileParams,
    SendFileResult, TopicSendParams, TopicSendResult, method,
};

type Outcome = Result<TopicDone, MemberError>;

/// Uploads under way, by number: one still waited for by its `file/send`
/// gets its outcome there; one the agent was told is kept settles on its
/// own ([`Session::kept_upload_settled`]).
#[derive(Default)]
pub(super) struct Uploads {
    next: u64,
    under_way: HashMap<u64, Upload>,
}

struct Upload {
    /// The file as the agent named it.
    path: String,
    /// Its `file/send` waits for the outcome; `None` once it answered.
    waiter: Option<oneshot::Sender<Outcome>>,
}

impl Uploads {
    fn begin(&mut self, path: String, waiter: oneshot::Sender<Outcome>) -> u64 {
        self.next += 1;
        let upload = Upload {
            path,
            waiter: Some(waiter),
        };
        self.under_way.insert(self.next, upload);
        self.next
    }
}

impl Session {
    fn uploads(&self) -> std::sync::MutexGuard<'_, Uploads> {
        self.uploads.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many files the agent was told are kept, still on their way.
    pub(super) fn uploads_kept(&self) -> usize {
        self.uploads()
            .under_way
            .values()
            .filter(|u| u.waiter.is_none())
            .count()
    }

    /// `file/send`: the agent posts a file into its topic. The path is
    /// resolved against the session's working directory; the leader checks
    /// where it lies and opens it (docs/DESIGN.md, *Files*). Answered
    /// within [`ANSWER_WITHIN`]: sent, refused, or kept (the upload goes on).
    pub(super) async fn send_file(
        &self,
        params: SendFileParams,
    ) -> Result<SendFileResult, RpcError> {
        crate::logging::milestone("file-asked", 0);
        let answer_by = Instant::now() + ANSWER_WITHIN;
        let refused = |message: String| RpcError {
            code: FILE_NOT_SENT,
            message,
        };
        let Some(member) = self.member() else {
            return Err(refused(
                "this session is not connected to Telegram; run /telegram-connect first".into(),
            ));
        };
        if !registered(&member, answer_by).await {
            return Err(refused(format!(
                "the file was not sent: {}",
                not_on_relay(&member)
            )));
        }
        let path = std::path::Path::new(&params.path);
        let path = if path.is_absolute() {
            path.to_path_buf()
        } else {
            std::path::Path::new(&self.cwd()).join(path)
        };
        let op = TopicOp::SendFile(SendFile {
            source: FileSource::Path(path.display().to_string()),
            caption: params.caption.filter(|c| !c.trim().is_empty()),
            send_as: params.send_as,
        });
        crate::logging::milestone("file-handed", 0);
        let (id, mut settled) = self.start_upload(&member, op, params.path.clone());
        let outcome = match tokio::time::timeout_at(answer_by, &mut settled).await {
            Ok(outcome) => outcome.ok(),
            Err(_) if self.keep_upload(id) => {
                return Ok(SendFileResult {
                    message_id: 0,
                    sent_as: params.send_as.unwrap_or(SendAs::Document),
                    size: std::fs::metadata(&path).map_or(0, |m| m.len()),
                    kept: Some(format!(
                        "{}: the relay goes on sending it (for up to {} minutes) and says in the topic if it does not arrive",
                        why_waiting(&member.watch().borrow()),
                        crate::protocol::bus::UPLOAD_DEADLINE.as_secs() / 60
                    )),
                });
            }
            // Settled the moment the answer was due: its outcome stands.
            Err(_) => settled.try_recv().ok(),
        };
        let Some(outcome) = outcome else {
            return Err(refused(
                "it is unknown whether the file reached the topic: the session ended while it was sent".into(),
            ));
        };
        file_sent(outcome).map_err(refused)
    }

    /// Starts uploading `op` as a task of the session's: its number, and
    /// where its outcome arrives while it is waited for.
    fn start_upload(
        &self,
        member: &Arc<Member>,
        op: TopicOp,
        path: String,
    ) -> (u64, oneshot::Receiver<Outcome>) {
        let (waiter, settled) = oneshot::channel();
        let id = self.uploads().begin(path, waiter);
        let uploading = member.clone();
        let session = self.this.clone();
        crate::tasks::spawn(async move {
            let outcome = uploading
                .topic_within(op, crate::member::UPLOAD_TIMEOUT)
                .await;
            if let Some(session) = session.upgrade() {
                session.upload_settled(id, outcome);
            }
        });
        (id, settled)
    }

    /// The answer to upload `id` is due and it has not settled: from now
    /// on it settles on its own. False when it settled meanwhile (or the
    /// session ended first).
    fn keep_upload(&self, id: u64) -> bool {
        match self.uploads().under_way.get_mut(&id) {
            Some(upload) => {
                upload.waiter = None;
                true
            }
            None => false,
        }
    }

    /// Upload `id` settled: its `file/send` hears it, or, when the agent
    /// was told it is kept, a failure is said in the topic and to the host.
    fn upload_settled(&self, id: u64, outcome: Outcome) {
        let Some(upload) = self.uploads().under_way.remove(&id) else {
            // The session ended first, and said so.
            return;
        };
        if let Some(waiter) = upload.waiter {
            crate::logging::milestone("file-settled", 0);
            let _ = waiter.send(outcome);
            return;
        }
        let Err(e) = outcome else {
            tracing::info!(path = %upload.path, "a kept file reached the topic");
            return;
        };
        let said = match e.code() {
            Some(BusErrorCode::CommitUnknown) => format!(
                "⚠️ It is unknown whether the file {} reached this topic ({e}). If it is not above, ask the agent to send it again.",
                upload.path
            ),
            _ => format!(
                "⚠️ The file {} did not reach this topic: {e}. Ask the agent to send it again.",
                upload.path
            ),
        };
        self.tell_of_upload(said);
    }

    /// The session ends: uploads under way are cut off with it, so the
    /// topic hears of each (before what was queued for it is flushed).
    pub(super) fn uploads_cut_off(&self) {
        let cut: Vec<Upload> = self.uploads().under_way.drain().map(|(_, u)| u).collect();
        for upload in cut {
            self.tell_of_upload(format!(
                "⚠️ It is unknown whether the file {} reached this topic: the session ended before Telegram answered. If it is not above, send it again.",
                upload.path
            ));
        }
    }

    /// What became of a file, in the topic (handed over: it goes when
    /// Telegram answers) and at the host's terminal.
    fn tell_of_upload(&self, said: String) {
        tracing::warn!("{said}");
        self.host.notify(
            method::UI_NOTIFY,
            &NotifyParams {
                message: format!("Telegram relay: {said}"),
                level: NotifyLevel::Warning,
            },
        );
        self.send_out(ToTopic::Plain(said));
    }

    /// `topic/send`: the agent's own message, handed over to the leader
    /// and answered within [`ANSWER_WITHIN`]: sent, or kept (the leader has
    /// it and posts it when Telegram answers), or why not.
    pub(super) async fn send_text(&self, params: TopicSendParams) -> TopicSendResult {
        let answer_by = Instant::now() + ANSWER_WITHIN;
        let not_sent = |reason: String| TopicSendResult {
            sent: false,
            messages: 0,
            reason: Some(reason),
            kept: false,
        };
        let Some(member) = self.member() else {
            return not_sent("this session is not connected to Telegram".into());
        };
        // A session that just started is waited for, within the answer's
        // time: it has no topic to send to before it is registered.
        let had_topic = member
            .watch()
            .borrow()
            .route
            .as_ref()
            .is_some_and(|r| r.target.is_some());
        if !had_topic && !registered(&member, answer_by).await {
            return not_sent(format!(
                "this session has no Telegram topic right now ({})",
                not_on_relay(&member)
            ));
        }
        let has_topic = member
            .watch()
            .borrow()
            .route
            .as_ref()
            .is_some_and(|r| r.target.is_some());
        if !has_topic {
            return not_sent("this session has no Telegram topic right now".into());
        }
        let (done, handed) = oneshot::channel();
        self.send_out(ToTopic::Reply {
            markdown: params.text,
            done,
        });
        let kept = |messages: u32, reason: String| TopicSendResult {
            sent: false,
            messages,
            reason: Some(reason),
            kept: true,
        };
        let messages = match tokio::time::timeout_at(answer_by, handed).await {
            Ok(Ok(Ok(messages))) => messages,
            Ok(Ok(Err(why))) => return not_sent(why),
            Ok(Err(_)) => return not_sent("the session left the relay".into()),
            Err(_) => {
                return kept(
                    0,
                    format!(
                        "it is queued in this session and handed to the relay when the relay takes it ({})",
                        why_waiting(&member.watch().borrow())
                    ),
                );
            }
        };
        match telegram_answers(&member, answer_by).await {
            Ok(()) => TopicSendResult {
                sent: true,
                messages,
                reason: None,
                kept: false,
            },
            Err(why) => kept(
                messages,
                format!("{why}: the relay has it and posts it when Telegram answers"),
            ),
        }
    }
}

/// What `file/send` answers once the upload settled: sent, or why not.
fn file_sent(outcome: Outcome) -> Result<SendFileResult, String> {
    match outcome {
        Ok(done) => Ok(SendFileResult {
            message_id: done.message_id.unwrap_or_default(),
            sent_as: done.sent_as.unwrap_or(SendAs::Document),
            size: done.size.unwrap_or_default(),
            kept: None,
        }),
        Err(e) => Err(match e.code() {
            Some(BusErrorCode::CommitUnknown) => format!(
                "it is unknown whether Telegram got the file ({e}); look in the topic before sending it again"
            ),
            Some(BusErrorCode::NoTopic) => {
                "this session has no Telegram topic yet; run /telegram-connect".into()
            }
            _ => format!("the file was not sent: {e}"),
        }),
    }
}

/// Whether the session is registered on the relay, waiting for it until
/// `until` at most.
async fn registered(member: &Member, until: Instant) -> bool {
    let left = until.saturating_duration_since(Instant::now());
    member.wait_registered(left).await.role.is_connected()
}

/// Why the session is not on the relay now, in a few words.
fn not_on_relay(member: &Member) -> String {
    let state = member.watch().borrow().clone();
    state
        .problem
        .unwrap_or_else(|| state.role.describe().to_string())
}

/// Whether Telegram answers the leader now, asked before `until`: a
/// background call (the typing indicator, shown while the agent works
/// anyway) that never waits for the chat's budget. What was handed over
/// goes out within moments then; when it does not answer, why not.
async fn telegram_answers(member: &Member, until: Instant) -> Result<(), String> {
    let state = member.watch().borrow().clone();
    if matches!(
        state.telegram,
        Health::Offline { .. } | Health::Unauthorized
    ) {
        return Err(why_waiting(&state));
    }
    match tokio::time::timeout_at(until, member.topic_background(TopicOp::Typing)).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) if e.code() == Some(BusErrorCode::Paced) => {
            Err("it waits for the chat's message budget".into())
        }
        Ok(Err(e)) => Err(format!("Telegram did not take a call just now ({e})")),
        Err(_) => Err(why_waiting(&member.watch().borrow())),
    }
}

/// Why what the session sends waits, as the member knows it.
fn why_waiting(state: &MemberState) -> String {
    if !state.role.is_connected() {
        return format!("the relay is not reachable now ({})", state.role.describe());
    }
    match &state.telegram {
        Health::Offline { reason } => return format!("Telegram is not answering ({reason})"),
        Health::Unauthorized => return "Telegram refuses the bot's token".into(),
        _ => {}
    }
    if let Some(until) = state.paced_until {
        let wait = until.saturating_duration_since(std::time::Instant::now());
        if wait > Duration::ZERO {
            return format!(
                "it waits for the chat's message budget (about {} s)",
                wait.as_secs().max(1)
            );
        }
    }
    "Telegram has not answered yet".into()
}

//! What enters the journal: a message from an allowed user in a topic some
//! session owns, its text or its files with their caption, and the two
//! buttons that stand for a session's command (a draft's stop, the progress
//! message's ⚡ Steer now). Everything else
//! (pairing, strangers, General, other button taps) is the leader's to answer
//! itself, and so is a file over Telegram's 20 MB download limit or a kind
//! of message no agent can take (a sticker): the topic is told, nothing
//! is downloaded.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use super::access::Access;
use crate::files::{DOWNLOAD_MAX, describe_against};
use crate::phone::PhoneCommand;
use crate::protocol::bus::{AttachmentKind, InboundAttachment};
use crate::store::{BindingStatus, NewUpdate, Store};
use crate::telegram::types::{CallbackQuery, MessageGenerationStopped};
use crate::telegram::{FileRef, MediaKind, Message, Update, UpdateKind};

/// What a journaled message keeps besides the columns every entry has.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct MessageDetail {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<i64>,
    /// The writer's first name, for showing who answered a question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The files the message carries; `text` is then their caption.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<JournaledFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_group_id: Option<String>,
    /// A scheduled prompt's firing, not a person's message.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub scheduled: bool,
}

/// A file of a journaled message: what `getFile` needs and what the
/// session is told.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct JournaledFile {
    pub kind: AttachmentKind,
    pub file_id: String,
    pub file_unique_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_s: Option<u32>,
}

/// A journaled message with what the leader keeps about it besides its
/// columns, read once: made by the triage, or read back from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Entry {
    pub update: NewUpdate,
    pub detail: MessageDetail,
}

impl Entry {
    /// An entry the store kept: its detail is read from its JSON column.
    pub fn stored(update: NewUpdate) -> Self {
        let detail = update
            .detail
            .as_deref()
            .and_then(|d| serde_json::from_str(d).ok())
            .unwrap_or_default();
        Self { update, detail }
    }
}

impl JournaledFile {
    fn new(kind: AttachmentKind, file: &FileRef) -> Self {
        Self {
            kind,
            file_id: file.file_id.clone(),
            file_unique_id: file.file_unique_id.clone(),
            size: file.file_size,
            name: file.file_name.clone(),
            // Telegram sends every photo as JPEG and names no type for it.
            mime_type: file
                .mime_type
                .clone()
                .or_else(|| (kind == AttachmentKind::Photo).then(|| "image/jpeg".into())),
            duration_s: file.duration,
        }
    }

    /// What the session is told of it.
    pub fn inbound(&self) -> InboundAttachment {
        InboundAttachment {
            kind: self.kind,
            name: self.name.clone(),
            mime_type: self.mime_type.clone(),
            size: self.size,
            duration_s: self.duration_s,
        }
    }
}

/// A line the leader writes into a topic about a message it did not pass on.
#[derive(Debug)]
pub(super) struct Notice {
    pub chat_id: i64,
    pub thread_id: i64,
    pub text: String,
}

/// What the leader makes of one update.
#[derive(Debug)]
pub(super) enum Triaged {
    /// A message for a session: journaled, then routed.
    Journal(Entry),
    /// The topic is told why the message goes nowhere; nothing else happens.
    Notice(Notice),
    /// A command the leader answers (`/new`, `/end`, `/start <code>`…):
    /// read here, once.
    Command(PhoneCommand),
    /// The leader answers it itself (pairing, a tap, a stranger…).
    Leader,
}

/// Decides what becomes of each update of a batch, against who may write
/// and which session owns which topic as they were when the batch came.
pub(super) struct Triage {
    store: Arc<Mutex<Store>>,
    access: Arc<Access>,
    /// Read once per batch: who may write (owners and drivers).
    allowed: HashSet<i64>,
    /// Read once per batch: which session owns which topic.
    owners: HashMap<(i64, i64), String>,
}

impl Triage {
    pub fn new(store: Arc<Mutex<Store>>, access: Arc<Access>) -> Self {
        Self {
            store,
            access,
            allowed: HashSet::new(),
            owners: HashMap::new(),
        }
    }

    /// Reads what the decisions need once per batch, not once per update:
    /// before a batch's first [`Triage::triage`].
    pub fn prepare(&mut self) {
        self.allowed = self.access.writers();
        self.owners.clear();
        let bindings = self
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bindings();
        match bindings {
            Ok(bindings) => self.owners.extend(
                bindings
                    .into_iter()
                    .filter(|b| b.status != BindingStatus::Offline)
                    .filter_map(|b| Some(((b.chat_id?, b.thread_id?), b.profile_key))),
            ),
            Err(e) => tracing::error!("cannot read the topics' owners: {e}"),
        }
    }

    /// What becomes of `update`: a journal entry, a notice in its topic, or
    /// the leader's to answer.
    ///
    /// Long because it is the one decision per update: its kind, its
    /// content, who wrote it and where, in the order they rule each other out.
    pub fn triage(&self, update: &Update) -> Triaged {
        let (message, edited) = match &update.kind {
            UpdateKind::Message(message) => (message, false),
            UpdateKind::EditedMessage(message) => (message, true),
            UpdateKind::GenerationStopped(stopped) => return self.stop_button(update, stopped),
            UpdateKind::CallbackQuery(query)
                if query.data.as_deref() == Some(crate::phone::STEER_BUTTON) =>
            {
                return self.steer_button(update, query);
            }
            UpdateKind::CallbackQuery(_) | UpdateKind::Unknown { .. } => return Triaged::Leader,
        };
        let Some(user) = message.from.as_ref().filter(|u| !u.is_bot) else {
            return Triaged::Leader;
        };
        let command = command_of(update);
        // An edited command is neither run again nor a prompt: the
        // leader says so.
        if edited
            && message
                .text
                .as_deref()
                .and_then(PhoneCommand::parse)
                .is_some()
        {
            return Triaged::Leader;
        }
        let owner = message
            .topic()
            .filter(|_| self.allowed.contains(&user.id))
            .and_then(|thread| self.owners.get(&(message.chat.id, thread)).cloned());
        let (Some(owner), Some(thread)) = (owner, message.topic()) else {
            return command.map_or(Triaged::Leader, Triaged::Command);
        };
        if let Some(command) = command {
            return match command.journaled() {
                // The session's own (`/stop`, `/status`, `/resend`): in
                // order with the messages around it.
                Some(text) => self.journal(update, message, &owner, text, Vec::new()),
                None => Triaged::Command(command),
            };
        }
        let (text, files) = match content(message, edited) {
            Ok(content) => content,
            Err(Some(text)) => {
                return Triaged::Notice(Notice {
                    chat_id: message.chat.id,
                    thread_id: thread,
                    text,
                });
            }
            Err(None) => return Triaged::Leader,
        };
        let text = if edited {
            format!("(edited) {text}")
        } else {
            text
        };
        self.journal(update, message, &owner, text, files)
    }

    /// A message from an allowed user for the session of `owner`, as the
    /// journal keeps it.
    fn journal(
        &self,
        update: &Update,
        message: &Message,
        owner: &str,
        text: String,
        files: Vec<JournaledFile>,
    ) -> Triaged {
        let user = message.from.as_ref();
        let reply_to = message.reply_to_message.as_ref().map(|m| m.message_id);
        let detail = MessageDetail {
            reply_to,
            from: reply_to.and(user.map(|u| u.first_name.clone())),
            media_group_id: message.media_group_id.clone().filter(|_| !files.is_empty()),
            files,
            scheduled: false,
        };
        Triaged::Journal(Entry {
            update: NewUpdate {
                update_id: update.update_id,
                owner: Some(owner.to_string()),
                chat_id: message.chat.id,
                thread_id: message.topic(),
                user_id: user.map_or(0, |u| u.id),
                message_id: message.message_id,
                // What a person pastes is kept as the agent would be told it:
                // a bot token masked before it reaches the disk.
                text: crate::redact::redact(&text).into_owned(),
                detail: (detail != MessageDetail::default())
                    .then(|| serde_json::to_string(&detail).ok())
                    .flatten(),
            },
            detail,
        })
    }
}

impl Triage {
    /// A draft's stop button, pressed in a session's topic of a private
    /// chat (whose id is the person's): it is [`PhoneCommand::Stop`], as
    /// `/stop` typed there is, in order with the messages around it. It
    /// names no message, so its entry names message 0.
    fn stop_button(&self, update: &Update, stopped: &MessageGenerationStopped) -> Triaged {
        let person = stopped.chat.id;
        let Some(thread) = stopped.message_thread_id else {
            return Triaged::Leader;
        };
        if !self.allowed.contains(&person) {
            return Triaged::Leader;
        }
        let Some(owner) = self.owners.get(&(person, thread)).cloned() else {
            return Triaged::Leader;
        };
        Triaged::Journal(Entry {
            update: NewUpdate {
                update_id: update.update_id,
                owner: Some(owner),
                chat_id: person,
                thread_id: Some(thread),
                user_id: person,
                message_id: 0,
                text: PhoneCommand::Stop.journaled().unwrap_or_default(),
                detail: None,
            },
            detail: MessageDetail::default(),
        })
    }
}

impl Triage {
    /// The progress message's ⚡ Steer now, tapped by an allowed user in a
    /// session's topic: a bare `/steer`, in order with the messages around
    /// it, naming no message of the person's (message 0). The leader still
    /// answers the tap's spinner (`Leader::answer`).
    fn steer_button(&self, update: &Update, query: &CallbackQuery) -> Triaged {
        let person = query.from.id;
        let (Some(message), false) = (query.message.as_ref(), query.from.is_bot) else {
            return Triaged::Leader;
        };
        let Some(thread) = message.topic().filter(|_| self.allowed.contains(&person)) else {
            return Triaged::Leader;
        };
        let Some(owner) = self.owners.get(&(message.chat.id, thread)).cloned() else {
            return Triaged::Leader;
        };
        Triaged::Journal(Entry {
            update: NewUpdate {
                update_id: update.update_id,
                owner: Some(owner),
                chat_id: message.chat.id,
                thread_id: Some(thread),
                user_id: person,
                message_id: 0,
                text: PhoneCommand::Steer(String::new())
                    .journaled()
                    .unwrap_or_default(),
                detail: None,
            },
            detail: MessageDetail::default(),
        })
    }
}

/// The command a message is, read once: only a message as first written
/// is one (an edit of a command is not a new command), and only a
/// person's.
pub(super) fn command_of(update: &Update) -> Option<PhoneCommand> {
    match &update.kind {
        UpdateKind::Message(message) if message.from.as_ref().is_some_and(|u| !u.is_bot) => {
            PhoneCommand::parse(message.text.as_deref()?)
        }
        _ => None,
    }
}

/// What a message from an allowed user in a session's topic carries for
/// its agent: its text, or its file with the caption. `Err(Some(notice))`:
/// the topic is told why it goes nowhere; `Err(None)`: nothing for an
/// agent (a service message, an edited caption).
fn content(
    message: &Message,
    edited: bool,
) -> Result<(String, Vec<JournaledFile>), Option<String>> {
    match (message.text.as_ref(), message.media()) {
        (Some(text), _) => Ok((text.clone(), Vec::new())),
        // A caption edited later: the file reached the agent already.
        (None, Some(_)) if edited => match message.caption.as_ref() {
            Some(caption) => Ok((caption.clone(), Vec::new())),
            None => Err(None),
        },
        (None, Some((MediaKind::Sticker, _))) => {
            Err(Some("Stickers are not passed to the agent.".into()))
        }
        (None, Some((kind, file))) => {
            if let Some(size) = file.file_size.filter(|size| *size > DOWNLOAD_MAX) {
                return Err(Some(too_big(message, file, size)));
            }
            let file = JournaledFile::new(attachment_kind(kind), file);
            Ok((message.caption.clone().unwrap_or_default(), vec![file]))
        }
        (None, None) => Err(None),
    }
}

/// The Bot API's field for a file, as the host protocol names it.
fn attachment_kind(kind: MediaKind) -> AttachmentKind {
    match kind {
        MediaKind::Photo => AttachmentKind::Photo,
        MediaKind::Document | MediaKind::Sticker => AttachmentKind::Document,
        MediaKind::Voice => AttachmentKind::Voice,
        MediaKind::Audio => AttachmentKind::Audio,
        MediaKind::Video => AttachmentKind::Video,
        MediaKind::VideoNote => AttachmentKind::VideoNote,
        MediaKind::Animation => AttachmentKind::Animation,
    }
}

/// The answer to a file bots may not download.
fn too_big(message: &Message, file: &FileRef, size: u64) -> String {
    let what = match (&file.file_name, message.media().map(|(k, _)| k)) {
        (Some(name), _) => format!("“{name}”"),
        (None, Some(MediaKind::Photo)) => "This photo".into(),
        (None, Some(MediaKind::Voice)) => "This voice note".into(),
        (None, Some(MediaKind::Video | MediaKind::VideoNote)) => "This video".into(),
        (None, _) => "This file".into(),
    };
    let (size, limit) = describe_against(size, DOWNLOAD_MAX);
    format!(
        "📎 {what} is {size}: bots can download at most {limit} from Telegram, so it was not passed to the agent. Share it another way (a link, or smaller parts)."
    )
}

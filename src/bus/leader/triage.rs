//! What enters the journal: a message from an allowed user in a topic some
//! session owns. Everything else (pairing, strangers, General, button taps)
//! is the leader's to answer itself.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

use super::access::Access;
use crate::store::{BindingStatus, NewUpdate, Store};
use crate::telegram::{Update, UpdateKind};

/// What a journaled message keeps besides the columns every entry has.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct MessageDetail {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<i64>,
    /// The writer's first name, for showing who answered a question.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

pub(super) struct Journaling {
    store: Arc<Mutex<Store>>,
    access: Arc<Access>,
    /// Read once per batch: who may write.
    allowed: HashSet<i64>,
    /// Read once per batch: which session owns which topic.
    owners: HashMap<(i64, i64), String>,
}

impl Journaling {
    pub fn new(store: Arc<Mutex<Store>>, access: Arc<Access>) -> Self {
        Self {
            store,
            access,
            allowed: HashSet::new(),
            owners: HashMap::new(),
        }
    }
}

impl Journaling {
    /// Called once before each batch: reads what the decisions need once,
    /// not once per update.
    pub fn prepare(&mut self) {
        self.allowed = self.access.snapshot();
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

    /// The journal entry for `update`, or `None` when the leader answers
    /// it itself.
    pub fn journal(&mut self, update: &Update) -> Option<NewUpdate> {
        match &update.kind {
            UpdateKind::Message(message) | UpdateKind::EditedMessage(message) => {
                let text = message.text.as_ref()?;
                let user = message.from.as_ref().filter(|u| !u.is_bot)?;
                let thread = message.topic()?;
                if !self.allowed.contains(&user.id) {
                    return None;
                }
                let owner = self.owners.get(&(message.chat.id, thread))?.clone();
                let text = match update.kind {
                    UpdateKind::EditedMessage(_) => format!("(edited) {text}"),
                    _ => text.clone(),
                };
                let reply_to = message.reply_to_message.as_ref().map(|m| m.message_id);
                let detail = MessageDetail {
                    reply_to,
                    from: reply_to.map(|_| user.first_name.clone()),
                };
                Some(NewUpdate {
                    update_id: update.update_id,
                    owner: Some(owner),
                    chat_id: message.chat.id,
                    thread_id: Some(thread),
                    user_id: user.id,
                    message_id: message.message_id,
                    text,
                    detail: (detail != MessageDetail::default())
                        .then(|| serde_json::to_string(&detail).ok())
                        .flatten(),
                })
            }
            UpdateKind::CallbackQuery(_) | UpdateKind::Unknown { .. } => None,
        }
    }
}

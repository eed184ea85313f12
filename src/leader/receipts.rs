//! Receipts on a person's own message ([`Receipts`]): what became of a
//! message somebody wrote in a session's topic, as the bot's reaction on
//! that message — 👀 once the agent took it (its host said so, or took it
//! at once), 💔 when it could not be delivered, beside the notice that says
//! why. One mark at a time: the latest. An album is one message (Telegram
//! puts a reaction on its first).
//!
//! A reaction is no message: Telegram counts it against no chat's message
//! budget (nor does the relay's limiter), and publishes no rate for it. So
//! the relay paces reactions apart from everything else: one call at a
//! time, at most [`PER_SECOND`] a second over every chat, each a
//! background call that never waits for a budget and never holds up an
//! answer. Marks that wait are kept per message, the later replacing the
//! earlier, so a burst costs one call per message at most. A 429 holds
//! them back for its `retry_after`; a chat that refuses them (its
//! administrators allow other reactions, or none) is not marked again by
//! this leader. `receipts = false` in config.toml switches them off.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;

use super::context::Context;
use super::failure::FailureKind;
use super::outbox::Pace;
use super::triage::Entry;
use crate::store::NewUpdate;
use crate::telegram::call::{ReactionType, SetMessageReaction};
use crate::telegram::{BotCall, Priority};

/// Reactions set at most this many times a second, over every chat.
const PER_SECOND: u32 = 5;
/// How long a mark waits after Telegram said a chat's budget is spent.
const PACED_PAUSE: Duration = Duration::from_secs(5);
/// Marks waiting at most; beyond, the oldest go (a later state of a message
/// never does: it replaces its earlier one in place).
const MAX_WAITING: usize = 1_024;
/// Albums remembered as marked, so an album is marked once.
const ALBUMS_KEPT: usize = 256;

/// What became of a person's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mark {
    /// The agent took it.
    Taken,
    /// It could not be delivered (the topic was told why).
    Undelivered,
}

impl Mark {
    fn emoji(self) -> &'static str {
        match self {
            Self::Taken => "👀",
            Self::Undelivered => "💔",
        }
    }
}

/// A message a mark goes on: its chat and its id.
type Target = (i64, i64);

#[derive(Default)]
struct Waiting {
    order: VecDeque<Target>,
    marks: HashMap<Target, Mark>,
    /// Albums marked lately, by chat and group id.
    albums: VecDeque<(i64, String)>,
    /// Chats that refuse the relay's reactions.
    refusing: HashSet<i64>,
}

impl Waiting {
    /// A mark for `update`, if a person wrote it (the relay's own prompts
    /// and a draft's stop button name no message) in a chat that takes
    /// reactions; an album once. A later mark of a message replaces one
    /// that had not gone yet.
    fn add(&mut self, update: &NewUpdate, mark: Mark) {
        if update.message_id <= 0 || self.refusing.contains(&update.chat_id) {
            return;
        }
        if let Some(group) = Entry::stored(update.clone()).detail.media_group_id {
            let key = (update.chat_id, group);
            if mark == Mark::Taken && self.albums.contains(&key) {
                return;
            }
            if self.albums.len() >= ALBUMS_KEPT {
                self.albums.pop_front();
            }
            self.albums.push_back(key);
        }
        let target = (update.chat_id, update.message_id);
        if self.marks.insert(target, mark).is_none() {
            self.order.push_back(target);
        }
        while self.order.len() > MAX_WAITING {
            if let Some(oldest) = self.order.pop_front() {
                self.marks.remove(&oldest);
            }
        }
    }

    /// The next mark to set, oldest first.
    fn next(&mut self) -> Option<(Target, Mark)> {
        let target = self.order.pop_front()?;
        let mark = self.marks.remove(&target)?;
        Some((target, mark))
    }

    /// A mark that could not go now goes again first, unless a newer one
    /// for the same message came meanwhile.
    fn again(&mut self, target: Target, mark: Mark) {
        if let std::collections::hash_map::Entry::Vacant(vacant) = self.marks.entry(target) {
            vacant.insert(mark);
            self.order.push_front(target);
        }
    }
}

/// See the module docs.
pub(super) struct Receipts {
    cx: Arc<Context>,
    enabled: bool,
    waiting: Mutex<Waiting>,
    wake: Notify,
}

impl Receipts {
    pub fn new(cx: Arc<Context>, enabled: bool) -> Self {
        Self {
            cx,
            enabled,
            waiting: Mutex::default(),
            wake: Notify::new(),
        }
    }

    fn waiting(&self) -> MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Journal entries the agent took: each acknowledgement as the session
    /// that owns the entry made it (another's changes nothing).
    pub fn taken(&self, acks: &[(String, i64)]) {
        if !self.enabled || acks.is_empty() {
            return;
        }
        let entries: Vec<NewUpdate> = {
            let store = self.cx.store();
            acks.iter()
                .filter_map(|(profile, id)| {
                    let entry = store.journal_entry(*id).ok().flatten()?;
                    (entry.update.owner.as_deref() == Some(profile.as_str()))
                        .then_some(entry.update)
                })
                .collect()
        };
        self.mark(&entries, Mark::Taken);
    }

    /// Journal entries given up: they reach no agent.
    pub fn undelivered(&self, entries: &[NewUpdate]) {
        if self.enabled {
            self.mark(entries, Mark::Undelivered);
        }
    }

    /// Marks each entry a person wrote.
    fn mark(&self, entries: &[NewUpdate], mark: Mark) {
        let mut waiting = self.waiting();
        for update in entries {
            waiting.add(update, mark);
        }
        drop(waiting);
        self.wake.notify_one();
    }

    /// Sets the marks as they come, for the leader's life.
    pub async fn run(self: Arc<Self>) {
        if !self.enabled {
            return;
        }
        let gap = Duration::from_secs(1) / PER_SECOND;
        loop {
            let next = self.waiting().next();
            let Some(((chat_id, message_id), mark)) = next else {
                tokio::select! {
                    () = self.cx.stop.cancelled() => return,
                    () = self.wake.notified() => continue,
                }
            };
            let call = BotCall::SetMessageReaction(SetMessageReaction {
                chat_id,
                message_id,
                reaction: vec![ReactionType::Emoji {
                    emoji: mark.emoji().into(),
                }],
            });
            let pause = match self
                .cx
                .outbox
                .call(call, Pace::of(Priority::Background))
                .await
            {
                Ok(_) => gap,
                Err(f) if matches!(f.kind, FailureKind::Paced | FailureKind::Unavailable) => {
                    self.waiting().again((chat_id, message_id), mark);
                    PACED_PAUSE
                }
                Err(f) if f.message.contains("REACTION_INVALID") => {
                    tracing::info!(
                        chat = chat_id,
                        "the chat refuses the relay's reactions: {f}"
                    );
                    self.waiting().refusing.insert(chat_id);
                    gap
                }
                Err(f) => {
                    tracing::debug!(chat = chat_id, message_id, "a receipt was not set: {f}");
                    gap
                }
            };
            tokio::select! {
                () = self.cx.stop.cancelled() => return,
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(update_id: i64, message_id: i64, album: Option<&str>) -> NewUpdate {
        NewUpdate {
            update_id,
            owner: Some("k".into()),
            chat_id: -100,
            thread_id: Some(7),
            user_id: 1001,
            message_id,
            text: "hi".into(),
            detail: album.map(|g| format!("{{\"mediaGroupId\":\"{g}\"}}")),
        }
    }

    #[test]
    fn one_mark_a_message_the_latest_an_album_once_and_no_mark_on_the_relays_own() {
        let mut waiting = Waiting::default();
        waiting.add(&written(1, 10, None), Mark::Taken);
        waiting.add(&written(2, 11, None), Mark::Taken);
        waiting.add(&written(1, 10, None), Mark::Undelivered);
        waiting.add(&written(3, 0, None), Mark::Taken);
        waiting.add(&written(4, 12, Some("g")), Mark::Taken);
        waiting.add(&written(5, 13, Some("g")), Mark::Taken);
        assert_eq!(
            waiting.next(),
            Some(((-100, 10), Mark::Undelivered)),
            "the latest"
        );
        assert_eq!(waiting.next(), Some(((-100, 11), Mark::Taken)));
        assert_eq!(
            waiting.next(),
            Some(((-100, 12), Mark::Taken)),
            "the album once"
        );
        assert_eq!(waiting.next(), None, "nothing for the relay's own prompt");
        waiting.again((-100, 12), Mark::Taken);
        waiting.add(&written(6, 14, None), Mark::Taken);
        assert_eq!(
            waiting.next(),
            Some(((-100, 12), Mark::Taken)),
            "what could not go, first"
        );
        waiting.refusing.insert(-100);
        waiting.add(&written(7, 15, None), Mark::Taken);
        assert_eq!(waiting.next(), Some(((-100, 14), Mark::Taken)));
        assert_eq!(
            waiting.next(),
            None,
            "a chat that refuses reactions gets none"
        );
        for i in 0..2000 {
            waiting.refusing.clear();
            waiting.add(&written(100 + i, 100 + i, None), Mark::Taken);
        }
        assert_eq!(waiting.order.len(), MAX_WAITING, "bounded");
    }
}

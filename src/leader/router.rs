//! Inbound routing ([`Router`]): journaled messages to the session that
//! owns their topic (a reply that answers an open question to the
//! question), acknowledgements back into the journal, and messages that
//! can never be delivered given up with a word to whoever wrote them.
//!
//! Nothing here awaits Telegram on the routing path: deliveries are frames
//! queued to connections, and whatever the leader says meanwhile goes to
//! the outbox of record off the path (`Speaker::later`), so a flood can
//! never delay anybody else's messages.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::mpsc;

use super::asks::Asks;
use super::context::Context;
use super::launches::{Comeback, Launches};
use super::receipts::Receipts;
use super::registry::{ConnId, Conns};
use super::triage::{Entry, JournaledFile};
use crate::ids::Place;
use crate::protocol::bus::*;
use crate::store::NewUpdate;

/// What the topic is told when its session is away.
const AWAY_NOTICE: &str =
    "⏸ This session is offline. Your message is kept and will be delivered when it comes back.";
/// …and when its host switched to another session and closed the topic.
const SWITCHED_NOTICE: &str = "⏸ This session is not the one running now (its topic is closed). Your message is kept and reaches it when the session is resumed.";

/// …and when it is a launched session that is started again for it.
const RESUMING_NOTICE: &str = "▶ Starting this session again for your message…";

/// Deliveries of one message that were never acknowledged before the
/// relay gives it up (a message the host keeps failing on).
pub(super) const MAX_ATTEMPTS: u32 = 10;
/// How much of a message a notice about it quotes.
const QUOTE: usize = 60;

pub(super) struct Router {
    cx: Arc<Context>,
    /// A reply may answer an open question instead of reaching the agent.
    asks: Arc<Asks>,
    /// A launched session that is not running is started again for a message.
    launches: Arc<Launches>,
    /// What became of a person's message, as a reaction on it.
    receipts: Arc<Receipts>,
    /// Profiles whose topic was told that the session is away, so it is told
    /// only once per absence.
    told_away: Mutex<HashSet<String>>,
    /// Delivery acknowledgements waiting to be written ([`Router::settle`]).
    settle: mpsc::UnboundedSender<(String, i64)>,
}

impl Router {
    pub fn new(
        cx: Arc<Context>,
        asks: Arc<Asks>,
        launches: Arc<Launches>,
        receipts: Arc<Receipts>,
        settle: mpsc::UnboundedSender<(String, i64)>,
    ) -> Self {
        Self {
            cx,
            asks,
            launches,
            receipts,
            told_away: Mutex::default(),
            settle,
        }
    }

    /// Queues `updates` to `conn` in order; returns the ids that were queued.
    /// The one path for new updates and for a backlog.
    fn push(&self, conns: &Conns, conn: ConnId, entries: &[Entry]) -> Vec<i64> {
        let mut queued = Vec::with_capacity(entries.len());
        for Entry { update, detail } in entries {
            let frame = FromLeader::Deliver(Deliver {
                delivery_id: update.update_id as u64,
                update_id: update.update_id,
                message: InboundMessage {
                    chat_id: update.chat_id,
                    thread_id: update.thread_id,
                    user_id: update.user_id,
                    message_id: update.message_id,
                    text: update.text.clone(),
                    reply_to: detail.reply_to,
                    attachments: detail.files.iter().map(JournaledFile::inbound).collect(),
                    media_group_id: detail.media_group_id.clone(),
                    scheduled: detail.scheduled,
                },
            });
            if !conns.push(conn, frame) {
                break;
            }
            queued.push(update.update_id);
        }
        queued
    }

    /// The session of `profile_key` is back: its topic may be told again.
    pub fn back(&self, profile_key: &str) {
        self.told_away
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(profile_key);
    }

    /// A follower handed a delivery to its host: queue it to be settled in
    /// the journal. Acks are written in batches ([`Router::settle`]): one
    /// fsync per batch instead of per message. An ack lost with a crashing
    /// leader only means the message comes again, and the session drops
    /// the repeat.
    pub fn delivered(&self, profile_key: String, delivery_id: u64) {
        let _ = self.settle.send((profile_key, delivery_id as i64));
    }

    /// Routes what a batch journaled. The journal already holds it durably,
    /// so a failure here only delays delivery until the owner registers
    /// again.
    pub fn route(&self, journaled: Vec<Entry>) {
        let mut sent = Vec::new();
        let mut away = Vec::new();
        let mut answers = Vec::new();
        {
            let conns = self.cx.registry.lock();
            let mut by_owner: Vec<(String, Vec<Entry>)> = Vec::new();
            for entry in journaled {
                // A reply that answers an open question is the question's,
                // not a prompt.
                if self.asks.answers(&entry) {
                    let update = &entry.update;
                    answers.extend(update.owner.clone().map(|o| (o, update.update_id)));
                    continue;
                }
                let Some(owner) = entry.update.owner.clone() else {
                    continue;
                };
                match by_owner.iter_mut().find(|(o, _)| *o == owner) {
                    Some((_, entries)) => entries.push(entry),
                    None => by_owner.push((owner, vec![entry])),
                }
            }
            for (owner, updates) in by_owner {
                match conns.owner_of(&owner).filter(|(_, s)| s.ready) {
                    Some((conn, _)) => sent.extend(self.push(&conns, conn, &updates)),
                    None => away.extend(updates),
                }
            }
        }
        if let Err(e) = self.cx.store().record_attempts(&sent) {
            tracing::warn!("cannot count delivery attempts: {e}");
        }
        self.settle(&answers);
        for entry in away {
            self.tell_away(entry.update);
        }
    }

    /// Makes a just-registered session live: queues, in order, everything
    /// the journal holds for it, and only then lets new updates through.
    /// Both happen under the registry lock, so an update arriving meanwhile
    /// can come twice (the session drops the repeat) but never ahead of
    /// older ones.
    pub fn go_live(&self, conn: ConnId, generation: Generation) {
        let queued = {
            let mut conns = self.cx.registry.lock();
            let Ok(session) = conns.session(conn, generation) else {
                return;
            };
            let profile = session.route.profile_key.clone();
            let pending = match self.cx.store().pending_for(&profile) {
                Ok(pending) => pending,
                Err(e) => {
                    tracing::error!("cannot read the journal: {e}");
                    return;
                }
            };
            let (spent, pending): (Vec<_>, Vec<_>) = pending
                .into_iter()
                .partition(|e| e.attempts >= MAX_ATTEMPTS);
            self.give_up(
                spent.into_iter().map(|e| e.update).collect(),
                &format!("it was handed to its session {MAX_ATTEMPTS} times and never taken"),
                true,
            );
            let entries: Vec<Entry> = pending
                .into_iter()
                .map(|e| Entry::stored(e.update))
                .collect();
            let queued = self.push(&conns, conn, &entries);
            if queued.len() < entries.len() {
                return;
            }
            if let Ok(session) = conns.session_mut(conn, generation) {
                session.ready = true;
            }
            queued
        };
        if let Err(e) = self.cx.store().record_attempts(&queued) {
            tracing::warn!("cannot count delivery attempts: {e}");
        }
    }

    /// A message for a session that is away waits in the journal; its topic
    /// is told once per absence.
    fn tell_away(&self, update: NewUpdate) {
        let Some(owner) = update.owner.clone() else {
            return;
        };
        let first = self
            .told_away
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(owner.clone());
        if first {
            // A launched session that does not run is started again for
            // the message, which waits in the journal meanwhile.
            let topic = Place {
                chat_id: update.chat_id,
                thread_id: update.thread_id,
            };
            match self.launches.resume_for_message(&owner, update.user_id) {
                Comeback::Resuming => {
                    self.cx.speaker.later(topic, RESUMING_NOTICE.into());
                    return;
                }
                // Its topic is told when `serve` has it back: a notice now
                // would only spend the chat's budget before the answer.
                Comeback::Returning => return,
                Comeback::No => {}
            }
            let switched = self
                .cx
                .store()
                .binding(&owner)
                .ok()
                .flatten()
                .is_some_and(|b| b.closed);
            let notice = if switched {
                SWITCHED_NOTICE
            } else {
                AWAY_NOTICE
            };
            self.cx.speaker.later(topic, notice.into());
        }
    }

    /// Gives up `entries`, which can never be delivered: each is dropped
    /// with `why`, and whoever wrote them is told, in their topic
    /// (`in_topic`) or, when that is gone, in the chat outside the topics.
    /// Nothing the user wrote disappears without a word.
    pub fn give_up(&self, entries: Vec<NewUpdate>, why: &str, in_topic: bool) {
        for (place, text) in self.drop_entries(entries, why, in_topic) {
            self.cx.speaker.later(place, text);
        }
    }

    /// [`Router::give_up`], the notices handed to the outbox before it
    /// returns: for a flow after which this leader may step down (a
    /// disconnect of its own session).
    pub async fn give_up_now(&self, entries: Vec<NewUpdate>, why: &str, in_topic: bool) {
        for (place, text) in self.drop_entries(entries, why, in_topic) {
            if let Err(e) = self.cx.speaker.post(place, text).await {
                let chat = place.chat_id;
                tracing::warn!(chat, "cannot tell that messages were given up: {e}");
            }
        }
    }

    /// Drops `entries` with `why`; answers what to say where, one line per
    /// place, in the order the messages were written.
    fn drop_entries(
        &self,
        entries: Vec<NewUpdate>,
        why: &str,
        in_topic: bool,
    ) -> Vec<(Place, String)> {
        self.receipts.undelivered(&entries);
        let mut places: Vec<(Place, Vec<NewUpdate>)> = Vec::new();
        for entry in entries {
            if let Err(e) = self.cx.store().mark_dropped(entry.update_id, why) {
                tracing::error!("cannot drop update {}: {e}", entry.update_id);
                continue;
            }
            tracing::warn!(update_id = entry.update_id, "a message is given up: {why}");
            let place = Place {
                chat_id: entry.chat_id,
                thread_id: entry.thread_id.filter(|_| in_topic),
            };
            match places.iter_mut().find(|(p, _)| *p == place) {
                Some((_, list)) => list.push(entry),
                None => places.push((place, vec![entry])),
            }
        }
        places
            .into_iter()
            .map(|(place, list)| {
                let first = crate::policy::clip(list[0].text.trim(), QUOTE);
                let text = match list.len() {
                    1 => format!("⚠️ Your message “{first}” reached no agent: {why}."),
                    n => format!(
                        "⚠️ {n} of your messages reached no agent, the first “{first}”: {why}."
                    ),
                };
                (place, text)
            })
            .collect()
    }

    /// Writes a batch of acknowledgements: pending → delivered, each only for
    /// the session that owns the entry.
    pub fn settle(&self, acks: &[(String, i64)]) {
        match self.cx.store().mark_delivered(acks) {
            Ok(changed) if changed < acks.len() => tracing::debug!(
                acks = acks.len(),
                changed,
                "some acknowledgements were repeats or not the session's own"
            ),
            Ok(_) => {}
            Err(e) => tracing::error!("cannot settle {} deliveries: {e}", acks.len()),
        }
        self.receipts.taken(acks);
    }
}

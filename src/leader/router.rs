//! Inbound routing: journaled messages to the session that owns their
//! topic, acknowledgements back into the journal, and what the leader
//! answers itself (pairing, people outside any session, button taps and
//! replies that answer an ask).
//!
//! Nothing here awaits Telegram on the routing path: deliveries are frames
//! queued to connections, and every answer the leader writes itself goes
//! through [`Replies`], a small bounded queue served off the path, so a
//! stranger's flood can never delay anybody else's messages.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc};

use super::asks::{self, Key, Taken};
use super::poller::Batch;
use super::registry::{ConnId, Conns};
use super::triage::{JournaledFile, MessageDetail};
use super::{Leader, now_ms};
use crate::protocol::bus::*;
use crate::render;
use crate::store::NewUpdate;
use crate::telegram::{CallbackQuery, ChatKind, Message, Update, UpdateKind};

/// What the topic is told when its session is away.
const AWAY_NOTICE: &str =
    "⏸ This session is offline. Your message is kept and will be delivered when it comes back.";
/// …and when its host switched to another session and closed the topic.
const SWITCHED_NOTICE: &str = "⏸ This session is not the one running now (its topic is closed). Your message is kept and reaches it when the session is resumed.";

/// Deliveries of one message that were never acknowledged before the
/// relay gives it up (a message the host keeps failing on).
pub(super) const MAX_ATTEMPTS: u32 = 10;
/// How much of a message a notice about it quotes.
const QUOTE: usize = 60;

pub(super) struct Router {
    /// Profiles whose topic was told that the session is away, so it is told
    /// only once per absence.
    told_away: Mutex<HashSet<String>>,
    /// Delivery acknowledgements waiting to be written (`Leader::settle`).
    settle: mpsc::UnboundedSender<(String, i64)>,
    pub replies: Replies,
}

impl Router {
    pub fn new(settle: mpsc::UnboundedSender<(String, i64)>) -> Self {
        Self {
            told_away: Mutex::default(),
            settle,
            replies: Replies::default(),
        }
    }

    /// Queues `updates` to `conn` in order; returns the ids that were queued.
    /// The one path for new updates and for a backlog.
    fn push(&self, conns: &Conns, conn: ConnId, updates: &[NewUpdate]) -> Vec<i64> {
        let mut queued = Vec::with_capacity(updates.len());
        for update in updates {
            let detail = MessageDetail::of(update);
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
                    media_group_id: detail.media_group_id,
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
    /// the journal. Acks are written in batches (`Leader::settle`): one
    /// fsync per batch instead of per message. An ack lost with a crashing
    /// leader only means the message comes again, and the session drops
    /// the repeat.
    pub fn delivered(&self, profile_key: String, delivery_id: u64) {
        let _ = self.settle.send((profile_key, delivery_id as i64));
    }
}

/// The time of day, as shown under an answered question.
fn clock() -> String {
    let secs = now_ms() / 1000;
    format!("{:02}:{:02} UTC", secs / 3600 % 24, secs / 60 % 60)
}

impl Leader {
    /// Routes one journaled batch. The journal already holds it durably, so
    /// a failure here only delays delivery until the owner registers again.
    pub(super) fn route(self: &Arc<Self>, batch: Batch) {
        let mut sent = Vec::new();
        let mut away = Vec::new();
        let mut answers = Vec::new();
        {
            let conns = self.registry.lock();
            let mut by_owner: Vec<(String, Vec<NewUpdate>)> = Vec::new();
            for update in batch.journaled {
                // A reply that answers an open question is the question's,
                // not a prompt.
                if self.answers_ask(&update) {
                    answers.extend(update.owner.clone().map(|o| (o, update.update_id)));
                    continue;
                }
                let Some(owner) = update.owner.clone() else {
                    continue;
                };
                match by_owner.iter_mut().find(|(o, _)| *o == owner) {
                    Some((_, updates)) => updates.push(update),
                    None => by_owner.push((owner, vec![update])),
                }
            }
            for (owner, updates) in by_owner {
                match conns.owner_of(&owner).filter(|(_, s)| s.ready) {
                    Some((conn, _)) => sent.extend(self.router.push(&conns, conn, &updates)),
                    None => away.extend(updates),
                }
            }
        }
        if let Err(e) = self.store().record_attempts(&sent) {
            tracing::warn!("cannot count delivery attempts: {e}");
        }
        self.settle(&answers);
        for update in away {
            self.tell_away(update);
        }
        for notice in batch.notices {
            self.router
                .replies
                .say(self, notice.chat_id, Some(notice.thread_id), notice.text);
        }
        for update in batch.others {
            self.answer_directly(update);
        }
    }

    /// Makes a just-registered session live: queues, in order, everything
    /// the journal holds for it, and only then lets new updates through.
    /// Both happen under the registry lock, so an update arriving meanwhile
    /// can come twice (the session drops the repeat) but never ahead of
    /// older ones.
    pub(super) fn go_live(self: &Arc<Self>, conn: ConnId, generation: Generation) {
        let queued = {
            let mut conns = self.registry.lock();
            let Ok(session) = conns.session(conn, generation) else {
                return;
            };
            let profile = session.route.profile_key.clone();
            let pending = match self.store().pending_for(&profile) {
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
            let updates: Vec<NewUpdate> = pending.into_iter().map(|e| e.update).collect();
            let queued = self.router.push(&conns, conn, &updates);
            if queued.len() < updates.len() {
                return;
            }
            if let Ok(session) = conns.session_mut(conn, generation) {
                session.ready = true;
            }
            queued
        };
        if let Err(e) = self.store().record_attempts(&queued) {
            tracing::warn!("cannot count delivery attempts: {e}");
        }
    }

    /// A message for a session that is away waits in the journal; its topic
    /// is told once per absence.
    fn tell_away(self: &Arc<Self>, update: NewUpdate) {
        let Some(owner) = update.owner.clone() else {
            return;
        };
        let first = self
            .router
            .told_away
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(owner.clone());
        if first {
            let switched = self
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
            self.router
                .replies
                .say(self, update.chat_id, update.thread_id, notice.into());
        }
    }

    /// Gives up `entries`, which can never be delivered: each is dropped
    /// with `why`, and whoever wrote them is told, in their topic
    /// (`in_topic`) or, when that is gone, in the chat outside the topics.
    /// Nothing the user wrote disappears without a word.
    pub(super) fn give_up(self: &Arc<Self>, entries: Vec<NewUpdate>, why: &str, in_topic: bool) {
        for (chat, thread, text) in self.drop_entries(entries, why, in_topic) {
            self.router.replies.say(self, chat, thread, text);
        }
    }

    /// [`Leader::give_up`], telling before it returns: for a flow after
    /// which this leader may step down (a disconnect of its own session),
    /// when a reply still on its way would be cancelled with the leader and
    /// the messages, already dropped, would go without a word.
    pub(super) async fn give_up_now(&self, entries: Vec<NewUpdate>, why: &str, in_topic: bool) {
        for (chat, thread, text) in self.drop_entries(entries, why, in_topic) {
            if let Err(e) = self.outbox.say(chat, thread, &text).await {
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
    ) -> Vec<(i64, Option<i64>, String)> {
        type Place = (i64, Option<i64>);
        let mut places: Vec<(Place, Vec<NewUpdate>)> = Vec::new();
        for entry in entries {
            if let Err(e) = self.store().mark_dropped(entry.update_id, why) {
                tracing::error!("cannot drop update {}: {e}", entry.update_id);
                continue;
            }
            tracing::warn!(update_id = entry.update_id, "a message is given up: {why}");
            let place = (entry.chat_id, entry.thread_id.filter(|_| in_topic));
            match places.iter_mut().find(|(p, _)| *p == place) {
                Some((_, list)) => list.push(entry),
                None => places.push((place, vec![entry])),
            }
        }
        places
            .into_iter()
            .map(|((chat, thread), list)| {
                let first = crate::policy::clip(list[0].text.trim(), QUOTE);
                let text = match list.len() {
                    1 => format!("⚠️ Your message “{first}” reached no agent: {why}."),
                    n => format!(
                        "⚠️ {n} of your messages reached no agent, the first “{first}”: {why}."
                    ),
                };
                (chat, thread, text)
            })
            .collect()
    }

    /// Whether `update` is a reply that answers an open free-text ask; the
    /// answer is shown on the question then.
    fn answers_ask(self: &Arc<Self>, update: &NewUpdate) -> bool {
        let detail = MessageDetail::of(update);
        let Some(message_id) = detail.reply_to else {
            return false;
        };
        let key = Key::Reply {
            message_id,
            text: &update.text,
        };
        let name = detail
            .from
            .unwrap_or_else(|| format!("user {}", update.user_id));
        match self
            .asks
            .take(key, update.chat_id, update.thread_id, update.user_id, &name)
        {
            Taken::Answered {
                target,
                message_id,
                text,
                label,
                ..
            } => {
                self.show_answer(target, &[message_id], text, label, name, None);
                true
            }
            Taken::Settled | Taken::Unknown => false,
        }
    }

    /// A tap on a button: asks are the only buttons there are.
    fn tap(self: &Arc<Self>, query: &CallbackQuery) {
        let replies = &self.router.replies;
        if query.from.is_bot || !self.access.is_allowed(query.from.id) {
            // Every tap is answered, or the phone shows a spinner; a
            // stranger's taps at most once a window.
            if replies.admit(query.from.id, Refusal::Tap) {
                replies.answer_tap(
                    self,
                    query.id.clone(),
                    "You are not allowed to use these buttons.",
                );
            }
            return;
        }
        let button = query.data.as_deref().and_then(asks::parse_button);
        let taken = match (button, &query.message) {
            (Some((token, choice)), Some(message)) => self.asks.take(
                Key::Tap {
                    token,
                    message_id: message.message_id,
                    choice,
                },
                message.chat.id,
                message.topic(),
                query.from.id,
                &query.from.first_name,
            ),
            _ => Taken::Unknown,
        };
        match taken {
            Taken::Answered {
                target,
                message_id,
                copy,
                text,
                label,
            } => {
                tracing::info!(
                    target: "audit",
                    user = query.from.id,
                    message_id,
                    answer = %label,
                    "a question was answered from the phone"
                );
                let messages: Vec<i64> = std::iter::once(message_id).chain(copy).collect();
                self.show_answer(
                    target,
                    &messages,
                    text,
                    label,
                    query.from.first_name.clone(),
                    Some(query.id.clone()),
                );
            }
            Taken::Settled => replies.answer_tap(self, query.id.clone(), "Already answered."),
            Taken::Unknown => {
                replies.answer_tap(self, query.id.clone(), "This question is no longer open.")
            }
        }
    }

    /// Shows who answered a question, with what and when, and answers the
    /// tap, off the routing path.
    fn show_answer(
        self: &Arc<Self>,
        target: Target,
        messages: &[i64],
        text: String,
        label: String,
        who: String,
        tap: Option<String>,
    ) {
        let leader = self.clone();
        let outcome = format!(
            "<b>{}</b> — {}, {}",
            render::escape(&label),
            render::escape(&who),
            clock()
        );
        let messages = messages.to_vec();
        tokio::spawn(async move {
            if let Some(tap) = tap
                && let Err(e) = leader
                    .outbox
                    .answer_callback(&tap, Some(&label), false)
                    .await
            {
                tracing::debug!("cannot answer a tap: {e}");
            }
            for message_id in messages {
                leader.settle_ask(target, message_id, &text, &outcome).await;
            }
        });
    }

    /// Closes the asks past their expiry and shows it on their messages.
    pub(super) fn expire_asks(self: &Arc<Self>) {
        for (target, message_id, text) in self.asks.sweep() {
            let leader = self.clone();
            tokio::spawn(async move {
                leader
                    .settle_ask(
                        target,
                        message_id,
                        &text,
                        "⌛ <i>Expired: nobody answered.</i>",
                    )
                    .await;
            });
        }
    }

    /// Updates that are not for a session: pairing, messages outside any
    /// session's topic, taps nobody can take. Never awaits.
    fn answer_directly(self: &Arc<Self>, update: Update) {
        match update.kind {
            UpdateKind::Message(message) | UpdateKind::EditedMessage(message) => {
                self.answer_message(&message)
            }
            UpdateKind::CallbackQuery(query) => self.tap(&query),
            UpdateKind::Unknown { .. } => {}
        }
    }

    fn answer_message(self: &Arc<Self>, message: &Message) {
        let Some(user) = message.from.as_ref().filter(|u| !u.is_bot) else {
            return;
        };
        let text = message.text.as_deref().unwrap_or_default().trim();
        let private = message.chat.kind == ChatKind::Private;
        let allowed = self.access.is_allowed(user.id);
        let mut greeting = "";
        if private && let Some(code) = text.strip_prefix("/start") {
            let code = code.trim();
            // A user who may already drive sessions does not spend the
            // code (someone else may be about to use it): they are told.
            if !code.is_empty() && !allowed {
                self.pair_user(user.id, message.chat.id, code);
                return;
            }
            if allowed {
                greeting = "You are already paired with this bot.\n";
            }
        }
        // Service messages (a topic made, a member joined) have neither.
        if !allowed || (text.is_empty() && message.media().is_none()) {
            return;
        }
        // The session list names local paths: only where the relay lives,
        // never in some other group an allowed user happens to be in.
        let ours = private || Some(message.chat.id) == self.chat_id;
        let mut prefix = greeting.to_string();
        if message.topic().is_some() {
            prefix
                .push_str("This topic belongs to no session, so your message reached no agent.\n");
        }
        if ours && self.cluster.is_some() {
            let (chat, thread) = (message.chat.id, message.topic());
            self.router.replies.spawn(self, move |leader| async move {
                let reply = format!("{prefix}{}", leader.overview_everywhere().await);
                if let Err(e) = leader.outbox.say(chat, thread, &reply).await {
                    tracing::warn!(chat, "cannot answer: {e}");
                }
            });
        } else if ours {
            let reply = format!("{prefix}{}", self.sessions_overview());
            self.router
                .replies
                .say(self, message.chat.id, message.topic(), reply);
        }
    }

    fn pair_user(self: &Arc<Self>, user: i64, chat: i64, code: &str) {
        let reply = match self.access.pair(&self.store, user, code) {
            Ok(true) => {
                tracing::info!(user, "paired a Telegram user");
                self.registry
                    .broadcast(&FromLeader::Paired(Paired { user_id: user }));
                "✅ Paired. Your agent sessions will appear here as topics."
            }
            Ok(false) => {
                if !self.router.replies.admit(chat, Refusal::Guess) {
                    return;
                }
                "That pairing code is wrong or has expired. Run /telegram-connect in your agent for a new link."
            }
            Err(e) => {
                tracing::error!("cannot store the paired user: {e}");
                "⚠️ Pairing failed: the relay could not save it. Try /telegram-connect again."
            }
        };
        self.router.replies.say(self, chat, None, reply.into());
    }

    fn sessions_overview(&self) -> String {
        let status = match self.status() {
            Ok(status) => status,
            Err(e) => return format!("The relay cannot list its sessions: {}", e.message),
        };
        if status.sessions.is_empty() {
            return "No agent sessions are connected. Run /telegram-connect in one.".into();
        }
        let mut out = String::from("Write in a session's topic to talk to it:\n");
        for s in &status.sessions {
            let state = if s.live { "live" } else { "offline" };
            out.push_str(&format!("• {} — {state} — {}\n", s.topic_name, s.cwd));
        }
        out.trim_end().to_string()
    }

    /// Writes a batch of acknowledgements: pending → delivered, each only for
    /// the session that owns the entry.
    pub(super) fn settle(&self, acks: &[(String, i64)]) {
        match self.store().mark_delivered(acks) {
            Ok(changed) if changed < acks.len() => tracing::debug!(
                acks = acks.len(),
                changed,
                "some acknowledgements were repeats or not the session's own"
            ),
            Ok(_) => {}
            Err(e) => tracing::error!("cannot settle {} deliveries: {e}", acks.len()),
        }
    }
}

/// What a refusal is for, each with its own allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Refusal {
    /// A wrong pairing code.
    Guess,
    /// A tap by somebody who may not tap.
    Tap,
}

/// The window in which a chat gets at most one refusal of a kind.
const REFUSAL_WINDOW: Duration = Duration::from_secs(600);
/// Refusals a chat may earn before it hears nothing at all for a window.
const MAX_REFUSALS: u32 = 3;
/// Answers waiting to be written, at most; beyond, they are dropped (and
/// logged): the relay owes strangers nothing, and its users come first.
const MAX_WAITING_REPLIES: usize = 64;

/// The leader's own answers, written by short tasks off the routing path,
/// bounded in number, with a refusal allowance per chat.
pub(super) struct Replies {
    waiting: Arc<Semaphore>,
    refusals: Mutex<HashMap<(i64, Refusal), (Instant, u32)>>,
}

impl Default for Replies {
    fn default() -> Self {
        Self {
            waiting: Arc::new(Semaphore::new(MAX_WAITING_REPLIES)),
            refusals: Mutex::default(),
        }
    }
}

impl Replies {
    /// Whether `chat` may get a refusal of `kind` now: one per window, and
    /// none at all once it kept trying past [`MAX_REFUSALS`].
    pub fn admit(&self, chat: i64, kind: Refusal) -> bool {
        let mut refusals = self.refusals.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        refusals.retain(|_, (since, _)| now.duration_since(*since) < REFUSAL_WINDOW);
        let (since, count) = refusals.entry((chat, kind)).or_insert((now, 0));
        *count += 1;
        if *count > MAX_REFUSALS {
            // Keeps guessing: the window starts again with every try.
            *since = now;
        }
        *count == 1
    }

    pub fn say(&self, leader: &Arc<Leader>, chat: i64, thread: Option<i64>, text: String) {
        self.spawn(leader, move |leader| async move {
            if let Err(e) = leader.outbox.say(chat, thread, &text).await {
                tracing::warn!(chat, "cannot answer: {e}");
            }
        });
    }

    pub fn answer_tap(&self, leader: &Arc<Leader>, callback_id: String, text: &'static str) {
        self.spawn(leader, move |leader| async move {
            if let Err(e) = leader
                .outbox
                .answer_callback(&callback_id, Some(text), false)
                .await
            {
                tracing::debug!("cannot answer a tap: {e}");
            }
        });
    }

    pub fn spawn<F, Fut>(&self, leader: &Arc<Leader>, answer: F)
    where
        F: FnOnce(Arc<Leader>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send,
    {
        let Ok(permit) = self.waiting.clone().try_acquire_owned() else {
            tracing::warn!("too many answers waiting; dropping one");
            return;
        };
        let leader = leader.clone();
        let stop = leader.stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = answer(leader) => {}
                () = stop.cancelled() => {}
            }
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_gets_one_refusal_per_window_and_silence_when_it_keeps_trying() {
        let replies = Replies::default();
        assert!(replies.admit(5, Refusal::Guess));
        assert!(!replies.admit(5, Refusal::Guess), "once per window");
        assert!(replies.admit(5, Refusal::Tap), "each kind has its own");
        assert!(replies.admit(6, Refusal::Guess), "each chat has its own");
        for _ in 0..10 {
            assert!(!replies.admit(5, Refusal::Guess));
        }
    }
}

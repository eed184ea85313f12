//! The outbox of record at work (docs/DESIGN.md, *Outbound*): what
//! sessions hand over (`post`) is written to the store, on disk, before
//! the session hears it was taken, and the courier sends it from there.
//! A session never waits for Telegram, and a process that dies the moment
//! after it handed an answer over loses nothing: whichever process leads
//! next sends it (a last process's drain included, `cli::drain`).
//!
//! Entries go in order, one *lane* per place (a session's topic as it is
//! when the entry goes, or a fixed chat), each lane a task of its own so a
//! paced chat never holds another up. Answers that wait for the chat's
//! budget together go out as one message when they fit in one.
//!
//! An entry is marked `sending`, durably, before its call is made. When
//! Telegram left the fate open, or a leader died mid-call (its successor
//! finds the entry `sending`), it is never sent again blindly: a duplicate
//! is worse than a gap the user is told of. Such an entry, and one
//! Telegram refused for good, is kept and offered in its topic with a
//! button that sends it again (an ask of the leader's); `/resend` sends
//! every kept one of the session. A notice that cannot be posted either is
//! counted in the session's status line and tried again once anything
//! reaches the topic.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::asks::Asks;
use super::context::Context;
use super::failure::store_error;
use super::failure::{Failure, FailureKind, Performed};
use super::outbox::{Pace, Upload};
use super::registry::ConnId;
use crate::ids::Place;
use crate::protocol::bus::*;
use crate::render;
use crate::store::{EntryKind, EntryState, Lane, NewOutboxEntry, OutboxEntry};
use crate::telegram::types::{
    EditMessageText, InlineKeyboardButton, InlineKeyboardMarkup, LinkPreviewOptions, ParseMode,
    ReplyParameters, SendMessage,
};
use crate::telegram::{BotCall, Priority, UploadSource};

/// How often the courier looks at lanes that could not go on (no topic,
/// Telegram unreachable) when nothing wakes it sooner.
const RETRY_EVERY: Duration = Duration::from_secs(5);
/// How long a notice's button works.
const OFFER_FOR: Duration = Duration::from_secs(12 * 3600);
/// How much of a message its notice quotes, so the user knows which.
const QUOTE: usize = 80;
/// What stands between texts that went out as one message.
const MERGED: &str = "\n\n";

/// How long a leader that leaves lets the calls already on their way to
/// Telegram finish: cut off, their messages would be of unknown fate.
const LAND_WITHIN: Duration = Duration::from_secs(5);

/// The courier's own state; the entries are in the store.
pub(super) struct Courier {
    cx: Arc<Context>,
    /// Notices of what did not arrive are questions with a button.
    asks: Arc<Asks>,
    /// Lanes with a task sending now.
    busy: Mutex<HashSet<Lane>>,
    /// The open notices, by entry: their ask's token.
    offers: Mutex<HashMap<i64, String>>,
    /// The leader leaves: no call starts any more, and one still waiting
    /// for the chat's budget is given up (its entries wait in the store).
    leaving: CancellationToken,
    /// The lanes stop, whatever they were doing (after [`Courier::land`]).
    halt: CancellationToken,
    /// Calls on their way to Telegram now.
    flying: AtomicUsize,
    landed: Notify,
}

impl Courier {
    pub fn new(cx: Arc<Context>, asks: Arc<Asks>) -> Self {
        Self {
            cx,
            asks,
            busy: Mutex::default(),
            offers: Mutex::default(),
            leaving: CancellationToken::new(),
            halt: CancellationToken::new(),
            flying: AtomicUsize::new(0),
            landed: Notify::new(),
        }
    }

    /// Stops starting calls, waits (up to [`LAND_WITHIN`]) until those on
    /// their way were answered, and stops the lanes. Calls that had not
    /// left yet are pending again for the next leader.
    pub async fn land(&self) {
        self.land_within(LAND_WITHIN).await;
        self.halt.cancel();
    }

    async fn land_within(&self, within: Duration) {
        self.leaving.cancel();
        let all_landed = async {
            loop {
                let landed = self.landed.notified();
                if self.flying.load(Ordering::Acquire) == 0 {
                    return;
                }
                landed.await;
            }
        };
        if tokio::time::timeout(within, all_landed).await.is_err() {
            tracing::warn!(
                "a message was still on its way to Telegram when this leader left; the next leader offers it"
            );
        }
    }

    /// Something new to send, or a place that may be reachable again.
    pub fn wake(&self) {
        self.cx.speaker.handed_over().notify_one();
    }

    fn busy(&self) -> std::sync::MutexGuard<'_, HashSet<Lane>> {
        self.busy.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn offers(&self) -> std::sync::MutexGuard<'_, HashMap<i64, String>> {
        self.offers.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Courier {
    /// Takes a session's items for its topic: checked, then on disk before
    /// this returns.
    pub(super) async fn post(&self, conn: ConnId, req: &Post) -> Result<Posted, BusError> {
        let session = self.cx.registry.session(conn, req.generation)?;
        let profile = session.route.profile_key;
        let mut posts = Vec::with_capacity(req.items.len());
        for (i, item) in req.items.iter().enumerate() {
            // The same hand-over again (its acknowledgement was lost) finds
            // the entries it made: an instance's hands are numbered.
            let origin = req
                .hand
                .map(|hand| format!("{}:{hand}:{i}", session.instance_id));
            posts.push(self.checked_post(&profile, session.route.target, item, origin)?);
        }
        let ids = self.cx.speaker.hand_over(posts).await?;
        Ok(Posted { ids })
    }

    /// One item as an entry of the outbox, after the checks a request in
    /// the topic passes (a message edited or replied to is the session's).
    ///
    /// Long because it is the one match over [`PostItem`]: each kind's checks
    /// beside the entry it becomes.
    fn checked_post(
        &self,
        profile: &str,
        target: Option<Target>,
        item: &PostItem,
        origin: Option<String>,
    ) -> Result<NewOutboxEntry, BusError> {
        let own = |message_id| match target {
            Some(target) => self.cx.own_message(profile, target, message_id),
            None => Err(BusError::new(
                BusErrorCode::NoTopic,
                "this session has no topic yet",
            )),
        };
        let html = |format: &TextFormat| *format == TextFormat::Html;
        let (kind, body, html) = match item {
            PostItem::Text {
                text,
                format,
                reply_to,
                merge,
            } => {
                if let Some(reply_to) = reply_to {
                    own(*reply_to)?;
                }
                let kind = EntryKind::Text {
                    reply_to: *reply_to,
                    merge: *merge,
                };
                (kind, text.clone(), html(format))
            }
            PostItem::Edit {
                message_id,
                text,
                format,
            } => {
                own(*message_id)?;
                let kind = EntryKind::Edit {
                    message_id: *message_id,
                    settled: None,
                };
                (kind, text.clone(), html(format))
            }
            PostItem::Document {
                name,
                text,
                caption,
            } => {
                if text.len() > MAX_INLINE_FILE {
                    let (size, limit) =
                        crate::files::describe_against(text.len() as u64, MAX_INLINE_FILE as u64);
                    return Err(BusError::new(
                        BusErrorCode::FileTooBig,
                        format!("an inline file is at most {limit}; this one is {size}"),
                    ));
                }
                let kind = EntryKind::Document {
                    file_name: crate::files::safe_name(name).unwrap_or_else(|| "answer.txt".into()),
                    caption: caption.clone(),
                };
                (kind, text.clone(), false)
            }
        };
        if body.trim().is_empty() && !matches!(kind, EntryKind::Document { .. }) {
            return Err(BusError::new(BusErrorCode::BadFrame, "an empty message"));
        }
        Ok(NewOutboxEntry {
            lane: Lane::Session(profile.to_string()),
            kind,
            body,
            html,
            origin,
        })
    }

    /// `/resend`: every entry of the session that did not arrive goes again.
    pub(super) async fn resend(&self, conn: ConnId, req: &Resend) -> Result<Resent, BusError> {
        let profile = self
            .cx
            .registry
            .session(conn, req.generation)?
            .route
            .profile_key;
        let count = self
            .cx
            .store()
            .posts_again(&profile, None)
            .map_err(store_error)?;
        let kept: Vec<(i64, String)> = self.offers().drain().collect();
        for (id, token) in kept {
            self.withdraw_offer(id, &token, &profile).await;
        }
        self.wake();
        self.report_outbox(&profile);
        Ok(Resent {
            count: count as u32,
        })
    }

    /// Tells the session of `profile` what the leader holds of its
    /// messages, when it is connected.
    pub(super) fn report_outbox(&self, profile: &str) {
        self.report_outbox_paced(profile, None);
    }

    fn report_outbox_paced(&self, profile: &str, paced: Option<Duration>) {
        let (waiting, undelivered) = {
            let store = self.cx.store();
            let waiting = store.posts_due().map_or(0, |due| {
                due.iter()
                    .filter(|p| p.new.lane == Lane::Session(profile.to_string()))
                    .count() as u32
            });
            (waiting, store.posts_unoffered(profile).unwrap_or(0))
        };
        let conn = self
            .cx
            .registry
            .lock()
            .owner_of(profile)
            .map(|(conn, _)| conn);
        if let Some(conn) = conn {
            self.cx.registry.send(
                conn,
                FromLeader::Outbox(OutboxReport {
                    waiting,
                    paced_ms: paced.map(|wait| wait.as_millis() as u64),
                    undelivered,
                }),
            );
        }
    }

    /// Messages waiting to go that have a place to go to now.
    pub fn sendable(&self) -> usize {
        let due = match self.cx.store().posts_due() {
            Ok(due) => due,
            Err(e) => {
                tracing::error!("cannot read the outbox: {e}");
                return 0;
            }
        };
        let lanes: HashSet<Lane> = due.iter().map(|p| p.new.lane.clone()).collect();
        let reachable: HashSet<Lane> = lanes
            .into_iter()
            .filter(|lane| self.place_of(lane).is_some())
            .collect();
        due.iter()
            .filter(|p| reachable.contains(&p.new.lane))
            .count()
    }

    /// Where a lane's entries go now; `None` while its session has no topic.
    pub(super) fn place_of(&self, lane: &Lane) -> Option<Place> {
        match lane {
            Lane::Fixed(place) => Some(*place),
            Lane::Session(profile) => {
                let live = self
                    .cx
                    .registry
                    .lock()
                    .owner_of(profile)
                    .and_then(|(_, s)| s.route.target);
                let target = match live {
                    Some(target) => Some(target),
                    // A session that is gone still gets what it handed over.
                    None => self
                        .cx
                        .store()
                        .binding(profile)
                        .ok()
                        .flatten()
                        .and_then(|b| {
                            (b.status == crate::store::BindingStatus::Active)
                                .then(|| b.target())
                                .flatten()
                        }),
                };
                target.map(Place::from)
            }
        }
    }
}

/// The courier's loop, for the leader's life: what a predecessor was
/// sending is of unknown fate now (offered, never sent again blindly);
/// then every lane with entries due gets a task.
pub(super) async fn run(courier: Arc<Courier>) {
    let orphaned = courier.cx.store().posts_orphaned();
    match orphaned {
        Ok(orphaned) => {
            for post in orphaned {
                tracing::warn!(
                    id = post.id,
                    "a message a previous leader was sending may be missing"
                );
                courier.offer(post.id).await;
            }
        }
        Err(e) => tracing::error!("cannot read the outbox: {e}"),
    }
    loop {
        let due = courier.cx.store().posts_due();
        match due {
            Ok(due) => {
                let lanes: Vec<Lane> = due.into_iter().map(|p| p.new.lane).collect();
                for lane in lanes {
                    if courier.busy().insert(lane.clone()) {
                        crate::tasks::spawn(send_lane(courier.clone(), lane));
                    }
                }
            }
            Err(e) => tracing::error!("cannot read the outbox: {e}"),
        }
        tokio::select! {
            () = courier.cx.stop.cancelled() => return,
            () = courier.cx.speaker.handed_over().notified() => {}
            () = tokio::time::sleep(RETRY_EVERY) => {}
        }
    }
}

/// Sends one lane's entries in order until none is left, or its place
/// cannot be reached now (the courier comes back to it).
async fn send_lane(courier: Arc<Courier>, lane: Lane) {
    tokio::select! {
        () = courier.halt.cancelled() => {}
        () = drain_lane(&courier, &lane) => {}
    }
    courier.busy().remove(&lane);
    if let Lane::Session(profile) = &lane {
        courier.report_outbox(profile);
    }
}

async fn drain_lane(courier: &Arc<Courier>, lane: &Lane) {
    while !courier.leaving.is_cancelled() {
        let due = match courier.cx.store().posts_due() {
            Ok(due) => due,
            Err(e) => {
                tracing::error!("cannot read the outbox: {e}");
                return;
            }
        };
        let mine: Vec<OutboxEntry> = due.into_iter().filter(|p| &p.new.lane == lane).collect();
        let Some(place) = courier.place_of(lane) else {
            return;
        };
        let batch = next_batch(&mine);
        if batch.is_empty() {
            return;
        }
        if !courier.send_batch(lane, place, &batch).await {
            return;
        }
    }
}

/// A batch marked `sending` in the store, until its call was answered.
/// Dropped unanswered (its leader left) before the call left for
/// Telegram, it is `pending` again: nothing can have been posted, and the
/// next leader sends it. Once the call left, it stays `sending`: the next
/// leader offers it, never replays it.
struct Going<'a> {
    courier: &'a Courier,
    ids: &'a [i64],
    departed: AtomicBool,
    settled: AtomicBool,
}

impl Going<'_> {
    /// The call leaves now.
    fn depart(&self) {
        if !self.departed.swap(true, Ordering::AcqRel) {
            self.courier.flying.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Ends when the leader leaves before this call left: a call on its
    /// way is let finish.
    async fn given_up(&self) {
        self.courier.leaving.cancelled().await;
        if self.departed.load(Ordering::Acquire) {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Going<'_> {
    fn drop(&mut self) {
        if self.departed.load(Ordering::Acquire) {
            self.courier.flying.fetch_sub(1, Ordering::AcqRel);
            self.courier.landed.notify_waiters();
        } else if !self.settled.load(Ordering::Acquire)
            && let Err(e) = self.courier.cx.store().posts_back(self.ids)
        {
            tracing::error!("cannot put back messages that did not go: {e}");
        }
    }
}

/// The entries that go as the next message: the first one, and when it is
/// an answer, the answers after it that fit in the same message.
fn next_batch(due: &[OutboxEntry]) -> Vec<OutboxEntry> {
    let Some(first) = due.first() else {
        return Vec::new();
    };
    let mergeable = |p: &OutboxEntry| {
        p.state == EntryState::Pending
            && p.new.html
            && matches!(
                p.new.kind,
                EntryKind::Text {
                    merge: true,
                    reply_to: None
                }
            )
    };
    let mut batch = vec![first.clone()];
    if !mergeable(first) {
        return batch;
    }
    let mut text = first.new.body.clone();
    for next in due[1..].iter().take_while(|p| mergeable(p)) {
        let joined = format!("{text}{MERGED}{}", next.new.body);
        if render::split(&joined, render::MESSAGE_LIMIT).len() > 1 {
            break;
        }
        text = joined;
        batch.push(next.clone());
    }
    batch
}

impl Courier {
    /// Sends one batch; false when the lane must stop for now. The call,
    /// the guard that keeps the entries' state true if the leader leaves
    /// meanwhile, and the settling belong together: the guard borrows
    /// across all three.
    async fn send_batch(
        self: &Arc<Self>,
        lane: &Lane,
        place: Place,
        batch: &[OutboxEntry],
    ) -> bool {
        let ids: Vec<i64> = batch.iter().map(|p| p.id).collect();
        if let Err(e) = self.cx.store().posts_sending(&ids) {
            tracing::error!("cannot mark messages as going: {e}");
            return false;
        }
        let going = Going {
            courier: self,
            ids: &ids,
            departed: AtomicBool::new(false),
            settled: AtomicBool::new(false),
        };
        let departing = || going.depart();
        let profile = match lane {
            Lane::Session(profile) => Some(profile.clone()),
            Lane::Fixed(_) => None,
        };
        if batch.len() > 1 {
            tracing::debug!(
                messages = batch.len(),
                "merged what waited for the chat's budget"
            );
        }
        let waiting = |wait: Duration| {
            if let Some(profile) = &profile {
                self.report_outbox_paced(profile, Some(wait));
            }
        };
        let priority = match batch[0].new.kind {
            EntryKind::Edit { .. } => Priority::Normal,
            _ => Priority::High,
        };
        let pace = Pace {
            waiting: &waiting,
            departing: &departing,
            ..Pace::of(priority)
        };
        let call = async {
            match (&batch[0].new.kind, place.thread_id) {
                (EntryKind::Document { file_name, caption }, Some(thread_id)) => {
                    let target = Target {
                        chat_id: place.chat_id,
                        thread_id,
                    };
                    going.depart();
                    self.send_document(target, &batch[0], file_name, caption)
                        .await
                }
                (EntryKind::Document { .. }, None) => Err(Failure::new(
                    FailureKind::Refused,
                    "a file goes into a topic only",
                )),
                _ => self.cx.outbox.call(call_for(place, batch), pace).await,
            }
        };
        let result = tokio::select! {
            biased;
            result = call => result,
            () = going.given_up() => return false,
        };
        going.settled.store(true, Ordering::Release);
        match profile {
            Some(profile) => {
                self.settle_batch(&profile, place.chat_id, &ids, result)
                    .await
            }
            None => self.settle_notice(&ids, result),
        }
    }

    /// A short file the session made (a long answer's code), as a
    /// document in `target`.
    async fn send_document(
        &self,
        target: Target,
        entry: &OutboxEntry,
        file_name: &str,
        caption: &Option<String>,
    ) -> Result<Performed, Failure> {
        let upload = Upload {
            source: UploadSource::Bytes(entry.new.body.clone().into_bytes()),
            file_name: file_name.to_string(),
            caption: caption.clone(),
            send_as: SendAs::Document,
            chosen: false,
        };
        self.cx
            .outbox
            .send_file(target, &upload)
            .await
            .map(|(performed, _)| performed)
    }

    /// Records how one of the leader's own notices went: sent, or (but
    /// for an unreachable Telegram, which is waited for) given up, logged.
    fn settle_notice(&self, ids: &[i64], result: Result<Performed, Failure>) -> bool {
        let recorded = match &result {
            Ok(performed) => self
                .cx
                .store()
                .posts_sent(ids, performed.reply.message_id()),
            Err(f) if f.kind == FailureKind::Unavailable => {
                // Waits for Telegram; the lane stops for now either way.
                if let Err(e) = self.cx.store().posts_back(ids) {
                    tracing::error!("cannot put a notice back in line: {e}");
                }
                return false;
            }
            Err(f) => {
                tracing::warn!("a notice of the relay's did not arrive: {f}");
                self.cx
                    .store()
                    .posts_missing(ids, EntryState::Failed, &f.message)
            }
        };
        match recorded {
            Ok(()) => true,
            Err(e) => {
                tracing::error!("cannot record how a notice went: {e}");
                false
            }
        }
    }

    /// Records how a batch of a session's went; false when the lane must
    /// stop for now.
    async fn settle_batch(
        self: &Arc<Self>,
        profile: &str,
        chat: i64,
        ids: &[i64],
        result: Result<Performed, Failure>,
    ) -> bool {
        let store_failed = |e| {
            tracing::error!("cannot record how messages went: {e}");
            false
        };
        match result {
            Ok(performed) => {
                let message_id = performed.reply.message_id();
                if let Err(e) = self.cx.store().posts_sent(ids, message_id) {
                    return store_failed(e);
                }
                if let Some(id) = message_id
                    && let Err(e) = self.cx.store().record_sent(chat, id, profile, None)
                {
                    tracing::warn!("cannot remember who posted message {id}: {e}");
                }
                // The topic can be reached: notices that could not be
                // posted are tried again.
                self.offer_unoffered(profile).await;
                true
            }
            Err(f) => {
                let missing = match f.kind {
                    FailureKind::CommitUnknown => EntryState::Unknown,
                    FailureKind::Refused | FailureKind::FileTooBig | FailureKind::Paced => {
                        EntryState::Failed
                    }
                    // Nothing was posted: the entries wait for the place to
                    // be reachable again.
                    kind => {
                        if let Err(e) = self.cx.store().posts_back(ids) {
                            return store_failed(e);
                        }
                        if kind == FailureKind::TopicGone {
                            self.topic_lost(profile);
                        }
                        tracing::info!("messages wait: {f}");
                        return false;
                    }
                };
                tracing::warn!(
                    messages = ids.len(),
                    "Telegram did not take a message ({f}); it is offered in its topic"
                );
                if let Err(e) = self.cx.store().posts_missing(ids, missing, &f.message) {
                    return store_failed(e);
                }
                for id in ids {
                    self.offer(*id).await;
                }
                true
            }
        }
    }

    /// The topic of `profile` is gone: its next registration makes a new
    /// one, and the session is told to register.
    fn topic_lost(&self, profile: &str) {
        self.cx.mark_stale(profile);
        let conns = self.cx.registry.lock();
        if let Some((conn, session)) = conns.owner_of(profile) {
            let thread_id = session.route.target.map_or(0, |t| t.thread_id);
            conns.push(conn, FromLeader::TopicGone(TopicGone { thread_id }));
        }
    }

    /// Offers an entry that did not arrive (or may not have) in its topic:
    /// a notice with a button that sends it again. Entries of the leader's
    /// own (a fixed place) are only logged.
    async fn offer(self: &Arc<Self>, id: i64) {
        let post = match self.cx.store().post_by_id(id) {
            Ok(Some(post)) => post,
            Ok(None) => return,
            Err(e) => {
                tracing::error!("cannot read a message that did not arrive: {e}");
                return;
            }
        };
        let Lane::Session(profile) = &post.new.lane else {
            tracing::warn!(id, why = ?post.why, "a notice of the relay's did not arrive");
            return;
        };
        if matches!(post.new.kind, EntryKind::Edit { .. }) {
            tracing::info!(id, why = ?post.why, "an edit did not arrive; the message stays as it was");
            return;
        }
        let target = match self.place_of(&post.new.lane) {
            Some(Place {
                chat_id,
                thread_id: Some(thread_id),
            }) => Target { chat_id, thread_id },
            _ => {
                self.not_offered(&post, profile);
                return;
            }
        };
        let token = uuid::Uuid::new_v4().simple().to_string();
        let ask = Ask {
            token: token.clone(),
            text: notice(&post),
            options: vec!["↻ Send it again".into()],
            free_text: false,
            expires_in_ms: OFFER_FOR.as_millis() as u64,
            concerns: Concerns::Anyone,
        };
        match self.asks.ask(profile, target, &ask).await {
            Ok(_) => {
                if let Err(e) = self.cx.store().posts_offered(&[id], true) {
                    tracing::warn!("cannot remember a notice was posted: {e}");
                }
                self.offers().insert(id, token.clone());
                self.report_outbox(profile);
                let courier = self.clone();
                let profile = profile.clone();
                crate::tasks::spawn(async move { courier.await_offer(id, token, profile).await });
            }
            Err(e) => {
                tracing::warn!("cannot offer a message again in its topic: {e}");
                self.not_offered(&post, profile);
            }
        }
    }

    fn not_offered(&self, post: &OutboxEntry, profile: &str) {
        if let Err(e) = self.cx.store().posts_offered(&[post.id], false) {
            tracing::warn!("cannot remember a notice was not posted: {e}");
        }
        self.report_outbox(profile);
    }

    /// Notices that could not be posted, tried again.
    async fn offer_unoffered(self: &Arc<Self>, profile: &str) {
        let kept = self.cx.store().posts_kept(profile);
        let Ok(kept) = kept else { return };
        for post in kept.into_iter().filter(|p| !p.offered) {
            self.offer(post.id).await;
        }
    }

    /// Waits for a notice's button: a tap sends the entry again.
    async fn await_offer(self: Arc<Self>, id: i64, token: String, profile: String) {
        let tapped = tokio::select! {
            () = self.cx.stop.cancelled() => return,
            tapped = self.asks.answered(&token, &profile) => match tapped {
                Some(tapped) => tapped,
                None => return,
            },
        };
        self.offers().remove(&id);
        if tapped {
            match self.cx.store().posts_again(&profile, Some(&[id])) {
                Ok(_) => self.wake(),
                Err(e) => tracing::error!("cannot send a message again: {e}"),
            }
        }
    }

    /// Closes a notice whose entry went again another way (`/resend`).
    async fn withdraw_offer(&self, id: i64, token: &str, profile: &str) {
        tracing::debug!(id, "withdrawing a notice");
        let close = CloseAsk {
            token: token.to_string(),
            message_id: 0,
            outcome: "↻ Sent again".into(),
        };
        let place = self.place_of(&Lane::Session(profile.to_string()));
        if let Some(Place {
            chat_id,
            thread_id: Some(thread_id),
        }) = place
        {
            let target = Target { chat_id, thread_id };
            if let Err(e) = self.asks.close_ask(profile, target, &close).await {
                tracing::debug!("cannot close a notice: {e}");
            }
        }
    }
}

/// The Bot API call for a batch of text entries, or an edit (a document
/// is an upload, `send_batch`).
fn call_for(place: Place, batch: &[OutboxEntry]) -> BotCall {
    let first = &batch[0].new;
    let parse_mode = first.html.then_some(ParseMode::Html);
    if let EntryKind::Edit {
        message_id,
        settled,
    } = &first.kind
    {
        return BotCall::EditMessageText(EditMessageText {
            chat_id: place.chat_id,
            message_id: *message_id,
            text: first.body.clone(),
            parse_mode,
            // A settled question keeps a button that cannot be pressed,
            // naming the decision (Bot API 10.3).
            reply_markup: settled.as_ref().map(|label| InlineKeyboardMarkup {
                inline_keyboard: vec![vec![InlineKeyboardButton::disabled(label.clone())]],
            }),
            link_preview_options: Some(LinkPreviewOptions::default()),
        });
    }
    let reply_to = match first.kind {
        EntryKind::Text { reply_to, .. } => reply_to,
        _ => None,
    };
    let text = batch
        .iter()
        .map(|p| p.new.body.as_str())
        .collect::<Vec<_>>()
        .join(MERGED);
    BotCall::SendMessage(SendMessage {
        chat_id: place.chat_id,
        message_thread_id: place.thread_id,
        text,
        parse_mode,
        reply_markup: None,
        reply_parameters: reply_to.map(|message_id| ReplyParameters {
            message_id,
            allow_sending_without_reply: true,
        }),
        // An agent's answer quoting a URL should not grow a card.
        link_preview_options: Some(LinkPreviewOptions::default()),
    })
}

/// The notice for an entry that did not arrive, or may not have.
fn notice(post: &OutboxEntry) -> String {
    let plain = if post.new.html {
        render::to_plain(&post.new.body)
    } else {
        post.new.body.clone()
    };
    let quote = crate::policy::clip(
        plain
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_default()
            .trim(),
        QUOTE,
    );
    let (head, tail) = if post.state == EntryState::Unknown {
        (
            "An answer may be missing",
            "Telegram did not confirm it, so it may or may not have arrived; sending it again could show it twice.",
        )
    } else {
        ("An answer could not be sent", "Nothing of it arrived.")
    };
    format!(
        "⚠️ <b>{head}</b> ({}): “{}”\n{tail} Tap to send it again, or write /resend.",
        render::escape(post.why.as_deref().unwrap_or("no reason given")),
        render::escape(&quote)
    )
}

//! The leader's long poll (docs/DESIGN.md, "Inbound").
//!
//! Each `getUpdates` batch is written to the inbound journal and the offset
//! advanced in one SQLite transaction *before* anything is routed, so a
//! leader that dies mid-batch loses nothing: its successor either finds the
//! batch journaled or fetches it again from the old offset. Updates are
//! decoded one by one; an unknown or broken one is skipped and the offset
//! still moves past it. The poller never gives up: a 409 (another poller),
//! 5xx or network failure backs off and tries again.
//!
//! It also watches that it hears what Telegram holds: after a poll that
//! came back empty it asks `getWebhookInfo`; updates pending twice in a row
//! behind empty polls mean the poll is alive but deaf (a proxy that broke
//! the connection, a stuck long poll). That shows as [`PollHealth::Deaf`],
//! and the poll restarts: a fresh HTTP client, `deleteWebhook` again, a new
//! poll. A long poll that times out gets fresh connections as well.
//!
//! A webhook (set by another program) and long polling exclude each other.
//! The poll does not delete one up front: a new leader's first request is
//! its `getUpdates`, and only Telegram's 409 "can't use getUpdates method
//! while webhook is active" makes it call `deleteWebhook` (pending updates
//! kept) and poll again at once; a webhook that comes back before a poll
//! got through counts as a conflict and backs off.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::batch::{Batch, route_then_flush};
use super::triage::Triage;
use crate::backoff::Backoff;
use crate::store::{Store, StoreError};
use crate::telegram::{BotApi, TelegramError, Update};

/// Seconds Telegram may hold one long poll open.
pub const POLL_TIMEOUT_S: u32 = 30;

/// How long a long poll must stay open before it counts as healthy.
const HEALTHY_AFTER: Duration = Duration::from_secs(2);

/// How long a stepping-down leader waits for its long poll to end.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Telegram holds an empty long poll until its timeout; an empty answer
/// much sooner is not a normal one.
const EARLY: Duration = Duration::from_secs(POLL_TIMEOUT_S as u64 / 2);

/// Checks in a row that found updates pending behind empty polls before
/// the poll counts as deaf (one alone may be an update that just arrived).
const DEAF_AFTER: u32 = 2;

/// How the poll is doing, for the status line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PollHealth {
    /// Not polled yet.
    Starting,
    Ok,
    /// Telegram's 409: another process polls this bot.
    Conflict,
    /// Telegram cannot be reached or answers with errors.
    Offline(String),
    /// Telegram rejected the token (401).
    Unauthorized,
    /// Polls come back empty while this many updates wait at Telegram.
    Deaf(u32),
}

/// What `/relay status` shows about the poll besides its health.
#[derive(Debug, Default)]
pub(super) struct PollFacts {
    /// When `getUpdates` last answered.
    pub last_ok: Option<Instant>,
    /// What `getWebhookInfo` last said was waiting.
    pub pending: Option<u32>,
    /// Restarts because the poll heard nothing.
    pub restarts: u32,
}

/// Where a polled batch goes before the next `getUpdates` confirms it:
/// this machine's journal ([`LocalJournal`]), or, while this machine polls
/// for a cluster, the cluster's stream (`cluster/poll.rs`).
pub(super) trait Journal: Send {
    /// The offset of the next `getUpdates`.
    fn offset(&self) -> Result<Option<i64>, StoreError>;

    /// Makes `raw` durable (and routes what is this machine's), or says why
    /// it cannot be confirmed.
    fn journal(
        &mut self,
        raw: Vec<Value>,
    ) -> impl std::future::Future<Output = Result<Step, StoreError>> + Send;
}

/// What the poller does after a batch.
pub(super) enum Step {
    /// Durable: the next poll confirms it.
    Confirm,
    /// Not durable (the stream failed): the next poll fetches it again.
    Again,
    /// Stop polling: another poller took over (a newer lease term), or the
    /// runtime is shutting down and the batch is not on disk.
    Stop,
}

/// A single machine's journal: the batch and the offset in one
/// transaction, routed, then synced before the next poll.
pub(super) struct LocalJournal {
    pub store: Arc<Mutex<Store>>,
    pub triage: Triage,
    pub batches: mpsc::Sender<Batch>,
}

impl Journal for LocalJournal {
    fn offset(&self) -> Result<Option<i64>, StoreError> {
        self.store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .offset()
    }

    async fn journal(&mut self, raw: Vec<Value>) -> Result<Step, StoreError> {
        let Some(last) = raw.iter().filter_map(update_id_of).max() else {
            if !raw.is_empty() {
                tracing::warn!("a batch of {} updates without readable ids", raw.len());
            }
            return Ok(Step::Confirm);
        };
        let batch = Batch::sorted(&mut self.triage, decoded(&raw).map(|update| (update, true)));
        // Committed at once, flushed after routing: routing does not wait
        // for the disk. The next getUpdates confirms this batch to Telegram,
        // which then forgets it: it must be on disk first. A flush the
        // runtime cancelled (shutting down) leaves the batch unconfirmed,
        // and Telegram keeps it.
        let written = self
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .journal_batch_unflushed(batch.journaled.iter().map(|e| &e.update), last + 1)?;
        if crate::logging::milestones_on() {
            for entry in &batch.journaled {
                crate::logging::milestone("journaled", entry.update.update_id);
            }
        }
        Ok(if route_then_flush(&self.batches, batch, written).await? {
            Step::Confirm
        } else {
            Step::Stop
        })
    }
}

/// The updates of a raw batch that decode; the others are skipped (the
/// offset still moves past them).
pub(super) fn decoded(raw: &[Value]) -> impl Iterator<Item = Update> + '_ {
    raw.iter().filter_map(|value| match Update::decode(value) {
        Ok(update) => Some(update),
        Err(e) => {
            tracing::warn!("skipping an update: {e}");
            None
        }
    })
}

pub(super) struct Poller<J> {
    pub api: BotApi,
    pub journal: J,
    pub health: watch::Sender<PollHealth>,
    pub facts: Arc<Mutex<PollFacts>>,
    pub stop: CancellationToken,
}

pub(super) fn update_id_of(value: &Value) -> Option<i64> {
    value.get("update_id").and_then(Value::as_i64)
}

impl<J: Journal> Poller<J> {
    fn facts(&self) -> std::sync::MutexGuard<'_, PollFacts> {
        self.facts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Polls until `stop` is cancelled. Returns only then, or when the store
    /// fails (the leader must not go on without its journal).
    pub async fn run(mut self) -> Result<(), StoreError> {
        let mut waits = Waits::new();
        crate::logging::milestone("poller", 0);
        while !self.stop.is_cancelled() {
            let offset = self.journal.offset()?;
            crate::logging::milestone("poll", offset.unwrap_or(0));
            let asked = Instant::now();
            let Some(polled) = self.poll(offset, &mut waits).await else {
                return Ok(());
            };
            let wait = match polled {
                Ok(raw) if raw.is_empty() => match self.heard_nothing(asked, &mut waits).await {
                    Some(wait) => wait,
                    None => continue,
                },
                Ok(raw) => {
                    if crate::logging::milestones_on() {
                        for id in raw.iter().filter_map(update_id_of) {
                            crate::logging::milestone("polled", id);
                        }
                    }
                    waits.heard();
                    self.facts().last_ok = Some(Instant::now());
                    self.health
                        .send_if_modified(|h| set_if_changed(h, PollHealth::Ok));
                    match self.journal.journal(raw).await? {
                        Step::Confirm | Step::Again => {}
                        Step::Stop => self.stop.cancel(),
                    }
                    continue;
                }
                Err(e) if webhook_active(&e) && !waits.webhook_deleted => {
                    tracing::warn!("a webhook is set for this bot; deleting it to poll ({e})");
                    self.delete_webhook(&mut waits.failure).await;
                    waits.webhook_deleted = true;
                    continue;
                }
                Err(e) => self.failed(e, &mut waits),
            };
            tokio::select! {
                () = self.stop.cancelled() => break,
                () = tokio::time::sleep(wait) => {}
            }
        }
        Ok(())
    }

    /// One long poll from `offset`; `None` when the leader stops meanwhile
    /// (the poll is ended first). While it is open long enough, the health
    /// turns good again.
    async fn poll(
        &mut self,
        offset: Option<i64>,
        waits: &mut Waits,
    ) -> Option<Result<Vec<Value>, TelegramError>> {
        // A handle of its own, so the poll does not borrow `self`.
        let api = self.api.clone();
        let poll = api.get_updates(offset, POLL_TIMEOUT_S, 100);
        tokio::pin!(poll);
        // A long poll that Telegram keeps open is itself the proof that
        // polling works again: no need to wait for traffic to say so.
        let healthy_after = tokio::time::sleep(HEALTHY_AFTER);
        tokio::pin!(healthy_after);
        loop {
            tokio::select! {
                polled = &mut poll => return Some(polled),
                () = &mut healthy_after, if *self.health.borrow() != PollHealth::Ok => {
                    // An open poll proves nothing about deafness; that
                    // nothing waits at Telegram does.
                    let deaf = matches!(*self.health.borrow(), PollHealth::Deaf(_));
                    if !deaf || self.pending().await == Some(0) {
                        waits.deaf_checks = 0;
                        self.health.send_if_modified(|h| set_if_changed(h, PollHealth::Ok));
                    }
                }
                () = self.stop.cancelled() => {
                    self.end_long_poll(poll, offset).await;
                    return None;
                }
            }
        }
    }

    /// An empty answer: is the poll deaf (updates wait at Telegram all the
    /// same)? Restarts it if so. `None`: poll again at once; else how long
    /// to wait first.
    async fn heard_nothing(&mut self, asked: Instant, waits: &mut Waits) -> Option<Duration> {
        waits.conflict.reset();
        waits.failure.reset();
        waits.webhook_deleted = false;
        self.facts().last_ok = Some(Instant::now());
        let pending = self.pending().await.unwrap_or(0);
        if pending > 0 {
            waits.deaf_checks += 1;
        } else {
            waits.deaf_checks = 0;
        }
        if waits.deaf_checks >= DEAF_AFTER {
            self.health
                .send_if_modified(|h| set_if_changed(h, PollHealth::Deaf(pending)));
            // Restarted at once, then less and less often while it stays
            // deaf; polling itself goes on meanwhile.
            if Instant::now() >= waits.restart_at {
                tracing::warn!(
                    pending,
                    "getUpdates hears nothing while updates wait; restarting the poll"
                );
                self.restart(&mut waits.failure).await;
                waits.restart_at = Instant::now() + waits.deafness.step();
            }
        } else if waits.deaf_checks == 0 {
            waits.deafness.reset();
            waits.restart_at = Instant::now();
            self.health.send_if_modified(|h| {
                matches!(h, PollHealth::Deaf(_)) && set_if_changed(h, PollHealth::Ok)
            });
        }
        // An empty answer long before the poll's timeout is no long poll:
        // do not spin on it.
        if asked.elapsed() < EARLY {
            Some(waits.early.step())
        } else {
            waits.early.reset();
            None
        }
    }

    /// A failed poll: what the health says, and how long to wait.
    fn failed(&mut self, error: TelegramError, waits: &mut Waits) -> Duration {
        let health = match &error {
            TelegramError::RateLimited { retry_after } => return *retry_after,
            TelegramError::Conflict { .. } => {
                if webhook_active(&error) {
                    // Set again before a poll got through: deleted once
                    // more after the wait (`run`).
                    tracing::warn!("409: another program keeps setting a webhook for this bot");
                    waits.webhook_deleted = false;
                } else {
                    tracing::warn!("409 conflict: another process polls this bot");
                }
                self.health
                    .send_if_modified(|h| set_if_changed(h, PollHealth::Conflict));
                return waits.conflict.step();
            }
            TelegramError::Unauthorized => {
                tracing::error!("Telegram rejected the bot token");
                PollHealth::Unauthorized
            }
            TelegramError::Timeout { .. } => {
                // Telegram answers a long poll at its timeout: one that did
                // not answer at all hangs on a broken connection.
                tracing::warn!(
                    "getUpdates got no answer ({error}); polling over fresh connections"
                );
                self.reconnect();
                PollHealth::Offline(error.to_string())
            }
            _ => {
                tracing::warn!("getUpdates failed: {error}");
                PollHealth::Offline(error.to_string())
            }
        };
        self.health.send_if_modified(|h| set_if_changed(h, health));
        waits.failure.step()
    }

    /// Ends our own long poll on Telegram's side before the leader lets go of
    /// the lock: a short poll at the same offset makes Telegram terminate the
    /// long one, so the next leader's poll never overlaps it. Nothing new is
    /// confirmed (same offset) and whatever the short poll returns is left to
    /// the next leader, which polls from the journaled offset.
    async fn end_long_poll(
        &self,
        long: impl std::future::Future<Output = Result<Vec<Value>, TelegramError>>,
        offset: Option<i64>,
    ) {
        let short = self.api.get_updates(offset, 0, 1);
        if tokio::time::timeout(STOP_GRACE, futures::future::join(long, short))
            .await
            .is_err()
        {
            tracing::warn!("the long poll did not end within {STOP_GRACE:?}; leaving anyway");
        }
    }

    /// How many updates wait at Telegram, remembered for `/relay status`;
    /// `None` when it cannot be asked.
    async fn pending(&self) -> Option<u32> {
        let asked = tokio::select! {
            () = self.stop.cancelled() => return None,
            info = self.api.get_webhook_info() => info,
        };
        match asked {
            Ok(info) => {
                self.facts().pending = Some(info.pending_update_count);
                Some(info.pending_update_count)
            }
            Err(e) => {
                tracing::debug!("getWebhookInfo failed: {e}");
                None
            }
        }
    }

    /// Polls over fresh connections.
    fn reconnect(&mut self) {
        match self.api.reconnected() {
            Ok(api) => self.api = api,
            Err(e) => tracing::warn!("cannot make a fresh HTTP client: {e}"),
        }
    }

    /// Restarts a poll that hears nothing: fresh connections, the webhook
    /// deleted again (another program may have set one), then a new poll.
    async fn restart(&mut self, backoff: &mut Backoff) {
        self.facts().restarts += 1;
        self.reconnect();
        self.delete_webhook(backoff).await;
    }

    /// Long polling and a webhook exclude each other; pending updates are kept.
    async fn delete_webhook(&self, backoff: &mut Backoff) {
        loop {
            let result = tokio::select! {
                () = self.stop.cancelled() => return,
                r = self.api.delete_webhook(false) => r,
            };
            match result {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!("deleteWebhook failed: {e}");
                    self.health.send_if_modified(|h| {
                        set_if_changed(h, PollHealth::Offline(e.to_string()))
                    });
                    let wait = e.retry_after().unwrap_or_else(|| backoff.step());
                    tokio::select! {
                        () = self.stop.cancelled() => return,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }
}

/// How long the poller waits, by what went wrong, and what it knows of a
/// deaf poll.
struct Waits {
    conflict: Backoff,
    failure: Backoff,
    early: Backoff,
    deafness: Backoff,
    /// Checks in a row that found updates waiting behind empty polls.
    deaf_checks: u32,
    /// When a deaf poll may be restarted again.
    restart_at: Instant,
    /// A webhook was deleted and no poll got through since.
    webhook_deleted: bool,
}

impl Waits {
    fn new() -> Self {
        Self {
            conflict: Backoff::new(Duration::from_millis(500), Duration::from_secs(15)),
            failure: Backoff::new(Duration::from_millis(250), Duration::from_secs(30)),
            early: Backoff::new(Duration::from_millis(250), Duration::from_secs(5)),
            deafness: Backoff::new(Duration::from_secs(1), Duration::from_secs(60)),
            deaf_checks: 0,
            restart_at: Instant::now(),
            webhook_deleted: false,
        }
    }

    /// Updates came: every wait starts over.
    fn heard(&mut self) {
        *self = Self::new();
    }
}

/// Telegram's 409 while a webhook is set: "Conflict: can't use getUpdates
/// method while webhook is active; use deleteWebhook to delete the webhook
/// first" (the other 409, another poller, never names a webhook).
fn webhook_active(error: &TelegramError) -> bool {
    matches!(error, TelegramError::Conflict { description } if description.contains("webhook"))
}

/// Sets the health to `new`, saying whether that changed it (the watch then
/// tells every session).
fn set_if_changed(health: &mut PollHealth, new: PollHealth) -> bool {
    if *health == new {
        return false;
    }
    *health = new;
    true
}

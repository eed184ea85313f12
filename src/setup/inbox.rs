//! What setup reads from Telegram: the user's `/start <code>` and, for a
//! group, the first message of that user there — and nothing else.
//!
//! Every update setup confirms to Telegram is gone for the relay, and an
//! offset confirms every update below it. So setup reads without an offset
//! (Telegram answers from the earliest unconfirmed update and confirms
//! nothing), remembers the ids of the updates it took, and at the end
//! confirms only the longest run of its own updates at the head of the
//! queue ([`confirmable`]): one short poll with the offset just past that
//! run. An update somebody sent before (a message for an offline session,
//! say) stays, and so does everything setup took after it: the relay gets
//! those later (it answers a stale `/start` with "code expired"; nothing
//! is lost). Never a negative offset (it drops the backlog).
//!
//! While updates are pending, Telegram answers a poll at once; setup then
//! waits [`BUSY_PAUSE`] before it asks again instead of spinning. It can
//! only ever see the first 100 pending updates without confirming any:
//! with a full batch that holds nothing for it, it gives up and says why.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::telegram::{BotApi, Message, TelegramError, Update, UpdateKind};

/// A long poll's timeout: short enough that a dead network shows soon.
const POLL_TIMEOUT_S: u32 = 10;
/// Between two polls while updates are pending (each answers at once).
const BUSY_PAUSE: Duration = Duration::from_secs(1);
/// The most updates one poll returns, and so all setup can look through.
const BATCH: u8 = 100;
/// Conflicts in a row before setup concludes somebody else polls.
const MAX_CONFLICTS: u32 = 5;

#[derive(Debug, thiserror::Error)]
pub enum OwnUpdatesError {
    #[error("nothing arrived in time; run setup again when you are ready")]
    TimedOut,
    #[error(
        "{0} updates are waiting for the bot before yours, and setup does not drop them: start one agent session so the relay reads them, then pair from it with /telegram-connect"
    )]
    Backlog(usize),
    #[error(
        "another program is reading this bot's updates (409 Conflict): agent-relay on another machine, or another bot framework with this token? Stop it and run setup again"
    )]
    Conflict,
    #[error("Telegram: {0}")]
    Telegram(#[from] TelegramError),
}

/// The reader of setup's own updates.
pub struct OwnUpdates<'a> {
    api: &'a BotApi,
    /// The updates setup took, by id.
    taken: BTreeSet<i64>,
}

impl<'a> OwnUpdates<'a> {
    pub fn new(api: &'a BotApi) -> Self {
        Self {
            api,
            taken: BTreeSet::new(),
        }
    }

    /// Waits until `pick` takes a message, at most until `deadline`.
    pub async fn wait_for<T>(
        &mut self,
        deadline: Instant,
        mut pick: impl FnMut(&Message) -> Option<T>,
    ) -> Result<T, OwnUpdatesError> {
        let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(5));
        let mut conflicts = 0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(OwnUpdatesError::TimedOut);
            }
            let timeout = POLL_TIMEOUT_S.min(left.as_secs().max(1) as u32);
            let batch = match self.api.get_updates(None, timeout, BATCH).await {
                Ok(batch) => {
                    backoff.reset();
                    conflicts = 0;
                    batch
                }
                Err(error) if error.is_retryable() => {
                    if matches!(error, TelegramError::Conflict { .. }) {
                        conflicts += 1;
                        if conflicts >= MAX_CONFLICTS {
                            return Err(OwnUpdatesError::Conflict);
                        }
                    }
                    let wait = error.retry_after().unwrap_or_else(|| backoff.step());
                    tokio::time::sleep(wait.min(left)).await;
                    continue;
                }
                Err(error) => return Err(error.into()),
            };
            for raw in &batch {
                let Ok(update) = Update::decode(raw) else {
                    continue;
                };
                if self.taken.contains(&update.update_id) {
                    continue;
                }
                if let UpdateKind::Message(message) = &update.kind
                    && let Some(found) = pick(message)
                {
                    self.taken.insert(update.update_id);
                    return Ok(found);
                }
            }
            if batch.len() >= usize::from(BATCH) {
                return Err(OwnUpdatesError::Backlog(batch.len()));
            }
            if !batch.is_empty() {
                tokio::time::sleep(BUSY_PAUSE.min(left)).await;
            }
        }
    }

    /// Confirms the run of taken updates at the head of the queue (see the
    /// module doc). Returns how many of the taken updates that was.
    pub async fn confirm(&mut self) -> Result<usize, TelegramError> {
        if self.taken.is_empty() {
            return Ok(0);
        }
        let head = self.api.get_updates(None, 0, BATCH).await?;
        let ids: Vec<i64> = head.iter().filter_map(update_id).collect();
        let Some(last) = confirmable(&ids, &self.taken) else {
            return Ok(0);
        };
        self.api.get_updates(Some(last + 1), 0, 1).await?;
        let confirmed = self.taken.range(..=last).count();
        self.taken.retain(|id| *id > last);
        Ok(confirmed)
    }

    /// Updates setup took that stay for the relay.
    pub fn left_for_the_relay(&self) -> usize {
        self.taken.len()
    }
}

fn update_id(raw: &Value) -> Option<i64> {
    raw.get("update_id").and_then(Value::as_i64)
}

/// The last id of the longest prefix of `pending` (the queue's head, in
/// order) whose every update is one setup took; `None` when the first
/// pending update is not.
pub fn confirmable(pending: &[i64], taken: &BTreeSet<i64>) -> Option<i64> {
    pending
        .iter()
        .take_while(|id| taken.contains(id))
        .last()
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_head_of_setups_own_updates_is_confirmed() {
        let taken: BTreeSet<i64> = [10, 11, 14].into();
        assert_eq!(confirmable(&[10, 11, 12, 14], &taken), Some(11));
        assert_eq!(confirmable(&[10, 11], &taken), Some(11));
        assert_eq!(confirmable(&[9, 10, 11], &taken), None, "9 is not ours");
        assert_eq!(confirmable(&[], &taken), None);
        assert_eq!(confirmable(&[14, 15], &taken), Some(14));
    }
}

//! The leader's own answers (a notice in a topic, a tap's toast, a refusal
//! to a stranger), written by short tasks off the routing path, bounded in
//! number, with a refusal allowance per chat: the relay owes strangers
//! nothing, and its users come first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use super::Leader;

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

    /// Says `text` in `chat` (in `thread`, or outside topics): handed to
    /// the outbox, so it is said even when this leader ends next.
    pub fn say(&self, leader: &Arc<Leader>, chat: i64, thread: Option<i64>, text: String) {
        let Ok(permit) = self.waiting.clone().try_acquire_owned() else {
            tracing::warn!("too many answers waiting; dropping one");
            return;
        };
        let leader = leader.clone();
        // Not cancelled with the leader: the hand-over takes a moment.
        crate::tasks::spawn(async move {
            if let Err(e) = leader.say_later(chat, thread, text).await {
                tracing::warn!(chat, "cannot answer: {e}");
            }
            drop(permit);
        });
    }

    pub fn answer_tap(&self, leader: &Arc<Leader>, callback_id: String, text: &'static str) {
        self.spawn(leader, move |leader| async move {
            if let Err(e) = leader.outbox.answer_tap(&callback_id, Some(text)).await {
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
        crate::tasks::spawn(async move {
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

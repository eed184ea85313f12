//! Pacing of the leader's Bot API calls, so Telegram rarely has to say 429.
//!
//! Telegram's published limits: about one message per second in a private
//! chat, twenty per minute in a group, thirty per second overall. Only calls
//! that put a message into a chat count against them; `sendChatAction`,
//! polls, reads and topic management do not (they have no published message
//! limit, and a typing indicator that waits behind a long answer is useless).
//! A `retry_after` from a 429 is different: it blocks *every* call to that
//! chat (or every call at all) until it expires, because Telegram asks the
//! bot to back off, not to switch to another method.
//!
//! Time is `tokio::time`, so tests run on a paused clock.

use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

const PRIVATE_CAPACITY: usize = 1;
const PRIVATE_PERIOD: Duration = Duration::from_secs(1);
const GROUP_CAPACITY: usize = 20;
const GROUP_PERIOD: Duration = Duration::from_secs(60);
const GLOBAL_CAPACITY: usize = 30;
const GLOBAL_PERIOD: Duration = Duration::from_secs(1);

/// Above this many tracked chats, idle ones are forgotten on the next call.
const IDLE_SWEEP_THRESHOLD: usize = 64;

pub struct RateLimiter {
    /// False for benchmarks: no windows, but penalties still hold.
    paced: bool,
    state: Mutex<Pacing>,
}

impl Default for RateLimiter {
    fn default() -> Self {
        Self::new()
    }
}

impl RateLimiter {
    /// Telegram's published limits.
    pub fn new() -> Self {
        Self {
            paced: true,
            state: Mutex::new(Pacing::default()),
        }
    }

    /// No pacing at all, for benchmarks against the fake Bot API; a
    /// `retry_after` penalty is still honoured.
    pub fn unlimited() -> Self {
        Self {
            paced: false,
            state: Mutex::new(Pacing::default()),
        }
    }

    /// Waits until `method` may be called for `chat` (`None` for calls not
    /// addressed to a chat), and books the call.
    #[cfg(test)]
    pub async fn acquire(&self, chat: Option<i64>, method: &str) {
        let far = Instant::now() + Duration::from_secs(365 * 86_400);
        let _ = self.acquire_until(chat, method, far).await;
    }

    /// Like [`RateLimiter::acquire`], but gives up at once, booking nothing,
    /// when the call could not go before `deadline`; the error is how long
    /// it would have waited.
    pub async fn acquire_until(
        &self,
        chat: Option<i64>,
        method: &str,
        deadline: Instant,
    ) -> Result<(), Duration> {
        let counted = self.paced && produces_message(method);
        loop {
            let ready_at = {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                let now = Instant::now();
                match state.grant(now, chat, counted) {
                    None => return Ok(()),
                    Some(at) if at > deadline => return Err(at - now),
                    Some(at) => at,
                }
            };
            // Another caller may take the slot first; then this loops and
            // waits again, which is the fairness a rate limit needs.
            sleep_until(ready_at).await;
        }
    }

    /// Records a 429's `retry_after`: for `chat`, or for every call when
    /// `None`. A shorter penalty never shortens a running one.
    pub fn penalize(&self, chat: Option<i64>, retry_after: Duration) {
        let until = Instant::now() + retry_after;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = match chat {
            Some(chat) => state.chat_penalties.entry(chat).or_insert(until),
            None => state.global_penalty.get_or_insert(until),
        };
        *slot = (*slot).max(until);
    }
}

/// Methods that put a message into a chat, the ones Telegram's message
/// limits are about.
fn produces_message(method: &str) -> bool {
    (method.starts_with("send") && method != "sendChatAction")
        || method.starts_with("editMessage")
        || method.starts_with("copyMessage")
        || method.starts_with("forwardMessage")
}

#[derive(Default)]
struct Pacing {
    global: Window,
    chats: HashMap<i64, Window>,
    global_penalty: Option<Instant>,
    chat_penalties: HashMap<i64, Instant>,
}

impl Pacing {
    /// Books the call and returns `None`, or returns when to ask again.
    fn grant(&mut self, now: Instant, chat: Option<i64>, counted: bool) -> Option<Instant> {
        if self.chats.len().max(self.chat_penalties.len()) > IDLE_SWEEP_THRESHOLD {
            self.forget_idle(now);
        }
        let mut ready_at = now;
        if let Some(until) = self.global_penalty {
            ready_at = ready_at.max(until);
        }
        if let Some(until) = chat.and_then(|chat| self.chat_penalties.get(&chat)) {
            ready_at = ready_at.max(*until);
        }
        if counted {
            ready_at = ready_at.max(self.global.next_free(now));
            if let Some(chat) = chat {
                let window = self
                    .chats
                    .entry(chat)
                    .or_insert_with(|| Window::for_chat(chat));
                ready_at = ready_at.max(window.next_free(now));
            }
        }
        if ready_at > now {
            return Some(ready_at);
        }
        if counted {
            self.global.book(now);
            if let Some(window) = chat.and_then(|chat| self.chats.get_mut(&chat)) {
                window.book(now);
            }
        }
        None
    }

    fn forget_idle(&mut self, now: Instant) {
        self.chats.retain(|_, window| {
            window.expire(now);
            !window.grants.is_empty()
        });
        self.chat_penalties.retain(|_, until| *until > now);
        if self.global_penalty.is_some_and(|until| until <= now) {
            self.global_penalty = None;
        }
    }
}

/// A sliding window: at most `capacity` grants within any `period`.
struct Window {
    capacity: usize,
    period: Duration,
    grants: VecDeque<Instant>,
}

impl Default for Window {
    fn default() -> Self {
        Self::new(GLOBAL_CAPACITY, GLOBAL_PERIOD)
    }
}

impl Window {
    fn new(capacity: usize, period: Duration) -> Self {
        Self {
            capacity,
            period,
            grants: VecDeque::with_capacity(capacity),
        }
    }

    /// Private chats have positive ids, groups and channels negative ones.
    fn for_chat(chat: i64) -> Self {
        if chat > 0 {
            Self::new(PRIVATE_CAPACITY, PRIVATE_PERIOD)
        } else {
            Self::new(GROUP_CAPACITY, GROUP_PERIOD)
        }
    }

    fn expire(&mut self, now: Instant) {
        while self
            .grants
            .front()
            .is_some_and(|granted| *granted + self.period <= now)
        {
            self.grants.pop_front();
        }
    }

    fn next_free(&mut self, now: Instant) -> Instant {
        self.expire(now);
        if self.grants.len() < self.capacity {
            now
        } else {
            // Full: the oldest grant must leave the window first.
            self.grants
                .front()
                .map_or(now, |oldest| *oldest + self.period)
        }
    }

    fn book(&mut self, now: Instant) {
        self.grants.push_back(now);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const ALICE: i64 = 42;
    const BOB: i64 = 43;
    const GROUP: i64 = -100_123;

    /// The virtual time `acquire` took.
    async fn timed(limiter: &RateLimiter, chat: Option<i64>, method: &str) -> Duration {
        let start = Instant::now();
        limiter.acquire(chat, method).await;
        start.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_private_chat_gets_one_message_per_second() {
        let limiter = RateLimiter::new();
        let start = Instant::now();
        for _ in 0..3 {
            limiter.acquire(Some(ALICE), "sendMessage").await;
        }
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        // Another private chat is not held up by Alice's window.
        assert_eq!(
            timed(&limiter, Some(BOB), "sendMessage").await,
            Duration::ZERO
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_group_gets_twenty_messages_per_minute() {
        let limiter = RateLimiter::new();
        for _ in 0..20 {
            assert_eq!(
                timed(&limiter, Some(GROUP), "sendMessage").await,
                Duration::ZERO
            );
        }
        assert_eq!(
            timed(&limiter, Some(GROUP), "editMessageText").await,
            Duration::from_secs(60)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn thirty_messages_per_second_overall() {
        let limiter = RateLimiter::new();
        for chat in 1..=30 {
            assert_eq!(
                timed(&limiter, Some(chat), "sendMessage").await,
                Duration::ZERO
            );
        }
        assert_eq!(
            timed(&limiter, Some(31), "sendMessage").await,
            Duration::from_secs(1)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn chat_actions_and_other_calls_are_not_paced() {
        let limiter = RateLimiter::new();
        limiter.acquire(Some(ALICE), "sendMessage").await;
        for method in [
            "sendChatAction",
            "getChat",
            "createForumTopic",
            "getUpdates",
        ] {
            assert_eq!(
                timed(&limiter, Some(ALICE), method).await,
                Duration::ZERO,
                "{method}"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_chat_penalty_blocks_that_chat_only_and_every_method() {
        let limiter = RateLimiter::new();
        limiter.penalize(Some(ALICE), Duration::from_secs(2));
        assert_eq!(
            timed(&limiter, Some(BOB), "sendMessage").await,
            Duration::ZERO
        );
        assert_eq!(timed(&limiter, None, "getMe").await, Duration::ZERO);
        assert_eq!(
            timed(&limiter, Some(ALICE), "sendChatAction").await,
            Duration::from_secs(2)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_global_penalty_blocks_everything_and_never_shrinks() {
        let limiter = RateLimiter::new();
        limiter.penalize(None, Duration::from_secs(5));
        limiter.penalize(None, Duration::from_secs(1));
        assert_eq!(
            timed(&limiter, Some(GROUP), "getChat").await,
            Duration::from_secs(5)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unlimited_still_honours_retry_after() {
        let limiter = RateLimiter::unlimited();
        for _ in 0..100 {
            assert_eq!(
                timed(&limiter, Some(ALICE), "sendMessage").await,
                Duration::ZERO
            );
        }
        limiter.penalize(Some(ALICE), Duration::from_secs(3));
        assert_eq!(
            timed(&limiter, Some(ALICE), "sendMessage").await,
            Duration::from_secs(3)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_refuses_a_wait_that_would_pass_it_and_books_nothing() {
        let limiter = RateLimiter::new();
        limiter.penalize(Some(ALICE), Duration::from_secs(30));
        let soon = Instant::now() + Duration::from_secs(10);
        assert_eq!(
            limiter
                .acquire_until(Some(ALICE), "sendMessage", soon)
                .await,
            Err(Duration::from_secs(30))
        );
        limiter.acquire(Some(BOB), "sendMessage").await;
        let later = Instant::now() + Duration::from_secs(2);
        assert_eq!(
            limiter.acquire_until(Some(BOB), "sendMessage", later).await,
            Ok(())
        );
        assert_eq!(
            Instant::now().duration_since(soon - Duration::from_secs(10)),
            Duration::from_secs(1),
            "the second send in Bob's private chat waited its second"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn concurrent_senders_share_the_window() {
        let limiter = Arc::new(RateLimiter::new());
        let start = Instant::now();
        let tasks: Vec<_> = (0..3)
            .map(|_| {
                let limiter = Arc::clone(&limiter);
                tokio::spawn(async move {
                    limiter.acquire(Some(ALICE), "sendMessage").await;
                    Instant::now()
                })
            })
            .collect();
        let mut granted = Vec::new();
        for task in tasks {
            granted.push(task.await.unwrap() - start);
        }
        granted.sort();
        assert_eq!(
            granted,
            [0, 1, 2].map(Duration::from_secs).to_vec(),
            "one grant per second"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn memory_stays_bounded_as_chats_come_and_go() {
        let limiter = RateLimiter::new();
        for chat in 1..=4 * IDLE_SWEEP_THRESHOLD as i64 {
            limiter.acquire(Some(chat), "sendMessage").await;
            limiter.penalize(Some(chat), Duration::from_millis(10));
            let state = limiter.state.lock().unwrap();
            // Idle entries are swept once a map outgrows the threshold.
            assert!(state.chats.len() <= IDLE_SWEEP_THRESHOLD + 1);
            assert!(state.chat_penalties.len() <= IDLE_SWEEP_THRESHOLD + 1);
        }
    }
}

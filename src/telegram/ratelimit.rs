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
//! When several calls wait for one chat's budget, [`Priority`] decides who
//! goes first: what a person waits for (an answer, a question) before
//! edits, and a background call (a typing indicator, a progress edit that a
//! later one supersedes) never waits at all, nor takes the last quarter of
//! a group's window. A send counts from when Telegram answered it
//! ([`RateLimiter::answered`]). What was paced is counted per chat
//! ([`RateLimiter::snapshot`]) for `/relay status`.
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

/// Background calls leave this fraction (1/n) of a chat's window to the
/// others: 5 of a group's 20 a minute; a private chat's one a second is
/// not split.
const BACKGROUND_RESERVE_DIVISOR: usize = 4;

/// Above this many tracked chats, idle ones are forgotten on the next call.
const IDLE_SWEEP_THRESHOLD: usize = 64;

/// How soon a call that let a more urgent one take a free slot looks again.
const OUTRANKED_RECHECK: Duration = Duration::from_millis(5);

pub struct RateLimiter {
    /// False for benchmarks: no windows, but penalties still hold.
    paced: bool,
    state: Mutex<Pacing>,
}

/// Who goes first when calls wait for the same chat's budget.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "camelCase")]
pub enum Priority {
    /// Superseded by a later call (typing, a progress edit): never waits;
    /// refused when the budget is spent or others wait.
    Background,
    /// Edits: after what people wait for.
    Normal,
    /// Answers, questions, notices: first.
    High,
}

/// One chat's budget as `/relay status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatBudget {
    pub chat: i64,
    pub used: usize,
    pub capacity: usize,
    pub period: Duration,
    /// Calls waiting for it now.
    pub waiting: usize,
    /// When the next call may go, from now (a penalty included).
    pub next_free: Duration,
    /// The longest wait for this chat since the limiter began.
    pub longest_wait: Duration,
    /// Calls that had to wait at all.
    pub paced: u64,
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
        let _ = self
            .acquire_until(chat, method, far, Priority::High, |_| {})
            .await;
    }

    /// Like [`RateLimiter::acquire`], with a `priority` among the calls
    /// waiting for the same chat; gives up at once, booking nothing, when
    /// the call could not go before `deadline` (a background call: when it
    /// could not go now). The error is how long it would have waited.
    /// `waiting` hears how long the call will wait, whenever that estimate
    /// grows.
    #[cfg(test)]
    pub async fn acquire_until(
        &self,
        chat: Option<i64>,
        method: &str,
        deadline: Instant,
        priority: Priority,
        waiting: impl FnMut(Duration),
    ) -> Result<(), Duration> {
        self.book_until(chat, method, deadline, priority, waiting)
            .await
            .map(|_| ())
    }

    /// [`RateLimiter::acquire_until`], answering when the call was booked,
    /// for [`RateLimiter::answered`].
    pub async fn book_until(
        &self,
        chat: Option<i64>,
        method: &str,
        deadline: Instant,
        priority: Priority,
        mut waiting: impl FnMut(Duration),
    ) -> Result<Instant, Duration> {
        let counted = self.paced && produces_message(method);
        let started = Instant::now();
        let mut told = None;
        let mut queued = Queued::new(self, chat, priority);
        loop {
            let ready_at = {
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                let now = Instant::now();
                match state.grant(now, chat, counted, priority) {
                    None => {
                        if told.is_some() {
                            state.waited(chat, now - started);
                        }
                        return Ok(now);
                    }
                    Some(at) if at > deadline || priority == Priority::Background => {
                        return Err(at - now);
                    }
                    Some(at) => {
                        queued.enter(&mut state);
                        at
                    }
                }
            };
            if told.is_none_or(|t| ready_at > t) {
                told = Some(ready_at);
                waiting(ready_at - Instant::now());
            }
            // Another caller may take the slot first; then this loops and
            // waits again, which is the fairness a rate limit needs.
            sleep_until(ready_at).await;
        }
    }

    /// The call booked at `booked` has been answered: it counts from now.
    /// Telegram counts a message when it arrives, which is after we booked
    /// it by however long the request took; counting from the answer keeps
    /// our window from ending before Telegram's (a 429 at the edge).
    pub fn answered(&self, chat: Option<i64>, method: &str, booked: Instant) {
        if !(self.paced && produces_message(method)) {
            return;
        }
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.global.restamp(booked, now);
        if let Some(window) = chat.and_then(|chat| state.chats.get_mut(&chat)) {
            window.restamp(booked, now);
        }
    }

    /// Every chat whose budget is in use or was waited for.
    pub fn snapshot(&self) -> Vec<ChatBudget> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let state = &mut *state;
        let mut chats: Vec<i64> = state.chats.keys().copied().collect();
        chats.extend(state.waited.keys().filter(|c| !state.chats.contains_key(c)));
        chats.sort_unstable();
        chats
            .into_iter()
            .map(|chat| {
                let window = state
                    .chats
                    .entry(chat)
                    .or_insert_with(|| Window::for_chat(chat));
                let mut next = window.next_free(now);
                if let Some(until) = state.chat_penalties.get(&chat) {
                    next = next.max(*until);
                }
                let waited = state.waited.get(&chat).copied().unwrap_or_default();
                ChatBudget {
                    chat,
                    used: window.grants.len(),
                    capacity: window.capacity,
                    period: window.period,
                    waiting: state
                        .queued
                        .iter()
                        .filter(|((c, _), _)| *c == Some(chat))
                        .map(|(_, n)| *n)
                        .sum(),
                    next_free: next - now,
                    longest_wait: waited.longest,
                    paced: waited.count,
                }
            })
            .collect()
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

/// What was spent of each chat's window, and the penalties still running,
/// in wall-clock milliseconds: Telegram's budget is the bot's, not a
/// process's, so a leader that takes over goes on from where the last one
/// stopped instead of drawing 429s at the edge of a window it forgot.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Spent {
    /// Each chat with sends in its window: when they counted.
    pub chats: Vec<(i64, Vec<u64>)>,
    /// Penalties still running: the chat (none: every call), and until when.
    pub penalties: Vec<(Option<i64>, u64)>,
}

impl RateLimiter {
    /// What this limiter spent, as of now.
    pub fn spent(&self) -> Spent {
        let (wall, now) = (wall_ms(), Instant::now());
        let at = |instant: Instant| {
            let ago =
                u64::try_from(now.saturating_duration_since(instant).as_millis()).unwrap_or(0);
            let ahead =
                u64::try_from(instant.saturating_duration_since(now).as_millis()).unwrap_or(0);
            wall.saturating_sub(ago).saturating_add(ahead)
        };
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut chats: Vec<(i64, Vec<u64>)> = state
            .chats
            .iter_mut()
            .filter_map(|(chat, window)| {
                window.expire(now);
                (!window.grants.is_empty())
                    .then(|| (*chat, window.grants.iter().map(|g| at(*g)).collect()))
            })
            .collect();
        chats.sort_unstable();
        let mut penalties: Vec<(Option<i64>, u64)> = state
            .chat_penalties
            .iter()
            .filter(|(_, until)| **until > now)
            .map(|(chat, until)| (Some(*chat), at(*until)))
            .collect();
        if let Some(until) = state.global_penalty.filter(|until| *until > now) {
            penalties.push((None, at(until)));
        }
        penalties.sort_unstable();
        Spent { chats, penalties }
    }

    /// Goes on from what another limiter (the last leader's) spent: its
    /// sends still in their windows count here, its penalties hold.
    pub fn go_on_from(&self, spent: &Spent) {
        let (wall, now) = (wall_ms(), Instant::now());
        let instant = |ms: u64| {
            if ms <= wall {
                now.checked_sub(Duration::from_millis(wall - ms))
            } else {
                Some(now + Duration::from_millis(ms - wall))
            }
        };
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        for (chat, grants) in &spent.chats {
            let window = state
                .chats
                .entry(*chat)
                .or_insert_with(|| Window::for_chat(*chat));
            let mut all: Vec<Instant> = window.grants.iter().copied().collect();
            // Never more than a window holds, and only what is still in it.
            all.extend(
                grants
                    .iter()
                    .filter_map(|ms| instant(*ms))
                    .filter(|g| *g <= now),
            );
            all.sort_unstable();
            window.grants = all.into_iter().collect();
            window.expire(now);
            while window.grants.len() > window.capacity {
                window.grants.pop_front();
            }
        }
        for (chat, until) in &spent.penalties {
            if let Some(until) = instant(*until).filter(|until| *until > now) {
                let slot = match chat {
                    Some(chat) => state.chat_penalties.entry(*chat).or_insert(until),
                    None => state.global_penalty.get_or_insert(until),
                };
                *slot = (*slot).max(until);
            }
        }
    }
}

fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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
    /// Calls waiting now, by chat and priority.
    queued: HashMap<(Option<i64>, Priority), usize>,
    /// What waiting there was, by chat.
    waited: HashMap<i64, Waited>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Waited {
    longest: Duration,
    count: u64,
}

/// A call counted among the waiting while it waits (and not after, however
/// its future ends).
struct Queued<'a> {
    limiter: &'a RateLimiter,
    key: (Option<i64>, Priority),
    entered: bool,
}

impl<'a> Queued<'a> {
    fn new(limiter: &'a RateLimiter, chat: Option<i64>, priority: Priority) -> Self {
        Self {
            limiter,
            key: (chat, priority),
            entered: false,
        }
    }

    fn enter(&mut self, state: &mut Pacing) {
        if !self.entered {
            self.entered = true;
            *state.queued.entry(self.key).or_default() += 1;
        }
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if self.entered {
            let mut state = self
                .limiter
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(n) = state.queued.get_mut(&self.key) {
                *n -= 1;
                if *n == 0 {
                    state.queued.remove(&self.key);
                }
            }
        }
    }
}

impl Pacing {
    fn waited(&mut self, chat: Option<i64>, wait: Duration) {
        if let Some(chat) = chat {
            let waited = self.waited.entry(chat).or_default();
            waited.longest = waited.longest.max(wait);
            waited.count += 1;
        }
    }

    /// Whether a call of `priority` for `chat` must let others go first.
    fn outranked(&self, chat: Option<i64>, priority: Priority) -> bool {
        self.queued
            .iter()
            .any(|((c, p), n)| *c == chat && *p > priority && *n > 0)
    }

    /// Books the call and returns `None`, or returns when to ask again.
    fn grant(
        &mut self,
        now: Instant,
        chat: Option<i64>,
        counted: bool,
        priority: Priority,
    ) -> Option<Instant> {
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
            if ready_at == now
                && priority == Priority::Background
                && let Some(window) = chat.and_then(|chat| self.chats.get_mut(&chat))
                && !window.spare_for_background(now)
            {
                // The last of the budget is kept for what people wait for.
                ready_at = window.grants.front().map_or(now, |g| *g + window.period);
            }
            if ready_at == now && self.outranked(chat, priority) {
                // A free slot with more urgent calls waiting for it: theirs.
                // They wake at once; look again a moment later.
                ready_at = now + OUTRANKED_RECHECK;
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
        if self.waited.len() > IDLE_SWEEP_THRESHOLD {
            let chats = &self.chats;
            self.waited.retain(|chat, _| chats.contains_key(chat));
        }
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

    /// Whether a call that a later one supersedes (typing, progress) may
    /// take a slot: not the last quarter of the window, which is kept for
    /// answers and questions, so a burst of progress cannot make them wait
    /// a whole window.
    fn spare_for_background(&mut self, now: Instant) -> bool {
        self.expire(now);
        self.grants.len() + self.capacity / BACKGROUND_RESERVE_DIVISOR < self.capacity
    }

    fn book(&mut self, now: Instant) {
        self.grants.push_back(now);
    }

    /// Moves the grant booked at `booked` to `now` (the latest of all, so
    /// the grants stay in order); nothing if it has expired.
    fn restamp(&mut self, booked: Instant, now: Instant) {
        if let Some(at) = self.grants.iter().position(|g| *g == booked) {
            self.grants.remove(at);
            self.grants.push_back(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

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
                .acquire_until(Some(ALICE), "sendMessage", soon, Priority::High, |_| {})
                .await,
            Err(Duration::from_secs(30))
        );
        limiter.acquire(Some(BOB), "sendMessage").await;
        let later = Instant::now() + Duration::from_secs(2);
        assert_eq!(
            limiter
                .acquire_until(Some(BOB), "sendMessage", later, Priority::High, |_| {})
                .await,
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
                crate::tasks::spawn(async move {
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

    /// Fills the group's window: the next counted call waits a minute.
    async fn spend_the_group_budget(limiter: &RateLimiter) {
        for _ in 0..GROUP_CAPACITY {
            limiter.acquire(Some(GROUP), "sendMessage").await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn answers_go_before_edits_that_waited_longer() {
        let limiter = Arc::new(RateLimiter::new());
        spend_the_group_budget(&limiter).await;
        let far = Instant::now() + Duration::from_secs(600);
        let order = Arc::new(Mutex::new(Vec::new()));
        let call = |method: &'static str, priority: Priority| {
            let limiter = Arc::clone(&limiter);
            let order = Arc::clone(&order);
            crate::tasks::spawn(async move {
                limiter
                    .acquire_until(Some(GROUP), method, far, priority, |_| {})
                    .await
                    .unwrap();
                order.lock().unwrap().push(method);
            })
        };
        let edit = call("editMessageText", Priority::Normal);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let answer = call("sendMessage", Priority::High);
        edit.await.unwrap();
        answer.await.unwrap();
        assert_eq!(*order.lock().unwrap(), ["sendMessage", "editMessageText"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_background_call_never_waits_and_books_nothing() {
        let limiter = RateLimiter::new();
        let now = Instant::now() + Duration::from_secs(600);
        assert_eq!(
            limiter
                .acquire_until(
                    Some(GROUP),
                    "editMessageText",
                    now,
                    Priority::Background,
                    |_| {}
                )
                .await,
            Ok(()),
            "a free budget lets it go"
        );
        for _ in 1..GROUP_CAPACITY {
            limiter.acquire(Some(GROUP), "sendMessage").await;
        }
        let start = Instant::now();
        let refused = limiter
            .acquire_until(
                Some(GROUP),
                "editMessageText",
                now,
                Priority::Background,
                |_| {},
            )
            .await;
        assert_eq!(refused, Err(Duration::from_secs(60)));
        assert_eq!(start.elapsed(), Duration::ZERO, "it did not wait");
        // Typing is no message: it goes while the budget is spent…
        assert_eq!(
            limiter
                .acquire_until(
                    Some(GROUP),
                    "sendChatAction",
                    now,
                    Priority::Background,
                    |_| {}
                )
                .await,
            Ok(())
        );
        // …but not through a 429's penalty.
        limiter.penalize(Some(GROUP), Duration::from_secs(5));
        assert_eq!(
            limiter
                .acquire_until(
                    Some(GROUP),
                    "sendChatAction",
                    now,
                    Priority::Background,
                    |_| {}
                )
                .await,
            Err(Duration::from_secs(5))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn background_calls_leave_the_last_quarter_of_a_group_to_answers() {
        let limiter = RateLimiter::new();
        let far = Instant::now() + Duration::from_secs(600);
        let background = || {
            limiter.acquire_until(
                Some(GROUP),
                "editMessageText",
                far,
                Priority::Background,
                |_| {},
            )
        };
        for _ in 0..GROUP_CAPACITY - GROUP_CAPACITY / BACKGROUND_RESERVE_DIVISOR {
            assert_eq!(background().await, Ok(()));
        }
        assert_eq!(
            background().await,
            Err(Duration::from_secs(60)),
            "the last five are kept"
        );
        for _ in 0..GROUP_CAPACITY / BACKGROUND_RESERVE_DIVISOR {
            let start = Instant::now();
            limiter.acquire(Some(GROUP), "sendMessage").await;
            assert_eq!(
                start.elapsed(),
                Duration::ZERO,
                "an answer takes one at once"
            );
        }
        // A private chat's single slot is not split.
        assert_eq!(
            limiter
                .acquire_until(
                    Some(ALICE),
                    "editMessageText",
                    far,
                    Priority::Background,
                    |_| {}
                )
                .await,
            Ok(())
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_counts_from_its_answer_not_from_its_booking() {
        let limiter = RateLimiter::new();
        let far = Instant::now() + Duration::from_secs(600);
        let first = limiter
            .book_until(Some(GROUP), "sendMessage", far, Priority::High, |_| {})
            .await
            .unwrap();
        // The request took 3 s to come back (Telegram counted it meanwhile).
        tokio::time::sleep(Duration::from_secs(3)).await;
        limiter.answered(Some(GROUP), "sendMessage", first);
        for _ in 1..GROUP_CAPACITY {
            limiter.acquire(Some(GROUP), "sendMessage").await;
        }
        let start = Instant::now();
        limiter.acquire(Some(GROUP), "sendMessage").await;
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(60),
            "the window ends 60 s after the first send was answered, not booked"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_is_told_and_counted_per_chat() {
        let limiter = Arc::new(RateLimiter::new());
        spend_the_group_budget(&limiter).await;
        let told = Arc::new(Mutex::new(Vec::new()));
        let waiter = {
            let limiter = Arc::clone(&limiter);
            let told = Arc::clone(&told);
            crate::tasks::spawn(async move {
                let far = Instant::now() + Duration::from_secs(600);
                limiter
                    .acquire_until(Some(GROUP), "sendMessage", far, Priority::High, |wait| {
                        told.lock().unwrap().push(wait)
                    })
                    .await
            })
        };
        tokio::time::sleep(Duration::from_secs(20)).await;
        let budget = limiter.snapshot();
        assert_eq!(budget.len(), 1);
        assert_eq!(
            (budget[0].chat, budget[0].used, budget[0].capacity),
            (GROUP, 20, 20)
        );
        assert_eq!(budget[0].waiting, 1);
        assert_eq!(budget[0].next_free, Duration::from_secs(40));
        assert_eq!(waiter.await.unwrap(), Ok(()));
        assert_eq!(*told.lock().unwrap(), [Duration::from_secs(60)]);
        let budget = limiter.snapshot();
        assert_eq!(budget[0].waiting, 0);
        assert_eq!(budget[0].longest_wait, Duration::from_secs(60));
        assert_eq!(budget[0].paced, 1);
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

    #[tokio::test(start_paused = true)]
    async fn a_new_limiter_goes_on_from_what_the_last_one_spent() {
        let group = -100;
        let old = RateLimiter::new();
        for _ in 0..GROUP_CAPACITY {
            old.acquire(Some(group), "sendMessage").await;
        }
        old.penalize(Some(7), Duration::from_secs(30));
        let spent = old.spent();
        assert_eq!(spent.chats.len(), 1);
        assert_eq!(spent.chats[0].1.len(), GROUP_CAPACITY);
        assert_eq!(spent.penalties.len(), 1);

        let new = RateLimiter::new();
        new.go_on_from(&spent);
        let penalty = new
            .acquire_until(
                Some(7),
                "sendMessage",
                Instant::now(),
                Priority::High,
                |_| {},
            )
            .await;
        assert!(penalty.is_err(), "the penalty holds");
        let far = Instant::now() + Duration::from_secs(600);
        let waits = new
            .acquire_until(
                Some(group),
                "sendMessage",
                Instant::now(),
                Priority::High,
                |_| {},
            )
            .await;
        assert!(
            waits.is_err(),
            "the group's window is full for the new limiter too"
        );
        let start = Instant::now();
        new.acquire_until(Some(group), "sendMessage", far, Priority::High, |_| {})
            .await
            .unwrap();
        assert!(Instant::now() - start >= GROUP_PERIOD - Duration::from_secs(1));
        assert_eq!(RateLimiter::new().spent(), Spent::default());
    }
}

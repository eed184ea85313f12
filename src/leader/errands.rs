//! The leader's own work off the routing path ([`Errands`]): a command
//! answered, a tap's toast, a schedule fired, a session resumed for a
//! message. Each runs as a short task, bounded in number and cancelled
//! with the leader, so nothing of it waits on the routing path; and a
//! chat that earns refusals gets an allowance of them, so a stranger's
//! flood costs the relay nothing: it owes strangers nothing, and its users
//! come first.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// What a refusal is for, each with its own allowance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Refusal {
    /// A wrong pairing code.
    Guess,
    /// A tap by somebody who may not tap.
    Tap,
    /// A viewer's message in a session's topic.
    Viewer,
}

/// The window in which a chat gets at most one refusal of a kind.
const REFUSAL_WINDOW: Duration = Duration::from_secs(600);
/// Refusals a chat may earn before it hears nothing at all for a window.
const MAX_REFUSALS: u32 = 3;
/// Errands running at once, at most; beyond, they wait their turn. None is
/// dropped: each carries a person's command, a tap or a firing, and a batch
/// brings at most a hundred updates, so what waits is bounded by what
/// people can send (a stranger earns refusals, which are rationed, never
/// errands).
const MAX_ERRANDS: usize = 64;

/// See the module docs.
pub(super) struct Errands {
    running: Arc<Semaphore>,
    refusals: Mutex<HashMap<(i64, Refusal), (Instant, u32)>>,
    stop: CancellationToken,
}

impl Errands {
    /// Errands cancelled with `stop`, the leader's.
    pub fn new(stop: CancellationToken) -> Self {
        Self {
            running: Arc::new(Semaphore::new(MAX_ERRANDS)),
            refusals: Mutex::default(),
            stop,
        }
    }

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

    /// Runs `errand` off the caller's path, in its turn, until it ends or
    /// the leader stops.
    pub fn run(&self, errand: impl Future<Output = ()> + Send + 'static) {
        let (running, stop) = (self.running.clone(), self.stop.clone());
        let errand = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(errand));
        crate::tasks::spawn(async move {
            let permit = tokio::select! {
                permit = running.acquire_owned() => permit,
                () = stop.cancelled() => return,
            };
            tokio::select! {
                ran = errand => if let Err(panic) = ran {
                    tracing::error!("an answer of the leader's panicked: {}", panic_text(panic.as_ref()));
                },
                () = stop.cancelled() => {}
            }
            drop(permit);
        });
    }
}

/// What a panic said, as far as it said it in words.
pub(super) fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(text), _) => (*text).to_string(),
        (None, Some(text)) => text.clone(),
        (None, None) => "no message".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_gets_one_refusal_per_window_and_silence_when_it_keeps_trying() {
        let errands = Errands::new(CancellationToken::new());
        assert!(errands.admit(5, Refusal::Guess));
        assert!(!errands.admit(5, Refusal::Guess), "once per window");
        assert!(errands.admit(5, Refusal::Tap), "each kind has its own");
        assert!(errands.admit(6, Refusal::Guess), "each chat has its own");
        for _ in 0..10 {
            assert!(!errands.admit(5, Refusal::Guess));
        }
    }
}

//! The one backoff of the crate: exponential, capped, with jitter.
//!
//! Every loop that tries again what failed waits with this, so they all
//! spread out the same way: the bus member reconnecting and a refused
//! registration; the poller after a 409, a network failure or a deaf
//! poll; the outbox after a transient Bot API failure; a session fetching
//! its files again from a new leader; a Claude Code hook and its MCP
//! server finding each other; `agent-relay codex` waiting for its
//! app-server to listen; setup reading its own updates; and across
//! machines, joining the cluster, its stream's placement, the bot-wide
//! offset, the consumer, and a call through the machine that polls. A
//! loop that looks again on a period rather than after a failure (the
//! courier's lanes, a lease's contender, the Codex bridge's subscription)
//! keeps its period. The jitter is "equal jitter": each wait is
//! between half and all of the current step, so a crowd of sidecars that
//! lost their leader at the same instant does not come back in lockstep,
//! and no wait is ever close to zero.

use std::time::Duration;

#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    start: Duration,
    cap: Duration,
    next: Duration,
}

impl Backoff {
    /// Waits start around `start` and double up to `cap`.
    pub(crate) const fn new(start: Duration, cap: Duration) -> Self {
        Self {
            start,
            cap,
            next: start,
        }
    }

    /// After a success: the next failure waits the shortest time again.
    pub(crate) fn reset(&mut self) {
        self.next = self.start;
    }

    /// The wait before the next attempt; each call doubles the step.
    pub(crate) fn step(&mut self) -> Duration {
        let wait = self.next.mul_f64(0.5 + fastrand::f64() / 2.0);
        self.next = (self.next * 2).min(self.cap);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_with_jitter_and_reset() {
        let start = Duration::from_millis(10);
        let cap = Duration::from_millis(80);
        let mut backoff = Backoff::new(start, cap);
        let mut steps = Vec::new();
        for _ in 0..6 {
            steps.push(backoff.step());
        }
        let ceilings = [10, 20, 40, 80, 80, 80].map(Duration::from_millis);
        for (wait, ceiling) in steps.iter().zip(ceilings) {
            assert!(
                *wait <= ceiling && *wait >= ceiling / 2,
                "{wait:?} vs {ceiling:?}"
            );
        }
        backoff.reset();
        assert!(backoff.step() <= start);
    }
}

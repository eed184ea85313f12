//! `/relay restart` as its caller sees it: ask the leader (or join a
//! restart already under way), then watch the bus until every route the
//! plan expects is back at a newer epoch, and report how it ended.

use std::time::{Duration, Instant};

use super::member::{Call, Member, MemberError};
use crate::protocol::bus::*;

/// How long a restart may take to converge before it is reported partial.
pub const RESTART_WINDOW: Duration = Duration::from_secs(10);
/// How often the restart's caller looks at the bus while it converges.
const RESTART_POLL: Duration = Duration::from_millis(20);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

impl Member {
    /// Asks the leader to restart the relay (or joins a restart already
    /// under way), then watches the bus until every expected route is back
    /// at a newer epoch, for at most [`RESTART_WINDOW`].
    pub async fn restart(&self) -> RestartOutcome {
        let started = Instant::now();
        let mut asked_while_away = false;
        let plan = loop {
            if let Some(plan) = self.restart_in_flight().await {
                break plan;
            }
            match self
                .call::<RestartPlan>(Call::Restart, REQUEST_TIMEOUT)
                .await
            {
                Ok(plan) => break plan,
                // Between leaders (another restart, a failover): wait to be
                // back, then join what is under way or ask again, once.
                Err(MemberError::NotConnected) if !asked_while_away => {
                    asked_while_away = true;
                    self.wait_registered(RESTART_WINDOW).await;
                }
                Err(e) => {
                    return RestartOutcome::Failed {
                        reason: e.to_string(),
                        elapsed_ms: started.elapsed().as_millis() as u64,
                    };
                }
            }
        };
        self.converge(&plan, started).await
    }

    /// A restart announced recently that has not converged yet: a request
    /// now joins it instead of restarting again.
    async fn restart_in_flight(&self) -> Option<RestartPlan> {
        let (plan, heard) = self.state().restarting?;
        if heard.elapsed() >= RESTART_WINDOW {
            return None;
        }
        match self.status().await {
            Ok(status) if converged(&plan, &status) => None,
            _ => Some(plan),
        }
    }

    async fn converge(&self, plan: &RestartPlan, started: Instant) -> RestartOutcome {
        let deadline = started + RESTART_WINDOW;
        let elapsed_ms = || started.elapsed().as_millis() as u64;
        let mut last: Option<BusStatus> = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Ok(Ok(status)) = tokio::time::timeout(left, self.status()).await
                && status.epoch > plan.epoch
            {
                if converged(plan, &status) {
                    return RestartOutcome::Complete {
                        routes: plan.expected_routes,
                        elapsed_ms: elapsed_ms(),
                    };
                }
                last = Some(status);
            }
            if Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(RESTART_POLL).await;
        }
        match last {
            Some(status) => {
                let missing: Vec<String> = plan
                    .expected
                    .iter()
                    .filter(|key| !is_back(key, &status))
                    .cloned()
                    .collect();
                RestartOutcome::PartialTimeout {
                    back: plan.expected_routes.saturating_sub(missing.len() as u32),
                    expected: plan.expected_routes,
                    missing,
                    elapsed_ms: elapsed_ms(),
                }
            }
            None => RestartOutcome::Failed {
                reason: self
                    .state()
                    .problem
                    .unwrap_or_else(|| "no leader was elected".into()),
                elapsed_ms: elapsed_ms(),
            },
        }
    }
}

fn is_back(key: &str, status: &BusStatus) -> bool {
    status
        .sessions
        .iter()
        .any(|s| s.profile_key == key && s.live && s.reconciled)
}

/// Whether every route a restart expects is back, live and reconciled at a
/// newer epoch.
fn converged(plan: &RestartPlan, status: &BusStatus) -> bool {
    status.epoch > plan.epoch && plan.expected.iter().all(|key| is_back(key, status))
}

//! `/relay restart` as its caller sees it: ask the leader (or join a
//! restart already under way), then watch the bus until every route the
//! plan expects is back at a newer epoch, and report how it ended. When
//! the relay spans machines the plan names every machine's routes, and the
//! caller watches every machine's status (docs/CLUSTER.md).

use std::time::{Duration, Instant};

use super::handle::{Member, MemberError};
use crate::protocol::bus::*;

/// How long a restart may take to converge before it is reported partial.
pub const RESTART_WINDOW: Duration = Duration::from_secs(10);
/// How often the restart's caller looks at the bus while it converges.
const RESTART_POLL: Duration = Duration::from_millis(20);
/// How often it asks every machine, when the relay spans machines.
const CLUSTER_POLL: Duration = Duration::from_millis(200);
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
                .request(|id, generation| Restart { id, generation }, REQUEST_TIMEOUT)
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
    async fn restart_in_flight(&self) -> Option<Restarting> {
        let (plan, heard) = self.state().restarting?;
        if heard.elapsed() >= RESTART_WINDOW {
            return None;
        }
        match self.status_for(&plan).await {
            Ok(status) if converged(&plan, &status) => None,
            _ => Some(plan),
        }
    }

    /// The status a plan's convergence is judged on: this machine's, or
    /// every machine's.
    async fn status_for(&self, plan: &Restarting) -> Result<BusStatus, MemberError> {
        if plan.machines.is_empty() {
            self.status().await
        } else {
            self.cluster_status().await
        }
    }

    async fn converge(&self, plan: &Restarting, started: Instant) -> RestartOutcome {
        let deadline = started + RESTART_WINDOW;
        let elapsed_ms = || started.elapsed().as_millis() as u64;
        let mut last: Option<BusStatus> = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if let Ok(Ok(status)) = tokio::time::timeout(left, self.status_for(plan)).await
                && (status.epoch > plan.epoch || !plan.machines.is_empty())
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
            tokio::time::sleep(if plan.machines.is_empty() {
                RESTART_POLL
            } else {
                CLUSTER_POLL
            })
            .await;
        }
        match last {
            Some(status) => {
                let missing = missing(plan, &status);
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

fn is_back(key: &str, sessions: &[SessionStatus]) -> bool {
    sessions
        .iter()
        .any(|s| s.profile_key == key && s.live && s.reconciled)
}

/// The expected routes that are not back, named with their machine when
/// the relay spans machines (`key on laptop`).
fn missing(plan: &Restarting, status: &BusStatus) -> Vec<String> {
    if plan.machines.is_empty() {
        return plan
            .expected
            .iter()
            .filter(|key| !is_back(key, &status.sessions))
            .cloned()
            .collect();
    }
    let mut missing = Vec::new();
    for part in &plan.machines {
        let now = machine(status, &part.node).filter(|m| m.epoch > Some(part.epoch));
        for key in &part.expected {
            if !now.is_some_and(|m| is_back(key, &m.sessions)) {
                missing.push(format!("{key} on {}", part.node));
            }
        }
    }
    missing
}

fn machine<'a>(status: &'a BusStatus, node: &str) -> Option<&'a MachineStatus> {
    status
        .cluster
        .as_ref()
        .and_then(|c| c.machines.iter().find(|m| m.answered && m.node == node))
}

/// Whether every route a restart expects is back, live and reconciled at a
/// newer epoch (of its own machine, when the relay spans machines).
fn converged(plan: &Restarting, status: &BusStatus) -> bool {
    if plan.machines.is_empty() {
        return status.epoch > plan.epoch
            && plan
                .expected
                .iter()
                .all(|key| is_back(key, &status.sessions));
    }
    plan.machines
        .iter()
        .all(|part| machine(status, &part.node).is_some_and(|m| m.epoch > Some(part.epoch)))
        && missing(plan, status).is_empty()
}

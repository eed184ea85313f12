//! What the leader says about itself: the bus status (`/relay status`,
//! `agent-relay status`, a restart's convergence), the health of its poll
//! as the status line shows it. The session list a message outside every
//! topic gets is the control place's (`control.rs`).

use std::sync::PoisonError;

use super::poller::PollHealth;
use super::{Leader, now_ms, store_error};
use crate::protocol::bus::*;
use crate::store::BindingStatus;

impl Leader {
    /// The bus as this leader sees it: every live session, and every
    /// stored one that is away.
    pub(super) fn status(&self) -> Result<BusStatus, BusError> {
        let stored = self.store().bindings().map_err(store_error)?;
        let launches = self.session_launches();
        let conns = self.registry.lock();
        let mut sessions: Vec<SessionStatus> = conns
            .map
            .values()
            .filter_map(|c| c.session.as_ref().map(|s| (c, s)))
            .map(|(c, s)| SessionStatus {
                slot: s.route.slot,
                topic_name: s.route.topic_name.clone(),
                target: s.route.target,
                profile_key: s.route.profile_key.clone(),
                session_name: s.session_name.clone(),
                cwd: s.cwd.clone(),
                pid: s.pid,
                instance_id: s.instance_id.clone(),
                heartbeat_age_ms: c.last_seen.elapsed().as_millis() as u64,
                live: true,
                reconciled: s.reconciled,
                launch: launches.get(&s.route.profile_key).cloned(),
            })
            .collect();
        drop(conns);
        for b in stored {
            let live = sessions.iter().any(|s| s.profile_key == b.profile_key);
            if !live && b.status != BindingStatus::Offline {
                let launch = launches.get(&b.profile_key).cloned();
                sessions.push(SessionStatus {
                    slot: b.slot,
                    topic_name: b.topic_name.clone(),
                    target: b.target(),
                    profile_key: b.profile_key,
                    session_name: b.session_name,
                    cwd: b.cwd,
                    pid: 0,
                    instance_id: b.instance_id,
                    heartbeat_age_ms: now_ms().saturating_sub(b.updated_ms),
                    live: false,
                    reconciled: false,
                    launch,
                });
            }
        }
        sessions.sort_by_key(|s| (s.slot, !s.live));
        Ok(BusStatus {
            epoch: self.epoch,
            leader_pid: std::process::id(),
            leader_instance: self.instance_id.clone(),
            leader_since_ms: self.since_ms,
            sessions,
            poll: Some(self.poll_report()),
            pacing: self.pacing(),
            cluster: None,
            serve: self.serve_status(),
        })
    }

    /// The chats' message budgets, as `/relay status` shows them.
    fn pacing(&self) -> Vec<ChatPacing> {
        self.outbox
            .budgets()
            .into_iter()
            .map(|b| ChatPacing {
                chat_id: b.chat,
                used: b.used as u32,
                capacity: b.capacity as u32,
                window_ms: b.period.as_millis() as u64,
                waiting: b.waiting as u32,
                next_free_ms: b.next_free.as_millis() as u64,
                longest_wait_ms: b.longest_wait.as_millis() as u64,
                paced: b.paced,
            })
            .collect()
    }

    /// The poll health as the bus wire states it.
    pub(super) fn wire_health(&self) -> Health {
        match &*self.health.borrow() {
            PollHealth::Starting => Health::Starting,
            PollHealth::Ok => Health::Ok,
            PollHealth::Conflict => Health::Conflict,
            PollHealth::Offline(reason) => Health::Offline {
                reason: reason.clone(),
            },
            PollHealth::Unauthorized => Health::Unauthorized,
            PollHealth::Deaf(pending) => Health::Deaf { pending: *pending },
        }
    }

    /// The poll for `/relay status`.
    fn poll_report(&self) -> PollReport {
        let facts = self.poll.lock().unwrap_or_else(PoisonError::into_inner);
        PollReport {
            health: self.wire_health(),
            last_ok_age_ms: facts.last_ok.map(|at| at.elapsed().as_millis() as u64),
            pending_updates: facts.pending,
            restarts: facts.restarts,
        }
    }
}

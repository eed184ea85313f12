//! What the leader says about the bus: its status (`/relay status`,
//! `agent-relay status`, a restart's convergence, the control place's
//! session list), on this machine or on every machine of a cluster.

use std::sync::PoisonError;

use super::cluster::questions;
use super::context::Context;
use super::failure::store_error;
use super::launches::Launches;
use super::now_ms;
use crate::protocol::bus::*;
use crate::store::BindingStatus;

/// The status of the bus, as this leader sees it.
pub(super) struct Status<'a> {
    pub cx: &'a Context,
    pub launches: &'a Launches,
}

impl Status<'_> {
    /// Every machine's sessions when the relay spans machines (asked, up
    /// to 2 s), else this machine's.
    pub async fn everywhere(&self) -> Result<BusStatus, BusError> {
        let local = self.here()?;
        Ok(match &self.cx.cluster {
            Some(node) => questions::everyone(node, local).await,
            None => local,
        })
    }

    /// The bus as this leader sees it: every live session, and every
    /// stored one that is away.
    pub fn here(&self) -> Result<BusStatus, BusError> {
        let cx = self.cx;
        let stored = cx.store().bindings().map_err(store_error)?;
        let launches = self.launches.session_launches();
        let conns = cx.registry.lock();
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
            epoch: cx.epoch,
            leader_pid: std::process::id(),
            leader_instance: cx.instance_id.clone(),
            leader_since_ms: cx.since_ms,
            sessions,
            poll: Some(self.poll_report()),
            pacing: self.pacing(),
            cluster: None,
            serve: self.launches.serve_status(),
            lacking: cx.outbox.lacking(),
        })
    }

    /// The chats' message budgets, as `/relay status` shows them.
    fn pacing(&self) -> Vec<ChatPacing> {
        self.cx
            .outbox
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

    /// The poll for `/relay status`.
    fn poll_report(&self) -> PollReport {
        let facts = self.cx.poll.lock().unwrap_or_else(PoisonError::into_inner);
        PollReport {
            health: self.cx.wire_health(),
            last_ok_age_ms: facts.last_ok.map(|at| at.elapsed().as_millis() as u64),
            pending_updates: facts.pending,
            restarts: facts.restarts,
        }
    }
}

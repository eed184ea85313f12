//! `/relay restart` at the leader: answers with the plan, tells every
//! session, and steps down. The member that owns this leader then
//! releases the lock, and the bus elects a leader again; sessions come
//! back on their own. When the relay spans machines, every machine does
//! so (`cluster/questions.rs`).

use std::sync::Arc;

use super::Leader;
use super::registry::ConnId;
use crate::protocol::bus::*;

/// Asks for a restart on behalf of the session on `conn`.
pub(super) fn restart(leader: &Arc<Leader>, conn: ConnId, req: &Restart) {
    if let Err(e) = leader.registry.session(conn, req.generation) {
        leader
            .registry
            .send(conn, leader.ack::<Restart>(Some(req.id), Err(e)));
        return;
    }
    if leader.cluster.is_some() {
        let leader = leader.clone();
        let id = req.id;
        crate::tasks::spawn(async move {
            let plan = leader.restart_cluster().await;
            leader
                .registry
                .send(conn, leader.ack::<Restart>(Some(id), plan));
        });
        return;
    }
    let mut first = false;
    let plan = leader.restarting.get_or_init(|| {
        first = true;
        let mut expected: Vec<String> = leader
            .registry
            .lock()
            .live()
            .filter(|(_, s)| s.ready)
            .map(|(_, s)| s.route.profile_key.clone())
            .collect();
        expected.sort();
        let count = expected.len() as u32;
        Restarting {
            epoch: leader.epoch,
            expected_instances: count,
            expected_routes: count,
            expected,
            machines: Vec::new(),
        }
    });
    leader
        .registry
        .send(conn, leader.ack::<Restart>(Some(req.id), Ok(plan.clone())));
    if first {
        tracing::info!(
            routes = plan.expected_routes,
            "restarting the relay on request"
        );
        leader.step_down_for(plan);
    }
}

impl Leader {
    /// Tells this machine's sessions about a restart, and steps down.
    pub(super) fn step_down_for(&self, plan: &Restarting) {
        self.registry
            .broadcast(&FromLeader::Restarting(plan.clone()));
        self.stop.cancel();
    }
}

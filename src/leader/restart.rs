//! `/relay restart` at the leader ([`Restart`]): answers with the plan,
//! tells every session, and steps down. The member that owns this leader
//! then releases the lock, and the bus elects a leader again; sessions come
//! back on their own. When the relay spans machines, every machine does
//! so (docs/CLUSTER.md): the plan names every machine's live sessions.

use std::sync::{Arc, OnceLock};

use super::cluster::questions;
use super::context::Context;
use super::launches::Launches;
use super::registry::ConnId;
use super::status::Status;
use crate::protocol::bus::{self, Ack, BusError, BusErrorCode, FromLeader, Restarting};

/// A restart of the relay, asked once per leader.
pub(super) struct Restart {
    cx: Arc<Context>,
    /// Whose sessions the plan expects back.
    launches: Arc<Launches>,
    /// The restart this leader is stepping down for, once one was asked:
    /// a second request joins it.
    restarting: OnceLock<Restarting>,
}

impl Restart {
    pub fn new(cx: Arc<Context>, launches: Arc<Launches>) -> Self {
        Self {
            cx,
            launches,
            restarting: OnceLock::new(),
        }
    }

    /// Asks for a restart on behalf of the session on `conn`; answers it
    /// with the plan.
    pub fn request(self: &Arc<Self>, conn: ConnId, req: &bus::Restart) {
        let ack = |plan: Result<Restarting, BusError>| {
            FromLeader::Ack(Ack::answer::<bus::Restart>(
                Some(req.id),
                self.cx.epoch,
                plan,
            ))
        };
        if let Err(e) = self.cx.registry.session(conn, req.generation) {
            self.cx.registry.send(conn, ack(Err(e)));
            return;
        }
        if self.cx.cluster.is_some() {
            let (restart, id) = (self.clone(), req.id);
            crate::tasks::spawn(async move {
                let plan = restart.everywhere().await;
                let ack = Ack::answer::<bus::Restart>(Some(id), restart.cx.epoch, plan);
                restart.cx.registry.send(conn, FromLeader::Ack(ack));
            });
            return;
        }
        let mut first = false;
        let plan = self.restarting.get_or_init(|| {
            first = true;
            let mut expected: Vec<String> = self
                .cx
                .registry
                .lock()
                .live()
                .filter(|(_, s)| s.ready)
                .map(|(_, s)| s.route.profile_key.clone())
                .collect();
            expected.sort();
            let count = expected.len() as u32;
            Restarting {
                epoch: self.cx.epoch,
                expected_instances: count,
                expected_routes: count,
                expected,
                machines: Vec::new(),
            }
        });
        self.cx.registry.send(conn, ack(Ok(plan.clone())));
        if first {
            tracing::info!(
                routes = plan.expected_routes,
                "restarting the relay on request"
            );
            self.step_down_for(plan);
        }
    }

    /// `/relay restart` across machines (docs/CLUSTER.md): the plan names
    /// every machine's live sessions at its current epoch; every machine's
    /// leader steps down as a single machine's does, and the caller
    /// watches them all come back.
    async fn everywhere(&self) -> Result<Restarting, BusError> {
        if let Some(plan) = self.restarting.get() {
            return Ok(plan.clone());
        }
        let node = self
            .cx
            .cluster
            .as_ref()
            .ok_or_else(|| BusError::new(BusErrorCode::Internal, "no cluster is configured"))?;
        let cluster = questions::for_restart(node)?;
        let status = Status {
            cx: &self.cx,
            launches: &self.launches,
        }
        .everywhere()
        .await?;
        let plan = questions::plan_of(self.cx.epoch, &status, node.name());
        let plan = self.restarting.get_or_init(|| plan).clone();
        let told = questions::restart_others(node, &cluster, &plan).await;
        tracing::info!(
            machines = plan.machines.len(),
            told,
            routes = plan.expected_routes,
            "restarting the relay on every machine"
        );
        self.step_down_for(&plan);
        Ok(plan)
    }

    /// Another machine's `/relay restart`: this machine steps down for its
    /// plan (or for the one it is stepping down for already).
    pub fn asked_by_another_machine(&self, plan: Restarting) {
        let plan = self.restarting.get_or_init(|| plan).clone();
        self.step_down_for(&plan);
    }

    /// Tells this machine's sessions about a restart, and steps down.
    fn step_down_for(&self, plan: &Restarting) {
        self.cx
            .registry
            .broadcast(&FromLeader::Restarting(plan.clone()));
        self.cx.stop.cancel();
    }
}

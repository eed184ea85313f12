//! What the machines of a cluster ask each other (docs/CLUSTER.md): every
//! machine's sessions for `/relay status` and the session list, `/relay
//! restart` on every machine, and an order for another machine's `serve`.
//! The asking side is here for the leader's flows; the answering side
//! serves, for the leader's life, what [`Machine`] answers.

use std::sync::Arc;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::Machine;
use super::claims::cluster_down;
use super::node::ClusterNode;
use crate::cluster::Cluster;
use crate::cluster::NodeName;
use crate::cluster::nodes::Question;
use crate::protocol::bus::*;
use crate::protocol::launch::{RemoteDone, RemoteOp, RemoteOrder};

/// `local`, this machine's status, with every other machine's sessions
/// (asked, up to 2 s), for `/relay status` and a restart's convergence.
/// Long because asking, waiting for and merging every machine's answer is
/// one bounded exchange.
pub(in crate::leader) async fn everyone(node: &ClusterNode, mut status: BusStatus) -> BusStatus {
    let link = node.link().borrow().clone();
    let me = node.name().clone();
    let mut machines = vec![MachineStatus {
        node: me.to_string(),
        answered: true,
        epoch: Some(status.epoch),
        sessions: status.sessions.clone(),
        serve: status.serve.clone(),
    }];
    if let Some(cluster) = node.cluster().filter(|_| node.is_up()) {
        let known: Vec<NodeName> = match cluster.claims().nodes().await {
            Ok(nodes) => nodes.into_iter().filter(|n| *n != me).collect(),
            Err(e) => {
                tracing::debug!("cannot list the machines: {e}");
                Vec::new()
            }
        };
        let answers: Vec<(NodeName, BusStatus)> = cluster
            .ask_nodes(Question::Status, &(), &known)
            .await
            .unwrap_or_else(|e| {
                tracing::debug!("cannot ask the machines: {e}");
                Vec::new()
            });
        for (name, theirs) in answers.into_iter().filter(|(n, _)| *n != me) {
            machines.push(MachineStatus {
                node: name.to_string(),
                answered: true,
                epoch: Some(theirs.epoch),
                sessions: theirs.sessions,
                serve: theirs.serve,
            });
        }
        for name in known {
            if !machines.iter().any(|m| m.node == name.as_str()) {
                machines.push(MachineStatus {
                    node: name.to_string(),
                    answered: false,
                    epoch: None,
                    sessions: Vec::new(),
                    serve: None,
                });
            }
        }
    }
    // This machine first, then the others by name.
    machines[1..].sort_by(|a, b| a.node.cmp(&b.node));
    status.cluster = Some(ClusterStatus {
        node: me.to_string(),
        link: link.state,
        polled_by: link.polled_by.clone(),
        term: node.leadership().borrow().term().map(|t| t.0),
        machines,
    });
    status
}

/// The connection to the other machines, or why a restart cannot reach
/// them.
pub(in crate::leader) fn for_restart(node: &ClusterNode) -> Result<Cluster, BusError> {
    node.cluster().filter(|_| node.is_up()).ok_or_else(|| {
        BusError::new(
            BusErrorCode::Unavailable,
            format!(
                "{}; /relay restart restarts every machine and needs the cluster",
                cluster_down(node)
            ),
        )
    })
}

/// Tells every other machine of `plan` to restart (docs/CLUSTER.md); each
/// steps down as a single machine's leader does. Answers how many heard.
pub(in crate::leader) async fn restart_others(
    node: &ClusterNode,
    cluster: &Cluster,
    plan: &Restarting,
) -> usize {
    let others: Vec<NodeName> = plan
        .machines
        .iter()
        .filter(|m| m.node != node.name().as_str())
        .filter_map(|m| NodeName::parse(&m.node).ok())
        .collect();
    let told: Vec<(NodeName, bool)> = cluster
        .ask_nodes(Question::Restart, plan, &others)
        .await
        .unwrap_or_default();
    told.len()
}

/// A restart's plan: every machine that answered, with its live sessions
/// at its current epoch.
pub(in crate::leader) fn plan_of(epoch: Epoch, status: &BusStatus, me: &NodeName) -> Restarting {
    let machines: Vec<MachinePlan> = status
        .cluster
        .iter()
        .flat_map(|c| &c.machines)
        .filter(|m| m.answered)
        .map(|m| {
            let mut expected: Vec<String> = m
                .sessions
                .iter()
                .filter(|s| s.live)
                .map(|s| s.profile_key.clone())
                .collect();
            expected.sort();
            MachinePlan {
                node: m.node.clone(),
                epoch: m.epoch.unwrap_or_default(),
                expected,
            }
        })
        .collect();
    let mine = machines.iter().find(|m| m.node == me.as_str());
    let expected = mine.map(|m| m.expected.clone()).unwrap_or_default();
    let routes: usize = machines.iter().map(|m| m.expected.len()).sum();
    Restarting {
        epoch,
        expected_instances: routes as u32,
        expected_routes: routes as u32,
        expected,
        machines,
    }
}

/// Runs `op` with machine `name`'s `serve`, through the cluster (`/new
/// box:…`, a button for another machine's session); `this` is this
/// machine in the cluster, if the relay spans machines.
pub(in crate::leader) async fn ask_machine(
    this: Option<&ClusterNode>,
    name: &str,
    op: RemoteOp,
) -> RemoteDone {
    let refused = |text: String| RemoteDone {
        ok: false,
        text: format!("⚠️ Not done: {}", crate::render::escape(&text)),
    };
    let Some(this) = this else {
        return refused(format!(
            "no machine named {name}: this relay runs on one machine"
        ));
    };
    let Some(cluster) = this.cluster().filter(|_| this.is_up()) else {
        return refused(format!(
            "{}; machine {name} cannot be asked",
            cluster_down(this)
        ));
    };
    let Ok(node) = NodeName::parse(name) else {
        return refused(format!("{name:?} is not a machine's name"));
    };
    let order = RemoteOrder {
        node: Some(name.to_string()),
        order: op,
    };
    let window = crate::protocol::launch::START_WAIT + std::time::Duration::from_secs(10);
    let answers: Vec<(NodeName, RemoteDone)> = cluster
        .ask_nodes_within(
            Question::Launch,
            &order,
            std::slice::from_ref(&node),
            window,
        )
        .await
        .unwrap_or_default();
    answers
        .into_iter()
        .find(|(n, _)| *n == node)
        .map(|(_, done)| done)
        .unwrap_or_else(|| {
            refused(format!(
                "machine {name} did not answer (is it on, with its relay and agent-relay serve running?)"
            ))
        })
}

/// Runs the orders other machines hand this machine's `serve` (`/new
/// box:…` asked where the control place is answered); orders for another
/// machine are left to it.
pub(super) async fn answer_launch<M: Machine>(
    machine: Arc<M>,
    cluster: Cluster,
    stop: CancellationToken,
) {
    let Ok(mut questions) = cluster.answer_nodes(Question::Launch).await else {
        tracing::warn!("cannot answer the other machines' launch orders");
        return;
    };
    let me = cluster.node().name.to_string();
    loop {
        let asked = tokio::select! {
            () = stop.cancelled() => return,
            asked = questions.next::<RemoteOrder>() => asked,
        };
        let Some(asked) = asked else { return };
        if asked.request.node.as_deref() != Some(me.as_str()) {
            continue;
        }
        tracing::info!(by = %asked.from, "an order for this machine's serve");
        let machine = machine.clone();
        crate::tasks::spawn(async move {
            let done = machine.launch(asked.request.order.clone()).await;
            if let Err(e) = asked.answer(&done).await {
                tracing::warn!("cannot answer a launch order: {e}");
            }
        });
    }
}

/// Answers the other machines' `/relay status` with this machine's sessions.
pub(super) async fn answer_status<M: Machine>(
    machine: Arc<M>,
    cluster: Cluster,
    stop: CancellationToken,
) {
    let Ok(mut questions) = cluster.answer_nodes(Question::Status).await else {
        tracing::warn!("cannot answer the other machines' status questions");
        return;
    };
    loop {
        let asked = tokio::select! {
            () = stop.cancelled() => return,
            asked = questions.next::<Value>() => asked,
        };
        let Some(asked) = asked else { return };
        match machine.status() {
            Ok(status) => {
                if let Err(e) = asked.answer(&status).await {
                    tracing::debug!("cannot answer a status question: {e}");
                }
            }
            Err(e) => tracing::warn!("cannot read this machine's status: {e}"),
        }
    }
}

/// Restarts this machine's relay when another machine asks (its
/// `/relay restart`).
pub(super) async fn answer_restart<M: Machine>(
    machine: Arc<M>,
    cluster: Cluster,
    stop: CancellationToken,
) {
    let Ok(mut questions) = cluster.answer_nodes(Question::Restart).await else {
        tracing::warn!("cannot answer the other machines' restarts");
        return;
    };
    loop {
        let asked = tokio::select! {
            () = stop.cancelled() => return,
            asked = questions.next::<Restarting>() => asked,
        };
        let Some(asked) = asked else { return };
        if asked.from == cluster.node().name {
            // Our own question: the asker steps down by itself.
            continue;
        }
        tracing::info!(by = %asked.from, "restarting the relay, asked by another machine");
        let plan = asked.request.clone();
        let _ = asked.answer(&true).await;
        machine.restart(plan);
        return;
    }
}

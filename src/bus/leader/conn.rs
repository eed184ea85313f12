//! One bus connection: a reader loop and a writer task joined by a bounded
//! channel, so the leader can push deliveries at any time and a slow
//! follower can never stall the others (its channel fills and it is
//! dropped). Requests that may wait (on a profile lock, on Telegram) run as
//! tasks of the connection, so heartbeats keep flowing meanwhile.

use std::sync::Arc;
use std::time::Duration;

use interprocess::local_socket::tokio::Stream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::Leader;
use super::registry::ConnId;
use crate::bus::wire::{self, Received};
use crate::protocol::bus::*;

/// Most frames written to one follower with one flush.
const WRITE_BURST: usize = 256;

/// How many frames may wait for one follower before it counts as stuck.
const OUTBOX_FRAMES: usize = 4096;

pub(super) async fn serve(leader: Arc<Leader>, stream: Stream) {
    // Only processes of the same user may join the bus.
    if let Err(e) = crate::bus::election::check_peer_is_me(&stream) {
        tracing::warn!("refused a bus connection: {e}");
        return;
    }
    let (mut reader, mut writer) = wire::split(stream);
    let (outbox, mut outgoing) = mpsc::channel::<FromLeader>(OUTBOX_FRAMES);
    let close = CancellationToken::new();
    let id = match leader.registry.open(outbox, close.clone()) {
        Ok(id) => id,
        Err(why) => {
            tracing::warn!("refused a bus connection: {why}");
            return;
        }
    };
    let writer_close = close.clone();
    let writer_task = tokio::spawn(async move {
        // Whatever queued up meanwhile goes out in one write.
        let mut burst = Vec::with_capacity(WRITE_BURST);
        while outgoing.recv_many(&mut burst, WRITE_BURST).await > 0 {
            if let Err(e) = writer.send_all(&burst).await {
                tracing::debug!("bus write failed: {e}");
                break;
            }
            burst.clear();
        }
        writer_close.cancel();
    });
    let mut requests = JoinSet::new();
    loop {
        let incoming = tokio::select! {
            () = close.cancelled() => break,
            () = leader.stop.cancelled() => break,
            incoming = reader.recv::<ToLeader>() => incoming,
            Some(_) = requests.join_next(), if !requests.is_empty() => continue,
        };
        match incoming {
            Ok(Some(Received::Envelope(envelope))) => {
                leader.registry.touch(id);
                handle(&leader, id, envelope, &mut requests);
            }
            Ok(Some(Received::Malformed { id: request, error })) => {
                tracing::debug!(conn = id, "malformed bus frame: {error}");
                leader.registry.send(
                    id,
                    leader.ack::<()>(request, Err(BusError::new(BusErrorCode::BadFrame, error))),
                );
            }
            Ok(Some(Received::Oversized)) => {
                tracing::warn!(conn = id, "oversized bus frame; closing that connection");
                break;
            }
            Ok(None) => break,
            Err(e) => {
                tracing::debug!(conn = id, "bus read failed: {e}");
                break;
            }
        }
    }
    // Wait for the cancelled requests so none of them writes after we leave.
    requests.shutdown().await;
    if let Some(session) = leader.registry.remove(id) {
        tracing::info!(slot = %session.route.slot, "session left the bus; its binding stays");
    }
    // Removing the registry entry dropped the outbox sender: the writer
    // drains what is queued (an ack, an error) and ends.
    let _ = tokio::time::timeout(Duration::from_secs(1), writer_task).await;
}

/// Runs one request. Quick ones are answered inline; those that may wait on
/// a lock or on Telegram get a task.
fn handle(leader: &Arc<Leader>, conn: ConnId, envelope: ToLeader, requests: &mut JoinSet<()>) {
    let reply = |id: u64, result| leader.registry.send(conn, leader.ack(Some(id), result));
    match envelope {
        ToLeader::Heartbeat(hb) => {
            reply(
                hb.id,
                leader
                    .registry
                    .session(conn, hb.generation)
                    .map(drop)
                    .map(|()| serde_json::Value::Null),
            );
        }
        ToLeader::Status(q) if q.cluster && leader.cluster.is_some() => {
            // Every machine is asked: up to 2 s, off the reader.
            let leader = leader.clone();
            requests.spawn(async move {
                let status = leader.cluster_status().await;
                leader.registry.send(conn, leader.ack(Some(q.id), status));
            });
        }
        ToLeader::Status(q) => {
            leader
                .registry
                .send(conn, leader.ack(Some(q.id), leader.status()));
        }
        ToLeader::DeliveryAck(ack) => match leader.registry.session(conn, ack.generation) {
            Ok(session) => leader
                .router
                .delivered(session.route.profile_key, ack.delivery_id),
            Err(_) => tracing::debug!("delivery ack with a stale generation ignored"),
        },
        ToLeader::Reconcile(req) => {
            leader
                .registry
                .send(conn, leader.ack(Some(req.id), leader.reconcile(conn, &req)));
        }
        ToLeader::Restart(req) => super::restart(leader, conn, &req),
        ToLeader::Pair(req) => {
            let leader = leader.clone();
            requests.spawn(async move {
                let result = leader.pair(conn, req.generation).await;
                leader.registry.send(conn, leader.ack(Some(req.id), result));
            });
        }
        ToLeader::Register(req) => {
            let leader = leader.clone();
            requests.spawn(async move {
                let (id, generation) = (req.id, req.registration_generation);
                let result = leader.register(conn, req).await;
                let registered = result.is_ok();
                leader.registry.send(conn, leader.ack(Some(id), result));
                if registered {
                    leader
                        .registry
                        .send(conn, FromLeader::Health(leader.wire_health()));
                    if let Some(frame) = leader.wire_cluster() {
                        leader.registry.send(conn, frame);
                    }
                    leader.go_live(conn, generation);
                }
            });
        }
        ToLeader::Disconnect(req) => {
            let leader = leader.clone();
            requests.spawn(async move {
                let result = leader.disconnect(conn, req.generation).await;
                leader.registry.send(conn, leader.ack(Some(req.id), result));
            });
        }
        ToLeader::Fetch(req) => {
            let leader = leader.clone();
            requests.spawn(async move {
                let result = leader.fetch(conn, &req).await;
                leader.registry.send(conn, leader.ack(Some(req.id), result));
            });
        }
        ToLeader::Topic(req) => {
            let leader = leader.clone();
            requests.spawn(async move {
                let result = leader.topic(conn, &req).await;
                leader.registry.send(conn, leader.ack(Some(req.id), result));
            });
        }
    }
}

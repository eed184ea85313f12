//! One bus connection: a reader loop and a writer task joined by a bounded
//! channel, so the leader can push deliveries at any time and a slow
//! follower can never stall the others (its channel fills and it is
//! dropped). Requests that may wait (on a profile lock, on Telegram) run as
//! tasks of the connection, so heartbeats keep flowing meanwhile.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;

use interprocess::local_socket::tokio::Stream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::Leader;
use super::registry::ConnId;
use crate::bus::wire::{self, Received, WireWriter};
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
    let (mut reader, writer) = wire::split(stream);
    let (outbox, outgoing) = mpsc::channel::<FromLeader>(OUTBOX_FRAMES);
    let close = CancellationToken::new();
    let id = match leader.registry.open(outbox, close.clone()) {
        Ok(id) => id,
        Err(why) => {
            tracing::warn!("refused a bus connection: {why}");
            return;
        }
    };
    let writer_task = crate::tasks::spawn(write_frames(writer, outgoing, close.clone()));
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
    leader.launcher_gone(id);
    // Removing the registry entry dropped the outbox sender: the writer
    // drains what is queued (an ack, an error) and ends.
    let _ = tokio::time::timeout(Duration::from_secs(1), writer_task).await;
}

/// The connection's writer: whatever queued up meanwhile goes out in one
/// write. A failed write closes the connection.
async fn write_frames(
    mut writer: WireWriter,
    mut outgoing: mpsc::Receiver<FromLeader>,
    close: CancellationToken,
) {
    let mut burst = Vec::with_capacity(WRITE_BURST);
    while outgoing.recv_many(&mut burst, WRITE_BURST).await > 0 {
        if let Err(e) = writer.send_all(&burst).await {
            tracing::debug!("bus write failed: {e}");
            break;
        }
        burst.clear();
    }
    close.cancel();
}

/// Runs one request. Quick ones are answered inline; those that may wait on
/// a lock or on Telegram get a task of the connection.
///
/// Long because it is the one match over the requests a member sends:
/// each one's answer, inline or as a task, stands beside the others.
fn handle(leader: &Arc<Leader>, conn: ConnId, envelope: ToLeader, requests: &mut JoinSet<()>) {
    let reply = |id: u64, result| leader.registry.send(conn, leader.ack(Some(id), result));
    // Sends the ack `answer` comes to, off the reader.
    let mut later = |answer: BoxFuture<'static, FromLeader>| {
        let leader = leader.clone();
        requests.spawn(crate::tasks::boxed(async move {
            let frame = answer.await;
            leader.registry.send(conn, frame);
        }));
    };
    let this = leader.clone();
    match envelope {
        ToLeader::Heartbeat(hb) => {
            let alive = leader.registry.lock().alive(conn, hb.generation);
            reply(hb.id, alive.map(|()| Value::Null))
        }
        ToLeader::Serve(hello) => reply(
            hello.id,
            leader.serve_hello(conn, &hello).and_then(to_value),
        ),
        ToLeader::OrderDone(done) => reply(
            done.id,
            leader.order_done(conn, &done).map(|()| Value::Null),
        ),
        ToLeader::LaunchReport(report) => reply(
            report.id,
            leader.launch_report(conn, &report).map(|()| Value::Null),
        ),
        // Every machine is asked: up to 2 s.
        ToLeader::Status(q) if q.cluster && leader.cluster.is_some() => {
            later(Box::pin(async move {
                this.ack(Some(q.id), this.cluster_status().await)
            }))
        }
        ToLeader::Status(q) => leader
            .registry
            .send(conn, leader.ack(Some(q.id), leader.status())),
        ToLeader::DeliveryAck(ack) => match leader.registry.session(conn, ack.generation) {
            Ok(session) => leader
                .router
                .delivered(session.route.profile_key, ack.delivery_id),
            Err(_) => tracing::debug!("delivery ack with a stale generation ignored"),
        },
        ToLeader::Reconcile(req) => leader
            .registry
            .send(conn, leader.ack(Some(req.id), leader.reconcile(conn, &req))),
        ToLeader::Restart(req) => super::restart::restart(leader, conn, &req),
        ToLeader::Pair(req) => later(Box::pin(async move {
            this.ack(Some(req.id), this.pair(conn, req.generation).await)
        })),
        ToLeader::Register(req) => {
            requests.spawn(crate::tasks::boxed(register(this, conn, req)));
        }
        ToLeader::Disconnect(req) => later(Box::pin(async move {
            this.ack(Some(req.id), this.disconnect(conn, req.generation).await)
        })),
        ToLeader::Fetch(req) => later(Box::pin(async move {
            this.ack(Some(req.id), this.fetch(conn, &req).await)
        })),
        ToLeader::Topic(req) => later(Box::pin(async move {
            this.ack(Some(req.id), this.topic(conn, &req).await)
        })),
        ToLeader::Post(req) => later(Box::pin(async move {
            this.ack(Some(req.id), this.post(conn, &req).await)
        })),
        ToLeader::Resend(req) => later(Box::pin(async move {
            this.ack(Some(req.id), this.resend(conn, &req).await)
        })),
    }
}

fn to_value<T: serde::Serialize>(value: T) -> Result<Value, BusError> {
    serde_json::to_value(value).map_err(|e| BusError::new(BusErrorCode::Internal, e.to_string()))
}

/// Registers, answers, and only then starts deliveries: the session knows
/// its route before its first message arrives.
async fn register(leader: Arc<Leader>, conn: ConnId, req: Register) {
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
        // What waited for this session's topic may go now.
        leader.courier.wake();
        if let Ok(session) = leader.registry.session(conn, generation) {
            leader.report_outbox(&session.route.profile_key);
        }
    }
}

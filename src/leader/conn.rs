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
use crate::bus::wire::{self, Received, WireWriter};
use crate::protocol::bus::*;

/// Most frames written to one follower with one flush.
const WRITE_BURST: usize = 256;

/// How many frames may wait for one follower before it counts as stuck.
const OUTBOX_FRAMES: usize = 4096;

pub(super) async fn serve(leader: Arc<Leader>, stream: Stream) {
    // Only processes of the same user may join the bus.
    let cx = leader.cx.clone();
    if let Err(e) = crate::bus::election::check_peer_is_me(&stream) {
        tracing::warn!("refused a bus connection: {e}");
        return;
    }
    let (mut reader, writer) = wire::split(stream);
    let (outbox, outgoing) = mpsc::channel::<FromLeader>(OUTBOX_FRAMES);
    let close = CancellationToken::new();
    let id = match cx.registry.open(outbox, close.clone()) {
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
            () = cx.stop.cancelled() => break,
            incoming = reader.recv::<ToLeader>() => incoming,
            Some(_) = requests.join_next(), if !requests.is_empty() => continue,
        };
        match incoming {
            Ok(Some(Received::Envelope(envelope))) => {
                cx.registry.touch(id);
                handle(&leader, id, envelope, &mut requests);
            }
            Ok(Some(Received::Malformed { id: request, error })) => {
                tracing::debug!(conn = id, "malformed bus frame: {error}");
                cx.registry.send(
                    id,
                    leader.ack::<Heartbeat>(
                        request,
                        Err(BusError::new(BusErrorCode::BadFrame, error)),
                    ),
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
    if let Some(session) = cx.registry.remove(id) {
        tracing::info!(slot = %session.route.slot, "session left the bus; its binding stays");
    }
    leader.launches.launcher_gone(id);
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
        if crate::logging::milestones_on() {
            for frame in &burst {
                if let FromLeader::Deliver(deliver) = frame {
                    crate::logging::milestone("framed", deliver.update_id);
                }
            }
        }
        burst.clear();
    }
    close.cancel();
}

/// Runs one request. Quick ones are answered inline; those that may wait on
/// a lock or on Telegram get a task of the connection.
fn handle(leader: &Arc<Leader>, conn: ConnId, envelope: ToLeader, requests: &mut JoinSet<()>) {
    let mut reply = Reply {
        leader,
        conn,
        requests,
    };
    let this = leader.clone();
    match envelope {
        ToLeader::Heartbeat(hb) => {
            let alive = leader.cx.registry.lock().alive(conn, hb.generation);
            reply.now(&hb, alive);
        }
        ToLeader::Serve(hello) => reply.now(&hello, leader.launches.serve_hello(conn, &hello)),
        ToLeader::OrderDone(done) => reply.now(&done, leader.launches.order_done(conn, &done)),
        ToLeader::LaunchReport(report) => {
            reply.now(&report, leader.launches.launch_report(conn, &report))
        }
        // Every machine is asked: up to 2 s.
        ToLeader::Status(q) if q.cluster && leader.cx.cluster.is_some() => {
            reply.later::<StatusQuery>(q.id, async move { this.status_view().everywhere().await })
        }
        ToLeader::Status(q) => reply.now(&q, leader.status()),
        ToLeader::DeliveryAck(ack) => match leader.cx.registry.session(conn, ack.generation) {
            Ok(session) => leader
                .router
                .delivered(session.route.profile_key, ack.delivery_id),
            Err(_) => tracing::debug!("delivery ack with a stale generation ignored"),
        },
        ToLeader::Reconcile(req) => reply.now(&req, leader.registrations.reconcile(conn, &req)),
        ToLeader::Restart(req) => leader.restart.request(conn, &req),
        ToLeader::Pair(req) => reply.later::<Pair>(req.id, async move {
            super::pairing::link(&this.cx, conn, req.generation).await
        }),
        ToLeader::Register(req) => {
            reply
                .requests
                .spawn(crate::tasks::boxed(register(this, conn, req)));
        }
        ToLeader::Disconnect(req) => reply.later::<Disconnect>(req.id, async move {
            this.registrations.disconnect(conn, req.generation).await
        }),
        ToLeader::Fetch(req) => {
            reply.later::<Fetch>(req.id, async move { this.files.fetch(conn, &req).await })
        }
        ToLeader::Topic(req) => reply
            .later::<TopicRequest>(req.id, async move { this.topics.request(conn, &req).await }),
        ToLeader::Post(req) => {
            reply.later::<Post>(req.id, async move { this.courier.post(conn, &req).await })
        }
        ToLeader::Resend(req) => {
            reply.later::<Resend>(req.id, async move { this.courier.resend(conn, &req).await })
        }
    }
}

/// Answers the requests of one connection, typed by the request.
struct Reply<'a> {
    leader: &'a Arc<Leader>,
    conn: ConnId,
    requests: &'a mut JoinSet<()>,
}

impl Reply<'_> {
    /// Answers `request` at once.
    fn now<R: Request>(&self, request: &R, result: Result<R::Reply, BusError>) {
        let frame = self.leader.ack::<R>(Some(request.id()), result);
        self.leader.cx.registry.send(self.conn, frame);
    }

    /// Answers request `id` with what `answer` comes to, off the reader.
    fn later<R: Request + 'static>(
        &mut self,
        id: u64,
        answer: impl Future<Output = Result<R::Reply, BusError>> + Send + 'static,
    ) {
        let (leader, conn) = (self.leader.clone(), self.conn);
        self.requests.spawn(crate::tasks::boxed(async move {
            let frame = leader.ack::<R>(Some(id), answer.await);
            leader.cx.registry.send(conn, frame);
        }));
    }
}

/// Registers, answers, and only then starts deliveries: the session knows
/// its route before its first message arrives.
async fn register(leader: Arc<Leader>, conn: ConnId, req: Register) {
    let cx = &leader.cx;
    let (id, generation) = (req.id, req.registration_generation);
    let result = leader.registrations.register(conn, req).await;
    let registered = result.is_ok();
    if registered {
        crate::logging::milestone("register", 0);
    }
    cx.registry
        .send(conn, leader.ack::<Register>(Some(id), result));
    if registered {
        cx.registry.send(conn, FromLeader::Health(cx.wire_health()));
        if let Some(frame) = leader.wire_cluster() {
            cx.registry.send(conn, frame);
        }
        leader.router.go_live(conn, generation);
        // What waited for this session's topic may go now.
        leader.courier.wake();
        if let Ok(session) = cx.registry.session(conn, generation) {
            leader.courier.report_outbox(&session.route.profile_key);
        }
    }
}

//! The cluster layer (`src/cluster/`, docs/CLUSTER.md) against real
//! `nats-server -js` processes on loopback: the lease, the inbound stream,
//! claims, calls, a server restart and a three-server cluster losing one.
//!
//! Every wait is bounded; every server is killed when its test ends (also
//! on a panic); every store lives in a temporary directory. Timing bounds
//! are the design's own (the lease time plus a margin), never speed.

use crate::nats;

use std::time::Duration;

use agent_relay::cluster::calls::CallError;
use agent_relay::cluster::claims::ClaimKey;
use agent_relay::cluster::inbound::RoutedUpdate;
use agent_relay::cluster::lease::{LEASE_TIME, Leadership, LeaseKeeper, STEP_DOWN_AFTER, Term};
use agent_relay::cluster::{
    BotId, Cluster, ClusterConfig, ClusterError, ClusterTlsFile, Link, NatsCredentials, NatsUrl,
    NkeySeed, NodeName,
};
use nats::NatsServer;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio::time::Instant;

const BOT: BotId = BotId(123456789);

/// Past the lease time, what a takeover may take: the contender's retry,
/// the server's expiry timer and a loaded machine.
const MARGIN: Duration = Duration::from_secs(4);

/// How long anything else may take.
const WAIT: Duration = Duration::from_secs(20);

fn config(urls: &[String], node: &str) -> ClusterConfig {
    ClusterConfig {
        servers: urls.iter().map(|u| NatsUrl::parse(u).unwrap()).collect(),
        credentials: None,
        require_tls: false,
        tls: ClusterTlsFile::default(),
        node: NodeName::parse(node).unwrap(),
    }
}

/// Connects node `node` (machine id `id`), retrying while a fresh
/// JetStream cluster elects its meta leader.
async fn connect(urls: &[String], node: &str, id: &str) -> Cluster {
    let start = Instant::now();
    loop {
        match Cluster::connect(&config(urls, node), BOT, id).await {
            Ok(cluster) => return cluster,
            Err(e) if start.elapsed() < WAIT => {
                eprintln!("connecting {node}: {e}; again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("cannot connect {node}: {e}"),
        }
    }
}

/// Waits until `leadership` satisfies `ok`, at most `within`.
async fn until(
    leadership: &mut watch::Receiver<Leadership>,
    within: Duration,
    ok: impl Fn(&Leadership) -> bool,
) -> Leadership {
    let found = tokio::time::timeout(within, leadership.wait_for(|l| ok(l)))
        .await
        .ok()
        .and_then(Result::ok)
        .map(|l| l.clone());
    found.unwrap_or_else(|| {
        panic!(
            "leadership is still {:?} after {within:?}",
            *leadership.borrow()
        )
    })
}

fn leading(l: &Leadership) -> bool {
    matches!(l, Leadership::Leading { .. })
}

macro_rules! nats_server {
    ($dir:ident, $server:ident) => {
        let Some(binary) = nats::binary() else { return };
        let $dir = tempfile::tempdir().unwrap();
        #[allow(unused_mut)]
        let mut $server = NatsServer::start(&binary, $dir.path());
    };
}

#[tokio::test]
async fn three_contenders_one_lease() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let mut keepers = Vec::new();
    for (name, id) in [("a", "id-a"), ("b", "id-b"), ("c", "id-c")] {
        keepers.push(connect(&urls, name, id).await.campaign());
    }
    let mut views: Vec<_> = keepers.iter().map(|k| k.leadership()).collect();
    // Someone leads…
    let start = Instant::now();
    while !views.iter().any(|v| leading(&v.borrow())) {
        assert!(start.elapsed() < WAIT, "nobody took the lease");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // …and over two lease times (renewals included), never two at once,
    // and the others name the same leader and term.
    let watch_until = Instant::now() + LEASE_TIME * 2;
    let mut terms = std::collections::BTreeSet::new();
    while Instant::now() < watch_until {
        let now: Vec<Leadership> = views
            .iter_mut()
            .map(|v| v.borrow_and_update().clone())
            .collect();
        let leaders: Vec<&Leadership> = now.iter().filter(|l| leading(l)).collect();
        assert!(leaders.len() <= 1, "two leaders at once: {now:?}");
        for l in &leaders {
            terms.insert(l.term());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(terms.len(), 1, "the lease stayed with one term: {terms:?}");
    let term = *terms.iter().next().unwrap();
    for view in &mut views {
        let l = until(view, WAIT, |l| l.term().is_some()).await;
        assert_eq!(l.term(), term, "everybody sees the same term");
    }
    drop(keepers);
}

#[tokio::test]
async fn the_holder_renews_past_the_lease_time_and_the_lease_expires_when_it_stops() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let a = connect(&urls, "a", "id-a").await;
    let keeper = a.campaign();
    let term = until(&mut keeper.leadership(), WAIT, leading).await.term();
    // Renewal: past twice the lease time it still holds the same term.
    tokio::time::sleep(LEASE_TIME * 2).await;
    assert_eq!(keeper.leadership().borrow().term(), term);
    let holder = a.lease_holder().await.unwrap().expect("a holds the lease");
    assert_eq!((holder.node.as_str(), Some(holder.term)), ("a", term));
    // Expiry: once it stops renewing, the server drops the lease by itself.
    keeper.abandon().await;
    let start = Instant::now();
    while a.lease_holder().await.unwrap().is_some() {
        assert!(
            start.elapsed() < LEASE_TIME + MARGIN,
            "the lease did not expire"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_contender_takes_over_within_the_lease_time_when_the_holder_stops_renewing() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let a = connect(&urls, "a", "id-a").await.campaign();
    let first = until(&mut a.leadership(), WAIT, leading)
        .await
        .term()
        .unwrap();
    let b = connect(&urls, "b", "id-b").await.campaign();
    let mut b_view = b.leadership();
    until(&mut b_view, WAIT, |l| {
        matches!(l, Leadership::Follower { .. })
    })
    .await;
    // A's machine disappears: its lease is not renewed, not released.
    let gone = Instant::now();
    a.abandon().await;
    let second = until(&mut b_view, LEASE_TIME + MARGIN, leading)
        .await
        .term()
        .unwrap();
    assert!(second > first, "a new term: {second} after {first}");
    eprintln!("takeover after {:?}", gone.elapsed());
    drop(b);
}

#[tokio::test]
async fn a_released_lease_is_taken_without_waiting_for_it_to_expire() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let a = connect(&urls, "a", "id-a").await.campaign();
    until(&mut a.leadership(), WAIT, leading).await;
    let b = connect(&urls, "b", "id-b").await.campaign();
    let mut b_view = b.leadership();
    until(&mut b_view, WAIT, |l| {
        matches!(l, Leadership::Follower { .. })
    })
    .await;
    a.release().await;
    // Well before the lease time: the release is seen, not waited out.
    until(&mut b_view, LEASE_TIME - Duration::from_secs(2), leading).await;
    drop(b);
}

#[tokio::test]
async fn a_holder_cut_off_from_nats_stops_leading_before_its_lease_can_expire() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let a = connect(&urls, "a", "id-a").await;
    let mut link = a.link();
    let keeper = a.campaign();
    let mut view = keeper.leadership();
    until(&mut view, WAIT, leading).await;
    // NATS goes (for this machine, a partition looks the same).
    server.kill();
    tokio::time::timeout(WAIT, link.wait_for(|l| *l == Link::Down))
        .await
        .expect("the link says down")
        .unwrap();
    let cut = Instant::now();
    until(&mut view, LEASE_TIME, |l| !leading(l)).await;
    // Another machine could take the lease only once it expired, at the
    // earliest LEASE_TIME after the last renewal: never two leaders.
    let stepped_down = cut.elapsed();
    assert!(
        stepped_down < LEASE_TIME - Duration::from_secs(1),
        "stepped down after {stepped_down:?}"
    );
    eprintln!("stepped down {stepped_down:?} after NATS went");
    // When NATS is back, the node leads again.
    server.restart();
    until(&mut view, WAIT, leading).await;
    assert_eq!(*link.borrow(), Link::Up);
}

#[tokio::test]
async fn a_new_process_of_the_same_node_keeps_the_lease_and_its_term() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let old = connect(&urls, "a", "machine-a").await.campaign();
    let term = until(&mut old.leadership(), WAIT, leading).await.term();
    let other = connect(&urls, "b", "machine-b").await.campaign();
    // The local leader dies (the kernel lock of the machine elects another
    // process of the same node, connected in milliseconds): no release, no
    // expiry waited for, and the machine absent from NATS for less than
    // another machine waits before it takes the lease.
    let successor = connect(&urls, "a", "machine-a").await;
    old.abandon().await;
    let new = successor.campaign();
    let adopted = until(
        &mut new.leadership(),
        LEASE_TIME - Duration::from_secs(2),
        leading,
    )
    .await;
    assert_eq!(adopted.term(), term, "the node kept its term");
    assert!(
        !leading(&other.leadership().borrow()),
        "nobody else took it"
    );
    drop((new, other));
}

/// What a machine's connection to NATS does in [`Proxy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    Open,
    /// A partition: both ends stay open and nothing passes.
    Silent,
    /// Closed at once, as the kernel closes a dead process's sockets; new
    /// connections are refused.
    Closed,
}

/// A TCP proxy between one machine and NATS, to fail its connection the
/// way a dead process does or the way a partition does.
struct Proxy {
    port: u16,
    wire: watch::Sender<Wire>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: &str) -> Proxy {
        let target = upstream.trim_start_matches("nats://").to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (wire, state) = watch::channel(Wire::Open);
        let task = tokio::spawn(async move {
            while let Ok((mut near, _)) = listener.accept().await {
                if *state.borrow() != Wire::Open {
                    continue;
                }
                let Ok(mut far) = tokio::net::TcpStream::connect(&target).await else {
                    continue;
                };
                let mut state = state.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut near, &mut far) => return,
                        _ = state.wait_for(|w| *w != Wire::Open) => {}
                    }
                    // Silent until closed (or the proxy goes): both ends held.
                    let _ = state.wait_for(|w| *w == Wire::Closed).await;
                });
            }
        });
        Proxy { port, wire, task }
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn set(&self, wire: Wire) {
        self.wire.send_replace(wire);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.wire.send_replace(Wire::Closed);
        self.task.abort();
    }
}

/// Every value `view` takes from now on, with when it was seen.
fn record(mut view: watch::Receiver<Leadership>) -> Arc<Mutex<Vec<(Instant, Leadership)>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let now = view.borrow_and_update().clone();
            log.lock().unwrap().push((Instant::now(), now));
            if view.changed().await.is_err() {
                return;
            }
        }
    });
    seen
}

/// When `seen` first satisfied `ok`.
fn first(seen: &Mutex<Vec<(Instant, Leadership)>>, ok: impl Fn(&Leadership) -> bool) -> Instant {
    let seen = seen.lock().unwrap();
    seen.iter()
        .find(|(_, l)| ok(l))
        .map(|(at, _)| *at)
        .unwrap_or_else(|| panic!("never seen: {seen:?}"))
}

/// A holder `a` behind a proxy and a follower `b`, both settled.
async fn holder_behind(proxy: &Proxy, server: &NatsServer) -> (LeaseKeeper, LeaseKeeper, Term) {
    let a = connect(&[proxy.url()], "a", "id-a").await.campaign();
    let term = until(&mut a.leadership(), WAIT, leading)
        .await
        .term()
        .unwrap();
    let b = connect(&[server.url()], "b", "id-b").await.campaign();
    until(&mut b.leadership(), WAIT, |l| {
        matches!(l, Leadership::Follower { leader: Some(_) })
    })
    .await;
    (a, b, term)
}

#[tokio::test]
async fn a_holder_whose_connection_closes_loses_the_lease_without_waiting_for_it() {
    nats_server!(dir, server);
    let proxy = Proxy::start(&server.url()).await;
    let (a, b, first_term) = holder_behind(&proxy, &server).await;
    let (a_seen, b_seen) = (record(a.leadership()), record(b.leadership()));
    // A's connection closes as a dead process's does. A itself lives on:
    // the harder case, since it must stop leading on its own.
    let closed = Instant::now();
    proxy.set(Wire::Closed);
    let second = until(&mut b.leadership(), WAIT, leading)
        .await
        .term()
        .unwrap();
    let took = closed.elapsed();
    assert!(
        second > first_term,
        "a new term: {second} after {first_term}"
    );
    // The lease was renewed at most a second before the close and expires
    // LEASE_TIME after that: taken before the holder could even step down
    // on its own, it was not waited out.
    assert!(
        took < STEP_DOWN_AFTER,
        "taken over {took:?} after the close"
    );
    let stopped = first(&a_seen, |l| !leading(l));
    let started = first(&b_seen, leading);
    assert!(
        stopped < started,
        "A led until {stopped:?}, B from {started:?}"
    );
    eprintln!(
        "taken over {took:?} after the close; A stopped leading {:?} after it",
        stopped - closed
    );
    drop((a, b));
}

#[tokio::test]
async fn a_holder_cut_off_silently_keeps_its_lease_until_it_expires() {
    nats_server!(dir, server);
    let proxy = Proxy::start(&server.url()).await;
    let (a, b, first_term) = holder_behind(&proxy, &server).await;
    let (a_seen, b_seen) = (record(a.leadership()), record(b.leadership()));
    // A partition: A's connection stays open, unanswered. Its machine may
    // still poll Telegram, so only the lease's expiry may hand it over.
    let cut = Instant::now();
    proxy.set(Wire::Silent);
    let second = until(&mut b.leadership(), LEASE_TIME + MARGIN, leading)
        .await
        .term()
        .unwrap();
    let took = cut.elapsed();
    assert!(
        second > first_term,
        "a new term: {second} after {first_term}"
    );
    assert!(
        took >= STEP_DOWN_AFTER,
        "taken over {took:?} after a partition: before the holder's own deadline"
    );
    let stopped = first(&a_seen, |l| !leading(l));
    let started = first(&b_seen, leading);
    assert!(
        stopped < started,
        "A led until {stopped:?}, B from {started:?}"
    );
    eprintln!("taken over {took:?} after the partition");
    drop((a, b));
}

#[tokio::test]
async fn a_stale_holders_write_is_refused_by_its_term() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let a = connect(&urls, "a", "id-a").await;
    let a_keeper = a.campaign();
    let old = until(&mut a_keeper.leadership(), WAIT, leading)
        .await
        .term()
        .unwrap();
    a.claims().advance_offset(old, 10).await.unwrap();
    assert_eq!(a.claims().offset().await.unwrap(), Some(10));

    // A stalls (stops renewing but still believes it leads); B takes over.
    let b = connect(&urls, "b", "id-b").await;
    let b_keeper = b.campaign();
    a_keeper.abandon().await;
    let new = until(&mut b_keeper.leadership(), LEASE_TIME + MARGIN, leading)
        .await
        .term()
        .unwrap();

    // Before B wrote anything, A's term is not the lease's: refused.
    let refused = a.claims().advance_offset(old, 20).await;
    assert!(
        matches!(refused, Err(ClusterError::Fenced { .. })),
        "{refused:?}"
    );
    // B writes; A's term is older than the stored one: refused for good.
    b.claims().advance_offset(new, 30).await.unwrap();
    let refused = a.claims().advance_offset(old, 40).await;
    assert!(
        matches!(refused, Err(ClusterError::Fenced { .. })),
        "{refused:?}"
    );
    assert_eq!(b.claims().offset().await.unwrap(), Some(30));
    // The offset never moves backwards, even for the leader.
    b.claims().advance_offset(new, 25).await.unwrap();
    assert_eq!(b.claims().offset().await.unwrap(), Some(30));
    drop(b_keeper);
}

fn update(node: &str, id: i64) -> RoutedUpdate {
    RoutedUpdate {
        node: NodeName::parse(node).unwrap(),
        update_id: id,
        payload: format!("{{\"update\":{id}}}").into_bytes().into(),
    }
}

#[tokio::test]
async fn a_republished_update_is_dropped_by_its_id() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let leader = connect(&urls, "a", "id-a").await;
    let term = Term(1);
    let first = leader
        .inbound()
        .publish(term, &[update("b", 1), update("b", 2)])
        .await
        .unwrap();
    assert!(first.iter().all(|p| !p.duplicate));
    // A successor fetches the batch again from the old offset and publishes
    // it again, plus what is new.
    let again = leader
        .inbound()
        .publish(Term(2), &[update("b", 1), update("b", 2), update("b", 3)])
        .await
        .unwrap();
    assert_eq!(
        again.iter().map(|p| p.duplicate).collect::<Vec<_>>(),
        [true, true, false]
    );
    let b = connect(&urls, "b", "id-b").await;
    let consumer = b.inbound().consumer(&b.node().name).await.unwrap();
    let got = consumer.fetch(10, Duration::from_secs(1)).await.unwrap();
    assert_eq!(
        got.iter().map(|d| d.update_id).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(got[2].term, Some(Term(2)));
}

#[tokio::test]
async fn a_node_that_was_off_gets_its_backlog_in_order_and_only_its_own() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let leader = connect(&urls, "a", "id-a").await;
    let b_name = NodeName::parse("b").unwrap();
    {
        // B reads and acknowledges the first two, then its machine goes off.
        let b = connect(&urls, "b", "id-b").await;
        let consumer = b.inbound().consumer(&b_name).await.unwrap();
        leader
            .inbound()
            .publish(Term(1), &[update("b", 1), update("b", 2)])
            .await
            .unwrap();
        let got = consumer.fetch(10, Duration::from_secs(1)).await.unwrap();
        for d in &got {
            d.ack().await.unwrap();
        }
        assert_eq!(got.iter().map(|d| d.update_id).collect::<Vec<_>>(), [1, 2]);
    }
    // Meanwhile: B's messages and C's.
    let backlog: Vec<RoutedUpdate> = (3..=40)
        .map(|id| update(if id % 3 == 0 { "c" } else { "b" }, id))
        .collect();
    leader.inbound().publish(Term(1), &backlog).await.unwrap();

    // B is back, as a new process with a new connection.
    let b = connect(&urls, "b", "id-b").await;
    let consumer = b.inbound().consumer(&b_name).await.unwrap();
    let mut seen = Vec::new();
    let start = Instant::now();
    loop {
        let got = consumer.fetch(7, Duration::from_millis(300)).await.unwrap();
        if got.is_empty() && start.elapsed() > Duration::from_secs(2) {
            break;
        }
        for d in got {
            d.ack().await.unwrap();
            seen.push(d.update_id);
        }
        assert!(start.elapsed() < WAIT);
    }
    let expected: Vec<i64> = (3..=40).filter(|id| id % 3 != 0).collect();
    assert_eq!(
        seen, expected,
        "B's backlog, in order, nothing acknowledged twice"
    );
}

#[tokio::test]
async fn a_nats_restart_loses_nothing_acknowledged() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let a = connect(&urls, "a", "id-a").await;
    let keeper = a.campaign();
    let term = until(&mut keeper.leadership(), WAIT, leading)
        .await
        .term()
        .unwrap();
    let published = a
        .inbound()
        .publish(
            term,
            &(1..=20).map(|id| update("b", id)).collect::<Vec<_>>(),
        )
        .await
        .unwrap();
    assert_eq!(published.len(), 20);
    a.claims().advance_offset(term, 21).await.unwrap();
    let slot = ClaimKey::Topic {
        chat: -100,
        thread: 7,
    };
    a.claims().create(&slot, &"a:api").await.unwrap();
    let b = connect(&urls, "b", "id-b").await;
    let consumer = b.inbound().consumer(&b.node().name).await.unwrap();
    let first = consumer.fetch(5, Duration::from_secs(1)).await.unwrap();
    for d in &first {
        d.ack().await.unwrap();
    }

    // SIGKILL, and back on the same port with the same store.
    server.restart();

    // The clients reconnect by themselves and everything published is
    // there, in order. A kill can lose the consumer's latest acks (the
    // server writes them lazily), so what was delivered before may come
    // again (a node's journal drops it by update id), but nothing new is
    // skipped.
    let start = Instant::now();
    let mut after = Vec::new();
    while after.last() != Some(&20) {
        assert!(start.elapsed() < WAIT, "only {after:?} came back");
        match consumer.fetch(20, Duration::from_millis(500)).await {
            Ok(got) => {
                for d in got {
                    d.ack().await.unwrap();
                    after.push(d.update_id);
                }
            }
            Err(e) => {
                eprintln!("fetching after the restart: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    assert_eq!(
        first.iter().map(|d| d.update_id).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5]
    );
    let resumed = after[0];
    assert!(
        (1..=6).contains(&resumed),
        "resumed at {resumed}: {after:?}"
    );
    assert_eq!(
        after,
        (resumed..=20).collect::<Vec<_>>(),
        "in order, no gap"
    );
    assert_eq!(b.claims().offset().await.unwrap(), Some(21));
    assert!(matches!(
        b.claims().create(&slot, &"b:web").await,
        Err(ClusterError::Taken { .. })
    ));
    // The lease is led again after the outage (the same node's, adopted or
    // taken afresh).
    until(&mut keeper.leadership(), WAIT, leading).await;
}

#[tokio::test]
async fn a_three_server_nats_cluster_survives_losing_one() {
    let Some(binary) = nats::binary() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut servers = nats::start_cluster(&binary, dir.path());
    let urls: Vec<String> = servers.iter().map(NatsServer::url).collect();
    // A knows only the first server: it must find the others by itself.
    let a = connect(&urls[..1], "a", "id-a").await;
    let keeper = a.campaign();
    let term = until(&mut keeper.leadership(), WAIT, leading)
        .await
        .term()
        .unwrap();
    // A fresh cluster may still be electing the stream's own leader.
    let start = Instant::now();
    let first: Vec<RoutedUpdate> = (1..=10).map(|id| update("b", id)).collect();
    while let Err(e) = a.inbound().publish(term, &first).await {
        assert!(start.elapsed() < WAIT, "cannot publish: {e}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    a.claims().advance_offset(term, 11).await.unwrap();
    let slot = ClaimKey::Slot {
        chat: -100,
        slot: "A".to_string().try_into().unwrap(),
    };
    a.claims().create(&slot, &"a:api").await.unwrap();

    // What the relay made is replicated on all three.
    let js = async_nats::jetstream::new(async_nats::connect(urls[1].as_str()).await.unwrap());
    for stream in [
        "RELAY_123456789_IN",
        "KV_relay-123456789-lease",
        "KV_relay-123456789-claims",
    ] {
        let info = js.get_stream(stream).await.unwrap().cached_info().clone();
        assert_eq!(info.config.num_replicas, 3, "{stream}");
    }

    // The server A is connected to goes.
    servers[0].kill();

    let b = connect(&urls[1..], "b", "id-b").await;
    // The stream may be electing a new leader among the two left.
    let start = Instant::now();
    let consumer = loop {
        match b.inbound().consumer(&NodeName::parse("b").unwrap()).await {
            Ok(consumer) => break consumer,
            Err(e) => {
                assert!(
                    start.elapsed() < WAIT,
                    "no consumer after losing a server: {e}"
                );
                eprintln!("creating the consumer with a server gone: {e}");
            }
        }
    };
    // Raft elections among the two left take a few seconds; a loaded
    // machine may take longer: a generous bound, not a speed.
    let start = Instant::now();
    let mut seen = Vec::new();
    while seen.len() < 15 {
        assert!(
            start.elapsed() < WAIT * 2,
            "only {seen:?} after losing a server"
        );
        if seen.len() == 10 {
            // Publishing still works with two of three.
            let published = tokio::time::timeout(
                WAIT,
                a.inbound().publish(
                    term,
                    &(11..=15).map(|id| update("b", id)).collect::<Vec<_>>(),
                ),
            )
            .await;
            if !matches!(published, Ok(Ok(_))) {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        }
        match consumer.fetch(20, Duration::from_millis(500)).await {
            Ok(got) => {
                for d in got {
                    d.ack().await.unwrap();
                    if !seen.contains(&d.update_id) {
                        seen.push(d.update_id);
                    }
                }
            }
            Err(e) => eprintln!("fetching with a server gone: {e}"),
        }
    }
    assert_eq!(seen, (1..=15).collect::<Vec<_>>());
    assert_eq!(b.claims().offset().await.unwrap(), Some(11));
    assert!(matches!(
        b.claims().create(&slot, &"b:web").await,
        Err(ClusterError::Taken { .. })
    ));
    until(&mut keeper.leadership(), WAIT, leading).await;
}

#[tokio::test]
async fn claims_are_taken_once_and_changed_only_by_who_read_them() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let a = connect(&urls, "a", "id-a").await;
    let b = connect(&urls, "b", "id-b").await;
    let slot = ClaimKey::Slot {
        chat: -1001234,
        slot: "C".to_string().try_into().unwrap(),
    };
    // Both machines pick the same free slot at once: one wins.
    let (ca, cb) = (a.claims(), b.claims());
    let (ra, rb) = tokio::join!(ca.create(&slot, &"a:api"), cb.create(&slot, &"b:web"));
    let (winner, loser) = match (&ra, &rb) {
        (Ok(_), Err(ClusterError::Taken { .. })) => (&a, &b),
        (Err(ClusterError::Taken { .. }), Ok(_)) => (&b, &a),
        other => panic!("exactly one create wins: {other:?}"),
    };
    let held = winner.claims().get::<String>(&slot).await.unwrap().unwrap();
    // The loser may not change what it never read…
    let stale = loser
        .claims()
        .update(&slot, &"stolen", held.revision - 1)
        .await;
    assert!(
        matches!(stale, Err(ClusterError::Changed { .. })),
        "{stale:?}"
    );
    // …nor a revision that moved on since it read it.
    let seen = loser.claims().get::<String>(&slot).await.unwrap().unwrap();
    let moved = winner
        .claims()
        .update(&slot, &"renamed", held.revision)
        .await
        .unwrap();
    let late = loser.claims().release(&slot, seen.revision).await;
    assert!(
        matches!(late, Err(ClusterError::Changed { .. })),
        "{late:?}"
    );
    // Released by its holder, it is free for anyone.
    winner.claims().release(&slot, moved).await.unwrap();
    assert_eq!(loser.claims().get::<String>(&slot).await.unwrap(), None);
    loser.claims().create(&slot, &"mine now").await.unwrap();

    // A node name is one machine's: another machine under it is refused.
    let twin = Cluster::connect(&config(&urls, "a"), BOT, "another-machine").await;
    assert!(
        matches!(twin, Err(ClusterError::NodeNameTaken { .. })),
        "{:?}",
        twin.err()
    );
    // The same machine again is welcome.
    connect(&urls, "a", "id-a").await;
}

#[tokio::test]
async fn a_call_reaches_the_leader_of_its_term_only() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let leader = connect(&urls, "a", "id-a").await;
    let node = connect(&urls, "b", "id-b").await;
    let term = Term(7);
    let mut served = leader.calls().serve(term).await.unwrap();
    let serving = tokio::spawn(async move {
        while let Some(call) = served.next::<String>().await {
            let answer = format!("{} asked {}", call.from, call.request);
            call.answer(&answer).await.unwrap();
        }
    });
    let answer: String = node
        .calls()
        .call(term, &"sendMessage".to_string(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(answer, "b asked sendMessage");
    // Another term has no leader: refused at once, nothing done.
    let other = node
        .calls()
        .call::<_, String>(Term(8), &"sendMessage".to_string(), Duration::from_secs(5))
        .await;
    assert_eq!(other, Err(CallError::NoLeader(Term(8))));
    serving.abort();
}

#[tokio::test]
async fn a_creds_file_others_may_read_or_write_is_refused_before_connecting() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("relay.creds");
    std::fs::write(&creds, "not even creds").unwrap();
    // Readable by others is enough: a creds file lets its reader in.
    for (mode, said) in [
        (0o666, "can be written"),
        (0o644, "can be read"),
        (0o640, "can be read"),
    ] {
        std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(mode)).unwrap();
        let mut config = config(&["nats://127.0.0.1:1".to_string()], "a");
        config.credentials = Some(agent_relay::cluster::NatsCredentials::CredsFile(
            creds.clone(),
        ));
        let refused = Cluster::connect(&config, BOT, "id-a").await.err();
        match refused {
            Some(ClusterError::Untrusted(why)) => assert!(
                why.contains(&creds.display().to_string())
                    && why.contains(said)
                    && why.contains("chmod 600"),
                "{mode:o}: {why}"
            ),
            other => panic!("{mode:o}: refused as untrusted, before any connection: {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_nkey_is_how_a_node_gets_in_and_the_seed_is_never_shown() {
    let Some(binary) = nats::binary() else { return };
    let dir = tempfile::tempdir().unwrap();
    let user = nkeys::KeyPair::new_user();
    let seed = user.seed().unwrap();
    let conf = dir.path().join("auth.conf");
    std::fs::write(
        &conf,
        format!(
            "authorization {{ users = [ {{ nkey: {} }} ] }}\n",
            user.public_key()
        ),
    )
    .unwrap();
    let server = NatsServer::start_with(
        &binary,
        dir.path(),
        vec!["-c".into(), conf.display().to_string()],
    );
    let urls = [server.url()];

    // Without credentials: refused, and the error says so.
    let refused = Cluster::connect(&config(&urls, "a"), BOT, "id-a")
        .await
        .err();
    assert!(
        matches!(refused, Some(ClusterError::Unreachable(_))),
        "{refused:?}"
    );

    // With the seed: in, and working.
    let mut with_seed = config(&urls, "a");
    with_seed.credentials = Some(NatsCredentials::Nkey(NkeySeed::parse(&seed).unwrap()));
    let a = Cluster::connect(&with_seed, BOT, "id-a").await.unwrap();
    let keeper = a.campaign();
    until(&mut keeper.leadership(), WAIT, leading).await;

    // A wrong seed: refused, and no seed in what is said or shown.
    let other = nkeys::KeyPair::new_user().seed().unwrap();
    let mut wrong = config(&urls, "b");
    wrong.credentials = Some(NatsCredentials::Nkey(NkeySeed::parse(&other).unwrap()));
    let refused = Cluster::connect(&wrong, BOT, "id-b")
        .await
        .err()
        .expect("refused");
    let said = format!("{refused} {refused:?} {wrong:?} {with_seed:?}");
    assert!(!said.contains(&seed) && !said.contains(&other), "{said}");
}

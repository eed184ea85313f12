//! One bot across several machines (docs/CLUSTER.md), end to end: three
//! "machines" are three relay homes with distinct node names, each with
//! real sidecars, all on one fake Bot API (which counts overlapping polls
//! across every process) and a real `nats-server -js` on loopback.
//!
//! Every wait is bounded; every process (sidecar or server) is killed when
//! its test ends; every home and store lives in a temporary directory.
//! Timing bounds are the design's own (the lease time plus a margin),
//! never speed: `scripts/bench` measures that.

use crate::common;
use crate::nats;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_relay::cluster::inbound::ACK_WAIT;
use agent_relay::cluster::lease::{LEASE_TIME, RENEW_EVERY};
use common::{
    CHAT, FakeServer, Options, Sidecar, USER, WAIT, connected, inject, prompts, topic, wait_prompt,
    wait_topic_text,
};
use nats::NatsServer;
use serde_json::{Value, json};
use tokio::time::Instant;

/// Past the lease time, what a takeover by another machine may take: the
/// contender's retry, the server's expiry timer, a loaded machine.
const MARGIN: Duration = Duration::from_secs(4);

/// A takeover that waited for the lease to expire cannot come sooner than
/// this after the holder's death (its last renewal was at most a second
/// before): one sooner found the dead relay gone from NATS.
fn sooner_than_the_lease() -> Duration {
    LEASE_TIME - RENEW_EVERY
}

/// A simulated machine: a relay home of its own under one node name.
struct Machine {
    name: &'static str,
    home: tempfile::TempDir,
}

impl Machine {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            home: common::home(),
        }
    }

    fn options<'a>(&'a self, fake: &FakeServer, urls: &[String]) -> Options<'a> {
        Options::new(self.home.path())
            .configured(fake)
            .env("AGENT_RELAY_NATS_URL", &urls.join(","))
            .env("AGENT_RELAY_NODE_NAME", self.name)
    }

    /// A session of this machine, on its bus (its own machine's leader
    /// or follower).
    async fn session(&self, fake: &FakeServer, urls: &[String], name: &str) -> Sidecar {
        common::start(self.options(fake, urls), &cwd(self.name, name), name).await
    }

    /// A session whose host logs every prompt's update id (its own
    /// deduplication by `origin.updateId`, as the pi adapter does).
    fn logged(&self, fake: &FakeServer, urls: &[String], log: Arc<Mutex<HostLog>>) -> Sidecar {
        Sidecar::spawn(self.options(fake, urls).answer(Arc::new(
            move |method, params| match method {
                "agent/sendUserMessage" => {
                    let id = params["origin"]["updateId"].as_i64().expect("an update id");
                    let mut log = log.lock().unwrap();
                    if log.seen.insert(id) {
                        log.accepted.push(id);
                        log.arrived.push(Instant::now());
                    } else {
                        log.redelivered += 1;
                    }
                    Some(json!({"accepted": true}))
                }
                "ui/confirm" => Some(json!({"confirmed": true})),
                _ => None,
            },
        )))
    }
}

impl Drop for Machine {
    /// A failing test shows what each machine's relay said (its log
    /// without debug lines), since its home goes with it.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let dir = self.home.path().join("state/logs");
        let mut lines = Vec::new();
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            lines.extend(
                text.lines()
                    .filter(|l| !l.contains(" DEBUG ") && !l.contains(" TRACE "))
                    .map(String::from),
            );
        }
        let skip = lines.len().saturating_sub(80);
        eprintln!(
            "--- machine {} (last {} lines of its log)",
            self.name,
            lines.len() - skip
        );
        for line in &lines[skip..] {
            eprintln!("{}", line.chars().take(300).collect::<String>());
        }
    }
}

fn cwd(machine: &str, session: &str) -> String {
    format!("/tmp/{machine}/{session}")
}

/// What every incarnation of one session's host saw, in order.
#[derive(Default)]
struct HostLog {
    /// Update ids handed to the agent (after the host's deduplication).
    accepted: Vec<i64>,
    /// When each of them reached the host.
    arrived: Vec<Instant>,
    /// Prompts that repeated an update id (dropped by the host).
    redelivered: usize,
    seen: HashSet<i64>,
}

/// Polls that overlapped a long poll of another process: 0 means one
/// poller at a time. (A stepping-down leader's own short poll, which ends
/// its long poll, is not a second poller.)
fn foreign_overlaps(fake: &FakeServer) -> u64 {
    let polls = fake.api().stats().polls;
    polls.overlaps - polls.short_poll_overlaps
}

/// `/relay status` from `session`, once every machine in `machines` shows.
async fn relay_status(session: &mut Sidecar, machines: &[&str]) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let (ok, text) = session.command("relay", "status").await;
        let all = machines.iter().all(|m| {
            text.contains(&format!("machine {m}"))
                && !text.contains(&format!("machine {m} · not answering"))
        });
        if ok && all {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "machines never all answered: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The machine that polls Telegram, as `/relay status` names it.
fn polled_by(status: &str) -> String {
    let first = status.lines().next().unwrap_or_default();
    first
        .split(" · ")
        .find_map(|part| {
            part.strip_suffix(" polls Telegram")
                .or_else(|| part.split_once(" polls Telegram (").map(|(node, _)| node))
        })
        .unwrap_or_else(|| panic!("no poller named: {status}"))
        .to_string()
}

macro_rules! nats_server {
    ($dir:ident, $server:ident) => {
        let Some(binary) = nats::binary() else { return };
        let $dir = tempfile::tempdir().unwrap();
        #[allow(unused_mut)]
        let mut $server = NatsServer::start(&binary, $dir.path());
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_poller_for_three_machines_and_each_message_reaches_its_machine() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let fake = common::fake().await;
    let machines = [
        Machine::new("laptop"),
        Machine::new("box"),
        Machine::new("cloud"),
    ];
    let mut sessions = Vec::new();
    for m in &machines {
        sessions.push(m.session(&fake, &urls, &format!("s-{}", m.name)).await);
    }
    // Topics say which machine, and no two machines share a slot.
    let names: Vec<String> = fake
        .api()
        .topics(CHAT)
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    for m in &machines {
        let expected = format!(" · {} · s-{}", m.name, m.name);
        assert!(names.iter().any(|n| n.ends_with(&expected)), "{names:?}");
    }
    let letters: HashSet<char> = names.iter().map(|n| n.chars().next().unwrap()).collect();
    assert_eq!(
        letters.len(),
        3,
        "distinct slots across machines: {names:?}"
    );

    // Each machine's session gets its own topic's messages, and only those.
    for (m, s) in machines.iter().zip(&sessions) {
        let thread = topic(&fake, &format!("s-{}", m.name)).thread_id;
        let text = format!("hello {}", m.name);
        let id = inject(&fake, Some(thread), USER, &text);
        let prompt = wait_prompt(s, &text).await;
        assert_eq!(prompt["params"]["origin"]["updateId"], id);
    }
    for (m, s) in machines.iter().zip(&sessions) {
        let got: Vec<Value> = prompts(s)
            .iter()
            .map(|p| p["params"]["text"].clone())
            .collect();
        assert_eq!(got, [json!(format!("hello {}", m.name))], "{}", m.name);
    }
    // Answers from every machine reach their topics (through the machine
    // that polls, whose limiter paces the whole bot).
    for (m, s) in machines.iter().zip(&sessions) {
        s.notify(
            "turn/ended",
            json!({"assistantText": format!("answer from {}", m.name), "toolCalls": []}),
        );
        let thread = topic(&fake, &format!("s-{}", m.name)).thread_id;
        wait_topic_text(&fake, thread, &format!("answer from {}", m.name)).await;
    }
    // `/relay status` shows every machine, its sessions and who polls.
    let status = relay_status(&mut sessions[0], &["laptop", "box", "cloud"]).await;
    for m in &machines {
        assert!(
            status.contains(&format!("· {} · s-{}", m.name, m.name)),
            "{status}"
        );
    }
    let poller = polled_by(&status);
    assert!(machines.iter().any(|m| m.name == poller), "{status}");
    assert_eq!(foreign_overlaps(&fake), 0, "one poller bot-wide");
}

/// Message `n` of a steady load, round robin over the sessions' topics.
fn load(fake: &FakeServer, threads: &[i64], sent: &mut BTreeMap<usize, Vec<i64>>, n: usize) {
    let which = n % threads.len();
    let id = inject(fake, Some(threads[which]), USER, &format!("m{n}"));
    sent.entry(which).or_default().push(id);
}

/// Spawns a logged session and waits until it is on its machine's bus.
async fn logged_session(
    m: &Machine,
    fake: &FakeServer,
    urls: &[String],
    name: &str,
    log: Arc<Mutex<HostLog>>,
) -> Sidecar {
    let mut s = m.logged(fake, urls, log);
    s.handshake(&cwd(m.name, name), name).await;
    s.wait_status(connected).await;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_polling_machine_hands_the_poll_over_and_loses_nothing() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let fake = common::fake().await;
    let machines = [
        Machine::new("laptop"),
        Machine::new("box"),
        Machine::new("cloud"),
    ];
    // Two sessions per machine: every machine has a leader and a follower.
    let mut sessions: Vec<(usize, String, Arc<Mutex<HostLog>>, Sidecar)> = Vec::new();
    for (i, m) in machines.iter().enumerate() {
        for n in 0..2 {
            let name = format!("{}-{n}", m.name);
            let log = Arc::new(Mutex::new(HostLog::default()));
            let s = logged_session(m, &fake, &urls, &name, log.clone()).await;
            sessions.push((i, name, log, s));
        }
    }
    let threads: Vec<i64> = sessions
        .iter()
        .map(|(_, name, _, _)| topic(&fake, name).thread_id)
        .collect();
    let status = relay_status(&mut sessions[0].3, &["laptop", "box", "cloud"]).await;
    let poller = polled_by(&status);
    let doomed = machines.iter().position(|m| m.name == poller).unwrap();
    eprintln!("{poller} polls; killing all of its sidecars under load");

    // A steady load over every session, before, during and after the kill.
    let mut sent: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
    let mut ticker = tokio::time::interval(Duration::from_millis(25));
    let mut n = 0;
    for _ in 0..40 {
        ticker.tick().await;
        load(&fake, &threads, &mut sent, n);
        n += 1;
    }
    for (i, _, _, s) in sessions.iter_mut() {
        if *i == doomed {
            s.signal(libc::SIGKILL);
        }
    }
    let killed = Instant::now();
    // The first message for a surviving machine after the kill shows when
    // another machine polls.
    let survivor = sessions.iter().position(|(i, ..)| *i != doomed).unwrap();
    let probe = inject(&fake, Some(threads[survivor]), USER, "probe");
    sent.entry(survivor).or_default().push(probe);
    let mut taken_over = None;
    while Instant::now() < killed + LEASE_TIME + MARGIN + Duration::from_secs(4) {
        ticker.tick().await;
        load(&fake, &threads, &mut sent, n);
        n += 1;
        if taken_over.is_none() && sessions[survivor].2.lock().unwrap().seen.contains(&probe) {
            taken_over = Some(killed.elapsed());
        }
    }
    let taken_over = taken_over.expect("no machine polled after the poller's machine died");
    eprintln!("another machine polls {taken_over:?} after the kill");
    assert!(
        taken_over < sooner_than_the_lease(),
        "takeover took {taken_over:?}: the dead relay's lease was waited out"
    );
    let status = relay_status(
        &mut sessions[survivor].3,
        &machines
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != doomed)
            .map(|(_, m)| m.name)
            .collect::<Vec<_>>(),
    )
    .await;
    assert!(
        status.contains(&format!("machine {poller} · not answering")),
        "{status}"
    );
    assert_ne!(polled_by(&status), poller, "{status}");

    // The dead machine comes back (its hosts start new sidecars for the
    // same sessions) and gets everything that waited for it.
    for (i, name, log, s) in sessions.iter_mut() {
        if *i == doomed {
            let _ = s.wait_exit().await;
            *s = logged_session(&machines[*i], &fake, &urls, name, log.clone()).await;
        }
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let done = sessions.iter().enumerate().all(|(k, (_, _, log, _))| {
            log.lock().unwrap().accepted.len() >= sent.get(&k).map_or(0, Vec::len)
        });
        if done {
            break;
        }
        assert!(Instant::now() < deadline, "not everything arrived");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut redelivered = 0;
    for (k, (_, name, log, _)) in sessions.iter().enumerate() {
        let log = log.lock().unwrap();
        let expected = sent.get(&k).cloned().unwrap_or_default();
        assert_eq!(
            log.accepted, expected,
            "{name}: every message once, in order"
        );
        redelivered += log.redelivered;
    }
    // A sidecar killed between its host's answer and its acknowledgement
    // hands that prompt to its successor, which the host drops by id.
    assert!(
        redelivered <= 2,
        "{redelivered} redeliveries for 2 killed sidecars"
    );
    assert_eq!(foreign_overlaps(&fake), 0, "never two pollers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_crashes_of_the_polling_machine_never_overlap_polls_nor_lose_a_message() {
    const CRASHES: usize = 20;
    nats_server!(dir, server);
    let urls = [server.url()];
    let fake = common::fake().await;
    let machines = [Machine::new("laptop"), Machine::new("box")];
    let logs: Vec<Arc<Mutex<HostLog>>> = (0..2).map(|_| Arc::default()).collect();
    let mut sessions = Vec::new();
    for (m, log) in machines.iter().zip(&logs) {
        sessions.push(logged_session(m, &fake, &urls, &format!("s-{}", m.name), log.clone()).await);
    }
    let threads: Vec<i64> = machines
        .iter()
        .map(|m| topic(&fake, &format!("s-{}", m.name)).thread_id)
        .collect();
    let mut sent: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
    let mut n = 0;
    let mut takeovers = Vec::new();
    for crash in 0..CRASHES {
        let status = relay_status(&mut sessions[crash % 2], &["laptop", "box"]).await;
        let poller = polled_by(&status);
        let doomed = machines.iter().position(|m| m.name == poller).unwrap();
        let survivor = 1 - doomed;
        for _ in 0..4 {
            load(&fake, &threads, &mut sent, n);
            n += 1;
        }
        // The polling machine's only relay dies, and a message for the
        // other machine shows when the other one polls.
        sessions[doomed].signal(libc::SIGKILL);
        let killed = Instant::now();
        let probe = inject(
            &fake,
            Some(threads[survivor]),
            USER,
            &format!("probe {crash}"),
        );
        sent.entry(survivor).or_default().push(probe);
        while !logs[survivor].lock().unwrap().seen.contains(&probe) {
            assert!(
                killed.elapsed() < LEASE_TIME + MARGIN,
                "crash {crash}: nobody polled after {poller} died"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        takeovers.push(killed.elapsed());
        // Its host starts a new sidecar, as pi does.
        let _ = sessions[doomed].wait_exit().await;
        let name = format!("s-{}", machines[doomed].name);
        sessions[doomed] =
            logged_session(&machines[doomed], &fake, &urls, &name, logs[doomed].clone()).await;
    }
    for (k, log) in logs.iter().enumerate() {
        until_accepted(log, sent[&k].len(), "after the crashes").await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut redelivered = 0;
    for (k, log) in logs.iter().enumerate() {
        let log = log.lock().unwrap();
        assert_eq!(
            log.accepted, sent[&k],
            "machine {k}: every message once, in order"
        );
        redelivered += log.redelivered;
    }
    takeovers.sort();
    eprintln!(
        "{CRASHES} crashes: takeover min {:?}, median {:?}, max {:?}; {redelivered} redelivered",
        takeovers[0],
        takeovers[CRASHES / 2],
        takeovers[CRASHES - 1]
    );
    assert!(
        takeovers.iter().all(|t| *t < sooner_than_the_lease()),
        "a dead relay's lease was waited out: {takeovers:?}"
    );
    assert!(
        redelivered <= CRASHES,
        "{redelivered} redeliveries for {CRASHES} killed sidecars"
    );
    assert_eq!(foreign_overlaps(&fake), 0, "never two pollers");
}

/// Waits until `log` accepted `count` prompts.
async fn until_accepted(log: &Arc<Mutex<HostLog>>, count: usize, what: &str) {
    let deadline = Instant::now() + WAIT;
    while log.lock().unwrap().accepted.len() < count {
        assert!(
            Instant::now() < deadline,
            "{what}: {} of {count} arrived",
            log.lock().unwrap().accepted.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_that_is_off_gets_its_messages_in_order_when_it_returns() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let fake = common::fake().await;
    let (first, second) = (Machine::new("laptop"), Machine::new("box"));
    let mut on = first.session(&fake, &urls, "stays").await;
    let log = Arc::new(Mutex::new(HostLog::default()));
    let mut away = logged_session(&second, &fake, &urls, "away", log.clone()).await;
    let thread = topic(&fake, "away").thread_id;
    relay_status(&mut on, &["laptop", "box"]).await;
    // The machine goes off: its only sidecar ends with its host.
    away.close_stdin();
    away.wait_exit().await;
    let status = relay_status(&mut on, &["laptop"]).await;
    assert!(status.contains("machine box · not answering"), "{status}");
    let ids: Vec<i64> = (1..=5)
        .map(|i| inject(&fake, Some(thread), USER, &format!("while off {i}")))
        .collect();
    // The polling machine keeps working meanwhile.
    let here = topic(&fake, "stays").thread_id;
    inject(&fake, Some(here), USER, "still here");
    wait_prompt(&on, "still here").await;
    assert!(log.lock().unwrap().accepted.is_empty());
    // Back: the same session on the same machine gets them, in order, once.
    let _back = logged_session(&second, &fake, &urls, "away", log.clone()).await;
    until_accepted(&log, ids.len(), "the backlog").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = log.lock().unwrap();
    assert_eq!(log.accepted, ids);
    assert_eq!(log.redelivered, 0);
    assert_eq!(topic(&fake, "away").thread_id, thread, "same topic");
    assert_eq!(foreign_overlaps(&fake), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_restart_loses_nothing_and_machines_send_meanwhile() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let fake = common::fake().await;
    let machines = [Machine::new("laptop"), Machine::new("box")];
    let logs: Vec<Arc<Mutex<HostLog>>> = (0..2).map(|_| Arc::default()).collect();
    let mut sessions = Vec::new();
    for (m, log) in machines.iter().zip(&logs) {
        sessions.push(logged_session(m, &fake, &urls, &format!("s-{}", m.name), log.clone()).await);
    }
    let threads: Vec<i64> = machines
        .iter()
        .map(|m| topic(&fake, &format!("s-{}", m.name)).thread_id)
        .collect();
    let mut sent: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
    for n in 0..6 {
        load(&fake, &threads, &mut sent, n);
    }
    for (k, log) in logs.iter().enumerate() {
        until_accepted(log, sent[&k].len(), "before the restart").await;
    }

    // The server dies without a word, for longer than the lease.
    server.kill();
    let killed = Instant::now();
    for s in &sessions {
        s.wait_status(|t| t.contains("◐ cluster down — sending only"))
            .await;
    }
    for n in 6..16 {
        load(&fake, &threads, &mut sent, n);
    }
    // Cut off, a machine still sends its sessions' answers itself.
    sessions[1].notify(
        "turn/ended",
        json!({"assistantText": "sent while NATS is down", "toolCalls": []}),
    );
    wait_topic_text(&fake, threads[1], "sent while NATS is down").await;
    let (ok, report) = sessions[1].command("telegram-status", "").await;
    assert!(
        ok && report.contains("cluster: machine box · down"),
        "{report}"
    );

    // Back with its store, after the lease expired: everything typed
    // meanwhile arrives, once.
    tokio::time::sleep_until(killed + LEASE_TIME + Duration::from_secs(1)).await;
    server.restart();
    for s in &sessions {
        s.wait_status(connected).await;
    }
    for n in 16..20 {
        load(&fake, &threads, &mut sent, n);
    }
    for (k, log) in logs.iter().enumerate() {
        until_accepted(log, sent[&k].len(), "after the restart").await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (k, log) in logs.iter().enumerate() {
        let log = log.lock().unwrap();
        assert_eq!(
            log.accepted, sent[&k],
            "machine {k}: every message once, in order"
        );
        assert_eq!(log.redelivered, 0);
    }
    assert_eq!(foreign_overlaps(&fake), 0, "never two pollers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_server_nats_cluster_survives_losing_one() {
    let Some(binary) = nats::binary() else { return };
    let dir = tempfile::tempdir().unwrap();
    let mut servers = nats::start_cluster(&binary, dir.path());
    let urls: Vec<String> = servers.iter().map(NatsServer::url).collect();
    let fake = common::fake().await;
    let machines = [Machine::new("laptop"), Machine::new("box")];
    let logs: Vec<Arc<Mutex<HostLog>>> = (0..2).map(|_| Arc::default()).collect();
    let mut sessions = Vec::new();
    for (m, log) in machines.iter().zip(&logs) {
        sessions.push(logged_session(m, &fake, &urls, &format!("s-{}", m.name), log.clone()).await);
    }
    let threads: Vec<i64> = machines
        .iter()
        .map(|m| topic(&fake, &format!("s-{}", m.name)).thread_id)
        .collect();
    let mut sent: BTreeMap<usize, Vec<i64>> = BTreeMap::new();
    for n in 0..6 {
        load(&fake, &threads, &mut sent, n);
    }
    for (k, log) in logs.iter().enumerate() {
        until_accepted(log, sent[&k].len(), "before losing a server").await;
    }
    // The first server is the one every client connected to first.
    servers[0].kill();
    for n in 6..20 {
        load(&fake, &threads, &mut sent, n);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (k, log) in logs.iter().enumerate() {
        until_accepted(log, sent[&k].len(), "after losing a server").await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (k, log) in logs.iter().enumerate() {
        let log = log.lock().unwrap();
        assert_eq!(
            log.accepted, sent[&k],
            "machine {k}: every message once, in order"
        );
    }
    let status = relay_status(&mut sessions[0], &["laptop", "box"]).await;
    assert!(status.contains("polls Telegram"), "{status}");
    assert_eq!(foreign_overlaps(&fake), 0, "never two pollers");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_restart_converges_on_every_machine() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let fake = common::fake().await;
    let machines = [
        Machine::new("laptop"),
        Machine::new("box"),
        Machine::new("cloud"),
    ];
    let mut sessions = Vec::new();
    for m in &machines {
        for n in 0..2 {
            sessions.push(m.session(&fake, &urls, &format!("{}-{n}", m.name)).await);
        }
    }
    relay_status(&mut sessions[0], &["laptop", "box", "cloud"]).await;
    let (ok, report) = sessions[0].command("relay", "restart").await;
    assert!(ok, "{report}");
    assert!(report.contains("complete 6/6"), "{report}");
    // Every machine came back and still routes.
    for (k, m) in machines.iter().enumerate() {
        let name = format!("{}-1", m.name);
        let text = format!("after the restart {}", m.name);
        inject(&fake, Some(topic(&fake, &name).thread_id), USER, &text);
        wait_prompt(&sessions[2 * k + 1], &text).await;
    }
    assert_eq!(
        fake.api()
            .topics(CHAT)
            .iter()
            .filter(|t| !t.deleted)
            .count(),
        6
    );
    assert_eq!(foreign_overlaps(&fake), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_machine_under_a_taken_name_is_told_how_to_fix_it() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let fake = common::fake().await;
    let (first, twin) = (Machine::new("laptop"), Machine::new("laptop"));
    let _first = first.session(&fake, &urls, "one").await;
    let mut s = Sidecar::spawn(common::accepting(twin.options(&fake, &urls)));
    s.handshake(&cwd("twin", "two"), "two").await;
    s.wait_status(|t| t.contains("cluster down")).await;
    let (_, report) = s.command("telegram-status", "").await;
    assert!(
        report.contains("node name `laptop` is taken") && report.contains("AGENT_RELAY_NODE_NAME"),
        "{report}"
    );
    assert_eq!(foreign_overlaps(&fake), 0, "the twin never polls");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tap_reaches_the_machine_whose_session_asked() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let fake = common::fake().await;
    let machines = [Machine::new("laptop"), Machine::new("box")];
    let mut sessions = Vec::new();
    for m in &machines {
        sessions.push(m.session(&fake, &urls, &format!("s-{}", m.name)).await);
    }
    let status = relay_status(&mut sessions[0], &["laptop", "box"]).await;
    // The session of the machine that does not poll asks on the phone.
    let asker = machines
        .iter()
        .position(|m| m.name != polled_by(&status))
        .unwrap();
    let thread = topic(&fake, &format!("s-{}", machines[asker].name)).thread_id;
    let decision = sessions[asker].call_later(
        "approval/request",
        json!({
            "toolCallId": "call-1",
            "tool": "bash",
            "input": {"command": "rm -rf build"},
            "fromTelegram": true,
        }),
    );
    // Posted in the asker's topic.
    let asked = common::question(&fake, thread, "rm -rf build").await;
    let tap = common::tap(
        &fake,
        &asked,
        thread,
        USER,
        &common::button(&asked, "Allow"),
    );
    let answer = tokio::time::timeout(WAIT, decision)
        .await
        .expect("the host's request is answered")
        .expect("the sidecar runs");
    assert_eq!(answer["result"]["decision"], "allow", "{answer}");
    assert_eq!(answer["result"]["by"], "phone", "{answer}");
    // The tap is answered and the question settled, through the machine
    // that polls.
    let shown = fake
        .api()
        .wait_until(
            |api| {
                let answered = api
                    .callback_queries()
                    .into_iter()
                    .any(|q| q.callback_query_id == tap && q.answer.is_some());
                api.message(CHAT, asked.message_id)
                    .filter(|m| answered && common::is_settled(m))
            },
            WAIT,
        )
        .await
        .expect("the tap is answered and the question loses its buttons");
    assert!(
        shown.plain_text.contains("Allow — "),
        "{}",
        shown.plain_text
    );
    assert_eq!(foreign_overlaps(&fake), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_failover_on_a_receiving_machine_holds_nothing_back() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let fake = common::fake().await;
    let (polling, receiving) = (Machine::new("laptop"), Machine::new("box"));
    let _first = polling.session(&fake, &urls, "first").await;
    // Sessions that lead the receiving machine in turn, and one to watch.
    let mut leaders = Vec::new();
    for k in 0..3 {
        leaders.push(receiving.session(&fake, &urls, &format!("lead-{k}")).await);
    }
    let log = Arc::new(Mutex::new(HostLog::default()));
    let _follower = logged_session(&receiving, &fake, &urls, "follows", log.clone()).await;
    let thread = topic(&fake, "follows").thread_id;
    let mut sent = Vec::new();
    for n in 0..200 {
        if n % 50 == 40 {
            // Its leader dies, now and then between fetching deliveries
            // and acknowledging them: those must not wait for JetStream's
            // redelivery.
            if let Some(leader) = leaders
                .iter_mut()
                .find(|s| s.latest_status().is_some_and(|t| t.ends_with("● leader")))
            {
                leader.signal(libc::SIGKILL);
            }
        }
        sent.push((
            inject(&fake, Some(thread), USER, &format!("x{n}")),
            Instant::now(),
        ));
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    until_accepted(&log, sent.len(), "every message").await;
    let log = log.lock().unwrap();
    assert_eq!(
        log.accepted,
        sent.iter().map(|(id, _)| *id).collect::<Vec<_>>(),
        "in order, once"
    );
    for ((id, typed), arrived) in sent.iter().zip(&log.arrived) {
        let took = arrived.saturating_duration_since(*typed);
        assert!(
            took < ACK_WAIT,
            "update {id} took {took:?}: it waited for a redelivery ({ACK_WAIT:?})"
        );
    }
}

/// Runs `agent-relay cluster forget <node>` from `machine`'s home.
fn forget(machine: &Machine, fake: &FakeServer, urls: &[String], node: &str) -> (bool, String) {
    let out = std::process::Command::new(common::binary())
        .args(["cluster", "forget", node])
        .env_clear()
        .env("AGENT_RELAY_HOME", machine.home.path())
        .env("TELEGRAM_BOT_TOKEN", fake.api().token())
        .env("AGENT_RELAY_API_URL", fake.url())
        .env("AGENT_RELAY_NATS_URL", urls.join(","))
        .env("AGENT_RELAY_NODE_NAME", machine.name)
        .output()
        .expect("run agent-relay cluster forget");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reinstalled_machine_takes_its_name_back_after_cluster_forget() {
    nats_server!(dir, server);
    let urls = [server.url()];
    let fake = common::fake().await;
    let (laptop, old_box) = (Machine::new("laptop"), Machine::new("box"));
    let mut stays = laptop.session(&fake, &urls, "stays").await;
    let mut gone = old_box.session(&fake, &urls, "gone").await;
    let thread = topic(&fake, "gone").thread_id;
    // A running machine is not forgotten.
    let (ok, said) = forget(&laptop, &fake, &urls, "box");
    assert!(!ok && said.contains("machine box is running"), "{said}");
    // The box dies for good, with a message waiting for it.
    gone.kill9().await;
    inject(&fake, Some(thread), USER, "for the old box");
    relay_status(&mut stays, &["laptop"]).await;
    // Reinstalled (a new home, so a new node id), it cannot take its name…
    let new_box = Machine {
        name: "box",
        home: common::home(),
    };
    let mut s = Sidecar::spawn(common::accepting(new_box.options(&fake, &urls)));
    s.handshake(&cwd("box", "new"), "new").await;
    s.wait_status(|t| t.contains("cluster down")).await;
    // …until the old one is forgotten.
    let (ok, said) = forget(&laptop, &fake, &urls, "box");
    assert!(ok, "{said}");
    assert!(
        said.contains("forgot machine box: 3 claim(s) removed"),
        "{said}"
    );
    assert!(
        said.contains("1 update(s) that were waiting for box were dropped (1 message(s) in 1 topic(s); 1 topic(s) told in Telegram)"),
        "{said}"
    );
    // …and the person hears of the message the old box never got, in its topic.
    let told = wait_topic_text(&fake, thread, "This message was not delivered").await;
    assert!(
        told.iter()
            .any(|t| t.contains("ran on machine box")
                && t.contains("agent-relay cluster forget box")),
        "{told:?}"
    );
    s.wait_status(connected).await;
    let status = relay_status(&mut stays, &["laptop", "box"]).await;
    assert!(status.contains("· box · new"), "{status}");
    let (ok, said) = forget(&laptop, &fake, &urls, "nobody");
    assert!(!ok && said.contains("no machine named nobody"), "{said}");
    assert_eq!(foreign_overlaps(&fake), 0);
}

/// A password written into `nats_url` reaches no log at any level: the
/// relay (at `trace`) gives the NATS client an address without it and the
/// user and password as options, with which it gets into a server that
/// requires them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_in_the_nats_url_reaches_no_log_at_trace_level() {
    const PASSWORD: &str = "hunter2-in-the-url";
    let Some(binary) = nats::binary() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = NatsServer::start_with(
        &binary,
        dir.path(),
        ["--user", "relay", "--pass", PASSWORD]
            .map(String::from)
            .to_vec(),
    );
    let url = server
        .url()
        .replace("nats://", &format!("nats://relay:{PASSWORD}@"));
    let fake = common::fake().await;
    let laptop = Machine::new("laptop");
    let s = common::start(
        laptop
            .options(&fake, std::slice::from_ref(&url))
            .env("AGENT_RELAY_LOG", "trace"),
        &cwd("laptop", "api"),
        "api",
    )
    .await;
    // In the cluster (its topic names the machine), and messages flow
    // through NATS.
    let thread = topic(&fake, "laptop · api").thread_id;
    inject(&fake, Some(thread), USER, "through the cluster");
    wait_prompt(&s, "through the cluster").await;
    drop(s);

    let mut log = String::new();
    for entry in std::fs::read_dir(laptop.home.path().join("state/logs"))
        .expect("the log directory")
        .flatten()
    {
        log.push_str(&std::fs::read_to_string(entry.path()).unwrap_or_default());
    }
    assert!(log.contains(" TRACE "), "the log was at trace level");
    assert!(log.contains("connect"), "the log saw the connection");
    assert_eq!(
        log.matches(PASSWORD).count(),
        0,
        "the password is in the log"
    );
}

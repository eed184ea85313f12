//! One bot across machines (docs/CLUSTER.md): two "machines" (two relay
//! homes under distinct node names, two sessions each) on one fake Bot API
//! and a real `nats-server -js` on loopback, started here.
//!
//! * failover across machines: SIGKILL every sidecar of the machine that
//!   polls → a message injected at that moment reaches a session of the
//!   other machine (the dead relay found gone from NATS, a takeover, a
//!   poll, the stream);
//! * inbound latency through JetStream, for a session of the polling
//!   machine and of the other one;
//! * NATS traffic per inbound update: messages and bytes in and out of
//!   `nats-server` (its `/varz`) during the inbound runs, minus an idle
//!   window as long (lease renewals, pull requests).
//!
//! Without `nats-server` (PATH, `NATS_SERVER`, /usr/sbin) the rows say so.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use agent_relay::election::BusDir;
use agent_relay::fake_bot_api::{
    DEFAULT_FORUM_CHAT_ID, DEFAULT_USER_ID, FakeBotApi, FakeConfig, FakeServer, Inject,
};
use agent_relay::protocol::bus::*;
use agent_relay::wire::{self, Received};
use anyhow::{Context as _, anyhow, bail};
use interprocess::local_socket::tokio::Stream;
use interprocess::local_socket::traits::tokio::Stream as _;

use crate::host::Host;
use crate::inbound::latency_at;
use crate::report::Measure;
use crate::world::{SETTLE, TempHome};

/// Sessions per machine.
const SESSIONS: usize = 2;
/// How long one cross-machine failover may take before it counts as failed:
/// the lease (6 s) and then some.
const TRIAL_TIMEOUT: Duration = Duration::from_secs(20);

/// The figures of the cluster section.
pub struct Figures {
    pub failover: Measure,
    pub inbound_polling: Measure,
    pub inbound_other: Measure,
    pub traffic: Measure,
}

/// Measures the cluster figures: `trials` failovers and `messages`
/// messages at `rate` per second to each of two sessions.
pub async fn measure(
    relay: &Path,
    trials: usize,
    messages: usize,
    rate: f64,
) -> anyhow::Result<Figures> {
    let binary = nats_server().context(
        "nats-server is not installed (apt-get install nats-server, or set NATS_SERVER)",
    )?;
    let nats = Nats::start(&binary)?;
    let fake = FakeBotApi::start(FakeConfig::default())
        .await
        .context("starting the fake Bot API")?;
    fake.api().add_default_chats();
    let mut machines = Vec::new();
    for name in ["bench-a", "bench-b"] {
        machines.push(Machine::start(relay, &fake, &nats.url(), name).await?);
    }
    settle(&mut machines, &fake).await?;

    // Inbound first, while nothing was killed.
    let poller = polling(&machines).await?;
    let other = 1 - poller;
    let api = fake.api();
    let before = nats.traffic();
    let started = Instant::now();
    let inbound_polling = {
        let thread = machines[poller].thread(&api, 0)?;
        latency_at(&api, &mut machines[poller].hosts[0], thread, rate, messages).await
    };
    let inbound_other = {
        let thread = machines[other].thread(&api, 0)?;
        latency_at(&api, &mut machines[other].hosts[0], thread, rate, messages).await
    };
    let busy = started.elapsed();
    let after = nats.traffic();
    tokio::time::sleep(busy).await;
    let idle = nats.traffic();
    let traffic = traffic_per_update(before, after, idle, 2 * messages);
    let mut samples = Vec::with_capacity(trials);
    for trial in 0..trials {
        samples.push(failover(relay, &mut machines, &fake, trial).await?);
    }
    Ok(Figures {
        failover: Measure::latency(&samples, "no trial"),
        inbound_polling: inbound_polling.unwrap_or_else(|e| Measure::na(format!("{e:#}"))),
        inbound_other: inbound_other.unwrap_or_else(|e| Measure::na(format!("{e:#}"))),
        traffic,
    })
}

/// NATS's traffic per update: what `updates` cost between `before` and
/// `after`, less what the same time costs idle (`after` to `idle`).
fn traffic_per_update(
    before: anyhow::Result<Traffic>,
    after: anyhow::Result<Traffic>,
    idle: anyhow::Result<Traffic>,
    updates: usize,
) -> Measure {
    match (before, after, idle) {
        (Ok(before), Ok(after), Ok(idle)) => {
            let per = |f: fn(&Traffic) -> u64| {
                let work = f(&after).saturating_sub(f(&before)) as f64;
                let background = f(&idle).saturating_sub(f(&after)) as f64;
                ((work - background) / updates as f64).max(0.0)
            };
            Measure::Traffic {
                messages: per(|t| t.messages),
                bytes: per(|t| t.bytes),
            }
        }
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => Measure::na(format!("{e:#}")),
    }
}

/// One failover: the polling machine's sidecars killed, a message to the
/// other's session; the time from the kill to its prompt. The dead machine
/// comes back after.
async fn failover(
    relay: &Path,
    machines: &mut [Machine],
    fake: &FakeServer,
    trial: usize,
) -> anyhow::Result<Duration> {
    let api = fake.api();
    let dead = polling(machines).await?;
    let alive = 1 - dead;
    let thread = machines[alive].thread(&api, 0)?;
    machines[alive].hosts[0].drain_prompts();
    let killed = machines[dead]
        .hosts
        .iter()
        .map(Host::sigkill)
        .min()
        .context("a machine without sidecars")?;
    let text = format!("bench cluster failover #{trial}.");
    api.inject_message(Inject {
        chat_id: DEFAULT_FORUM_CHAT_ID,
        thread_id: Some(thread),
        user_id: DEFAULT_USER_ID,
        text: text.clone(),
    });
    let prompt = machines[alive].hosts[0]
        .prompt(&text, TRIAL_TIMEOUT)
        .await
        .with_context(|| format!("trial {trial}: no machine polled within {TRIAL_TIMEOUT:?}"))?;
    machines[dead].restart(relay).await?;
    settle(machines, fake).await?;
    Ok(prompt.at.saturating_duration_since(killed))
}

/// One machine: its home, its node name and its sessions.
struct Machine {
    hosts: Vec<Host>,
    env: Vec<(String, String)>,
    bus: BusDir,
    // Last, so the sidecars are killed before their home goes.
    _home: TempHome,
}

impl Machine {
    async fn start(
        relay: &Path,
        fake: &FakeServer,
        nats: &str,
        name: &str,
    ) -> anyhow::Result<Machine> {
        let home = TempHome::new(name)?;
        let api = fake.api();
        let env: Vec<(String, String)> = [
            ("AGENT_RELAY_HOME", home.path().display().to_string()),
            ("TELEGRAM_BOT_TOKEN", api.token()),
            ("AGENT_RELAY_CHAT_ID", DEFAULT_FORUM_CHAT_ID.to_string()),
            ("AGENT_RELAY_ALLOWED_USERS", DEFAULT_USER_ID.to_string()),
            ("AGENT_RELAY_API_URL", fake.url()),
            ("AGENT_RELAY_UNLIMITED", "1".into()),
            ("AGENT_RELAY_NATS_URL", nats.to_string()),
            ("AGENT_RELAY_NODE_NAME", name.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let bus = BusDir::new(home.path().join("run").join(api.bot_id().to_string()));
        let mut machine = Machine {
            hosts: Vec::new(),
            env,
            bus,
            _home: home,
        };
        for i in 0..SESSIONS {
            let cwd = format!("/tmp/bench/{name}/p{i}");
            machine.hosts.push(Host::spawn(
                relay,
                &machine.env,
                &cwd,
                &format!("{name}-s{i}"),
            )?);
        }
        for host in &mut machine.hosts {
            host.handshake().await?;
        }
        Ok(machine)
    }

    /// Its hosts start new sidecars for the same sessions, as after a crash.
    async fn restart(&mut self, relay: &Path) -> anyhow::Result<()> {
        for i in 0..self.hosts.len() {
            self.hosts[i].reap().await;
            let (cwd, name) = (self.hosts[i].cwd.clone(), self.hosts[i].name.clone());
            let mut host = Host::spawn(relay, &self.env, &cwd, &name)?;
            host.handshake().await?;
            self.hosts[i] = host;
        }
        Ok(())
    }

    /// The topic of session `i`.
    fn thread(&self, api: &FakeBotApi, i: usize) -> anyhow::Result<i64> {
        let suffix = format!("· {}", self.hosts[i].name);
        api.topics(DEFAULT_FORUM_CHAT_ID)
            .into_iter()
            .find(|t| !t.deleted && t.name.ends_with(&suffix))
            .map(|t| t.thread_id)
            .with_context(|| format!("no topic for {}", self.hosts[i].name))
    }

    /// Every machine's sessions, as this machine's leader sees them.
    async fn status(&self) -> anyhow::Result<BusStatus> {
        let stream = Stream::connect(self.bus.socket_name()?).await?;
        let (mut reader, mut writer) = wire::split(stream);
        writer
            .send(&ToLeader::Status(StatusQuery {
                id: 1,
                cluster: true,
            }))
            .await?;
        let wait = async {
            loop {
                match reader.recv::<FromLeader>().await? {
                    Some(Received::Envelope(FromLeader::Ack(ack))) if ack.id == Some(1) => {
                        return ack
                            .reply::<StatusQuery>()
                            .map_err(|e| anyhow!("status refused: {e}"));
                    }
                    Some(_) => continue,
                    None => bail!("the leader closed the connection"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .map_err(|_| anyhow!("no status within 5 s"))?
    }
}

/// Waits until every session of every machine is live, as one machine
/// sees the whole cluster, and one machine polls.
async fn settle(machines: &mut [Machine], fake: &FakeServer) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + SETTLE;
    for machine in machines.iter_mut() {
        for host in &mut machine.hosts {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            host.wait_status(left, |s| s.contains("● leader") || s.contains("● follower"))
                .await?;
        }
    }
    let expected = machines.len() * SESSIONS;
    let mut last = String::new();
    while tokio::time::Instant::now() < deadline {
        if let Ok(status) = machines[0].status().await
            && let Some(cluster) = &status.cluster
        {
            let live = cluster
                .machines
                .iter()
                .flat_map(|m| &m.sessions)
                .filter(|s| s.live)
                .count();
            let topics = fake
                .api()
                .topics(DEFAULT_FORUM_CHAT_ID)
                .iter()
                .filter(|t| !t.deleted)
                .count();
            if live == expected && topics == expected && cluster.polled_by.is_some() {
                return Ok(());
            }
            last = format!("{live}/{expected} live, polled by {:?}", cluster.polled_by);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    bail!("the machines did not settle within {SETTLE:?} ({last})")
}

/// The index of the machine that polls.
async fn polling(machines: &[Machine]) -> anyhow::Result<usize> {
    let status = machines[0].status().await?;
    let node = status
        .cluster
        .and_then(|c| c.polled_by)
        .context("no machine polls")?;
    machines
        .iter()
        .position(|m| {
            m.env
                .iter()
                .any(|(k, v)| k == "AGENT_RELAY_NODE_NAME" && *v == node)
        })
        .with_context(|| format!("{node} is none of ours"))
}

fn nats_server() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::var_os("NATS_SERVER")
        .map(PathBuf::from)
        .into_iter()
        .chain(std::env::split_paths(&path).map(|d| d.join("nats-server")))
        .chain(["/usr/sbin/nats-server", "/usr/bin/nats-server"].map(PathBuf::from))
        .find(|p| p.is_file())
}

/// A `nats-server -js` on a free loopback port, its monitoring on
/// another, its store in a temporary home; killed on drop.
struct Nats {
    child: Child,
    port: u16,
    monitor: u16,
    _home: TempHome,
}

/// What went through `nats-server` so far, both ways, all clients.
struct Traffic {
    messages: u64,
    bytes: u64,
}

impl Nats {
    fn start(binary: &Path) -> anyhow::Result<Nats> {
        let home = TempHome::new("nats")?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let monitor = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log = home.path().join("log");
        let child = Command::new(binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string()])
            .args(["-m", &monitor.to_string()])
            .arg("-sd")
            .arg(home.path().join("store"))
            .arg("-l")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawning {}", binary.display()))?;
        let nats = Nats {
            child,
            port,
            monitor,
            _home: home,
        };
        let start = Instant::now();
        while !std::fs::read_to_string(&log).is_ok_and(|l| l.contains("Server is ready")) {
            if start.elapsed() > Duration::from_secs(20) {
                bail!("nats-server was not ready within 20 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(nats)
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's counters, from its monitoring endpoint.
    fn traffic(&self) -> anyhow::Result<Traffic> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.monitor))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(b"GET /varz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let body = response
            .split_once("\r\n\r\n")
            .map(|(_, body)| body)
            .context("no body from /varz")?;
        let varz: serde_json::Value = serde_json::from_str(body).context("reading /varz")?;
        let count = |key: &str| {
            varz[key]
                .as_u64()
                .with_context(|| format!("no {key} in /varz"))
        };
        Ok(Traffic {
            messages: count("in_msgs")? + count("out_msgs")?,
            bytes: count("in_bytes")? + count("out_bytes")?,
        })
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! One relay under test: a private `AGENT_RELAY_HOME`, an in-process fake
//! Bot API, and N sessions whose sidecars form one bus. Raw bus clients
//! (status queries, the failover probe) talk to the leader's socket
//! directly, as `agent-relay status` does.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use agent_relay::election::BusDir;
use agent_relay::fake_bot_api::{
    DEFAULT_FORUM_CHAT_ID, DEFAULT_USER_ID, FakeBotApi, FakeConfig, FakeServer,
};
use agent_relay::protocol::bus::*;
use agent_relay::wire::{self, Received};
use anyhow::{Context as _, anyhow, bail};
use interprocess::local_socket::tokio::Stream;
use interprocess::local_socket::traits::tokio::Stream as _;

use crate::host::Host;
use crate::milestones::{ENV, Milestone};

/// How long a whole bus may take to (re)form before the bench gives up.
pub const SETTLE: Duration = Duration::from_secs(30);

/// A temporary directory removed on drop (the bench has no tempfile crate).
pub struct TempHome {
    path: PathBuf,
}

impl TempHome {
    pub fn new(what: &str) -> anyhow::Result<TempHome> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        // Short: the bus socket's path must fit in sun_path (108 bytes).
        let path = std::env::temp_dir().join(format!("rb-{}-{n}-{what}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(TempHome { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempHome {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

pub struct World {
    pub fake: FakeServer,
    pub hosts: Vec<Host>,
    relay: PathBuf,
    bus: BusDir,
    paced: bool,
    /// The sidecars log their milestones (`milestones.rs`).
    traced: bool,
    // Last, so the sidecars are killed before their home goes.
    home: TempHome,
}

impl World {
    /// A fake Bot API and `sessions` sidecars, all on the bus.
    pub async fn start(relay: &Path, sessions: usize) -> anyhow::Result<World> {
        World::start_with(relay, sessions, false).await
    }

    /// [`World::start`]; `paced`: Telegram's limits on, in the fake and in
    /// the relay (the budget figures).
    pub async fn start_with(relay: &Path, sessions: usize, paced: bool) -> anyhow::Result<World> {
        World::start_as(relay, sessions, paced, false).await
    }

    /// [`World::start`] whose sidecars log their milestones, for a
    /// breakdown (a few debug lines per failover or per message).
    pub async fn start_traced(relay: &Path, sessions: usize) -> anyhow::Result<World> {
        World::start_as(relay, sessions, false, true).await
    }

    async fn start_as(
        relay: &Path,
        sessions: usize,
        paced: bool,
        traced: bool,
    ) -> anyhow::Result<World> {
        let fake = FakeBotApi::start(FakeConfig {
            rate_limits: paced,
            ..FakeConfig::default()
        })
        .await
        .context("starting the fake Bot API")?;
        fake.api().add_default_chats();
        let home = TempHome::new("home")?;
        let bot = fake.api().bot_id();
        let bus = BusDir::new(home.path().join("run").join(bot.to_string()));
        let mut world = World {
            fake,
            hosts: Vec::new(),
            relay: relay.to_path_buf(),
            bus,
            paced,
            traced,
            home,
        };
        for i in 0..sessions {
            // A real folder: the files figure sends from it.
            let cwd = world.home.path().join(format!("p{i}"));
            std::fs::create_dir_all(&cwd)?;
            let host = world.spawn_session(&cwd.display().to_string(), &format!("s{i}"))?;
            world.hosts.push(host);
        }
        for host in &mut world.hosts {
            host.handshake().await?;
        }
        world.settle(sessions).await?;
        Ok(world)
    }

    /// The environment of a sidecar configured for the fake's bot. The
    /// relay's own pacing is switched off unless the world is paced: the
    /// figures are about the relay's overhead, not Telegram's limits.
    pub fn env(&self) -> Vec<(String, String)> {
        let api = self.fake.api();
        [
            ("AGENT_RELAY_HOME", self.home.path().display().to_string()),
            ("TELEGRAM_BOT_TOKEN", api.token()),
            ("AGENT_RELAY_CHAT_ID", DEFAULT_FORUM_CHAT_ID.to_string()),
            ("AGENT_RELAY_ALLOWED_USERS", DEFAULT_USER_ID.to_string()),
            ("AGENT_RELAY_API_URL", self.fake.url()),
            ("AGENT_RELAY_UNLIMITED", "1".into()),
        ]
        .into_iter()
        .filter(|(k, _)| !(self.paced && *k == "AGENT_RELAY_UNLIMITED"))
        .map(|(k, v)| (k.to_string(), v))
        .chain(self.traced.then(|| (ENV.0.to_string(), ENV.1.to_string())))
        .collect()
    }

    /// The milestones the sidecars logged so far.
    pub fn milestones(&self) -> Vec<Milestone> {
        crate::milestones::read(self.home.path())
    }

    /// Spawns (without handshake) a sidecar for the session `cwd`/`name`.
    pub fn spawn_session(&self, cwd: &str, name: &str) -> anyhow::Result<Host> {
        Host::spawn(&self.relay, &self.env(), cwd, name)
    }

    pub fn api(&self) -> FakeBotApi {
        self.fake.api()
    }

    /// Waits until every host shows a connected status line and the leader
    /// counts `sessions` live sessions of ours: the bus is quiet again.
    pub async fn settle(&mut self, sessions: usize) -> anyhow::Result<BusStatus> {
        let deadline = tokio::time::Instant::now() + SETTLE;
        for host in &mut self.hosts {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            host.wait_status(left, |s| s.contains("● leader") || s.contains("● follower"))
                .await?;
        }
        let pids: Vec<u32> = self.hosts.iter().map(Host::pid).collect();
        let mut last = None;
        while tokio::time::Instant::now() < deadline {
            if let Ok(status) = self.status().await {
                let live = status
                    .sessions
                    .iter()
                    .filter(|s| s.live && pids.contains(&s.pid))
                    .count();
                if live == sessions && pids.contains(&status.leader_pid) {
                    return Ok(status);
                }
                last = Some(format!("{live}/{sessions} live"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        bail!(
            "the bus did not settle within {SETTLE:?} ({})",
            last.unwrap_or_else(|| "no leader answered".into())
        )
    }

    /// The leader's view of the bus.
    pub async fn status(&self) -> anyhow::Result<BusStatus> {
        let (mut reader, mut writer) = wire::split(self.connect().await?);
        writer
            .send(&ToLeader::Status(StatusQuery {
                id: 1,
                cluster: false,
            }))
            .await?;
        let ack = next_ack(&mut reader, 1, Duration::from_secs(5)).await?;
        ack.reply::<StatusQuery>()
            .map_err(|e| anyhow!("status refused: {e}"))
    }

    pub async fn connect(&self) -> anyhow::Result<Stream> {
        Ok(Stream::connect(self.bus.socket_name()?).await?)
    }

    /// Index of the host that leads, per `status`.
    pub fn leader_index(&self, status: &BusStatus) -> Option<usize> {
        self.hosts.iter().position(|h| h.pid() == status.leader_pid)
    }

    /// Indices of the hosts that follow.
    pub fn follower_indices(&self, status: &BusStatus) -> Vec<usize> {
        (0..self.hosts.len())
            .filter(|&i| self.hosts[i].pid() != status.leader_pid)
            .collect()
    }

    /// The forum topic of host `index`.
    pub fn thread_of(&self, status: &BusStatus, index: usize) -> anyhow::Result<i64> {
        let pid = self.hosts[index].pid();
        status
            .sessions
            .iter()
            .find(|s| s.pid == pid && s.live)
            .and_then(|s| s.target)
            .map(|t| t.thread_id)
            .with_context(|| format!("session of pid {pid} has no topic"))
    }

    /// Every follower with its forum topic.
    pub fn followers_with_threads(
        &self,
        status: &BusStatus,
    ) -> anyhow::Result<(Vec<usize>, Vec<i64>)> {
        let followers = self.follower_indices(status);
        let threads = followers
            .iter()
            .map(|&f| self.thread_of(status, f))
            .collect::<anyhow::Result<Vec<i64>>>()?;
        Ok((followers, threads))
    }
}

/// Reads frames until the ack for `id`.
async fn next_ack(
    reader: &mut wire::WireReader,
    id: u64,
    timeout: Duration,
) -> anyhow::Result<Ack> {
    let wait = async {
        loop {
            match reader.recv::<FromLeader>().await? {
                Some(Received::Envelope(FromLeader::Ack(ack))) if ack.id == Some(id) => {
                    return Ok(ack);
                }
                Some(_) => continue,
                None => bail!("the leader closed the connection"),
            }
        }
    };
    tokio::time::timeout(timeout, wait)
        .await
        .map_err(|_| anyhow!("the leader did not answer within {timeout:?}"))?
}

/// A raw bus client that registers as one session, over and over: the
/// failover figure ends when a new leader accepts it. It carries its route,
/// as a returning sidecar does, so the leader need not touch Telegram.
pub struct Probe {
    generation: Generation,
    carried: Option<Route>,
}

impl Probe {
    pub fn new() -> Probe {
        Probe {
            generation: 0,
            carried: None,
        }
    }

    /// Connects and registers once; the registration ends with the
    /// connection, when this returns.
    pub async fn register(&mut self, world: &World) -> anyhow::Result<()> {
        let stream = world.connect().await?;
        let (mut reader, mut writer) = wire::split(stream);
        self.generation += 1;
        let register = ToLeader::Register(Register {
            id: 1,
            instance_id: "relay-bench-probe".into(),
            instance_secret: "relay-bench-probe-secret".into(),
            registration_generation: self.generation,
            profile_key: "relay-bench-probe".into(),
            session_name: "probe".into(),
            cwd: "/tmp/bench/probe".into(),
            pid: std::process::id(),
            carried: self.carried.clone(),
            protocol_version: BUS_PROTOCOL_VERSION,
            retry_provisioning: false,
            left: None,
            launch: None,
        });
        writer.send(&register).await?;
        let ack = next_ack(&mut reader, 1, Duration::from_secs(5)).await?;
        let registered = ack
            .reply::<Register>()
            .map_err(|e| anyhow!("registration refused: {e}"))?;
        self.carried = Some(registered.route);
        Ok(())
    }

    /// Retries [`Probe::register`] until it succeeds; returns when it did.
    /// Polls every 200 µs as asked, which tokio's timer makes a millisecond:
    /// the figure may be up to that pessimistic.
    pub async fn register_until(
        &mut self,
        world: &World,
        deadline: Instant,
    ) -> anyhow::Result<Instant> {
        loop {
            match self.register(world).await {
                Ok(()) => return Ok(Instant::now()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e.context("no leader accepted the probe"));
                }
                Err(_) => tokio::time::sleep(Duration::from_micros(200)).await,
            }
        }
    }
}

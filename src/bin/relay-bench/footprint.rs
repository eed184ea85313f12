//! What a sidecar costs while nobody uses it: start-up time and resident
//! memory when idle.

use std::path::Path;
use std::time::{Duration, Instant};

use agent_relay::fake_bot_api::FakeConfig;

use crate::host::{Host, private_kib, rss_kib};
use crate::reference::IdleNode;
use crate::report::Measure;
use crate::world::{TempHome, World};

/// Spawn → `initialize` answered, `runs` times. Configured as for real,
/// but `initialized` is never sent, so no bus is joined.
pub async fn cold_start(relay: &Path, runs: usize) -> anyhow::Result<Vec<Duration>> {
    let home = TempHome::new("cold")?;
    let env: Vec<(String, String)> = [
        ("AGENT_RELAY_HOME", home.path().display().to_string()),
        ("TELEGRAM_BOT_TOKEN", FakeConfig::default().token),
        ("AGENT_RELAY_CHAT_ID", "-1001000000001".into()),
        ("AGENT_RELAY_ALLOWED_USERS", "1001".into()),
        // Never contacted: the sidecar only joins the bus after `initialized`.
        ("AGENT_RELAY_API_URL", "http://127.0.0.1:9".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        let mut host = Host::spawn(relay, &env, "/tmp/bench/cold", "cold")?;
        host.initialize().await?;
        samples.push(start.elapsed());
        host.sigkill();
        host.reap().await;
    }
    Ok(samples)
}

pub struct IdleRss {
    pub leader: Measure,
    pub follower: Measure,
    /// The follower's private memory (its code pages are shared).
    pub follower_private: Measure,
    pub node: Measure,
}

/// A leader and a follower, and an idle Node.js beside them, after `idle`.
pub async fn idle_rss(relay: &Path, idle: Duration) -> anyhow::Result<IdleRss> {
    let mut world = World::start(relay, 2).await?;
    // Asked before the idle period, so nothing disturbs it.
    let status = world.settle(2).await?;
    let node = IdleNode::spawn();
    tokio::time::sleep(idle).await;
    let leader = world.leader_index(&status).map(|i| world.hosts[i].pid());
    let follower = world
        .follower_indices(&status)
        .first()
        .map(|&i| world.hosts[i].pid());
    let memory = |pid: Option<u32>, read: fn(u32) -> anyhow::Result<u64>| match pid.map(read) {
        Some(Ok(kib)) => Measure::Memory { kib },
        Some(Err(e)) => Measure::na(format!("{e:#}")),
        None => Measure::na("no such sidecar"),
    };
    let node = match node.and_then(|n| n.rss_kib()) {
        Ok(kib) => Measure::Memory { kib },
        Err(e) => Measure::na(format!("{e:#}")),
    };
    Ok(IdleRss {
        leader: memory(leader, rss_kib),
        follower: memory(follower, rss_kib),
        follower_private: memory(follower, private_kib),
        node,
    })
}

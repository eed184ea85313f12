//! Failover: SIGKILL the leader; the figure ends when a new leader both
//! accepts a registration (a raw probe client) and polls Telegram (a new
//! `getUpdates` the fake counts), whichever comes last.
//!
//! The same trials measure how far every survivor's status line lags the
//! truth: from the new leader's first poll to the host reading a connected
//! status line (`● leader` / `● follower`, nothing after it). A line that
//! was back before the poll counts as no lag.
//!
//! The sidecars log their milestones (`milestones.rs`), so each trial is
//! also broken down: the kill, the survivor that wins the lock, its store
//! opened (the journal read, the epoch written), the socket bound, its
//! first connection accepted and registration done, and the first
//! `getUpdates`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};

use crate::milestones::{self, first_after, span};
use crate::world::{Probe, World};

/// One failover may take this long before the trial counts as failed.
const TRIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// What the failover trials measured.
pub struct Failover {
    /// One sample per trial: the bus working again.
    pub takeover: Vec<Duration>,
    /// One sample per survivor and trial: its status line after the poll.
    pub status_lag: Vec<Duration>,
    /// Each step of the new leader (from the milestone before it), with
    /// one sample per trial that logged both.
    pub steps: Vec<(&'static str, Vec<Duration>)>,
}

/// The new leader's milestones, each measured from an earlier one ("kill"
/// is the bench's own): (step, from, what the span is). Once bound, the
/// connections and the poller go on side by side.
pub const STEPS: [(&str, &str, &str); 10] = [
    ("lock", "kill", "kill → a survivor holds the lock"),
    (
        "outbox",
        "lock",
        "lock → outbox built (its HTTP client; beside the store)",
    ),
    (
        "store-opened",
        "lock",
        "lock → store open (quick_check, WAL, migrations)",
    ),
    (
        "epoch",
        "store-opened",
        "store open → epoch written (fsync)",
    ),
    ("store", "epoch", "epoch → access list read"),
    ("bind", "store", "access read → socket bound"),
    ("accept", "bind", "bound → first connection accepted"),
    ("register", "accept", "accepted → first registration done"),
    ("poller", "bind", "bound → the poller starts"),
    ("poll", "poller", "poller starts → first getUpdates sent"),
];

fn connected(status: &str) -> bool {
    status.ends_with("● leader") || status.ends_with("● follower")
}

/// `trials` failovers of a bus of `sessions` sessions.
pub async fn measure(relay: &Path, sessions: usize, trials: usize) -> anyhow::Result<Failover> {
    let mut world = World::start_traced(relay, sessions).await?;
    let mut probe = Probe::new();
    // Once beforehand, so the probe has a topic to carry into every trial.
    probe
        .register(&world)
        .await
        .context("first probe registration")?;
    let mut samples = Vec::with_capacity(trials);
    let mut lags = Vec::with_capacity(trials * sessions.saturating_sub(1));
    let mut kills_us = Vec::with_capacity(trials);
    for trial in 0..trials {
        let status = world.settle(sessions).await?;
        let leader = world
            .leader_index(&status)
            .context("the leader is none of our sidecars")?;
        let api = world.api();
        // The fake's poll count, not its call record: copying thousands of
        // records at every call would slow the bench's own side down.
        let polls_before = api.stats().polls.polls;
        kills_us.push(milestones::now_us());
        let killed = world.hosts[leader].sigkill();
        let deadline = killed + TRIAL_TIMEOUT;
        let polled = api.wait_until(
            |api| (api.stats().polls.polls > polls_before).then(Instant::now),
            TRIAL_TIMEOUT,
        );
        let survivors = world
            .hosts
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != leader)
            .map(|(_, host)| host.status_since(killed, TRIAL_TIMEOUT, connected));
        let (registered, polled, back) = tokio::join!(
            probe.register_until(&world, deadline),
            polled,
            futures::future::join_all(survivors)
        );
        let registered = registered.with_context(|| format!("trial {trial}"))?;
        let polled = polled.map_err(|e| anyhow!("trial {trial}: no new getUpdates: {e}"))?;
        samples.push(registered.max(polled).saturating_duration_since(killed));
        for at in back {
            let at = at.with_context(|| format!("trial {trial}: a survivor's status line"))?;
            lags.push(at.saturating_duration_since(polled));
        }

        // Bring the killed session back, as its host would restart it.
        world.hosts[leader].reap().await;
        let (cwd, name) = (
            world.hosts[leader].cwd.clone(),
            world.hosts[leader].name.clone(),
        );
        let mut replacement = world.spawn_session(&cwd, &name)?;
        replacement.handshake().await?;
        world.hosts[leader] = replacement;
    }
    Ok(Failover {
        takeover: samples,
        status_lag: lags,
        steps: breakdown(&world, &kills_us),
    })
}

/// Each trial's steps, from its kill until the next trial's.
fn breakdown(world: &World, kills_us: &[u128]) -> Vec<(&'static str, Vec<Duration>)> {
    // The last lines are written by each sidecar's logging thread.
    std::thread::sleep(Duration::from_millis(200));
    let all = world.milestones();
    let mut steps: Vec<(&'static str, Vec<Duration>)> = STEPS
        .iter()
        .map(|(_, _, what)| (*what, Vec::new()))
        .collect();
    for (i, &kill) in kills_us.iter().enumerate() {
        let until = kills_us.get(i + 1).copied().unwrap_or(u128::MAX);
        let at = |step: &str| match step {
            "kill" => Some(kill),
            _ => first_after(&all, step, kill, until).map(|m| m.at_us),
        };
        for (k, (step, from, _)) in STEPS.iter().enumerate() {
            if let (Some(from), Some(to)) = (at(from), at(step)) {
                steps[k].1.push(span(from, to));
            }
        }
    }
    steps
}

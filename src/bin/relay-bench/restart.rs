//! Restart convergence: `/relay restart` from one session's host until its
//! answer reports every route back (`complete`).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::report::Measure;
use crate::world::World;

pub async fn measure(relay: &Path, sessions: usize, trials: usize) -> anyhow::Result<Measure> {
    let mut world = World::start(relay, sessions).await?;
    let mut samples: Vec<Duration> = Vec::with_capacity(trials);
    for trial in 0..trials {
        let status = world.settle(sessions).await?;
        // Asked from a follower when there is one: the usual case.
        let asker = world
            .follower_indices(&status)
            .first()
            .copied()
            .unwrap_or(0);
        let start = Instant::now();
        let (ok, message) = world.hosts[asker].command("relay", "restart").await?;
        let elapsed = start.elapsed();
        if !ok && trial == 0 && samples.is_empty() {
            return Ok(Measure::na(format!("/relay restart: {message}")));
        }
        if !ok || !message.contains("complete") {
            bail!("trial {trial}: /relay restart did not complete: {message}");
        }
        samples.push(elapsed);
    }
    Ok(Measure::latency(&samples, "no trial"))
}

//! Inbound latency and fan-out: a user's message in a session's topic until
//! that session's host holds it as `agent/sendUserMessage`.
//!
//! The clock starts when the bench injects the message into the in-process
//! fake, which wakes the leader's pending long poll at once: the start is
//! "the fake answers a poll", plus the fake's own wake-up (so slightly
//! pessimistic). It stops when the host reads the request's line.

use std::time::{Duration, Instant};

use agent_relay::fake_bot_api::{DEFAULT_FORUM_CHAT_ID, DEFAULT_USER_ID, FakeBotApi, Inject};
use anyhow::{Context as _, bail};

use crate::host::Host;
use crate::milestones::{now_us, of_update, span};
use crate::report::Measure;
use crate::world::World;

/// How long one message may take before it counts as lost.
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a fan-out burst may take in all.
const BURST_TIMEOUT: Duration = Duration::from_secs(60);

fn inject(world: &World, thread: i64, text: String) {
    inject_into(&world.api(), thread, text);
}

/// Injects a message; returns its update id.
fn inject_into(api: &FakeBotApi, thread: i64, text: String) -> i64 {
    api.inject_message(Inject {
        chat_id: DEFAULT_FORUM_CHAT_ID,
        thread_id: Some(thread),
        user_id: DEFAULT_USER_ID,
        text,
    })
}

/// One message of a latency run: its update id, when it was injected (on
/// the bench's clock and the wall clock) and when the host read it.
struct Sent {
    update_id: i64,
    injected_us: u128,
    latency: Duration,
}

/// `count` messages to one follower, paced at `rate` per second.
pub async fn latency(world: &mut World, rate: f64, count: usize) -> anyhow::Result<Measure> {
    let status = world.status().await?;
    let follower = *world
        .follower_indices(&status)
        .first()
        .context("no follower on the bus")?;
    let thread = world.thread_of(&status, follower)?;
    let api = world.api();
    latency_at(&api, &mut world.hosts[follower], thread, rate, count).await
}

/// `count` messages into `thread`, whose session is `host`'s, paced at
/// `rate` per second: from the injection to the host reading the prompt.
pub async fn latency_at(
    api: &FakeBotApi,
    host: &mut Host,
    thread: i64,
    rate: f64,
    count: usize,
) -> anyhow::Result<Measure> {
    Ok(match send_paced(api, host, thread, rate, count).await? {
        Ok(sent) => {
            let samples: Vec<Duration> = sent.iter().map(|s| s.latency).collect();
            Measure::latency(&samples, "no message")
        }
        Err(na) => na,
    })
}

/// The steps of an update's way to a follower's host, each measured from
/// an earlier one ("injected" and "host" are the bench's own): (step,
/// from, what the span is). The fsync runs beside the way, before the
/// next `getUpdates`.
pub const HOP_STEPS: [(&str, &str, &str); 6] = [
    (
        "polled",
        "injected",
        "injected → the leader's poll answered",
    ),
    ("journaled", "polled", "poll answered → journal committed"),
    (
        "framed",
        "journaled",
        "committed → routed and written to the follower's socket",
    ),
    ("received", "framed", "written → the follower read it"),
    (
        "host",
        "received",
        "the follower read it → its host read the prompt",
    ),
    (
        "synced",
        "journaled",
        "committed → fsync done (beside the way; before the next poll)",
    ),
];

/// `count` messages at `rate` per second to a follower of a world of two
/// sessions whose sidecars log their milestones: each step's samples.
pub async fn hop_breakdown(
    relay: &std::path::Path,
    rate: f64,
    count: usize,
) -> anyhow::Result<Vec<(&'static str, Vec<Duration>)>> {
    let mut world = World::start_traced(relay, 2).await?;
    let status = world.status().await?;
    let follower = *world
        .follower_indices(&status)
        .first()
        .context("no follower on the bus")?;
    let thread = world.thread_of(&status, follower)?;
    let api = world.api();
    let sent = match send_paced(&api, &mut world.hosts[follower], thread, rate, count).await? {
        Ok(sent) => sent,
        Err(na) => bail!("{na:?}"),
    };
    // The last lines are written by each sidecar's logging thread.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let all = world.milestones();
    let mut steps: Vec<(&'static str, Vec<Duration>)> = HOP_STEPS
        .iter()
        .map(|(_, _, what)| (*what, Vec::new()))
        .collect();
    for s in &sent {
        let at = |step: &str| match step {
            "injected" => Some(s.injected_us),
            "host" => Some(s.injected_us + s.latency.as_micros()),
            _ => of_update(&all, step, s.update_id).map(|m| m.at_us),
        };
        for (k, (step, from, _)) in HOP_STEPS.iter().enumerate() {
            if let (Some(from), Some(to)) = (at(from), at(step)) {
                steps[k].1.push(span(from, to));
            }
        }
    }
    Ok(steps)
}

/// Sends `count` messages (and one unmeasured first) at `rate` per second
/// and waits for each at the host; `Err` is a figure not available.
async fn send_paced(
    api: &FakeBotApi,
    host: &mut Host,
    thread: i64,
    rate: f64,
    count: usize,
) -> anyhow::Result<Result<Vec<Sent>, Measure>> {
    host.drain_prompts();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let start = tokio::time::Instant::now();
    let mut samples = Vec::with_capacity(count);
    let mut lost = 0;
    // One unmeasured message first: the first delivery opens lazily built paths.
    for i in 0..=count {
        tokio::time::sleep_until(start + interval.mul_f64(i as f64)).await;
        // The full stop keeps "#1." from matching "#10.".
        let text = format!("bench inbound {rate}/s #{i}.");
        let sent = Instant::now();
        let injected_us = now_us();
        let update_id = inject_into(api, thread, text.clone());
        match host.prompt(&text, MESSAGE_TIMEOUT).await {
            Some(prompt) if i > 0 => samples.push(Sent {
                update_id,
                injected_us,
                latency: prompt.at.saturating_duration_since(sent),
            }),
            Some(_) => {}
            None if i == 0 => {
                return Ok(Err(Measure::na(format!(
                    "no agent/sendUserMessage reached the follower's host within {MESSAGE_TIMEOUT:?}"
                ))));
            }
            None => lost += 1,
        }
    }
    if lost > 0 {
        bail!("{lost} of {count} messages never reached the host");
    }
    Ok(Ok(samples))
}

/// `per_follower` messages to each follower's topic, injected at once;
/// deliveries per second from the first injection to the last arrival.
pub async fn fan_out(world: &mut World, per_follower: usize) -> anyhow::Result<Measure> {
    let status = world.status().await?;
    let (followers, threads) = world.followers_with_threads(&status)?;
    let (&first, &first_thread) = followers
        .first()
        .zip(threads.first())
        .context("no follower")?;
    world.hosts[first].drain_prompts();
    // Fail fast (and soft) where inbound delivery does not work at all.
    inject(world, first_thread, "bench fanout check".into());
    if world.hosts[first]
        .prompt("bench fanout check", MESSAGE_TIMEOUT)
        .await
        .is_none()
    {
        return Ok(Measure::na(format!(
            "no agent/sendUserMessage reached a follower's host within {MESSAGE_TIMEOUT:?}"
        )));
    }
    for &f in &followers {
        world.hosts[f].drain_prompts();
    }
    let start = Instant::now();
    for i in 0..per_follower {
        for &thread in &threads {
            inject(world, thread, format!("bench fanout #{i}."));
        }
    }
    let deadline = tokio::time::Instant::now() + BURST_TIMEOUT;
    let mut last = start;
    let mut missing = 0;
    for &f in &followers {
        match world.hosts[f]
            .prompts_with("bench fanout #", per_follower, deadline)
            .await
        {
            Ok(at) => last = last.max(at),
            Err(received) => missing += per_follower - received,
        }
    }
    let total = per_follower * followers.len();
    if missing > 0 {
        bail!("{missing} of {total} deliveries missing after {BURST_TIMEOUT:?}");
    }
    Ok(Measure::rate(
        total as u64,
        last.saturating_duration_since(start),
    ))
}

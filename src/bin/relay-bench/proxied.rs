//! Outbound through the leader: a follower's host ends a turn
//! (`turn/ended {assistantText}`), its session sends the text into its topic
//! as a Bot API call proxied by the leader. Both ends are observed in the
//! fake's record, so a proxied call and a direct one are timed alike: from
//! the first byte the bench writes to the message being stored by the fake.

use std::time::{Duration, Instant};

use agent_relay::fake_bot_api::{DEFAULT_FORUM_CHAT_ID, FakeBotApi};
use anyhow::{Context as _, bail};
use serde_json::json;

use crate::report::Measure;
use crate::world::World;

/// How long one message may take before it counts as lost.
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a throughput burst may take in all.
const BURST_TIMEOUT: Duration = Duration::from_secs(30);

/// When the fake stores a message containing `marker` in `thread`.
async fn stored(api: &FakeBotApi, thread: i64, marker: &str) -> Option<Instant> {
    api.wait_until(
        |api| {
            api.messages(DEFAULT_FORUM_CHAT_ID, Some(thread))
                .iter()
                .any(|m| m.text.contains(marker))
                .then(Instant::now)
        },
        MESSAGE_TIMEOUT,
    )
    .await
    .ok()
}

fn turn_ended(text: &str) -> serde_json::Value {
    json!({"assistantText": text, "toolCalls": []})
}

/// Latency of one `sendMessage`, proxied through the leader and direct.
pub struct Latencies {
    pub proxied: Measure,
    pub direct: Measure,
}

pub async fn latency(world: &mut World, count: usize) -> anyhow::Result<Latencies> {
    let status = world.status().await?;
    let follower = *world
        .follower_indices(&status)
        .first()
        .context("no follower on the bus")?;
    let thread = world.thread_of(&status, follower)?;
    let api = world.api();
    let client = reqwest::Client::new();
    let url = format!("{}/sendMessage", world.fake.bot_url());
    let mut direct = Vec::with_capacity(count);
    let mut proxied = Vec::with_capacity(count);
    let mut proxied_works = true;
    // One unmeasured round of each first: connections are set up lazily.
    for i in 0..=count {
        let marker = format!("bench direct #{i}.");
        let start = Instant::now();
        let call = client
            .post(&url)
            .json(&json!({"chat_id": DEFAULT_FORUM_CHAT_ID, "message_thread_id": thread, "text": marker}))
            .send();
        let (answer, at) = tokio::join!(call, stored(&api, thread, &marker));
        answer.context("direct sendMessage")?.error_for_status()?;
        let at = at.context("a direct sendMessage was not stored")?;
        if i > 0 {
            direct.push(at.saturating_duration_since(start));
        }
        if !proxied_works {
            continue;
        }
        let marker = format!("bench proxied #{i}.");
        let start = Instant::now();
        world.hosts[follower].notify("turn/ended", turn_ended(&marker));
        match stored(&api, thread, &marker).await {
            Some(at) if i > 0 => proxied.push(at.saturating_duration_since(start)),
            Some(_) => {}
            None if i == 0 => proxied_works = false,
            None => bail!("proxied message {i} never reached the fake"),
        }
    }
    let proxied = if proxied_works {
        Measure::latency(&proxied, "no message")
    } else {
        Measure::na(format!(
            "turn/ended sent nothing into the topic within {MESSAGE_TIMEOUT:?}"
        ))
    };
    Ok(Latencies {
        proxied,
        direct: Measure::latency(&direct, "no message"),
    })
}

/// `per_follower` turns ended at once by every follower; answers per
/// second until the fake stored the last one. A session merges the
/// answers that queue while a send is under way (docs/DESIGN.md, *Never
/// silent*), so answers are counted, not messages.
pub async fn throughput(world: &mut World, per_follower: usize) -> anyhow::Result<Measure> {
    let status = world.status().await?;
    let (followers, threads) = world.followers_with_threads(&status)?;
    let api = world.api();
    let count = |api: &FakeBotApi| -> usize {
        threads
            .iter()
            .map(|&t| {
                api.messages(DEFAULT_FORUM_CHAT_ID, Some(t))
                    .iter()
                    .map(|m| m.text.matches("bench burst #").count())
                    .sum::<usize>()
            })
            .sum()
    };
    let total = per_follower * followers.len();
    let start = Instant::now();
    for i in 0..per_follower {
        for &f in &followers {
            world.hosts[f].notify("turn/ended", turn_ended(&format!("bench burst #{i}.")));
        }
    }
    // Polled, not awaited per change: counting thousands of stored messages
    // on every change of the fake would slow the fake down.
    let deadline = start + BURST_TIMEOUT;
    loop {
        let stored = count(&api);
        if stored >= total {
            return Ok(Measure::rate(total as u64, start.elapsed()));
        }
        if Instant::now() >= deadline {
            let why = format!(
                "{stored}/{total} answers reached the fake within {BURST_TIMEOUT:?} (is the relay's limiter off: AGENT_RELAY_UNLIMITED=1?)"
            );
            return if stored == 0 {
                Ok(Measure::na(why))
            } else {
                bail!(why)
            };
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

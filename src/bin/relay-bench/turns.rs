//! What a turn costs in Telegram's budget (about 20 messages a minute in a
//! group, shared by every topic), with the fake's limits on and the relay
//! pacing itself: a turn in which the model writes a line before each of
//! its three tools, as real models do, for one session and for several at
//! once. Counted per turn: `sendMessage` and `editMessageText` calls into
//! the sessions' topics, 429s from the fake, and the longest wait from an
//! agent's answer (`agent/ended`) to the answer in its topic.

use std::path::Path;
use std::time::{Duration, Instant};

use agent_relay::fake_bot_api::DEFAULT_FORUM_CHAT_ID;
use anyhow::bail;
use serde_json::json;

use crate::report::Measure;
use crate::world::World;

/// How long the answers of one round may take: a group's whole minute and
/// some.
const ROUND_TIMEOUT: Duration = Duration::from_secs(180);
const TOOLS: usize = 3;

/// `rounds` rounds of one turn in each of `sessions` sessions at once.
pub async fn measure(relay: &Path, sessions: usize, rounds: usize) -> anyhow::Result<Measure> {
    let mut world = World::start_with(relay, sessions, true).await?;
    let status = world.settle(sessions).await?;
    let threads: Vec<i64> = (0..sessions)
        .map(|i| world.thread_of(&status, i))
        .collect::<anyhow::Result<_>>()?;
    let api = world.api();
    let calls_before = api.calls().len();
    let mut longest = Duration::ZERO;
    for round in 0..rounds {
        let mut ended = Vec::with_capacity(sessions);
        for (i, host) in world.hosts.iter().enumerate() {
            let answer = format!("Done «r{round}s{i}»");
            run_turn(host, &answer);
            ended.push((answer, Instant::now()));
        }
        let deadline = Instant::now() + ROUND_TIMEOUT;
        let mut arrived = vec![false; sessions];
        while arrived.iter().any(|a| !a) {
            if Instant::now() > deadline {
                bail!("round {round}: answers missing after {ROUND_TIMEOUT:?}");
            }
            for (i, thread) in threads.iter().enumerate() {
                if arrived[i] {
                    continue;
                }
                let (answer, at) = &ended[i];
                let marker = answer.trim_start_matches("Done ");
                if api
                    .messages(DEFAULT_FORUM_CHAT_ID, Some(*thread))
                    .iter()
                    .any(|m| m.plain_text.contains(marker))
                {
                    arrived[i] = true;
                    longest = longest.max(at.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // The summaries follow the answers: let them land before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let calls = api.calls();
    // An edit names its message, not its topic: the topics' messages.
    let ours: std::collections::HashSet<i64> = threads
        .iter()
        .flat_map(|t| api.messages(DEFAULT_FORUM_CHAT_ID, Some(*t)))
        .map(|m| m.message_id)
        .collect();
    let into_topics = |method: &str| {
        calls[calls_before..]
            .iter()
            .filter(|c| c.method == method && c.ok)
            .filter(|c| match c.params["message_thread_id"].as_i64() {
                Some(thread) => threads.contains(&thread),
                None => c.params["message_id"]
                    .as_i64()
                    .is_some_and(|m| ours.contains(&m)),
            })
            .count()
    };
    let turns = (sessions * rounds) as f64;
    let sends = into_topics("sendMessage") as f64 / turns;
    let edits = into_topics("editMessageText") as f64 / turns;
    let too_many = calls[calls_before..]
        .iter()
        .filter(|c| c.status == Some(429))
        .count() as u64;
    Ok(Measure::Turns {
        sends,
        edits,
        too_many,
        longest_wait_ms: longest.as_secs_f64() * 1000.0,
    })
}

/// One agent run as pi reports it: a line before each tool, then the
/// answer.
fn run_turn(host: &crate::host::Host, answer: &str) {
    host.notify("agent/started", json!({}));
    for k in 0..TOOLS {
        let id = format!("call{k}");
        host.notify(
            "tool/started",
            json!({"toolName": "bash", "toolCallId": id, "args": {"command": format!("make step{k}")}}),
        );
        host.notify(
            "tool/ended",
            json!({"toolName": "bash", "toolCallId": id, "isError": false}),
        );
        host.notify(
            "turn/ended",
            json!({"assistantText": format!("Now step {k}."), "toolCalls": [{"name": "bash"}]}),
        );
    }
    host.notify(
        "turn/ended",
        json!({"assistantText": answer, "toolCalls": []}),
    );
    host.notify("agent/ended", json!({"lastAssistantText": answer}));
}

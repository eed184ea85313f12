//! One turn, one message (issue 28): Telegram's budget (about 20 messages
//! a minute in a group, shared by every topic) spent on what a person
//! reads. A turn in which the model writes a line before each of its three
//! tools costs at most two messages in its topic — the progress message,
//! with those lines folded in, and the answer — for one session and for
//! five at once, with the fake's limits on: no 429, every answer exactly
//! once. A `/relay restart` while answers wait for the budget loses none
//! and draws no 429: the next leader goes on from the last one's budget.
//! Real sidecars against the fake Bot API; every wait has a deadline.

use crate::common;

use std::time::Duration;

use agent_relay::fake_bot_api::FakeConfig;
use common::{CHAT, FakeServer, Sidecar, session, topic, wait_topic_text};
use serde_json::json;

const TOOLS: usize = 3;

/// One agent run as pi reports it: before each tool the model writes a
/// line (a turn that ends with a tool call), then the answer.
fn run_turn(s: &Sidecar, answer: &str) {
    s.notify("agent/started", json!({}));
    for k in 0..TOOLS {
        let id = format!("call{k}");
        s.notify(
            "tool/started",
            json!({"toolName": "bash", "toolCallId": id, "args": {"command": format!("make step{k}")}}),
        );
        s.notify(
            "tool/ended",
            json!({"toolName": "bash", "toolCallId": id, "isError": false}),
        );
        s.notify(
            "turn/ended",
            json!({"assistantText": format!("Now step {k}."), "toolCalls": [{"name": "bash"}]}),
        );
    }
    s.notify(
        "turn/ended",
        json!({"assistantText": answer, "toolCalls": []}),
    );
    s.notify("agent/ended", json!({"lastAssistantText": answer}));
}

/// `sendMessage` calls into `thread` since call `from`.
fn sends(fake: &FakeServer, thread: i64, from: usize) -> usize {
    fake.api().calls()[from..]
        .iter()
        .filter(|c| c.method == "sendMessage" && c.params["message_thread_id"] == thread)
        .count()
}

fn too_many(fake: &FakeServer) -> usize {
    fake.api()
        .calls()
        .iter()
        .filter(|c| c.status == Some(429))
        .count()
}

fn count(fake: &FakeServer, thread: i64, needle: &str) -> usize {
    fake.api()
        .messages(CHAT, Some(thread))
        .iter()
        .filter(|m| m.plain_text.contains(needle))
        .count()
}

/// Waits until the progress message of `thread` says how the turn went,
/// with every line the model wrote on its way.
async fn wait_summary(fake: &FakeServer, thread: i64) -> String {
    fake.api()
        .wait_until(
            |api| {
                api.messages(CHAT, Some(thread))
                    .into_iter()
                    .map(|m| m.plain_text)
                    .find(|t| t.starts_with("✓ · 3 tools") && t.contains("Now step 2."))
            },
            Duration::from_secs(150),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no summary in {thread}: {:?}",
                fake.api().messages(CHAT, Some(thread))
            )
        })
}

fn limited() -> FakeConfig {
    FakeConfig {
        rate_limits: true,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_turn_with_a_line_before_each_tool_costs_two_messages() {
    let home = common::home();
    let fake = common::fake_with(limited()).await;
    let s = session(home.path(), &fake, "/tmp/one", "one").await;
    let thread = topic(&fake, "one").thread_id;
    wait_topic_text(&fake, thread, "connected").await;
    for turn in 0..3 {
        let from = fake.api().calls().len();
        let answer = format!("All three steps ran «t{turn}»");
        run_turn(&s, &answer);
        wait_topic_text(&fake, thread, &format!("«t{turn}»")).await;
        let summary = wait_summary(&fake, thread).await;
        assert!(
            summary.contains("💬 Now step 0.\n💬 Now step 1.\n💬 Now step 2."),
            "the model's lines are kept, in order: {summary}"
        );
        assert!(
            sends(&fake, thread, from) <= 2,
            "turn {turn}: {} messages: {:?}",
            sends(&fake, thread, from),
            fake.api().messages(CHAT, Some(thread))
        );
        assert_eq!(count(&fake, thread, &format!("«t{turn}»")), 1);
        // The next turn's summary must be its own.
        fake.api()
            .wait_until(
                |api| {
                    api.messages(CHAT, Some(thread))
                        .iter()
                        .all(|m| !m.plain_text.starts_with("⚙️ Working"))
                        .then_some(())
                },
                Duration::from_secs(150),
            )
            .await
            .expect("every progress message ends as a summary");
    }
    assert_eq!(too_many(&fake), 0, "no 429 from Telegram");
}

#[tokio::test]
async fn five_sessions_at_once_cost_two_messages_a_turn_and_no_429() {
    const SESSIONS: usize = 5;
    let home = common::home();
    let fake = common::fake_with(limited()).await;
    let mut all = Vec::new();
    for i in 0..SESSIONS {
        all.push(
            session(
                home.path(),
                &fake,
                &format!("/tmp/five{i}"),
                &format!("five{i}"),
            )
            .await,
        );
    }
    let threads: Vec<i64> = (0..SESSIONS)
        .map(|i| topic(&fake, &format!("five{i}")).thread_id)
        .collect();
    for &thread in &threads {
        wait_topic_text(&fake, thread, "connected").await;
    }
    let from = fake.api().calls().len();
    for (i, s) in all.iter().enumerate() {
        run_turn(s, &format!("Session {i} is done «s{i}»"));
    }
    for (i, &thread) in threads.iter().enumerate() {
        fake.api()
            .wait_until(
                |api| {
                    api.messages(CHAT, Some(thread))
                        .iter()
                        .any(|m| m.plain_text.contains(&format!("«s{i}»")))
                        .then_some(())
                },
                Duration::from_secs(150),
            )
            .await
            .unwrap_or_else(|_| panic!("the answer of session {i} did not arrive"));
        wait_summary(&fake, thread).await;
    }
    for (i, &thread) in threads.iter().enumerate() {
        assert_eq!(count(&fake, thread, &format!("«s{i}»")), 1, "session {i}");
        assert!(
            sends(&fake, thread, from) <= 2,
            "session {i}: {} messages",
            sends(&fake, thread, from)
        );
    }
    assert_eq!(too_many(&fake), 0, "no 429 from Telegram");
}

/// A `/relay restart` while answers wait for the group's budget: they stay
/// the relay's (none turns into "could not be sent"), and the next leader
/// knows what the last one spent, so Telegram says no 429.
#[tokio::test]
async fn a_restart_while_answers_wait_for_the_budget_loses_none_and_draws_no_429() {
    let home = common::home();
    let fake = common::fake_with(limited()).await;
    let mut leader = session(home.path(), &fake, "/tmp/lead", "lead").await;
    let s = session(home.path(), &fake, "/tmp/paced", "paced").await;
    let thread = topic(&fake, "paced").thread_id;
    wait_topic_text(&fake, thread, "connected").await;
    // Spend the group's minute, then more answers than it allows.
    const ANSWERS: usize = 22;
    for k in 0..ANSWERS {
        s.notify("agent/started", json!({}));
        s.notify(
            "turn/ended",
            json!({"assistantText": format!("answer «{k}» {}", "x".repeat(3000)), "toolCalls": []}),
        );
        s.notify("agent/ended", json!({}));
    }
    fake.api()
        .wait_until(
            |api| {
                api.messages(CHAT, Some(thread))
                    .iter()
                    .any(|m| m.plain_text.contains("answer «3»"))
                    .then_some(())
            },
            Duration::from_secs(30),
        )
        .await
        .expect("the first answers went");
    let (ok, text) = leader.command("relay", "restart").await;
    assert!(ok, "{text}");
    fake.api()
        .wait_until(
            |api| {
                let here = api.messages(CHAT, Some(thread));
                (0..ANSWERS)
                    .all(|k| {
                        here.iter()
                            .any(|m| m.plain_text.contains(&format!("answer «{k}»")))
                    })
                    .then_some(())
            },
            Duration::from_secs(240),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "answers missing: {:?}",
                fake.api().messages(CHAT, Some(thread)).len()
            )
        });
    for k in 0..ANSWERS {
        let needle = format!("answer «{k}»");
        let found: Vec<String> = fake
            .api()
            .messages(CHAT, Some(thread))
            .into_iter()
            .map(|m| m.plain_text)
            .filter(|t| t.contains(&needle))
            .map(|t| t.chars().take(120).collect())
            .collect();
        assert_eq!(found.len(), 1, "answer {k}: {found:?}");
    }
    assert_eq!(count(&fake, thread, "may be missing"), 0);
    assert_eq!(count(&fake, thread, "could not be sent"), 0);
    assert_eq!(too_many(&fake), 0, "no 429 from Telegram");
}

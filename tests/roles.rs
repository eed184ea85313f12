//! Several people on one bot (issue 38): `[access]` roles, approvals
//! answered by whom they concern (`[approvals] by`), and scheduled turns
//! that decide without a person (`[schedules] approvals`). Real sidecars,
//! the fake Bot API, a scripted host.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use common::{
    CHAT, Options, Sidecar, USER, WAIT, button, connected, inject, question, tap, tap_answer,
    topic, wait_prompt, wait_topic_text,
};
use serde_json::{Value, json};
use tokio::sync::oneshot;

/// Two drivers and a viewer beside [`USER`], who stays an owner.
const ANN: i64 = 501;
const BOB: i64 = 502;
const VERA: i64 = 503;

/// A session that accepts prompts, with `config` as config.toml.
async fn session(home: &Path, fake: &common::FakeServer, config: &str) -> Sidecar {
    common::write_config(
        home,
        &format!("[access]\ndrivers = [{ANN}, {BOB}]\nviewers = [{VERA}]\n{config}"),
    );
    let auto = Arc::new(|method: &str, _: &Value| match method {
        "agent/sendUserMessage" => Some(json!({"accepted": true})),
        _ => None,
    });
    let mut s = Sidecar::spawn(Options::new(home).configured(fake).answer(auto));
    s.handshake("/tmp/api", "api").await;
    s.wait_status(connected).await;
    s
}

fn bash(s: &mut Sidecar, command: &str) -> oneshot::Receiver<Value> {
    s.call_later(
        "approval/request",
        json!({
            "toolCallId": format!("call-{command}"),
            "tool": "bash",
            "input": {"command": command},
            "fromTelegram": true,
        }),
    )
}

async fn decided(rx: oneshot::Receiver<Value>) -> Value {
    let response = tokio::time::timeout(WAIT, rx)
        .await
        .expect("the approval is answered in time")
        .expect("the sidecar is running");
    response["result"].clone()
}

/// The host runs a turn for a message and ends it.
fn turn(s: &Sidecar, started: bool) {
    let method = if started {
        "agent/started"
    } else {
        "agent/ended"
    };
    s.notify(method, json!({}));
}

#[tokio::test]
async fn an_approval_is_the_requesters_another_drivers_tap_changes_nothing_and_an_owner_decides() {
    let home = common::home();
    let fake = common::fake().await;
    let mut s = session(home.path(), &fake, "[approvals]\nby = \"requester\"\n").await;
    let thread = topic(&fake, "api").thread_id;

    // Ann's message starts the turn: its approval is hers.
    inject(&fake, Some(thread), ANN, "clean the build");
    wait_prompt(&s, "clean the build").await;
    turn(&s, true);
    let decision = bash(&mut s, "rm -rf build");
    let asked = question(&fake, thread, "rm -rf build").await;
    let by_bob = tap(&fake, &asked, thread, BOB, &button(&asked, "Allow"));
    assert_eq!(
        tap_answer(&fake, &by_bob).await,
        "Not yours: this approval is for whoever started the turn, or an owner."
    );
    let by_vera = tap(&fake, &asked, thread, VERA, &button(&asked, "Allow"));
    assert_eq!(
        tap_answer(&fake, &by_vera).await,
        "You can read here, not answer: you are a viewer."
    );
    let by_ann = tap(&fake, &asked, thread, ANN, &button(&asked, "Deny"));
    assert_eq!(tap_answer(&fake, &by_ann).await, "❌ Deny");
    let result = decided(decision).await;
    assert_eq!(
        result["decision"], "deny",
        "Bob's tap changed nothing: {result}"
    );
    assert!(
        result["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("(user {ANN})"))),
        "the decision names who took it: {result}"
    );
    turn(&s, false);

    // Bob's turn now; an owner may decide it too.
    inject(&fake, Some(thread), BOB, "deploy it");
    wait_prompt(&s, "deploy it").await;
    turn(&s, true);
    let decision = bash(&mut s, "make deploy");
    let asked = question(&fake, thread, "make deploy").await;
    let by_ann = tap(&fake, &asked, thread, ANN, &button(&asked, "Allow"));
    assert!(tap_answer(&fake, &by_ann).await.starts_with("Not yours"));
    tap(&fake, &asked, thread, USER, &button(&asked, "Allow"));
    let result = decided(decision).await;
    assert_eq!(result["decision"], "allow", "the owner decided: {result}");
    assert!(fake.api().unanswered_callback_queries().is_empty());
}

#[tokio::test]
async fn with_approvals_by_owners_a_drivers_own_turn_waits_for_an_owner() {
    let home = common::home();
    let fake = common::fake().await;
    let mut s = session(home.path(), &fake, "[approvals]\nby = \"owners\"\n").await;
    let thread = topic(&fake, "api").thread_id;
    inject(&fake, Some(thread), ANN, "push it");
    wait_prompt(&s, "push it").await;
    turn(&s, true);
    let decision = bash(&mut s, "git push");
    let asked = question(&fake, thread, "git push").await;
    let by_ann = tap(&fake, &asked, thread, ANN, &button(&asked, "Allow"));
    assert!(tap_answer(&fake, &by_ann).await.starts_with("Not yours"));
    tap(&fake, &asked, thread, USER, &button(&asked, "Deny"));
    assert_eq!(decided(decision).await["decision"], "deny");
}

#[tokio::test]
async fn a_viewer_reaches_no_agent_and_is_told_why_and_a_driver_cannot_start_agents() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "").await;
    let thread = topic(&fake, "api").thread_id;

    inject(&fake, Some(thread), VERA, "rm everything please");
    wait_topic_text(&fake, thread, "You are a viewer here").await;
    inject(&fake, Some(thread), VERA, "/stop");
    wait_topic_text(&fake, thread, "🔒 You are a viewer here").await;
    inject(&fake, None, ANN, "/new /tmp x");
    wait_topic_text_general(
        &fake,
        "🔒 You are a driver here ([access] in config.toml); this needs an owner.",
    )
    .await;
    inject(&fake, None, ANN, "/every 1h check");
    wait_topic_text_general(&fake, "this needs an owner").await;
    // A viewer may read the lists.
    inject(&fake, None, VERA, "/sessions");
    wait_topic_text_general(&fake, "Sessions").await;

    // What Ann writes in the topic still reaches the agent; nothing of
    // Vera's ever did.
    inject(&fake, Some(thread), ANN, "after that");
    wait_prompt(&s, "after that").await;
    let prompts = common::prompts(&s);
    assert!(
        prompts.iter().all(|p| !p["params"]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("rm everything")),
        "{prompts:?}"
    );
}

/// Waits until a message containing `needle` is in the forum's General.
async fn wait_topic_text_general(fake: &common::FakeServer, needle: &str) {
    fake.api()
        .wait_until(
            |api| {
                api.messages(CHAT, None)
                    .into_iter()
                    .any(|m| m.plain_text.contains(needle))
                    .then_some(())
            },
            WAIT,
        )
        .await
        .unwrap_or_else(|_| {
            let said: Vec<String> = fake
                .api()
                .messages(CHAT, None)
                .into_iter()
                .map(|m| m.plain_text)
                .collect();
            panic!("no {needle:?} in General: {said:?}")
        });
}

#[tokio::test]
async fn a_scheduled_turn_is_denied_without_asking_when_configured_and_a_persons_still_asks() {
    let home = common::home();
    let fake = common::fake().await;
    let mut s = session(home.path(), &fake, "[schedules]\napprovals = \"deny\"\n").await;
    let thread = topic(&fake, "api").thread_id;
    inject(&fake, Some(thread), USER, "/at +5s nightly check");
    wait_prompt(&s, "nightly check").await;
    turn(&s, true);
    let result = decided(bash(&mut s, "make release")).await;
    assert_eq!(
        (result["decision"].as_str(), result["by"].as_str()),
        (Some("deny"), Some("policy")),
        "{result}"
    );
    assert!(
        result["reason"]
            .as_str()
            .is_some_and(|r| r.contains("scheduled")),
        "{result}"
    );
    assert!(
        fake.api()
            .messages(CHAT, Some(thread))
            .iter()
            .all(|m| !m.plain_text.contains("make release") || m.reply_markup.is_none()),
        "nobody was asked"
    );
    turn(&s, false);

    // A person's turn is asked as ever.
    inject(&fake, Some(thread), USER, "now by hand");
    wait_prompt(&s, "now by hand").await;
    turn(&s, true);
    let decision = bash(&mut s, "make release again");
    let asked = question(&fake, thread, "make release again").await;
    tap(&fake, &asked, thread, USER, &button(&asked, "Allow"));
    assert_eq!(decided(decision).await["decision"], "allow");
}

//! Receipts on a person's own message (issue 38): what became of it, as
//! the bot's reaction on it — 👀 once the agent took it (at once, or when a
//! turn took a queued one), 💔 when it could not be delivered, beside the
//! notice; an album once; none with `receipts = false`; never a message.

use crate::common;

use serde_json::json;

use common::{CHAT, Options, Sidecar, USER, WAIT, inject, session, topic, wait_prompt};

/// Waits until message `message_id` of the forum carries `emoji` as the
/// bot's reaction now.
async fn wait_mark(fake: &common::FakeServer, message_id: i64, emoji: &str) {
    let wanted = Some(emoji.to_string());
    fake.api()
        .wait_until(
            |api| (api.reactions(CHAT, message_id).last() == Some(&wanted)).then_some(()),
            WAIT,
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "message {message_id} never got {emoji}: {:?}",
                fake.api().reactions(CHAT, message_id)
            )
        });
}

/// The message a person wrote, with its id.
fn write(fake: &common::FakeServer, thread: i64, text: &str) -> i64 {
    fake.api()
        .inject_user_message(agent_relay::fake_bot_api::UserMessage {
            chat_id: CHAT,
            thread_id: Some(thread),
            user_id: USER,
            text: text.into(),
            ..Default::default()
        })
        .expect("posted")
        .message_id
}

#[tokio::test]
async fn a_message_the_agent_took_is_marked_and_a_mark_is_no_message() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let sent = fake.api().messages(CHAT, Some(thread)).len();
    let message_id = write(&fake, thread, "look at the build");
    wait_prompt(&s, "look at the build").await;
    wait_mark(&fake, message_id, "👀").await;
    assert_eq!(
        fake.api().messages(CHAT, Some(thread)).len(),
        sent,
        "no message of the bot's: a mark is no message"
    );
    assert_eq!(
        fake.api().reactions(CHAT, message_id).len(),
        1,
        "marked once"
    );
}

/// A host that holds a prompt for its next turn (`queued`): the mark comes
/// when a turn takes it, not before.
#[tokio::test]
async fn a_queued_message_is_marked_when_a_turn_takes_it() {
    let home = common::home();
    let fake = common::fake().await;
    let queued = std::sync::Arc::new(|method: &str, _: &serde_json::Value| match method {
        "agent/sendUserMessage" => Some(json!({"accepted": true, "queued": true})),
        _ => None,
    });
    let mut s = Sidecar::spawn(Options::new(home.path()).configured(&fake).answer(queued));
    s.handshake("/tmp/api", "api").await;
    s.wait_status(common::connected).await;
    let thread = topic(&fake, "api").thread_id;
    let message_id = write(&fake, thread, "after this turn");
    let prompt = wait_prompt(&s, "after this turn").await;
    // A command the session runs at once is marked: by then the first
    // would have been too, had the relay marked it before a turn took it.
    let status = write(&fake, thread, "/status");
    wait_mark(&fake, status, "👀").await;
    assert!(
        fake.api().reactions(CHAT, message_id).is_empty(),
        "no mark while it waits for a turn"
    );
    s.notify(
        "agent/taken",
        json!({"updateIds": [prompt["params"]["origin"]["updateId"]]}),
    );
    wait_mark(&fake, message_id, "👀").await;
}

/// A message that can never be delivered (its session disconnected for
/// good) is marked 💔 beside the notice that says why.
#[tokio::test]
async fn a_message_that_reached_no_agent_is_marked_beside_the_notice() {
    let home = common::home();
    let fake = common::fake().await;
    // A session whose host never answers a prompt: its messages wait in
    // the journal. It confirms the disconnect's dialog.
    let refusing = std::sync::Arc::new(|method: &str, _: &serde_json::Value| match method {
        "ui/confirm" => Some(json!({"confirmed": true})),
        _ => None,
    });
    let mut s = Sidecar::spawn(Options::new(home.path()).configured(&fake).answer(refusing));
    s.handshake("/tmp/api", "api").await;
    s.wait_status(common::connected).await;
    let thread = topic(&fake, "api").thread_id;
    let message_id = write(&fake, thread, "nobody reads this");
    s.wait_for("the prompt", |m| m["method"] == "agent/sendUserMessage")
        .await;
    let (ok, text) = s.command("telegram-disconnect", "").await;
    assert!(ok, "{text}");
    fake.api()
        .wait_until(
            |api| {
                api.messages(CHAT, None).into_iter().find(|m| {
                    m.plain_text
                        .contains("“nobody reads this” reached no agent")
                })
            },
            WAIT,
        )
        .await
        .expect("the notice");
    wait_mark(&fake, message_id, "💔").await;
}

#[tokio::test]
async fn receipts_can_be_switched_off() {
    let home = common::home();
    common::write_config(home.path(), "receipts = false\n");
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let first = write(&fake, thread, "one");
    wait_prompt(&s, "one").await;
    let _ = inject(&fake, Some(thread), USER, "two");
    wait_prompt(&s, "two").await;
    assert!(fake.api().reactions(CHAT, first).is_empty());
    assert!(
        !fake
            .api()
            .calls()
            .iter()
            .any(|c| c.method == "setMessageReaction"),
        "not one reaction"
    );
}

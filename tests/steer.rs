//! Steer or queue (issue 38): a message written while a turn runs waits
//! for the next turn; the progress message offers ⚡ Steer now (no message
//! of its own) and `/steer` does it, into the running turn, once. A host
//! that cannot steer is offered nothing, and `/steer` says why.

use crate::common;

use serde_json::{Value, json};

use agent_relay::fake_bot_api::{CallbackInject, FakeServer};
use common::{CHAT, Options, Sidecar, USER, WAIT, connected, inject, prompts, topic, wait_prompt};

/// A session in the group whose host says whether it can steer (`None`:
/// says nothing, as an older host).
async fn session(home: &std::path::Path, fake: &FakeServer, can_steer: Option<bool>) -> Sidecar {
    started(Options::new(home).configured(fake), can_steer).await
}

async fn started(options: Options<'_>, can_steer: Option<bool>) -> Sidecar {
    let mut s = Sidecar::spawn(common::accepting(options));
    let mut params = json!({
        "protocolVersion": 1,
        "host": {"name": "test-host", "version": "1.0"},
        "cwd": "/tmp/api",
        "session": {"id": "id-api", "name": "api"},
    });
    if let Some(can) = can_steer {
        params["canSteer"] = json!(can);
    }
    s.call("initialize", params).await;
    s.notify("initialized", json!({}));
    s.wait_status(connected).await;
    s
}

/// A turn under way with a tool call, so a group's progress message shows.
async fn turn_with_progress(s: &Sidecar, fake: &FakeServer, thread: i64) -> i64 {
    s.notify("agent/started", json!({}));
    s.notify(
        "tool/started",
        json!({"toolName": "bash", "toolCallId": "t1", "args": {"command": "make"}}),
    );
    fake.api()
        .wait_until(
            |api| {
                api.messages(CHAT, Some(thread))
                    .into_iter()
                    .find(|m| m.plain_text.contains("Working"))
                    .map(|m| m.message_id)
            },
            WAIT,
        )
        .await
        .expect("the progress message")
}

/// The progress message's buttons' data, once it has `want` of them.
async fn wait_buttons(fake: &FakeServer, thread: i64, progress: i64, want: usize) -> Vec<String> {
    fake.api()
        .wait_until(
            |api| {
                let message = api
                    .messages(CHAT, Some(thread))
                    .into_iter()
                    .find(|m| m.message_id == progress)?;
                let data = buttons(message.reply_markup.as_ref());
                (data.len() == want).then_some(data)
            },
            WAIT,
        )
        .await
        .unwrap_or_else(|_| panic!("the progress message never had {want} buttons"))
}

fn buttons(markup: Option<&Value>) -> Vec<String> {
    markup
        .and_then(|m| m["inline_keyboard"].as_array())
        .into_iter()
        .flatten()
        .flat_map(|row| row.as_array().cloned().unwrap_or_default())
        .filter_map(|b| b["callback_data"].as_str().map(String::from))
        .collect()
}

fn prompts_with(s: &Sidecar, text: &str) -> Vec<Value> {
    prompts(s)
        .into_iter()
        .filter(|m| m["params"]["text"] == text)
        .collect()
}

#[tokio::test]
async fn a_message_written_mid_turn_waits_and_steer_now_gives_it_to_the_running_turn_once() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, Some(true)).await;
    let thread = topic(&fake, "api").thread_id;
    let progress = turn_with_progress(&s, &fake, thread).await;
    let sent = fake.api().messages(CHAT, Some(thread)).len();

    let written = fake
        .api()
        .inject_user_message(agent_relay::fake_bot_api::UserMessage {
            chat_id: CHAT,
            thread_id: Some(thread),
            user_id: USER,
            text: "also check the docs".into(),
            ..Default::default()
        })
        .expect("posted")
        .message_id;
    let data = wait_buttons(&fake, thread, progress, 1).await;
    assert_eq!(data, ["steer"]);
    let shown = fake.api().messages(CHAT, Some(thread));
    assert!(
        shown.iter().any(|m| m
            .plain_text
            .contains("📨 1 message waits for the next turn")),
        "{shown:?}"
    );
    assert!(
        prompts_with(&s, "also check the docs").is_empty(),
        "it waits in the relay, not in the host"
    );
    assert!(
        fake.api().reactions(CHAT, written).is_empty(),
        "not taken yet: no 👀"
    );

    fake.api().inject_callback_query(CallbackInject {
        chat_id: CHAT,
        thread_id: Some(thread),
        user_id: USER,
        message_id: progress,
        data: "steer".into(),
    });
    let steered = wait_prompt(&s, "also check the docs").await;
    assert_eq!(steered["params"]["deliverAs"], "steer", "{steered}");
    wait_buttons(&fake, thread, progress, 0).await;
    // Its receipt: 👀 once the host took it.
    fake.api()
        .wait_until(
            |api| (api.reactions(CHAT, written).last() == Some(&Some("👀".into()))).then_some(()),
            WAIT,
        )
        .await
        .expect("the steered message marked taken");

    // The run ends; what comes next is a turn of its own, and the steered
    // message is not given again.
    s.notify("agent/ended", json!({"lastAssistantText": "done"}));
    inject(&fake, Some(thread), USER, "next");
    let next = wait_prompt(&s, "next").await;
    assert!(next["params"].get("deliverAs").is_none(), "{next}");
    assert_eq!(prompts_with(&s, "also check the docs").len(), 1);
    common::wait_topic_text(&fake, thread, "done").await;
    let answers = fake.api().messages(CHAT, Some(thread)).len();
    assert_eq!(
        answers,
        sent + 1,
        "the answer is the only message since the progress: the button and its line cost none"
    );
}

#[tokio::test]
async fn what_waited_starts_the_next_turn_as_one_prompt_and_steer_with_text_goes_in_now() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, Some(true)).await;
    let thread = topic(&fake, "api").thread_id;
    let progress = turn_with_progress(&s, &fake, thread).await;

    inject(&fake, Some(thread), USER, "first thought");
    inject(&fake, Some(thread), USER, "second thought");
    fake.api()
        .wait_until(
            |api| {
                api.messages(CHAT, Some(thread)).into_iter().find(|m| {
                    m.message_id == progress && m.plain_text.contains("📨 2 messages wait")
                })
            },
            WAIT,
        )
        .await
        .expect("two wait");

    inject(&fake, Some(thread), USER, "/steer not that file, the other");
    let steered = wait_prompt(&s, "not that file, the other").await;
    assert_eq!(steered["params"]["deliverAs"], "steer", "{steered}");

    s.notify("agent/ended", json!({"lastAssistantText": "done"}));
    let next = wait_prompt(&s, "first thought\n\nsecond thought").await;
    assert!(next["params"].get("deliverAs").is_none(), "{next}");
    assert!(prompts_with(&s, "first thought").is_empty());

    // No turn runs and nothing waits: a bare /steer says what it does.
    inject(&fake, Some(thread), USER, "/steer");
    common::wait_topic_text(&fake, thread, "Nothing waits for the next turn").await;
}

#[tokio::test]
async fn a_host_that_cannot_steer_is_offered_no_button_and_steer_says_why() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, None).await;
    let thread = topic(&fake, "api").thread_id;
    let progress = turn_with_progress(&s, &fake, thread).await;

    inject(&fake, Some(thread), USER, "also check the docs");
    let queued = wait_prompt(&s, "also check the docs").await;
    assert_eq!(
        queued["params"]["deliverAs"], "followUp",
        "queued in the host at once, as before"
    );

    inject(&fake, Some(thread), USER, "/steer look at the tests");
    common::wait_topic_text(&fake, thread, "cannot take a message into a turn that runs").await;
    let kept = wait_prompt(&s, "look at the tests").await;
    assert_eq!(
        kept["params"]["deliverAs"], "followUp",
        "not lost: the next turn gets it"
    );
    let message = fake
        .api()
        .messages(CHAT, Some(thread))
        .into_iter()
        .find(|m| m.message_id == progress)
        .expect("the progress message");
    assert!(
        buttons(message.reply_markup.as_ref()).is_empty(),
        "{:?}",
        message.reply_markup
    );
}

#[tokio::test]
async fn in_a_private_chat_the_draft_names_steer_and_steer_gives_what_waits() {
    let home = common::home();
    let fake = common::fake().await;
    let s = started(Options::new(home.path()).private_chat(&fake), Some(true)).await;
    let thread = common::Chat::Private.topic(&fake, "api");
    s.notify("agent/started", json!({}));
    s.notify(
        "tool/started",
        json!({"toolName": "bash", "toolCallId": "c1", "args": {"command": "make"}}),
    );
    common::inject_in(&fake, USER, Some(thread), USER, "also the docs");
    fake.api()
        .wait_until(
            |api| {
                api.drafts().into_iter().find(|d| {
                    d.thread_id == Some(thread)
                        && d.texts.iter().any(|t| {
                            t.contains("📨 1 message waits for the next turn · /steer gives it now")
                        })
                })
            },
            WAIT,
        )
        .await
        .unwrap_or_else(|_| panic!("no draft names /steer: {:?}", fake.api().drafts()));
    assert!(prompts_with(&s, "also the docs").is_empty());
    common::inject_in(&fake, USER, Some(thread), USER, "/steer");
    let steered = wait_prompt(&s, "also the docs").await;
    assert_eq!(steered["params"]["deliverAs"], "steer", "{steered}");
}

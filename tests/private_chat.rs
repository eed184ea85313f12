//! The private-chat mode, as first-class as the group: no `chat_id`, the
//! topics in the paired user's private chat with the bot (which has topics
//! there: `getMe` → `has_topics_enabled`). What holds in a group holds
//! here, and runs here from `routing.rs` (routing both ways, offline
//! delivery, failover, the list outside the topics); the rest is the
//! private chat's own: the status line, disconnect, restart, pairing from
//! a session, topics switched on later, approvals and drafts.

use crate::common;
use crate::routing;

use std::path::Path;

use common::{
    Chat, FakeServer, Options, Sidecar, USER, WAIT, accepting, connected, created_topics,
    inject_in, pairing_code, prompts, start, wait_prompt, wait_topic_text_in,
};
use serde_json::json;

/// An accepting session in the private-chat mode, on the bus.
async fn session(home: &Path, fake: &FakeServer, cwd: &str, name: &str) -> Sidecar {
    start(Options::new(home).private_chat(fake), cwd, name).await
}

/// The session's live topic in the user's private chat.
fn topic(fake: &FakeServer, name: &str) -> i64 {
    Chat::Private.topic(fake, name)
}

fn inject(fake: &FakeServer, thread: i64, text: &str) -> i64 {
    inject_in(fake, USER, Some(thread), USER, text)
}

#[tokio::test]
async fn each_session_gets_a_topic_in_the_private_chat_and_only_its_own_messages() {
    routing::own_topics_and_messages(Chat::Private).await;
}

#[tokio::test]
async fn outside_any_topic_the_user_gets_the_list_of_sessions_in_the_private_chat() {
    routing::list_outside_the_topics(Chat::Private).await;
}

#[tokio::test]
async fn an_offline_owner_gets_its_private_messages_in_order_when_it_returns() {
    routing::offline_owner_gets_its_messages(Chat::Private).await;
}

#[tokio::test]
async fn sigkill_of_the_leader_keeps_every_private_topic_and_delivery_goes_on() {
    routing::delivery_in_flight_through_failover(Chat::Private).await;
}

#[tokio::test]
async fn the_status_line_and_telegram_status_show_the_private_topic() {
    let home = common::home();
    let fake = common::fake().await;
    let mut a = session(home.path(), &fake, "/tmp/a", "api").await;
    let status = a.latest_status().unwrap();
    assert!(status.contains("·api ● leader"), "{status}");
    let (ok, text) = a.command("telegram-status", "").await;
    assert!(ok, "{text}");
    assert!(
        text.contains("binding: bound A · api") && text.contains("transport: leader"),
        "{text}"
    );
    assert!(
        text.contains(&format!("private chat with user {USER}")),
        "{text}"
    );
}

#[tokio::test]
async fn disconnect_deletes_the_private_topic_only_when_confirmed() {
    let home = common::home();
    let fake = common::fake().await;
    let _leader = session(home.path(), &fake, "/tmp/l", "lead").await;
    let declined = Options::new(home.path())
        .private_chat(&fake)
        .answer(std::sync::Arc::new(|method, _| {
            (method == "ui/confirm").then(|| json!({"confirmed": false}))
        }));
    let mut no = Sidecar::spawn(declined);
    no.handshake("/tmp/n", "keep").await;
    no.wait_status(connected).await;
    let (ok, text) = no.command("telegram-disconnect", "").await;
    assert!(!ok && text.contains("nothing changed"), "{text}");
    topic(&fake, "keep");

    let mut yes = session(home.path(), &fake, "/tmp/y", "bye").await;
    let thread = topic(&fake, "bye");
    let (ok, text) = yes.command("telegram-disconnect", "").await;
    assert!(ok, "{text}");
    let gone = fake
        .api()
        .topics(USER)
        .into_iter()
        .find(|t| t.thread_id == thread)
        .expect("the topic is known");
    assert!(gone.deleted, "the topic is deleted");
    assert_eq!(yes.wait_status(|_| true).await, "TG ○ disconnected");
    let deletes: Vec<_> = fake
        .api()
        .calls()
        .into_iter()
        .filter(|c| c.method == "deleteForumTopic")
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert_eq!(deletes[0].params["chat_id"], USER);
}

#[tokio::test]
async fn restart_completes_in_the_private_chat_and_creates_no_topic() {
    let home = common::home();
    let fake = common::fake().await;
    let mut a = session(home.path(), &fake, "/tmp/a", "one").await;
    let b = session(home.path(), &fake, "/tmp/b", "two").await;
    let (ok, text) = a.command("relay", "restart").await;
    assert!(ok, "{text}");
    assert!(text.contains("complete 2/2"), "{text}");
    b.wait_status(connected).await;
    a.wait_status(connected).await;
    assert_eq!(created_topics(&fake), 2, "a restart creates no topics");
    inject(&fake, topic(&fake, "two"), "after the restart");
    wait_prompt(&b, "after the restart").await;
}

#[tokio::test]
async fn pairing_from_a_session_puts_the_topics_in_that_users_private_chat() {
    let home = common::home();
    let fake = common::fake().await;
    let options = accepting(
        Options::new(home.path())
            .private_chat(&fake)
            .env("AGENT_RELAY_ALLOWED_USERS", ""),
    );
    let mut a = Sidecar::spawn(options);
    a.handshake("/tmp/a", "pair").await;
    a.wait_status(|s| s.contains("unpaired")).await;
    assert!(
        fake.api().topics(USER).is_empty(),
        "no chat to put it in yet"
    );
    let (ok, text) = a.command("telegram-connect", "").await;
    assert!(ok, "{text}");
    let code = pairing_code(&text);
    inject_in(&fake, USER, None, USER, &format!("/start {code}"));
    // Paired while topicless: the session registers again and gets its
    // topic in the paired user's private chat.
    let thread = fake
        .api()
        .wait_until(
            |api| {
                api.topics(USER)
                    .into_iter()
                    .find(|t| !t.deleted && t.name.ends_with("· pair"))
            },
            WAIT,
        )
        .await
        .expect("a topic in the paired user's private chat")
        .thread_id;
    a.wait_status(|s| s.contains("·pair ● leader")).await;
    inject(&fake, thread, "now mine");
    wait_prompt(&a, "now mine").await;
}

#[tokio::test]
async fn topics_switched_on_in_botfather_are_noticed_without_a_restart() {
    let home = common::home();
    let fake = common::fake().await;
    fake.api().set_has_topics_enabled(false);
    let mut a = Sidecar::spawn(accepting(Options::new(home.path()).private_chat(&fake)));
    a.handshake("/tmp/a", "api").await;
    // The session says what to switch on, not just that it is stuck.
    let status = a.wait_status(|s| s.contains("✕ chat has no topics")).await;
    let (_, text) = a.command("telegram-status", "").await;
    assert!(text.contains("turn on Threaded Mode"), "{status}\n{text}");
    // The user switches topics on; the same leader notices.
    fake.api().set_has_topics_enabled(true);
    let (ok, text) = a.command("telegram-connect", "").await;
    assert!(ok, "{text}");
    a.wait_status(connected).await;
    assert_eq!(created_topics(&fake), 1);
}

#[tokio::test]
async fn a_tool_call_is_approved_from_the_private_topic() {
    let home = common::home();
    let fake = common::fake().await;
    let mut a = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api");
    let decision = a.call_later(
        "approval/request",
        json!({"toolCallId": "c1", "tool": "bash", "input": {"command": "make deploy"}, "fromTelegram": true}),
    );
    // Asked in the private topic.
    let asked = common::question_in(&fake, USER, thread, "make deploy").await;
    let allow = common::button(&asked, "Allow");
    common::tap_in(&fake, USER, &asked, thread, USER, &allow);
    let answer = tokio::time::timeout(WAIT, decision)
        .await
        .expect("decided in time")
        .expect("the sidecar runs");
    assert_eq!(answer["result"]["decision"], "allow", "{answer}");
    assert_eq!(answer["result"]["by"], "phone", "{answer}");
}

/// The drafts of `thread` whose text satisfies `shown`, once there is one.
async fn wait_draft(
    fake: &FakeServer,
    thread: i64,
    shown: impl Fn(&str) -> bool,
) -> agent_relay::fake_bot_api::DraftRecord {
    fake.api()
        .wait_until(
            |api| {
                api.drafts()
                    .into_iter()
                    .find(|d| d.thread_id == Some(thread) && d.texts.iter().any(|t| shown(t)))
            },
            WAIT,
        )
        .await
        .unwrap_or_else(|_| panic!("no such draft: {:?}", fake.api().drafts()))
}

#[tokio::test]
async fn a_turn_streams_as_a_draft_and_lands_as_one_message() {
    let home = common::home();
    let fake = common::fake().await;
    let a = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api");
    let before = fake.api().messages(USER, Some(thread)).len();

    a.notify("agent/started", json!({}));
    a.notify(
        "tool/started",
        json!({"toolName": "bash", "toolCallId": "c1", "args": {"command": "ls"}}),
    );
    wait_draft(&fake, thread, |t| t.contains("▸ bash: ")).await;
    a.notify("turn/text", json!({"text": "Listing the files"}));
    a.notify(
        "turn/ended",
        json!({"assistantText": "Listing the files", "toolCalls": [{"name": "bash"}]}),
    );
    a.notify("turn/text", json!({"text": "The answer"}));
    wait_draft(&fake, thread, |t| t.contains("The answer")).await;
    a.notify("turn/text", json!({"text": "The answer is **42**"}));
    let draft = wait_draft(&fake, thread, |t| t.contains("The answer is 42")).await;
    assert!(draft.can_stop, "the draft offers its stop button");
    a.notify(
        "turn/ended",
        json!({"assistantText": "The answer is **42**", "toolCalls": []}),
    );
    a.notify(
        "agent/ended",
        json!({"lastAssistantText": "The answer is **42**"}),
    );
    let texts = wait_topic_text_in(&fake, USER, thread, "The answer is 42").await;

    let drafts: Vec<_> = fake
        .api()
        .drafts()
        .into_iter()
        .filter(|d| d.thread_id == Some(thread))
        .collect();
    assert_eq!(drafts.len(), 1, "one draft for the turn: {drafts:?}");
    let shown = &drafts[0].texts;
    assert!(shown[0].starts_with("⚙️ Working · 1 tool"), "{shown:?}");
    let grew = shown
        .iter()
        .position(|t| t.ends_with("The answer"))
        .zip(shown.iter().position(|t| t.ends_with("The answer is 42")));
    assert!(
        matches!(grew, Some((early, late)) if early < late),
        "the draft grows with the answer: {shown:?}"
    );
    // One message for the turn: how it went, what was said on the way,
    // and the answer; it takes the draft's place.
    let messages = fake.api().messages(USER, Some(thread));
    let turn: Vec<_> = messages[before..].iter().collect();
    assert_eq!(turn.len(), 1, "one message: {texts:?}");
    let answer = &turn[0].plain_text;
    assert!(answer.starts_with("✓ · 1 tool · 0:0"), "{answer}");
    assert!(answer.contains("💬 Listing the files"), "{answer}");
    assert!(answer.ends_with("The answer is 42"), "{answer}");
    assert_eq!(drafts[0].replaced_by, Some(turn[0].message_id));
    let edits = fake
        .api()
        .calls()
        .iter()
        .filter(|c| c.method.starts_with("editMessage"))
        .count();
    assert_eq!(edits, 0, "a draft is never an edit");
}

#[tokio::test]
async fn the_drafts_stop_button_stops_the_turn() {
    let home = common::home();
    let fake = common::fake().await;
    let a = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api");
    a.notify("agent/started", json!({}));
    a.notify(
        "tool/started",
        json!({"toolName": "bash", "toolCallId": "c1", "args": {"command": "sleep 600"}}),
    );
    let draft = wait_draft(&fake, thread, |t| t.contains("sleep 600")).await;
    fake.api()
        .press_stop(USER, Some(thread), draft.draft_id)
        .expect("the stop button is shown");
    a.wait_for("agent/abort", |m| m["method"] == "agent/abort")
        .await;
    wait_topic_text_in(&fake, USER, thread, "⏹ Stopped.").await;
    assert!(
        prompts(&a).is_empty(),
        "the stop is no prompt: {:?}",
        prompts(&a)
    );
}

/// A Bot API server that lags behind Telegram (a self-hosted one, or a
/// proxy) lacks drafts and disabled buttons: the turn's progress is an
/// edited message, as in a group, after one refused draft (before: every
/// 1.2 s a 404, for the whole turn, and only typing shown); a settled
/// question loses its buttons instead of keeping live ones; `/relay
/// status` says what the server lacks.
#[tokio::test]
async fn a_server_without_drafts_or_disabled_buttons_is_done_without() {
    let home = common::home();
    let fake = common::fake().await;
    fake.api().set_lagging(&["sendMessageDraft"], false);
    let mut a = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api");

    a.notify("agent/started", json!({}));
    a.notify(
        "tool/started",
        json!({"toolName": "bash", "toolCallId": "c1", "args": {"command": "ls"}}),
    );
    wait_topic_text_in(&fake, USER, thread, "⚙️ Working").await;
    a.notify(
        "tool/started",
        json!({"toolName": "bash", "toolCallId": "c2", "args": {"command": "make"}}),
    );
    a.notify(
        "turn/ended",
        json!({"assistantText": "Built.", "toolCalls": [{"name": "bash"}, {"name": "bash"}]}),
    );
    a.notify("agent/ended", json!({"lastAssistantText": "Built."}));
    wait_topic_text_in(&fake, USER, thread, "Built.").await;
    let drafts = fake
        .api()
        .calls()
        .iter()
        .filter(|c| c.method == "sendMessageDraft")
        .count();
    assert_eq!(drafts, 1, "one draft refused, then none asked for");

    let decision = a.call_later(
        "approval/request",
        json!({"toolCallId": "c3", "tool": "bash", "input": {"command": "make deploy"}, "fromTelegram": true}),
    );
    let asked = common::question_in(&fake, USER, thread, "make deploy").await;
    let allow = common::button(&asked, "Allow");
    common::tap_in(&fake, USER, &asked, thread, USER, &allow);
    tokio::time::timeout(WAIT, decision)
        .await
        .expect("decided in time")
        .expect("the sidecar runs");
    fake.api()
        .wait_until(
            |api| {
                api.message(USER, asked.message_id)
                    .filter(|m| m.plain_text.contains("Allow") && m.reply_markup.is_none())
            },
            WAIT,
        )
        .await
        .expect("the settled question keeps no live buttons");

    let (ok, text) = a.command("relay", "status").await;
    assert!(ok, "{text}");
    assert!(
        text.contains("the Bot API server lacks: sendMessageDraft")
            && text.contains("the Bot API server lacks: disabled buttons"),
        "{text}"
    );
}

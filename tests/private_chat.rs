//! The private-chat mode, as first-class as the group: no `chat_id`, the
//! topics in the paired user's private chat with the bot (which has topics
//! there: `getMe` → `has_topics_enabled`). The same real sidecars and fake
//! Bot API as `routing.rs`, `bus.rs` and `lifecycle.rs`: routing both ways,
//! offline delivery, failover, disconnect, restart, the status line and
//! pairing from a session.

use crate::common;

use std::path::Path;

use common::{
    CHAT, FakeServer, Options, Sidecar, USER, WAIT, accepting, connected, inject_in, prompts,
    start, topic_in, wait_prompt, wait_topic_text_in,
};
use serde_json::json;

/// An accepting session in the private-chat mode, on the bus.
async fn session(home: &Path, fake: &FakeServer, cwd: &str, name: &str) -> Sidecar {
    start(Options::new(home).private_chat(fake), cwd, name).await
}

/// The session's live topic in the user's private chat.
fn topic(fake: &FakeServer, name: &str) -> i64 {
    topic_in(fake, USER, name).thread_id
}

fn inject(fake: &FakeServer, thread: i64, text: &str) -> i64 {
    inject_in(fake, USER, Some(thread), USER, text)
}

fn created_topics(fake: &FakeServer) -> usize {
    fake.api()
        .calls()
        .iter()
        .filter(|c| c.method == "createForumTopic" && c.ok)
        .count()
}

#[tokio::test]
async fn each_session_gets_a_topic_in_the_private_chat_and_only_its_own_messages() {
    let home = common::home();
    let fake = common::fake().await;
    let a = session(home.path(), &fake, "/tmp/a", "api").await;
    let b = session(home.path(), &fake, "/tmp/b", "web").await;
    assert!(fake.api().topics(CHAT).is_empty(), "no group is involved");
    let (api, web) = (topic(&fake, "api"), topic(&fake, "web"));
    assert_ne!(api, web);

    let update_id = inject(&fake, web, "deploy the web app");
    let prompt = wait_prompt(&b, "deploy the web app").await;
    assert_eq!(prompt["params"]["origin"]["updateId"], update_id);
    assert_eq!(prompt["params"]["origin"]["threadId"], web);
    b.notify(
        "turn/ended",
        json!({"assistantText": "Deployed **web** ✅", "toolCalls": []}),
    );
    let texts = wait_topic_text_in(&fake, USER, web, "Deployed web").await;
    assert!(texts.iter().any(|t| t == "Deployed web ✅"), "{texts:?}");
    let leaked = fake
        .api()
        .messages(USER, Some(api))
        .iter()
        .any(|m| m.plain_text.contains("Deployed"));
    assert!(!leaked, "topic api got web's answer");

    // A later message to A proves the earlier one would have arrived.
    inject(&fake, api, "hello api");
    wait_prompt(&a, "hello api").await;
    assert!(
        prompts(&a)
            .iter()
            .all(|p| p["params"]["text"] != "deploy the web app")
    );
    // A stranger writing into the user's chat is impossible; a stranger's
    // own private chat reaches no session.
    inject_in(&fake, 2002, None, 2002, "let me in");
    inject(&fake, api, "still only mine");
    wait_prompt(&a, "still only mine").await;
    assert!(
        prompts(&a)
            .iter()
            .all(|p| p["params"]["text"] != "let me in")
    );
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
    // Outside any topic the user gets the list of sessions, in the
    // private chat itself.
    inject_in(&fake, USER, None, USER, "hello?");
    let outside = fake
        .api()
        .wait_for_messages(USER, None, 1, WAIT)
        .await
        .expect("a reply outside the topics");
    assert!(outside[0].plain_text.contains("· api"), "{:?}", outside[0]);
}

#[tokio::test]
async fn an_offline_owner_gets_its_private_messages_in_order_when_it_returns() {
    let home = common::home();
    let fake = common::fake().await;
    let _leader = session(home.path(), &fake, "/tmp/l", "lead").await;
    let mut b = session(home.path(), &fake, "/tmp/b", "away").await;
    let thread = topic(&fake, "away");
    b.kill9().await;
    for i in 1..=3 {
        inject(&fake, thread, &format!("while away {i}"));
    }
    let texts = wait_topic_text_in(&fake, USER, thread, "offline").await;
    let notices = texts.iter().filter(|t| t.contains("offline")).count();
    assert_eq!(notices, 1, "the topic is told once: {texts:?}");
    let back = session(home.path(), &fake, "/tmp/b", "away").await;
    wait_prompt(&back, "while away 3").await;
    let got: Vec<String> = prompts(&back)
        .iter()
        .map(|p| p["params"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(got, ["while away 1", "while away 2", "while away 3"]);
    assert_eq!(topic(&fake, "away"), thread, "same topic");
}

#[tokio::test]
async fn sigkill_of_the_leader_keeps_every_private_topic_and_delivery_goes_on() {
    let home = common::home();
    let fake = common::fake().await;
    let mut leader = session(home.path(), &fake, "/tmp/l", "lead").await;
    assert!(leader.latest_status().unwrap().contains("● leader"));
    // B's host holds one prompt unanswered across the failover.
    let mut b = Sidecar::spawn(Options::new(home.path()).private_chat(&fake));
    b.handshake("/tmp/b", "slow").await;
    b.wait_status(connected).await;
    let thread = topic(&fake, "slow");
    inject(&fake, thread, "only once");
    let request = wait_prompt(&b, "only once").await;
    leader.kill9().await;
    b.wait_status(|s| s.contains("● leader")).await;
    b.send_line(
        &json!({"jsonrpc": "2.0", "id": request["id"], "result": {"accepted": true}}).to_string(),
    );
    inject(&fake, thread, "after failover");
    let later = wait_prompt(&b, "after failover").await;
    b.send_line(
        &json!({"jsonrpc": "2.0", "id": later["id"], "result": {"accepted": true}}).to_string(),
    );
    let count = prompts(&b)
        .iter()
        .filter(|p| p["params"]["text"] == "only once")
        .count();
    assert_eq!(count, 1, "the message in flight arrived once");
    assert_eq!(topic(&fake, "slow"), thread, "the survivor keeps its topic");
    b.notify(
        "turn/ended",
        json!({"assistantText": "answered by the new leader", "toolCalls": []}),
    );
    wait_topic_text_in(&fake, USER, thread, "answered by the new leader").await;
    assert_eq!(created_topics(&fake), 2, "no topic was made twice");
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
    let url = text
        .split_whitespace()
        .find(|w| w.starts_with("https://t.me/relay_test_bot?start="))
        .unwrap_or_else(|| panic!("no link in {text}"));
    let code = url.split("start=").nth(1).unwrap();
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

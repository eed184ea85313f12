//! One topic per session and routing both ways, with real sidecars and the
//! fake Bot API: topics, inbound delivery, answers, failover, offline
//! owners, deleted topics, profiles and pairing. What holds in both places
//! topics can be (a forum group, the user's private chat) is written once
//! here for a [`Chat`]; `private_chat.rs` runs it in the private chat.

use crate::common;

use agent_relay::fake_bot_api::Inject;
use common::{
    CHAT, Chat, Options, Sidecar, USER, WAIT, accepting, connected, created_topics, inject,
    pairing_code, prompts, session, topic, wait_prompt, wait_topic_text,
};
use serde_json::json;

#[tokio::test]
async fn each_session_gets_its_own_topic_and_only_its_own_messages() {
    own_topics_and_messages(Chat::Group).await;
}

/// Three sessions get three topics in `chat` (none elsewhere), each only
/// its own messages, both ways; a stranger's own chat reaches none.
pub async fn own_topics_and_messages(chat: Chat) {
    let home = common::home();
    let fake = common::fake().await;
    let mut a = chat.session(home.path(), &fake, "/tmp/a", "api").await;
    let b = chat.session(home.path(), &fake, "/tmp/b", "web").await;
    let c = chat.session(home.path(), &fake, "/tmp/c", "docs").await;
    let topics: Vec<String> = fake
        .api()
        .topics(chat.id())
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(topics.len(), 3, "{topics:?}");
    assert!(
        fake.api().topics(chat.other()).is_empty(),
        "no other chat is involved"
    );
    let mut letters: Vec<char> = topics.iter().map(|n| n.chars().next().unwrap()).collect();
    letters.sort();
    letters.dedup();
    assert_eq!(letters.len(), 3, "distinct slots: {topics:?}");

    let web = chat.topic(&fake, "web");
    let update_id = chat.inject(&fake, Some(web), USER, "deploy the web app");
    let prompt = wait_prompt(&b, "deploy the web app").await;
    assert_eq!(prompt["params"]["origin"]["updateId"], update_id);
    assert_eq!(prompt["params"]["origin"]["threadId"], web);

    // The answer goes back into topic B only.
    b.notify(
        "turn/ended",
        json!({"assistantText": "Deployed **web** ✅", "toolCalls": []}),
    );
    let texts = chat.wait_text(&fake, web, "Deployed web").await;
    assert!(texts.iter().any(|t| t == "Deployed web ✅"), "{texts:?}");
    for other in ["api", "docs"] {
        let thread = chat.topic(&fake, other);
        let leaked = fake
            .api()
            .messages(chat.id(), Some(thread))
            .iter()
            .any(|m| m.plain_text.contains("Deployed") || m.plain_text.contains("deploy the web"));
        assert!(!leaked, "topic {other} got B's traffic");
    }
    // A stranger's own private chat with the bot reaches no session.
    common::inject_in(&fake, 2002, None, 2002, "let me in");
    // A later message to A proves the earlier ones would have arrived by now.
    let api = chat.topic(&fake, "api");
    chat.inject(&fake, Some(api), USER, "hello api");
    wait_prompt(&a, "hello api").await;
    assert!(
        prompts(&a)
            .iter()
            .all(|p| p["params"]["text"] != "deploy the web app"
                && p["params"]["text"] != "let me in")
    );
    assert!(prompts(&c).is_empty());
    let (ok, _) = a.command("telegram-status", "").await;
    assert!(ok);
}

#[tokio::test]
async fn strangers_reach_no_host_and_nothing_is_echoed() {
    let home = common::home();
    let fake = common::fake().await;
    let a = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    inject(&fake, Some(thread), 666, "rm -rf / please");
    inject(&fake, Some(thread), USER, "the real one");
    wait_prompt(&a, "the real one").await;
    assert_eq!(prompts(&a).len(), 1, "{:?}", prompts(&a));
    let echoed = fake
        .api()
        .calls()
        .iter()
        .any(|c| c.params.to_string().contains("rm -rf"));
    assert!(!echoed, "a stranger's text went back to Telegram");
}

#[tokio::test]
async fn a_long_markdown_answer_arrives_as_valid_html_chunks() {
    let home = common::home();
    let fake = common::fake().await;
    let a = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let mut markdown = String::from("# Report\n\n");
    for i in 0..120 {
        markdown.push_str(&format!(
            "Paragraph {i} with **bold**, `code <tag>` and a [link](https://example.com/{i}) & more.\n\n"
        ));
    }
    markdown.push_str("```rust\n");
    for i in 0..150 {
        markdown.push_str(&format!("let x{i} = \"<{i}>\";\n"));
    }
    markdown.push_str("```\nThe end.\n");
    a.notify(
        "turn/ended",
        json!({"assistantText": markdown, "toolCalls": []}),
    );
    let texts = wait_topic_text(&fake, thread, "The end.").await;
    let sent = fake.api().messages(CHAT, Some(thread));
    let chunks: Vec<_> = sent
        .iter()
        .filter(|m| m.parse_mode.as_deref() == Some("HTML"))
        .collect();
    assert!(
        chunks.len() >= 3,
        "expected several chunks, got {}",
        chunks.len()
    );
    for chunk in &chunks {
        assert!(chunk.text.encode_utf16().count() < 4096);
    }
    let all = texts.concat();
    assert!(all.contains("Paragraph 0 with bold") && all.contains("let x149 = \"<149>\";"));
}

#[tokio::test]
async fn a_delivery_in_flight_during_failover_arrives_exactly_once() {
    delivery_in_flight_through_failover(Chat::Group).await;
}

/// The leader is killed while a prompt waits for its host: the prompt
/// arrived once, the survivor keeps its topic in `chat`, and delivery and
/// answers go on through the new leader.
pub async fn delivery_in_flight_through_failover(chat: Chat) {
    let home = common::home();
    let fake = common::fake().await;
    let mut leader = chat.session(home.path(), &fake, "/tmp/l", "lead").await;
    assert!(leader.latest_status().unwrap().contains("● leader"));
    // B's host holds the prompt unanswered until after the leader is gone.
    let mut b = Sidecar::spawn(chat.options(Options::new(home.path()), &fake));
    b.handshake("/tmp/b", "slow").await;
    b.wait_status(connected).await;
    let thread = chat.topic(&fake, "slow");
    chat.inject(&fake, Some(thread), USER, "only once");
    let request = wait_prompt(&b, "only once").await;
    leader.kill9().await;
    b.wait_status(|s| s.contains("● leader")).await;
    b.send_line(
        &json!({"jsonrpc": "2.0", "id": request["id"], "result": {"accepted": true}}).to_string(),
    );
    // A later message through the new leader proves delivery goes on…
    chat.inject(&fake, Some(thread), USER, "after failover");
    let later = wait_prompt(&b, "after failover").await;
    b.send_line(
        &json!({"jsonrpc": "2.0", "id": later["id"], "result": {"accepted": true}}).to_string(),
    );
    // …and the in-flight one was not handed over twice.
    let count = prompts(&b)
        .iter()
        .filter(|p| p["params"]["text"] == "only once")
        .count();
    assert_eq!(count, 1, "the message in flight arrived once");
    assert_eq!(
        chat.topic(&fake, "slow"),
        thread,
        "the survivor keeps its topic"
    );
    b.notify(
        "turn/ended",
        json!({"assistantText": "answered by the new leader", "toolCalls": []}),
    );
    chat.wait_text(&fake, thread, "answered by the new leader")
        .await;
    assert_eq!(created_topics(&fake), 2, "no topic was made twice");
}

#[tokio::test]
async fn an_offline_owner_gets_its_messages_in_order_when_it_returns() {
    offline_owner_gets_its_messages(Chat::Group).await;
}

/// A killed session's messages wait, the topic told once; the same
/// profile comes back to its topic in `chat` and gets them in order.
pub async fn offline_owner_gets_its_messages(chat: Chat) {
    let home = common::home();
    let fake = common::fake().await;
    let _leader = chat.session(home.path(), &fake, "/tmp/l", "lead").await;
    let mut b = chat.session(home.path(), &fake, "/tmp/b", "away").await;
    let thread = chat.topic(&fake, "away");
    b.kill9().await;
    for i in 1..=3 {
        chat.inject(&fake, Some(thread), USER, &format!("while away {i}"));
    }
    let texts = chat.wait_text(&fake, thread, "offline").await;
    let notices = texts.iter().filter(|t| t.contains("offline")).count();
    assert_eq!(notices, 1, "the topic is told once: {texts:?}");
    // The same profile (cwd + name) comes back and gets its topic and mail.
    let back = chat.session(home.path(), &fake, "/tmp/b", "away").await;
    wait_prompt(&back, "while away 3").await;
    let got: Vec<String> = prompts(&back)
        .iter()
        .map(|p| p["params"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(got, ["while away 1", "while away 2", "while away 3"]);
    assert_eq!(chat.topic(&fake, "away"), thread, "same topic");
    let probed = fake
        .api()
        .calls()
        .iter()
        .any(|c| c.method == "sendChatAction" && c.params["message_thread_id"] == thread);
    assert!(probed, "the stored topic is probed before reuse");
}

#[tokio::test]
async fn a_deleted_topic_is_replaced_once_on_next_need() {
    let home = common::home();
    let fake = common::fake().await;
    let a = session(home.path(), &fake, "/tmp/a", "gone").await;
    let old = topic(&fake, "gone").thread_id;
    fake.api().delete_topic_externally(CHAT, old).unwrap();
    a.notify(
        "turn/ended",
        json!({"assistantText": "first answer", "toolCalls": []}),
    );
    a.notify(
        "turn/ended",
        json!({"assistantText": "second answer", "toolCalls": []}),
    );
    let fresh = fake
        .api()
        .wait_until(
            |api| {
                api.topics(CHAT)
                    .into_iter()
                    .find(|t| !t.deleted && t.name.ends_with("· gone"))
            },
            WAIT,
        )
        .await
        .expect("a new topic");
    assert_ne!(fresh.thread_id, old);
    wait_topic_text(&fake, fresh.thread_id, "second answer").await;
    wait_topic_text(&fake, fresh.thread_id, "first answer").await;
    assert_eq!(
        created_topics(&fake),
        2,
        "one original and one replacement, never two"
    );
}

#[tokio::test]
async fn two_live_sessions_in_one_folder_get_two_topics() {
    let home = common::home();
    let fake = common::fake().await;
    let _a = session(home.path(), &fake, "/tmp/same", "twin").await;
    let _b = session(home.path(), &fake, "/tmp/same", "twin").await;
    let live: Vec<_> = fake
        .api()
        .topics(CHAT)
        .into_iter()
        .filter(|t| !t.deleted)
        .collect();
    assert_eq!(live.len(), 2, "{live:?}");
    assert_ne!(live[0].name, live[1].name);
}

#[tokio::test]
async fn outside_any_topic_the_user_gets_the_list_of_sessions() {
    list_outside_the_topics(Chat::Group).await;
}

/// A message in `chat` outside the topics (a group's General, the private
/// chat itself) is answered with the list of sessions, there.
pub async fn list_outside_the_topics(chat: Chat) {
    let home = common::home();
    let fake = common::fake().await;
    let _a = chat.session(home.path(), &fake, "/tmp/a", "api").await;
    chat.inject(&fake, None, USER, "hello?");
    let outside = fake
        .api()
        .wait_for_messages(chat.id(), None, 1, WAIT)
        .await
        .expect("a reply outside the topics");
    assert!(outside[0].plain_text.contains("· api"), "{:?}", outside[0]);
}

#[tokio::test]
async fn status_and_stop_work_from_the_topic() {
    let home = common::home();
    let fake = common::fake().await;
    let a = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    inject(&fake, Some(thread), USER, "/status");
    wait_topic_text(&fake, thread, "binding: bound").await;
    inject(&fake, Some(thread), USER, "/stop@relay_test_bot");
    a.wait_for("agent/abort", |m| m["method"] == "agent/abort")
        .await;
    wait_topic_text(&fake, thread, "Stopped").await;
    assert!(prompts(&a).is_empty(), "commands are not prompts");
}

#[tokio::test]
async fn pairing_binds_the_right_user_only() {
    let home = common::home();
    let fake = common::fake().await;
    let options = accepting(
        Options::new(home.path())
            .configured(&fake)
            .env("AGENT_RELAY_ALLOWED_USERS", ""),
    );
    let mut a = Sidecar::spawn(options);
    a.handshake("/tmp/a", "pair").await;
    a.wait_status(|s| s.contains("unpaired")).await;
    let (ok, text) = a.command("telegram-connect", "").await;
    assert!(ok, "{text}");
    let code = pairing_code(&text);
    fake.api().add_private_chat(2002, "Bob");
    let thread = topic(&fake, "pair").thread_id;

    // A wrong code binds nobody.
    fake.api().inject_message(Inject {
        chat_id: 2002,
        thread_id: None,
        user_id: 2002,
        text: "/start wrongcode".into(),
    });
    fake.api()
        .wait_until(
            |api| {
                api.messages(2002, None)
                    .iter()
                    .any(|m| m.plain_text.contains("wrong"))
                    .then_some(())
            },
            WAIT,
        )
        .await
        .expect("the wrong code is refused");
    inject(&fake, Some(thread), 2002, "not yet allowed");

    // The right code binds that user, and the status line says so.
    fake.api().inject_message(Inject {
        chat_id: 2002,
        thread_id: None,
        user_id: 2002,
        text: format!("/start {code}"),
    });
    a.wait_status(|s| s.contains("● leader") && !s.contains("unpaired"))
        .await;
    inject(&fake, Some(thread), 2002, "now allowed");
    wait_prompt(&a, "now allowed").await;
    assert!(
        prompts(&a)
            .iter()
            .all(|p| p["params"]["text"] != "not yet allowed")
    );

    // Bob opening the link again is told he is paired, not that the code
    // is wrong.
    fake.api().inject_message(Inject {
        chat_id: 2002,
        thread_id: None,
        user_id: 2002,
        text: format!("/start {code}"),
    });
    fake.api()
        .wait_until(
            |api| {
                api.messages(2002, None)
                    .iter()
                    .any(|m| m.plain_text.contains("already paired"))
                    .then_some(())
            },
            WAIT,
        )
        .await
        .expect("a paired user is told so");

    // The code was single-use: a replay binds nobody else.
    fake.api().add_private_chat(3003, "Eve");
    fake.api().inject_message(Inject {
        chat_id: 3003,
        thread_id: None,
        user_id: 3003,
        text: format!("/start {code}"),
    });
    fake.api()
        .wait_until(
            |api| {
                api.messages(3003, None)
                    .iter()
                    .any(|m| m.plain_text.contains("wrong"))
                    .then_some(())
            },
            WAIT,
        )
        .await
        .expect("a used code is refused");
}

#[tokio::test]
async fn a_host_switching_sessions_moves_to_their_topics_and_back() {
    let home = common::home();
    let fake = common::fake().await;
    let mut s = Sidecar::spawn(accepting(Options::new(home.path()).configured(&fake)));
    s.call(
        "initialize",
        json!({
            "protocolVersion": 1,
            "host": {"name": "test-host", "version": "1"},
            "cwd": "/tmp/switch",
            "session": {"id": "1", "file": "/sessions/one.jsonl", "name": "one"},
            "hasUI": true
        }),
    )
    .await;
    s.notify("initialized", json!({}));
    s.wait_status(|t| t.contains("·one ● leader")).await;
    let one = topic(&fake, "one").thread_id;

    // `/new`: another session, another topic; the same process stays leader.
    s.notify(
        "session/started",
        json!({"reason": "new", "session": {"id": "2", "file": "/sessions/two.jsonl", "name": "two"}}),
    );
    s.wait_status(|t| t.contains("·two ● leader")).await;
    let two = topic(&fake, "two").thread_id;
    assert_ne!(one, two);
    inject(&fake, Some(two), USER, "to two");
    wait_prompt(&s, "to two").await;

    // `/resume` of the first: its topic comes back, not a new one.
    s.notify(
        "session/started",
        json!({"reason": "resume", "session": {"id": "1", "file": "/sessions/one.jsonl", "name": "one"}}),
    );
    s.wait_status(|t| t.contains("·one ● leader")).await;
    assert_eq!(topic(&fake, "one").thread_id, one);
    inject(&fake, Some(one), USER, "to one");
    wait_prompt(&s, "to one").await;
    assert_eq!(created_topics(&fake), 2);
}

/// Prompts are pipelined to the host; the ordering rule of
/// `session/inbound.rs`: the host receives them in journal order; one it
/// refuses is settled and its topic told, the rest unaffected; one it fails
/// to answer stays in the journal and comes again after a reconnect, once,
/// while none of the others comes twice.
#[tokio::test]
async fn pipelined_prompts_keep_their_order_through_a_refusal_and_a_failure() {
    let home = common::home();
    let fake = common::fake().await;
    let mut a = Sidecar::spawn(Options::new(home.path()).configured(&fake).answer(
        std::sync::Arc::new(|method, params| {
            match (method, params["text"].as_str()) {
                ("agent/sendUserMessage", Some("p2")) => Some(json!({"accepted": false})),
                // Left to the test, which answers it with an error.
                ("agent/sendUserMessage", Some("p4")) => None,
                ("agent/sendUserMessage", _) => Some(json!({"accepted": true})),
                ("ui/confirm", _) => Some(json!({"confirmed": true})),
                _ => None,
            }
        }),
    ));
    a.handshake("/tmp/a", "api").await;
    a.wait_status(connected).await;
    let thread = topic(&fake, "api").thread_id;
    let texts: Vec<String> = (1..=6).map(|i| format!("p{i}")).collect();
    for text in &texts {
        inject(&fake, Some(thread), USER, text);
    }
    wait_prompt(&a, "p6").await;
    let p4 = wait_prompt(&a, "p4").await;
    a.link()
        .respond_error(p4["id"].clone(), -32000, "the agent is busy")
        .expect("answer p4");
    let order: Vec<String> = prompts(&a)
        .iter()
        .map(|p| p["params"]["text"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(order, texts, "the host got them in journal order");
    wait_topic_text(&fake, thread, "did not accept").await;

    // A reconnect (here: a restart of the relay) brings p4 again, once.
    let (ok, report) = a.command("relay", "restart").await;
    assert!(ok, "{report}");
    a.wait_for("p4 again", |m| {
        m["method"] == "agent/sendUserMessage" && m["params"]["text"] == "p4" && m["id"] != p4["id"]
    })
    .await;
    inject(&fake, Some(thread), USER, "after the restart");
    wait_prompt(&a, "after the restart").await;
    let count = |text: &str| {
        prompts(&a)
            .iter()
            .filter(|p| p["params"]["text"] == text)
            .count()
    };
    assert_eq!(count("p4"), 2, "the failed one came again");
    for text in ["p1", "p2", "p3", "p5", "p6"] {
        assert_eq!(count(text), 1, "{text} came once");
    }
}

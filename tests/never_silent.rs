//! Never silent (issue 17): whatever happens between the agent and the
//! phone, the user is told, in the right place. Pacing shown and spent
//! well, answers of unknown fate offered again, a deaf poll noticed and
//! restarted, undeliverable messages answered, missing rights and a
//! rejected token said as such, and a topic closed when its session is
//! switched away and opened again when it is resumed. Real sidecars against
//! the fake Bot API; every wait has a deadline.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use agent_relay::fake_bot_api::{BotRights, Fault, MediaInject, MediaKind, UserMessage};
use common::{
    CHAT, FakeServer, Options, Sidecar, USER, WAIT, connected, first_button, inject, question,
    session, tap, topic, wait_prompt, wait_topic_text,
};
use serde_json::{Value, json};

fn answer(s: &Sidecar, text: &str) {
    s.notify(
        "turn/ended",
        json!({"assistantText": text, "toolCalls": []}),
    );
}

/// The bot's messages in `thread`, as displayed.
fn texts(fake: &FakeServer, thread: i64) -> Vec<String> {
    fake.api()
        .messages(CHAT, Some(thread))
        .into_iter()
        .map(|m| m.plain_text)
        .collect()
}

/// The bot's messages outside any topic (`None`) or in `thread`.
fn texts_in(fake: &FakeServer, thread: Option<i64>) -> Vec<String> {
    fake.api()
        .messages(CHAT, thread)
        .into_iter()
        .map(|m| m.plain_text)
        .collect()
}

/// Waits until `count` messages of `thread` satisfy `pred`.
async fn wait_count(fake: &FakeServer, thread: i64, count: usize, pred: impl Fn(&str) -> bool) {
    fake.api()
        .wait_until(
            |api| {
                let n = api
                    .messages(CHAT, Some(thread))
                    .iter()
                    .filter(|m| pred(&m.plain_text))
                    .count();
                (n >= count).then_some(())
            },
            WAIT,
        )
        .await
        .unwrap_or_else(|_| panic!("never {count} such messages: {:?}", texts(fake, thread)));
}

/// A `ui/notify` whose message contains `needle`.
async fn notified(s: &Sidecar, needle: &str) -> Value {
    s.wait_for(&format!("a notice with {needle:?}"), |m| {
        m["method"] == "ui/notify"
            && m["params"]["message"]
                .as_str()
                .is_some_and(|t| t.contains(needle))
    })
    .await
}

// ------------------------------------------------------------------ pacing

/// Item 1: a wait for the chat's budget shows in the status line and in
/// both status commands, answers that queue meanwhile go out as one
/// message, and a progress update never waits for the budget.
#[tokio::test]
async fn a_paced_chat_shows_the_wait_and_merges_what_queues_meanwhile() {
    let home = common::home();
    let fake = common::fake().await;
    let mut s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;
    wait_topic_text(&fake, thread, "connected").await;

    // Telegram says: slow down, for 4 s, in this chat.
    fake.api()
        .inject_fault("sendMessage", Fault::TooManyRequests { retry_after: 4 }, 1);
    answer(&s, "first answer");
    let status = s.wait_status(|t| t.contains("⏳ paced")).await;
    assert!(
        status.starts_with("TG A·api ● leader ⏳ paced "),
        "{status}"
    );

    // While it waits: two more answers and a tool call.
    s.notify("agent/started", json!({}));
    s.notify(
        "tool/started",
        json!({"toolName": "bash", "toolCallId": "c1", "args": {"command": "ls"}}),
    );
    answer(&s, "second answer");
    answer(&s, "third answer");
    let (_, report) = s.command("telegram-status", "").await;
    assert!(
        report.contains("outbox: paced — Telegram allows about 20 messages a minute in a group, shared by every topic; the next message goes in"),
        "{report}"
    );
    let (_, relay) = s.command("relay", "status").await;
    assert!(
        relay.contains(&format!("pacing: chat {CHAT}: ")) && relay.contains("1 waiting"),
        "{relay}"
    );

    wait_topic_text(&fake, thread, "third answer").await;
    s.wait_status(connected).await;
    let all = texts(&fake, thread);
    let answers: Vec<&String> = all.iter().filter(|t| t.contains("answer")).collect();
    assert_eq!(
        answers,
        ["first answer", "second answer\n\nthird answer"],
        "what queued while the chat was paced went out as one message: {all:?}"
    );
    // The progress message is a background request: during the penalty it
    // was not sent (nor did it wait); the answers went first.
    let calls = fake.api().calls();
    let first_answer = calls
        .iter()
        .position(|c| {
            c.method == "sendMessage" && c.params["text"] == "first answer" && c.status == Some(200)
        })
        .expect("the first answer was sent");
    assert!(
        !calls[..first_answer].iter().any(|c| c.params["text"]
            .as_str()
            .is_some_and(|t| t.contains("Working"))),
        "no progress message went before the waiting answer"
    );
    let (_, relay) = s.command("relay", "status").await;
    assert!(relay.contains("1 paced, longest wait"), "{relay}");
}

// ------------------------------------------------------- unknown fates

/// Item 2: a send answered 429, 429 and then 500 is not replayed (Telegram
/// may have posted it), and the topic is told, with a button that sends it
/// again; `/resend` does the same.
#[tokio::test]
async fn an_answer_of_unknown_fate_is_offered_again_by_button_or_resend() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;
    wait_topic_text(&fake, thread, "connected").await;

    for fault in [
        Fault::TooManyRequests { retry_after: 1 },
        Fault::TooManyRequests { retry_after: 1 },
        Fault::ServerError { code: 500 },
    ] {
        fake.api().inject_fault("sendMessage", fault, 1);
    }
    answer(&s, "the plan is ready");
    let notice = question(&fake, thread, "An answer may be missing").await;
    assert!(
        notice.plain_text.contains("server error 500")
            && notice.plain_text.contains("“the plan is ready”")
            && notice.plain_text.contains("/resend"),
        "{}",
        notice.plain_text
    );
    let tried = |fake: &FakeServer| {
        fake.api()
            .calls()
            .iter()
            .filter(|c| c.method == "sendMessage" && c.params["text"] == "the plan is ready")
            .count()
    };
    assert_eq!(
        tried(&fake),
        3,
        "429, 429, then 500: never a fourth try by itself"
    );

    tap(&fake, &notice, thread, USER, &first_button(&notice));
    wait_count(&fake, thread, 1, |t| t == "the plan is ready").await;
    let settled = fake
        .api()
        .wait_until(
            |api| {
                api.message(CHAT, notice.message_id)
                    .filter(common::is_settled)
            },
            WAIT,
        )
        .await
        .expect("the notice loses its button");
    assert!(
        settled.plain_text.contains("↻ Send it again —"),
        "{}",
        settled.plain_text
    );

    // The same through /resend.
    fake.api()
        .inject_fault("sendMessage", Fault::ServerError { code: 502 }, 1);
    answer(&s, "the tests pass");
    let notice = question(&fake, thread, "“the tests pass”").await;
    inject(&fake, Some(thread), USER, "/resend");
    wait_count(&fake, thread, 1, |t| t == "the tests pass").await;
    fake.api()
        .wait_until(
            |api| {
                api.message(CHAT, notice.message_id)
                    .filter(|m| common::is_settled(m) && m.plain_text.contains("↻ Sent again"))
            },
            WAIT,
        )
        .await
        .expect("the notice says it was sent again");
}

/// Item 2, continued: when not even the notice reaches the topic, the host
/// is told and the status line counts the answer; the notice follows once
/// the topic can be reached again.
#[tokio::test]
async fn an_answer_the_topic_cannot_take_is_told_to_the_host_and_the_status_line() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;
    wait_topic_text(&fake, thread, "connected").await;

    fake.api().inject_fault_until_cleared(
        "sendMessage",
        Fault::BadRequest {
            description: "Bad Request: CHAT_WRITE_FORBIDDEN".into(),
        },
    );
    answer(&s, "nobody hears this yet");
    let notice = notified(&s, "nor a notice about it").await;
    assert_eq!(notice["params"]["level"], "warning");
    s.wait_status(|t| t == "TG A·api ● leader ⚠ 1 answer not delivered")
        .await;

    fake.api().clear_faults();
    answer(&s, "now it works");
    let offer = question(&fake, thread, "“nobody hears this yet”").await;
    assert!(
        offer.plain_text.contains("An answer could not be sent"),
        "{}",
        offer.plain_text
    );
    s.wait_status(connected).await;
}

// ------------------------------------------------------------- webhook

/// Polling and a webhook exclude each other. A leader does not delete one
/// up front (its first request is its poll); a webhook another program
/// sets is deleted when Telegram refuses the poll for it, with the updates
/// that wait kept, and nothing typed meanwhile is lost.
#[tokio::test]
async fn a_webhook_another_program_sets_is_deleted_and_nothing_waiting_is_lost() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let deletions = |fake: &FakeServer| {
        fake.api()
            .calls()
            .into_iter()
            .filter(|c| c.method == "deleteWebhook")
            .collect::<Vec<_>>()
    };
    assert!(deletions(&fake).is_empty(), "no webhook, no deleteWebhook");

    fake.api()
        .set_webhook_externally("https://example.invalid/other-program");
    // The poll open now still hears this one; the next is refused.
    inject(&fake, Some(thread), USER, "before the webhook was noticed");
    wait_prompt(&s, "before the webhook was noticed").await;
    inject(&fake, Some(thread), USER, "while the webhook was set");
    wait_prompt(&s, "while the webhook was set").await;

    let deleted = deletions(&fake);
    assert_eq!(deleted.len(), 1, "{deleted:?}");
    assert_eq!(deleted[0].params["drop_pending_updates"], false);
    let refused = fake
        .api()
        .calls()
        .into_iter()
        .filter(|c| c.method == "getUpdates" && c.seq < deleted[0].seq)
        .any(|c| c.status == Some(409));
    assert!(refused, "deleted because Telegram refused a poll for it");
    s.wait_status(connected).await;
}

// ------------------------------------------------------------ deafness

/// Item 3: a poll that is alive but hears nothing while updates wait is
/// noticed, shown and restarted; `/relay status` shows the last poll's age
/// and what waits; once Telegram answers again, the message arrives.
#[tokio::test]
async fn a_deaf_poll_is_noticed_shown_and_restarted() {
    let home = common::home();
    let fake = common::fake().await;
    let mut s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let webhook_deletions = |fake: &FakeServer| {
        fake.api()
            .calls()
            .iter()
            .filter(|c| c.method == "deleteWebhook")
            .count()
    };
    let before = webhook_deletions(&fake);

    fake.api()
        .inject_fault_until_cleared("getUpdates", Fault::Deaf { immediately: true });
    // The poll open now still hears this one; the polls after it are deaf.
    inject(&fake, Some(thread), USER, "still heard");
    wait_prompt(&s, "still heard").await;
    inject(&fake, Some(thread), USER, "are you there?");
    let status = s.wait_status(|t| t.contains("not receiving")).await;
    assert!(status.starts_with("TG A·api ⚠ not receiving ("), "{status}");
    let (_, relay) = s.command("relay", "status").await;
    assert!(
        relay.contains("poll: ⚠ not receiving")
            && relay.contains("· last answer ")
            && relay.contains(" waiting at Telegram")
            && relay.contains("· restarted "),
        "{relay}"
    );
    let (_, report) = s.command("telegram-status", "").await;
    assert!(report.contains("transport: not receiving: "), "{report}");
    // Restarted: fresh connections and the webhook deleted again.
    assert!(webhook_deletions(&fake) > before, "the poll was restarted");

    fake.api().clear_faults();
    wait_prompt(&s, "are you there?").await;
    s.wait_status(connected).await;
}

// ------------------------------------------------------- undeliverable

/// Item 4: what can never reach an agent is answered where it was written:
/// messages a session had not taken when it was disconnected, a sticker
/// (files reach the agent: tests/files.rs), a message in a topic that
/// belongs to no session.
#[tokio::test]
async fn what_can_never_be_delivered_is_answered() {
    let home = common::home();
    let fake = common::fake().await;
    // A host that takes no prompt (it never answers), and says yes to dialogs.
    let auto = Arc::new(|method: &str, _: &Value| match method {
        "ui/confirm" => Some(json!({"confirmed": true})),
        _ => None,
    });
    let mut s = Sidecar::spawn(Options::new(home.path()).configured(&fake).answer(auto));
    s.handshake("/tmp/api", "api").await;
    s.wait_status(connected).await;
    let thread = topic(&fake, "api").thread_id;

    fake.api()
        .inject_user_message(UserMessage {
            chat_id: CHAT,
            thread_id: Some(thread),
            user_id: USER,
            text: String::new(),
            media: Some(MediaInject {
                kind: MediaKind::Sticker,
                bytes: bytes::Bytes::from_static(b"RIFF\0\0\0\0WEBP"),
                ..MediaInject::default()
            }),
            ..UserMessage::default()
        })
        .expect("a sticker");
    wait_topic_text(&fake, thread, "Stickers are not passed to the agent.").await;

    // A topic of its own the user opened: nobody's.
    let (other, _) = fake
        .api()
        .inject_topic(CHAT, USER, "notes")
        .expect("a user's topic");
    inject(&fake, Some(other), USER, "to nobody");
    wait_topic_text(
        &fake,
        other,
        "This topic belongs to no session, so your message reached no agent.",
    )
    .await;

    inject(&fake, Some(thread), USER, "hello? anyone?");
    s.wait_for("the prompt handed to the host", |m| {
        m["method"] == "agent/sendUserMessage" && m["params"]["text"] == "hello? anyone?"
    })
    .await;
    // Telegram slow to take the notice: the leader, whose own session this
    // is, steps down right after the disconnect, and must not take the
    // notice with it.
    fake.api()
        .inject_fault("sendMessage", Fault::Delay(Duration::from_millis(700)), 2);
    let (ok, text) = s.command("telegram-disconnect", "").await;
    assert!(ok, "{text}");
    let general = fake
        .api()
        .wait_until(
            |api| {
                api.messages(CHAT, None)
                    .into_iter()
                    .find(|m| m.plain_text.contains("“hello? anyone?”"))
            },
            WAIT,
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the chat is told outside the deleted topic; it has {:?}; the topic {:?}",
                texts_in(&fake, None),
                texts(&fake, thread)
            )
        });
    assert_eq!(
        general.plain_text,
        "⚠️ Your message “hello? anyone?” reached no agent: A · api was disconnected."
    );
}

// ----------------------------------------------------------- the user fixes

/// Item 5: a bot that may not manage topics says so in the status line
/// (not "reconnecting") and tells the host the fix once; it does not try
/// again every backoff step, and `/telegram-connect` tries again once the
/// right is there.
#[tokio::test]
async fn missing_topic_rights_are_said_as_such_and_not_retried_in_a_loop() {
    let home = common::home();
    let fake = common::fake().await;
    fake.api()
        .set_bot_rights(
            CHAT,
            BotRights {
                can_manage_topics: false,
                can_delete_messages: true,
            },
        )
        .unwrap();
    let mut s = Sidecar::spawn(common::accepting(
        Options::new(home.path()).configured(&fake),
    ));
    s.handshake("/tmp/api", "api").await;
    s.wait_status(|t| t == "TG ✕ no right to manage topics")
        .await;
    let notice = notified(&s, "Manage topics").await;
    assert_eq!(notice["params"]["level"], "error");
    let (_, report) = s.command("telegram-status", "").await;
    assert!(
        report.contains(
            "binding: no topic: no right to manage topics — the bot may not manage topics in chat"
        ) && report.contains("then run /telegram-connect"),
        "{report}"
    );
    let creations = |fake: &FakeServer| {
        fake.api()
            .calls()
            .iter()
            .filter(|c| c.method == "createForumTopic")
            .count()
    };
    // Long enough for three of the old backoff's retries (1 s, 2 s).
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(creations(&fake), 1, "no retry in a loop");
    assert_eq!(s.latest_status().unwrap(), "TG ✕ no right to manage topics");

    fake.api().set_bot_rights(CHAT, BotRights::FULL).unwrap();
    let (ok, text) = s.command("telegram-connect", "").await;
    assert!(ok, "{text}");
    s.wait_status(connected).await;
    topic(&fake, "api");
}

/// Item 5, continued: a topic that vanished while the bot lost its rights
/// is not probed again at every attempt.
#[tokio::test]
async fn a_dead_topic_is_not_probed_again_and_again() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;
    wait_topic_text(&fake, thread, "connected").await;
    fake.api().delete_topic_externally(CHAT, thread).unwrap();
    fake.api()
        .set_bot_rights(
            CHAT,
            BotRights {
                can_manage_topics: false,
                can_delete_messages: true,
            },
        )
        .unwrap();
    answer(&s, "into the void");
    s.wait_status(|t| t == "TG ✕ no right to manage topics")
        .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let probes = fake
        .api()
        .calls()
        .iter()
        .filter(|c| c.method == "sendChatAction" && c.params["message_thread_id"] == thread)
        .count();
    assert_eq!(probes, 0, "the topic Telegram said is gone is not probed");
}

/// Item 7: a token Telegram rejects is said in the status line and in a
/// notice that points to `agent-relay doctor`.
#[tokio::test]
async fn a_rejected_token_is_said_in_the_status_line_and_a_notice() {
    let home = common::home();
    let fake = common::fake().await;
    let mut s = Sidecar::spawn(common::accepting(
        Options::new(home.path()).configured(&fake).env(
            "TELEGRAM_BOT_TOKEN",
            "123456789:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
        ),
    ));
    s.handshake("/tmp/api", "api").await;
    s.wait_status(|t| t == "TG ✕ token rejected").await;
    let notice = notified(&s, "rejected the bot token").await;
    assert!(
        notice["params"]["message"]
            .as_str()
            .unwrap()
            .contains("agent-relay doctor"),
        "{notice}"
    );
    let (_, report) = s.command("telegram-status", "").await;
    assert!(report.contains("401"), "{report}");
}

// ------------------------------------------------------------- /new, /resume

/// Item 11: when the host switches to another session, the old topic says
/// where it went and is closed (not left saying "offline" while the same
/// process runs); what is written there waits; resuming the session opens
/// its topic again, with no new topic, and hands over what waited.
#[tokio::test]
async fn a_switched_away_session_closes_its_topic_and_resuming_reopens_it() {
    let home = common::home();
    let fake = common::fake().await;
    let mut s = Sidecar::spawn(common::accepting(
        Options::new(home.path()).configured(&fake),
    ));
    s.call(
        "initialize",
        json!({"protocolVersion": 1, "host": {"name": "pi", "version": "0"},
               "cwd": "/tmp/api", "hasUI": false,
               "session": {"id": "one", "file": "/tmp/api/one.jsonl", "name": "api"}}),
    )
    .await;
    s.notify("initialized", json!({}));
    s.wait_status(connected).await;
    let first = topic(&fake, "api");
    wait_topic_text(&fake, first.thread_id, "connected").await;

    s.notify(
        "session/started",
        json!({"reason": "new",
               "session": {"id": "two", "file": "/tmp/api/two.jsonl", "name": "api-2"}}),
    );
    s.wait_status(|t| t.starts_with("TG B·api-2 ")).await;
    wait_topic_text(
        &fake,
        first.thread_id,
        "⏸ Switched to another session: B · api-2.",
    )
    .await;
    fake.api()
        .wait_until(
            |api| {
                api.topics(CHAT)
                    .into_iter()
                    .find(|t| t.thread_id == first.thread_id && t.closed)
            },
            WAIT,
        )
        .await
        .expect("the old topic is closed");

    inject(&fake, Some(first.thread_id), USER, "for the first session");
    wait_topic_text(
        &fake,
        first.thread_id,
        "reaches it when the session is resumed",
    )
    .await;

    let topics_before = fake.api().topics(CHAT).len();
    s.notify(
        "session/started",
        json!({"reason": "resume",
               "session": {"id": "one", "file": "/tmp/api/one.jsonl", "name": "api"}}),
    );
    wait_prompt(&s, "for the first session").await;
    s.wait_status(|t| t.starts_with("TG A·api ")).await;
    let reopened = topic(&fake, "api");
    assert_eq!(reopened.thread_id, first.thread_id);
    assert!(!reopened.closed, "resuming reopens the topic");
    fake.api()
        .wait_until(
            |api| {
                api.topics(CHAT)
                    .into_iter()
                    .find(|t| t.name == "B · api-2" && t.closed)
            },
            WAIT,
        )
        .await
        .expect("and closes the one it left");
    assert_eq!(fake.api().topics(CHAT).len(), topics_before, "no new topic");
}

// ------------------------------------------------------------ failover

/// The status lines a sidecar sent after the first `skip` messages.
fn statuses_after(s: &Sidecar, skip: usize) -> Vec<String> {
    s.messages()[skip..]
        .iter()
        .filter(|m| m["method"] == "ui/setStatus")
        .filter_map(|m| m["params"]["text"].as_str().map(String::from))
        .collect()
}

/// Item 6: after the leader is SIGKILLed, every survivor's status line
/// follows the bus as it happens: it says `◌ reconnecting` only while it is
/// away, and once a message written after the kill has reached it (the new
/// leader polls and routes) and one round trip to the leader later, its
/// line names its new role. No timer brings it back, so there is no window of
/// "reconnecting" while messages flow. Nothing here measures time;
/// `scripts/bench` does ("status line after failover").
#[tokio::test]
async fn after_a_failover_the_status_line_follows_the_bus_not_a_timer() {
    let home = common::home();
    let fake = common::fake().await;
    let mut all = Vec::new();
    for name in ["one", "two", "three"] {
        all.push(session(home.path(), &fake, &format!("/tmp/{name}"), name).await);
    }
    for s in &all {
        s.wait_status(connected).await;
    }
    let leader = all
        .iter()
        .position(|s| s.latest_status().unwrap().contains("● leader"))
        .expect("one of them leads");
    let seen: Vec<usize> = all.iter().map(|s| s.messages().len()).collect();
    all[leader].kill9().await;
    let survivors: Vec<usize> = (0..all.len()).filter(|i| *i != leader).collect();
    for &i in &survivors {
        let name = ["one", "two", "three"][i];
        let thread = topic(&fake, name).thread_id;
        inject(
            &fake,
            Some(thread),
            USER,
            &format!("after the kill, {name}"),
        );
        wait_prompt(&all[i], &format!("after the kill, {name}")).await;
        // A round trip to the new leader (`/relay status`): by its answer
        // the status line has long had its turn, without any timer.
        let (ok, relay) = all[i].command("relay", "status").await;
        assert!(ok, "{relay}");
        let lines = statuses_after(&all[i], seen[i]);
        let shown = lines.last().cloned().unwrap_or_default();
        assert!(
            lines.iter().any(|l| l.contains("◌ reconnecting")),
            "survivor {name} never said it was away: {lines:?}"
        );
        assert!(
            shown.contains("● leader") || shown.contains("● follower"),
            "messages flow both ways for survivor {name}, yet its line says {shown:?}; lines since the kill: {lines:?}"
        );
    }
    // Every survivor ends connected, exactly one leads, and none of them
    // went back to "reconnecting" after it was back.
    for &i in &survivors {
        all[i].wait_status(connected).await;
        let lines = statuses_after(&all[i], seen[i]);
        let back = lines
            .iter()
            .position(|l| l.contains("● leader") || l.contains("● follower"))
            .expect("back");
        assert!(
            lines[back..].iter().all(|l| !l.contains("reconnecting")),
            "{lines:?}"
        );
    }
    let leaders = survivors
        .iter()
        .filter(|&&i| all[i].latest_status().unwrap().ends_with("● leader"))
        .count();
    assert_eq!(leaders, 1);
}

// ------------------------------------------------------------------ /stop

/// Item 10: `/stop` from the topic stops the run, and the answer the run
/// still sends is marked as cut off, even from a host that does not say the
/// turn was aborted; the next run's answer is whole again.
#[tokio::test]
async fn an_answer_cut_off_by_stop_says_so() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/stop", "stop").await;
    let thread = topic(&fake, "stop").thread_id;
    inject(&fake, Some(thread), USER, "explain the build");
    wait_prompt(&s, "explain the build").await;
    s.notify("agent/started", json!({}));
    // Busy as far as the relay knows: it shows the typing indicator.
    fake.api()
        .wait_until(
            |api| {
                api.calls()
                    .iter()
                    .any(|c| c.method == "sendChatAction")
                    .then_some(())
            },
            WAIT,
        )
        .await
        .expect("typing while the agent works");
    inject(&fake, Some(thread), USER, "/stop");
    s.wait_for("agent/abort", |m| m["method"] == "agent/abort")
        .await;
    wait_topic_text(&fake, thread, "⏹ Stopped.").await;
    // The host ends the run without saying it was aborted.
    answer(&s, "The build runs in three st");
    s.notify(
        "agent/ended",
        json!({"lastAssistantText": "The build runs in three st"}),
    );
    let texts = wait_topic_text(&fake, thread, "The build runs in three st").await;
    let cut = texts
        .iter()
        .find(|t| t.contains("The build runs in three st"))
        .unwrap();
    assert!(
        cut.contains("⏹ Stopped: this answer is cut off."),
        "{cut:?}"
    );
    assert_eq!(
        texts.iter().filter(|t| t.contains("three st")).count(),
        1,
        "the answer once: {texts:?}"
    );

    // The next run is not cut off.
    inject(&fake, Some(thread), USER, "and now?");
    wait_prompt(&s, "and now?").await;
    s.notify("agent/started", json!({}));
    answer(&s, "All three stages passed.");
    s.notify(
        "agent/ended",
        json!({"lastAssistantText": "All three stages passed."}),
    );
    let texts = wait_topic_text(&fake, thread, "All three stages passed.").await;
    let whole = texts.iter().find(|t| t.contains("stages passed")).unwrap();
    assert!(!whole.contains("cut off"), "{whole:?}");
}

// ------------------------------------------------------------- a burst

/// Item 1, the figures: five sessions in one group answer a burst (six
/// answers each, a tool call before every one) against the fake with
/// Telegram's limits on (20 messages a minute in a group, shared by every
/// topic). Prints what was asked for, sent and merged, and the longest
/// wait; asserts that nothing is lost or doubled, that Telegram never had to
/// say 429, that no 60 s window carried more than 20 messages, and that
/// when the window opened again the answers waiting for it went before any
/// progress. Real time: it takes about a minute, as the budget
/// does.
#[tokio::test]
async fn a_burst_from_five_sessions_loses_nothing_and_spends_the_budget_on_answers() {
    const SESSIONS: usize = 5;
    const ANSWERS: usize = 6;
    let home = common::home();
    let fake = common::fake_with(agent_relay::fake_bot_api::FakeConfig {
        rate_limits: true,
        ..Default::default()
    })
    .await;
    let names: Vec<String> = (0..SESSIONS).map(|i| format!("burst{i}")).collect();
    let mut all = Vec::new();
    for name in &names {
        all.push(session(home.path(), &fake, &format!("/tmp/{name}"), name).await);
    }
    let threads: Vec<i64> = names.iter().map(|n| topic(&fake, n).thread_id).collect();
    for &thread in &threads {
        wait_topic_text(&fake, thread, "connected").await;
    }
    let marker = |i: usize, j: usize| format!("«s{i} a{j}»");

    // The burst: round after round, every session runs a tool and answers.
    let calls_before = fake.api().calls().len();
    let mut asked = Vec::new();
    for s in &all {
        s.notify("agent/started", json!({}));
    }
    for j in 0..ANSWERS {
        for (i, s) in all.iter().enumerate() {
            s.notify(
                "tool/started",
                json!({"toolName": "bash", "toolCallId": format!("c{j}"), "args": {"command": "make"}}),
            );
            s.notify(
                "tool/ended",
                json!({"toolName": "bash", "toolCallId": format!("c{j}"), "isError": false}),
            );
            answer(
                s,
                &format!("Step {j} of session {i} is done {}", marker(i, j)),
            );
            asked.push((i, j, std::time::Instant::now()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (i, s) in all.iter().enumerate() {
        let last = format!(
            "Step {} of session {i} is done {}",
            ANSWERS - 1,
            marker(i, ANSWERS - 1)
        );
        s.notify("agent/ended", json!({"lastAssistantText": last}));
    }

    // Watch every answer arrive; the budget allows it within two minutes.
    let deadline = std::time::Instant::now() + Duration::from_secs(150);
    let mut arrived: std::collections::HashMap<(usize, usize), std::time::Instant> =
        std::collections::HashMap::new();
    while arrived.len() < asked.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "answers missing after 150 s: {:?}",
            asked
                .iter()
                .filter(|(i, j, _)| !arrived.contains_key(&(*i, *j)))
                .map(|(i, j, _)| marker(*i, *j))
                .collect::<Vec<_>>()
        );
        for (i, &thread) in threads.iter().enumerate() {
            let here = texts(&fake, thread);
            for j in 0..ANSWERS {
                if !arrived.contains_key(&(i, j)) && here.iter().any(|t| t.contains(&marker(i, j)))
                {
                    arrived.insert((i, j), std::time::Instant::now());
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Nothing lost, nothing twice, each in its own topic.
    for (i, &thread) in threads.iter().enumerate() {
        let here = texts(&fake, thread);
        for j in 0..ANSWERS {
            let n = here.iter().filter(|t| t.contains(&marker(i, j))).count();
            assert_eq!(n, 1, "{} in its topic: {here:?}", marker(i, j));
        }
        for (k, &other) in threads.iter().enumerate() {
            if k != i {
                assert!(
                    texts(&fake, other)
                        .iter()
                        .all(|t| !t.contains(&format!("«s{i} "))),
                    "session {i}'s answer in topic {k}"
                );
            }
        }
        assert!(
            here.iter().all(|t| !t.contains("may be missing")),
            "no answer's fate was left open: {here:?}"
        );
    }

    let calls = fake.api().calls();
    let burst = &calls[calls_before..];
    let spends = |c: &&agent_relay::fake_bot_api::CallRecord| {
        matches!(c.method.as_str(), "sendMessage" | "editMessageText") && c.status == Some(200)
    };
    let is_answer = |c: &agent_relay::fake_bot_api::CallRecord| {
        c.params["text"].as_str().is_some_and(|t| t.contains('«'))
    };
    let refused: Vec<(&str, u64, &Value)> = burst
        .iter()
        .filter(|c| c.status == Some(429))
        .map(|c| (c.method.as_str(), c.started_ms, &c.params))
        .collect();
    // Telegram's window, as the fake counts it: the fullest minute.
    let times: Vec<u64> = calls.iter().filter(spends).map(|c| c.started_ms).collect();
    let fullest = times
        .iter()
        .map(|&t| times.iter().filter(|&&u| u >= t && u < t + 60_000).count())
        .max()
        .unwrap_or(0);
    let sent = burst.iter().filter(|c| spends(c) && is_answer(c)).count();
    let progress = burst.iter().filter(|c| spends(c) && !is_answer(c)).count();
    let longest = asked
        .iter()
        .map(|(i, j, at)| arrived[&(*i, *j)].saturating_duration_since(*at))
        .max()
        .unwrap_or_default();
    let (_, relay) = all[0].command("relay", "status").await;
    let pacing: Vec<&str> = relay.lines().filter(|l| l.contains("pacing")).collect();
    eprintln!(
        "burst from {SESSIONS} sessions: {} answers asked for, {sent} messages sent with them \
         ({} merged into another), longest wait from answer to topic {:.1} s; \
         {progress} progress messages and edits; {} calls refused with 429; \
         fullest minute {fullest} messages; relay status: {pacing:?}",
        asked.len(),
        asked.len() - sent,
        longest.as_secs_f64(),
        refused.len(),
    );

    assert!(
        refused.is_empty(),
        "the relay paced itself, yet Telegram said 429 to {refused:?}"
    );
    assert!(fullest <= 20, "{fullest} messages in one minute");
    // Answers before progress: the budget ran out and the chat paused for
    // its window; when it opened again, every session had an answer waiting
    // at the limiter, and those went before any progress edit.
    let spent: Vec<&agent_relay::fake_bot_api::CallRecord> =
        burst.iter().filter(|c| spends(c)).collect();
    let reopened = (1..spent.len())
        .max_by_key(|&k| spent[k].started_ms - spent[k - 1].started_ms)
        .expect("more than one message");
    let pause = spent[reopened].started_ms - spent[reopened - 1].started_ms;
    assert!(
        pause >= 30_000,
        "the burst had to wait for the window ({pause} ms)"
    );
    let first: Vec<&str> = spent[reopened..]
        .iter()
        .take(SESSIONS)
        .filter_map(|c| c.params["text"].as_str())
        .collect();
    assert!(
        first.iter().all(|t| t.contains('«')),
        "when the window opened, answers went first: {first:?}"
    );
    assert!(sent < asked.len(), "what queued was merged");
}

//! The Telegram transport with real sidecars and the fake Bot API: the
//! offset survives a leader's SIGKILL, overlapping polls (409), 429 and 5xx
//! answers, garbage bodies, unknown update kinds, and followers' sends
//! proxied through the leader. Timing is only ever checked on the fake's
//! call record, never on the test's own clock.

use crate::common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_relay::fake_bot_api::{CallRecord, Fault};
use agent_relay::{JournalState, Store};
use common::{
    CHAT, FakeServer, Options, USER, WAIT, inject, prompts, session, start, topic, wait_prompt,
    wait_topic_text,
};
use serde_json::{Value, json};

/// Waits until the fake's call record satisfies `check`.
async fn wait_calls<T>(
    fake: &FakeServer,
    what: &str,
    mut check: impl FnMut(&[CallRecord]) -> Option<T>,
) -> T {
    fake.api()
        .wait_until(|api| check(&api.calls()), WAIT)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "timed out waiting for {what}; calls: {:#?}",
                fake.api().calls()
            )
        })
}

/// The relay's own long polls (a rival poll in a test uses another limit).
fn relay_polls(calls: &[CallRecord]) -> Vec<CallRecord> {
    calls
        .iter()
        .filter(|c| c.method == "getUpdates" && c.params["limit"] == 100)
        .cloned()
        .collect()
}

/// One leader polls at a time: each of its polls starts after the previous
/// one was answered, else the fake would have cut the older one with 409.
fn assert_polls_never_overlap(calls: &[CallRecord]) {
    let polls = relay_polls(calls);
    for pair in polls.windows(2) {
        let finished = pair[0].finished_ms.unwrap_or_else(|| {
            panic!("poll {} still open when {} began", pair[0].seq, pair[1].seq)
        });
        assert!(
            pair[1].started_ms >= finished,
            "poll {} began at {} ms before poll {} ended at {finished} ms",
            pair[1].seq,
            pair[1].started_ms,
            pair[0].seq
        );
    }
}

fn store_path(home: &Path, fake: &FakeServer) -> PathBuf {
    home.join("state")
        .join(format!("{}.sqlite3", fake.api().bot_id()))
}

fn read_store(path: &Path) -> Store {
    Store::open_read_only(path).expect("open the relay's store read-only")
}

/// Re-checks the leader's store until `check` holds. The store cannot wake
/// the test when it changes, so this polls it, with a deadline.
async fn wait_store<T>(path: &Path, what: &str, mut check: impl FnMut(&Store) -> Option<T>) -> T {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Some(found) = check(&read_store(path)) {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what} in the store"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A poll of the Bot API from outside the relay, as a second bot instance
/// would make.
async fn rival_poll(fake: &FakeServer, params: Value) -> reqwest::Response {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
        .post(format!("{}/getUpdates", fake.bot_url()))
        .json(&params)
        .timeout(WAIT)
        .send()
        .await
        .expect("the rival poll reaches the fake")
}

#[tokio::test]
async fn the_offset_survives_a_leader_sigkill_and_nothing_is_lost_or_doubled() {
    let home = common::home();
    let fake = common::fake().await;
    let mut leader = session(home.path(), &fake, "/tmp/l", "lead").await;
    assert!(leader.latest_status().unwrap().contains("● leader"));
    let follower = session(home.path(), &fake, "/tmp/f", "follow").await;
    assert!(follower.latest_status().unwrap().contains("● follower"));
    let thread = topic(&fake, "follow").thread_id;

    let mut sent: HashMap<i64, String> = HashMap::new();
    // Returns the batch's last update id.
    let mut send_batch = |batch: usize| {
        (0..3)
            .map(|i| {
                let text = format!("batch {batch} message {i}");
                let id = inject(&fake, Some(thread), USER, &text);
                sent.insert(id, text);
                id
            })
            .max()
            .unwrap_or_default()
    };
    // The first half arrives through the first leader.
    send_batch(1);
    let first_half = send_batch(2);
    wait_prompt(&follower, "batch 2 message 2").await;
    // Mid-stream: this batch may be unpolled, polled but not journaled, or
    // journaled but not delivered when the leader dies.
    send_batch(3);
    leader.kill9().await;
    let before_failover = fake.api().calls().len();
    send_batch(4);
    follower.wait_status(|s| s.contains("● leader")).await;
    send_batch(5);
    for text in sent.values() {
        wait_prompt(&follower, text).await;
    }
    let last = *sent.keys().max().expect("messages were sent");

    let store = store_path(home.path(), &fake);
    let owner = read_store(&store)
        .binding_by_thread(CHAT, thread)
        .expect("read the bindings")
        .expect("the follower's topic is bound")
        .profile_key;
    // Every message is journaled once (update_id is the journal's key), for
    // its owner, and settled as delivered.
    wait_store(&store, "every message delivered", |s| {
        sent.keys()
            .all(|id| {
                s.journal_entry(*id)
                    .expect("read the journal")
                    .is_some_and(|e| e.state == JournalState::Delivered)
            })
            .then_some(())
    })
    .await;
    let journal = read_store(&store);
    for (id, text) in &sent {
        let entry = journal.journal_entry(*id).unwrap().unwrap();
        assert_eq!(&entry.update.text, text);
        assert_eq!(entry.update.owner.as_deref(), Some(owner.as_str()));
    }
    let offset = journal.offset().unwrap().expect("an offset was stored");
    assert!(offset > last, "offset {offset} must be past update {last}");

    // A later message cannot overtake a duplicate already on its way.
    let sentinel = inject(&fake, Some(thread), USER, "sentinel");
    wait_prompt(&follower, "sentinel").await;
    let mut per_update: HashMap<i64, usize> = HashMap::new();
    let mut per_text: HashMap<String, usize> = HashMap::new();
    for p in prompts(&follower) {
        *per_update
            .entry(p["params"]["origin"]["updateId"].as_i64().unwrap())
            .or_default() += 1;
        *per_text
            .entry(p["params"]["text"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    for (id, text) in &sent {
        assert_eq!(per_update.get(id), Some(&1), "update {id} ({text})");
        assert_eq!(per_text.get(text), Some(&1), "{text}");
    }
    assert_eq!(
        per_update.len(),
        sent.len() + 1,
        "nothing else: {per_update:?}"
    );
    assert_eq!(per_update.get(&sentinel), Some(&1));

    // The successor resumed from the offset its predecessor persisted; it
    // did not start over from whatever Telegram still held.
    let calls = fake.api().calls();
    let resumed = relay_polls(&calls[before_failover..])
        .first()
        .map(|c| c.params["offset"].as_i64())
        .expect("the new leader polled");
    assert!(
        resumed.is_some_and(|o| o > first_half),
        "the new leader's first poll asked for offset {resumed:?}, \
         after {first_half} had been journaled"
    );
    fake.api()
        .wait_until(
            |api| api.pending_update_ids().is_empty().then_some(()),
            WAIT,
        )
        .await
        .expect("the new leader confirmed every update");
}

#[tokio::test]
async fn an_overlapping_poll_is_a_conflict_the_leader_recovers_from() {
    let home = common::home();
    let fake = common::fake().await;
    let leader = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    fake.api().wait_for_poller(WAIT).await.unwrap();

    // Telegram answers the older poll, the leader's, with 409. The rival's
    // own poll ends when the leader polls again (another 409) or times out.
    let rival = rival_poll(&fake, json!({"timeout": 2, "limit": 1})).await;
    assert!(matches!(rival.status().as_u16(), 200 | 409));

    wait_calls(&fake, "the leader polling again after a 409", |calls| {
        let polls = relay_polls(calls);
        let conflict = polls.iter().find(|c| c.status == Some(409))?;
        let finished = conflict.finished_ms?;
        polls
            .iter()
            .any(|c| c.seq > conflict.seq && c.started_ms >= finished)
            .then_some(())
    })
    .await;
    // Until a poll succeeds again, the status line says why nothing arrives.
    leader.wait_status(|s| s.contains("409 conflict")).await;

    inject(&fake, Some(thread), USER, "after the conflict");
    wait_prompt(&leader, "after the conflict").await;
    leader.wait_status(|s| s.contains("● leader")).await;
    assert_polls_never_overlap(&fake.api().calls());
}

#[tokio::test]
async fn a_429_holds_back_the_chat_for_retry_after_and_the_answer_still_arrives() {
    let home = common::home();
    let fake = common::fake().await;
    let a = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    // The connected notice is sent first; the fault must meet the answer.
    wait_topic_text(&fake, thread, "connected").await;
    fake.api()
        .inject_fault("sendMessage", Fault::TooManyRequests { retry_after: 2 }, 1);
    a.notify(
        "turn/ended",
        json!({"assistantText": "the answer", "toolCalls": []}),
    );
    wait_topic_text(&fake, thread, "the answer").await;

    let calls = fake.api().calls();
    let limited = calls
        .iter()
        .find(|c| c.method == "sendMessage" && c.status == Some(429))
        .expect("the 429 was answered");
    assert!(
        limited.params["text"]
            .as_str()
            .unwrap()
            .contains("the answer")
    );
    let limited_at = limited.finished_ms.unwrap();
    let next = calls
        .iter()
        .find(|c| c.seq > limited.seq && c.method == "sendMessage" && c.params["chat_id"] == CHAT)
        .expect("the answer was sent again");
    assert!(
        next.started_ms >= limited_at + 2000,
        "retry_after 2 s not honoured: 429 at {limited_at} ms, next send at {} ms",
        next.started_ms
    );
    assert!(next.ok, "{next:?}");
    let answers = fake
        .api()
        .messages(CHAT, Some(thread))
        .iter()
        .filter(|m| m.plain_text == "the answer")
        .count();
    assert_eq!(answers, 1, "sent once, not replayed twice");
}

#[tokio::test]
async fn a_streak_of_5xx_backs_off_and_polling_recovers() {
    let home = common::home();
    let fake = common::fake().await;
    let a = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    fake.api().wait_for_poller(WAIT).await.unwrap();
    fake.api()
        .inject_fault("getUpdates", Fault::ServerError { code: 502 }, 5);
    // Ends the waiting poll, so the next five meet the fault.
    inject(&fake, Some(thread), USER, "before the outage");
    wait_prompt(&a, "before the outage").await;

    let failed = wait_calls(&fake, "five failed polls", |calls| {
        let failed: Vec<CallRecord> = relay_polls(calls)
            .into_iter()
            .filter(|c| c.status == Some(502))
            .collect();
        (failed.len() == 5 && failed.iter().all(|c| c.finished_ms.is_some())).then_some(failed)
    })
    .await;
    // While it lasts, the status line says Telegram is unreachable.
    let offline = a.messages().iter().any(|m| {
        m["method"] == "ui/setStatus"
            && m["params"]["text"]
                .as_str()
                .is_some_and(|t| t.contains("offline"))
    });
    assert!(offline, "the outage never showed in the status line");
    inject(&fake, Some(thread), USER, "after the outage");
    wait_prompt(&a, "after the outage").await;
    a.wait_status(|s| s.ends_with("● leader")).await;

    let gaps: Vec<u64> = failed
        .windows(2)
        .map(|pair| pair[1].started_ms - pair[0].finished_ms.unwrap())
        .collect();
    let first = failed[0].started_ms;
    let in_first_second = relay_polls(&fake.api().calls())
        .iter()
        .filter(|c| c.started_ms >= first && c.started_ms < first + 1000)
        .count();
    assert!(
        in_first_second <= 5,
        "a hot loop: {in_first_second} polls in the first second; gaps {gaps:?} ms"
    );
    assert!(
        gaps.last() > gaps.first(),
        "the backoff does not grow: gaps {gaps:?} ms"
    );
    assert_polls_never_overlap(&fake.api().calls());
}

#[tokio::test]
async fn garbage_answers_to_polls_crash_nothing() {
    let home = common::home();
    let fake = common::fake().await;
    let mut a = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    fake.api().wait_for_poller(WAIT).await.unwrap();
    fake.api().inject_fault("getUpdates", Fault::GarbageBody, 2);
    fake.api()
        .inject_fault("getUpdates", Fault::TruncatedJson, 1);
    inject(&fake, Some(thread), USER, "before the garbage");
    wait_prompt(&a, "before the garbage").await;
    // A truncated answer is a performed poll: it waits for an update, which
    // then reaches the relay cut in half and must be fetched again.
    wait_calls(&fake, "the truncated poll", |calls| {
        calls
            .iter()
            .any(|c| c.fault.as_deref() == Some("TruncatedJson"))
            .then_some(())
    })
    .await;
    let cut = inject(&fake, Some(thread), USER, "cut in half once");
    wait_prompt(&a, "cut in half once").await;

    let calls = fake.api().calls();
    let garbage = calls
        .iter()
        .filter(|c| c.fault.as_deref() == Some("GarbageBody"))
        .count();
    assert_eq!(garbage, 2);
    assert_eq!(
        prompts(&a)
            .iter()
            .filter(|p| p["params"]["origin"]["updateId"] == cut)
            .count(),
        1
    );
    assert!(a.is_running(), "the sidecar died");
    let (ok, status) = a.command("telegram-status", "").await;
    assert!(ok, "{status}");
    assert_polls_never_overlap(&calls);
}

#[tokio::test]
async fn unknown_and_broken_updates_are_skipped_and_the_offset_moves_past_them() {
    let home = common::home();
    let fake = common::fake().await;
    // A previous bot program asked for reactions; Telegram queued one under
    // that setting, and the relay's first poll receives it.
    let earlier = rival_poll(
        &fake,
        json!({"timeout": 0, "limit": 1, "allowed_updates": ["message", "message_reaction"]}),
    )
    .await;
    assert_eq!(earlier.status().as_u16(), 200);
    let reaction = fake.api().inject_raw_update(json!({"message_reaction": {
        "chat": {"id": CHAT, "type": "supergroup", "title": "Relay Test Forum"},
        "message_id": 1,
        "user": {"id": USER, "is_bot": false, "first_name": "Alice"},
        "date": 1_700_000_000,
        "old_reaction": [],
        "new_reaction": [{"type": "emoji", "emoji": "👍"}],
    }}));
    assert_eq!(fake.api().pending_update_ids(), [reaction]);
    let a = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;

    // A known kind with a payload that does not decode, while polling.
    let broken = fake
        .api()
        .inject_raw_update(json!({"message": "not a message"}));
    let text = inject(&fake, Some(thread), USER, "still delivered");
    wait_prompt(&a, "still delivered").await;

    let store = store_path(home.path(), &fake);
    let offset = wait_store(&store, "an offset past the message", |s| {
        s.offset().unwrap().filter(|o| *o > text)
    })
    .await;
    assert!(offset > reaction && offset > broken);
    let journal = read_store(&store);
    assert_eq!(journal.journal_entry(reaction).unwrap(), None);
    assert_eq!(journal.journal_entry(broken).unwrap(), None);
    // Telegram forgets them once a poll confirms the offset.
    fake.api()
        .wait_until(
            |api| api.pending_update_ids().is_empty().then_some(()),
            WAIT,
        )
        .await
        .expect("every update confirmed");
    // The first poll received the reaction (alone, or with what followed),
    // so the very next one must already confirm it.
    let calls = fake.api().calls();
    let polls = relay_polls(&calls);
    assert!(
        polls[1].params["offset"]
            .as_i64()
            .is_some_and(|o| o > reaction),
        "the poll after the first does not confirm the unknown update: {:?}",
        polls[1]
    );
    assert_eq!(prompts(&a).len(), 1, "{:?}", prompts(&a));
    assert_polls_never_overlap(&calls);
}

#[tokio::test]
async fn a_followers_answer_reaches_telegram_through_the_leader() {
    let home = common::home();
    let fake = common::fake().await;
    // Whatever the follower would send to Telegram itself lands here instead.
    let decoy = common::fake().await;
    let leader = session(home.path(), &fake, "/tmp/l", "lead").await;
    assert!(leader.latest_status().unwrap().contains("● leader"));
    let options = Options::new(home.path())
        .configured(&fake)
        .env("AGENT_RELAY_API_URL", &decoy.url());
    let follower = start(options, "/tmp/f", "follow").await;
    assert!(follower.latest_status().unwrap().contains("● follower"));
    let thread = topic(&fake, "follow").thread_id;

    follower.notify(
        "turn/ended",
        json!({"assistantText": "answer from the **follower**", "toolCalls": []}),
    );
    wait_topic_text(&fake, thread, "answer from the follower").await;
    let sent = fake
        .api()
        .calls()
        .into_iter()
        .find(|c| {
            c.method == "sendMessage"
                && c.params["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("follower"))
        })
        .expect("the answer's sendMessage");
    assert_eq!(sent.params["chat_id"], CHAT);
    assert_eq!(sent.params["message_thread_id"], thread);
    assert!(
        decoy.api().calls().is_empty(),
        "the follower called Telegram itself: {:?}",
        decoy.api().calls()
    );
}

#[tokio::test]
async fn a_hanging_send_is_given_up_not_replayed_and_the_next_one_goes_through() {
    let home = common::home();
    let fake = common::fake().await;
    let mut a = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    wait_topic_text(&fake, thread, "connected").await;
    fake.api().inject_fault("sendMessage", Fault::Hang, 1);
    a.notify(
        "turn/ended",
        json!({"assistantText": "lost in the void", "toolCalls": []}),
    );
    // The client gives up on the hanging call; its outcome is unknown, so it
    // is not sent again (a duplicate answer is worse than a missing one).
    wait_calls(&fake, "the hanging send", |calls| {
        calls
            .iter()
            .find(|c| c.method == "sendMessage" && c.fault.is_some())
            .cloned()
    })
    .await;
    a.notify(
        "turn/ended",
        json!({"assistantText": "the next answer", "toolCalls": []}),
    );
    wait_topic_text(&fake, thread, "the next answer").await;
    let tries = fake
        .api()
        .calls()
        .iter()
        .filter(|c| c.method == "sendMessage" && c.params["text"] == "lost in the void")
        .count();
    assert_eq!(tries, 1, "an ambiguous send was replayed");
    // …but the topic is told that it may be missing.
    wait_topic_text(&fake, thread, "An answer may be missing").await;
    let (ok, _) = a.command("telegram-status", "").await;
    assert!(ok, "the sidecar still answers");
}

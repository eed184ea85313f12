//! Nothing lost when a session ends (docs/DESIGN.md, *Outbound*): an
//! answer is the relay's once its host handed it over — `agent/ended` sent
//! as a request is answered when the answer is on disk at the leader —
//! whatever happens to the session's process, or the leader's, next.
//! Telegram is made slow (one second a `sendMessage`, as a busy chat is),
//! so every process here is gone while the answer still waits to go.

use crate::common;

use std::time::Duration;

use agent_relay::election::BusDir;
use agent_relay::fake_bot_api::Fault;
use common::{CHAT, Options, Sidecar, WAIT};
use serde_json::json;

/// How slow Telegram is made: long enough for every exit below to happen
/// while an answer waits for it.
const SLOW: Duration = Duration::from_secs(1);

/// Hands `text` over as the turn's answer, the way a host that exits next
/// does: `agent/ended` as a request, answered once it is the relay's.
async fn answer_and_wait(s: &mut Sidecar, text: &str) {
    let response = s
        .call_raw("agent/ended", json!({"lastAssistantText": text}))
        .await;
    assert!(response.get("error").is_none(), "{response}");
}

/// How many messages of `thread` contain `needle`.
fn count(fake: &common::FakeServer, thread: i64, needle: &str) -> usize {
    fake.api()
        .messages(CHAT, Some(thread))
        .iter()
        .filter(|m| m.plain_text.contains(needle))
        .count()
}

/// Waits until nobody holds the bus lock: no relay process of the bot is
/// left (a drain included).
async fn wait_no_leader(home: &std::path::Path, fake: &common::FakeServer) {
    let bot = fake.api().bot_id().to_string();
    let bus = BusDir::new(home.join("run").join(bot));
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if bus.try_lock().expect("the bus directory").is_some() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a relay process is still running"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_answer_handed_over_survives_its_sidecar_killed_the_moment_after() {
    let home = common::home();
    let fake = common::fake().await;
    let _leader = common::session(home.path(), &fake, "/tmp/lead", "lead").await;
    let mut s = common::session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = common::topic(&fake, "api").thread_id;
    fake.api()
        .inject_fault_until_cleared("sendMessage", Fault::Delay(SLOW));
    answer_and_wait(&mut s, "the answer handed over").await;
    s.kill9().await;
    common::wait_topic_text(&fake, thread, "the answer handed over").await;
    assert_eq!(count(&fake, thread, "the answer handed over"), 1);
}

#[tokio::test]
async fn the_last_session_leaving_hands_what_waits_to_a_drain() {
    let home = common::home();
    let fake = common::fake().await;
    let mut s = common::session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = common::topic(&fake, "api").thread_id;
    fake.api()
        .inject_fault_until_cleared("sendMessage", Fault::Delay(SLOW));
    answer_and_wait(&mut s, "the last words").await;
    s.close_stdin();
    assert!(s.wait_exit().await.is_some(), "the sidecar exits on EOF");
    common::wait_topic_text(&fake, thread, "the last words").await;
    assert_eq!(count(&fake, thread, "the last words"), 1);
    // The drain leaves once it sent what waited.
    wait_no_leader(home.path(), &fake).await;
}

#[tokio::test]
async fn two_sessions_ending_together_both_land() {
    let home = common::home();
    let fake = common::fake().await;
    let mut first = common::session(home.path(), &fake, "/tmp/one", "one").await;
    let mut second = common::session(home.path(), &fake, "/tmp/two", "two").await;
    let (one, two) = (
        common::topic(&fake, "one").thread_id,
        common::topic(&fake, "two").thread_id,
    );
    fake.api()
        .inject_fault_until_cleared("sendMessage", Fault::Delay(SLOW));
    answer_and_wait(&mut first, "the first answer").await;
    answer_and_wait(&mut second, "the second answer").await;
    // The leader (the first) and the other one leave at once.
    first.close_stdin();
    second.close_stdin();
    assert!(first.wait_exit().await.is_some());
    assert!(second.wait_exit().await.is_some());
    common::wait_topic_text(&fake, one, "the first answer").await;
    common::wait_topic_text(&fake, two, "the second answer").await;
    assert_eq!(count(&fake, one, "the first answer"), 1);
    assert_eq!(count(&fake, two, "the second answer"), 1);
    wait_no_leader(home.path(), &fake).await;
}

#[tokio::test]
async fn a_send_cut_off_by_the_leaders_death_is_offered_never_replayed() {
    let home = common::home();
    let fake = common::fake().await;
    let mut s = common::session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = common::topic(&fake, "api").thread_id;
    fake.api()
        .inject_fault_until_cleared("sendMessage", Fault::Delay(Duration::from_secs(3)));
    answer_and_wait(&mut s, "cut off mid-call").await;
    // The leader is sending it now (Telegram holds the call): it dies.
    fake.api()
        .wait_until(
            |api| {
                api.calls()
                    .iter()
                    .any(|c| c.method == "sendMessage" && c.finished_ms.is_none())
                    .then_some(())
            },
            WAIT,
        )
        .await
        .expect("the answer is on its way");
    s.kill9().await;
    fake.api().clear_faults();
    // The next session leads, and finds the answer of unknown fate.
    let _next = common::session(home.path(), &fake, "/tmp/api", "api").await;
    let said = common::wait_topic_text(&fake, thread, "An answer may be missing").await;
    assert!(
        said.iter()
            .any(|t| t.contains("An answer may be missing") && t.contains("cut off mid-call")),
        "{said:?}"
    );
    assert!(
        count(&fake, thread, "cut off mid-call") <= 2,
        "the answer (if Telegram took it) and the notice, never a replay: {:?}",
        fake.api().messages(CHAT, Some(thread))
    );
}

/// A host that holds prompts for a turn to take (`queued`, as Claude
/// Code's MCP server does): a session that ends before a turn took one
/// leaves it with the relay, and the same session resumed gets it again.
#[tokio::test]
async fn a_message_no_turn_took_waits_for_the_session_resumed() {
    let home = common::home();
    let fake = common::fake().await;
    let _leader = common::session(home.path(), &fake, "/tmp/lead", "lead").await;
    let queued = std::sync::Arc::new(|method: &str, _: &serde_json::Value| match method {
        "agent/sendUserMessage" => Some(json!({"accepted": true, "queued": true})),
        _ => None,
    });
    let mut s = Sidecar::spawn(
        Options::new(home.path())
            .configured(&fake)
            .answer(queued.clone()),
    );
    s.handshake("/tmp/api", "api").await;
    s.wait_status(common::connected).await;
    let thread = common::topic(&fake, "api").thread_id;
    common::inject(&fake, Some(thread), common::USER, "read me later");
    common::wait_prompt(&s, "read me later").await;
    s.close_stdin();
    assert!(s.wait_exit().await.is_some());
    // Resumed: the message comes again, and once a turn took it, never more.
    let mut again = Sidecar::spawn(
        Options::new(home.path())
            .configured(&fake)
            .answer(queued.clone()),
    );
    again.handshake("/tmp/api", "api").await;
    let prompt = common::wait_prompt(&again, "read me later").await;
    let update_id = prompt["params"]["origin"]["updateId"].clone();
    again.notify("agent/taken", json!({"updateIds": [update_id]}));
    again.close_stdin();
    assert!(again.wait_exit().await.is_some());
    let mut third = Sidecar::spawn(Options::new(home.path()).configured(&fake).answer(queued));
    third.handshake("/tmp/api", "api").await;
    third.wait_status(common::connected).await;
    common::inject(&fake, Some(thread), common::USER, "a later one");
    common::wait_prompt(&third, "a later one").await;
    assert_eq!(
        common::prompts(&third)
            .iter()
            .filter(|p| p["params"]["text"] == "read me later")
            .count(),
        0,
        "a message a turn took is not given again"
    );
}

//! Disconnect, restart and self-healing routes, with real sidecars and the
//! fake Bot API. Earlier systems shipped each of these with races; these
//! tests are the point.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use agent_relay::fake_bot_api::{Fault, TopicInfo};
use agent_relay::protocol::bus::*;
use agent_relay::wire::{self, Received};
use common::{CHAT, FakeServer, Options, Sidecar, WAIT, connected};
use interprocess::local_socket::tokio::Stream;
use interprocess::local_socket::traits::tokio::Stream as _;
use interprocess::local_socket::{GenericFilePath, ToFsName};
use serde_json::json;

/// A host that answers confirmations with `confirm`.
fn host(options: Options<'_>, confirm: bool) -> Options<'_> {
    options.answer(Arc::new(move |method, _| match method {
        "ui/confirm" => Some(json!({"confirmed": confirm})),
        "agent/sendUserMessage" => Some(json!({"accepted": true})),
        _ => None,
    }))
}

async fn sessions(home: &Path, fake: &FakeServer, n: usize, confirm: bool) -> Vec<Sidecar> {
    let mut all: Vec<Sidecar> = (0..n)
        .map(|_| Sidecar::spawn(host(Options::new(home).configured(fake), confirm)))
        .collect();
    for (i, s) in all.iter_mut().enumerate() {
        s.handshake(&format!("/tmp/p{i}"), &format!("s{i}")).await;
    }
    for s in &all {
        s.wait_status(connected).await;
    }
    all
}

fn leader_index(all: &[Sidecar]) -> usize {
    let leaders: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, s)| s.latest_status().is_some_and(|t| t.contains("● leader")))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(leaders.len(), 1, "exactly one leader");
    leaders[0]
}

fn live_topic(fake: &FakeServer, name: &str) -> Option<TopicInfo> {
    let suffix = format!("· {name}");
    fake.api()
        .topics(CHAT)
        .into_iter()
        .find(|t| !t.deleted && t.name.ends_with(&suffix))
}

#[tokio::test]
async fn restart_completes_with_every_route_back() {
    let home = common::home();
    let fake = common::fake().await;
    let mut all = sessions(home.path(), &fake, 5, true).await;
    let (ok, text) = all[2].command("relay", "restart").await;
    assert!(ok, "{text}");
    assert!(text.contains("complete 5/5"), "{text}");
    for s in &all {
        s.wait_status(connected).await;
    }
    leader_index(&all);
    let topics = fake.api().topics(CHAT);
    assert_eq!(topics.len(), 5, "a restart creates no topics: {topics:?}");
}

#[tokio::test]
async fn restart_with_a_stopped_session_is_partial_and_names_it() {
    let home = common::home();
    let fake = common::fake().await;
    let mut all = sessions(home.path(), &fake, 3, true).await;
    let leader = leader_index(&all);
    let stopped = (leader + 1) % 3;
    let caller = (leader + 2) % 3;
    all[stopped].signal(libc::SIGSTOP);
    let (ok, text) = all[caller].command("relay", "restart").await;
    assert!(!ok, "{text}");
    assert!(text.contains("partial-timeout 2/3"), "{text}");
    assert!(
        text.contains(&format!("/tmp/p{stopped}#s{stopped}")),
        "{text}"
    );
    all[stopped].signal(libc::SIGCONT);
    all[stopped].wait_status(connected).await;
}

#[tokio::test]
async fn restart_fails_clearly_when_no_bus_can_be_formed() {
    let home = common::home();
    let fake = common::fake().await;
    let mut all = sessions(home.path(), &fake, 1, true).await;
    // Make the database unusable: no sidecar can lead without it. (The old
    // leader keeps its open file until it steps down.)
    let db = home.path().join("state").join("123456789.sqlite3");
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    std::fs::create_dir(&db).unwrap();
    let (ok, text) = all[0].command("relay", "restart").await;
    assert!(!ok, "{text}");
    assert!(text.contains("failed"), "{text}");
    assert!(text.contains("database"), "the reason is given: {text}");
}

#[tokio::test]
async fn twenty_restarts_never_overlap_polls_or_leave_two_leaders() {
    let home = common::home();
    let fake = common::fake().await;
    let mut all = sessions(home.path(), &fake, 3, true).await;
    for round in 0..20 {
        let caller = round % 3;
        let (ok, text) = all[caller].command("relay", "restart").await;
        assert!(ok && text.contains("complete 3/3"), "round {round}: {text}");
    }
    for s in &all {
        s.wait_status(connected).await;
    }
    leader_index(&all);
    // Each leader ends its own long poll with a short one before it lets go
    // of the lock (Telegram terminates the older poll with 409). So: every
    // 409 is followed by that short poll, and otherwise no poll starts
    // before the previous one finished.
    let mut polls: Vec<_> = fake
        .api()
        .calls()
        .into_iter()
        .filter(|c| c.method == "getUpdates")
        .collect();
    polls.sort_by_key(|c| c.started_ms);
    for pair in polls.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.status == Some(409) {
            assert_eq!(
                b.params["timeout"], 0,
                "a poll was terminated by a rival: {a:?} then {b:?}"
            );
        } else {
            let finished = a.finished_ms.unwrap_or(u64::MAX);
            assert!(
                b.started_ms >= finished,
                "overlapping polls: {a:?} and {b:?}"
            );
        }
    }
    assert!(polls.len() > 20, "every leader polled: {polls:?}");
    for s in &all {
        let conflict = s.messages().iter().any(|m| {
            m["method"] == "ui/setStatus"
                && m["params"]["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("409"))
        });
        assert!(!conflict, "the relay saw itself as a rival poller");
    }
}

#[tokio::test]
async fn disconnect_confirmed_deletes_the_topic() {
    let home = common::home();
    let fake = common::fake().await;
    let mut all = sessions(home.path(), &fake, 2, true).await;
    let follower = 1 - leader_index(&all);
    let name = format!("s{follower}");
    assert!(live_topic(&fake, &name).is_some());
    let (ok, text) = all[follower].command("telegram-disconnect", "").await;
    assert!(ok, "{text}");
    assert!(live_topic(&fake, &name).is_none(), "the topic is deleted");
    assert_eq!(
        all[follower].wait_status(|_| true).await,
        "TG ○ disconnected"
    );
    let (_, table) = all[1 - follower].command("relay", "status").await;
    assert!(
        table.contains("1 session(s)") && !table.contains(&name),
        "{table}"
    );
}

#[tokio::test]
async fn disconnect_declined_changes_nothing() {
    let home = common::home();
    let fake = common::fake().await;
    let mut all = sessions(home.path(), &fake, 1, false).await;
    let result = all[0]
        .call(
            "command/execute",
            serde_json::json!({"name": "telegram-disconnect", "args": ""}),
        )
        .await;
    // Declining is no error: the host shows it as information.
    assert_eq!(
        result,
        serde_json::json!({"ok": false, "cancelled": true,
            "message": "Disconnect cancelled; nothing changed."})
    );
    assert!(live_topic(&fake, "s0").is_some());
    assert!(connected(&all[0].latest_status().unwrap()));
    let deletes = fake
        .api()
        .calls()
        .iter()
        .filter(|c| c.method == "deleteForumTopic")
        .count();
    assert_eq!(deletes, 0);
}

/// A refusal that retrying cannot fix.
fn no_rights() -> Fault {
    Fault::BadRequest {
        description: "Bad Request: not enough rights to delete the topic".into(),
    }
}

/// A passing server error on a deletion (which may be sent twice) is the
/// leader's to retry: the user sees the disconnect succeed.
#[tokio::test]
async fn a_passing_server_error_on_disconnect_is_retried_by_the_leader() {
    let home = common::home();
    let fake = common::fake().await;
    let mut all = sessions(home.path(), &fake, 2, true).await;
    let follower = 1 - leader_index(&all);
    fake.api()
        .inject_fault("deleteForumTopic", Fault::ServerError { code: 502 }, 2);
    let (ok, text) = all[follower].command("telegram-disconnect", "").await;
    assert!(ok, "{text}");
    assert!(live_topic(&fake, &format!("s{follower}")).is_none());
    let deletes = fake
        .api()
        .calls()
        .iter()
        .filter(|c| c.method == "deleteForumTopic")
        .count();
    assert_eq!(deletes, 3, "two failures, then the deletion");
}

#[tokio::test]
async fn disconnect_is_not_reported_done_when_telegram_fails() {
    let home = common::home();
    let fake = common::fake().await;
    let mut all = sessions(home.path(), &fake, 2, true).await;
    let follower = 1 - leader_index(&all);
    fake.api().inject_fault("deleteForumTopic", no_rights(), 1);
    let (ok, text) = all[follower].command("telegram-disconnect", "").await;
    assert!(!ok, "{text}");
    assert!(
        text.contains("not confirmed") && text.contains("retry"),
        "{text}"
    );
    assert!(
        live_topic(&fake, &format!("s{follower}")).is_some(),
        "the binding stays intact"
    );
    assert!(connected(&all[follower].latest_status().unwrap()));
    // Retrying works once Telegram does.
    let (ok, text) = all[follower].command("telegram-disconnect", "").await;
    assert!(ok, "{text}");
    assert!(live_topic(&fake, &format!("s{follower}")).is_none());
}

#[tokio::test]
async fn a_leaders_disconnect_hands_over_and_the_successor_finishes_the_deletion() {
    let home = common::home();
    let fake = common::fake().await;
    let mut all = sessions(home.path(), &fake, 2, true).await;
    let leader = leader_index(&all);
    let name = format!("s{leader}");
    let thread = live_topic(&fake, &name).unwrap().thread_id;
    fake.api().inject_fault("deleteForumTopic", no_rights(), 1);
    let (ok, text) = all[leader].command("telegram-disconnect", "").await;
    assert!(!ok, "{text}");
    assert!(text.contains("will finish"), "{text}");
    // The other session takes over and finishes the promised deletion.
    all[1 - leader]
        .wait_status(|s| s.ends_with("● leader"))
        .await;
    fake.api()
        .wait_until(
            |api| {
                api.topics(CHAT)
                    .iter()
                    .any(|t| t.thread_id == thread && t.deleted)
                    .then_some(())
            },
            WAIT,
        )
        .await
        .expect("the successor deletes the topic");
}

#[tokio::test]
async fn a_follower_heals_when_the_leader_changes_under_it() {
    let home = common::home();
    let fake = common::fake().await;
    let mut all = sessions(home.path(), &fake, 2, true).await;
    let leader = leader_index(&all);
    let follower = 1 - leader;
    let (_, before) = all[follower].command("telegram-status", "").await;
    assert!(before.contains("sync: synced@1"), "{before}");
    all[leader].kill9().await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, now) = all[follower].command("telegram-status", "").await;
        if now.contains("sync: synced@2") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never healed: {now}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A raw bus client registered as `profile` (generation `generation`).
async fn raw_register(
    home: &Path,
    profile: &str,
    generation: u64,
) -> (wire::WireReader, wire::WireWriter, Registered) {
    let path = home.join("run").join("123456789").join("bus.sock");
    let stream = Stream::connect(path.to_fs_name::<GenericFilePath>().unwrap())
        .await
        .unwrap();
    let (mut reader, mut writer) = wire::split(stream);
    writer
        .send(&ToLeader::Register(common::raw_register(
            1, profile, generation,
        )))
        .await
        .unwrap();
    let ack = next_ack(&mut reader, 1).await;
    let registered = ack.reply::<Register>().expect("registered");
    (reader, writer, registered)
}

async fn next_ack(reader: &mut wire::WireReader, id: u64) -> Ack {
    loop {
        match tokio::time::timeout(WAIT, reader.recv::<FromLeader>())
            .await
            .expect("an answer")
            .unwrap()
        {
            Some(Received::Envelope(FromLeader::Ack(ack))) if ack.id == Some(id) => return ack,
            Some(_) => continue,
            None => panic!("connection closed"),
        }
    }
}

#[tokio::test]
async fn a_disconnect_racing_a_reregister_never_deletes_a_live_topic() {
    let home = common::home();
    let fake = common::fake().await;
    let _leader = sessions(home.path(), &fake, 1, true).await;
    let (mut reader, mut writer, first) = raw_register(home.path(), "racer", 1).await;
    let thread = first.route.target.expect("a topic").thread_id;
    // Pipelined: the leader sees both before answering either.
    writer
        .send(&ToLeader::Disconnect(Disconnect {
            id: 2,
            generation: 1,
        }))
        .await
        .unwrap();
    let mut carried = first.route.clone();
    carried.target = Some(Target {
        chat_id: CHAT,
        thread_id: thread,
    });
    writer
        .send(&ToLeader::Register(Register {
            carried: Some(carried),
            ..common::raw_register(3, "racer", 2)
        }))
        .await
        .unwrap();
    // The two answers may come in either order.
    let (mut disconnect, mut register) = (None, None);
    while disconnect.is_none() || register.is_none() {
        let frame = tokio::time::timeout(WAIT, reader.recv::<FromLeader>())
            .await
            .expect("an answer")
            .unwrap();
        match frame {
            Some(Received::Envelope(FromLeader::Ack(ack))) if ack.id == Some(2) => {
                disconnect = Some(ack)
            }
            Some(Received::Envelope(FromLeader::Ack(ack))) if ack.id == Some(3) => {
                register = Some(ack)
            }
            Some(_) => {}
            None => panic!("connection closed"),
        }
    }
    let (disconnect, register) = (disconnect.unwrap(), register.unwrap());
    assert!(register.outcome.is_ok(), "{register:?}");
    let now = register.reply::<Register>().unwrap();
    let live_thread = now.route.target.expect("a topic").thread_id;
    let deleted = |t: i64| {
        fake.api()
            .topics(CHAT)
            .iter()
            .any(|x| x.thread_id == t && x.deleted)
    };
    assert!(
        !deleted(live_thread),
        "the live registration's topic was deleted"
    );
    match disconnect.outcome {
        Ok(_) => assert!(
            deleted(thread) && live_thread != thread,
            "disconnect won: a fresh topic"
        ),
        Err(e) => {
            assert_eq!(e.code, BusErrorCode::StaleGeneration);
            assert_eq!(live_thread, thread, "register won: the same topic");
        }
    }
}

#[tokio::test]
async fn reconcile_rejects_routes_the_session_does_not_own() {
    let home = common::home();
    let fake = common::fake().await;
    let _leader = sessions(home.path(), &fake, 1, true).await;
    let (mut reader, mut writer, registered) = raw_register(home.path(), "mine", 1).await;
    let mut moved = registered.route.clone();
    moved.slot = Slot::from_index(25).unwrap();
    let foreign = Route {
        profile_key: "someone-else".into(),
        ..registered.route.clone()
    };
    writer
        .send(&ToLeader::Reconcile(Reconcile {
            id: 2,
            generation: 1,
            observed_epoch: registered.epoch,
            routes: vec![registered.route.clone(), moved, foreign],
        }))
        .await
        .unwrap();
    let ack = next_ack(&mut reader, 2).await;
    let answer = ack.reply::<Reconcile>().unwrap();
    assert_eq!(answer.accepted, vec!["mine".to_string()]);
    assert_eq!(answer.rejected.len(), 2);
    assert!(
        answer
            .rejected
            .iter()
            .any(|r| r.reason.starts_with("moved"))
    );
    assert!(
        answer
            .rejected
            .iter()
            .any(|r| r.reason.starts_with("unknown"))
    );
    // Sizes are bounded.
    let many = vec![registered.route.clone(); 100];
    writer
        .send(&ToLeader::Reconcile(Reconcile {
            id: 3,
            generation: 1,
            observed_epoch: registered.epoch,
            routes: many,
        }))
        .await
        .unwrap();
    let ack = next_ack(&mut reader, 3).await;
    assert_eq!(ack.outcome.unwrap_err().code, BusErrorCode::BadFrame);
}

#[tokio::test]
async fn a_second_restart_while_one_converges_joins_it() {
    let home = common::home();
    let fake = common::fake().await;
    let mut all = sessions(home.path(), &fake, 3, true).await;
    let leader = leader_index(&all);
    let (caller, second, stopped) = (leader, (leader + 1) % 3, (leader + 2) % 3);
    // A stopped session keeps the first restart converging for its window.
    all[stopped].signal(libc::SIGSTOP);
    let first = all[caller].call_later(
        "command/execute",
        json!({"name": "relay", "args": "restart"}),
    );
    // The second session is back on the new leader, so it heard the restart.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, text) = all[second].command("telegram-status", "").await;
        if text.contains("sync: synced@2") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never rejoined: {text}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (ok, text) = all[second].command("relay", "restart").await;
    assert!(!ok && text.contains("partial-timeout 2/3"), "{text}");
    let first = tokio::time::timeout(WAIT, first).await.unwrap().unwrap();
    let first = first["result"]["message"].as_str().unwrap().to_string();
    assert!(first.contains("partial-timeout 2/3"), "{first}");
    // One restart, not two: the first leader (epoch 1) and one successor.
    for session in [caller, second] {
        let (_, text) = all[session].command("telegram-status", "").await;
        assert!(text.contains("sync: synced@2"), "{text}");
    }
    all[stopped].signal(libc::SIGCONT);
}

/// A host that exits right after its last answer (`claude -p`, `pi -p`)
/// does not lose it: closing hands what is queued for the topic to the
/// leader first, which sends it.
#[tokio::test]
async fn the_last_answer_reaches_the_topic_when_the_host_exits_right_after_it() {
    let home = common::home();
    let fake = common::fake().await;
    // A follower, so the answer takes a bus hop before Telegram.
    let _leader = common::session(home.path(), &fake, "/tmp/lead", "lead").await;
    let mut s = common::session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = common::topic(&fake, "api").thread_id;
    let paragraph = "The build passed and every test is green. ".repeat(60);
    let last = format!("{paragraph}\n\n{paragraph}\n\n{paragraph}\n\nthe very last words");
    s.notify(
        "turn/ended",
        serde_json::json!({"assistantText": last, "toolCalls": []}),
    );
    s.close_stdin();
    assert!(s.wait_exit().await.is_some(), "the sidecar exits on EOF");
    let said = common::wait_topic_text(&fake, thread, "the very last words").await;
    assert!(
        said.iter().any(|t| t.contains("the very last words")),
        "the answer was lost when the host exited: {said:?}"
    );
}

//! Security properties with real processes: who may use the bus, what a
//! follower may make the leader do, what a stranger on Telegram can reach, and
//! that the bot token never leaves the process. The bus directory's modes are
//! checked in `tests/bus.rs` (`the_bus_directory_is_private_and_the_socket_is_0600`).

use crate::common;

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use agent_relay::fake_bot_api::{Fault, Inject, TopicInfo};
use agent_relay::protocol::bus::*;
use agent_relay::wire::{self, Received};
use common::{CHAT, FakeServer, Options, SECRET, Sidecar, TOKEN, USER, WAIT};
use interprocess::local_socket::tokio::Stream;
use interprocess::local_socket::traits::tokio::Stream as _;
use interprocess::local_socket::{GenericFilePath, ToFsName};
use serde_json::{Value, json};

const BOT: &str = "123456789";
/// `nobody` on Debian and most distributions.
const NOBODY: u32 = 65534;

fn connected(status: &str) -> bool {
    status.contains("● leader") || status.contains("● follower")
}

/// A host that takes every prompt.
fn accepting(options: Options<'_>) -> Options<'_> {
    options.answer(Arc::new(|method, _| match method {
        "agent/sendUserMessage" => Some(json!({"accepted": true})),
        "ui/confirm" => Some(json!({"confirmed": true})),
        _ => None,
    }))
}

async fn session(home: &Path, fake: &FakeServer, cwd: &str, name: &str) -> Sidecar {
    let mut s = Sidecar::spawn(accepting(Options::new(home).configured(fake)));
    s.handshake(cwd, name).await;
    s.wait_status(connected).await;
    s
}

/// The live topic whose name ends with `· name`.
fn topic(fake: &FakeServer, name: &str) -> TopicInfo {
    let suffix = format!("· {name}");
    let live: Vec<TopicInfo> = fake
        .api()
        .topics(CHAT)
        .into_iter()
        .filter(|t| !t.deleted && t.name.ends_with(&suffix))
        .collect();
    assert_eq!(live.len(), 1, "one live topic for {name}: {live:?}");
    live[0].clone()
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

/// Every file under `<home>/state/logs`, as text.
fn log_text(home: &Path) -> String {
    let dir = home.join("state").join("logs");
    let mut text = String::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("a directory entry").path();
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.push_str(&String::from_utf8_lossy(&bytes));
    }
    text
}

/// Waits until the logs under `home` contain `needle`. The file writer runs
/// in the background and the file cannot be awaited, so this polls.
async fn wait_log(home: &Path, needle: &str) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let text = log_text(home);
        if text.contains(needle) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the log never said {needle:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `agent-relay status`, run as `uid` (or as ourselves).
async fn status_cli(home: &Path, uid: Option<u32>) -> Output {
    let mut command = tokio::process::Command::new(common::binary());
    command
        .arg("status")
        .env_clear()
        .env("AGENT_RELAY_HOME", home)
        .env("TELEGRAM_BOT_TOKEN", TOKEN)
        .kill_on_drop(true);
    if let Some(uid) = uid {
        command.uid(uid).gid(uid);
    }
    tokio::time::timeout(WAIT, command.output())
        .await
        .expect("agent-relay status ends in time")
        .expect("spawn agent-relay status")
}

#[tokio::test]
async fn another_users_process_is_refused_by_the_leader() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: running a client as another uid needs root (CI runs as root)");
        return;
    }
    let home = common::home();
    let fake = common::fake().await;
    let _leader = session(home.path(), &fake, "/tmp/a", "api").await;

    // The socket's mode keeps other users out already; open it so that only
    // the peer-credential checks stand in the way. The CLI reaches it
    // through a hard link in a home of its own user (the path checks refuse
    // a symlinked run/, or a home of someone else).
    let socket = home.path().join("run").join(BOT).join("bus.sock");
    set_mode(&socket, 0o666);
    let linked_home = |owner: Option<u32>| {
        let linked = common::home();
        let bus = linked.path().join("run").join(BOT);
        std::fs::create_dir_all(&bus).expect("run/<bot>");
        std::fs::hard_link(&socket, bus.join("bus.sock")).expect("link bus.sock");
        for dir in [linked.path(), &linked.path().join("run"), &bus] {
            set_mode(dir, 0o700);
            if let Some(uid) = owner {
                std::os::unix::fs::chown(dir, Some(uid), Some(uid)).expect("chown");
            }
        }
        linked
    };
    let own_home = linked_home(None);
    let own = status_cli(own_home.path(), None).await;
    let own_text = String::from_utf8_lossy(&own.stdout);
    assert!(
        own.status.success() && own_text.contains("1 session(s)"),
        "the same route works for the leader's own user: {own:?}"
    );

    let foreign = linked_home(Some(NOBODY));
    let other = status_cli(foreign.path(), Some(NOBODY)).await;
    let stdout = String::from_utf8_lossy(&other.stdout);
    let stderr = String::from_utf8_lossy(&other.stderr);
    // Exit 3 would mean it never reached the socket: the test would prove nothing.
    assert_eq!(
        other.status.code(),
        Some(1),
        "stdout {stdout:?}, stderr {stderr:?}"
    );
    // Both ends check who is on the other: the client refuses to talk to a
    // leader of another user, and the leader refuses the client.
    assert!(
        stderr.contains("not asking") && stderr.contains("runs as uid 0"),
        "the client did not refuse the foreign leader: {stderr:?}"
    );
    assert!(!stdout.contains("session(s)"), "answered: {stdout}");
    wait_log(
        home.path(),
        &format!("refused a bus connection: the other end of the bus socket runs as uid {NOBODY}"),
    )
    .await;
}

#[tokio::test]
async fn the_token_appears_in_no_log_line_and_no_output() {
    let home = common::home();
    let fake = common::fake().await;
    let mut sidecars = Vec::new();
    for (i, name) in ["api", "web", "docs"].iter().enumerate() {
        sidecars.push(session(home.path(), &fake, &format!("/tmp/project-{i}"), name).await);
    }
    // Telegram misbehaves: the poller, an answer and provisioning each meet a
    // fault, so errors get formatted, logged and shown to the user.
    let api = fake.api();
    api.inject_fault("getUpdates", Fault::ServerError { code: 502 }, 2);
    api.inject_fault("sendMessage", Fault::TruncatedJson, 1);
    api.inject_fault("createForumTopic", Fault::GarbageBody, 1);
    for s in sidecars.iter_mut() {
        let (ok, text) = s.command("telegram-status", "--debug").await;
        assert!(ok, "{text}");
        let (ok, text) = s.command("relay", "status").await;
        assert!(ok, "{text}");
        s.notify(
            "turn/ended",
            json!({"assistantText": "done", "toolCalls": []}),
        );
    }
    let (_, text) = sidecars[2].command("telegram-disconnect", "").await;
    assert!(!text.is_empty());
    // Provisioning the topic again meets the garbage answer.
    let (_, text) = sidecars[2].command("telegram-connect", "").await;
    assert!(!text.is_empty());
    let cli = status_cli(home.path(), None).await;
    // The truncated answer has been met before Telegram goes away.
    wait_log(home.path(), "malformed answer").await;

    // A sidecar whose config file breaks on the token's own line: parse
    // errors like to quote the offending line.
    let broken_home = common::home();
    let config_dir = broken_home.path().join("config");
    std::fs::create_dir_all(&config_dir).expect("config dir");
    std::fs::write(
        config_dir.join("config.toml"),
        format!("bot_token = \"{TOKEN}\" chat_id = -100\n"),
    )
    .expect("write config.toml");
    let mut broken = Sidecar::spawn(Options::new(broken_home.path()));
    broken.handshake("/tmp/broken", "broken").await;
    let (_, text) = broken.command("telegram-status", "--debug").await;
    assert!(
        text.contains("config.toml"),
        "the config error is shown: {text}"
    );
    sidecars.push(broken);

    // Telegram goes away entirely: every call now fails below HTTP, where
    // client errors like to quote the URL, and the URL holds the token.
    fake.shutdown().await.expect("stop the fake");
    wait_log(home.path(), "network error").await;
    for s in sidecars.iter_mut() {
        s.close_stdin();
        s.wait_exit().await;
    }

    let logs = log_text(home.path()) + &log_text(broken_home.path());
    let mut outputs: Vec<String> = Vec::new();
    for s in &sidecars {
        let traffic = s.traffic();
        outputs.extend(traffic.iter().map(|(_, value)| value.to_string()));
        outputs.extend(s.garbage());
    }
    outputs.push(String::from_utf8_lossy(&cli.stdout).into_owned());
    outputs.push(String::from_utf8_lossy(&cli.stderr).into_owned());
    let in_logs = logs.matches(SECRET).count();
    let in_outputs: usize = outputs.iter().map(|o| o.matches(SECRET).count()).sum();
    // How often redaction masked a token on its way out; 0 as long as the
    // client drops URLs from its errors before anything formats them.
    let masked = logs.matches("123456789:<redacted>").count()
        + outputs
            .iter()
            .map(|o| o.matches("123456789:<redacted>").count())
            .sum::<usize>();
    eprintln!(
        "token scan: {} log bytes, {} output messages; secret found {in_logs} + {in_outputs} times, masked {masked} times",
        logs.len(),
        outputs.len()
    );
    for evidence in ["network error", "malformed answer", "configuration error"] {
        assert!(
            logs.contains(evidence),
            "no {evidence:?} in the logs to scan"
        );
    }
    assert_eq!(in_logs, 0, "the token is in the logs");
    assert_eq!(
        in_outputs, 0,
        "the token is on stdout or in the CLI's output"
    );
}

#[tokio::test]
async fn a_stranger_reaches_no_session_and_learns_nothing() {
    let home = common::home();
    let fake = common::fake().await;
    let a = session(home.path(), &fake, "/tmp/secret-project", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let api = fake.api();
    let stranger = 999;
    let write = |thread: Option<i64>, user: i64, text: &str| {
        api.inject_message(Inject {
            chat_id: CHAT,
            thread_id: thread,
            user_id: user,
            text: text.into(),
        })
    };
    // In the topic, outside any topic (where the allowed user gets the list of
    // sessions), and a command.
    write(Some(thread), stranger, "stranger in the topic");
    write(None, stranger, "stranger in general");
    write(Some(thread), stranger, "/relay status");
    // The allowed user follows in both places; once both are handled, the
    // stranger's earlier updates have been handled too.
    write(None, USER, "which sessions?");
    write(Some(thread), USER, "the real one");
    a.wait_for("the allowed prompt", |m| {
        m["method"] == "agent/sendUserMessage" && m["params"]["text"] == "the real one"
    })
    .await;
    let overview = api
        .wait_until(
            |api| {
                let general: Vec<String> = api
                    .messages(CHAT, None)
                    .into_iter()
                    .map(|m| m.plain_text)
                    .collect();
                general
                    .iter()
                    .any(|t| t.contains("/tmp/secret-project"))
                    .then_some(general)
            },
            WAIT,
        )
        .await
        .expect("the allowed user gets the list of sessions");
    assert_eq!(
        overview
            .iter()
            .filter(|t| t.contains("/tmp/secret-project"))
            .count(),
        1,
        "the list went to the stranger too: {overview:?}"
    );

    let prompts: Vec<Value> = a
        .messages()
        .into_iter()
        .filter(|m| m["method"] == "agent/sendUserMessage")
        .collect();
    assert_eq!(prompts.len(), 1, "{prompts:?}");
    let echoed: Vec<Value> = api
        .calls()
        .into_iter()
        .map(|c| c.params)
        .filter(|p| p.to_string().contains("stranger") || p.to_string().contains("/relay"))
        .collect();
    assert!(
        echoed.is_empty(),
        "a stranger's text reached Telegram: {echoed:?}"
    );
}

/// A registered raw bus client: what a compromised or buggy follower can send.
struct RawFollower {
    reader: wire::WireReader,
    writer: wire::WireWriter,
    generation: Generation,
    next_id: u64,
    route: Route,
}

impl RawFollower {
    async fn register(home: &Path) -> Self {
        let path = home.join("run").join(BOT).join("bus.sock");
        let name = path.to_fs_name::<GenericFilePath>().expect("a socket name");
        let (reader, writer) = wire::split(Stream::connect(name).await.expect("connect"));
        let mut me = Self {
            reader,
            writer,
            generation: 1,
            next_id: 0,
            route: Route {
                profile_key: String::new(),
                slot: Slot::from_index(0).expect("A"),
                target: None,
                topic_name: String::new(),
            },
        };
        let ack = me
            .request(|id, generation| {
                ToLeader::Register(Register {
                    id,
                    instance_id: "raw-instance".into(),
                    instance_secret: "raw-instance-secret-0123456789".into(),
                    registration_generation: generation,
                    profile_key: "raw".into(),
                    session_name: "raw".into(),
                    cwd: "/raw".into(),
                    pid: std::process::id(),
                    carried: None,
                    protocol_version: BUS_PROTOCOL_VERSION,
                    retry_provisioning: false,
                    left: None,
                    launch: None,
                })
            })
            .await;
        assert!(ack.outcome.is_ok(), "register: {ack:?}");
        let registered = ack.reply::<Register>().expect("Registered");
        me.route = registered.route;
        me
    }

    async fn request(&mut self, make: impl FnOnce(u64, Generation) -> ToLeader) -> Ack {
        self.next_id += 1;
        let id = self.next_id;
        self.writer
            .send(&make(id, self.generation))
            .await
            .expect("send");
        loop {
            let frame = tokio::time::timeout(WAIT, self.reader.recv::<FromLeader>())
                .await
                .expect("the leader answers in time")
                .expect("read");
            match frame {
                Some(Received::Envelope(FromLeader::Ack(ack))) if ack.id == Some(id) => {
                    return ack;
                }
                Some(_) => continue,
                None => panic!("the leader closed the connection"),
            }
        }
    }

    async fn topic(&mut self, op: TopicOp) -> Ack {
        self.request(|id, generation| {
            ToLeader::Topic(TopicRequest {
                id,
                generation,
                op,
                background: false,
            })
        })
        .await
    }

    /// Sends a hand-written frame, as a process that is no sidecar could;
    /// its `id` and `generation` are filled in.
    async fn raw(&mut self, mut frame: Value) -> Ack {
        self.request(|id, generation| {
            frame["id"] = json!(id);
            frame["generation"] = json!(generation);
            serde_json::from_value(frame).expect("a valid envelope")
        })
        .await
    }
}

fn code(ack: &Ack) -> Option<BusErrorCode> {
    ack.outcome.as_ref().err().map(|e| e.code)
}

fn text(text: &str) -> TopicOp {
    TopicOp::SendText(SendText {
        text: text.into(),
        format: TextFormat::Plain,
        buttons: None,
        reply_to: None,
    })
}

/// Typed requests name no chat and no topic: a follower reaches its own
/// topic and nothing else, and can edit, reply to or answer only what is
/// its own (issue: a member edited a message in another session's topic).
#[tokio::test]
async fn a_follower_cannot_make_the_leader_act_outside_its_topic() {
    let home = common::home();
    let fake = common::fake().await;
    let owner = session(home.path(), &fake, "/tmp/a", "api").await;
    let victim = topic(&fake, "api").thread_id;
    // A message of the victim's: an answer the agent posted, and a tap on
    // the victim's topic that the raw follower learns the id of.
    owner.notify("turn/ended", json!({"assistantText": "victim-answer"}));
    let posted = common::wait_topic_text(&fake, victim, "victim-answer").await;
    assert!(!posted.is_empty());
    let victims_message = fake
        .api()
        .messages(CHAT, Some(victim))
        .into_iter()
        .find(|m| m.text.contains("victim-answer"))
        .expect("the victim's answer")
        .message_id;
    let mut raw = RawFollower::register(home.path()).await;
    let own = raw.route.target.expect("the raw session got a topic");
    assert_ne!(own.thread_id, victim);

    let marker = "forbidden-marker";
    let edit = TopicOp::EditText(EditText {
        message_id: victims_message,
        text: marker.into(),
        format: TextFormat::Plain,
        buttons: None,
    });
    let buttons = TopicOp::EditButtons(EditButtons {
        message_id: victims_message,
        buttons: None,
    });
    let reply = TopicOp::SendText(SendText {
        reply_to: Some(victims_message),
        ..match text(marker) {
            TopicOp::SendText(s) => s,
            _ => unreachable!(),
        }
    });
    let close = TopicOp::CloseAsk(CloseAsk {
        token: "a-token-of-someone-else".into(),
        message_id: victims_message,
        outcome: marker.into(),
    });
    for (what, op) in [
        ("edit another session's message", edit),
        ("remove another session's buttons", buttons),
        ("reply to another session's message", reply),
        ("close a question it never asked", close),
    ] {
        let ack = raw.topic(op).await;
        assert_eq!(code(&ack), Some(BusErrorCode::Forbidden), "{what}: {ack:?}");
    }
    // Naming a target anyway: the names are not part of the protocol and
    // change nothing, and the old untyped call is no envelope at all.
    let ack = raw
        .raw(json!({"kind": "topic", "op": {
            "type": "sendText", "text": "allowed", "format": "plain",
            "chatId": CHAT, "threadId": victim, "message_thread_id": victim}}))
        .await;
    assert!(ack.outcome.is_ok(), "{ack:?}");
    raw.writer
        .send(&json!({"kind": "telegram", "id": 92, "generation": 1,
            "method": "deleteForumTopic", "params": {"chat_id": CHAT, "message_thread_id": victim}}))
        .await
        .expect("send");
    let refused = loop {
        match tokio::time::timeout(WAIT, raw.reader.recv::<FromLeader>())
            .await
            .expect("an answer")
            .expect("read")
        {
            Some(Received::Envelope(FromLeader::Ack(ack))) if ack.id == Some(92) => break ack,
            Some(_) => continue,
            None => panic!("closed"),
        }
    };
    assert_eq!(code(&refused), Some(BusErrorCode::BadFrame), "{refused:?}");

    let allowed = fake.api().messages(CHAT, Some(own.thread_id));
    assert!(
        allowed.iter().any(|m| m.text == "allowed"),
        "the allowed text reached the raw session's own topic: {allowed:?}"
    );
    assert!(
        fake.api()
            .messages(CHAT, Some(victim))
            .iter()
            .all(|m| m.text != "allowed"),
        "nothing reached the victim's topic"
    );

    let calls = fake.api().calls();
    let leaked: Vec<_> = calls
        .iter()
        .filter(|c| c.method == "deleteForumTopic" || c.params.to_string().contains(marker))
        .collect();
    assert!(
        leaked.is_empty(),
        "forbidden calls reached Telegram: {leaked:?}"
    );
    assert!(
        fake.api().topics(CHAT).iter().all(|t| !t.deleted),
        "a topic was deleted"
    );
}

/// Thirty `/start <guess>` DMs from a stranger neither delay the allowed
/// user's message nor earn thirty answers: the leader answers off the
/// routing path, once per window, and a chat that keeps guessing hears
/// nothing more. (Before, each refusal was awaited in the routing loop at
/// Telegram's pace of one message a second per private chat, so the
/// allowed message waited about 30 s: longer than this test's wait.)
#[tokio::test]
async fn a_stranger_guessing_pairing_codes_delays_nobody_and_hears_once() {
    let home = common::home();
    let fake = common::fake_with(common::FakeConfig {
        rate_limits: true,
        ..common::FakeConfig::default()
    })
    .await;
    let a = session(home.path(), &fake, "/tmp/a", "api").await;
    let thread = topic(&fake, "api").thread_id;
    let api = fake.api();
    let stranger = 4242;
    api.add_private_chat(stranger, "Mallory");
    for guess in 0..30 {
        api.inject_message(Inject {
            chat_id: stranger,
            thread_id: None,
            user_id: stranger,
            text: format!("/start guess{guess:04}"),
        });
    }
    let sent = std::time::Instant::now();
    api.inject_message(Inject {
        chat_id: CHAT,
        thread_id: Some(thread),
        user_id: USER,
        text: "after the flood".into(),
    });
    a.wait_for("the allowed prompt", |m| {
        m["method"] == "agent/sendUserMessage" && m["params"]["text"] == "after the flood"
    })
    .await;
    // A figure for the record, not a limit: it was 28 s before the fix.
    eprintln!(
        "after 30 stranger guesses, the allowed message reached its host in {:?}",
        sent.elapsed()
    );
    let refusals = api
        .wait_until(
            |api| {
                let said = api.messages(stranger, None);
                (!said.is_empty()).then_some(said)
            },
            WAIT,
        )
        .await
        .expect("the stranger is told once that the code is wrong");
    // Give the leader every chance to say more before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let said = api.messages(stranger, None);
    assert_eq!(said.len(), 1, "one refusal per window: {said:?}");
    assert!(refusals[0].plain_text.contains("wrong or has expired"));
}

/// Registering under another session's instance id (visible in `status`)
/// with a huge generation takes nothing over: the instance's secret is
/// missing, so the leader refuses, and the victim keeps its topic.
#[tokio::test]
async fn a_generation_jump_cannot_take_over_another_session() {
    let home = common::home();
    let fake = common::fake().await;
    let victim = session(home.path(), &fake, "/tmp/victim", "victim").await;
    let thread = topic(&fake, "victim").thread_id;
    let mut raw = RawFollower::register(home.path()).await;
    let status: BusStatus = raw
        .request(|id, _| ToLeader::Status(StatusQuery { id, cluster: false }))
        .await
        .reply::<StatusQuery>()
        .expect("status");
    let target = status
        .sessions
        .iter()
        .find(|s| s.session_name == "victim")
        .expect("the victim is listed");
    let hijack = raw
        .request(|id, _| {
            ToLeader::Register(Register {
                id,
                instance_id: target.instance_id.clone(),
                instance_secret: "a-guess-at-the-secret-of-it".into(),
                registration_generation: u64::MAX,
                profile_key: target.profile_key.clone(),
                session_name: "victim".into(),
                cwd: "/tmp/victim".into(),
                pid: 1,
                carried: None,
                protocol_version: BUS_PROTOCOL_VERSION,
                retry_provisioning: false,
                left: None,
                launch: None,
            })
        })
        .await;
    assert_eq!(code(&hijack), Some(BusErrorCode::Forbidden), "{hijack:?}");
    // The victim still owns its topic: a message there reaches it.
    fake.api().inject_message(Inject {
        chat_id: CHAT,
        thread_id: Some(thread),
        user_id: USER,
        text: "still yours".into(),
    });
    victim
        .wait_for("the victim's prompt", |m| {
            m["method"] == "agent/sendUserMessage" && m["params"]["text"] == "still yours"
        })
        .await;
}

/// A relay that somebody may drive never hands out a pairing code: a code
/// minted by any bus member could be redeemed by a stranger.
#[tokio::test]
async fn pairing_codes_are_only_minted_while_nobody_is_paired() {
    let home = common::home();
    let fake = common::fake().await;
    let _a = session(home.path(), &fake, "/tmp/a", "api").await;
    let mut raw = RawFollower::register(home.path()).await;
    let pair = raw
        .request(|id, generation| ToLeader::Pair(Pair { id, generation }))
        .await;
    assert_eq!(code(&pair), Some(BusErrorCode::Forbidden), "{pair:?}");
}

/// Connections that never register cannot pile up: beyond 32 at once the
/// oldest idle one is closed for the newcomer, and each is closed after 5 s
/// anyway; a real session still joins meanwhile.
#[tokio::test]
async fn idle_unregistered_connections_are_bounded_in_number_and_time() {
    let home = common::home();
    let fake = common::fake().await;
    let _leader = session(home.path(), &fake, "/tmp/a", "api").await;
    let path = home.path().join("run").join(BOT).join("bus.sock");
    let mut idle = Vec::new();
    for _ in 0..40 {
        let name = path
            .clone()
            .to_fs_name::<GenericFilePath>()
            .expect("a socket name");
        idle.push(wire::split(Stream::connect(name).await.expect("connect")));
    }
    // Each connection ends (EOF) within the 5 s allowance plus slack; the
    // ones over the limit end at once.
    let mut closed = 0;
    for (reader, _writer) in &mut idle {
        let ended = tokio::time::timeout(WAIT, reader.recv::<FromLeader>()).await;
        if matches!(ended, Ok(Ok(None)) | Ok(Err(_))) {
            closed += 1;
        }
    }
    assert_eq!(closed, 40, "every idle connection was closed");
    let b = session(home.path(), &fake, "/tmp/b", "web").await;
    assert!(connected(&b.latest_status().unwrap_or_default()));
}

/// A same-uid flood of idle connections, reconnecting as soon as one is
/// closed, keeps nobody out: `agent-relay status` is answered and a new
/// session joins, since each newcomer closes the oldest connection that
/// has not said a word (a status query and a member speak at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_keeps_out_neither_status_nor_a_new_session() {
    let home = common::home();
    let fake = common::fake().await;
    let _leader = session(home.path(), &fake, "/tmp/a", "api").await;
    let path = home.path().join("run").join(BOT).join("bus.sock");
    let (held_tx, mut held) = tokio::sync::mpsc::unbounded_channel::<()>();
    let flood: Vec<_> = (0..40)
        .map(|_| {
            let path = path.clone();
            let held_tx = held_tx.clone();
            tokio::spawn(async move {
                loop {
                    let name = path
                        .clone()
                        .to_fs_name::<GenericFilePath>()
                        .expect("a name");
                    let Ok(stream) = Stream::connect(name).await else {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    let _ = held_tx.send(());
                    let (mut reader, _writer) = wire::split(stream);
                    // Idle until the leader closes it; then at once again.
                    while let Ok(Some(_)) = reader.recv::<FromLeader>().await {}
                }
            })
        })
        .collect();
    // The flood is in place: every one of the 40 connected at least once.
    for _ in 0..40 {
        tokio::time::timeout(WAIT, held.recv())
            .await
            .expect("the flood connects")
            .expect("the flood runs");
    }
    let status = status_cli(home.path(), None).await;
    let said = String::from_utf8_lossy(&status.stdout).into_owned()
        + &String::from_utf8_lossy(&status.stderr);
    assert!(status.status.success(), "status under the flood: {said}");
    assert!(said.contains("api"), "{said}");
    let b = session(home.path(), &fake, "/tmp/b", "web").await;
    assert!(connected(&b.latest_status().unwrap_or_default()));
    for task in flood {
        task.abort();
    }
}

/// The session list names local paths: an allowed user gets it in the
/// relay's own chat and in a private chat, never in some other group.
#[tokio::test]
async fn the_session_list_stays_in_the_relays_own_chats() {
    let home = common::home();
    let fake = common::fake().await;
    let _a = session(home.path(), &fake, "/tmp/secret-path", "api").await;
    let api = fake.api();
    let elsewhere = -1_002_000_000_777;
    api.add_supergroup(
        elsewhere,
        "Some other group",
        agent_relay::fake_bot_api::BotRights::FULL,
    );
    for chat in [elsewhere, CHAT] {
        api.inject_message(Inject {
            chat_id: chat,
            thread_id: None,
            user_id: USER,
            text: "what runs?".into(),
        });
    }
    api.wait_until(
        |api| {
            api.messages(CHAT, None)
                .iter()
                .any(|m| m.plain_text.contains("/tmp/secret-path"))
                .then_some(())
        },
        WAIT,
    )
    .await
    .expect("the list in the relay's chat");
    assert!(
        api.messages(elsewhere, None).is_empty(),
        "the list leaked into another group: {:?}",
        api.messages(elsewhere, None)
    );
}

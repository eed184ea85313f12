//! A scripted host for integration tests: spawns the real `agent-relay`
//! binary with its own `AGENT_RELAY_HOME`, speaks JSON-RPC to it over its
//! stdio and records everything it says. Every wait has a timeout; every
//! process is killed when its `Sidecar` is dropped.

mod asks;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::process::Command;
use tokio::sync::{Notify, oneshot};

pub use agent_relay::fake_bot_api::{
    DEFAULT_FORUM_CHAT_ID as CHAT, DEFAULT_USER_ID as USER, FakeBotApi, FakeConfig, FakeServer,
};
pub use agent_relay::host_client::Direction;
use agent_relay::host_client::{self, FromSidecar, Link, Said};
pub use asks::{
    button, first_button, has_buttons, is_settled, question, question_in, settled_label, tap,
    tap_answer, tap_in,
};

/// The fake's default token.
pub const TOKEN: &str = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_";
/// The secret part of [`TOKEN`], which must never appear in any output.
pub const SECRET: &str = "AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_";

/// A fake Bot API with the usual test world (a forum with full rights and
/// user [`USER`]).
pub async fn fake() -> FakeServer {
    fake_with(FakeConfig::default()).await
}

pub async fn fake_with(config: FakeConfig) -> FakeServer {
    let server = FakeBotApi::start(config)
        .await
        .expect("start the fake Bot API");
    server.api().add_default_chats();
    server
}
pub const WAIT: Duration = Duration::from_secs(20);

pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_agent-relay"))
}

/// Answers the sidecar's own requests (`ui/confirm` and friends): given the
/// method and params, the result to send, or `None` to leave it unanswered.
pub type AutoAnswer = Arc<dyn Fn(&str, &Value) -> Option<Value> + Send + Sync>;

#[derive(Default)]
struct Inbox {
    /// Notifications and requests from the sidecar, in order.
    messages: Vec<Value>,
    /// Lines on stdout that are not JSON (stdout must carry protocol only).
    garbage: Vec<String>,
    closed: bool,
}

/// A real sidecar process played by the crate's one host client, with an
/// inbox of everything it said and optional auto-answers to its requests.
pub struct Sidecar {
    process: host_client::Sidecar,
    link: Link,
    inbox: Arc<Mutex<Inbox>>,
    changed: Arc<Notify>,
}

pub struct Options<'a> {
    pub home: &'a Path,
    pub env: Vec<(String, String)>,
    pub auto_answer: Option<AutoAnswer>,
    /// The command line after the binary (default `stdio`).
    pub args: Vec<String>,
    /// Run as this uid (and gid) instead of the test's own: needs root.
    pub uid: Option<u32>,
}

impl<'a> Options<'a> {
    pub fn new(home: &'a Path) -> Self {
        Self {
            home,
            env: Vec::new(),
            auto_answer: None,
            args: vec!["stdio".into()],
            uid: None,
        }
    }

    /// Runs the sidecar as `uid` (see [`unused_uid`]); the test must be root.
    pub fn run_as(mut self, uid: u32) -> Self {
        self.uid = Some(uid);
        self
    }

    /// Runs `agent-relay mcp` (Claude Code's MCP server) instead.
    pub fn mcp(mut self) -> Self {
        self.args = vec!["mcp".into()];
        self
    }

    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// The env of a sidecar configured for `fake`'s bot, its forum and user.
    pub fn configured(self, fake: &FakeServer) -> Self {
        self.env("TELEGRAM_BOT_TOKEN", &fake.api().token())
            .env("AGENT_RELAY_CHAT_ID", &CHAT.to_string())
            .env("AGENT_RELAY_ALLOWED_USERS", &USER.to_string())
            .env("AGENT_RELAY_API_URL", &fake.url())
    }

    /// The env of a sidecar of `fake`'s bot in the private-chat mode: no
    /// chat configured, user [`USER`] allowed, so the topics go into that
    /// user's private chat with the bot.
    pub fn private_chat(self, fake: &FakeServer) -> Self {
        self.env("TELEGRAM_BOT_TOKEN", &fake.api().token())
            .env("AGENT_RELAY_ALLOWED_USERS", &USER.to_string())
            .env("AGENT_RELAY_API_URL", &fake.url())
    }

    pub fn answer(mut self, auto: AutoAnswer) -> Self {
        self.auto_answer = Some(auto);
        self
    }
}

impl Sidecar {
    pub fn spawn(options: Options<'_>) -> Sidecar {
        let mut command = Command::new(binary());
        command
            .args(&options.args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("AGENT_RELAY_HOME", options.home)
            .env("AGENT_RELAY_LOG", "debug")
            .stderr(Stdio::null());
        for (k, v) in &options.env {
            command.env(k, v);
        }
        if let Some(uid) = options.uid {
            // std drops the supplementary groups when root sets a uid.
            command.uid(uid).gid(uid);
        }
        let (process, mut incoming) =
            host_client::Sidecar::spawn_with(command, true).expect("spawn agent-relay");
        let link = process.link().clone();
        let inbox = Arc::new(Mutex::new(Inbox::default()));
        let changed = Arc::new(Notify::new());
        {
            let inbox = inbox.clone();
            let changed = changed.clone();
            let link = link.clone();
            let auto = options.auto_answer.clone();
            tokio::spawn(async move {
                while let Some(Said { message, .. }) = incoming.recv().await {
                    let value = match message {
                        FromSidecar::NotJson(line) => {
                            inbox.lock().unwrap().garbage.push(line);
                            changed.notify_waiters();
                            continue;
                        }
                        FromSidecar::Response(response) => response,
                        FromSidecar::Notification { method, params } => {
                            json!({"jsonrpc": "2.0", "method": method, "params": params})
                        }
                        FromSidecar::Request { id, method, params } => {
                            if let Some(result) =
                                auto.as_ref().and_then(|auto| auto(&method, &params))
                            {
                                let _ = link.respond(id.clone(), result);
                            }
                            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
                        }
                    };
                    inbox.lock().unwrap().messages.push(value);
                    changed.notify_waiters();
                }
                inbox.lock().unwrap().closed = true;
                changed.notify_waiters();
            });
        }
        Sidecar {
            process,
            link,
            inbox,
            changed,
        }
    }

    pub fn pid(&self) -> i32 {
        self.process.pid().expect("running") as i32
    }

    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    pub fn link(&self) -> &Link {
        &self.link
    }

    /// Every message both ways, for checking against the schemas.
    pub fn traffic(&self) -> Vec<(Direction, Value)> {
        self.link.traffic()
    }

    /// Writes one raw line.
    pub fn send_line(&self, line: &str) {
        let _ = self.link.send_line(line);
    }

    /// Sends a request and waits for its response (the whole message).
    pub async fn call_raw(&mut self, method: &str, params: Value) -> Value {
        self.link
            .request_message(method, params, WAIT)
            .await
            .unwrap_or_else(|e| panic!("no response to {method}: {e}"))
    }

    /// Sends a request whose response is a waiter of its own, for
    /// overlapping requests.
    pub fn call_later(&mut self, method: &str, params: Value) -> oneshot::Receiver<Value> {
        self.link
            .request_later(method, params)
            .expect("the sidecar is running")
    }

    /// Sends a request and returns its `result`, panicking on an error.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let response = self.call_raw(method, params).await;
        assert!(
            response.get("error").is_none(),
            "{method} failed: {response}"
        );
        response["result"].clone()
    }

    pub fn notify(&self, method: &str, params: Value) {
        let _ = self.link.notify(method, params);
    }

    /// `initialize` + `initialized` as a host named `test-host` in `cwd`.
    pub async fn handshake(&mut self, cwd: &str, session_name: &str) -> Value {
        let result = self
            .call(
                "initialize",
                json!({
                    "protocolVersion": 1,
                    "host": {"name": "test-host", "version": "1.0"},
                    "pid": std::process::id(),
                    "cwd": cwd,
                    "session": {"id": format!("id-{session_name}"), "name": session_name},
                    "hasUI": true
                }),
            )
            .await;
        self.notify("initialized", json!({}));
        result
    }

    /// Runs a command and returns `(ok, message)`.
    pub async fn command(&mut self, name: &str, args: &str) -> (bool, String) {
        let result = self
            .call("command/execute", json!({"name": name, "args": args}))
            .await;
        (
            result["ok"].as_bool().expect("ok is a bool"),
            result["message"]
                .as_str()
                .expect("message is a string")
                .to_string(),
        )
    }

    /// Waits for a message from the sidecar matching `pred`; returns it.
    pub async fn wait_for(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        self.wait_for_within(what, WAIT, pred)
            .await
            .unwrap_or_else(|| {
                let inbox = self.inbox.lock().unwrap();
                panic!("timed out waiting for {what}; got {:#?}", inbox.messages)
            })
    }

    pub async fn wait_for_within(
        &self,
        _what: &str,
        timeout: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let inbox = self.inbox.lock().unwrap();
                if let Some(found) = inbox.messages.iter().rev().find(|m| pred(m)) {
                    return Some(found.clone());
                }
                if inbox.closed {
                    return None;
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }

    /// Waits until the latest `ui/setStatus` text satisfies `pred`.
    pub async fn wait_status(&self, pred: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let latest = self.latest_status();
            if let Some(text) = &latest
                && pred(text)
            {
                return text.clone();
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("status line never matched; latest {latest:?}");
            }
        }
    }

    pub fn latest_status(&self) -> Option<String> {
        let inbox = self.inbox.lock().unwrap();
        inbox
            .messages
            .iter()
            .rev()
            .find(|m| m["method"] == "ui/setStatus")
            .and_then(|m| m["params"]["text"].as_str().map(String::from))
    }

    pub fn messages(&self) -> Vec<Value> {
        self.inbox.lock().unwrap().messages.clone()
    }

    pub fn garbage(&self) -> Vec<String> {
        self.inbox.lock().unwrap().garbage.clone()
    }

    /// Closes stdin, as a host does when it goes away.
    pub fn close_stdin(&mut self) {
        self.link.close();
    }

    /// Waits for the process to exit; returns its exit code.
    pub async fn wait_exit(&mut self) -> Option<i32> {
        self.process
            .wait_exit(WAIT)
            .await
            .expect("sidecar did not exit in time")
    }

    pub fn signal(&self, signal: i32) {
        assert!(self.process.signal(signal), "kill({signal}) failed");
    }

    pub async fn kill9(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.process.wait_exit(WAIT).await;
    }
}

/// A fresh home with nothing configured.
pub fn home() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("relay-test-")
        .tempdir()
        .expect("tempdir")
}

/// Whether the tests run as root, and so can play a second user.
pub fn root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Says why a test that needs a second uid does not run, when not root (a
/// developer's machine); CI runs as root, where it always runs.
pub fn skip_unless_root(what: &str) -> bool {
    if !root() {
        eprintln!("skipped: {what} needs root to run a second uid (CI runs as root)");
    }
    !root()
}

/// A uid no account has, from `from` on.
pub fn unused_uid(from: u32) -> u32 {
    (from..from + 1000)
        // SAFETY: getpwuid with any uid; the result is only compared to null.
        .find(|&uid| unsafe { libc::getpwuid(uid).is_null() })
        .expect("a free uid")
}

/// Gives `path` and everything under it to `uid` (links themselves, never
/// what they point to).
pub fn chown_all(path: &Path, uid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(uid))
        .unwrap_or_else(|e| panic!("chown {uid} {}: {e}", path.display()));
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        for entry in std::fs::read_dir(path).expect("read_dir").flatten() {
            chown_all(&entry.path(), uid);
        }
    }
}

/// Registered and reconciled: nothing after the role (no "syncing").
pub fn connected(status: &str) -> bool {
    status.ends_with("● leader") || status.ends_with("● follower")
}

/// A host that takes every prompt, aborts on request and confirms dialogs.
pub fn accepting(options: Options<'_>) -> Options<'_> {
    options.answer(Arc::new(|method, _| match method {
        "agent/sendUserMessage" => Some(json!({"accepted": true})),
        "agent/abort" => Some(json!({})),
        "ui/confirm" => Some(json!({"confirmed": true})),
        _ => None,
    }))
}

/// Spawns an accepting sidecar with `options`, hands it over as `cwd`/`name`
/// and waits until it is on the bus.
pub async fn start(options: Options<'_>, cwd: &str, name: &str) -> Sidecar {
    let mut s = Sidecar::spawn(accepting(options));
    s.handshake(cwd, name).await;
    s.wait_status(connected).await;
    s
}

/// Writes `home`'s config.toml with `text`, private as the relay wants it.
pub fn write_config(home: &Path, text: &str) {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    let dir = home.join("config");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .expect("config dir");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(dir.join("config.toml"))
        .expect("config.toml");
    std::io::Write::write_all(&mut file, text.as_bytes()).expect("write config");
}

/// An accepting session of `fake`'s bot in `home`, on the bus.
pub async fn session(home: &Path, fake: &FakeServer, cwd: &str, name: &str) -> Sidecar {
    start(Options::new(home).configured(fake), cwd, name).await
}

/// The one live topic whose name ends with `· name`.
pub fn topic(fake: &FakeServer, name: &str) -> agent_relay::fake_bot_api::TopicInfo {
    topic_in(fake, CHAT, name)
}

/// The one live topic of `chat` whose name ends with `· name`.
pub fn topic_in(fake: &FakeServer, chat: i64, name: &str) -> agent_relay::fake_bot_api::TopicInfo {
    let suffix = format!("· {name}");
    let live: Vec<_> = fake
        .api()
        .topics(chat)
        .into_iter()
        .filter(|t| !t.deleted && t.name.ends_with(&suffix))
        .collect();
    assert_eq!(
        live.len(),
        1,
        "expected one live topic for {name}: {live:?}"
    );
    live[0].clone()
}

/// A user message in the forum (`thread` None: General).
pub fn inject(fake: &FakeServer, thread: Option<i64>, user: i64, text: &str) -> i64 {
    inject_in(fake, CHAT, thread, user, text)
}

/// A user message in `chat` (`thread` None: outside the topics).
pub fn inject_in(fake: &FakeServer, chat: i64, thread: Option<i64>, user: i64, text: &str) -> i64 {
    fake.api()
        .inject_message(agent_relay::fake_bot_api::Inject {
            chat_id: chat,
            thread_id: thread,
            user_id: user,
            text: text.into(),
        })
}

/// Where a bot's topics are: a forum group (`chat_id` configured), or the
/// paired user's private chat (none). The routing tests run in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chat {
    Group,
    Private,
}

impl Chat {
    /// The chat the topics are in.
    pub fn id(self) -> i64 {
        match self {
            Self::Group => CHAT,
            Self::Private => USER,
        }
    }

    /// The chat the topics are not in.
    pub fn other(self) -> i64 {
        match self {
            Self::Group => USER,
            Self::Private => CHAT,
        }
    }

    /// `options` of `fake`'s bot with the topics here.
    pub fn options<'a>(self, options: Options<'a>, fake: &FakeServer) -> Options<'a> {
        match self {
            Self::Group => options.configured(fake),
            Self::Private => options.private_chat(fake),
        }
    }

    /// An accepting session on the bus with its topic here.
    pub async fn session(self, home: &Path, fake: &FakeServer, cwd: &str, name: &str) -> Sidecar {
        start(self.options(Options::new(home), fake), cwd, name).await
    }

    /// The thread of the one live topic here whose name ends with `· name`.
    pub fn topic(self, fake: &FakeServer, name: &str) -> i64 {
        topic_in(fake, self.id(), name).thread_id
    }

    /// A message from `user` here (`thread` None: outside the topics).
    pub fn inject(self, fake: &FakeServer, thread: Option<i64>, user: i64, text: &str) -> i64 {
        inject_in(fake, self.id(), thread, user, text)
    }

    /// [`wait_topic_text`] here.
    pub async fn wait_text(self, fake: &FakeServer, thread: i64, needle: &str) -> Vec<String> {
        wait_topic_text_in(fake, self.id(), thread, needle).await
    }
}

/// How many topics were created (and confirmed).
pub fn created_topics(fake: &FakeServer) -> usize {
    fake.api()
        .calls()
        .iter()
        .filter(|c| c.method == "createForumTopic" && c.ok)
        .count()
}

/// The pairing code of the deep link `/telegram-connect` answered with.
pub fn pairing_code(answer: &str) -> String {
    let url = answer
        .split_whitespace()
        .find(|w| w.starts_with("https://t.me/relay_test_bot?start="))
        .unwrap_or_else(|| panic!("no link in {answer}"));
    url.split("start=").nth(1).unwrap_or_default().to_string()
}

/// Every `agent/sendUserMessage` the sidecar sent its host.
pub fn prompts(s: &Sidecar) -> Vec<Value> {
    s.messages()
        .into_iter()
        .filter(|m| m["method"] == "agent/sendUserMessage")
        .collect()
}

pub async fn wait_prompt(s: &Sidecar, text: &str) -> Value {
    s.wait_for(&format!("prompt {text:?}"), |m| {
        m["method"] == "agent/sendUserMessage" && m["params"]["text"] == text
    })
    .await
}

/// Waits until a message containing `needle` is in the topic; returns the
/// topic's texts as displayed.
pub async fn wait_topic_text(fake: &FakeServer, thread: i64, needle: &str) -> Vec<String> {
    wait_topic_text_in(fake, CHAT, thread, needle).await
}

/// [`wait_topic_text`] in `chat`.
pub async fn wait_topic_text_in(
    fake: &FakeServer,
    chat: i64,
    thread: i64,
    needle: &str,
) -> Vec<String> {
    let needle = needle.to_string();
    fake.api()
        .wait_until(
            |api| {
                let texts: Vec<String> = api
                    .messages(chat, Some(thread))
                    .into_iter()
                    .map(|m| m.plain_text)
                    .collect();
                texts.iter().any(|t| t.contains(&needle)).then_some(texts)
            },
            WAIT,
        )
        .await
        .unwrap_or_else(|_| panic!("{needle:?} never arrived in thread {thread}"))
}

/// A `register` envelope as a raw bus client sends it: instance `raw-<profile>`.
pub fn raw_register(
    id: u64,
    profile: &str,
    generation: u64,
) -> agent_relay::protocol::bus::Register {
    agent_relay::protocol::bus::Register {
        id,
        instance_id: format!("raw-{profile}"),
        instance_secret: format!("raw-{profile}-secret-of-this-test"),
        registration_generation: generation,
        profile_key: profile.into(),
        session_name: profile.into(),
        cwd: "/raw".into(),
        pid: 1,
        carried: None,
        protocol_version: agent_relay::protocol::bus::BUS_PROTOCOL_VERSION,
        retry_provisioning: false,
        left: None,
        launch: None,
    }
}

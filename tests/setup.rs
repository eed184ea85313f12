//! `agent-relay setup` as a person runs it: the real binary in a
//! pseudo-terminal (rexpect), typing answers, against the in-process fake
//! Bot API, whose users press Start and write in groups. Every wait is
//! bounded by the pty's timeout, every process is killed when its session
//! is dropped, and each test has its own home.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use agent_relay::fake_bot_api::{BotRights, FakeServer, Inject};
use common::{CHAT, FakeConfig, SECRET, TOKEN, USER};
use rexpect::session::{Options, PtySession};

/// Bounds every expectation (the pty's own timeout).
const PTY_TIMEOUT_MS: u64 = 20_000;

/// `agent-relay setup` on a pseudo-terminal, and everything it printed.
struct Terminal {
    session: PtySession,
    transcript: String,
}

impl Terminal {
    /// Runs setup with only `env` (and PATH and the home) set.
    fn spawn(home: &Path, env: &[(&str, String)]) -> Self {
        let mut command = Command::new(common::binary());
        command
            .arg("setup")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("AGENT_RELAY_HOME", home)
            .env("TERM", "dumb");
        for (key, value) in env {
            command.env(key, value);
        }
        let options = Options::new()
            .timeout_ms(Some(PTY_TIMEOUT_MS))
            .strip_ansi_escape_codes(true);
        let session = rexpect::session::spawn_with_options(command, options).expect("spawn setup");
        Self {
            session,
            transcript: String::new(),
        }
    }

    /// Waits for `needle`; panics with the transcript if it does not come.
    fn expect(&mut self, needle: &str) {
        let got = tokio::task::block_in_place(|| self.session.exp_string(&as_read(needle)));
        match got {
            Ok(before) => {
                self.transcript.push_str(&decoded(&before));
                self.transcript.push_str(needle);
            }
            Err(e) => panic!(
                "setup never printed {needle:?} ({e}); it printed:\n{}",
                self.transcript
            ),
        }
    }

    /// Waits for `regex`; returns what matched.
    fn expect_regex(&mut self, regex: &str) -> String {
        let got = tokio::task::block_in_place(|| self.session.exp_regex(regex));
        match got {
            Ok((before, matched)) => {
                self.transcript.push_str(&decoded(&before));
                self.transcript.push_str(&matched);
                matched
            }
            Err(e) => panic!(
                "setup never printed /{regex}/ ({e}); it printed:\n{}",
                self.transcript
            ),
        }
    }

    fn type_line(&mut self, line: &str) {
        tokio::task::block_in_place(|| self.session.send_line(line)).expect("type into setup");
    }

    /// Waits for setup to end; returns its exit code. The transcript never
    /// holds the token's secret.
    fn finish(mut self) -> (i32, String) {
        let rest = tokio::task::block_in_place(|| self.session.exp_eof())
            .unwrap_or_else(|e| panic!("setup did not end ({e}):\n{}", self.transcript));
        self.transcript.push_str(&decoded(&rest));
        let status =
            tokio::task::block_in_place(|| self.session.process().wait()).expect("wait for setup");
        // rexpect hands out nix's WaitStatus without re-exporting it:
        // `Exited(Pid(n), code)`.
        let status = format!("{status:?}");
        let code = status
            .strip_prefix("Exited(")
            .and_then(|rest| rest.trim_end_matches(')').rsplit(", ").next())
            .and_then(|code| code.parse().ok())
            .unwrap_or_else(|| panic!("setup ended by {status}:\n{}", self.transcript));
        assert!(
            !self.transcript.contains(SECRET),
            "the token's secret was shown:\n{}",
            self.transcript
        );
        (code, self.transcript)
    }
}

/// rexpect reads the terminal a byte at a time and makes each byte a
/// char: `needle` as it appears in what rexpect read.
fn as_read(needle: &str) -> String {
    needle.bytes().map(char::from).collect()
}

/// What rexpect read, as the UTF-8 setup wrote.
fn decoded(read: &str) -> String {
    let bytes: Vec<u8> = read.chars().map(|c| c as u32 as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

fn api_url(fake: &FakeServer) -> (&'static str, String) {
    ("AGENT_RELAY_API_URL", fake.url())
}

fn token_env() -> (&'static str, String) {
    ("TELEGRAM_BOT_TOKEN", TOKEN.to_string())
}

/// The user presses Start in the deep link's private chat.
fn press_start(fake: &FakeServer, user: i64, code: &str) -> i64 {
    fake.api().inject_message(Inject {
        chat_id: user,
        thread_id: None,
        user_id: user,
        text: format!("/start {code}"),
    })
}

/// The code of the printed deep link.
fn pairing_code(terminal: &mut Terminal) -> String {
    let matched = terminal.expect_regex(r"relay_test_bot\?start=[0-9a-f]{32}");
    let code = matched.rsplit('=').next().unwrap().to_string();
    terminal.expect("Waiting for your Start");
    code
}

fn config_file(home: &Path) -> std::path::PathBuf {
    home.join("config/config.toml")
}

fn written_config(home: &Path) -> toml::Table {
    let path = config_file(home);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o600, "config.toml is private");
    toml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn users(config: &toml::Table) -> Vec<i64> {
    config["allowed_users"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_integer().unwrap())
        .collect()
}

/// The hello setup leaves in a first topic of `chat`.
fn hello_topic(fake: &FakeServer, chat: i64) {
    let topic = fake
        .api()
        .topics(chat)
        .into_iter()
        .find(|t| t.name == "agent-relay")
        .unwrap_or_else(|| panic!("no hello topic in {chat}: {:?}", fake.api().topics(chat)));
    let texts: Vec<String> = fake
        .api()
        .messages(chat, Some(topic.thread_id))
        .into_iter()
        .map(|m| m.plain_text)
        .collect();
    assert!(
        texts.iter().any(|t| t.contains("agent-relay is set up")),
        "{texts:?}"
    );
}

/// Every `getUpdates` setup made: never a negative offset.
fn polls(fake: &FakeServer) -> Vec<serde_json::Value> {
    let polls: Vec<_> = fake
        .api()
        .calls()
        .into_iter()
        .filter(|c| c.method == "getUpdates")
        .map(|c| c.params)
        .collect();
    assert!(
        polls.iter().all(|p| p
            .get("offset")
            .and_then(|o| o.as_i64())
            .is_none_or(|o| o >= 0)),
        "{polls:?}"
    );
    polls
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_checks_the_token_pairs_a_private_chat_and_writes_a_private_config() {
    let home = common::home();
    let fake = common::fake().await;
    let mut terminal = Terminal::spawn(home.path(), &[api_url(&fake)]);
    terminal.expect("Bot token: ");
    terminal.type_line("123:short");
    terminal.expect("✗ that is not a bot token");
    terminal.expect("Bot token: ");
    terminal.type_line("123456789:AAWrongWrongWrongWrongWrongWrongWro");
    terminal.expect("✗ Telegram rejected that token (401 Unauthorized)");
    terminal.expect("Bot token: ");
    terminal.type_line(TOKEN);
    terminal.expect("✓ the token works: bot @relay_test_bot (id 123456789)");
    terminal.expect("Choose 1 or 2 [1]: ");
    terminal.type_line("");
    terminal.expect("✓ @relay_test_bot has topics in private chats");
    let code = pairing_code(&mut terminal);
    // The deep link's Start, then somebody else's message, which setup
    // leaves for the relay.
    press_start(&fake, USER, &code);
    let later = fake.api().inject_message(Inject {
        chat_id: 2002,
        thread_id: None,
        user_id: 2002,
        text: "a message for the relay".into(),
    });
    terminal.expect("✓ paired with Alice (user id 1001)");
    terminal.expect("✓ wrote");
    terminal.expect("✓ said hello in a topic “agent-relay”");
    // Built inside this checkout (the usual target dir), the commands name it.
    let checkout = env!("CARGO_MANIFEST_DIR");
    let inside = common::binary().starts_with(checkout);
    let source = if inside { checkout } else { "" };
    terminal.expect(&format!("pi install {source}"));
    terminal.expect(&format!("claude plugin marketplace add {source}"));
    terminal.expect("claude plugin install agent-relay@agent-relay");
    let (code, transcript) = terminal.finish();
    assert_eq!(code, 0, "{transcript}");
    assert!(
        transcript.contains('█'),
        "a QR code is shown:\n{transcript}"
    );

    let config = written_config(home.path());
    assert_eq!(config["bot_token"].as_str(), Some(TOKEN));
    assert_eq!(users(&config), [USER]);
    assert!(
        !config.contains_key("chat_id"),
        "the private chat mode: {config:?}"
    );
    hello_topic(&fake, USER);
    let webhook = fake
        .api()
        .calls()
        .into_iter()
        .find(|c| c.method == "deleteWebhook")
        .expect("the webhook is deleted before polling");
    assert_eq!(webhook.params["drop_pending_updates"], false);
    // The Start was confirmed (the relay will not see it); the later
    // message stays.
    assert_eq!(fake.api().pending_update_ids(), [later]);
    polls(&fake);

    // The relay runs on what setup wrote: a session's topic goes into the
    // private chat, and the relay never sees the Start setup took.
    let session = common::start(
        common::Options::new(home.path()).env("AGENT_RELAY_API_URL", &fake.url()),
        "/tmp/a",
        "api",
    )
    .await;
    let thread = common::topic_in(&fake, USER, "api").thread_id;
    common::inject_in(&fake, USER, Some(thread), USER, "hello from the phone");
    common::wait_prompt(&session, "hello from the phone").await;
    let refused = fake
        .api()
        .messages(USER, None)
        .iter()
        .any(|m| m.plain_text.contains("expired"));
    assert!(!refused, "the relay answered setup's Start");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_says_what_to_switch_on_when_topics_are_off_and_goes_on_once_they_are() {
    let home = common::home();
    let fake = common::fake_with(FakeConfig {
        has_topics_enabled: false,
        ..FakeConfig::default()
    })
    .await;
    // A message that reached the bot while no relay ran: setup must leave
    // it, and so cannot confirm its own Start behind it.
    let earlier = common::inject(&fake, None, USER, "for the relay, from before");
    let mut terminal = Terminal::spawn(home.path(), &[api_url(&fake), token_env()]);
    terminal.expect("Using the token from TELEGRAM_BOT_TOKEN.");
    terminal.expect("✓ the token works: bot @relay_test_bot");
    terminal.expect("Choose 1 or 2 [1]: ");
    terminal.type_line("1");
    terminal.expect("✗ @relay_test_bot has no topics in private chats yet");
    terminal.expect("turn on Threaded Mode");
    terminal.expect("Press Enter once it is on");
    // Enter too early: it checks again and says so again.
    terminal.type_line("");
    terminal.expect("✗ @relay_test_bot has no topics in private chats yet");
    terminal.expect("Press Enter once it is on");
    fake.api().set_has_topics_enabled(true);
    terminal.type_line("");
    terminal.expect("✓ @relay_test_bot has topics in private chats");
    let code = pairing_code(&mut terminal);
    let start = press_start(&fake, USER, &code);
    terminal.expect("✓ paired with Alice (user id 1001)");
    terminal.expect("stay for the relay");
    terminal.expect("✓ said hello");
    let (code, transcript) = terminal.finish();
    assert_eq!(code, 0, "{transcript}");

    let getme = fake
        .api()
        .calls()
        .iter()
        .filter(|c| c.method == "getMe")
        .count();
    assert!(getme >= 3, "getMe asked again after each Enter ({getme})");
    assert_eq!(fake.api().pending_update_ids(), [earlier, start]);
    assert!(
        polls(&fake).iter().all(|p| p.get("offset").is_none()),
        "nothing was confirmed"
    );
    let config = written_config(home.path());
    assert_eq!(config["bot_token"].as_str(), Some(TOKEN));
    assert_eq!(users(&config), [USER]);
    hello_topic(&fake, USER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rerun_shows_the_configuration_without_the_token_and_changes_it_only_when_asked() {
    let home = common::home();
    let fake = common::fake().await;
    fake.api().add_private_chat(2002, "Bob");
    let dir = home.path().join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(home.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let before = format!(
        "# my relay\nbot_token = \"{TOKEN}\"\nallowed_users = [{USER}]\nauto_connect = false # quiet\n"
    );
    let file = config_file(home.path());
    std::fs::write(&file, &before).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();

    let mut terminal = Terminal::spawn(home.path(), &[api_url(&fake)]);
    terminal.expect("agent-relay is set up in");
    terminal.expect("bot:    @relay_test_bot (id 123456789) — the token is not shown");
    terminal.expect(&format!("topics: the private chat of user {USER}"));
    terminal.expect(&format!("users:  {USER}"));
    terminal.expect("also:   auto_connect");
    terminal.expect("Change it? [y/N] ");
    terminal.type_line("");
    terminal.expect("Nothing changed.");
    let (code, transcript) = terminal.finish();
    assert_eq!(code, 0, "{transcript}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before);
    assert!(
        !fake.api().calls().iter().any(|c| c.method == "getUpdates"),
        "a rerun that changes nothing reads no updates"
    );

    // Again, and this time pair another account; the bot stays.
    let mut terminal = Terminal::spawn(home.path(), &[api_url(&fake)]);
    terminal.expect("Change it? [y/N] ");
    terminal.type_line("y");
    terminal.expect("Keep bot 123456789? [Y/n] ");
    terminal.type_line("");
    terminal.expect("✓ the token works");
    terminal.expect("Choose 1 or 2 [1]: ");
    terminal.type_line("");
    let code = pairing_code(&mut terminal);
    press_start(&fake, 2002, &code);
    terminal.expect("✓ paired with Bob (user id 2002)");
    terminal.expect("✓ said hello");
    let (code, transcript) = terminal.finish();
    assert_eq!(code, 0, "{transcript}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(
        text.starts_with("# my relay\n") && text.contains("auto_connect = false # quiet"),
        "what setup does not manage stays:\n{text}"
    );
    let config = written_config(home.path());
    assert_eq!(config["bot_token"].as_str(), Some(TOKEN));
    assert_eq!(users(&config), [2002, USER], "the paired user comes first");
    hello_topic(&fake, 2002);
}

#[tokio::test]
async fn setup_without_a_terminal_refuses_and_names_the_non_interactive_way() {
    let home = common::home();
    let output = tokio::process::Command::new(common::binary())
        .arg("setup")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("AGENT_RELAY_HOME", home.path())
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(common::WAIT, output)
        .await
        .expect("setup ends at once")
        .expect("run setup");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for needle in [
        "needs a terminal",
        "TELEGRAM_BOT_TOKEN",
        "AGENT_RELAY_ALLOWED_USERS",
        "AGENT_RELAY_CHAT_ID",
        "bot_token, allowed_users and chat_id",
        "agent-relay doctor",
    ] {
        assert!(stderr.contains(needle), "{needle:?} missing from: {stderr}");
    }
    assert!(
        stderr.contains(&config_file(home.path()).display().to_string()),
        "{stderr}"
    );
    assert!(!config_file(home.path()).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_finds_the_forum_group_from_the_users_first_message_and_checks_the_rights() {
    let home = common::home();
    let fake = common::fake().await;
    let group = -1_004_000_000_004;
    let elsewhere = -1_005_000_000_005;
    fake.api().add_forum_supergroup(
        group,
        "Agents",
        BotRights {
            can_manage_topics: false,
            can_delete_messages: true,
        },
    );
    fake.api()
        .add_forum_supergroup(elsewhere, "Elsewhere", BotRights::FULL);
    let mut terminal = Terminal::spawn(home.path(), &[api_url(&fake), token_env()]);
    terminal.expect("Choose 1 or 2 [1]: ");
    terminal.type_line("2");
    let code = pairing_code(&mut terminal);
    press_start(&fake, USER, &code);
    terminal.expect("✓ paired with Alice");
    terminal
        .expect("make it an administrator with the rights “Manage topics” and “Delete messages”");
    terminal.expect("Send /start@relay_test_bot in the group.");
    terminal.expect("Waiting for your message in the group");
    // Somebody else's group does not count; the user's does.
    let stranger = fake.api().inject_message(Inject {
        chat_id: elsewhere,
        thread_id: None,
        user_id: 2002,
        text: "/start@relay_test_bot".into(),
    });
    let found = fake.api().inject_message(Inject {
        chat_id: group,
        thread_id: None,
        user_id: USER,
        text: "/start@relay_test_bot".into(),
    });
    terminal.expect(&format!("✓ found the group “Agents” (id {group})"));
    terminal.expect(&format!("✓ chat {group}: forum supergroup “Agents”"));
    terminal.expect("✗ rights: the bot is an administrator without can_manage_topics");
    terminal.expect("press Enter to check again");
    fake.api().set_bot_rights(group, BotRights::FULL).unwrap();
    terminal.type_line("");
    terminal.expect("✓ rights: the bot is an administrator and may manage topics");
    terminal.expect("✓ wrote");
    terminal.expect("✓ said hello");
    let (code, transcript) = terminal.finish();
    assert_eq!(code, 0, "{transcript}");

    let config = written_config(home.path());
    assert_eq!(config["chat_id"].as_integer(), Some(group));
    assert_eq!(users(&config), [USER]);
    hello_topic(&fake, group);
    assert!(fake.api().topics(elsewhere).is_empty());
    assert!(fake.api().topics(CHAT).is_empty());
    // The Start was first in the queue and is confirmed; the stranger's
    // message came before the user's group message, so both stay.
    assert_eq!(fake.api().pending_update_ids(), [stranger, found]);
    polls(&fake);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_does_not_poll_while_a_leader_runs_and_says_what_to_do() {
    let home = common::home();
    let fake = common::fake().await;
    let leader = common::session(home.path(), &fake, "/tmp/a", "api").await;
    let polls_before = fake.api().stats().polls;
    let mut terminal = Terminal::spawn(home.path(), &[api_url(&fake), token_env()]);
    terminal.expect("✓ the token works");
    terminal.expect(&format!(
        "a relay is running for @relay_test_bot (leader pid {})",
        leader.pid()
    ));
    terminal.expect("/telegram-connect");
    let (code, transcript) = terminal.finish();
    assert_eq!(code, 1, "{transcript}");
    assert!(
        !transcript.contains("start="),
        "no pairing link: {transcript}"
    );
    assert!(!config_file(home.path()).exists(), "nothing written");
    let polls_after = fake.api().stats().polls;
    assert_eq!(
        polls_after.overlaps, polls_before.overlaps,
        "no 409 anybody"
    );
    assert!(
        leader
            .latest_status()
            .is_some_and(|s| s.ends_with("● leader")),
        "the leader goes on"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_started_while_setup_polls_waits_and_leads_after_it() {
    let home = common::home();
    let fake = common::fake().await;
    let mut terminal = Terminal::spawn(home.path(), &[api_url(&fake), token_env()]);
    terminal.expect("Choose 1 or 2 [1]: ");
    terminal.type_line("");
    let code = pairing_code(&mut terminal);
    // Setup holds the bus lock now: a sidecar cannot lead, so it cannot
    // poll beside setup.
    let mut sidecar = common::Sidecar::spawn(common::accepting(
        common::Options::new(home.path()).private_chat(&fake),
    ));
    sidecar.handshake("/tmp/a", "api").await;
    let waiting = sidecar.wait_status(|_| true).await;
    assert!(!waiting.contains("● leader"), "{waiting}");
    let (ok, text) = sidecar.command("telegram-status", "").await;
    assert!(ok && !text.contains("transport: leader"), "{text}");
    press_start(&fake, USER, &code);
    terminal.expect("✓ said hello");
    let (code, transcript) = terminal.finish();
    assert_eq!(code, 0, "{transcript}");
    // Once setup let go of the lock, the sidecar leads, with no 409.
    sidecar.wait_status(|s| s.ends_with("● leader")).await;
    common::topic_in(&fake, USER, "api");
    assert_eq!(
        fake.api().stats().polls.overlaps,
        0,
        "no poll ever overlapped"
    );
}

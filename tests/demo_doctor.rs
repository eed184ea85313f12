//! `agent-relay demo` and `agent-relay doctor`, run as a user runs them: the
//! real binary, its exit code and what it prints. Doctor talks to an
//! in-process fake Bot API set up for each case.

use crate::common;

use std::path::Path;
use std::time::Duration;

use agent_relay::fake_bot_api::BotRights;
use agent_relay::host_client::{FromSidecar, Said, Sidecar};
use common::{CHAT, FakeServer, SECRET, USER, WAIT};
use serde_json::json;
use tokio::process::Command;

/// The demo takes well under a second on a laptop; this is for loaded CI.
const DEMO_WAIT: Duration = Duration::from_secs(60);

struct Run {
    code: Option<i32>,
    stdout: String,
}

/// Runs the binary with only `env` (and PATH) set; waits up to `timeout`.
async fn run(args: &[&str], env: &[(&str, String)], timeout: Duration) -> Run {
    let mut command = Command::new(common::binary());
    command
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .kill_on_drop(true);
    for (key, value) in env {
        command.env(key, value);
    }
    let output = tokio::time::timeout(timeout, command.output())
        .await
        .unwrap_or_else(|_| panic!("agent-relay {args:?} did not finish within {timeout:?}"))
        .expect("run agent-relay");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !stdout.contains(SECRET) && !stderr.contains(SECRET),
        "the token's secret was printed:\n{stdout}\n{stderr}"
    );
    Run {
        code: output.status.code(),
        stdout,
    }
}

/// The env of a relay configured for `fake`'s bot and `chat`.
fn configured(home: &Path, fake: &FakeServer, chat: i64) -> Vec<(&'static str, String)> {
    vec![
        ("AGENT_RELAY_HOME", home.display().to_string()),
        ("TELEGRAM_BOT_TOKEN", fake.api().token()),
        ("AGENT_RELAY_CHAT_ID", chat.to_string()),
        ("AGENT_RELAY_ALLOWED_USERS", USER.to_string()),
        ("AGENT_RELAY_API_URL", fake.url()),
    ]
}

async fn doctor(env: &[(&str, String)]) -> Run {
    run(&["doctor"], env, WAIT).await
}

fn line<'a>(run: &'a Run, start: &str) -> &'a str {
    run.stdout
        .lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting with {start:?} in:\n{}", run.stdout))
}

#[tokio::test]
async fn the_demo_runs_to_completion_and_cleans_up_after_itself() {
    // The demo's temporary home goes under TMPDIR; it must be gone after.
    let tmp = common::home();
    let run = run(
        &["demo"],
        &[("TMPDIR", tmp.path().display().to_string())],
        DEMO_WAIT,
    )
    .await;
    assert_eq!(run.code, Some(0), "{}", run.stdout);
    for (topic, answer) in [
        ("A · api", "api here: I ran cargo test for “run the tests”"),
        (
            "B · web",
            "web here: I ran npm run build for “build the frontend”",
        ),
        (
            "C · docs",
            "docs here: I ran mdbook build for “check the links”",
        ),
    ] {
        let reply = format!("→ “{topic}”: {answer}");
        assert!(
            run.stdout
                .lines()
                .any(|l| l.contains('🤖') && l.contains(&reply)),
            "no reply {reply:?} in:\n{}",
            run.stdout
        );
    }
    let failover = line_containing(&run, "✅ failover:");
    assert!(failover.contains("ms after the SIGKILL"), "{failover}");
    // A message after the failover reached a survivor and came back.
    let kill = run.stdout.find("💥 SIGKILL").expect("the kill is shown");
    let after = &run.stdout[kill..];
    assert!(
        after.contains("🤖 web   → “B · web”: web here: I ran npm run build for “still there"),
        "{after}"
    );
    assert!(run.stdout.lines().count() <= 50, "{}", run.stdout);

    for pid in started_pids(&run.stdout) {
        // SAFETY: signal 0 only asks whether the process exists.
        let alive = unsafe { libc::kill(pid, 0) } == 0;
        assert!(!alive, "sidecar {pid} outlived the demo");
    }
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "the demo left {left:?} behind");
}

fn line_containing<'a>(run: &'a Run, needle: &str) -> &'a str {
    run.stdout
        .lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{}", run.stdout))
}

/// The pids of "▶ session api starts (pid 1234)" lines.
fn started_pids(transcript: &str) -> Vec<i32> {
    let pids: Vec<i32> = transcript
        .lines()
        .filter(|l| l.contains("▶ session"))
        .filter_map(|l| l.split("(pid ").nth(1)?.trim_end_matches(')').parse().ok())
        .collect();
    assert_eq!(pids.len(), 3, "{transcript}");
    pids
}

#[tokio::test]
async fn doctor_passes_a_good_setup_and_shows_where_things_are() {
    let home = common::home();
    let fake = common::fake().await;
    let run = doctor(&configured(home.path(), &fake, CHAT)).await;
    assert_eq!(run.code, Some(0), "{}", run.stdout);
    assert_eq!(
        line(&run, "✓ token"),
        "✓ token: bot @relay_test_bot (id 123456789)"
    );
    assert!(line(&run, &format!("✓ chat {CHAT}")).contains("forum supergroup"));
    assert!(line(&run, "✓ rights").contains("may manage topics"));
    let config_file = home.path().join("config/config.toml");
    assert!(line(&run, "· config file").contains(&config_file.display().to_string()));
    let bus = home.path().join("run/123456789");
    assert!(line(&run, "· bus dir").ends_with(&bus.display().to_string()));
    assert!(line(&run, "· leader").contains("none running"));
    assert!(
        run.stdout.ends_with("all checks passed\n"),
        "{}",
        run.stdout
    );
}

#[tokio::test]
async fn doctor_finds_the_running_leader() {
    let home = common::home();
    let fake = common::fake().await;
    let env = configured(home.path(), &fake, CHAT);
    let mut command = Command::new(common::binary());
    command.arg("stdio").env_clear();
    for (key, value) in &env {
        command.env(key, value);
    }
    let (sidecar, mut incoming) = Sidecar::spawn(command).expect("spawn a sidecar");
    sidecar
        .link()
        .request(
            "initialize",
            json!({
                "protocolVersion": 1,
                "host": {"name": "test-host", "version": "1"},
                "cwd": "/tmp/lead",
                "session": {"id": "s1", "name": "lead"},
                "hasUI": false
            }),
            WAIT,
        )
        .await
        .expect("initialize");
    sidecar
        .link()
        .notify("initialized", json!({}))
        .expect("initialized");
    tokio::time::timeout(WAIT, async {
        while let Some(Said { message, .. }) = incoming.recv().await {
            if let FromSidecar::Notification { method, params } = message
                && method == "ui/setStatus"
                && params["text"]
                    .as_str()
                    .is_some_and(|t| t.contains("● leader"))
            {
                return;
            }
        }
        panic!("the sidecar closed before it led");
    })
    .await
    .expect("the sidecar became leader");

    let run = doctor(&env).await;
    assert_eq!(run.code, Some(0), "{}", run.stdout);
    let pid = sidecar.pid().expect("still running");
    assert!(
        line(&run, "✓ leader").contains(&format!("running: pid {pid}, epoch")),
        "{}",
        run.stdout
    );
}

#[tokio::test]
async fn doctor_says_a_plain_supergroup_is_not_a_forum_and_how_to_fix_it() {
    let home = common::home();
    let fake = common::fake().await;
    let plain = -1_002_000_000_002;
    fake.api()
        .add_supergroup(plain, "Plain group", BotRights::FULL);
    let run = doctor(&configured(home.path(), &fake, plain)).await;
    assert_eq!(run.code, Some(1), "{}", run.stdout);
    assert_eq!(
        line(&run, &format!("✗ chat {plain}")),
        format!(
            "✗ chat {plain}: “Plain group” is not a forum — fix: enable Topics in the group settings (Edit → Topics)"
        )
    );
    assert!(run.stdout.ends_with("1 problem found\n"), "{}", run.stdout);
}

#[tokio::test]
async fn doctor_says_the_bot_needs_the_manage_topics_right() {
    let home = common::home();
    let fake = common::fake().await;
    let forum = -1_003_000_000_003;
    fake.api().add_forum_supergroup(
        forum,
        "No rights",
        BotRights {
            can_manage_topics: false,
            can_delete_messages: true,
        },
    );
    let run = doctor(&configured(home.path(), &fake, forum)).await;
    assert_eq!(run.code, Some(1), "{}", run.stdout);
    let rights = line(&run, "✗ rights");
    assert!(
        rights.contains("without can_manage_topics")
            && rights
                .contains("— fix: make the bot an administrator with the “Manage topics” right"),
        "{rights}"
    );
}

#[tokio::test]
async fn doctor_says_a_rejected_token_is_rejected_without_showing_it() {
    let home = common::home();
    let fake = common::fake().await;
    let wrong_secret = "AAWrongWrongWrongWrongWrongWrongWro";
    let mut env = configured(home.path(), &fake, CHAT);
    env.retain(|(key, _)| *key != "TELEGRAM_BOT_TOKEN");
    env.push(("TELEGRAM_BOT_TOKEN", format!("123456789:{wrong_secret}")));
    let run = doctor(&env).await;
    assert_eq!(run.code, Some(1), "{}", run.stdout);
    let token = line(&run, "✗ token");
    assert!(
        token.starts_with("✗ token 123456789:…: Telegram rejected it (401 Unauthorized) — fix:")
            && token.contains("@BotFather"),
        "{token}"
    );
    assert!(!run.stdout.contains(wrong_secret), "{}", run.stdout);
}

#[tokio::test]
async fn doctor_without_a_token_names_the_config_file_to_put_it_in() {
    let home = common::home();
    let run = doctor(&[("AGENT_RELAY_HOME", home.path().display().to_string())]).await;
    assert_eq!(run.code, Some(1), "{}", run.stdout);
    let config_file = home.path().join("config/config.toml");
    assert_eq!(
        line(&run, "✗ token"),
        format!(
            "✗ token: no bot token configured — fix: set bot_token in {} or TELEGRAM_BOT_TOKEN (@BotFather gives you one with /newbot)",
            config_file.display()
        )
    );
}

/// The env of a relay in the private-chat mode: no chat, the user allowed.
fn private_mode(home: &Path, fake: &FakeServer) -> Vec<(&'static str, String)> {
    let mut env = configured(home, fake, CHAT);
    env.retain(|(key, _)| *key != "AGENT_RELAY_CHAT_ID");
    env
}

#[tokio::test]
async fn doctor_recognises_the_private_chat_mode() {
    let home = common::home();
    let fake = common::fake().await;
    let run = doctor(&private_mode(home.path(), &fake)).await;
    assert_eq!(run.code, Some(0), "{}", run.stdout);
    assert_eq!(
        line(&run, &format!("✓ chat {USER}")),
        format!(
            "✓ chat {USER}: private chat with Alice (the first of allowed_users); the bot has topics enabled"
        )
    );
    assert!(!run.stdout.contains("rights"), "{}", run.stdout);
}

#[tokio::test]
async fn doctor_says_what_to_switch_on_when_the_bot_has_no_private_topics() {
    let home = common::home();
    let fake = common::fake_with(common::FakeConfig {
        has_topics_enabled: false,
        ..common::FakeConfig::default()
    })
    .await;
    let run = doctor(&private_mode(home.path(), &fake)).await;
    assert_eq!(run.code, Some(1), "{}", run.stdout);
    let chat = line(&run, "✗ chat");
    assert!(
        chat.starts_with("✗ chat: none configured, and the bot has no topics in private chats — fix: in @BotFather")
            && chat.contains("turn on Threaded Mode")
            && chat.contains("agent-relay setup"),
        "{chat}"
    );
}

#[tokio::test]
async fn doctor_says_when_the_bot_cannot_reach_the_users_private_chat() {
    let home = common::home();
    let fake = common::fake().await;
    let mut env = private_mode(home.path(), &fake);
    env.retain(|(key, _)| *key != "AGENT_RELAY_ALLOWED_USERS");
    env.push(("AGENT_RELAY_ALLOWED_USERS", "4242".into()));
    let run = doctor(&env).await;
    assert_eq!(run.code, Some(1), "{}", run.stdout);
    assert!(
        line(&run, "✗ chat 4242")
            .contains("open https://t.me/relay_test_bot on that user's phone and press Start"),
        "{}",
        run.stdout
    );
}

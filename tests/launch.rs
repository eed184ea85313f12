//! Starting work from the phone without a real agent (docs/DESIGN.md,
//! *Launching* and *Scheduled prompts*): what the leader answers in the
//! control place and in a session's topic, scheduled prompts reaching a
//! session (a scripted host plays it), firings missed while no relay ran
//! told and not run, `agent-relay install service` and `doctor`.
//!
//! The real agents under `agent-relay serve` are `tests/pi/launch.test.mjs`,
//! `tests/pi/launch-cluster.test.mjs` and `tests/claude/launch.test.mjs`.

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use agent_relay::fake_bot_api::{CallbackInject, FakeServer, SentMessage};
use common::{CHAT, USER, WAIT, inject, session, topic, wait_prompt, wait_topic_text};

/// The control place's messages (the General topic).
fn general(fake: &FakeServer) -> Vec<SentMessage> {
    fake.api().messages(CHAT, None)
}

/// Waits for a message in the General topic containing `needle`.
async fn wait_general(fake: &FakeServer, needle: &str) -> SentMessage {
    let needle = needle.to_string();
    fake.api()
        .wait_until(
            |api| {
                api.messages(CHAT, None)
                    .into_iter()
                    .find(|m| m.plain_text.contains(&needle))
            },
            WAIT,
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{needle:?} never arrived in General: {:?}",
                general(fake)
                    .iter()
                    .map(|m| &m.plain_text)
                    .collect::<Vec<_>>()
            )
        })
}

/// Writes `config.toml` (0600) into `home`.
fn config(home: &Path, toml: &str) {
    let dir = home.join("config");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let file = dir.join("config.toml");
    std::fs::write(&file, toml).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
}

#[tokio::test]
async fn new_without_roots_says_how_to_allow_folders_and_without_serve_how_to_start_it() {
    let home = common::home();
    let fake = common::fake().await;
    let _s = session(home.path(), &fake, "/tmp/api", "api").await;
    inject(&fake, None, USER, "/new ~/api fix it");
    let off = wait_general(&fake, "Not done").await;
    assert!(
        off.plain_text.contains("[launch] roots = [\"~/code\"]"),
        "{}",
        off.plain_text
    );
    inject(&fake, None, USER, "/new");
    wait_general(&fake, "⚠️ starting agents from the phone is off").await;
    assert_eq!(
        fake.api().topics(CHAT).len(),
        1,
        "no topic but the session's own"
    );

    // With roots, but no serve on this machine.
    let home = common::home();
    let fake = common::fake().await;
    config(home.path(), "[launch]\nroots = [\"/tmp\"]\n");
    let _s = session(home.path(), &fake, "/tmp/web", "web").await;
    inject(&fake, None, USER, "/new /tmp hello");
    let no_serve = wait_general(&fake, "Not done").await;
    assert!(
        no_serve
            .plain_text
            .contains("agent-relay serve is not running"),
        "{}",
        no_serve.plain_text
    );

    // `/new` alone offers the folders sessions ran in, under the roots;
    // a tap is `/new` in that folder.
    inject(&fake, None, USER, "/new");
    let offer = wait_general(&fake, "in which folder?").await;
    let markup = offer.reply_markup.clone().unwrap_or_default();
    let buttons: Vec<&serde_json::Value> = markup["inline_keyboard"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|row| row.as_array())
        .flatten()
        .collect();
    assert_eq!(buttons.len(), 1, "{markup}");
    assert!(
        buttons[0]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("web"),
        "{markup}"
    );
    fake.api().inject_callback_query(CallbackInject {
        chat_id: CHAT,
        thread_id: None,
        user_id: USER,
        message_id: offer.message_id,
        data: buttons[0]["callback_data"]
            .as_str()
            .unwrap_or_default()
            .into(),
    });
    let tapped = fake
        .api()
        .wait_until(
            |api| {
                api.messages(CHAT, None).into_iter().find(|m| {
                    m.plain_text.contains("Not done") && m.message_id != no_serve.message_id
                })
            },
            WAIT,
        )
        .await
        .expect("the tap starts /new in that folder");
    assert!(
        tapped.plain_text.contains("/tmp/web")
            || tapped.plain_text.contains("serve is not running"),
        "{}",
        tapped.plain_text
    );
}

#[tokio::test]
async fn a_scheduled_prompt_reaches_its_session_and_is_cancelled_with_a_tap() {
    let home = common::home();
    let fake = common::fake().await;
    let s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;

    inject(&fake, Some(thread), USER, "/at +1s once only");
    wait_topic_text(&fake, thread, "⏰ #1 scheduled for this session").await;
    wait_prompt(&s, "once only").await;
    wait_topic_text(&fake, thread, "⏰ once only (at ").await;

    inject(&fake, Some(thread), USER, "/every 5s check the queue");
    wait_topic_text(&fake, thread, "⏰ #2 scheduled").await;
    wait_prompt(&s, "check the queue").await;
    assert!(
        !s.messages()
            .iter()
            .any(|m| m["params"]["text"] == "/every 5s check the queue"),
        "the command is the leader's, not a prompt"
    );

    inject(&fake, Some(thread), USER, "/schedules");
    wait_topic_text(&fake, thread, "#2 every 5s").await;
    let list = fake
        .api()
        .messages(CHAT, Some(thread))
        .into_iter()
        .find(|m| m.plain_text.starts_with("Scheduled prompts"))
        .expect("the list");
    assert!(
        !list.plain_text.contains("#1"),
        "a one-off is gone once fired: {}",
        list.plain_text
    );
    fake.api().inject_callback_query(CallbackInject {
        chat_id: CHAT,
        thread_id: Some(thread),
        user_id: USER,
        message_id: list.message_id,
        data: "c:x:2".into(),
    });
    fake.api()
        .wait_until(
            |api| {
                api.message(CHAT, list.message_id)
                    .filter(|m| m.plain_text.starts_with("No prompts are scheduled"))
            },
            WAIT,
        )
        .await
        .expect("the list shows the schedule cancelled");
}

#[tokio::test]
async fn firings_missed_while_no_relay_ran_are_told_and_not_run() {
    let home = common::home();
    let fake = common::fake().await;
    let mut s = session(home.path(), &fake, "/tmp/api", "api").await;
    let thread = topic(&fake, "api").thread_id;
    s.close_stdin();
    s.wait_exit().await;

    // Three hours ago, hourly: the machine was off meanwhile.
    let store = home.path().join("state").join("123456789.sqlite3");
    let db = rusqlite::Connection::open(&store).expect("the store");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    db.execute(
        "INSERT INTO schedules (profile_key, every_s, once, prompt, next_ms, chat_id, thread_id, by_user, created_ms) \
         VALUES ('cwd:/tmp/api#api', 3600, 0, 'nightly report', ?1, ?2, ?3, ?4, ?1)",
        rusqlite::params![now - 3 * 3_600_000 + 60_000, CHAT, thread, USER],
    )
    .expect("a schedule");
    drop(db);

    let s = session(home.path(), &fake, "/tmp/api", "api").await;
    let said = wait_topic_text(&fake, thread, "missed 3 firing(s)").await;
    assert!(
        said.iter().any(|t| t.contains("they were not run. Next:")),
        "{said:?}"
    );
    // Whatever the leader did with the schedule, it did before this.
    inject(&fake, Some(thread), USER, "are you there?");
    wait_prompt(&s, "are you there?").await;
    assert!(
        !s.messages()
            .iter()
            .any(|m| m["params"]["text"] == "nightly report"),
        "missed firings are not run in a burst"
    );
}

#[tokio::test]
async fn doctor_says_whether_serve_runs() {
    let home = common::home();
    let fake = common::fake().await;
    config(home.path(), "[launch]\nroots = [\"/tmp\"]\n");
    let env: Vec<(String, String)> = [
        ("AGENT_RELAY_HOME", home.path().display().to_string()),
        ("TELEGRAM_BOT_TOKEN", fake.api().token()),
        ("AGENT_RELAY_CHAT_ID", CHAT.to_string()),
        ("AGENT_RELAY_ALLOWED_USERS", USER.to_string()),
        ("AGENT_RELAY_API_URL", fake.url()),
        ("PATH", std::env::var("PATH").unwrap_or_default()),
    ]
    .map(|(k, v)| (k.to_string(), v))
    .to_vec();
    let run = |args: &[&str]| {
        let mut command = tokio::process::Command::new(common::binary());
        command
            .args(args)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    };
    let doctor = || async {
        let out = tokio::time::timeout(WAIT, run(&["doctor"]).output())
            .await
            .expect("doctor in time")
            .expect("doctor");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let before = doctor().await;
    assert!(before.contains("serve"), "{before}");
    assert!(
        before.contains("not running: /new from the phone needs it"),
        "{before}"
    );

    let mut serve = run(&["serve"]).spawn().expect("serve");
    let pid = serve.id().expect("a pid");
    let during = tokio::time::timeout(WAIT, async {
        loop {
            let said = doctor().await;
            if said.contains(&format!("running: pid {pid}, starts")) {
                return said;
            }
        }
    })
    .await
    .expect("doctor sees serve");
    assert!(during.contains("agents may be started in /tmp"), "{during}");

    // A second serve for the same bot is refused.
    let second = tokio::time::timeout(WAIT, run(&["serve"]).output())
        .await
        .expect("the second serve leaves")
        .expect("serve");
    assert!(!second.status.success());
    assert!(
        String::from_utf8_lossy(&second.stderr).contains(&format!(
            "already runs for this bot on this machine (pid {pid})"
        )),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    // SAFETY: a plain signal to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let exit = tokio::time::timeout(Duration::from_secs(30), serve.wait())
        .await
        .expect("serve stops on SIGTERM")
        .expect("serve's status");
    assert!(exit.success(), "{exit:?}");
}

#[test]
fn install_service_shows_writes_and_removes_the_unit() {
    let home = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        std::process::Command::new(common::binary())
            .args(args)
            .env_clear()
            .env("HOME", home.path())
            .env("PATH", "/usr/bin:/bin")
            .stdin(Stdio::null())
            .output()
            .expect("run agent-relay")
    };
    let shown = run(&["install", "service", "--dry-run", "--systemd"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    let unit = home.path().join(".config/systemd/user/agent-relay.service");
    assert!(
        text.contains(&format!("would write {}", unit.display())),
        "{text}"
    );
    assert!(
        text.contains(" serve\n") && text.contains("Environment=\"PATH=/usr/bin:/bin\""),
        "{text}"
    );
    assert!(!unit.exists(), "a dry run writes nothing");

    // The kind this system does not run is written, never loaded.
    let other = if cfg!(target_os = "macos") {
        "--systemd"
    } else {
        "--launchd"
    };
    let written = run(&["install", "service", other]);
    let said = String::from_utf8_lossy(&written.stdout);
    assert!(written.status.success(), "{said}");
    assert!(said.contains("not loaded"), "{said}");
    let file = if cfg!(target_os = "macos") {
        unit
    } else {
        home.path()
            .join("Library/LaunchAgents/dev.agent-relay.serve.plist")
    };
    let text = std::fs::read_to_string(&file).expect("the service file");
    assert!(text.contains("serve"), "{text}");
    assert!(!text.contains("TELEGRAM_BOT_TOKEN"), "{text}");
    let removed = run(&["install", "service", other, "--remove"]);
    assert!(removed.status.success());
    assert!(!file.exists());
}

/// `/new claude` names the engine, never a folder called `claude`: the
/// folders are offered for Claude Code, with the first prompt written
/// after it, and a tap starts that there.
#[tokio::test]
async fn new_with_an_engine_alone_offers_the_folders_for_that_engine() {
    let home = common::home();
    let fake = common::fake().await;
    config(home.path(), "[launch]\nroots = [\"/tmp\"]\n");
    let _s = session(home.path(), &fake, "/tmp/web", "web").await;
    inject(&fake, None, USER, "/new claude fix the build");
    let offer = wait_general(&fake, "in which folder?").await;
    assert!(
        offer
            .plain_text
            .starts_with("Start claude in which folder?")
            && offer.plain_text.contains("first prompt: “fix the build”"),
        "{}",
        offer.plain_text
    );
    let markup = offer.reply_markup.clone().unwrap_or_default();
    let web = markup["inline_keyboard"][0][0].clone();
    assert!(
        web["text"].as_str().unwrap_or_default().contains("web"),
        "{markup}"
    );
    fake.api().inject_callback_query(CallbackInject {
        chat_id: CHAT,
        thread_id: None,
        user_id: USER,
        message_id: offer.message_id,
        data: web["callback_data"].as_str().unwrap_or_default().into(),
    });
    // No serve runs here: the start is refused, after saying what it was.
    wait_general(&fake, "Not done").await;
    // Every text the control place showed, each edit's included.
    let said: Vec<String> = general(&fake)
        .into_iter()
        .flat_map(|m| m.history.into_iter().map(|v| v.plain_text))
        .collect();
    assert!(
        said.iter()
            .any(|t| t.starts_with("⏳ Starting claude in /tmp/web")),
        "{said:?}"
    );
    assert!(
        !said
            .iter()
            .any(|t| t.contains("Starting pi") || t.contains("in claude…")),
        "never a folder called claude: {said:?}"
    );
}

/// An engine that never joins: a shell that plays pi's RPC side (it answers
/// every command, `get_commands` listing the relay's command as if its
/// extension were loaded) and starts a child of its own, whose pid it
/// appends to `pids`; `delay` seconds before its first answer.
fn never_joins(pids: &Path, delay: u32) -> String {
    let script = format!(
        "sleep 600 & echo $! >> '{}'; sleep {delay}; n=0; \
         while read -r line; do \
           printf '{{\"type\":\"response\",\"id\":\"relay-%s\",\"success\":true,\"data\":{{\"commands\":[{{\"name\":\"telegram-connect\",\"source\":\"extension\"}}]}}}}\\n' \"$n\"; \
           n=$((n+1)); \
         done",
        pids.display()
    );
    serde_json::to_string(&["/bin/sh", "-c", &script, "pi"]).unwrap()
}

/// `agent-relay serve` for `fake`'s bot with `config.toml` written from
/// `launch` (the `[launch]` table's lines), once it is on the bus. The
/// relay's own pacing is off (`AGENT_RELAY_UNLIMITED`): a burst of `/new`
/// is answered at once rather than at Telegram's 20 a minute in a group.
async fn serve(home: &Path, fake: &FakeServer, launch: &str) -> tokio::process::Child {
    config(
        home,
        &format!(
            "bot_token = \"{}\"\nchat_id = {CHAT}\nallowed_users = [{USER}]\napi_url = \"{}\"\n[launch]\n{launch}\n",
            fake.api().token(),
            fake.url()
        ),
    );
    let command = |args: &[&str]| {
        let mut command = tokio::process::Command::new(common::binary());
        command
            .args(args)
            .env_clear()
            .env("AGENT_RELAY_HOME", home)
            .env("AGENT_RELAY_LOG", "debug")
            .env("AGENT_RELAY_UNLIMITED", "1")
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        command
    };
    let serve = command(&["serve"]).spawn().expect("serve");
    let pid = serve.id().expect("a pid");
    tokio::time::timeout(WAIT, async {
        loop {
            let out = command(&["status"]).output().await.expect("status");
            if String::from_utf8_lossy(&out.stdout).contains(&format!("serve: pid {pid}")) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("serve on the bus");
    serve
}

/// Whether `pid` runs (a zombie has ended; it only waits to be reaped).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some(!matches!(state, 'Z' | 'X'))
        })
        .unwrap_or(false)
}

/// The running processes whose parent is `parent`, but its watcher.
fn agents_of(parent: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split(' ').nth(1)?.parse::<u32>().ok());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let watcher = String::from_utf8_lossy(&cmdline).contains("serve-watcher");
        if ppid == Some(parent) && running(pid) && !watcher {
            found.push(pid);
        }
    }
    found
}

/// The pids an agent of [`never_joins`] wrote down.
fn written_pids(file: &Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// Waits until `pids` all ended.
async fn all_end(pids: &[u32], within: Duration) {
    let ended = tokio::time::timeout(within, async {
        while pids.iter().any(|pid| running(*pid)) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    let left: Vec<_> = pids.iter().filter(|pid| running(**pid)).collect();
    assert!(ended.is_ok(), "still running after {within:?}: {left:?}");
}

/// 50 `/new` at once on a machine whose agents never join: the first ones
/// start and are ended when they do not join within `[launch]
/// join_within_s`; past `[launch] max_agents` the rest are refused naming
/// the setting; every one is answered, and nothing is left running — no
/// agent, nothing an agent started.
#[tokio::test]
async fn a_burst_of_new_is_capped_and_leaves_no_agent_that_nothing_reaches() {
    let home = common::home();
    let fake = common::fake().await;
    let work = home.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let pids = home.path().join("pids");
    let launch = format!(
        "roots = [\"{}\"]\nmax_agents = 3\njoin_within_s = 5\n[launch.commands]\npi = {}",
        work.display(),
        never_joins(&pids, 0)
    );
    let serve = serve(home.path(), &fake, &launch).await;
    let serve_pid = serve.id().unwrap();
    for i in 0..50 {
        inject(
            &fake,
            None,
            USER,
            &format!("/new {} task {i}", work.display()),
        );
    }
    let answers = fake
        .api()
        .wait_until(
            |api| {
                let done: Vec<String> = api
                    .messages(CHAT, None)
                    .into_iter()
                    .map(|m| m.plain_text)
                    .filter(|t| !t.starts_with("⏳"))
                    .collect();
                (done.len() >= 50).then_some(done)
            },
            Duration::from_secs(90),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "not every /new was answered: {:?}",
                general(&fake)
                    .iter()
                    .map(|m| &m.plain_text)
                    .collect::<Vec<_>>()
            )
        });
    assert!(
        answers.iter().all(|t| t.starts_with("⚠️ Not done")),
        "{answers:#?}"
    );
    let capped = answers
        .iter()
        .filter(|t| t.contains("[launch] max_agents"))
        .count();
    let given_up = answers
        .iter()
        .filter(|t| t.contains("did not join the relay within 5 s ([launch] join_within_s"))
        .count();
    assert!(capped >= 1 && given_up >= 1, "{answers:#?}");
    assert_eq!(capped + given_up, 50, "{answers:#?}");
    assert!(
        written_pids(&pids).len() <= given_up,
        "an agent starts only for a /new that is then given up"
    );
    // Every agent and what it started ends.
    tokio::time::timeout(Duration::from_secs(30), async {
        while !agents_of(serve_pid).is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("agents left: {:?}", agents_of(serve_pid)));
    all_end(&written_pids(&pids), Duration::from_secs(30)).await;
    assert!(fake.api().topics(CHAT).is_empty(), "no topic was made");
}

/// The leader gives a start up while the agent is still being started
/// (it answers only after `join_within_s`): the agent is ended as soon as
/// it runs, and no topic is told it started.
#[tokio::test]
async fn a_start_given_up_while_the_agent_starts_ends_it_when_it_runs() {
    let home = common::home();
    let fake = common::fake().await;
    let work = home.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let pids = home.path().join("pids");
    let launch = format!(
        "roots = [\"{}\"]\njoin_within_s = 5\n[launch.commands]\npi = {}",
        work.display(),
        never_joins(&pids, 8)
    );
    let serve = serve(home.path(), &fake, &launch).await;
    inject(&fake, None, USER, &format!("/new {} slow", work.display()));
    let refused = wait_general(&fake, "Not done").await;
    assert!(
        refused.plain_text.contains("did not answer within 5 s"),
        "{}",
        refused.plain_text
    );
    // The agent answers at 8 s; then it is ended, with its child.
    let serve_pid = serve.id().unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    tokio::time::timeout(Duration::from_secs(30), async {
        while !agents_of(serve_pid).is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("agents left: {:?}", agents_of(serve_pid)));
    let started = written_pids(&pids);
    assert_eq!(started.len(), 1);
    all_end(&started, Duration::from_secs(30)).await;
    assert!(fake.api().topics(CHAT).is_empty(), "no topic was made");
}

/// `serve` killed outright (SIGKILL): what its agent started ends too,
/// through `serve`'s watcher, not only the agent (the kernel's death
/// signal reaches the agent alone).
#[tokio::test]
async fn what_an_agent_started_ends_when_serve_is_killed() {
    let home = common::home();
    let fake = common::fake().await;
    let work = home.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let pids = home.path().join("pids");
    let launch = format!(
        "roots = [\"{}\"]\n[launch.commands]\npi = {}",
        work.display(),
        never_joins(&pids, 0)
    );
    let mut serve = serve(home.path(), &fake, &launch).await;
    let serve_pid = serve.id().unwrap();
    inject(&fake, None, USER, &format!("/new {} hi", work.display()));
    // The agent runs (it waits to join) and its child too.
    let (agent, child) = tokio::time::timeout(WAIT, async {
        loop {
            if let ([agent], [child]) = (
                agents_of(serve_pid).as_slice(),
                written_pids(&pids).as_slice(),
            ) {
                return (*agent, *child);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the agent and its child run");
    assert!(running(child));
    serve.start_kill().unwrap();
    serve.wait().await.unwrap();
    all_end(&[agent, child], Duration::from_secs(20)).await;
}

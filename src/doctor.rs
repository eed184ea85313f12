//! `agent-relay doctor`: checks what a relay needs before it can work — the
//! configuration, the token, the chat and the bot's rights in it — and says
//! for each failure what is wrong and how to fix it. It also shows where the
//! relay keeps its files and whether a leader is running.
//!
//! Every check is a read: `getMe`, `getChat`, `getChatMember`, `leader.json`
//! and a status query on the bus socket. Nothing here changes any state, so
//! it is safe to run next to a live relay.

use std::fmt;
use std::time::Duration;

use crate::claude::install::{self, Installed};
use crate::config::{Config, ConfigError};
use crate::member::{LeaderReport, leader_report};
use crate::paths::Paths;
use crate::redact::redact;
use crate::telegram::{BotApi, BotInfo, ChatKind, ChatMemberStatus, TOPICS_SWITCH, TelegramError};

/// A doctor should answer promptly even when Telegram does not.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// Something the relay needs is missing; `fix` says what to do.
    Fail {
        fix: String,
    },
    /// Information (a path, an optional feature), neither good nor bad.
    Note,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub subject: String,
    pub detail: String,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    /// True when no check failed.
    pub fn passed(&self) -> bool {
        !self
            .checks
            .iter()
            .any(|c| matches!(c.verdict, Verdict::Fail { .. }))
    }

    fn push(&mut self, subject: impl Into<String>, detail: impl Into<String>, verdict: Verdict) {
        self.checks.push(Check {
            subject: subject.into(),
            detail: detail.into(),
            verdict,
        });
    }

    fn pass(&mut self, subject: impl Into<String>, detail: impl Into<String>) {
        self.push(subject, detail, Verdict::Pass);
    }

    fn fail(
        &mut self,
        subject: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) {
        self.push(subject, detail, Verdict::Fail { fix: fix.into() });
    }

    fn note(&mut self, subject: impl Into<String>, detail: impl Into<String>) {
        self.push(subject, detail, Verdict::Note);
    }
}

impl fmt::Display for Check {
    /// `✓ subject: detail`, `✗ subject: detail — fix: …` or `· subject: detail`,
    /// redacted: details quote Telegram's and the config's own words, and
    /// whatever they contain, a token does not leave through a check.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let line = match &self.verdict {
            Verdict::Pass => format!("✓ {}: {}", self.subject, self.detail),
            Verdict::Fail { fix } => {
                format!("✗ {}: {} — fix: {fix}", self.subject, self.detail)
            }
            Verdict::Note => format!("· {}: {}", self.subject, self.detail),
        };
        f.write_str(&redact(&line))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for check in &self.checks {
            writeln!(f, "{check}")?;
        }
        let failed = self
            .checks
            .iter()
            .filter(|c| matches!(c.verdict, Verdict::Fail { .. }))
            .count();
        match failed {
            0 => writeln!(f, "all checks passed"),
            1 => writeln!(f, "1 problem found"),
            n => writeln!(f, "{n} problems found"),
        }
    }
}

/// Runs every check that the previous ones make possible (no chat check
/// without a working token) and reports each; then how the relay is added
/// to Claude Code, which needs none of them.
pub async fn diagnose(paths: &Paths, config: Result<Config, ConfigError>) -> Report {
    let mut report = Report::default();
    diagnose_relay(&mut report, paths, config).await;
    if let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        let home = std::path::Path::new(&home);
        let installed = install::installed(&install::Targets::from_env(home));
        let var = |names: &[&str]| {
            names
                .iter()
                .find_map(|name| std::env::var_os(name).filter(|v| !v.is_empty()))
        };
        let (relay_bin, path, cargo_home) = (
            var(&["AGENT_RELAY_BIN"]),
            var(&["PATH"]),
            var(&["CARGO_HOME"]),
        );
        let npm_prefix = var(&["npm_config_prefix", "NPM_CONFIG_PREFIX"]);
        let npmrc = var(&["npm_config_userconfig", "NPM_CONFIG_USERCONFIG"]);
        let binary = install::launcher_finds(&install::LauncherEnv {
            relay_bin: relay_bin.as_deref(),
            path: path.as_deref(),
            cargo_home: cargo_home.as_deref(),
            npm_prefix: npm_prefix.as_deref(),
            npmrc: npmrc.as_deref(),
            home,
        });
        check_claude_code(&mut report, &installed, binary);
    }
    report
}

async fn diagnose_relay(report: &mut Report, paths: &Paths, config: Result<Config, ConfigError>) {
    let file = paths.config_file();
    let found = if file.exists() {
        "found"
    } else {
        "not found: environment and defaults only"
    };
    report.note("config file", format!("{} ({found})", file.display()));
    report.note("state dir", paths.state_dir.display().to_string());

    let config = match config {
        Ok(config) => config,
        // An untrusted file or directory stops the doctor here: nothing it
        // names (an api_url, a bus) is contacted.
        Err(ConfigError::Untrusted(untrusted)) => {
            report.fail("files", untrusted.problem(), untrusted.fix);
            return;
        }
        Err(error) => {
            let fix = config_fix(&error);
            report.fail("config", error.to_string(), fix);
            return;
        }
    };
    let Some(token) = &config.token else {
        report.note(
            "bus dir",
            format!("{}/<bot id>", paths.runtime_dir.display()),
        );
        report.fail(
            "token",
            "no bot token configured",
            format!(
                "set bot_token in {} or TELEGRAM_BOT_TOKEN (@BotFather gives you one with /newbot)",
                file.display()
            ),
        );
        return;
    };
    let bot_id = token.bot_id();
    report.note("bus dir", paths.bus_dir(bot_id).display().to_string());
    report.note("Bot API", config.api_url.clone());

    match BotApi::new(&config.api_url, token) {
        Ok(api) => {
            let api = api.with_timeout(CALL_TIMEOUT);
            if let Some(bot) = check_token(report, &api, &config).await {
                match config.chat_id {
                    Some(chat_id) => check_chat(report, &api, &bot, chat_id).await,
                    None => check_private_chat(report, &api, &bot, &config.allowed_users).await,
                }
            }
        }
        Err(error) => report.fail(
            "Bot API",
            error.to_string(),
            "set api_url to https://api.telegram.org (or remove it)",
        ),
    }
    check_users(report, &config.allowed_users);
    check_transcriber(report, &config, std::env::var_os("PATH"));
    let launched = config
        .launch
        .commands
        .get("opencode")
        .and_then(|a| a.first());
    check_opencode(
        report,
        &crate::opencode::program(),
        launched.map(String::as_str),
        std::env::var_os("PATH").as_deref(),
    );
    let serve = check_leader(report, paths, bot_id).await;
    check_serve(report, serve, &config.launch);
}

/// Whether `transcribe_command`'s program can be run: a path must be an
/// executable file, a bare name must be found on `path` (the sidecar's
/// `PATH` is its host's; the doctor's is a good guess of it).
fn check_transcriber(report: &mut Report, config: &Config, path: Option<std::ffi::OsString>) {
    let Some(transcriber) = &config.files.transcriber else {
        report.note(
            "voice notes",
            format!(
                "reach the agent as audio files; set transcribe_command in {} to have them transcribed",
                config.file.display()
            ),
        );
        return;
    };
    let program = &transcriber.argv[0];
    match find_program(program, path.as_deref()) {
        Some(found) => report.pass(
            "voice notes",
            format!(
                "transcribed by {} (at most {} s)",
                found.display(),
                transcriber.timeout.as_secs()
            ),
        ),
        None => report.fail(
            "voice notes",
            format!("transcribe_command's program {program} is not an executable file or on PATH"),
            format!(
                "install it, or give its full path in transcribe_command in {}",
                config.file.display()
            ),
        ),
    }
}

/// Where `program` is: a path must be an executable file, a bare name is
/// looked for on `path`.
fn find_program(program: &str, path: Option<&std::ffi::OsStr>) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let runnable = |candidate: &std::path::Path| {
        std::fs::metadata(candidate)
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        runnable(std::path::Path::new(program)).then(|| std::path::PathBuf::from(program))
    } else {
        path.into_iter()
            .flat_map(std::env::split_paths)
            .map(|dir| dir.join(program))
            .find(|candidate| runnable(candidate))
    }
}

/// Whether OpenCode is there for `agent-relay opencode` (`program`:
/// `AGENT_RELAY_OPENCODE_BIN`, else `opencode`) and for `/new … opencode`
/// (`launched`, the program of `[launch.commands] opencode`), on `path`.
/// Without it the relay works for the other hosts: a note, not a failure.
fn check_opencode(
    report: &mut Report,
    program: &std::path::Path,
    launched: Option<&str>,
    path: Option<&std::ffi::OsStr>,
) {
    const SUBJECT: &str = "OpenCode";
    let Some(found) = find_program(&program.to_string_lossy(), path) else {
        report.note(
            SUBJECT,
            format!(
                "{} is not found: install OpenCode (`npm i -g opencode-ai`) to use `agent-relay opencode`, or set {}",
                program.display(),
                crate::opencode::OPENCODE_BIN
            ),
        );
        return;
    };
    let from_phone = match launched.and_then(|p| find_program(p, path)) {
        Some(_) => ", `/new … opencode` starts it from the phone",
        None => " ([launch.commands] opencode is not found: /new cannot start it)",
    };
    report.pass(
        SUBJECT,
        format!(
            "{}: `agent-relay opencode` runs its TUI beside the relay{from_phone}",
            found.display()
        ),
    );
}

fn config_fix(error: &ConfigError) -> String {
    match error {
        ConfigError::Read { .. } => "make the file readable for your user, or remove it".into(),
        ConfigError::Parse { .. } => {
            "correct the file at that line; schema/config.schema.json lists every key".into()
        }
        ConfigError::Invalid { origin, key, .. } if origin == "environment" => {
            format!("correct or unset {key}")
        }
        ConfigError::Invalid { key, .. } => format!("correct `{key}` in the file"),
        ConfigError::Untrusted(untrusted) => untrusted.fix.clone(),
    }
}

async fn check_token(report: &mut Report, api: &BotApi, config: &Config) -> Option<BotInfo> {
    let subject = match config.bot_id() {
        Some(id) => format!("token {id}:…"),
        None => "token".into(),
    };
    match api.get_me().await {
        Ok(bot) => {
            report.pass("token", format!("bot @{} (id {})", bot.username, bot.id));
            Some(bot)
        }
        Err(TelegramError::Unauthorized) => {
            report.fail(
                subject,
                "Telegram rejected it (401 Unauthorized)",
                "copy the token again from @BotFather (/mybots → your bot → API Token); it may have been revoked",
            );
            None
        }
        Err(error) if error.is_transient() => {
            report.fail(
                subject,
                format!("cannot reach the Bot API at {}: {error}", config.api_url),
                "check the network connection, a proxy in between, or api_url",
            );
            None
        }
        Err(error) => {
            report.fail(
                subject,
                format!("getMe failed: {error}"),
                "check the token and api_url",
            );
            None
        }
    }
}

/// The private-chat mode (no `chat_id`): the topics go into the private chat
/// of the first allowed user (or of whoever pairs), which needs topics
/// enabled for the bot, and a chat the bot can reach.
async fn check_private_chat(report: &mut Report, api: &BotApi, bot: &BotInfo, users: &[i64]) {
    if !bot.has_topics_enabled {
        report.fail(
            "chat",
            "none configured, and the bot has no topics in private chats",
            format!("{TOPICS_SWITCH}, or set chat_id to a forum supergroup where the bot is an administrator (agent-relay setup does either)"),
        );
        return;
    }
    let Some(&user) = users.first() else {
        report.note(
            "chat",
            "private chat mode (the bot has topics enabled): the topics go into the private chat of whoever pairs; nobody is in allowed_users — run agent-relay setup, or /telegram-connect from a session",
        );
        return;
    };
    let subject = format!("chat {user}");
    match api.get_chat(user).await {
        Ok(chat) if chat.kind == ChatKind::Private => {
            let name = chat.first_name.as_deref().unwrap_or("the user");
            report.pass(
                subject,
                format!("private chat with {name} (the first of allowed_users); the bot has topics enabled"),
            );
            report.note("pacing", pacing_note(true));
        }
        Ok(_) => report.fail(
            subject,
            "the first of allowed_users is not a user's private chat",
            "put your own Telegram user id first in allowed_users (agent-relay setup finds it for you)",
        ),
        Err(TelegramError::ChatNotFound { .. } | TelegramError::Forbidden { .. }) => report.fail(
            subject,
            "the bot cannot reach this user's private chat (never started, or blocked)",
            format!("open https://t.me/{} on that user's phone and press Start", bot.username),
        ),
        Err(error) => report.fail(
            subject,
            format!("getChat failed: {error}"),
            "check allowed_users and the network",
        ),
    }
}

/// The checks of a forum group: that `chat_id` is a forum supergroup and the
/// bot may manage and delete topics there. `agent-relay setup` runs them on
/// the group it found.
pub(crate) async fn check_group(api: &BotApi, bot: &BotInfo, chat_id: i64) -> Report {
    let mut report = Report::default();
    check_chat(&mut report, api, bot, chat_id).await;
    report
}

async fn check_chat(report: &mut Report, api: &BotApi, bot: &BotInfo, chat_id: i64) {
    let subject = format!("chat {chat_id}");
    let chat = match api.get_chat(chat_id).await {
        Ok(chat) => chat,
        Err(TelegramError::ChatNotFound { .. }) => {
            report.fail(
                subject,
                "Telegram knows no such chat for this bot",
                "add the bot to the group, then check chat_id (a supergroup's id starts with -100)",
            );
            return;
        }
        Err(TelegramError::ChatMigrated { to_chat_id }) => {
            report.fail(
                subject,
                format!("the group became a supergroup with id {to_chat_id}"),
                format!("set chat_id to {to_chat_id}"),
            );
            return;
        }
        Err(error @ TelegramError::Forbidden { .. }) => {
            report.fail(
                subject,
                error.to_string(),
                "add the bot to the group as an administrator",
            );
            return;
        }
        Err(error) => {
            report.fail(
                subject,
                format!("getChat failed: {error}"),
                "check chat_id and the network",
            );
            return;
        }
    };
    let title = chat.title.as_deref().unwrap_or("untitled");
    match chat.kind {
        ChatKind::Supergroup if chat.is_forum => {
            report.pass(subject, format!("forum supergroup “{title}”"));
            check_rights(report, api, bot, chat_id).await;
            report.note("pacing", pacing_note(false));
        }
        ChatKind::Supergroup => report.fail(
            subject,
            format!("“{title}” is not a forum"),
            "enable Topics in the group settings (Edit → Topics)",
        ),
        ChatKind::Group => report.fail(
            subject,
            format!("“{title}” is a basic group, not a forum"),
            "enable Topics in the group settings; Telegram then moves it to a supergroup with a new id (-100…) to put in chat_id",
        ),
        ChatKind::Private if bot.has_topics_enabled => {
            report.pass(subject, "private chat; the bot has topics enabled");
            report.note("pacing", pacing_note(true));
        }
        ChatKind::Private => report.fail(
            subject,
            "a private chat, but the bot has topics disabled in private chats",
            format!("{TOPICS_SWITCH}, or set chat_id to a forum supergroup"),
        ),
        ChatKind::Channel | ChatKind::Other => report.fail(
            subject,
            "a channel cannot hold forum topics",
            "set chat_id to a forum supergroup",
        ),
    }
}

async fn check_rights(report: &mut Report, api: &BotApi, bot: &BotInfo, chat_id: i64) {
    let member = match api.get_chat_member(chat_id, bot.id).await {
        Ok(member) => member,
        Err(error) => {
            report.fail(
                "rights",
                format!("getChatMember failed: {error}"),
                "make sure the bot is still a member of the group",
            );
            return;
        }
    };
    let status = match member.status {
        ChatMemberStatus::Creator => "the owner",
        ChatMemberStatus::Administrator => "an administrator",
        ChatMemberStatus::Member => "a plain member",
        ChatMemberStatus::Restricted => "restricted",
        ChatMemberStatus::Left => "not in the group",
        ChatMemberStatus::Kicked => "banned from the group",
        ChatMemberStatus::Other => "of an unknown status",
    };
    if !member.may_manage_topics() {
        report.fail(
            "rights",
            format!("the bot is {status} without can_manage_topics, so it cannot create topics"),
            "make the bot an administrator with the “Manage topics” right (group settings → Administrators)",
        );
    } else if !member.may_delete_messages() {
        report.fail(
            "rights",
            format!(
                "the bot is {status} without can_delete_messages, so /telegram-disconnect cannot delete a topic"
            ),
            "give the bot the “Delete messages” right (group settings → Administrators)",
        );
    } else {
        report.pass(
            "rights",
            format!("the bot is {status} and may manage topics"),
        );
    }
}

/// Telegram's message limit for the chat the topics live in: what a user
/// with several busy sessions will meet, and the other mode's limit.
fn pacing_note(private: bool) -> String {
    if private {
        "Telegram lets a bot send about one message a second into a private chat, shared by all its topics (about 60 a minute; a forum group allows only about 20); answers that have to wait show as ⏳ paced in the status line and go out merged".into()
    } else {
        "Telegram lets a bot send about 20 messages a minute into one group, shared by every topic, so several busy sessions will wait (⏳ paced in the status line; answers that pile up go out merged); a private chat with topics allows about one a second (60 a minute) — leave chat_id unset to use it".into()
    }
}

fn check_users(report: &mut Report, users: &[i64]) {
    if users.is_empty() {
        report.note(
            "users",
            "none configured; pair your Telegram account with /telegram-connect from a session",
        );
    } else {
        let list: Vec<String> = users.iter().map(i64::to_string).collect();
        report.pass("users", format!("allowed: {}", list.join(", ")));
    }
}

/// Whether `agent-relay serve` runs (the leader knows: `serve` is a member
/// of the bus), and where it may start agents.
fn check_serve(
    report: &mut Report,
    serve: Option<crate::protocol::bus::ServeStatus>,
    launch: &crate::config::LaunchPolicy,
) {
    match serve {
        Some(serve) => report.pass(
            "serve",
            format!(
                "running: pid {}, starts {} (/new from the phone)",
                serve.pid,
                serve.engines.join(", ")
            ),
        ),
        None => report.note(
            "serve",
            "not running: /new from the phone needs it; run `agent-relay serve`, or `agent-relay install service` to keep it running",
        ),
    }
    if launch.roots.is_empty() {
        report.note(
            "launch",
            "no [launch] roots: starting agents from the phone is off until you name the folders they may work in",
        );
    } else {
        let roots: Vec<String> = launch
            .roots
            .iter()
            .map(|r| r.display().to_string())
            .collect();
        report.pass(
            "launch",
            format!("agents may be started in {}", roots.join(", ")),
        );
    }
}

/// Whether a leader answers; answers the `serve` it knows of.
async fn check_leader(
    report: &mut Report,
    paths: &Paths,
    bot: crate::ids::BotId,
) -> Option<crate::protocol::bus::ServeStatus> {
    // leader.json is for people only; the socket answering is the truth.
    let LeaderReport {
        status,
        recorded_pid,
    } = leader_report(paths, bot).await;
    match status {
        Ok(Some(status)) => {
            let live = status.sessions.iter().filter(|s| s.live).count();
            report.pass(
                "leader",
                format!(
                    "running: pid {}, epoch {}, {live} live session(s)",
                    status.leader_pid, status.epoch
                ),
            );
            return status.serve;
        }
        Ok(None) => match recorded_pid {
            Some(pid) => report.note(
                "leader",
                format!("none running (leader.json names pid {pid}, which no longer answers)"),
            ),
            None => report.note(
                "leader",
                "none running; the first session a host starts becomes the leader",
            ),
        },
        Err(error) => {
            let pid = recorded_pid.map_or_else(|| "?".to_string(), |pid| pid.to_string());
            report.fail(
                "leader",
                format!("the bus socket accepts but the leader does not answer: {error}"),
                format!("run /relay restart from a session, or end the leader process (pid {pid})"),
            );
        }
    }
    None
}

/// How the relay is added to Claude Code: the plugin, or the entries
/// `install claude-code` writes, and not both (two MCP servers in every
/// session, every hook twice). `binary` is what the plugin's launcher would
/// run, as far as this environment tells.
fn check_claude_code(
    report: &mut Report,
    installed: &Installed,
    binary: Result<std::path::PathBuf, String>,
) {
    const SUBJECT: &str = "Claude Code";
    for problem in &installed.unreadable {
        report.note(SUBJECT, problem.clone());
    }
    let plugin = installed.plugin.as_ref();
    let by_command = installed.by_command();
    if let Some(plugin) = plugin.filter(|p| !p.enabled) {
        report.note(
            SUBJECT,
            format!(
                "the plugin {} is installed but disabled (claude plugin enable {})",
                plugin.id, plugin.id
            ),
        );
    }
    match (plugin.filter(|p| p.enabled), by_command) {
        (None, false) => {
            if plugin.is_none() {
                report.note(
                    SUBJECT,
                    "not added: neither the plugin nor `agent-relay install claude-code` (README.md, “Use it with Claude Code”)",
                );
            }
        }
        (Some(plugin), true) => report.fail(
            SUBJECT,
            format!(
                "both the plugin {} and `agent-relay install claude-code` are active: every session starts two agent-relay MCP servers and runs each hook twice, so each prompt and answer reaches the topic twice",
                plugin.id
            ),
            format!(
                "keep one: `agent-relay install claude-code --remove` keeps the plugin; `claude plugin uninstall {}` keeps your settings files",
                plugin.id
            ),
        ),
        (Some(plugin), false) => {
            let version = plugin
                .version
                .as_deref()
                .map_or_else(String::new, |v| format!(" {v}"));
            match binary {
                Ok(binary) => report.pass(
                    SUBJECT,
                    format!(
                        "the plugin {}{version} is enabled and runs {}",
                        plugin.id,
                        binary.display()
                    ),
                ),
                Err(why) => report.fail(
                    SUBJECT,
                    format!("the plugin {} finds no binary: {why}", plugin.id),
                    "install it with `cargo install --locked --path .` in the agent-relay checkout, or set AGENT_RELAY_BIN in Claude Code's environment",
                ),
            }
        }
        (None, true) => check_installed_by_command(report, installed),
    }
}

/// The entries `install claude-code` wrote: all of them, naming a binary
/// that is still there.
fn check_installed_by_command(report: &mut Report, installed: &Installed) {
    use std::os::unix::fs::PermissionsExt as _;
    const SUBJECT: &str = "Claude Code";
    let fix = "run `agent-relay install claude-code` again (with the binary you mean to keep)";
    let Some(program) = &installed.server else {
        report.fail(
            SUBJECT,
            "`install claude-code`'s hooks are in settings.json, but its MCP server is not in ~/.claude.json",
            fix,
        );
        return;
    };
    let missing: Vec<&str> = install::HOOKS
        .iter()
        .map(|(event, _)| *event)
        .filter(|event| !installed.hooks.iter().any(|h| h == event))
        .collect();
    if !missing.is_empty() {
        report.fail(
            SUBJECT,
            format!(
                "`install claude-code`'s hooks lack {} in settings.json",
                missing.join(", ")
            ),
            fix,
        );
        return;
    }
    let runnable = std::fs::metadata(program)
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    if runnable {
        report.pass(
            SUBJECT,
            format!("added by `agent-relay install claude-code`: the MCP server and the hooks run {program}"),
        );
    } else {
        report.fail(
            SUBJECT,
            format!(
                "`install claude-code` added {program}, which is not an executable file any more"
            ),
            fix,
        );
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn the_pacing_note_names_the_group_limit_and_the_higher_private_one() {
        let group = pacing_note(false);
        assert!(
            group.contains("about 20 messages a minute into one group"),
            "{group}"
        );
        assert!(
            group.contains("private chat with topics allows about one a second"),
            "{group}"
        );
        assert!(group.contains("⏳ paced"), "{group}");
        let private = pacing_note(true);
        assert!(private.contains("about one message a second"), "{private}");
        assert!(
            private.contains("a forum group allows only about 20"),
            "{private}"
        );
        let mut report = Report::default();
        report.note("pacing", group);
        assert!(report.passed(), "a note is no failure");
        assert!(
            report
                .to_string()
                .starts_with("· pacing: Telegram lets a bot send")
        );
    }

    #[test]
    fn the_report_reads_as_one_line_per_check_and_never_shows_a_token() {
        let mut report = Report::default();
        report.pass("token", "bot @relay_test_bot (id 123456789)");
        report.fail(
            "chat -1001",
            "“x” is not a forum (123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_)",
            "enable Topics in the group settings",
        );
        report.note("state dir", "/tmp/state");
        assert!(!report.passed());
        assert_eq!(
            report.to_string(),
            "✓ token: bot @relay_test_bot (id 123456789)\n\
             ✗ chat -1001: “x” is not a forum (123456789:<redacted>) — fix: enable Topics in the group settings\n\
             · state dir: /tmp/state\n\
             1 problem found\n"
        );
    }

    #[test]
    fn the_transcribers_program_must_be_runnable() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        let config = |argv: &str| {
            std::fs::write(&file, format!("transcribe_command = {argv}\n")).unwrap();
            Config::load_with(&file, |_| None).unwrap()
        };
        let check = |config: &Config| {
            let mut report = Report::default();
            check_transcriber(&mut report, config, Some(dir.path().as_os_str().to_owned()));
            report
        };
        let script = dir.path().join("whisper-cli");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o700)).unwrap();

        let found = check(&config(r#"["whisper-cli", "-f"]"#));
        assert!(found.passed(), "{found}");
        assert!(found.to_string().contains("transcribed by"), "{found}");
        let missing = check(&config(r#"["no-such-whisper"]"#));
        assert!(!missing.passed(), "{missing}");
        assert!(
            missing.to_string().contains("give its full path"),
            "{missing}"
        );
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o600)).unwrap();
        let not_executable = check(&config(&format!("[{:?}]", script.display().to_string())));
        assert!(!not_executable.passed(), "{not_executable}");
        let unset = check(&Config::load_with(&dir.path().join("none.toml"), |_| None).unwrap());
        assert!(unset.passed(), "a note only: {unset}");
        assert!(unset.to_string().contains("audio files"), "{unset}");
    }

    #[test]
    fn opencode_is_found_on_path_and_its_absence_is_a_note() {
        use std::os::unix::fs::PermissionsExt as _;
        let bin = tempfile::tempdir().unwrap();
        let opencode = bin.path().join("opencode");
        std::fs::write(&opencode, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&opencode, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = bin.path().as_os_str();
        let mut found = Report::default();
        check_opencode(
            &mut found,
            std::path::Path::new("opencode"),
            Some("opencode"),
            Some(path),
        );
        assert!(found.passed());
        assert!(
            found.to_string().contains("`/new … opencode` starts it"),
            "{found}"
        );
        let mut absent = Report::default();
        let elsewhere = tempfile::tempdir().unwrap();
        check_opencode(
            &mut absent,
            std::path::Path::new("opencode"),
            None,
            Some(elsewhere.path().as_os_str()),
        );
        assert!(absent.passed(), "a note: {absent}");
        assert!(
            absent.to_string().contains("npm i -g opencode-ai"),
            "{absent}"
        );
    }

    #[test]
    fn notes_do_not_fail_a_report() {
        let mut report = Report::default();
        report.note("leader", "none running");
        report.pass("token", "ok");
        assert!(report.passed());
        assert!(report.to_string().ends_with("all checks passed\n"));
    }

    fn claude_report(installed: &Installed, binary: Result<std::path::PathBuf, String>) -> Report {
        let mut report = Report::default();
        check_claude_code(&mut report, installed, binary);
        report
    }

    fn plugin(enabled: bool) -> Option<install::Plugin> {
        Some(install::Plugin {
            id: "agent-relay@agent-relay".into(),
            enabled,
            install_path: None,
            version: Some("1a2b3c4d5e6f".into()),
        })
    }

    #[test]
    fn claude_code_has_the_plugin_or_the_commands_entries_and_never_both() {
        let found = || Ok(std::path::PathBuf::from("/usr/bin/agent-relay"));
        let none = claude_report(&Installed::default(), found());
        assert!(none.passed(), "{none}");
        assert!(
            none.to_string().contains("Claude Code: not added"),
            "{none}"
        );

        let with_plugin = Installed {
            plugin: plugin(true),
            ..Installed::default()
        };
        let ok = claude_report(&with_plugin, found());
        assert!(ok.passed(), "{ok}");
        assert!(
            ok.to_string().contains(
                "the plugin agent-relay@agent-relay 1a2b3c4d5e6f is enabled and runs /usr/bin/agent-relay"
            ),
            "{ok}"
        );
        let lost = claude_report(&with_plugin, Err("there is no agent-relay on PATH".into()));
        assert!(!lost.passed(), "{lost}");
        assert!(
            lost.to_string().contains("cargo install --locked"),
            "{lost}"
        );

        let dir = tempfile::tempdir().unwrap();
        let exe = dir.path().join("agent-relay");
        std::fs::write(&exe, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o700)).unwrap();
        let by_command = Installed {
            server: Some(exe.display().to_string()),
            hooks: install::HOOKS.iter().map(|(e, _)| e.to_string()).collect(),
            ..Installed::default()
        };
        let ok = claude_report(&by_command, found());
        assert!(ok.passed(), "{ok}");
        assert!(
            ok.to_string()
                .contains("added by `agent-relay install claude-code`"),
            "{ok}"
        );

        let both = Installed {
            plugin: plugin(true),
            ..by_command
        };
        let twice = claude_report(&both, found());
        assert!(!twice.passed(), "{twice}");
        let text = twice.to_string();
        assert!(
            text.contains("two agent-relay MCP servers and runs each hook twice"),
            "{text}"
        );
        assert!(
            text.contains("`agent-relay install claude-code --remove` keeps the plugin"),
            "{text}"
        );
        assert!(
            text.contains("`claude plugin uninstall agent-relay@agent-relay`"),
            "{text}"
        );

        // A disabled plugin beside the entries is no conflict.
        let disabled = Installed {
            plugin: plugin(false),
            ..both
        };
        let fine = claude_report(&disabled, found());
        assert!(fine.passed(), "{fine}");
        assert!(
            fine.to_string().contains("installed but disabled"),
            "{fine}"
        );
    }

    #[test]
    fn the_commands_entries_must_be_whole_and_name_a_binary_that_is_there() {
        let all: Vec<String> = install::HOOKS.iter().map(|(e, _)| e.to_string()).collect();
        let gone = Installed {
            server: Some("/no/such/agent-relay".into()),
            hooks: all.clone(),
            ..Installed::default()
        };
        let report = claude_report(&gone, Err(String::new()));
        assert!(!report.passed());
        assert!(
            report
                .to_string()
                .contains("not an executable file any more"),
            "{report}"
        );
        let partial = Installed {
            server: Some("/bin/sh".into()),
            hooks: all[..2].to_vec(),
            ..Installed::default()
        };
        let report = claude_report(&partial, Err(String::new()));
        assert!(
            report.to_string().contains("hooks lack PreToolUse"),
            "{report}"
        );
        let hooks_only = Installed {
            hooks: all,
            ..Installed::default()
        };
        let report = claude_report(&hooks_only, Err(String::new()));
        assert!(
            report.to_string().contains("its MCP server is not in"),
            "{report}"
        );
    }
}

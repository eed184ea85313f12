//! `agent-relay setup`: the first run, in a terminal (docs/DESIGN.md,
//! *Setup*).
//!
//! It checks the token with `getMe`, lets the user choose where the topics
//! live — the private chat with the bot (when the bot has topics there:
//! `getMe` → `has_topics_enabled`; setup says what to switch on in
//! @BotFather) or a forum group — pairs the user's Telegram account through
//! a deep link (`https://t.me/<bot>?start=<code>`, also as a QR code),
//! finds the group from the user's first message there and checks the
//! bot's rights as `doctor` does, writes `config.toml` and says hello in a
//! first topic. A rerun shows what is configured (never the token) and
//! changes it only when asked.
//!
//! Reading updates makes setup a poller of the bot, and a bot has one
//! poller: setup polls only while it holds the bus lock (`bus.lock`,
//! [`BusDir::try_lock`]), so no sidecar becomes leader and polls meanwhile,
//! and while a leader runs it does not poll at all (pairing is then
//! `/telegram-connect`'s job). Which updates it takes, and how it leaves
//! everything else to the relay, is [`inbox`]'s doc; how it writes the file
//! is [`file`]'s.

mod console;
mod file;
mod inbox;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use console::Console;

use crate::bus::election::{BusDir, LeaderLock};
use crate::config::{BotToken, Config, ConfigError};
use crate::doctor;
use crate::paths::{Paths, UntrustedPath};
use crate::telegram::TOPICS_SWITCH;
use crate::telegram::call::CreateForumTopic;
use crate::telegram::types::{LinkPreviewOptions, SendMessage};
use crate::telegram::{BotApi, BotCall, BotInfo, BotReply, ChatKind, Message, TelegramError};
use file::{Chat, ConfigDocument, FileError, Managed};
use inbox::{OwnUpdates, OwnUpdatesError};

/// How long setup waits for the user's Start, or their group message.
const WAIT_FOR_USER: Duration = Duration::from_secs(600);
/// A Bot API call other than a long poll.
const CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// Tries at typing a token before setup gives up.
const TOKEN_TRIES: usize = 3;
/// The topic setup says hello in.
const HELLO_TOPIC: &str = "agent-relay";

/// Why setup stopped. None of the messages contains the token.
#[derive(Debug, thiserror::Error)]
pub enum SetupStopped {
    #[error(
        "setup is interactive and needs a terminal. Without one, set TELEGRAM_BOT_TOKEN and AGENT_RELAY_ALLOWED_USERS (your Telegram user id), and AGENT_RELAY_CHAT_ID for a forum group — or bot_token, allowed_users and chat_id in {} (chmod 600) — then check with `agent-relay doctor`",
        .0.display()
    )]
    NoTerminal(PathBuf),
    #[error("setup stopped; nothing was written")]
    Aborted,
    #[error(transparent)]
    Untrusted(#[from] UntrustedPath),
    #[error(
        "the configuration cannot be used: {0}; correct it (or move the file away) and run setup again"
    )]
    Config(ConfigError),
    #[error(transparent)]
    File(#[from] FileError),
    #[error(
        "a relay is running for @{bot}{}: it alone reads the bot's updates, so setup does not. Pair from one of its sessions with /telegram-connect, or close your agent sessions and run setup again",
        .pid.map(|pid| format!(" (leader pid {pid})")).unwrap_or_default()
    )]
    LeaderRunning { bot: String, pid: Option<u32> },
    #[error("cannot use the bus directory: {0}")]
    Bus(String),
    #[error("cannot start: {0}")]
    Client(String),
    #[error("cannot reach the Bot API at {url}: {error}; check the network, a proxy, or api_url")]
    Unreachable { url: String, error: TelegramError },
    #[error(
        "Telegram rejected the token in TELEGRAM_BOT_TOKEN (401 Unauthorized): correct or unset it, and run setup again"
    )]
    EnvTokenRejected,
    #[error(
        "no working token after {TOKEN_TRIES} tries; copy it again from @BotFather (/mybots → your bot → API Token)"
    )]
    NoToken,
    #[error(transparent)]
    OwnUpdates(#[from] OwnUpdatesError),
    #[error("Telegram: {0}")]
    Telegram(#[from] TelegramError),
}

impl From<console::Aborted> for SetupStopped {
    fn from(_: console::Aborted) -> Self {
        Self::Aborted
    }
}

/// How setup ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Configured and greeted.
    Done,
    /// A rerun the user left as it was.
    Unchanged,
    /// Configured, but the hello did not get through (`doctor` says why).
    NoHello,
}

/// Everything setup needs, checked by `config::Setup` first.
pub struct Start {
    pub console: Console,
    /// The checked directories.
    pub paths: Paths,
    /// The configuration as the relay would use it (file and environment).
    pub config: Result<Config, ConfigError>,
    /// This program, to find the pi extension beside it.
    pub exe: Option<PathBuf>,
}

/// The configuration file's path, for the refusal without a terminal.
pub fn no_terminal(paths: &Paths) -> SetupStopped {
    SetupStopped::NoTerminal(paths.config_file())
}

/// Runs setup to the end.
pub fn run(start: Start) -> Result<Outcome, SetupStopped> {
    let config = start.config.map_err(|e| match e {
        ConfigError::Untrusted(untrusted) => SetupStopped::Untrusted(untrusted),
        other => SetupStopped::Config(other),
    })?;
    let document = ConfigDocument::read(&start.paths.config_file())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| SetupStopped::Client(format!("the async runtime: {e}")))?;
    Wizard {
        console: start.console,
        paths: start.paths,
        config,
        document,
        exe: start.exe,
        rt,
    }
    .run()
}

/// Where the topics go, as the user chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Private,
    Group,
}

/// Where the token comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenSource {
    Environment,
    File,
    Typed,
}

struct Wizard {
    console: Console,
    paths: Paths,
    config: Config,
    document: ConfigDocument,
    exe: Option<PathBuf>,
    rt: tokio::runtime::Runtime,
}

/// A checked token, the client made with it and the bot it belongs to.
struct Bot {
    token: BotToken,
    api: BotApi,
    info: BotInfo,
}

impl Wizard {
    fn say(&self, text: &str) {
        self.console.say(text);
    }

    fn run(self) -> Result<Outcome, SetupStopped> {
        self.say(
            "agent-relay setup: one Telegram bot for every coding-agent session on this machine.",
        );
        let Some(source) = self.token_source()? else {
            self.say("Nothing changed.");
            return Ok(Outcome::Unchanged);
        };
        let bot = self.bot(source)?;
        self.say(&format!(
            "✓ the token works: bot @{} (id {})",
            bot.info.username, bot.info.id
        ));
        // Before asking anything more: is a relay running for this bot?
        drop(self.bus_lock(&bot)?);

        let mut mode = self.choose_mode()?;
        let mut bot = bot;
        if mode == Mode::Private {
            mode = self.topics_on(&mut bot)?;
        }

        // From here on setup polls, and only while it holds the bus lock.
        let lock = self.bus_lock(&bot)?;
        self.rt.block_on(bot.api.delete_webhook(false))?;
        let mut inbox = OwnUpdates::new(&bot.api);
        let (user, name) = self.pair(&bot, &mut inbox)?;
        self.say(&format!("✓ paired with {name} (user id {user})"));
        let chat = match mode {
            Mode::Private => Chat::Private,
            Mode::Group => Chat::Group(self.find_group(&bot, &mut inbox, user)?),
        };
        self.confirm_updates(&mut inbox);
        drop(inbox);

        self.write(&bot, user, chat)?;
        let chat_id = match chat {
            Chat::Private => user,
            Chat::Group(id) => id,
        };
        let hello = self.hello(&bot, chat_id);
        drop(lock);
        self.warn_about_overrides();
        self.next_steps(chat);
        Ok(if hello {
            Outcome::Done
        } else {
            Outcome::NoHello
        })
    }

    /// Where the token comes from: the environment, typed, or (on a rerun
    /// that keeps the bot) the file; `None` when a rerun changes nothing.
    fn token_source(&self) -> Result<Option<TokenSource>, SetupStopped> {
        let env_token = env_set("TELEGRAM_BOT_TOKEN");
        let typed_or_env = if env_token {
            TokenSource::Environment
        } else {
            TokenSource::Typed
        };
        if !self.document.is_configured() {
            return Ok(Some(typed_or_env));
        }
        self.show_configuration()?;
        if !self.console.confirm("Change it?", false)? {
            return Ok(None);
        }
        if env_token || self.document.values.bot_token.is_none() {
            return Ok(Some(typed_or_env));
        }
        let keep = match self.config.token.as_ref().map(BotToken::bot_id) {
            Some(id) => self.console.confirm(&format!("Keep bot {id}?"), true)?,
            None => false,
        };
        Ok(Some(if keep {
            TokenSource::File
        } else {
            typed_or_env
        }))
    }

    /// Writes `config.toml`: the bot's token, `user` allowed, the topics in
    /// `chat`; and says so.
    fn write(&self, bot: &Bot, user: i64, chat: Chat) -> Result<(), SetupStopped> {
        let managed = Managed {
            token: bot.token.expose().to_string(),
            user,
            chat,
        };
        let written = self.document.write(&managed)?;
        let place = match chat {
            Chat::Private => "the topics go into your private chat with the bot".to_string(),
            Chat::Group(id) => format!("the topics go into the group {id}"),
        };
        self.say(&format!(
            "✓ wrote {} (mode 600): the bot's token, you (user id {user}) in allowed_users; {place}",
            written.path().display()
        ));
        Ok(())
    }

    /// A rerun: what the file holds, never the token.
    fn show_configuration(&self) -> Result<(), SetupStopped> {
        let values = &self.document.values;
        self.say(&format!(
            "agent-relay is set up in {}:",
            self.document.path().display()
        ));
        let bot = match &self.config.token {
            None => "none".to_string(),
            Some(token) => {
                let id = token.bot_id();
                let checked = BotApi::new(&self.config.api_url, token)
                    .ok()
                    .map(|api| self.rt.block_on(api.with_timeout(CALL_TIMEOUT).get_me()));
                match checked {
                    Some(Ok(info)) => format!("@{} (id {id})", info.username),
                    Some(Err(e)) => format!("id {id} (getMe failed: {e})"),
                    None => format!("id {id}"),
                }
            }
        };
        self.say(&format!("  bot:    {bot} — the token is not shown"));
        let users = values.allowed_users.clone().unwrap_or_default();
        let topics = match (values.chat_id, users.first()) {
            (Some(chat), _) => format!("the forum group {chat}"),
            (None, Some(user)) => format!("the private chat of user {user}"),
            (None, None) => "not chosen yet".to_string(),
        };
        self.say(&format!("  topics: {topics}"));
        let users: Vec<String> = users.iter().map(i64::to_string).collect();
        let users = if users.is_empty() {
            "none".to_string()
        } else {
            users.join(", ")
        };
        self.say(&format!("  users:  {users}"));
        let others = self.document.other_keys();
        if !others.is_empty() {
            self.say(&format!(
                "  also:   {} (setup leaves these as they are)",
                others.join(", ")
            ));
        }
        self.warn_about_overrides();
        Ok(())
    }

    /// Environment variables that beat the file at run time.
    fn warn_about_overrides(&self) {
        for (var, key) in [
            ("TELEGRAM_BOT_TOKEN", "bot_token"),
            ("AGENT_RELAY_CHAT_ID", "chat_id"),
            ("AGENT_RELAY_ALLOWED_USERS", "allowed_users"),
        ] {
            if env_set(var) {
                self.say(&format!(
                    "  note: {var} is set in this shell and overrides {key} in the file"
                ));
            }
        }
    }

    /// The token from `source`, checked with `getMe`; typed ones are asked
    /// for again when Telegram or the shape check refuses them.
    fn bot(&self, mut source: TokenSource) -> Result<Bot, SetupStopped> {
        if source == TokenSource::Environment {
            self.say("Using the token from TELEGRAM_BOT_TOKEN.");
        }
        let mut tries = 0;
        loop {
            let token = match (source, &self.config.token) {
                (TokenSource::Environment | TokenSource::File, Some(token)) => token.clone(),
                _ => {
                    if tries == TOKEN_TRIES {
                        return Err(SetupStopped::NoToken);
                    }
                    tries += 1;
                    if tries == 1 {
                        self.say("Paste your bot's token from @BotFather (/newbot makes a bot; /mybots → API Token shows one). It is not shown as you type.");
                    }
                    let typed = self.console.ask_secret("Bot token: ")?;
                    match BotToken::parse(&typed) {
                        Ok(token) => token,
                        Err(why) => {
                            self.say(&format!("✗ that is not a bot token: {why}"));
                            source = TokenSource::Typed;
                            continue;
                        }
                    }
                }
            };
            let api = BotApi::new(&self.config.api_url, &token)
                .map_err(|e| SetupStopped::Client(e.to_string()))?
                .with_timeout(CALL_TIMEOUT);
            match self.rt.block_on(api.get_me()) {
                Ok(info) => return Ok(Bot { token, api, info }),
                Err(TelegramError::Unauthorized) => match source {
                    TokenSource::Environment => return Err(SetupStopped::EnvTokenRejected),
                    TokenSource::File => {
                        self.say("✗ Telegram rejects the token in the file (401 Unauthorized); it may have been revoked.");
                        source = TokenSource::Typed;
                    }
                    TokenSource::Typed => {
                        self.say("✗ Telegram rejected that token (401 Unauthorized). Copy it again from @BotFather.");
                    }
                },
                Err(error) if error.is_transient() => {
                    return Err(SetupStopped::Unreachable {
                        url: self.config.api_url.clone(),
                        error,
                    });
                }
                Err(error) => return Err(error.into()),
            }
        }
    }

    /// The bus lock of the bot: refused while a leader (or another setup)
    /// holds it.
    fn bus_lock(&self, bot: &Bot) -> Result<LeaderLock, SetupStopped> {
        let bus = BusDir::open_checked(self.paths.bus_dir(bot.token.bot_id()))?;
        match bus.try_lock() {
            Ok(Some(lock)) => Ok(lock),
            Ok(None) => Err(SetupStopped::LeaderRunning {
                bot: bot.info.username.clone(),
                pid: bus.leader_info().map(|info| info.pid),
            }),
            Err(e) => Err(SetupStopped::Bus(e.to_string())),
        }
    }

    fn choose_mode(&self) -> Result<Mode, SetupStopped> {
        let default = if self.document.values.chat_id.is_some() {
            Mode::Group
        } else {
            Mode::Private
        };
        self.say("Where should your sessions' topics be?");
        self.say("  1  in your private chat with the bot (recommended: nothing else to set up)");
        self.say("  2  in a forum group (the bot must be an administrator there)");
        let default_key = if default == Mode::Private { "1" } else { "2" };
        loop {
            match self
                .console
                .ask(&format!("Choose 1 or 2 [{default_key}]: "))?
                .as_str()
            {
                "" => return Ok(default),
                "1" => return Ok(Mode::Private),
                "2" => return Ok(Mode::Group),
                _ => self.say("Please type 1 or 2."),
            }
        }
    }

    /// Waits until the bot has topics in private chats, saying how to
    /// switch them on; the user may choose a group instead.
    fn topics_on(&self, bot: &mut Bot) -> Result<Mode, SetupStopped> {
        loop {
            if bot.info.has_topics_enabled {
                self.say(&format!(
                    "✓ @{} has topics in private chats",
                    bot.info.username
                ));
                return Ok(Mode::Private);
            }
            self.say(&format!(
                "✗ @{} has no topics in private chats yet (getMe: has_topics_enabled is false).",
                bot.info.username
            ));
            self.say(&format!("  To switch them on: {TOPICS_SWITCH}."));
            let answer = self
                .console
                .ask("Press Enter once it is on to check again (or type 2 to use a forum group instead): ")?;
            if answer == "2" {
                return Ok(Mode::Group);
            }
            bot.info = self.rt.block_on(bot.api.get_me())?;
        }
    }

    /// The deep link, and the wait for its `/start`. Returns the user's id
    /// and first name.
    fn pair(&self, bot: &Bot, inbox: &mut OwnUpdates<'_>) -> Result<(i64, String), SetupStopped> {
        // The code grants control of the user's agents: from the OS's
        // CSPRNG (122 random bits), like the relay's own pairing codes.
        let code = uuid::Uuid::new_v4().simple().to_string();
        let link = format!("https://t.me/{}?start={code}", bot.info.username);
        self.say("");
        self.say("Pair your Telegram account: open this link on your phone (or scan the code) and press Start:");
        self.say("");
        self.say(&format!("  {link}"));
        self.say("");
        if let Some(qr) = console::qr_code(&link) {
            self.say(&qr);
        }
        self.say("Waiting for your Start… (Ctrl-C stops setup; nothing is written before you are paired)");
        let deadline = tokio::time::Instant::now() + WAIT_FOR_USER;
        Ok(self
            .rt
            .block_on(inbox.wait_for(deadline, |message| started_with(message, &code)))?)
    }

    /// The group: the first message the paired user writes in one, then the
    /// doctor's checks until they pass.
    fn find_group(
        &self,
        bot: &Bot,
        inbox: &mut OwnUpdates<'_>,
        user: i64,
    ) -> Result<i64, SetupStopped> {
        let name = &bot.info.username;
        self.say("");
        self.say("Now the group:");
        self.say(
            "  1. In Telegram, create a group (or open one) and turn on Topics in its settings.",
        );
        self.say(&format!(
            "  2. Add @{name} to it and make it an administrator with the rights “Manage topics” and “Delete messages”."
        ));
        self.say(&format!("  3. Send /start@{name} in the group."));
        self.say("Waiting for your message in the group… (only yours counts)");
        let deadline = tokio::time::Instant::now() + WAIT_FOR_USER;
        let (mut chat, title) = self.rt.block_on(inbox.wait_for(deadline, |message| {
            let from = message.from.as_ref()?;
            let group = matches!(message.chat.kind, ChatKind::Group | ChatKind::Supergroup);
            (group && from.id == user).then(|| (message.chat.id, message.chat.title.clone()))
        }))?;
        self.say(&format!(
            "✓ found the group “{}” (id {chat})",
            title.as_deref().unwrap_or("untitled")
        ));
        loop {
            if let Err(TelegramError::ChatMigrated { to_chat_id }) =
                self.rt.block_on(bot.api.get_chat(chat))
            {
                self.say(&format!(
                    "  the group became a supergroup with id {to_chat_id}"
                ));
                chat = to_chat_id;
            }
            let report = self
                .rt
                .block_on(doctor::check_group(&bot.api, &bot.info, chat));
            for check in &report.checks {
                self.say(&check.to_string());
            }
            if report.passed() {
                return Ok(chat);
            }
            self.console
                .ask("Fix that in Telegram, then press Enter to check again: ")?;
        }
    }

    /// Confirms what setup took, as far as that loses nobody else's
    /// updates (see [`inbox`]).
    fn confirm_updates(&self, inbox: &mut OwnUpdates<'_>) {
        match self.rt.block_on(inbox.confirm()) {
            Ok(_) if inbox.left_for_the_relay() > 0 => self.say(
                "  note: messages sent to the bot before your Start stay for the relay, and so does your Start: when the relay starts it may answer that the code has expired — you are paired all the same",
            ),
            Ok(_) => {}
            Err(e) => self.say(&format!(
                "  note: could not tell Telegram that setup read your Start ({e}); the relay may answer it later with “code expired” — you are paired all the same"
            )),
        }
    }

    /// A first topic with a hello in it. Returns whether it got through.
    fn hello(&self, bot: &Bot, chat: i64) -> bool {
        let text = "👋 agent-relay is set up. Each agent session you start on your computer gets a topic of its own here: what you write in it goes to that agent, and its answers come back.".to_string();
        let sent = self.rt.block_on(async {
            let create = BotCall::CreateForumTopic(CreateForumTopic {
                chat_id: chat,
                name: HELLO_TOPIC.into(),
            });
            let thread = match bot.api.perform(&create).await? {
                BotReply::Topic { message_thread_id } => message_thread_id,
                other => {
                    return Err(TelegramError::Malformed {
                        message: format!("createForumTopic answered {other:?}"),
                        commit_unknown: true,
                    });
                }
            };
            bot.api
                .send_message(SendMessage {
                    chat_id: chat,
                    message_thread_id: Some(thread),
                    text,
                    parse_mode: None,
                    reply_markup: None,
                    reply_parameters: None,
                    link_preview_options: Some(LinkPreviewOptions::default()),
                })
                .await
        });
        match sent {
            Ok(_) => {
                self.say(&format!("✓ said hello in a topic “{HELLO_TOPIC}”"));
                true
            }
            Err(e) => {
                self.say(&format!(
                    "✗ could not say hello in a first topic: {e} — run `agent-relay doctor` to see why"
                ));
                false
            }
        }
    }

    fn next_steps(&self, chat: Chat) {
        // Each coding agent installs the relay its own way (README.md, "Use it
        // with pi", "Use it with Claude Code"); from a checkout, the commands
        // name it.
        let source = self.exe.as_deref().and_then(checkout).map_or_else(
            || "<the agent-relay repository, or a clone of it>".to_string(),
            |p| p.display().to_string(),
        );
        let place = match chat {
            Chat::Private => "your private chat with the bot",
            Chat::Group(_) => "the group",
        };
        self.say("");
        self.say("Next, add the relay to your coding agent:");
        self.say("");
        self.say(&format!("  pi:           pi install {source}"));
        self.say(&format!(
            "  Claude Code:  claude plugin marketplace add {source}"
        ));
        // The plugin `agent-relay` of the marketplace `agent-relay`
        // (`.claude-plugin/marketplace.json`).
        self.say("                claude plugin install agent-relay@agent-relay");
        self.say("");
        self.say(&format!(
            "Each session gets a topic of its own in {place}. `agent-relay doctor` checks the setup at any time; `agent-relay setup` again changes it."
        ));
    }
}

/// `/start <code>` in a private chat, from a person: their id and name.
fn started_with(message: &Message, code: &str) -> Option<(i64, String)> {
    let from = message.from.as_ref().filter(|u| !u.is_bot)?;
    if message.chat.kind != ChatKind::Private {
        return None;
    }
    let mut words = message.text.as_deref()?.split_whitespace();
    let command = words.next()?;
    let start = command == "/start" || command.starts_with("/start@");
    (start && words.next() == Some(code) && words.next().is_none())
        .then(|| (from.id, from.first_name.clone()))
}

/// The checkout this program was built in (`target/release/agent-relay`):
/// the pi package and the Claude Code marketplace both are its root.
fn checkout(exe: &Path) -> Option<PathBuf> {
    exe.ancestors().skip(1).find_map(|dir| {
        (dir.join("scripts/pi-extension.ts").is_file()
            && dir.join(".claude-plugin/marketplace.json").is_file())
        .then(|| dir.to_path_buf())
    })
}

fn env_set(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| !v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn message(chat: serde_json::Value, from: i64, text: &str) -> Message {
        serde_json::from_value(json!({
            "message_id": 1, "date": 1, "chat": chat, "text": text,
            "from": {"id": from, "is_bot": false, "first_name": "Ada"}
        }))
        .unwrap()
    }

    #[test]
    fn only_the_code_in_a_private_chat_pairs() {
        let private = json!({"id": 7, "type": "private"});
        let group = json!({"id": -100, "type": "supergroup"});
        let code = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            started_with(
                &message(private.clone(), 7, &format!("/start {code}")),
                code
            ),
            Some((7, "Ada".into()))
        );
        for text in [
            "/start".to_string(),
            "/start wrong".to_string(),
            format!("/start {code} extra"),
            format!("hello {code}"),
        ] {
            assert_eq!(
                started_with(&message(private.clone(), 7, &text), code),
                None,
                "{text}"
            );
        }
        assert_eq!(
            started_with(&message(group, 7, &format!("/start {code}")), code),
            None,
            "a group is no pairing place"
        );
    }

    #[test]
    fn the_checkout_is_found_from_its_build() {
        let tmp = tempfile::tempdir().unwrap();
        let bin = tmp.path().join("target/release");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(tmp.path().join("scripts")).unwrap();
        std::fs::create_dir_all(tmp.path().join(".claude-plugin")).unwrap();
        assert_eq!(checkout(&bin.join("agent-relay")), None);
        std::fs::write(tmp.path().join("scripts/pi-extension.ts"), "").unwrap();
        std::fs::write(tmp.path().join(".claude-plugin/marketplace.json"), "{}").unwrap();
        assert_eq!(
            checkout(&bin.join("agent-relay")),
            Some(tmp.path().to_path_buf())
        );
    }
}

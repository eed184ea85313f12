//! Configuration: `config.toml` in the config dir, overridden by environment
//! variables (docs/DESIGN.md, "Configuration"). A bad file is an error that
//! names the file and the
//! key; the sidecar shows it and keeps serving the host.
//!
//! [`Setup`] is the one way a command that uses the relay's files starts:
//! resolve the directories, check them (see [`crate::paths`]), read the
//! config file only if it is the user's own and not writable by others, then
//! check the bot's bus directory and store. A file or directory that fails is
//! a [`ConfigError::Untrusted`], so nothing is read from it and no token is
//! sent anywhere it names.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::ids::{BotId, NodeName};
use crate::paths::{Missing, Paths, PathsError, UntrustedPath, open_private_file};
use crate::policy::{ApprovalsFile, Policy};
use crate::redact::{MIN_SECRET_CHARS, redact};

pub const DEFAULT_API_URL: &str = "https://api.telegram.org";

/// The contents of `config.toml`. Every key is optional; unknown keys are an
/// error so that a typo does not silently do nothing.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "agent-relay config.toml")]
pub struct ConfigFile {
    /// The bot token from @BotFather (`<bot id>:<secret>`). Env: `TELEGRAM_BOT_TOKEN`.
    pub bot_token: Option<String>,
    /// The chat that holds the topics: a forum supergroup (`-100…`) or the
    /// private chat with the user when the bot has topics enabled.
    /// Env: `AGENT_RELAY_CHAT_ID`.
    pub chat_id: Option<i64>,
    /// Telegram user ids allowed to drive sessions. Empty: pair with
    /// `/telegram-connect`. Env: `AGENT_RELAY_ALLOWED_USERS` (comma-separated).
    pub allowed_users: Option<Vec<i64>>,
    /// Bot API base URL. Env: `AGENT_RELAY_API_URL`.
    pub api_url: Option<String>,
    /// Join the bus as soon as the host is initialized (default true); when
    /// false the session waits for `/telegram-connect`.
    pub auto_connect: Option<bool>,
    /// Mark each message written in a topic with what became of it, as the
    /// bot's reaction on it: 👀 once the agent took it, 💔 when it could not
    /// be delivered (default true).
    pub receipts: Option<bool>,
    /// Which tool calls wait for a person's approval, and where they ask.
    pub approvals: Option<ApprovalsFile>,
    /// One bot across several machines, over NATS JetStream
    /// (docs/CLUSTER.md). Without this section the relay is the
    /// single-machine relay and needs no server.
    pub cluster: Option<ClusterFile>,
    /// Speech to text for voice notes: a program and its arguments, run
    /// without a shell, e.g. `["whisper-cli", "-m", "/models/ggml-base.bin",
    /// "-nt", "-f", "{file}"]`. The audio file's path replaces `{file}` (or
    /// is added at the end); what the program prints is the transcript.
    pub transcribe_command: Option<CommandLine>,
    /// Seconds `transcribe_command` may run before it is killed (default
    /// 120).
    pub transcribe_timeout_s: Option<u64>,
    /// Files, photos and voice notes both ways.
    pub files: Option<FilesFile>,
    /// Sessions the relay starts itself (`agent-relay serve`, `/new` from
    /// the phone).
    pub launch: Option<LaunchFile>,
    /// What each allowed user may do, when several share the bot.
    pub access: Option<AccessFile>,
    /// Scheduled prompts (`/every`, `/at`).
    pub schedules: Option<SchedulesFile>,
}

/// `[access]` in `config.toml`: roles, for a bot several people share.
/// Every user named here may use the bot (as those in `allowed_users`);
/// an allowed user named nowhere here is an owner, so one person's relay
/// needs none of this.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AccessFile {
    /// Everything: sessions started, ended and resumed from the phone,
    /// schedules, every question and approval.
    pub owners: Option<Vec<i64>>,
    /// Write to sessions and answer their questions (approvals as
    /// `[approvals] by` says); no `/new`, `/end`, `/resume` or schedules.
    pub drivers: Option<Vec<i64>>,
    /// Read only: their messages reach no agent and are answered with why.
    pub viewers: Option<Vec<i64>>,
}

/// `[schedules]` in `config.toml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SchedulesFile {
    /// What a scheduled turn does when a tool call needs approval: `ask`
    /// (the default: the phone is asked, as for any turn) or `deny` (at
    /// once, without a person: a turn at 3 a.m. does not wait for a phone
    /// that sleeps).
    pub approvals: Option<crate::policy::Scheduled>,
}

/// What a user may do with the bot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Owner,
    Driver,
    Viewer,
}

impl Role {
    /// Whether the user may write to sessions (their messages are prompts).
    pub fn writes(self) -> bool {
        self != Self::Viewer
    }

    /// Whether this role may do what `needed` may.
    pub fn covers(self, needed: Role) -> bool {
        let rank = |role| match role {
            Self::Viewer => 0,
            Self::Driver => 1,
            Self::Owner => 2,
        };
        rank(self) >= rank(needed)
    }

    /// The role's name as `[access]` spells it, singular.
    pub fn name(self) -> &'static str {
        match self {
            Self::Owner => "an owner",
            Self::Driver => "a driver",
            Self::Viewer => "a viewer",
        }
    }
}

/// `[access]`, checked: no user in two roles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roles {
    pub owners: Vec<i64>,
    pub drivers: Vec<i64>,
    pub viewers: Vec<i64>,
}

impl Roles {
    fn from_file(file: AccessFile) -> Result<Self, (&'static str, String)> {
        let roles = Self {
            owners: file.owners.unwrap_or_default(),
            drivers: file.drivers.unwrap_or_default(),
            viewers: file.viewers.unwrap_or_default(),
        };
        let named = [
            ("access.owners", &roles.owners),
            ("access.drivers", &roles.drivers),
            ("access.viewers", &roles.viewers),
        ];
        for (i, (key, users)) in named.iter().enumerate() {
            for user in users.iter() {
                if let Some((other, _)) = named[i + 1..].iter().find(|(_, u)| u.contains(user)) {
                    return Err((
                        key,
                        format!("user {user} is also in {other}: one role each"),
                    ));
                }
            }
        }
        Ok(roles)
    }

    /// Every user the roles name.
    pub fn users(&self) -> impl Iterator<Item = i64> + '_ {
        self.owners
            .iter()
            .chain(&self.drivers)
            .chain(&self.viewers)
            .copied()
    }

    /// The role of an allowed `user`: an owner unless named a driver or a
    /// viewer.
    pub fn of(&self, user: i64) -> Role {
        if self.viewers.contains(&user) {
            Role::Viewer
        } else if self.drivers.contains(&user) {
            Role::Driver
        } else {
            Role::Owner
        }
    }
}

/// `[launch]` in `config.toml`: where `/new` may start agents, and how.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchFile {
    /// Folders agents may be started in from the phone, with everything
    /// beneath them (absolute, or starting with `~/`). None by default:
    /// `/new` then says how to allow one.
    pub roots: Option<Vec<String>>,
    /// End a launched session that had no turn for this many hours; the
    /// next message resumes it (default: never).
    pub idle_end_hours: Option<f64>,
    /// How many agents `agent-relay serve` runs at once on this machine;
    /// `/new` and a resume past it are refused, saying so (default 8, 1 to
    /// 64).
    pub max_agents: Option<u32>,
    /// Seconds a launched agent has to join the relay (its session
    /// registered) before its start is given up and the agent ended
    /// (default 90, 5 to 90: a machine asked through the cluster waits no
    /// longer).
    pub join_within_s: Option<u64>,
    /// The engine `/new` starts when none is named: `pi`, `claude` or
    /// `codex` (default `pi`). `default_engine`, the name an earlier README
    /// gave it, is read as this.
    #[serde(alias = "default_engine")]
    pub engine: Option<String>,
    /// How to run each engine, as a list of arguments (no shell); the relay
    /// adds what makes it headless. Default: `pi = ["pi"]`,
    /// `claude = ["claude"]`, `codex = ["codex"]`. pi gets the relay's extension from
    /// `agent-relay serve` unless its settings load the package (`pi install`) or this
    /// names it with `-e`.
    pub commands: Option<std::collections::BTreeMap<String, CommandLine>>,
}

/// A command line as a list of arguments. A single string is refused with a
/// clear error rather than split: there is no shell to quote for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum CommandLine {
    Arguments(Vec<String>),
    /// Refused when read: a list of arguments is needed.
    Text(String),
}

/// `[files]` in `config.toml`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FilesFile {
    /// Megabytes each session's inbox (the files received from Telegram)
    /// may hold; the oldest files are removed first (default 200, at least
    /// 20: one Telegram download).
    pub inbox_max_mb: Option<u64>,
    /// Folders besides the session's working directory that the agent may
    /// send files from (absolute, or starting with `~/`).
    pub send_from: Option<Vec<String>>,
    /// Send an answer that is mostly one long code block or diff as a file
    /// instead of many messages (default true).
    pub long_answers_as_file: Option<bool>,
}

/// What `[launch]` comes to (docs/DESIGN.md, *Launching*).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchPolicy {
    /// Absolute folders, `~` expanded; links are resolved where they are
    /// used, since a root may not exist yet.
    pub roots: Vec<PathBuf>,
    pub idle_end: Option<std::time::Duration>,
    /// How many agents `serve` runs at once.
    pub max_agents: usize,
    /// How long a launch may take from the order to its session joining.
    pub join_within: std::time::Duration,
    pub default_engine: String,
    /// Engine name → program and arguments.
    pub commands: std::collections::BTreeMap<String, Vec<String>>,
}

impl Default for LaunchPolicy {
    fn default() -> Self {
        Self {
            roots: Vec::new(),
            idle_end: None,
            max_agents: Self::MAX_AGENTS,
            join_within: Self::JOIN_WITHIN_MOST,
            default_engine: "pi".into(),
            commands: [
                ("pi", "pi"),
                ("claude", "claude"),
                ("codex", "codex"),
                ("opencode", "opencode"),
            ]
            .into_iter()
            .map(|(engine, program)| (engine.to_string(), vec![program.to_string()]))
            .collect(),
        }
    }
}

impl LaunchPolicy {
    /// `[launch] max_agents` unless set: a few sessions at once is what one
    /// person drives, and a burst of `/new` must not start dozens.
    pub const MAX_AGENTS: usize = 8;
    /// The most `[launch] max_agents` may be.
    const MOST_AGENTS: u32 = 64;
    /// The least `[launch] join_within_s` may be: pi loads its extensions,
    /// the sidecar joins, the topic is made.
    const JOIN_WITHIN_LEAST: u64 = 5;
    /// Its default and its most: a machine that asks another's `serve`
    /// through the cluster waits this long and a little more
    /// (`protocol::launch::START_WAIT`, the same).
    pub const JOIN_WITHIN_MOST: std::time::Duration = std::time::Duration::from_secs(90);

    /// Checks the keys; an error names the key. `home` expands `~/`.
    fn from_file(file: LaunchFile, home: Option<&Path>) -> Result<Self, (&'static str, String)> {
        let mut policy = Self::default();
        policy.read_numbers(&file)?;
        for root in file.roots.unwrap_or_default() {
            policy
                .roots
                .push(absolute(&root, home).map_err(|m| ("launch.roots", m))?);
        }
        for (engine, command) in file.commands.unwrap_or_default() {
            let argv = match command {
                CommandLine::Arguments(argv)
                    if argv.first().is_some_and(|p| !p.trim().is_empty()) =>
                {
                    argv
                }
                CommandLine::Arguments(_) => {
                    return Err((
                        "launch.commands",
                        format!("{engine}: needs a program first"),
                    ));
                }
                CommandLine::Text(text) => {
                    return Err((
                        "launch.commands",
                        format!(
                            "{engine}: must be a list of arguments, e.g. {:?}: it runs without a shell",
                            text.split_whitespace().collect::<Vec<_>>()
                        ),
                    ));
                }
            };
            if !engine_name(&engine) {
                return Err((
                    "launch.commands",
                    format!("{engine:?} is not an engine name (a-z, at most 16)"),
                ));
            }
            policy.commands.insert(engine, argv);
        }
        if let Some(engine) = file.engine {
            if !policy.commands.contains_key(&engine) {
                return Err((
                    "launch.engine",
                    format!(
                        "{engine:?} is none of the engines: {}",
                        policy
                            .commands
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            policy.default_engine = engine;
        }
        Ok(policy)
    }

    /// The keys that are numbers, each range-checked.
    fn read_numbers(&mut self, file: &LaunchFile) -> Result<(), (&'static str, String)> {
        if let Some(hours) = file.idle_end_hours {
            if !(hours > 0.0 && hours <= 24.0 * 365.0) {
                return Err((
                    "launch.idle_end_hours",
                    format!("must be more than 0 and at most a year of hours, found {hours}"),
                ));
            }
            self.idle_end = Some(std::time::Duration::from_secs_f64(hours * 3600.0));
        }
        if let Some(agents) = file.max_agents {
            if !(1..=Self::MOST_AGENTS).contains(&agents) {
                return Err((
                    "launch.max_agents",
                    format!("must be 1 to {}, found {agents}", Self::MOST_AGENTS),
                ));
            }
            self.max_agents = agents as usize;
        }
        if let Some(seconds) = file.join_within_s {
            let most = Self::JOIN_WITHIN_MOST.as_secs();
            if !(Self::JOIN_WITHIN_LEAST..=most).contains(&seconds) {
                return Err((
                    "launch.join_within_s",
                    format!(
                        "must be {} to {most} seconds, found {seconds}",
                        Self::JOIN_WITHIN_LEAST
                    ),
                ));
            }
            self.join_within = std::time::Duration::from_secs(seconds);
        }
        Ok(())
    }
}

/// An engine's name as configuration and commands spell it.
fn engine_name(name: &str) -> bool {
    (1..=16).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_lowercase())
}

/// `folder` as an absolute path: `~/` expanded with `home`.
fn absolute(folder: &str, home: Option<&Path>) -> Result<PathBuf, String> {
    let path = match folder.strip_prefix("~/").or((folder == "~").then_some("")) {
        Some(rest) => match home {
            Some(home) => home.join(rest),
            None => return Err(format!("{folder:?}: no home directory to expand ~ with")),
        },
        None => PathBuf::from(folder),
    };
    if !path.is_absolute() {
        return Err(format!(
            "{folder:?} must be an absolute path (or start with ~/)"
        ));
    }
    Ok(path)
}

/// How voice notes are transcribed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transcriber {
    /// Program and arguments; `{file}` is where the audio's path goes.
    pub argv: Vec<String>,
    pub timeout: std::time::Duration,
}

/// What `[files]` and the transcription keys come to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesPolicy {
    pub inbox_max_bytes: u64,
    /// Absolute folders the agent may also send from.
    pub send_from: Vec<PathBuf>,
    pub long_answers_as_file: bool,
    pub transcriber: Option<Transcriber>,
}

/// Default and bounds of `[files] inbox_max_mb`.
const INBOX_DEFAULT_MB: u64 = 200;
const INBOX_MIN_MB: u64 = 20;
const INBOX_MAX_MB: u64 = 1024 * 1024;
/// Default and bounds of `transcribe_timeout_s`.
const TRANSCRIBE_DEFAULT_S: u64 = 120;
const TRANSCRIBE_MAX_S: u64 = 3600;

impl Default for FilesPolicy {
    fn default() -> Self {
        Self {
            inbox_max_bytes: INBOX_DEFAULT_MB * 1024 * 1024,
            send_from: Vec::new(),
            long_answers_as_file: true,
            transcriber: None,
        }
    }
}

impl FilesPolicy {
    /// Checks the keys; an error names the key. `home` expands `~/`.
    fn from_file(
        files: FilesFile,
        transcribe: Option<CommandLine>,
        timeout_s: Option<u64>,
        home: Option<&Path>,
    ) -> Result<Self, (&'static str, String)> {
        let mb = files.inbox_max_mb.unwrap_or(INBOX_DEFAULT_MB);
        if !(INBOX_MIN_MB..=INBOX_MAX_MB).contains(&mb) {
            return Err((
                "files.inbox_max_mb",
                format!(
                    "must be {INBOX_MIN_MB} to {INBOX_MAX_MB} (one Telegram download is up to 20 MB), found {mb}"
                ),
            ));
        }
        let mut send_from = Vec::new();
        for folder in files.send_from.unwrap_or_default() {
            send_from.push(absolute(&folder, home).map_err(|m| ("files.send_from", m))?);
        }
        let timeout_s = timeout_s.unwrap_or(TRANSCRIBE_DEFAULT_S);
        if !(1..=TRANSCRIBE_MAX_S).contains(&timeout_s) {
            return Err((
                "transcribe_timeout_s",
                format!("must be 1 to {TRANSCRIBE_MAX_S} seconds, found {timeout_s}"),
            ));
        }
        let transcriber = match transcribe {
            None => None,
            Some(CommandLine::Text(text)) => {
                return Err((
                    "transcribe_command",
                    format!(
                        "must be a list of arguments, e.g. {:?}: it runs without a shell, so a single string cannot be split safely",
                        text.split_whitespace()
                            .chain(["{file}"])
                            .collect::<Vec<_>>()
                    ),
                ));
            }
            Some(CommandLine::Arguments(argv)) => {
                if argv.first().is_none_or(|program| program.trim().is_empty()) {
                    return Err((
                        "transcribe_command",
                        "needs a program as its first element".into(),
                    ));
                }
                Some(Transcriber {
                    argv,
                    timeout: std::time::Duration::from_secs(timeout_s),
                })
            }
        };
        Ok(Self {
            inbox_max_bytes: mb * 1024 * 1024,
            send_from,
            long_answers_as_file: files.long_answers_as_file.unwrap_or(true),
            transcriber,
        })
    }
}

/// `[cluster]` in `config.toml`: where the NATS servers are, how to
/// authenticate, and this machine's name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// The NATS server(s), comma-separated, e.g. `tls://nats.example.net:4222`.
    /// Required in a `[cluster]` section. Env: `AGENT_RELAY_NATS_URL`.
    pub nats_url: Option<String>,
    /// A NATS `.creds` file (a user JWT and its nkey seed). Not with `nkey`.
    pub creds_file: Option<PathBuf>,
    /// An nkey seed (`SU…`) to authenticate with. Not with `creds_file`.
    /// Never logged or shown.
    pub nkey: Option<String>,
    /// This machine's name in the cluster: 1-32 of `a-z`, `0-9`, `-`
    /// (default: the host name, made to fit). Env: `AGENT_RELAY_NODE_NAME`.
    pub node_name: Option<String>,
    /// TLS to the NATS servers; its presence (or a `tls://` URL) requires TLS.
    pub tls: Option<ClusterTlsFile>,
}

/// `[cluster.tls]`: the certificates for TLS to the NATS servers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterTlsFile {
    /// PEM file of the authorities to trust besides the system's.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, with `key_file`, when the servers ask for one.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
}

/// The effective cluster configuration (docs/CLUSTER.md, *Configuration*).
/// Its `Debug` shows no secret: URLs without their user and password, the
/// seed masked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// The servers to connect to, at least one.
    pub servers: Vec<NatsUrl>,
    pub credentials: Option<NatsCredentials>,
    /// TLS is required (a `tls://` URL or a `[cluster.tls]` section).
    pub require_tls: bool,
    pub tls: ClusterTlsFile,
    pub node: NodeName,
}

/// How the relay authenticates to NATS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NatsCredentials {
    /// A `.creds` file, read by the NATS client when it connects.
    CredsFile(PathBuf),
    /// An nkey seed.
    Nkey(NkeySeed),
}

/// An nkey seed. Its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct NkeySeed(String);

impl NkeySeed {
    /// Checks the seed's shape: `S`, a key type letter, 56 base32 characters.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        // The shape `redact` masks (`NKEY_SEED`): a seed it would not
        // recognise must not be accepted.
        let shaped = text.len() == 58
            && text.starts_with('S')
            && text.as_bytes()[1].is_ascii_uppercase()
            && text
                .bytes()
                .all(|b| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b));
        if shaped {
            Ok(Self(text.to_string()))
        } else {
            Err(
                "an nkey seed is 58 characters: 'S', a key type letter and 56 of A-Z and 2-7"
                    .into(),
            )
        }
    }

    /// The seed itself, for the NATS client only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for NkeySeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("NkeySeed(<redacted>)")
    }
}

impl fmt::Display for NkeySeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A NATS server URL. A user and password (`nats://user:pass@host`) or a
/// token (`nats://token@host`) in it are taken out when it is parsed: the
/// client gets them as authentication options ([`NatsUrl::auth`]) and an
/// address without them ([`NatsUrl::address`]), so no library logs them
/// with the address, at any level. `Debug` and `Display` show
/// `<redacted>@` where they were.
#[derive(Clone, PartialEq, Eq)]
pub struct NatsUrl {
    /// `scheme://host:port`, or as configured without a scheme.
    address: String,
    auth: Option<NatsUrlAuth>,
}

/// The user and password, or the token, a NATS URL carried.
#[derive(Clone, PartialEq, Eq)]
pub enum NatsUrlAuth {
    UserPassword { user: String, password: String },
    Token(String),
}

impl fmt::Debug for NatsUrlAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UserPassword { user, .. } => f
                .debug_struct("UserPassword")
                .field("user", user)
                .field("password", &"<redacted>")
                .finish(),
            Self::Token(_) => f.write_str("Token(<redacted>)"),
        }
    }
}

impl NatsUrl {
    /// Checks the scheme (`nats`, `tls`, `ws`, `wss`, or none) and that a
    /// host is named; takes a user and password or a token out (their
    /// `%`-escapes decoded).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (scheme, rest) = match text.split_once("://") {
            Some((scheme @ ("nats" | "tls" | "ws" | "wss"), rest)) => (Some(scheme), rest),
            Some(_) => {
                return Err(format!(
                    "a NATS URL starts with nats://, tls://, ws:// or wss://, found {}",
                    shown_url(text)
                ));
            }
            None => (None, text),
        };
        let (userinfo, host) = match rest.rsplit_once('@') {
            Some((userinfo, host)) => (Some(userinfo), host),
            None => (None, rest),
        };
        if host.is_empty() || host.starts_with(':') {
            return Err(format!(
                "a NATS URL names a host, found {}",
                shown_url(text)
            ));
        }
        let decoded = |part: &str| {
            percent_encoding::percent_decode_str(part)
                .decode_utf8()
                .map(|part| part.into_owned())
                .map_err(|_| {
                    format!(
                        "the user or password of a NATS URL is not UTF-8 once decoded, in {}",
                        shown_url(text)
                    )
                })
        };
        let auth = match userinfo.map(|info| info.split_once(':')) {
            None => None,
            Some(Some((user, password))) => Some(NatsUrlAuth::UserPassword {
                user: decoded(user)?,
                password: decoded(password)?,
            }),
            Some(None) => Some(NatsUrlAuth::Token(decoded(userinfo.unwrap_or_default())?)),
        };
        Ok(Self {
            address: match scheme {
                Some(scheme) => format!("{scheme}://{host}"),
                None => host.to_string(),
            },
            auth,
        })
    }

    /// Whether the URL itself asks for TLS.
    pub fn is_tls(&self) -> bool {
        self.address.starts_with("tls://") || self.address.starts_with("wss://")
    }

    /// The server's address, without user, password or token: what the
    /// NATS client is given.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The user and password, or the token, the URL carried: for the NATS
    /// client's authentication options only.
    pub fn auth(&self) -> Option<&NatsUrlAuth> {
        self.auth.as_ref()
    }
}

/// A NATS URL as it may be shown: the part before a `@` masked.
fn shown_url(text: &str) -> String {
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) => (Some(scheme), rest),
        None => (None, text),
    };
    let host = match rest.rsplit_once('@') {
        Some((_, host)) => format!("<redacted>@{host}"),
        None => rest.to_string(),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{host}"),
        None => host,
    }
}

impl fmt::Display for NatsUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.auth.is_some(), self.address.split_once("://")) {
            (false, _) => f.write_str(&self.address),
            (true, Some((scheme, host))) => write!(f, "{scheme}://<redacted>@{host}"),
            (true, None) => write!(f, "<redacted>@{}", self.address),
        }
    }
}

impl fmt::Debug for NatsUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NatsUrl({self})")
    }
}

/// A bot token. Its `Debug` and `Display` never show the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct BotToken {
    secret: String,
    id: BotId,
}

impl BotToken {
    /// Checks the token's shape: `<digits>:<secret>`, the secret at least
    /// [`MIN_SECRET_CHARS`] of `[A-Za-z0-9_-]`. Telegram's secrets are 35
    /// characters; a few fewer are accepted in case that changes, but never
    /// so few that [`redact`] would not recognise the token.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let (id, rest) = text
            .split_once(':')
            .ok_or("expected <bot id>:<secret>, found no ':'")?;
        let id: u64 = id
            .bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| id.parse().ok())
            .flatten()
            .ok_or_else(|| "the part before ':' must be the bot's numeric id".to_string())?;
        if !rest
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err("the part after ':' must be letters, digits, '_' or '-'".into());
        }
        if rest.len() < MIN_SECRET_CHARS {
            return Err(format!(
                "the part after ':' is {} characters long; a bot token's secret has at least {MIN_SECRET_CHARS} (Telegram's have 35): copy the whole token from @BotFather",
                rest.len()
            ));
        }
        Ok(Self {
            secret: text.to_string(),
            id: BotId(id),
        })
    }

    pub fn bot_id(&self) -> BotId {
        self.id
    }

    /// The whole token, for building request URLs only.
    pub fn expose(&self) -> &str {
        &self.secret
    }
}

impl fmt::Debug for BotToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BotToken({}:<redacted>)", self.id)
    }
}

impl fmt::Display for BotToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:<redacted>", self.id)
    }
}

/// The effective configuration: file merged with environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub token: Option<BotToken>,
    pub chat_id: Option<i64>,
    pub allowed_users: Vec<i64>,
    pub api_url: String,
    pub auto_connect: bool,
    /// Receipts on people's messages, as reactions (`receipts`).
    pub receipts: bool,
    pub approvals: Policy,
    /// One bot across machines (docs/CLUSTER.md); `None` is the
    /// single-machine relay.
    pub cluster: Option<ClusterConfig>,
    /// Files both ways: the inbox cap, where files may be sent from, voice
    /// transcription.
    pub files: FilesPolicy,
    /// `[launch]`: where and how `agent-relay serve` starts agents.
    pub launch: LaunchPolicy,
    /// `[access]`: what each allowed user may do.
    pub roles: Roles,
    /// The file that was read (it may not exist).
    pub file: PathBuf,
}

/// Why the configuration could not be used. Every variant names where the
/// problem is; none of them ever contains the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {message}", path.display())]
    Read { path: PathBuf, message: String },
    #[error("{}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("{origin}: `{key}` {message}")]
    Invalid {
        /// The file path or the environment variable the value came from.
        origin: String,
        key: String,
        message: String,
    },
    /// A directory or file of the relay that another user could have
    /// planted or changed.
    #[error(transparent)]
    Untrusted(#[from] UntrustedPath),
}

/// The environment of a program the relay starts for the user (a
/// transcriber, Codex): `parent` without the relay's own variables
/// (`TELEGRAM_BOT_TOKEN`, `AGENT_RELAY_*`, which may hold the bot token and
/// a NATS password). The program may need the user's `PATH`, `HOME` or an
/// API key of its own, but none of the relay's secrets.
pub fn child_env(
    parent: impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)>,
) -> impl Iterator<Item = (std::ffi::OsString, std::ffi::OsString)> {
    parent.filter(|(key, _)| {
        let key = key.to_string_lossy();
        key != "TELEGRAM_BOT_TOKEN" && !key.starts_with("AGENT_RELAY_")
    })
}

/// How every command that uses the relay's files starts (all but `schema`
/// and `demo`): the directories resolved and checked, and the configuration
/// read from them, or why it cannot be used.
#[derive(Debug)]
pub struct Setup {
    /// The directories, with their ancestors resolved once checked.
    pub paths: Paths,
    /// Whether the relay's own directories passed the checks; if not, nothing
    /// may be written there (no log file either).
    pub dirs_trusted: bool,
    pub config: Result<Config, ConfigError>,
}

impl Setup {
    /// Resolves the directories from the process environment, then
    /// [`Setup::load`].
    pub fn from_env(missing: Missing) -> Result<Self, PathsError> {
        Ok(Self::load(Paths::from_env()?, missing, |k| {
            std::env::var(k).ok()
        }))
    }

    /// Checks `paths` (creating missing directories if `missing` says so),
    /// reads the config file from the checked config dir with `env` on top,
    /// and, once the bot is known, checks its bus directory and store.
    pub fn load(paths: Paths, missing: Missing, env: impl Fn(&str) -> Option<String>) -> Self {
        let checked = match paths.checked(missing) {
            Ok(checked) => checked,
            Err(error) => {
                return Self {
                    paths,
                    dirs_trusted: false,
                    config: Err(error.into()),
                };
            }
        };
        let config = Config::load_with(&checked.config_file(), env).and_then(|config| {
            if let Some(bot) = config.bot_id() {
                checked.check_bot(bot, missing)?;
            }
            Ok(config)
        });
        Self {
            paths: checked,
            dirs_trusted: true,
            config,
        }
    }
}

impl Config {
    /// Reads `file` (a missing file is an empty config) and applies `env`, a
    /// lookup of environment variables, on top. The file is read only if it
    /// is a regular file of the user's own that others cannot write; the
    /// directories above it are [`Setup`]'s to check.
    pub fn load_with(
        file: &Path,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let parsed = match open_private_file(file)? {
            Some(mut opened) => {
                let mut text = String::new();
                opened
                    .read_to_string(&mut text)
                    .map_err(|e| ConfigError::Read {
                        path: file.to_path_buf(),
                        message: e.to_string(),
                    })?;
                toml::from_str::<ConfigFile>(&text).map_err(|e| ConfigError::Parse {
                    path: file.to_path_buf(),
                    message: redact(e.message()).into_owned() + &location(&text, e.span()),
                })?
            }
            None => ConfigFile::default(),
        };
        Self::merge(file, parsed, env)
    }

    fn merge(
        file: &Path,
        parsed: ConfigFile,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigError> {
        let from_file = file.display().to_string();
        let env = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let token = match env("TELEGRAM_BOT_TOKEN") {
            Some(t) => Some(
                BotToken::parse(&t).map_err(|m| invalid("environment", "TELEGRAM_BOT_TOKEN", m))?,
            ),
            None => parsed
                .bot_token
                .as_deref()
                .map(|t| BotToken::parse(t).map_err(|m| invalid(&from_file, "bot_token", m)))
                .transpose()?,
        };
        let chat_id = match env("AGENT_RELAY_CHAT_ID") {
            Some(v) => Some(v.trim().parse::<i64>().map_err(|_| {
                invalid(
                    "environment",
                    "AGENT_RELAY_CHAT_ID",
                    "must be an integer chat id".into(),
                )
            })?),
            None => parsed.chat_id,
        };
        let allowed_users = match env("AGENT_RELAY_ALLOWED_USERS") {
            Some(v) => user_ids(&v)?,
            None => parsed.allowed_users.unwrap_or_default(),
        };
        let api_url = match env("AGENT_RELAY_API_URL") {
            Some(v) => api_url("environment", "AGENT_RELAY_API_URL", &v)?,
            None => api_url(
                &from_file,
                "api_url",
                parsed.api_url.as_deref().unwrap_or(DEFAULT_API_URL),
            )?,
        };
        let scheduled = parsed.schedules.unwrap_or_default().approvals;
        let approvals = Policy::from_file(parsed.approvals.unwrap_or_default(), scheduled)
            .map_err(|(key, message)| invalid(&from_file, key, message))?;
        let roles = Roles::from_file(parsed.access.unwrap_or_default())
            .map_err(|(key, message)| invalid(&from_file, key, message))?;
        let home = env("HOME").map(PathBuf::from);
        let files = FilesPolicy::from_file(
            parsed.files.unwrap_or_default(),
            parsed.transcribe_command,
            parsed.transcribe_timeout_s,
            home.as_deref(),
        )
        .map_err(|(key, message)| invalid(&from_file, key, message))?;
        let launch = LaunchPolicy::from_file(parsed.launch.unwrap_or_default(), home.as_deref())
            .map_err(|(key, message)| invalid(&from_file, key, message))?;
        let cluster = cluster_config(&from_file, parsed.cluster, env, crate::sys::host_name)?;
        Ok(Self {
            files,
            launch,
            roles,
            token,
            chat_id,
            allowed_users,
            api_url,
            auto_connect: parsed.auto_connect.unwrap_or(true),
            receipts: parsed.receipts.unwrap_or(true),
            approvals,
            cluster,
            file: file.to_path_buf(),
        })
    }

    /// The bot this configuration drives, when a token is set.
    pub fn bot_id(&self) -> Option<BotId> {
        self.token.as_ref().map(BotToken::bot_id)
    }
}

/// A value of `key` (from `origin`: the file or the environment) that
/// cannot be used, and why.
fn invalid(origin: &str, key: &str, message: String) -> ConfigError {
    ConfigError::Invalid {
        origin: origin.to_string(),
        key: key.to_string(),
        message,
    }
}

/// `AGENT_RELAY_ALLOWED_USERS`: user ids separated by commas.
fn user_ids(list: &str) -> Result<Vec<i64>, ConfigError> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<i64>().map_err(|_| {
                invalid(
                    "environment",
                    "AGENT_RELAY_ALLOWED_USERS",
                    format!("must be comma-separated user ids, found {s:?}"),
                )
            })
        })
        .collect()
}

/// The Bot API's URL without a trailing slash; an http(s) URL only.
fn api_url(origin: &str, key: &str, url: &str) -> Result<String, ConfigError> {
    let url = url.trim().trim_end_matches('/').to_string();
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(invalid(
            origin,
            key,
            format!("must be an http(s) URL, found {:?}", redact(&url)),
        ));
    }
    Ok(url)
}

/// The `[cluster]` section with the environment on top; `None` when
/// neither names a NATS server.
fn cluster_config(
    from_file: &str,
    parsed: Option<ClusterFile>,
    env: impl Fn(&str) -> Option<String>,
    host: impl Fn() -> Option<String>,
) -> Result<Option<ClusterConfig>, ConfigError> {
    let section = parsed.clone().unwrap_or_default();
    let (url_origin, url_key, urls) = match env("AGENT_RELAY_NATS_URL") {
        Some(v) => ("environment", "AGENT_RELAY_NATS_URL", v),
        None => match section.nats_url {
            Some(v) => (from_file, "cluster.nats_url", v),
            None if parsed.is_some() => {
                return Err(invalid(
                    from_file,
                    "cluster.nats_url",
                    "is required in a [cluster] section".into(),
                ));
            }
            None => return Ok(None),
        },
    };
    let servers = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(NatsUrl::parse)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|m| invalid(url_origin, url_key, m))?;
    if servers.is_empty() {
        return Err(invalid(url_origin, url_key, "names no server".into()));
    }
    // A user and password in the URLs are one more way in: one way only,
    // the same for every server.
    let url_auths: Vec<&NatsUrlAuth> = servers.iter().filter_map(NatsUrl::auth).collect();
    if url_auths.windows(2).any(|pair| pair[0] != pair[1]) {
        return Err(invalid(
            url_origin,
            url_key,
            "names different users, passwords or tokens for its servers: every server takes the same one".into(),
        ));
    }
    if !url_auths.is_empty() && (section.creds_file.is_some() || section.nkey.is_some()) {
        return Err(invalid(
            url_origin,
            url_key,
            "carries a user and password (or a token), which `cluster.nkey` and `cluster.creds_file` exclude: keep one way in".into(),
        ));
    }
    let credentials = nats_credentials(from_file, section.creds_file, section.nkey)?;
    let node = match env("AGENT_RELAY_NODE_NAME") {
        Some(v) => NodeName::parse(v.trim())
            .map_err(|m| invalid("environment", "AGENT_RELAY_NODE_NAME", m))?,
        None => node_name(from_file, section.node_name, host)?,
    };
    let tls = section.tls.clone().unwrap_or_default();
    if tls.cert_file.is_some() != tls.key_file.is_some() {
        return Err(invalid(
            from_file,
            "cluster.tls",
            "`cert_file` and `key_file` go together".into(),
        ));
    }
    Ok(Some(ClusterConfig {
        require_tls: section.tls.is_some() || servers.iter().any(NatsUrl::is_tls),
        servers,
        credentials,
        tls,
        node,
    }))
}

/// How this machine proves itself to NATS, from `[cluster]`: a `.creds`
/// file or an nkey seed, not both.
fn nats_credentials(
    from_file: &str,
    creds_file: Option<PathBuf>,
    nkey: Option<String>,
) -> Result<Option<NatsCredentials>, ConfigError> {
    match (creds_file, nkey) {
        (Some(_), Some(_)) => Err(invalid(
            from_file,
            "cluster.nkey",
            "and `cluster.creds_file` exclude each other: keep one".into(),
        )),
        (Some(path), None) => Ok(Some(NatsCredentials::CredsFile(path))),
        (None, Some(seed)) => Ok(Some(NatsCredentials::Nkey(
            NkeySeed::parse(&seed).map_err(|m| invalid(from_file, "cluster.nkey", m))?,
        ))),
        (None, None) => Ok(None),
    }
}

/// This machine's node name from `[cluster]`, else from its host name.
fn node_name(
    from_file: &str,
    named: Option<String>,
    host: impl Fn() -> Option<String>,
) -> Result<NodeName, ConfigError> {
    match named {
        Some(v) => NodeName::parse(&v).map_err(|m| invalid(from_file, "cluster.node_name", m)),
        None => host()
            .as_deref()
            .and_then(NodeName::from_host)
            .ok_or_else(|| {
                invalid(
                    from_file,
                    "cluster.node_name",
                    "is needed: the host name gives no usable name".into(),
                )
            }),
    }
}

/// ` (line N, column M)` for a byte span in `text`, or nothing.
fn location(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let Some(span) = span else {
        return String::new();
    };
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!(" (line {line}, column {column})")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_";

    fn load(text: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(&file, text).unwrap();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::load_with(&file, |k| {
            env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
        })
    }

    #[test]
    fn roles_approvals_by_and_scheduled_approvals_are_read_and_a_user_has_one_role() {
        let c = load(
            "[access]\ndrivers = [5]\nviewers = [6]\n[approvals]\nby = \"requester\"\n\
             [schedules]\napprovals = \"deny\"\n",
            &[],
        )
        .unwrap();
        assert_eq!(c.roles.of(5), Role::Driver);
        assert_eq!(c.roles.of(6), Role::Viewer);
        assert_eq!(
            c.roles.of(7),
            Role::Owner,
            "an allowed user named nowhere owns"
        );
        assert_eq!(c.approvals.by, crate::policy::ApproveBy::Requester);
        assert_eq!(c.approvals.scheduled, crate::policy::Scheduled::Deny);
        let defaults = load("", &[]).unwrap();
        assert_eq!(defaults.approvals.by, crate::policy::ApproveBy::Anyone);
        assert_eq!(defaults.approvals.scheduled, crate::policy::Scheduled::Ask);
        let twice = load("[access]\nowners = [5]\nviewers = [5]\n", &[]).unwrap_err();
        assert!(twice.to_string().contains("one role each"), "{twice}");
        let unknown = load("[approvals]\nby = \"whoever\"\n", &[]).unwrap_err();
        assert!(
            unknown.to_string().contains("expected one of `anyone`"),
            "{unknown}"
        );
    }

    #[test]
    fn a_program_the_relay_starts_gets_the_users_environment_without_the_relays_secrets() {
        let parent = [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/ada"),
            ("OPENAI_API_KEY", "sk-the-users-own"),
            (
                "TELEGRAM_BOT_TOKEN",
                "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_",
            ),
            ("AGENT_RELAY_NATS_URL", "nats://relay:secret@h"),
            ("AGENT_RELAY_HOME", "/h"),
        ]
        .map(|(k, v)| (k.into(), v.into()));
        let kept: Vec<String> = child_env(parent.into_iter())
            .map(|(k, _)| k.to_string_lossy().into_owned())
            .collect();
        assert_eq!(kept, ["PATH", "HOME", "OPENAI_API_KEY"]);
    }

    #[test]
    fn missing_file_is_an_unconfigured_default() {
        let c = Config::load_with(Path::new("/nonexistent/config.toml"), |_| None).unwrap();
        assert!(c.token.is_none());
        assert_eq!(c.api_url, DEFAULT_API_URL);
        assert!(c.auto_connect);
    }

    #[test]
    fn file_values_and_env_overrides() {
        let text = format!("bot_token = \"{TOKEN}\"\nchat_id = -1001\nallowed_users = [1, 2]\n");
        let c = load(&text, &[]).unwrap();
        assert_eq!(c.bot_id(), Some(BotId(123456789)));
        assert_eq!(c.chat_id, Some(-1001));
        assert_eq!(c.allowed_users, vec![1, 2]);

        let c = load(
            &text,
            &[
                ("AGENT_RELAY_CHAT_ID", "-1002"),
                ("AGENT_RELAY_ALLOWED_USERS", "7, 8"),
                ("AGENT_RELAY_API_URL", "http://127.0.0.1:9/"),
            ],
        )
        .unwrap();
        assert_eq!(c.chat_id, Some(-1002));
        assert_eq!(c.allowed_users, vec![7, 8]);
        assert_eq!(c.api_url, "http://127.0.0.1:9");
    }

    #[test]
    fn errors_name_the_file_and_key_and_never_the_token() {
        let err = load("chat_id = \"abc\"\n", &[]).unwrap_err().to_string();
        assert!(
            err.contains("config.toml") && err.contains("line 1"),
            "{err}"
        );

        let err = load("chat = 1\n", &[]).unwrap_err().to_string();
        assert!(err.contains("unknown field `chat`"), "{err}");

        let err = load(&format!("bot_token = {TOKEN}\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(
            !err.contains("AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_"),
            "{err}"
        );

        let err = load("bot_token = \"nope\"\n", &[]).unwrap_err().to_string();
        assert!(
            err.contains("`bot_token`") && err.contains("config.toml"),
            "{err}"
        );

        let err = load("", &[("AGENT_RELAY_ALLOWED_USERS", "1,x")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("AGENT_RELAY_ALLOWED_USERS"), "{err}");
    }

    #[test]
    fn token_shape_is_checked_with_a_clear_error() {
        assert!(BotToken::parse(TOKEN).is_ok(), "the test token stays valid");
        assert!(BotToken::parse(&format!(" {TOKEN}\n")).is_ok());
        // A little shorter than Telegram's 35 still passes…
        assert!(BotToken::parse("1:abcdefghijklmnopqrstuvwxyz0123").is_ok());
        // …but never shorter than redaction recognises.
        let err = BotToken::parse("123:abcdefghijklmnopqrstuvwxyz012").unwrap_err();
        assert!(
            err.contains("29 characters") && err.contains("at least 30"),
            "{err}"
        );
        for bad in [
            "nocolon",
            "+123:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_",
            "12a:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_",
            ":AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_",
            "123:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/",
            "123:",
        ] {
            assert!(BotToken::parse(bad).is_err(), "{bad}");
        }
        let err = load("", &[("TELEGRAM_BOT_TOKEN", "123:short")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("TELEGRAM_BOT_TOKEN") && err.contains("at least 30"),
            "{err}"
        );
        assert!(!err.contains("short"), "the secret is not echoed: {err}");
    }

    #[test]
    fn a_config_file_others_may_write_is_refused_and_not_read() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config.toml");
        std::fs::write(&file, "api_url = \"http://127.0.0.1:9\"\n").unwrap();
        for mode in [0o666, 0o620, 0o602] {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = Config::load_with(&file, |_| None).unwrap_err();
            assert!(matches!(err, ConfigError::Untrusted(_)), "{err:?}");
            let text = err.to_string();
            assert!(
                text.contains(&file.display().to_string()) && text.contains("chmod 600"),
                "{text}"
            );
        }
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(
            Config::load_with(&file, |_| None).unwrap().api_url,
            "http://127.0.0.1:9"
        );
    }

    #[test]
    fn setup_checks_the_directories_and_the_bus_before_the_config_counts() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let env = |k: &str| (k == "TELEGRAM_BOT_TOKEN").then(|| TOKEN.to_string());
        let setup = Setup::load(Paths::under(&home), Missing::Leave, env);
        assert!(setup.config.is_ok(), "{:?}", setup.config);
        assert!(!home.exists(), "Leave creates nothing");

        let setup = Setup::load(Paths::under(&home), Missing::Create, env);
        assert!(setup.dirs_trusted && setup.config.is_ok(), "{setup:?}");
        assert!(home.join("run/123456789").is_dir(), "the bus dir is made");

        let bus = home.join("run/123456789");
        std::fs::set_permissions(&bus, std::fs::Permissions::from_mode(0o733)).unwrap();
        let setup = Setup::load(Paths::under(&home), Missing::Leave, env);
        assert!(setup.dirs_trusted);
        let err = setup.config.unwrap_err().to_string();
        assert!(
            err.contains("run/123456789") && err.contains("0733"),
            "{err}"
        );

        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o777)).unwrap();
        let setup = Setup::load(Paths::under(&home), Missing::Create, env);
        assert!(!setup.dirs_trusted);
        assert!(matches!(setup.config, Err(ConfigError::Untrusted(_))));
    }

    const SEED: &str = "SUAIBDPBAUTWCWBKIO6XHQNINK5FWJW4OHLXC3HQ2KFE4PEJUA44CNHTC4";

    #[test]
    fn without_a_cluster_section_the_relay_is_single_machine() {
        assert_eq!(load("", &[]).unwrap().cluster, None);
    }

    #[test]
    fn the_cluster_section_with_env_overrides() {
        let text = format!(
            "[cluster]\nnats_url = \"tls://a:4222, nats://b:4222\"\nnkey = \"{SEED}\"\nnode_name = \"laptop\"\n"
        );
        let c = load(&text, &[]).unwrap().cluster.unwrap();
        assert_eq!(c.servers.len(), 2);
        assert!(c.require_tls, "a tls:// URL requires TLS");
        assert_eq!(c.node.as_str(), "laptop");
        assert!(matches!(c.credentials, Some(NatsCredentials::Nkey(_))));

        let c = load(
            &text,
            &[
                ("AGENT_RELAY_NATS_URL", "nats://127.0.0.1:4333"),
                ("AGENT_RELAY_NODE_NAME", "box-2"),
            ],
        )
        .unwrap()
        .cluster
        .unwrap();
        assert_eq!(c.servers[0].address(), "nats://127.0.0.1:4333");
        assert!(!c.require_tls);
        assert_eq!(c.node.as_str(), "box-2");

        // The environment alone is enough to join a cluster.
        let c = load("", &[("AGENT_RELAY_NATS_URL", "nats://h:1")]).unwrap();
        assert!(c.cluster.is_some());
    }

    #[test]
    fn cluster_errors_name_the_key_and_never_the_secrets() {
        let err = load("[cluster]\nnode_name = \"x\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`cluster.nats_url`") && err.contains("required"),
            "{err}"
        );

        let text = format!(
            "[cluster]\nnats_url = \"nats://h\"\nnkey = \"{SEED}\"\ncreds_file = \"/x.creds\"\n"
        );
        let err = load(&text, &[]).unwrap_err().to_string();
        assert!(
            err.contains("exclude each other") && !err.contains(SEED),
            "{err}"
        );

        let err = load(
            "[cluster]\nnats_url = \"nats://h\"\nnkey = \"SUshort\"\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("`cluster.nkey`") && !err.contains("SUshort"),
            "{err}"
        );

        let err = load(
            "[cluster]\nnats_url = \"nats://h\"\nnode_name = \"My Box\"\n",
            &[],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("`cluster.node_name`"), "{err}");

        let err = load("[cluster]\nnats_url = \"http://h\"\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("`cluster.nats_url`"), "{err}");

        let err = load("[cluster]\nnats_url = \"nats://h\"\nnats = 1\n", &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `nats`"), "{err}");

        let text = "[cluster]\nnats_url = \"nats://h\"\n[cluster.tls]\ncert_file = \"/c\"\n";
        let err = load(text, &[]).unwrap_err().to_string();
        assert!(err.contains("go together"), "{err}");
    }

    #[test]
    fn cluster_secrets_are_never_displayed() {
        let text = format!(
            "[cluster]\nnats_url = \"nats://h:4222\"\nnkey = \"{SEED}\"\n[cluster.tls]\nca_file = \"/ca.pem\"\n"
        );
        let c = load(&text, &[("AGENT_RELAY_NODE_NAME", "n")]).unwrap();
        let shown = format!("{c:?}");
        assert!(!shown.contains(SEED), "{shown}");
        assert!(
            c.cluster.unwrap().require_tls,
            "a [cluster.tls] section requires TLS"
        );
        let text = "[cluster]\nnats_url = \"nats://relay:hunter2%40secret@h:4222\"\n";
        let c = load(text, &[("AGENT_RELAY_NODE_NAME", "n")]).unwrap();
        let cluster = c.cluster.as_ref().unwrap();
        let shown = format!("{c:?} {}", cluster.servers[0]);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("nats://<redacted>@h:4222"), "{shown}");
    }

    /// A user and password in the URL are taken out of it: the client gets
    /// them as options (`%`-escapes decoded) and an address without them,
    /// which is all a library can log.
    #[test]
    fn a_urls_password_goes_as_options_never_in_the_address() {
        let url = NatsUrl::parse("tls://relay:hunter2%40x@nats.example:4222").unwrap();
        assert_eq!(url.address(), "tls://nats.example:4222");
        assert_eq!(
            url.auth(),
            Some(&NatsUrlAuth::UserPassword {
                user: "relay".into(),
                password: "hunter2@x".into()
            })
        );
        assert!(url.is_tls());
        let token = NatsUrl::parse("s3cr3ttoken@h").unwrap();
        assert_eq!(token.address(), "h");
        assert_eq!(
            token.auth(),
            Some(&NatsUrlAuth::Token("s3cr3ttoken".into()))
        );
        assert_eq!(
            format!("{token} {token:?}"),
            "<redacted>@h NatsUrl(<redacted>@h)"
        );
        assert_eq!(NatsUrl::parse("nats://h:1").unwrap().auth(), None);

        let err = |text: &str| {
            load(text, &[("AGENT_RELAY_NODE_NAME", "n")])
                .unwrap_err()
                .to_string()
        };
        let both = err(&format!(
            "[cluster]\nnats_url = \"nats://u:hunter2@h\"\nnkey = \"{SEED}\"\n"
        ));
        assert!(
            both.contains("one way in") && !both.contains("hunter2"),
            "{both}"
        );
        let differ = err("[cluster]\nnats_url = \"nats://u:hunter2@a, nats://u:other@b\"\n");
        assert!(differ.contains("every server takes the same"), "{differ}");
        assert!(
            !differ.contains("hunter2") && !differ.contains("other@"),
            "{differ}"
        );
    }

    #[test]
    fn node_names_from_host_names() {
        let from = |h: &str| NodeName::from_host(h).map(|n| n.to_string());
        assert_eq!(from("Laptop.local").as_deref(), Some("laptop"));
        assert_eq!(from("dev_box 2").as_deref(), Some("dev-box-2"));
        assert_eq!(from("-._"), None);
        assert_eq!(
            from(&"x".repeat(40)).map(|n| n.len()),
            Some(NodeName::MAX_CHARS)
        );
        assert!(NodeName::parse("UPPER").is_err());
        assert!(NodeName::parse("").is_err());
    }

    #[test]
    fn files_and_transcription_keys_with_their_defaults_and_errors() {
        let c = load("", &[]).unwrap();
        assert_eq!(c.files, FilesPolicy::default());
        assert_eq!(c.files.inbox_max_bytes, 200 * 1024 * 1024);

        let text = "transcribe_command = [\"whisper-cli\", \"-nt\", \"-f\", \"{file}\"]\n\
                    transcribe_timeout_s = 30\n\
                    [files]\ninbox_max_mb = 50\nsend_from = [\"~/Downloads\", \"/srv/out\"]\n\
                    long_answers_as_file = false\n";
        let c = load(text, &[("HOME", "/home/ada")]).unwrap();
        let transcriber = c.files.transcriber.clone().unwrap();
        assert_eq!(transcriber.argv, ["whisper-cli", "-nt", "-f", "{file}"]);
        assert_eq!(transcriber.timeout, std::time::Duration::from_secs(30));
        assert_eq!(c.files.inbox_max_bytes, 50 * 1024 * 1024);
        assert_eq!(
            c.files.send_from,
            [
                PathBuf::from("/home/ada/Downloads"),
                PathBuf::from("/srv/out")
            ]
        );
        assert!(!c.files.long_answers_as_file);

        for (text, key, says) in [
            (
                "transcribe_command = \"whisper-cli -f\"",
                "transcribe_command",
                "list of arguments",
            ),
            ("transcribe_command = []", "transcribe_command", "program"),
            (
                "transcribe_timeout_s = 0",
                "transcribe_timeout_s",
                "1 to 3600",
            ),
            ("[files]\ninbox_max_mb = 5", "files.inbox_max_mb", "20 to"),
            (
                "[files]\nsend_from = [\"relative\"]",
                "files.send_from",
                "absolute",
            ),
        ] {
            match load(text, &[]) {
                Err(ConfigError::Invalid {
                    key: k, message, ..
                }) => {
                    assert_eq!(k, key, "{text}");
                    assert!(message.contains(says), "{text}: {message}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(matches!(
            load("[files]\ninbox_max = 5", &[]),
            Err(ConfigError::Parse { .. })
        ));
    }

    #[test]
    fn launch_keys_with_their_defaults_and_errors() {
        let c = load("", &[]).unwrap();
        assert!(c.launch.roots.is_empty(), "no roots by default");
        assert_eq!(c.launch.idle_end, None);
        assert_eq!(c.launch.max_agents, 8);
        assert_eq!(c.launch.join_within, std::time::Duration::from_secs(90));
        assert_eq!(c.launch.default_engine, "pi");
        assert_eq!(c.launch.commands["claude"], ["claude"]);

        let text = "[launch]\nroots = [\"~/code\", \"/srv/work\"]\nidle_end_hours = 0.5\n\
                    engine = \"claude\"\n[launch.commands]\npi = [\"node\", \"/opt/pi/cli.js\"]\n";
        let c = load(text, &[("HOME", "/home/ada")]).unwrap();
        assert_eq!(
            c.launch.roots,
            [PathBuf::from("/home/ada/code"), PathBuf::from("/srv/work")]
        );
        assert_eq!(
            c.launch.idle_end,
            Some(std::time::Duration::from_secs(1800))
        );
        assert_eq!(c.launch.default_engine, "claude");
        assert_eq!(c.launch.commands["pi"], ["node", "/opt/pi/cli.js"]);
        let capped = load("[launch]\nmax_agents = 2\njoin_within_s = 5\n", &[]).unwrap();
        assert_eq!(capped.launch.max_agents, 2);
        assert_eq!(capped.launch.join_within, std::time::Duration::from_secs(5));
        let older = load("[launch]\ndefault_engine = \"codex\"\n", &[]).unwrap();
        assert_eq!(
            older.launch.default_engine, "codex",
            "the name an earlier README gave the key"
        );

        for (text, key, says) in [
            ("[launch]\nroots = [\"code\"]", "launch.roots", "absolute"),
            (
                "[launch]\nidle_end_hours = 0",
                "launch.idle_end_hours",
                "more than 0",
            ),
            (
                "[launch]\nengine = \"vim\"",
                "launch.engine",
                "none of the engines",
            ),
            ("[launch]\nmax_agents = 0", "launch.max_agents", "1 to 64"),
            ("[launch]\nmax_agents = 65", "launch.max_agents", "1 to 64"),
            (
                "[launch]\njoin_within_s = 4",
                "launch.join_within_s",
                "5 to 90 seconds",
            ),
            (
                "[launch]\njoin_within_s = 91",
                "launch.join_within_s",
                "5 to 90 seconds",
            ),
            (
                "[launch.commands]\npi = \"pi -e x\"",
                "launch.commands",
                "list of arguments",
            ),
            (
                "[launch.commands]\nPi = [\"pi\"]",
                "launch.commands",
                "engine name",
            ),
        ] {
            match load(text, &[]) {
                Err(ConfigError::Invalid {
                    key: k, message, ..
                }) => {
                    assert_eq!(k, key, "{text}");
                    assert!(message.contains(says), "{text}: {message}");
                }
                other => panic!("{text}: {other:?}"),
            }
        }
    }

    #[test]
    fn token_is_never_displayed() {
        let t = BotToken::parse(TOKEN).unwrap();
        assert_eq!(
            format!("{t} {t:?}"),
            "123456789:<redacted> BotToken(123456789:<redacted>)"
        );
    }
}

//! The `agent-relay` binary: what a host spawns (`stdio`, the default) and a
//! few commands for people at a terminal.

use std::path::PathBuf;
use std::process::ExitCode;

use agent_relay::cli;
use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "agent-relay",
    version = agent_relay::VERSION,
    about = "Drive every coding-agent session on this machine from one Telegram bot"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve one host over JSON-RPC on stdin/stdout (what a coding agent spawns).
    Stdio {
        /// Also log to stderr.
        #[arg(long)]
        log_stderr: bool,
    },
    /// Serve Claude Code as an MCP server on stdin/stdout (what `claude` spawns).
    Mcp {
        /// Also log to stderr.
        #[arg(long)]
        log_stderr: bool,
    },
    /// Run the machine's launcher: start and keep agent sessions asked for from Telegram (`/new`).
    Serve {
        /// Also log to stderr.
        #[arg(long)]
        log_stderr: bool,
    },
    /// Run Codex's terminal UI with the relay beside it on the same thread (arguments go to `codex`,
    /// e.g. `agent-relay codex resume --last`).
    Codex {
        /// What `codex` gets, after `--remote` on the relay's private app-server.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Run OpenCode's terminal UI with the relay beside it on the same server (arguments go to
    /// `opencode attach`, e.g. `agent-relay opencode --continue`).
    Opencode {
        /// What `opencode attach` gets, after the relay's private server and `--dir`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Handle one hook event (its JSON on stdin); what Claude Code's hooks, and plain Codex's, run.
    Hook {
        /// Whose hook it is.
        #[arg(long, value_enum, default_value = "claude-code")]
        host: HookHost,
        /// The event: SessionStart, UserPromptSubmit, PreToolUse, PostToolUse, PermissionRequest, Notification, Stop, StopFailure, SessionEnd (Codex: SessionStart, PermissionRequest, Stop).
        event: String,
    },
    /// The MCP server the relay names on Codex's command line: its `send_file` tool goes to the
    /// relay's session of that Codex over `socket`.
    #[command(hide = true)]
    CodexTools { socket: std::path::PathBuf },
    /// Send what the last relay process left to go, then exit (a relay process starts this itself).
    #[command(hide = true)]
    Drain,
    /// End the process groups of `serve`'s agents once `serve` is gone (`serve` starts this itself).
    #[command(hide = true)]
    ServeWatcher,
    /// Add the relay to a coding agent's configuration.
    Install {
        #[command(subcommand)]
        host: InstallHost,
    },
    /// Show the relay's sessions, as the leader sees them.
    Status,
    /// Run three sessions against a simulated Telegram, kill the leader, watch the failover.
    Demo,
    /// Check the configuration, the token, the chat and the bot's rights.
    Doctor,
    /// Set the relay up interactively: the token, pairing your Telegram account, where the topics go.
    Setup,
    /// Look after a relay that spans machines (docs/CLUSTER.md).
    Cluster {
        #[command(subcommand)]
        command: ClusterCmd,
    },
    /// Write the JSON Schemas of every wire type.
    Schema {
        /// Folder to write into.
        #[arg(long, default_value = "schema")]
        out: PathBuf,
    },
    /// Print the shell completions for agent-relay (e.g. `agent-relay completions bash > ~/.local/share/bash-completion/completions/agent-relay`).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the manual page, or write it and one page per command into a folder
    /// (e.g. `agent-relay man --out ~/.local/share/man/man1`).
    Man {
        /// Folder to write every page into, instead of printing the main one.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum HookHost {
    ClaudeCode,
    Codex,
}

#[derive(Subcommand)]
enum InstallHost {
    /// Keep `agent-relay serve` running: a systemd user unit (enabled and started), or a
    /// launchd agent on macOS (loaded).
    Service {
        /// Show the file and the commands, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Stop the service and take its file away.
        #[arg(long)]
        remove: bool,
        /// A launchd agent even where launchd is not (written, not loaded).
        #[arg(long, conflicts_with = "systemd")]
        launchd: bool,
        /// A systemd user unit even where systemd is not (written, not loaded).
        #[arg(long)]
        systemd: bool,
    },
    /// The MCP server in ~/.claude.json and the hooks in ~/.claude/settings.json (user scope),
    /// for those who keep their own settings files rather than use the plugin.
    ClaudeCode {
        /// Show what would change, write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Take out what an earlier `install claude-code` added (to use the plugin instead).
        #[arg(long)]
        remove: bool,
    },
    /// The hooks for plain `codex` in $CODEX_HOME/hooks.json (~/.codex), trusted in Codex's
    /// config.toml: a topic per session, the answers, approvals on the phone. `agent-relay codex`
    /// does all that and more (the phone starts turns) without them.
    Codex {
        /// Show what would change, write nothing.
        #[arg(long)]
        dry_run: bool,
        /// Take out what an earlier `install codex` added.
        #[arg(long)]
        remove: bool,
    },
}

#[derive(Subcommand)]
enum ClusterCmd {
    /// Forget a machine that is gone for good (retired, or reinstalled):
    /// its name, its slots and topics, and the messages waiting for it.
    Forget {
        /// The machine's node name.
        node: String,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Cmd::Stdio { log_stderr: false });
    if matches!(
        command,
        Cmd::Stdio { .. }
            | Cmd::Mcp { .. }
            | Cmd::Serve { .. }
            | Cmd::Codex { .. }
            | Cmd::Opencode { .. }
            | Cmd::Hook { .. }
            | Cmd::Drain
            | Cmd::Status
            | Cmd::Doctor
            | Cmd::Setup
            | Cmd::Cluster { .. }
    ) {
        let started_with = cli::private_umask();
        cli::agents_umask(started_with);
    }
    let result = match command {
        Cmd::Stdio { log_stderr } => cli::stdio(log_stderr),
        Cmd::Mcp { log_stderr } => cli::mcp(log_stderr),
        Cmd::Serve { log_stderr } => cli::serve(log_stderr),
        Cmd::Codex { args } => cli::codex(&args),
        Cmd::Opencode { args } => cli::opencode(&args),
        Cmd::Hook { host, event } => cli::hook(matches!(host, HookHost::Codex), &event),
        Cmd::Drain => cli::drain(),
        Cmd::ServeWatcher => Ok(cli::serve_watcher()),
        Cmd::CodexTools { socket } => cli::codex_tools(&socket),
        Cmd::Install {
            host: InstallHost::ClaudeCode { dry_run, remove },
        } => cli::install_claude_code(dry_run, remove),
        Cmd::Install {
            host:
                InstallHost::Service {
                    dry_run,
                    remove,
                    launchd,
                    systemd,
                },
        } => cli::install_service(dry_run, remove, launchd, systemd),
        Cmd::Install {
            host: InstallHost::Codex { dry_run, remove },
        } => cli::install_codex(dry_run, remove),
        Cmd::Status => cli::status(),
        Cmd::Demo => cli::demo(),
        Cmd::Doctor => cli::doctor(),
        Cmd::Setup => cli::setup(),
        Cmd::Cluster {
            command: ClusterCmd::Forget { node },
        } => cli::cluster_forget(&node),
        Cmd::Schema { out } => cli::schema(&out),
        Cmd::Completions { shell } => cli::completions(shell, Cli::command()),
        Cmd::Man { out } => cli::man(Cli::command(), out.as_deref()),
    };
    result.unwrap_or_else(|e| {
        cli::report(&e);
        ExitCode::FAILURE
    })
}

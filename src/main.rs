//! The `agent-relay` binary: what a host spawns (`stdio`, the default) and a
//! few commands for people at a terminal.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use clap::{Parser, Subcommand};

use agent_relay::commands;
use agent_relay::config::{ConfigError, Setup};
use agent_relay::paths::Missing;
use agent_relay::session::Session;
use agent_relay::{bus, host, logging};

#[derive(Parser)]
#[command(
    name = "agent-relay",
    version,
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
    /// Show the relay's sessions, as the leader sees them.
    Status,
    /// Run three sessions against a simulated Telegram, kill the leader, watch the failover.
    Demo,
    /// Check the configuration, the token, the chat and the bot's rights.
    Doctor,
    /// Write the JSON Schemas of every wire type.
    Schema {
        /// Folder to write into.
        #[arg(long, default_value = "schema")]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Cmd::Stdio { log_stderr: false });
    if matches!(command, Cmd::Stdio { .. } | Cmd::Status | Cmd::Doctor) {
        // Whatever the relay or a library it uses creates (log files,
        // SQLite's -wal and -shm) is for the user alone, whatever umask the
        // host passed down. Set before any thread exists, so nothing races it.
        // SAFETY: umask has no preconditions and cannot fail.
        unsafe { libc::umask(0o077) };
    }
    let result = match command {
        Cmd::Stdio { log_stderr } => stdio(log_stderr),
        Cmd::Status => status(),
        Cmd::Demo => demo(),
        Cmd::Doctor => doctor(),
        Cmd::Schema { out } => schema(&out),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let message = agent_relay::redact::redact(&format!("{e:#}")).into_owned();
            eprintln!("agent-relay: {message}");
            ExitCode::FAILURE
        }
    }
}

/// One thread is plenty for a sidecar: it waits on pipes, a socket and
/// HTTP, and its few blocking calls (SQLite, stdin) go to tokio's blocking
/// pool. Fewer threads also means fewer malloc arenas and a smaller idle
/// footprint.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

fn stdio(log_stderr: bool) -> anyhow::Result<ExitCode> {
    let Setup {
        paths,
        dirs_trusted,
        config,
    } = Setup::from_env(Missing::Create)?;
    // Logging is a convenience: a sidecar that cannot log still serves its
    // host. It never logs into directories that failed the checks.
    let _log = if dirs_trusted {
        match logging::init(&paths.log_dir(), log_stderr) {
            Ok(guard) => Some(guard),
            Err(e) => {
                eprintln!("agent-relay: logging disabled: {e}");
                None
            }
        }
    } else {
        eprintln!("agent-relay: logging disabled: the relay's directories failed the checks");
        None
    };
    // The session shows a bad configuration in the status line and keeps
    // serving the host; an untrusted path also goes to stderr, since the log
    // may be the very thing that cannot be written.
    if let Err(e) = &config {
        tracing::error!("configuration error: {e}");
        if matches!(e, ConfigError::Untrusted(_)) {
            eprintln!("agent-relay: refusing to join the relay: {e}");
        }
    }
    let rt = runtime()?;
    rt.block_on(async move {
        let session: Arc<OnceLock<Arc<Session>>> = Arc::default();
        let slot = session.clone();
        let serve = host::serve(tokio::io::stdin(), tokio::io::stdout(), move |link| {
            let s = Session::new(link, paths, config);
            let _ = slot.set(s.clone());
            s
        });
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .context("cannot watch SIGTERM")?;
        tokio::select! {
            served = serve => served.context("stdio transport failed")?,
            _ = terminate.recv() => tracing::info!("SIGTERM: leaving"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: leaving"),
        }
        if let Some(session) = session.get() {
            session.close().await;
        }
        anyhow::Ok(())
    })?;
    // The blocking stdin reader may still sit in read(2); do not wait for it.
    rt.shutdown_background();
    Ok(ExitCode::SUCCESS)
}

fn status() -> anyhow::Result<ExitCode> {
    let Setup { paths, config, .. } = Setup::from_env(Missing::Leave)?;
    let config = config?;
    let bot = config
        .bot_id()
        .context("no bot token configured (config.toml bot_token or TELEGRAM_BOT_TOKEN)")?;
    let status = runtime()?.block_on(bus::query_status(&paths, bot))?;
    match status {
        Some(status) => {
            println!("{}", commands::relay_status_text(&status));
            Ok(ExitCode::SUCCESS)
        }
        None => {
            println!(
                "no relay is running for bot {bot} (no leader on {})",
                paths.bus_dir(bot).display()
            );
            Ok(ExitCode::from(3))
        }
    }
}

fn demo() -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find this program's own path")?;
    runtime()?
        .block_on(agent_relay::demo::run(&exe, std::io::stdout()))
        .context("demo failed")?;
    Ok(ExitCode::SUCCESS)
}

fn doctor() -> anyhow::Result<ExitCode> {
    let Setup { paths, config, .. } = Setup::from_env(Missing::Leave)?;
    let report = runtime()?.block_on(agent_relay::doctor::diagnose(&paths, config));
    print!("{report}");
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn schema(out: &std::path::Path) -> anyhow::Result<ExitCode> {
    let written = agent_relay::schema::write_schemas(out)
        .with_context(|| format!("cannot write {}", out.display()))?;
    println!("wrote {} schemas under {}", written.len(), out.display());
    Ok(ExitCode::SUCCESS)
}

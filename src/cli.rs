//! The commands of the `agent-relay` binary, one function each; `main.rs`
//! only parses the command line. This is the binary's edge: errors are
//! `anyhow` here and nowhere else.

use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use anyhow::Context;

use crate::config::{ConfigError, Setup};
use crate::paths::Missing;
use crate::session::Session;
use crate::{bus, commands, host, logging};

/// Whatever the relay or a library it uses creates (log files, SQLite's
/// -wal and -shm) is for the user alone, whatever umask the host passed
/// down. Call it before any thread exists, so nothing races it.
pub fn private_umask() {
    // SAFETY: umask has no preconditions and cannot fail.
    unsafe { libc::umask(0o077) };
}

/// How an error leaves the binary: one line on stderr, redacted.
pub fn report(error: &anyhow::Error) {
    let message = crate::redact::redact(&format!("{error:#}")).into_owned();
    eprintln!("agent-relay: {message}");
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

pub fn stdio(log_stderr: bool) -> anyhow::Result<ExitCode> {
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

/// `agent-relay mcp`: Claude Code's MCP server, a session of the relay.
pub fn mcp(log_stderr: bool) -> anyhow::Result<ExitCode> {
    let Setup {
        paths,
        dirs_trusted,
        config,
    } = Setup::from_env(Missing::Create)?;
    let _log = if dirs_trusted {
        logging::init(&paths.log_dir(), log_stderr)
            .map_err(|e| eprintln!("agent-relay: logging disabled: {e}"))
            .ok()
    } else {
        eprintln!("agent-relay: logging disabled: the relay's directories failed the checks");
        None
    };
    if let Err(e) = &config {
        tracing::error!("configuration error: {e}");
        eprintln!("agent-relay: {e}");
    }
    let env = crate::claude::ClaudeEnv::from_env();
    let rt = runtime()?;
    rt.block_on(async move {
        let serve =
            crate::claude::serve(tokio::io::stdin(), tokio::io::stdout(), paths, config, env);
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .context("cannot watch SIGTERM")?;
        // Claude Code ends its MCP servers with SIGINT (stdin still open).
        // The serving future is dropped there, so leave the bus explicitly:
        // the session's drop does not wait.
        tokio::select! {
            served = serve => served.context("stdio transport failed")?,
            _ = terminate.recv() => tracing::info!("SIGTERM: leaving"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: leaving"),
        }
        anyhow::Ok(())
    })?;
    rt.shutdown_timeout(std::time::Duration::from_millis(500));
    Ok(ExitCode::SUCCESS)
}

/// `agent-relay hook <event>`: one Claude Code hook. It always exits 0: a
/// hook that fails must not block Claude Code, and deciding nothing lets
/// Claude Code go on as without it.
pub fn hook(event: &str) -> anyhow::Result<ExitCode> {
    use std::io::{Read, Write};
    let mut input = Vec::new();
    std::io::stdin()
        .take(64 << 20)
        .read_to_end(&mut input)
        .context("cannot read the hook input")?;
    let Setup { paths, config, .. } = Setup::from_env(Missing::Leave)?;
    let (output, note) =
        runtime()?.block_on(crate::claude::hook::run(event, &input, &paths, config));
    if let Some(note) = note {
        eprintln!("{}", crate::redact::redact(&note));
    }
    if let Some(output) = output {
        let mut stdout = std::io::stdout();
        stdout.write_all(output.as_bytes())?;
        stdout.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `agent-relay install claude-code`.
pub fn install_claude_code(dry_run: bool) -> anyhow::Result<ExitCode> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    let exe = std::env::current_exe().context("cannot find this program's own path")?;
    let exe = exe.to_str().context("this program's path is not UTF-8")?;
    let targets = crate::claude::install::Targets::from_env(std::path::Path::new(&home));
    print!(
        "{}",
        crate::claude::install::install(&targets, exe, dry_run)?
    );
    Ok(ExitCode::SUCCESS)
}

pub fn status() -> anyhow::Result<ExitCode> {
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

pub fn demo() -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find this program's own path")?;
    runtime()?
        .block_on(crate::demo::run(&exe, std::io::stdout()))
        .context("demo failed")?;
    Ok(ExitCode::SUCCESS)
}

pub fn doctor() -> anyhow::Result<ExitCode> {
    let Setup { paths, config, .. } = Setup::from_env(Missing::Leave)?;
    let report = runtime()?.block_on(crate::doctor::diagnose(&paths, config));
    print!("{report}");
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `agent-relay setup`: the interactive first run. Without a terminal it
/// refuses with the non-interactive way (environment or config keys).
pub fn setup() -> anyhow::Result<ExitCode> {
    let Some(console) = crate::setup::Console::open() else {
        let paths = crate::paths::Paths::from_env()?;
        return Err(crate::setup::no_terminal(&paths).into());
    };
    // Directories that fail the checks come back as an untrusted `config`,
    // which setup refuses before it reads or writes anything.
    let Setup { paths, config, .. } = Setup::from_env(Missing::Create)?;
    let outcome = crate::setup::run(crate::setup::Start {
        console,
        paths,
        config,
        exe: std::env::current_exe().ok(),
    })?;
    Ok(match outcome {
        crate::setup::Outcome::Done | crate::setup::Outcome::Unchanged => ExitCode::SUCCESS,
        crate::setup::Outcome::NoHello => ExitCode::FAILURE,
    })
}

pub fn schema(out: &std::path::Path) -> anyhow::Result<ExitCode> {
    let written = crate::schema::write_schemas(out)
        .with_context(|| format!("cannot write {}", out.display()))?;
    println!("wrote {} schemas under {}", written.len(), out.display());
    Ok(ExitCode::SUCCESS)
}

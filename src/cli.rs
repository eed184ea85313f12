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

/// `agent-relay cluster forget <machine>`: a machine that is gone for good
/// (retired, or reinstalled with a new node id) gives up its name, its
/// slots and topics, and the updates that were waiting for it.
pub fn cluster_forget(name: &str) -> anyhow::Result<ExitCode> {
    use crate::cluster::nodes::Question;
    use crate::cluster::{Cluster, NodeName};
    let Setup { config, .. } = Setup::from_env(Missing::Leave)?;
    let config = config?;
    let bot = config
        .bot_id()
        .context("no bot token configured (config.toml bot_token or TELEGRAM_BOT_TOKEN)")?;
    let cluster = config.cluster.clone().context(
        "no [cluster] section in config.toml (or AGENT_RELAY_NATS_URL): this relay runs on one machine",
    )?;
    let name = NodeName::parse(name).map_err(anyhow::Error::msg)?;
    runtime()?.block_on(async {
        let nats = Cluster::connect_unclaimed(&cluster, bot, "agent-relay-cli").await?;
        let known = nats.claims().nodes().await?;
        if !known.contains(&name) {
            let known: Vec<String> = known.iter().map(ToString::to_string).collect();
            anyhow::bail!(
                "no machine named {name} joined this relay (machines: {})",
                if known.is_empty() { "none".into() } else { known.join(", ") }
            );
        }
        let answered: Vec<(NodeName, serde_json::Value)> = nats
            .ask_nodes(Question::Status, &(), std::slice::from_ref(&name))
            .await?;
        if answered.iter().any(|(n, _)| *n == name) {
            anyhow::bail!(
                "machine {name} is running: `forget` is for a machine that is gone for good; stop its sessions first"
            );
        }
        let forgotten = nats.forget(&name).await?;
        println!(
            "forgot machine {name}: {} claim(s) removed{}",
            forgotten.claims,
            if forgotten.had_consumer {
                ", its consumer deleted"
            } else {
                ""
            }
        );
        if forgotten.dropped_updates > 0 {
            println!(
                "{} message(s) that were waiting for {name} were dropped: the sessions they were for lived on that machine",
                forgotten.dropped_updates
            );
        }
        Ok(ExitCode::SUCCESS)
    })
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

//! The commands of the `agent-relay` binary, one function each; `main.rs`
//! only parses the command line. This is the binary's edge: errors are
//! `anyhow` here and nowhere else.

use std::future::Future;
use std::process::ExitCode;
use std::sync::{Arc, OnceLock};

use anyhow::Context;

use crate::config::{ConfigError, Setup};
use crate::paths::Missing;
use crate::session::Session;
use crate::{commands, host, logging, member};

/// Whatever the relay or a library it uses creates (log files, SQLite's
/// -wal and -shm) is for the user alone, whatever umask the host passed
/// down. Call it before any thread exists, so nothing races it.
pub fn private_umask() -> u32 {
    crate::sys::set_umask(0o077)
}

/// The umask the agents `serve` starts get: the one it was started with
/// (an agent's files are its project's, not the relay's).
pub fn agents_umask(mask: u32) {
    crate::launch::set_agent_umask(mask);
}

/// How an error leaves the binary: one line on stderr, redacted.
pub fn report(error: &anyhow::Error) {
    eprintln!("agent-relay: {}", one_line(error));
}

/// An error and its causes on one line, each said once: a cause whose
/// message its wrapper already quotes (`cannot load …: {0}`) is not
/// repeated after it.
fn one_line(error: &anyhow::Error) -> String {
    let mut said = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if said.contains(&text) {
            continue;
        }
        if !said.is_empty() {
            said.push_str(": ");
        }
        said.push_str(&text);
    }
    crate::redact::redact(&said).into_owned()
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

/// What a sidecar that a host spawns (`stdio`, `mcp`) starts from: the
/// checked directories and configuration, the log, and the runtime.
struct Sidecar {
    paths: crate::paths::Paths,
    config: Result<crate::config::Config, ConfigError>,
    rt: tokio::runtime::Runtime,
    _log: Option<logging::LogGuard>,
}

/// The one prologue of `stdio` and `mcp`. A bad configuration does not stop
/// the sidecar: it keeps serving its host and shows the problem where the
/// host shows things; `on_stderr` says which problems also go to stderr
/// (the log may be the very thing that cannot be written).
fn sidecar(log_stderr: bool, on_stderr: fn(&ConfigError) -> bool) -> anyhow::Result<Sidecar> {
    let Setup {
        paths,
        dirs_trusted,
        config,
    } = Setup::from_env(Missing::Create)?;
    // Logging is a convenience: a sidecar that cannot log still serves its
    // host. It never logs into directories that failed the checks.
    let log = if dirs_trusted {
        logging::init(&paths.log_dir(), log_stderr)
            .map_err(|e| eprintln!("agent-relay: logging disabled: {e}"))
            .ok()
    } else {
        eprintln!("agent-relay: logging disabled: the relay's directories failed the checks");
        None
    };
    if let Err(e) = &config {
        tracing::error!("configuration error: {e}");
        if on_stderr(e) {
            eprintln!("agent-relay: refusing to join the relay: {e}");
        }
    }
    Ok(Sidecar {
        paths,
        config,
        rt: runtime()?,
        _log: log,
    })
}

/// Serves until `serve` ends (the host closed stdin) or SIGTERM or SIGINT
/// arrives; then `serve` is dropped.
async fn until_stopped(serve: impl Future<Output = std::io::Result<()>>) -> anyhow::Result<()> {
    let stop = tokio_util::sync::CancellationToken::new();
    let signalled = stop_on_signal(stop.clone())?;
    tokio::select! {
        served = serve => served.context("stdio transport failed")?,
        () = stop.cancelled() => {}
    }
    signalled.abort();
    Ok(())
}

/// Cancels `stop` on the first SIGTERM or SIGINT.
fn stop_on_signal(
    stop: tokio_util::sync::CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot watch SIGTERM")?;
    let mut interrupt = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("cannot watch SIGINT")?;
    Ok(crate::tasks::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => tracing::info!("SIGTERM: leaving"),
            _ = interrupt.recv() => tracing::info!("SIGINT: leaving"),
        }
        stop.cancel();
    }))
}

pub fn stdio(log_stderr: bool) -> anyhow::Result<ExitCode> {
    // The session shows a bad configuration in the status line; only an
    // untrusted path also goes to stderr.
    let Sidecar {
        paths,
        config,
        rt,
        _log,
    } = sidecar(log_stderr, |e| matches!(e, ConfigError::Untrusted(_)))?;
    rt.block_on(async move {
        let session: Arc<OnceLock<Arc<Session>>> = Arc::default();
        let slot = session.clone();
        // `agent-relay serve` names the launch a sidecar's host is.
        let launch = std::env::var(crate::session::LAUNCH_ENV)
            .ok()
            .filter(|id| !id.is_empty());
        let serve = host::serve(tokio::io::stdin(), tokio::io::stdout(), move |link| {
            let s = Session::new(link, paths, config);
            if let Some(id) = launch {
                s.set_launch(id);
            }
            let _ = slot.set(s.clone());
            s
        });
        until_stopped(serve).await?;
        if let Some(session) = session.get() {
            session.close().await;
        }
        anyhow::Ok(())
    })?;
    // The blocking stdin reader may still sit in read(2); do not wait for it.
    rt.shutdown_background();
    Ok(ExitCode::SUCCESS)
}

/// Whether this process runs inside an agent `agent-relay serve` started,
/// which relays that agent itself: the Claude Code plugin's MCP server and
/// hooks step aside there, or the session would register twice.
fn launched_by_serve() -> bool {
    std::env::var_os(crate::session::LAUNCH_ENV).is_some_and(|id| !id.is_empty())
}

/// `agent-relay mcp`: Claude Code's MCP server, a session of the relay.
pub fn mcp(log_stderr: bool) -> anyhow::Result<ExitCode> {
    if launched_by_serve() {
        eprintln!(
            "agent-relay: this Claude Code was started by agent-relay serve, which relays it itself; the MCP server steps aside"
        );
        return Ok(ExitCode::SUCCESS);
    }
    // Claude Code has no status line for the MCP server: every problem
    // goes to stderr, which it keeps in its MCP log.
    let Sidecar {
        paths,
        config,
        rt,
        _log,
    } = sidecar(log_stderr, |_| true)?;
    let env = crate::claude::ClaudeEnv::from_env();
    // Claude Code ends its MCP servers with SIGINT (stdin still open): the
    // server leaves in its own time, bounded (`claude::LEAVE_WITHIN`).
    rt.block_on(async {
        let stop = tokio_util::sync::CancellationToken::new();
        let signalled = stop_on_signal(stop.clone())?;
        let served = crate::claude::serve(
            tokio::io::stdin(),
            tokio::io::stdout(),
            paths,
            config,
            env,
            stop,
        )
        .await;
        signalled.abort();
        served.context("stdio transport failed")
    })?;
    // The blocking stdin reader may still sit in read(2); do not wait for it.
    rt.shutdown_background();
    Ok(ExitCode::SUCCESS)
}

/// `agent-relay serve-watcher`: what `serve` starts beside it to end its
/// agents' process groups once it is gone (`launch::watcher`).
pub fn serve_watcher() -> ExitCode {
    crate::launch::watcher::run()
}

/// `agent-relay drain`: a leader for as long as the messages the last
/// relay process left take to go (`leader::drain`). Started by a relay
/// process, detached; what it does goes to the log.
pub fn drain() -> anyhow::Result<ExitCode> {
    let Sidecar {
        paths,
        config,
        rt,
        _log,
    } = sidecar(false, |_| false)?;
    let config = config.context("the configuration cannot be used")?;
    let drained = rt.block_on(crate::leader::drain(&paths, &config))?;
    tracing::info!(?drained, "the drain ends");
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    Ok(ExitCode::SUCCESS)
}

/// `agent-relay serve`: the machine's launcher, until SIGTERM or SIGINT
/// (docs/DESIGN.md, *Launching*).
pub fn serve(log_stderr: bool) -> anyhow::Result<ExitCode> {
    let Setup {
        paths,
        dirs_trusted,
        config,
    } = Setup::from_env(Missing::Create)?;
    let config = config.context("agent-relay serve cannot start")?;
    let _log = if dirs_trusted {
        logging::init(&paths.log_dir(), log_stderr)
            .map_err(|e| eprintln!("agent-relay: logging disabled: {e}"))
            .ok()
    } else {
        None
    };
    if config.launch.roots.is_empty() {
        eprintln!(
            "agent-relay serve: no [launch] roots in {}: /new is refused until you name the folders agents may work in",
            config.file.display()
        );
    }
    if std::env::var_os("TELEGRAM_BOT_TOKEN").is_some() && config.launch.commands.contains_key("pi")
    {
        eprintln!(
            "agent-relay serve: TELEGRAM_BOT_TOKEN is not passed to the agents it starts; a pi session's sidecar reads bot_token from {}",
            config.file.display()
        );
    }
    eprintln!(
        "agent-relay serve: pid {}, starting agents asked for from Telegram (stop with Ctrl-C)",
        std::process::id()
    );
    runtime()?.block_on(async move {
        let stop = tokio_util::sync::CancellationToken::new();
        let stopping = stop.clone();
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .context("cannot watch SIGTERM")?;
        crate::tasks::spawn(async move {
            tokio::select! {
                _ = terminate.recv() => tracing::info!("SIGTERM: serve stops"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: serve stops"),
            }
            stopping.cancel();
        });
        crate::launch::serve::run(paths, config, stop)
            .await
            .context("agent-relay serve")
    })?;
    Ok(ExitCode::SUCCESS)
}

/// `agent-relay install service [--remove] [--dry-run] [--launchd|--systemd]`.
pub fn install_service(
    dry_run: bool,
    remove: bool,
    launchd: bool,
    systemd: bool,
) -> anyhow::Result<ExitCode> {
    use crate::launch::service::{self, Manager};
    let home = std::path::PathBuf::from(std::env::var_os("HOME").context("HOME is not set")?);
    let config_home = std::env::var_os("XDG_CONFIG_HOME")
        .map(std::path::PathBuf::from)
        .filter(|p| p.is_absolute())
        .unwrap_or_else(|| home.join(".config"));
    let manager = match (launchd, systemd) {
        (true, _) => Manager::Launchd,
        (_, true) => Manager::Systemd,
        _ => Manager::native(),
    };
    let exe = std::env::current_exe().context("cannot find this program's own path")?;
    let mut env: Vec<(String, String)> = Vec::new();
    for key in ["PATH", "AGENT_RELAY_HOME"] {
        if let Ok(value) = std::env::var(key) {
            env.push((key.to_string(), value));
        }
    }
    let unit = service::unit(manager, &exe, &home, &config_home, &env);
    let done = if remove {
        service::remove(&unit, dry_run)?
    } else {
        service::install(&unit, dry_run)?
    };
    print!("{}", done.said);
    if !remove && std::env::var_os("TELEGRAM_BOT_TOKEN").is_some() {
        println!(
            "note: the service does not carry TELEGRAM_BOT_TOKEN; it reads bot_token from config.toml"
        );
    }
    Ok(if done.failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// `agent-relay codex [args…]`: Codex's TUI with the relay beside it; exits
/// with the TUI's code.
pub fn codex(args: &[std::ffi::OsString]) -> anyhow::Result<ExitCode> {
    // The terminal is the TUI's: problems go to the log, and to stderr only
    // before the TUI starts.
    let Sidecar {
        paths,
        config,
        rt,
        _log,
    } = sidecar(false, |e| matches!(e, ConfigError::Untrusted(_)))?;
    let program = crate::codex::wrapper::program();
    let code = rt.block_on(crate::codex::wrapper::run(paths, config, &program, args))?;
    rt.shutdown_timeout(std::time::Duration::from_millis(500));
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

/// `agent-relay opencode [args…]`: OpenCode's TUI with the relay beside it;
/// exits with the TUI's code.
pub fn opencode(args: &[std::ffi::OsString]) -> anyhow::Result<ExitCode> {
    // The terminal is the TUI's, as for `agent-relay codex`.
    let Sidecar {
        paths,
        config,
        rt,
        _log,
    } = sidecar(false, |e| matches!(e, ConfigError::Untrusted(_)))?;
    let program = crate::opencode::program();
    let code = rt.block_on(crate::opencode::wrapper::run(paths, config, &program, args))?;
    rt.shutdown_timeout(std::time::Duration::from_millis(500));
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

/// `agent-relay codex-tools <socket>`: the MCP server Codex runs for the
/// relay's tool; ends when Codex closes its stdin.
pub fn codex_tools(socket: &std::path::Path) -> anyhow::Result<ExitCode> {
    let rt = runtime()?;
    rt.block_on(crate::codex::tools::run_mcp(
        socket,
        tokio::io::stdin(),
        tokio::io::stdout(),
    ))
    .with_context(|| format!("the relay's tool socket {}", socket.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// How long a hook waits for its input to end (Claude Code writes it at
/// once).
const HOOK_INPUT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// `agent-relay hook [--host codex] <event>`: one Claude Code (or Codex)
/// hook. It always exits 0: a hook that fails must not block its host, and
/// deciding nothing lets the host go on as without it.
pub fn hook(codex: bool, event: &str) -> anyhow::Result<ExitCode> {
    use std::io::{Read, Write};
    if launched_by_serve() {
        // serve plays this Claude Code's host: nothing for a hook to do.
        return Ok(ExitCode::SUCCESS);
    }
    // Claude Code writes the event and closes stdin at once; a stdin that
    // never ends must not keep the hook (and Claude Code) waiting.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut input = Vec::new();
        let read = std::io::stdin()
            .take(64 << 20)
            .read_to_end(&mut input)
            .map(|_| input);
        let _ = tx.send(read);
    });
    let input = match rx.recv_timeout(HOOK_INPUT_WAIT) {
        Ok(read) => read.context("cannot read the hook input")?,
        Err(_) => {
            eprintln!(
                "agent-relay: the hook input did not end within {} s; nothing was relayed",
                HOOK_INPUT_WAIT.as_secs()
            );
            // The reader thread may sit in read(2); leaving ends it.
            return Ok(ExitCode::SUCCESS);
        }
    };
    let (output, note) = if codex {
        // The hook joins the relay itself (there is nothing else to hand
        // the event to): it logs, and creates what a session needs.
        let Sidecar {
            paths,
            config,
            rt,
            _log,
        } = sidecar(false, |_| false)?;
        let wrapped = std::env::var_os(crate::codex::hook::WRAPPED).is_some();
        let answer = rt.block_on(crate::codex::hook::run(
            event, &input, paths, config, wrapped,
        ));
        rt.shutdown_timeout(std::time::Duration::from_millis(500));
        (answer.output, answer.note)
    } else {
        let Setup { paths, config, .. } = Setup::from_env(Missing::Leave)?;
        runtime()?.block_on(crate::claude::hook::run(event, &input, &paths, config))
    };
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

/// `agent-relay install claude-code [--remove]`.
pub fn install_claude_code(dry_run: bool, remove: bool) -> anyhow::Result<ExitCode> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    let targets = crate::claude::install::Targets::from_env(std::path::Path::new(&home));
    let said = if remove {
        crate::claude::install::remove(&targets, dry_run)?
    } else {
        let exe = std::env::current_exe().context("cannot find this program's own path")?;
        let exe = exe.to_str().context("this program's path is not UTF-8")?;
        crate::claude::install::install(&targets, exe, dry_run)?
    };
    print!("{said}");
    Ok(ExitCode::SUCCESS)
}

/// `agent-relay install codex [--remove]`.
pub fn install_codex(dry_run: bool, remove: bool) -> anyhow::Result<ExitCode> {
    let home = std::env::var_os("HOME").context("HOME is not set")?;
    let targets = crate::codex::install::Targets::from_env(std::path::Path::new(&home));
    let said = if remove {
        crate::codex::install::remove(&targets, dry_run)?
    } else {
        let exe = std::env::current_exe().context("cannot find this program's own path")?;
        let exe = exe.to_str().context("this program's path is not UTF-8")?;
        let codex = crate::codex::wrapper::program();
        runtime()?.block_on(crate::codex::install::install(
            &targets, exe, &codex, dry_run,
        ))?
    };
    print!("{said}");
    Ok(ExitCode::SUCCESS)
}

/// `agent-relay completions <shell>`: the completion script on stdout.
pub fn completions(
    shell: clap_complete::Shell,
    mut command: clap::Command,
) -> anyhow::Result<ExitCode> {
    // Generated into memory first: clap_complete panics on a failed write,
    // and `agent-relay completions bash | head` is a closed pipe.
    let mut script = Vec::new();
    let name = command.get_name().to_string();
    clap_complete::generate(shell, &mut command, name, &mut script);
    write_stdout(&script)
}

/// `agent-relay man`: the manual page (roff) on stdout; with `--out`, that
/// page and one per command (`agent-relay-setup.1`, …, which the main page
/// refers to) written into a folder.
pub fn man(command: clap::Command, out: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    let Some(dir) = out else {
        let mut page = Vec::new();
        clap_mangen::Man::new(command)
            .render(&mut page)
            .context("cannot render the manual page")?;
        return write_stdout(&page);
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut command = command.disable_help_subcommand(true);
    command.build();
    let mut pending = vec![command];
    let mut written = 0;
    while let Some(command) = pending.pop() {
        pending.extend(
            command
                .get_subcommands()
                .filter(|c| !c.is_hide_set())
                .cloned(),
        );
        let page = clap_mangen::Man::new(command);
        let path = page
            .generate_to(dir)
            .with_context(|| format!("cannot write a manual page into {}", dir.display()))?;
        written += 1;
        tracing::debug!("wrote {}", path.display());
    }
    println!("wrote {written} manual pages under {}", dir.display());
    Ok(ExitCode::SUCCESS)
}

fn write_stdout(bytes: &[u8]) -> anyhow::Result<ExitCode> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .context("cannot write to stdout")?;
    Ok(ExitCode::SUCCESS)
}

pub fn status() -> anyhow::Result<ExitCode> {
    let Setup { paths, config, .. } = Setup::from_env(Missing::Leave)?;
    let config = config?;
    let bot = config
        .bot_id()
        .context("no bot token configured (config.toml bot_token or TELEGRAM_BOT_TOKEN)")?;
    let status = runtime()?.block_on(member::query_status(&paths, bot))?;
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
        let Some(last) = forgotten.waiting.last().map(|w| w.sequence) else {
            return Ok(ExitCode::SUCCESS);
        };
        // Nothing the person wrote disappears without a word: each topic
        // with messages waiting is told they were not delivered, and what
        // cannot be told there is printed here, before anything is dropped.
        let undelivered = undelivered_by_topic(&forgotten.waiting);
        let token = config
            .token
            .as_ref()
            .context("no bot token configured (config.toml bot_token or TELEGRAM_BOT_TOKEN)")?;
        let api = crate::telegram::BotApi::new(&config.api_url, token)?
            .with_timeout(std::time::Duration::from_secs(30));
        let messages: usize = undelivered.iter().map(|t| t.texts.len()).sum();
        let mut told = 0;
        for topic in &undelivered {
            match tell_undelivered(&api, &name, topic).await {
                Ok(()) => told += 1,
                Err(e) => {
                    println!(
                        "could not tell topic {} of chat {} ({e}); its undelivered message(s):",
                        topic.thread, topic.chat
                    );
                    for text in &topic.texts {
                        println!("  > {text}");
                    }
                }
            }
        }
        let dropped = nats.drop_waiting(&name, last).await?;
        println!(
            "{dropped} update(s) that were waiting for {name} were dropped ({messages} message(s) in {} topic(s); {told} topic(s) told in Telegram): the sessions they were for lived on that machine",
            undelivered.len()
        );
        Ok(ExitCode::SUCCESS)
    })
}

/// The messages in one topic that a forgotten machine never received.
#[derive(Debug, PartialEq, Eq)]
struct Undelivered {
    chat: i64,
    thread: i64,
    /// The first of them, which the notice replies to.
    first: i64,
    /// Their texts, oldest first ("(no text)" for a photo and the like).
    texts: Vec<String>,
}

/// The person's messages among `waiting`, grouped by topic in the order
/// the topics first appear. Taps and bots' messages are left out: a tap
/// on a gone session's button has nothing to deliver.
fn undelivered_by_topic(waiting: &[crate::cluster::nodes::Waiting]) -> Vec<Undelivered> {
    use crate::telegram::{Update, UpdateKind};
    let mut out: Vec<Undelivered> = Vec::new();
    for w in waiting {
        let Ok(update) = Update::from_slice(&w.payload) else {
            continue;
        };
        let (UpdateKind::Message(m) | UpdateKind::EditedMessage(m)) = update.kind else {
            continue;
        };
        let (Some(thread), false) = (m.topic(), m.from.as_ref().is_none_or(|u| u.is_bot)) else {
            continue;
        };
        let text = m.text.clone().unwrap_or_else(|| "(no text)".into());
        match out
            .iter_mut()
            .find(|t| t.chat == m.chat.id && t.thread == thread)
        {
            Some(topic) => topic.texts.push(text),
            None => out.push(Undelivered {
                chat: m.chat.id,
                thread,
                first: m.message_id,
                texts: vec![text],
            }),
        }
    }
    out
}

/// The notice in a topic whose messages were not delivered.
fn undelivered_notice(machine: &crate::cluster::NodeName, topic: &Undelivered) -> String {
    let n = topic.texts.len();
    let what = if n == 1 {
        "This message was".to_string()
    } else {
        format!("{n} messages here, from this one on, were")
    };
    format!(
        "⚠️ {what} not delivered: this topic's session ran on machine {machine}, which was removed from the relay (`agent-relay cluster forget {machine}`). Send it again in another session's topic."
    )
}

/// Says [`undelivered_notice`] in `topic`, as a reply to its first
/// undelivered message; once more after a `retry_after`.
async fn tell_undelivered(
    api: &crate::telegram::BotApi,
    machine: &crate::cluster::NodeName,
    topic: &Undelivered,
) -> Result<(), crate::telegram::TelegramError> {
    use crate::telegram::TelegramError;
    use crate::telegram::types::{ReplyParameters, SendMessage};
    let params = SendMessage {
        chat_id: topic.chat,
        message_thread_id: Some(topic.thread),
        text: undelivered_notice(machine, topic),
        parse_mode: None,
        reply_markup: None,
        reply_parameters: Some(ReplyParameters {
            message_id: topic.first,
            allow_sending_without_reply: true,
        }),
        link_preview_options: None,
    };
    match api.send_message(params.clone()).await {
        Err(TelegramError::RateLimited { retry_after }) => {
            tokio::time::sleep(retry_after).await;
            api.send_message(params).await.map(drop)
        }
        sent => sent.map(drop),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::nodes::Waiting;
    use serde_json::json;

    fn waiting(sequence: u64, update: serde_json::Value) -> Waiting {
        Waiting {
            sequence,
            payload: serde_json::to_vec(&update).unwrap().into(),
        }
    }

    fn message(update_id: i64, thread: i64, message_id: i64, is_bot: bool, text: &str) -> Waiting {
        waiting(
            update_id as u64,
            json!({"update_id": update_id, "message": {
                "message_id": message_id, "date": 1,
                "chat": {"id": -100, "type": "supergroup", "is_forum": true},
                "from": {"id": 7, "is_bot": is_bot, "first_name": "P"},
                "message_thread_id": thread, "is_topic_message": true,
                "text": text,
            }}),
        )
    }

    #[test]
    fn the_undelivered_messages_are_grouped_by_topic_leaving_taps_and_bots_out() {
        let tap = waiting(
            4,
            json!({"update_id": 4, "callback_query": {
                "id": "q", "from": {"id": 7, "is_bot": false, "first_name": "P"},
                "data": "x",
            }}),
        );
        let all = [
            message(1, 10, 100, false, "first in 10"),
            message(2, 20, 200, false, "first in 20"),
            message(3, 10, 101, true, "a bot's"),
            tap,
            message(5, 10, 102, false, "second in 10"),
            waiting(6, json!("not an update")),
        ];
        let got = undelivered_by_topic(&all);
        assert_eq!(
            got,
            [
                Undelivered {
                    chat: -100,
                    thread: 10,
                    first: 100,
                    texts: vec!["first in 10".into(), "second in 10".into()],
                },
                Undelivered {
                    chat: -100,
                    thread: 20,
                    first: 200,
                    texts: vec!["first in 20".into()],
                },
            ]
        );
        let machine = crate::cluster::NodeName::parse("box").unwrap();
        assert!(undelivered_notice(&machine, &got[0]).starts_with("⚠️ 2 messages here"));
        assert!(undelivered_notice(&machine, &got[1]).starts_with("⚠️ This message was"));
    }

    #[derive(Debug, thiserror::Error)]
    #[error("can be written by other users (mode 0666)")]
    struct Inner;

    #[derive(Debug, thiserror::Error)]
    #[error("config.toml {0}")]
    struct Quoting(#[source] Inner);

    /// Each cause once: a wrapper that quotes its source is not followed by
    /// the source again; one that does not quote it is.
    #[test]
    fn an_error_is_said_once_with_each_cause() {
        let quoted = anyhow::Error::new(Quoting(Inner));
        assert_eq!(
            one_line(&quoted),
            "config.toml can be written by other users (mode 0666)"
        );
        let context = anyhow::Error::new(Inner).context("cannot load the configuration");
        assert_eq!(
            one_line(&context),
            "cannot load the configuration: can be written by other users (mode 0666)"
        );
    }
}

//! Runs the fake Telegram Bot API as its own process, for tests, demos and
//! benchmarks that drive it over HTTP (see `agent_relay::fake_bot_api`).
//!
//! Prints exactly one line on stdout once it accepts connections:
//! `fake-bot-api listening on http://127.0.0.1:PORT token=<token>`
//! and serves until SIGINT or SIGTERM.

use std::io::Write;
use std::net::SocketAddr;

use agent_relay::fake_bot_api::{FakeBotApi, FakeConfig};
use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
#[command(about = "A fake Telegram Bot API on 127.0.0.1, for tests and demos")]
struct Args {
    /// Address to listen on; port 0 picks a free one.
    #[arg(long, default_value = "127.0.0.1:0")]
    addr: SocketAddr,
    /// Bot token the fake accepts (`<digits>:<35 chars>`).
    #[arg(long)]
    token: Option<String>,
    /// The bot's username, as `getMe` reports it.
    #[arg(long)]
    username: Option<String>,
    /// Enforce Telegram's send limits with 429 answers.
    #[arg(long)]
    rate_limits: bool,
    /// Report `has_topics_enabled: false` (no topics in private chats); a test
    /// can switch it on later with `POST control/bot_settings`.
    #[arg(long)]
    no_topics: bool,
    /// Report `allows_users_to_create_topics: false`.
    #[arg(long)]
    no_user_topics: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let defaults = FakeConfig::default();
    let config = FakeConfig {
        token: args.token.unwrap_or(defaults.token),
        bot_username: args.username.unwrap_or(defaults.bot_username),
        has_topics_enabled: !args.no_topics,
        allows_users_to_create_topics: !args.no_user_topics,
        rate_limits: args.rate_limits,
        addr: args.addr,
        ..defaults
    };
    let server = FakeBotApi::start(config)
        .await
        .with_context(|| format!("binding {}", args.addr))?;
    let api = server.api();
    api.add_default_chats();
    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "fake-bot-api listening on {} token={}",
        server.url(),
        api.token()
    )?;
    stdout.flush()?;
    drop(stdout);

    wait_for_signal().await?;
    server
        .shutdown()
        .await
        .context("shutting the server down")?;
    Ok(())
}

async fn wait_for_signal() -> anyhow::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result?,
        _ = terminate.recv() => {}
    }
    Ok(())
}

//! agent-relay: one Telegram bot drives every coding-agent session on a machine.
//!
//! A coding agent (the *host*) spawns this binary and speaks JSON-RPC 2.0 to it
//! over stdin/stdout. Every such *sidecar* joins a machine-local *bus*; the one
//! that holds the bus lock is the *leader* and alone talks to Telegram.
//! `docs/DESIGN.md` explains the protocols and the rules; `ARCHITECTURE.md` is
//! the map.
//!
//! Data flows one way: `host` (stdio) → `session` → `member` → over the
//! `bus` → `leader` → `telegram`, and back; with `[cluster]`, the leaders
//! of several machines meet through `cluster`. What every module
//! is, and what it may depend on, is on the code map of `ARCHITECTURE.md`.
//! `tests/tidy.rs` holds the code to that map (every module on it, each
//! naming only what its row allows, no import circle between the files of
//! one module), so this file keeps no second one.
//!
//! Only what another crate needs is public: the binary's commands (`cli`),
//! and for the tests, the benchmark and the fuzzers the wire types, the
//! codec, the stdio transport, the fake, the host client, the store's read
//! side, the bus's socket and the cluster layer. Everything else is private
//! to the crate, so the compiler reports what nothing uses.

mod backoff;
mod bus;
mod claude;
pub mod cli;
pub mod cluster;
pub mod codex;
mod commands;
mod config;
mod demo;
mod doctor;
pub mod fake_bot_api;
mod files;
pub mod framing;
pub mod host;
pub mod host_client;
mod ids;
mod launch;
mod leader;
mod logging;
mod mcp;
mod member;
mod opencode;
mod paths;
pub mod phone;
mod policy;
pub mod protocol;
mod redact;
mod render;
mod rpc_client;
pub mod schema;
mod session;
mod settings_file;
mod setup;
mod store;
mod sys;
mod tasks;
mod telegram;
mod topics;
mod visible;

/// `agent-relay --version`: the crate's version and the commit it was built
/// from (`build.rs`; `unknown` outside a checkout).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("AGENT_RELAY_COMMIT"),
    ")"
);

/// The bus's socket: its checked directory and typed envelopes (tests and
/// the benchmark play raw bus clients with these).
pub use bus::{election, wire};
/// The store's read side (tests look into the journal).
pub use store::{JournalState, Store};

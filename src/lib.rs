//! agent-relay: one Telegram bot drives every coding-agent session on a machine.
//!
//! A coding agent (the *host*) spawns this binary and speaks JSON-RPC 2.0 to it
//! over stdin/stdout. Every such *sidecar* joins a machine-local *bus*; the one
//! that holds the bus lock is the *leader* and alone talks to Telegram.
//! `docs/DESIGN.md` explains the protocols and the rules; `ARCHITECTURE.md` is
//! the map.
//!
//! The major components, in the order data flows through them:
//!
//! * `host` — NDJSON framing on stdio, the demultiplexer in front of the
//!   method table (params parsed once, with jsonrpsee's types), and
//!   outbound requests to the host with timeouts.
//!   It knows nothing of Telegram or the bus.
//! * `session` — one agent session: its binding, transport and sync facts,
//!   the status line, host events into relay actions, deliveries into prompts.
//! * `claude` — Claude Code as a host: the MCP server (`agent-relay mcp`)
//!   that runs a session and plays its host, and the hook command.
//! * `commands` — parsing of `/telegram-*` and `/relay` commands and the text
//!   of their reports.
//! * `bus` — the member (handle, actor, restart, status), election through a
//!   kernel file lock, the wire envelopes on the local socket, and the leader:
//!   registry, router, outbox, access, poller, triage.
//! * `telegram` — the Bot API client, the one error classifier, the types and
//!   the pacing; `render` — Markdown into Telegram HTML; `files` — the file
//!   rules both sides share (Telegram's limits, safe names, sizes).
//! * `topics` — slots A–Z, topic names and profile keys.
//! * `store` — the leader's SQLite state: epoch, bindings, offset, journal,
//!   who posted what, cleanup intents, paired users.
//! * `protocol` — every type that crosses a wire, each with a JSON Schema
//!   (`schema` exports them).
//! * `framing` — the one newline-delimited codec used by stdio and the bus.
//! * `cluster` — one bot across machines over NATS JetStream: the lease,
//!   the inbound stream, claims and calls (docs/CLUSTER.md). Phase 1: tested
//!   against a real `nats-server`, not yet used by the leader.
//! * `ids`, `config`, `paths`, `redact`, `visible`, `logging`, `backoff` — the
//!   edges (`visible`: text made safe to show, hidden characters written out).
//! * `doctor` and `setup` — the checks, and the interactive first run that
//!   writes the configuration.
//! * `fake_bot_api` — a faithful Bot API simulator for tests, `demo` and
//!   benchmarks; production paths never depend on it. `host_client` — the
//!   host's end of the host protocol, for the demo, benchmark and tests.
//!
//! Only what another crate needs is public: the binary's commands (`cli`),
//! and for the tests, the benchmark and the fuzzers the wire types, the
//! codec, the stdio transport, the fake, the host client, the store's
//! read side, the bus's socket and the cluster layer. Everything else is private to the
//! crate, so the compiler reports what nothing uses.

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
mod leader;
mod logging;
mod member;
mod paths;
mod policy;
pub mod protocol;
mod redact;
mod render;
pub mod schema;
mod session;
mod settings_file;
mod setup;
mod store;
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

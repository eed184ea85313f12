//! agent-relay: one Telegram bot drives every coding-agent session on a machine.
//!
//! A coding agent (the *host*) spawns this binary and speaks JSON-RPC 2.0 to it
//! over stdin/stdout. Every such *sidecar* joins a machine-local *bus*; the one
//! that holds the bus lock is the *leader* and alone talks to Telegram.
//!
//! The major components, in the order data flows through them:
//!
//! * [`host`] — NDJSON framing on stdio, the demultiplexer in front of the
//!   jsonrpsee dispatcher, and outbound requests to the host with timeouts.
//!   It knows nothing of Telegram or the bus.
//! * [`session`] — one agent session: its binding, transport and sync facts,
//!   the status line, and the translation of host events into relay actions.
//! * [`commands`] — parsing and handling of `/telegram-*` and `/relay` commands.
//! * [`bus`] — election through a kernel file lock, the wire envelopes on the
//!   local socket, the leader (registry, routing, restart) and the follower
//!   (client, reconnect, reconcile).
//! * [`telegram`] — the Bot API client, the durable poller, the rate-limited
//!   outbox, error classification and Markdown → Telegram HTML rendering.
//! * [`topics`] — slots A–Z, topic names and provisioning decisions.
//! * [`store`] — the leader's SQLite state: epoch, bindings, offset, inbound
//!   journal, cleanup intents.
//! * [`protocol`] — every type that crosses a wire, each with a JSON Schema.
//! * [`framing`] — the one newline-delimited codec used by stdio and the bus.
//! * [`config`], [`paths`], [`redact`], [`logging`] — the edges.
//! * [`fake_bot_api`] — a faithful Bot API simulator for tests, `demo` and
//!   benchmarks; production paths never depend on it.

mod backoff;
pub mod bus;
pub mod commands;
pub mod config;
pub mod demo;
pub mod doctor;
pub mod fake_bot_api;
pub mod framing;
pub mod host;
pub mod host_client;
pub mod ids;
pub mod logging;
pub mod paths;
pub mod protocol;
pub mod redact;
pub mod render;
pub mod schema;
pub mod session;
pub mod store;
pub mod telegram;
pub mod topics;

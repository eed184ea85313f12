//! `agent-relay serve`: sessions the relay starts itself (docs/DESIGN.md,
//! *Launching*). One `serve` per machine joins the bus as its launcher —
//! a member like any sidecar, which may lead — and keeps the agents it
//! starts as its own children, so a leader that changes touches them no
//! more than a keyboard session.
//!
//! * [`serve`] — the launcher's life: the leader's orders (start, end,
//!   models), each agent's end reported, idle agents ended, and the
//!   sessions that were running started again when `serve` comes back.
//! * [`engine`] — the seam every agent host plugs into: what an engine is
//!   given and what it gives back. One file per engine under `engines/`
//!   (`pi.rs`, `claude.rs`, `codex.rs`).
//! * [`place`] — where agents may run: `[launch] roots`, links and owners.
//! * [`env`] — the environment a launched agent gets.
//! * `child` — spawning an agent's process and ending it with its whole
//!   process group; [`watcher`] — what ends those groups when `serve` is
//!   killed (`agent-relay serve-watcher`); `starting` —
//!   an agent from its spawn to its end, the same for every engine (a
//!   failed start-up reported, the controls served); `hosted` — a
//!   relay session in `serve`'s own process for an engine whose agent has
//!   no relay extension of its own (Claude Code), which the engine plays
//!   host to; Codex's engine has the same from `crate::codex`, whose
//!   bridge plays host to it as it does in `agent-relay codex`.
//! * [`service`] — `agent-relay install service`: the systemd user unit,
//!   or the launchd agent on macOS.

mod child;
pub mod engine;
mod engines;

pub use engines::Engine;
pub mod env;
mod hosted;
pub mod place;
pub mod serve;
pub mod service;
mod starting;
pub mod watcher;

pub use child::set_agent_umask;

//! A sidecar's membership of its bot's bus (docs/DESIGN.md, "The bus"):
//! every sidecar of one bot is a [`Member`]; the one holding the kernel
//! lock also runs the [`crate::leader`].
//!
//! * [`handle`] — the [`Member`] handle a session holds: requests to the
//!   leader, deliveries from it, the membership's state.
//! * [`actor`] — the member's loop: lead if the lock is free, connect, check
//!   the peer, register, serve, reconnect. The leader's own session
//!   registers through the socket like every other one, so there is exactly
//!   one registration path and the leader is an ordinary session. The
//!   handle and the actor are one pair: each names the other's types (the
//!   one import circle `tests/tidy.rs` allows).
//! * [`restart`] — `/relay restart` as its caller sees it.
//! * [`status`] — the bus status without joining (`agent-relay status`).

mod actor;
mod handle;
mod restart;
mod status;

pub use handle::{
    JoinRequest, LauncherRequest, Member, MemberError, MemberState, Role, UPLOAD_TIMEOUT,
};
pub use status::{LeaderReport, leader_report, query_status};

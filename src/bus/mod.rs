//! The machine-local bus (docs/DESIGN.md, "The bus"): every sidecar of one
//! bot is a [`Member`]; the one holding the kernel lock also runs the
//! leader.
//!
//! * [`member`] — the [`Member`] handle a session holds: requests to the
//!   leader, deliveries from it, the membership's state.
//! * [`actor`] — the member's loop: lead if the lock is free, connect, check
//!   the peer, register, serve, reconnect. The leader's own session
//!   registers through the socket like every other one, so there is exactly
//!   one registration path and the leader is an ordinary session.
//! * [`restart`] — `/relay restart` as its caller sees it.
//! * [`status`] — the bus status without joining (`agent-relay status`).
//! * [`election`] — the lock, the socket, `leader.json`.
//! * [`wire`] — typed envelopes over the socket.
//! * [`leader`] — the leader itself.

mod actor;
pub mod election;
pub(crate) mod leader;
mod member;
mod restart;
mod status;
pub mod wire;

pub use member::{JoinRequest, Member, MemberError, MemberState, Role, UPLOAD_TIMEOUT};
pub use status::{LeaderReport, leader_report, query_status};

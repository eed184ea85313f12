//! The machine-local bus's socket (docs/DESIGN.md, "The bus"), shared by
//! both of its ends: the [`crate::member`] every sidecar runs and the
//! [`crate::leader`] the lock holder runs.
//!
//! * [`election`] — the kernel lock, the socket, `leader.json`, and the
//!   peer check every connection passes.
//! * [`wire`] — typed envelopes over the socket.

pub mod election;
pub mod wire;

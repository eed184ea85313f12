//! The integration tests, one binary (`Cargo.toml`: `autotests = false`,
//! one `[[test]]`): each `tests/<flow>.rs` is a module of it, run as
//! `cargo test --test suite <flow>::`. One binary instead of one per file
//! links the crate once instead of two dozen times, builds the shared
//! helpers once, and lets the harness run a slow file's tests beside the
//! others' instead of one file after another (docs/decisions/0004-build-profiles.md).
//! `tests/tidy.rs` fails when a `tests/*.rs` file is not listed here, so
//! none is silently left out.

mod common;
#[path = "cluster/nats.rs"]
mod nats;

mod approvals;
mod budget;
mod bus;
mod chaos;
mod claude_code;
mod cluster;
mod cluster_relay;
mod demo_doctor;
mod files;
mod handover;
mod host;
mod install;
mod launch;
mod lifecycle;
mod local_trust;
mod never_down;
mod never_silent;
mod private_chat;
mod proptest_entry;
mod receipts;
mod roles;
mod routing;
mod schema;
mod security;
mod setup;
mod steer;
mod telegram;
mod tidy;

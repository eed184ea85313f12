//! Every type that crosses a wire: the host protocol ([`host`]), the bus
//! ([`bus`]), `serve` and the leader ([`launch`]) and Claude Code's hooks
//! talking to their session ([`claude`]).
//! Each derives `JsonSchema`; `crate::schema` exports them (with the config
//! file's) to `schema/`.

pub mod bus;
pub mod claude;
pub mod host;
pub mod launch;

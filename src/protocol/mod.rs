//! Every type that crosses a wire: the host protocol ([`host`]) and the bus
//! ([`bus`]). Each derives `JsonSchema`; `crate::schema` exports them (with
//! the config file's) to `schema/`.

pub mod bus;
pub mod host;

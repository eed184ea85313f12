//! One file per engine (`super::engine` is the seam): each has
//! `start(Start, &Context) -> Result<Agent, EngineError>`.

pub(super) mod claude;
pub(super) mod pi;

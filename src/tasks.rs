//! Spawning tasks: every future is boxed before tokio sees it.
//!
//! `tokio::spawn` is generic over the future, so each distinct future type
//! gets its own copy of tokio's task machinery (the cell, the harness, the
//! waker vtable, `catch_unwind`): about 2.5k lines of LLVM IR each, for two
//! hundred spawned futures a seventh of the crate. Boxed, the machinery is
//! compiled once per output type; the cost is one more allocation per
//! spawn, beside the one tokio makes for the task itself.

use std::future::Future;
use std::pin::Pin;

use tokio::task::JoinHandle;

/// A future as the runtime sees it once boxed.
pub(crate) type BoxedTask<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// `tokio::spawn`, with the future boxed first (see the module's comment).
pub(crate) fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(boxed(future))
}

/// A future boxed as [`spawn`] boxes it, for a `JoinSet` to spawn.
pub(crate) fn boxed<F>(future: F) -> BoxedTask<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    Box::pin(future)
}

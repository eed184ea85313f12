//! The way out to the host: the line queue feeding the writer loop, and the
//! table of our own requests still waiting for the host's answer.
//!
//! Both live behind one [`Outbox`] shared by the transport and every
//! [`HostLink`](super::HostLink) clone. The locks are std mutexes held only
//! for a map operation, never across an await.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

/// What the host answered: the `result`, or the raw `error` object.
pub(crate) type Answer = Result<Value, Value>;

#[derive(Debug)]
pub(crate) struct Outbox {
    /// `None` once the transport is closing: later lines are dropped.
    lines: Mutex<Option<mpsc::UnboundedSender<String>>>,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
}

#[derive(Debug, Default)]
struct Pending {
    /// Set when the host is gone; no new request may wait after that.
    closed: bool,
    waiters: HashMap<u64, oneshot::Sender<Answer>>,
}

/// Why a request could not be registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Closed;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is a single map or Option operation, so a
    // poisoned lock still guards consistent data.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Outbox {
    pub fn new(lines: mpsc::UnboundedSender<String>) -> Self {
        Self {
            lines: Mutex::new(Some(lines)),
            pending: Mutex::new(Pending::default()),
            // Ids start at 1 so that a host echoing `0` for "unknown" can
            // never complete a real request.
            next_id: AtomicU64::new(1),
        }
    }

    /// Queues one line for the writer. Returns false once the transport is
    /// closing or the writer is gone; the line is then dropped.
    pub fn send(&self, line: String) -> bool {
        match lock(&self.lines).as_ref() {
            Some(lines) => lines.send(line).is_ok(),
            None => false,
        }
    }

    /// Stops accepting lines; the writer ends once it has written what was
    /// already queued.
    pub fn close_lines(&self) {
        lock(&self.lines).take();
    }

    /// Registers a new outbound request and returns its id and the receiver
    /// of the answer. The caller must hold a [`PendingEntry`] for the id so
    /// the entry is removed however the wait ends.
    pub fn register(&self) -> Result<(u64, oneshot::Receiver<Answer>), Closed> {
        let mut pending = lock(&self.pending);
        if pending.closed {
            return Err(Closed);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        pending.waiters.insert(id, tx);
        Ok((id, rx))
    }

    /// Hands the host's answer to whoever waits for request `id`. Returns
    /// false when nobody does (unknown id, timed out, or cancelled).
    pub fn complete(&self, id: &Value, answer: Answer) -> bool {
        let Some(id) = id.as_u64() else {
            return false;
        };
        let waiter = lock(&self.pending).waiters.remove(&id);
        // The waiter may have given up between the lookup and now; that is
        // the same as arriving late.
        waiter.is_some_and(|waiter| waiter.send(answer).is_ok())
    }

    fn forget(&self, id: u64) {
        lock(&self.pending).waiters.remove(&id);
    }

    /// Fails every waiting request with `Closed` (their senders are dropped)
    /// and refuses new ones.
    pub fn close_pending(&self) {
        let waiters = {
            let mut pending = lock(&self.pending);
            pending.closed = true;
            std::mem::take(&mut pending.waiters)
        };
        drop(waiters);
    }

    #[cfg(test)]
    pub fn pending_len(&self) -> usize {
        lock(&self.pending).waiters.len()
    }
}

/// Removes a pending entry when dropped, so a timed-out or cancelled request
/// leaves nothing behind in the table.
pub(crate) struct PendingEntry<'a> {
    pub outbox: &'a Outbox,
    pub id: u64,
}

impl Drop for PendingEntry<'_> {
    fn drop(&mut self) {
        self.outbox.forget(self.id);
    }
}

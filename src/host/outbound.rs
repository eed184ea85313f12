//! The way out to the host: the line queue feeding the writer loop, and the
//! table of our own requests still waiting for the host's answer.
//!
//! Both live behind one [`ToHost`] shared by the transport and every
//! [`HostLink`](super::HostLink) clone. The locks are std mutexes held only
//! for a queue or map operation, never across an await.
//!
//! The line queue is bounded: at most [`QUEUE_BYTES`] wait for a host that
//! does not read (one line of any size always fits an empty queue). When it
//! is full, answers and our own requests wait for room — nothing the
//! protocol promises is dropped — and the reader stops taking new lines from
//! the host until there is room again: backpressure, so a host that never
//! reads stalls its own sidecar instead of growing it. Notifications cannot
//! wait (they are sent from synchronous code): a status update replaces the
//! one of the same key still queued (only the latest status matters) and is
//! always taken, at most one per key; any other notification finding the
//! queue full is dropped and counted.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde_json::Value;
use tokio::sync::{Notify, oneshot};

/// How many bytes of lines may wait for a host that does not read, counting
/// those the writer has taken but not yet written. As large as the longest
/// line the host may send us.
pub(crate) const QUEUE_BYTES: usize = crate::framing::MAX_FRAME_BYTES;

/// What the host answered: the `result`, or the raw `error` object.
pub(crate) type Answer = Result<Value, Value>;

#[derive(Debug)]
pub(crate) struct ToHost {
    lines: Mutex<LineQueue>,
    /// Wakes the writer: a line was queued or the queue closed.
    queued: Notify,
    /// Wakes those waiting for room: lines were written or the queue closed.
    room: Notify,
    pending: Mutex<Pending>,
    next_id: AtomicU64,
}

#[derive(Debug, Default)]
struct LineQueue {
    lines: VecDeque<Queued>,
    /// Bytes of the queued lines plus those the writer is writing.
    bytes: usize,
    /// Set once the transport is closing or the host's output broke: no line
    /// is taken after that (queued ones are still written, unless broken).
    closed: bool,
    /// Notifications dropped because the queue was full.
    dropped: u64,
}

#[derive(Debug)]
struct Queued {
    line: String,
    /// A notification that a later one with the same key replaces.
    key: Option<String>,
}

impl LineQueue {
    fn has_room(&self, len: usize) -> bool {
        self.bytes == 0 || self.bytes + len <= QUEUE_BYTES
    }

    fn push(&mut self, line: String, key: Option<String>) {
        self.bytes += line.len();
        self.lines.push_back(Queued { line, key });
    }
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

impl ToHost {
    pub fn new() -> Self {
        Self {
            lines: Mutex::new(LineQueue::default()),
            queued: Notify::new(),
            room: Notify::new(),
            pending: Mutex::new(Pending::default()),
            // Ids start at 1 so that a host echoing `0` for "unknown" can
            // never complete a real request.
            next_id: AtomicU64::new(1),
        }
    }

    /// Queues one line for the writer, waiting for room. Returns false once
    /// the transport is closing or the host's output is broken; the line is
    /// then dropped.
    pub async fn send(&self, line: String) -> bool {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut queue = lock(&self.lines);
                if queue.closed {
                    return false;
                }
                if queue.has_room(line.len()) {
                    queue.push(line, None);
                    drop(queue);
                    self.queued.notify_one();
                    return true;
                }
            }
            room.await;
        }
    }

    /// Queues a notification without waiting (see the module doc): one with
    /// a `key` replaces a queued one of the same key, or is added whatever
    /// the room; one without is dropped if the queue is full. Returns false
    /// when the line was dropped.
    pub fn notify(&self, line: String, key: Option<String>) -> bool {
        let mut queue = lock(&self.lines);
        if queue.closed {
            return false;
        }
        if let Some(key) = &key
            && let Some(queued) = queue
                .lines
                .iter_mut()
                .find(|queued| queued.key.as_ref() == Some(key))
        {
            let (added, removed) = (line.len(), queued.line.len());
            queued.line = line;
            queue.bytes = queue.bytes + added - removed;
            return true;
        }
        if key.is_none() && !queue.has_room(line.len()) {
            queue.dropped += 1;
            return false;
        }
        queue.push(line, key);
        drop(queue);
        self.queued.notify_one();
        true
    }

    /// Waits until the queue has room for another line (or is closed): the
    /// reader calls this before it takes the next line from the host.
    pub async fn wait_for_room(&self) {
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let queue = lock(&self.lines);
                if queue.closed || queue.bytes < QUEUE_BYTES {
                    return;
                }
            }
            room.await;
        }
    }

    /// For the writer: every queued line and their size, once there is one;
    /// `None` when the queue is closed and empty. The size stays counted
    /// until [`ToHost::written`].
    pub async fn next_batch(&self) -> Option<(Vec<String>, usize)> {
        loop {
            let queued = self.queued.notified();
            tokio::pin!(queued);
            queued.as_mut().enable();
            {
                let mut queue = lock(&self.lines);
                if !queue.lines.is_empty() {
                    let batch: Vec<String> = queue.lines.drain(..).map(|q| q.line).collect();
                    let bytes = batch.iter().map(String::len).sum();
                    return Some((batch, bytes));
                }
                if queue.closed {
                    return None;
                }
            }
            queued.await;
        }
    }

    /// For the writer: a batch of `bytes` is out; its room is free again.
    pub fn written(&self, bytes: usize) {
        let mut queue = lock(&self.lines);
        queue.bytes = queue.bytes.saturating_sub(bytes);
        drop(queue);
        self.room.notify_waiters();
    }

    /// Stops accepting lines; the writer ends once it has written what was
    /// already queued.
    pub fn close_lines(&self) {
        lock(&self.lines).closed = true;
        self.queued.notify_one();
        self.room.notify_waiters();
    }

    /// The host's output is broken: drop what is queued, take nothing more,
    /// and release everyone waiting for room.
    pub fn abandon(&self) {
        {
            let mut queue = lock(&self.lines);
            queue.closed = true;
            queue.lines.clear();
            queue.bytes = 0;
        }
        self.room.notify_waiters();
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

    /// Bytes waiting for the host, and how many lines carry `needle`.
    #[cfg(test)]
    pub fn queued(&self, needle: &str) -> (usize, usize) {
        let queue = lock(&self.lines);
        let matching = queue
            .lines
            .iter()
            .filter(|q| q.line.contains(needle))
            .count();
        (queue.bytes, matching)
    }

    #[cfg(test)]
    pub fn dropped(&self) -> u64 {
        lock(&self.lines).dropped
    }
}

/// Removes a pending entry when dropped, so a timed-out or cancelled request
/// leaves nothing behind in the table.
pub(crate) struct PendingEntry {
    pub outbox: std::sync::Arc<ToHost>,
    pub id: u64,
}

impl Drop for PendingEntry {
    fn drop(&mut self) {
        self.outbox.forget(self.id);
    }
}

//! Telegram's message budget is the bot's, not a process's: a leader that
//! takes over (a `/relay restart`, a failover, a drain) goes on from what
//! the last one spent instead of drawing 429s at the edge of a window it
//! forgot (docs/DESIGN.md, *Telegram*, pacing). The limiter's spending is
//! kept in a small file next to the store, written by the lock holder only:
//! every [`KEEP_EVERY`] while it changes, and when the leader stops.

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use super::outbox::Outbox;
use crate::telegram::Spent;

/// How often a changed budget is written: a leader killed outright loses
/// at most this much of its spending.
pub(super) const KEEP_EVERY: Duration = Duration::from_secs(10);

/// The budget file and what was last written to it.
pub(super) struct Kept {
    path: PathBuf,
    written: Mutex<Spent>,
}

impl Kept {
    /// Reads what the last leader spent; a missing file is nothing spent,
    /// a broken one is said and ignored (it only paces, it holds no data).
    pub fn read(path: PathBuf) -> (Self, Spent) {
        let spent = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(path = %path.display(), "the last leader's message budget is unreadable ({e}); starting afresh");
                Spent::default()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Spent::default(),
            Err(e) => {
                tracing::warn!(path = %path.display(), "cannot read the last leader's message budget: {e}");
                Spent::default()
            }
        };
        let kept = Self {
            path,
            written: Mutex::new(spent.clone()),
        };
        (kept, spent)
    }

    /// Writes the limiter's spending when it changed since the last write.
    pub fn keep(&self, outbox: &Outbox) {
        let spent = outbox.spent();
        let mut written = self.written.lock().unwrap_or_else(PoisonError::into_inner);
        if *written == spent {
            return;
        }
        let bytes = match serde_json::to_vec(&spent) {
            Ok(bytes) => bytes,
            Err(e) => {
                tracing::warn!("cannot encode the message budget: {e}");
                return;
            }
        };
        match crate::paths::replace_file(&self.path, &bytes, 0o600) {
            Ok(()) => *written = spent,
            Err(e) => tracing::warn!(
                path = %self.path.display(),
                "cannot keep the message budget for the next leader: {e}"
            ),
        }
    }
}

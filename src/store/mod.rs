//! The leader's durable state (docs/DESIGN.md, "State"): one SQLite file per
//! bot holding the epoch, topic bindings, the `getUpdates` offset, the
//! inbound journal, the outbox of record (`outbox.rs`), unfinished topic
//! cleanups, the paired users and which session posted which message.
//!
//! Every table is bounded ([`Store::prune`] runs on a timer in the leader):
//! settled journal entries beyond the newest [`KEEP_SETTLED`] go, pending
//! ones never; `sent` keeps [`KEEP_SENT_DAYS`] days; bindings are one per
//! slot (26 at most); a cleanup intent is one per topic and is given up
//! after [`MAX_CLEANUP_ATTEMPTS`] leaders failed it; the outbox keeps the
//! newest [`KEEP_SENT_POSTS`] sent entries and the ones that did not arrive
//! for [`KEEP_KEPT_DAYS`] days, those still to go always.
//!
//! Only the leader writes; followers may open the file read-only for
//! diagnostics. The API is synchronous and every call is one short
//! transaction, so the leader can call it from async code while holding a
//! mutex for microseconds rather than handing work to a blocking pool.
//!
//! The file fails closed: a damaged file, a file that is not ours, or a schema
//! newer than this binary is an error that names the file, and the file is
//! never rewritten, renamed or reset. Losing the bindings would orphan every
//! topic and losing the journal would drop messages, so a person has to look.

mod launches;
mod outbox;
mod schema;
#[cfg(test)]
mod tests;

pub use launches::{Launch, LaunchState, MAX_SCHEDULES, NewSchedule, Schedule};

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, Type, ValueRef};
use rusqlite::{
    Connection, ErrorCode, OpenFlags, OptionalExtension, Row, Transaction, TransactionBehavior,
    params,
};

use crate::ids::{Epoch, Slot, Target};
pub use outbox::{EntryKind, EntryState, Lane, NewOutboxEntry, OutboxEntry};
use schema::{APPLICATION_ID, CURRENT_VERSION, MIGRATIONS};

pub type Result<T> = std::result::Result<T, StoreError>;

/// How long a call waits for another connection's lock (a diagnostic reader,
/// or a previous leader still closing) before giving up.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the store refused or failed. Callers branch on [`StoreError::Corrupt`],
/// [`StoreError::TooNew`] and [`StoreError::Foreign`] (fail closed and tell the
/// user) and on the two `*Taken` conflicts (pick another slot or topic).
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "state database {} is damaged ({message}); it was left untouched for inspection: \
         move it aside to start with empty state",
        path.display()
    )]
    Corrupt { path: PathBuf, message: String },

    #[error(
        "state database {} has schema version {found}, newer than the version {supported} \
         this agent-relay understands; upgrade agent-relay",
        path.display()
    )]
    TooNew {
        path: PathBuf,
        found: i64,
        supported: i64,
    },

    #[error(
        "state database {} has schema version {found} and a read-only handle cannot migrate \
         it to {current}; it is migrated when a leader opens it",
        path.display()
    )]
    Outdated {
        path: PathBuf,
        found: i64,
        current: i64,
    },

    #[error(
        "{} is an SQLite file but not an agent-relay state database ({message}); \
         it was left untouched",
        path.display()
    )]
    Foreign { path: PathBuf, message: String },

    #[error("slot {slot} is already bound to session {holder:?}")]
    SlotTaken { slot: Slot, holder: String },

    #[error("topic {thread_id} in chat {chat_id} is already bound to session {holder:?}")]
    ThreadTaken {
        chat_id: i64,
        thread_id: i64,
        holder: String,
    },

    #[error("cannot create state database {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("state database {}: {source}", path.display())]
    Sqlite {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
}

/// Where a topic binding stands. Stored as the kebab-case text of each name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BindingStatus {
    /// The topic exists and its session is live on the bus.
    Active,
    /// Telegram said the topic is gone; provision a new one on next need.
    Stale,
    /// The session left the bus; the topic stays as a restart hint.
    Offline,
    /// The topic must be probed before a new process may reuse it.
    ProbeRequired,
    /// `createForumTopic` failed ambiguously: a topic may exist that we do
    /// not know the id of, so it is not blindly created again.
    CreateUnknown,
}

impl BindingStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Stale => "stale",
            Self::Offline => "offline",
            Self::ProbeRequired => "probe-required",
            Self::CreateUnknown => "create-unknown",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "active" => Self::Active,
            "stale" => Self::Stale,
            "offline" => Self::Offline,
            "probe-required" => Self::ProbeRequired,
            "create-unknown" => Self::CreateUnknown,
            _ => return None,
        })
    }
}

impl std::fmt::Display for BindingStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A session's topic, remembered across leader changes and process restarts.
///
/// Slots are unique among all stored bindings, offline ones included: an
/// offline session's topic keeps its letter in its name, and a second topic
/// showing the same letter would confuse the person reading them. The leader
/// reclaims a slot by removing the offline binding that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    pub profile_key: String,
    pub instance_id: String,
    pub session_name: String,
    pub cwd: String,
    pub chat_id: Option<i64>,
    /// Set once the topic is known; `chat_id` is then set too.
    pub thread_id: Option<i64>,
    pub slot: Slot,
    pub topic_name: String,
    pub status: BindingStatus,
    /// The "connected" notice was already posted in the topic.
    pub announced: bool,
    /// The relay closed the topic: its host switched to another session.
    /// It is reopened when this session comes back.
    pub closed: bool,
    /// Stamped by the store on first insert; ignored on upsert.
    pub created_ms: u64,
    /// Stamped by the store on every write; ignored on upsert.
    pub updated_ms: u64,
}

impl Binding {
    /// The topic, once both its chat and thread are known.
    pub fn target(&self) -> Option<Target> {
        Some(Target {
            chat_id: self.chat_id?,
            thread_id: self.thread_id?,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JournalState {
    /// Not yet handed to its session.
    Pending,
    Delivered,
    /// Will never be delivered (the reason is kept with the entry).
    Dropped,
}

impl JournalState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Dropped => "dropped",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "pending" => Self::Pending,
            "delivered" => Self::Delivered,
            "dropped" => Self::Dropped,
            _ => return None,
        })
    }
}

/// An inbound update as journaled by the poller, with its bookkeeping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JournalEntry {
    pub update: NewUpdate,
    pub state: JournalState,
    pub attempts: u32,
    /// Why it was dropped; `None` unless `state` is `Dropped`.
    pub drop_reason: Option<String>,
    pub received_ms: u64,
}

/// What the poller journals for one routable update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewUpdate {
    pub update_id: i64,
    /// The profile key of the session it is for, if any.
    pub owner: Option<String>,
    pub chat_id: i64,
    pub thread_id: Option<i64>,
    pub user_id: i64,
    pub message_id: i64,
    pub text: String,
    /// What only the leader interprets (JSON), e.g. the message it replies to.
    pub detail: Option<String>,
}

/// Settled journal entries kept for diagnostics; older ones are pruned.
pub const KEEP_SETTLED: usize = 1_000;
/// How long the store remembers who posted a message (for edits).
pub const KEEP_SENT_DAYS: u64 = 14;
/// Leaders that may fail a topic deletion before the intent is given up.
pub const MAX_CLEANUP_ATTEMPTS: u32 = 20;

/// The write-ahead log is truncated to this many bytes after a checkpoint.
const WAL_LIMIT: i64 = 1024 * 1024;

/// What one [`Store::prune`] removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub journal: usize,
    pub sent: usize,
    pub cleanups: usize,
    pub posts: usize,
}

/// A journal commit that may not be on disk yet. Nothing may tell Telegram
/// the batch arrived (the next `getUpdates`) before [`Unflushed::flush`].
#[must_use = "a journal batch must be flushed before it is confirmed to Telegram"]
#[derive(Debug)]
pub struct Unflushed {
    path: PathBuf,
}

impl Unflushed {
    /// Waits until the commit is on disk: an fsync of the write-ahead log,
    /// which holds every commit not yet checkpointed (a checkpoint syncs
    /// the log before it copies it, so nothing is lost in between). Blocking.
    pub fn flush(self) -> Result<()> {
        let mut wal = self.path.clone().into_os_string();
        wal.push("-wal");
        let target = match std::fs::File::open(&wal) {
            Ok(file) => file,
            // Not in WAL mode: the commit went to the database file itself.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::File::open(&self.path).map_err(|source| StoreError::Io {
                    path: self.path.clone(),
                    source,
                })?
            }
            Err(source) => {
                return Err(StoreError::Io {
                    path: PathBuf::from(wal),
                    source,
                });
            }
        };
        target.sync_data().map_err(|source| StoreError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

/// A topic deletion that was promised but not confirmed by Telegram; a
/// successor leader finishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CleanupIntent {
    pub id: i64,
    pub chat_id: i64,
    pub thread_id: i64,
    pub profile_key: String,
    pub reason: String,
    pub created_ms: u64,
    pub attempts: u32,
}

/// A [`CleanupIntent`] before the store has given it an id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCleanup {
    pub chat_id: i64,
    pub thread_id: i64,
    pub profile_key: String,
    pub reason: String,
}

/// The leader's state database. `Send`, not `Sync`: the leader keeps it
/// behind a mutex.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

impl Store {
    /// Opens the state database read-write, creating it (mode 0600) when
    /// missing, and migrates it to the current schema. The parent directory
    /// must exist.
    pub fn open(path: &Path) -> Result<Store> {
        create_private_file(path)?;
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut store = Self::connect(path, flags)?;
        let found = store.verify()?;
        store.enable_wal()?;
        store.migrate(found)?;
        Ok(store)
    }

    /// Opens an existing, already migrated state database for reading only.
    /// Every write through the returned store fails.
    pub fn open_read_only(path: &Path) -> Result<Store> {
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let store = Self::connect(path, flags)?;
        let found = store.verify()?;
        if found < CURRENT_VERSION {
            return Err(StoreError::Outdated {
                path: store.path,
                found,
                current: CURRENT_VERSION,
            });
        }
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The current leader term; 0 when no sidecar has ever led.
    pub fn epoch(&self) -> Result<Epoch> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached("SELECT epoch FROM meta WHERE id = 1")?;
            Ok(stmt.query_row([], |row| get_u64(row, 0))?)
        })
    }

    /// Starts a new leader term and returns it. Committed before returning.
    pub fn bump_epoch(&mut self) -> Result<Epoch> {
        self.write(|tx| {
            let mut stmt = tx
                .prepare_cached("UPDATE meta SET epoch = epoch + 1 WHERE id = 1 RETURNING epoch")?;
            Ok(stmt.query_row([], |row| get_u64(row, 0))?)
        })
    }

    pub fn binding(&self, profile_key: &str) -> Result<Option<Binding>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {BINDING_COLUMNS} FROM bindings WHERE profile_key = ?1"
            ))?;
            Ok(stmt.query_row([profile_key], binding_from_row).optional()?)
        })
    }

    /// Every binding, ordered by slot.
    pub fn bindings(&self) -> Result<Vec<Binding>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {BINDING_COLUMNS} FROM bindings ORDER BY slot"
            ))?;
            let rows = stmt.query_map([], binding_from_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// The binding of a topic, for routing an inbound message.
    pub fn binding_by_thread(&self, chat_id: i64, thread_id: i64) -> Result<Option<Binding>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {BINDING_COLUMNS} FROM bindings WHERE chat_id = ?1 AND thread_id = ?2"
            ))?;
            Ok(stmt
                .query_row(params![chat_id, thread_id], binding_from_row)
                .optional()?)
        })
    }

    /// Inserts or replaces the binding of `b.profile_key`. Fails with
    /// [`StoreError::SlotTaken`] or [`StoreError::ThreadTaken`] when another
    /// session's binding holds the slot or the topic; nothing is written then.
    pub fn upsert_binding(&mut self, b: &Binding) -> Result<()> {
        let slot = b.slot.to_string();
        self.write(|tx| {
            let holder: Option<String> = tx
                .prepare_cached(
                    "SELECT profile_key FROM bindings WHERE slot = ?1 AND profile_key <> ?2",
                )?
                .query_row(params![slot, b.profile_key], |row| row.get(0))
                .optional()?;
            if let Some(holder) = holder {
                return Err(Fault::SlotTaken {
                    slot: b.slot,
                    holder,
                });
            }
            if let (Some(chat_id), Some(thread_id)) = (b.chat_id, b.thread_id) {
                let holder: Option<String> = tx
                    .prepare_cached(
                        "SELECT profile_key FROM bindings \
                         WHERE chat_id = ?1 AND thread_id = ?2 AND profile_key <> ?3",
                    )?
                    .query_row(params![chat_id, thread_id, b.profile_key], |row| row.get(0))
                    .optional()?;
                if let Some(holder) = holder {
                    return Err(Fault::ThreadTaken {
                        chat_id,
                        thread_id,
                        holder,
                    });
                }
            }
            let now = now_ms();
            tx.prepare_cached(
                "INSERT INTO bindings (profile_key, instance_id, session_name, cwd, chat_id, \
                     thread_id, slot, topic_name, status, announced, closed, created_ms, \
                     updated_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?12, ?11, ?11) \
                 ON CONFLICT (profile_key) DO UPDATE SET \
                     instance_id = excluded.instance_id, \
                     session_name = excluded.session_name, \
                     cwd = excluded.cwd, \
                     chat_id = excluded.chat_id, \
                     thread_id = excluded.thread_id, \
                     slot = excluded.slot, \
                     topic_name = excluded.topic_name, \
                     status = excluded.status, \
                     announced = excluded.announced, \
                     closed = excluded.closed, \
                     updated_ms = excluded.updated_ms",
            )?
            .execute(params![
                b.profile_key,
                b.instance_id,
                b.session_name,
                b.cwd,
                b.chat_id,
                b.thread_id,
                slot,
                b.topic_name,
                b.status,
                b.announced,
                now,
                b.closed,
            ])?;
            Ok(())
        })
    }

    /// Stamps a binding that is written again unchanged (its session
    /// registered again, as after every failover) with the time, without
    /// flushing it to disk: on power loss only this time goes back to the
    /// binding's last change. Returns whether the binding exists.
    pub fn touch_binding(&mut self, profile_key: &str) -> Result<bool> {
        self.write_unflushed(|tx| {
            let touched = tx
                .prepare_cached("UPDATE bindings SET updated_ms = ?2 WHERE profile_key = ?1")?
                .execute(params![profile_key, now_ms()])?;
            Ok(touched > 0)
        })
    }

    /// Sets a binding's status. Returns whether the stored status changed
    /// (false when the binding is missing or already had that status).
    pub fn set_binding_status(&mut self, profile_key: &str, status: BindingStatus) -> Result<bool> {
        self.write(|tx| {
            let changed = tx
                .prepare_cached(
                    "UPDATE bindings SET status = ?2, updated_ms = ?3 \
                     WHERE profile_key = ?1 AND status <> ?2",
                )?
                .execute(params![profile_key, status, now_ms()])?;
            Ok(changed > 0)
        })
    }

    /// Marks a binding's topic closed (or open again). Returns whether it
    /// changed.
    pub fn set_topic_closed(&mut self, profile_key: &str, closed: bool) -> Result<bool> {
        self.write(|tx| {
            let changed = tx
                .prepare_cached(
                    "UPDATE bindings SET closed = ?2, updated_ms = ?3 \
                     WHERE profile_key = ?1 AND closed <> ?2",
                )?
                .execute(params![profile_key, closed, now_ms()])?;
            Ok(changed > 0)
        })
    }

    /// Forgets a binding. Returns whether there was one.
    pub fn remove_binding(&mut self, profile_key: &str) -> Result<bool> {
        self.write(|tx| {
            let removed = tx
                .prepare_cached("DELETE FROM bindings WHERE profile_key = ?1")?
                .execute([profile_key])?;
            Ok(removed > 0)
        })
    }

    /// The offset for the next `getUpdates`; `None` before the first batch.
    pub fn offset(&self) -> Result<Option<i64>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached("SELECT next_offset FROM meta WHERE id = 1")?;
            Ok(stmt.query_row([], |row| row.get(0))?)
        })
    }

    /// Journals one `getUpdates` batch and advances the offset, in one
    /// transaction (docs/DESIGN.md, "Inbound"): either both are durable or
    /// neither is, so a crash can only make Telegram send the batch again,
    /// never lose it.
    ///
    /// An update whose `update_id` is already journaled is skipped, not an
    /// error. The offset becomes `max(current, next_offset)`. Returns the
    /// update ids that were newly journaled, in the order given. Call it with
    /// no updates to advance the offset past a batch with nothing routable.
    pub fn journal_batch(&mut self, updates: &[NewUpdate], next_offset: i64) -> Result<Vec<i64>> {
        let (inserted, unflushed) = self.journal_batch_unflushed(updates, next_offset)?;
        unflushed.flush()?;
        Ok(inserted)
    }

    /// [`Store::journal_batch`] without waiting for the disk: the commit is
    /// atomic and visible at once, and [`Unflushed::flush`] makes it durable.
    /// The poller routes the batch meanwhile and flushes before its next
    /// `getUpdates`, which is what confirms the batch to Telegram.
    pub fn journal_batch_unflushed<'a>(
        &mut self,
        updates: impl IntoIterator<Item = &'a NewUpdate>,
        next_offset: i64,
    ) -> Result<(Vec<i64>, Unflushed)> {
        self.journal_unflushed(updates, Some(next_offset))
    }

    /// Journals updates another machine polled (docs/CLUSTER.md,
    /// *Inbound*): like [`Store::journal_batch_unflushed`], but the offset
    /// is the cluster's, so the local one stays as it is.
    pub fn journal_received_unflushed<'a>(
        &mut self,
        updates: impl IntoIterator<Item = &'a NewUpdate>,
    ) -> Result<(Vec<i64>, Unflushed)> {
        self.journal_unflushed(updates, None)
    }

    fn journal_unflushed<'a>(
        &mut self,
        updates: impl IntoIterator<Item = &'a NewUpdate>,
        next_offset: Option<i64>,
    ) -> Result<(Vec<i64>, Unflushed)> {
        let inserted = self.write_unflushed(|tx| {
            let now = now_ms();
            let mut insert = tx.prepare_cached(
                "INSERT INTO journal (update_id, owner, chat_id, thread_id, user_id, \
                     message_id, text, received_ms, detail) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) \
                 ON CONFLICT (update_id) DO NOTHING",
            )?;
            let mut inserted = Vec::new();
            for u in updates {
                let changed = insert.execute(params![
                    u.update_id,
                    u.owner,
                    u.chat_id,
                    u.thread_id,
                    u.user_id,
                    u.message_id,
                    u.text,
                    now,
                    u.detail,
                ])?;
                if changed > 0 {
                    inserted.push(u.update_id);
                }
            }
            if let Some(next_offset) = next_offset {
                tx.prepare_cached(
                    "UPDATE meta SET next_offset = max(coalesce(next_offset, ?1), ?1) WHERE id = 1",
                )?
                .execute([next_offset])?;
            }
            Ok(inserted)
        })?;
        Ok((
            inserted,
            Unflushed {
                path: self.path.clone(),
            },
        ))
    }

    /// The undelivered messages of one session, oldest first.
    pub fn pending_for(&self, owner: &str) -> Result<Vec<JournalEntry>> {
        self.journal_query(
            &format!(
                "SELECT {JOURNAL_COLUMNS} FROM journal \
                 WHERE owner = ?1 AND state = 'pending' ORDER BY update_id"
            ),
            &[&owner],
        )
    }

    /// The undelivered messages that no session owns, oldest first.
    pub fn pending_unowned(&self) -> Result<Vec<JournalEntry>> {
        self.journal_query(
            &format!(
                "SELECT {JOURNAL_COLUMNS} FROM journal \
                 WHERE owner IS NULL AND state = 'pending' ORDER BY update_id"
            ),
            &[],
        )
    }

    pub fn journal_entry(&self, update_id: i64) -> Result<Option<JournalEntry>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {JOURNAL_COLUMNS} FROM journal WHERE update_id = ?1"
            ))?;
            Ok(stmt.query_row([update_id], journal_from_row).optional()?)
        })
    }

    /// Counts one more delivery attempt for each pending entry of `ids`, in
    /// one transaction (a routed batch is counted at once).
    pub fn record_attempts(&mut self, ids: &[i64]) -> Result<()> {
        if ids.is_empty() {
            return Ok(());
        }
        self.write_unflushed(|tx| {
            let mut stmt = tx.prepare_cached(
                "UPDATE journal SET attempts = attempts + 1 \
                 WHERE update_id = ?1 AND state = 'pending'",
            )?;
            for id in ids {
                stmt.execute([id])?;
            }
            Ok(())
        })
    }

    /// Pending → delivered for each `(owner, update_id)`, in one transaction;
    /// an entry only settles for the session that owns it. Returns how many
    /// changed: a repeated acknowledgement, an unknown id, a dropped entry or
    /// another owner's entry changes nothing.
    pub fn mark_delivered(&mut self, acks: &[(String, i64)]) -> Result<usize> {
        if acks.is_empty() {
            return Ok(0);
        }
        self.write_unflushed(|tx| {
            let mut stmt = tx.prepare_cached(
                "UPDATE journal SET state = 'delivered' \
                 WHERE update_id = ?1 AND owner = ?2 AND state = 'pending'",
            )?;
            let mut changed = 0;
            for (owner, id) in acks {
                changed += stmt.execute(rusqlite::params![id, owner])?;
            }
            Ok(changed)
        })
    }

    /// Pending → dropped, keeping `reason`. Returns whether it changed.
    pub fn mark_dropped(&mut self, update_id: i64, reason: &str) -> Result<bool> {
        self.write(|tx| {
            let changed = tx
                .prepare_cached(
                    "UPDATE journal SET state = 'dropped', drop_reason = ?2 \
                     WHERE update_id = ?1 AND state = 'pending'",
                )?
                .execute(params![update_id, reason])?;
            Ok(changed > 0)
        })
    }

    /// Hands every pending entry of `from_owner` to `to_owner` (a session
    /// that got a binding of its own). Returns how many moved.
    pub fn reassign_pending(&mut self, from_owner: &str, to_owner: &str) -> Result<usize> {
        self.write(|tx| {
            Ok(tx
                .prepare_cached(
                    "UPDATE journal SET owner = ?2 WHERE owner = ?1 AND state = 'pending'",
                )?
                .execute([from_owner, to_owner])?)
        })
    }

    /// Keeps every table bounded (see the module docs); returns what went.
    /// Pending journal entries are never pruned.
    ///
    /// Pruned entries cannot come back as duplicates: each was journaled in
    /// the transaction that moved the offset past it, and Telegram never
    /// resends an update below a confirmed offset.
    pub fn prune(&mut self) -> Result<Pruned> {
        self.prune_with(KEEP_SETTLED, now_ms())
    }

    fn prune_with(&mut self, keep_settled: usize, now: i64) -> Result<Pruned> {
        let keep = i64::try_from(keep_settled).unwrap_or(i64::MAX);
        let sent_before =
            now.saturating_sub(i64::try_from(KEEP_SENT_DAYS * 86_400_000).unwrap_or(0));
        self.write_unflushed(|tx| {
            let journal = tx
                .prepare_cached(
                    "DELETE FROM journal WHERE state <> 'pending' AND update_id < coalesce( \
                     (SELECT update_id FROM journal WHERE state <> 'pending' \
                      ORDER BY update_id DESC LIMIT 1 OFFSET ?1 - 1), -1)",
                )?
                .execute([keep])?;
            let sent = tx
                .prepare_cached("DELETE FROM sent WHERE sent_ms < ?1")?
                .execute([sent_before])?;
            let cleanups = tx
                .prepare_cached("DELETE FROM cleanups WHERE attempts >= ?1")?
                .execute([MAX_CLEANUP_ATTEMPTS])?;
            let posts = Store::prune_posts(tx, now)?;
            Ok(Pruned {
                journal,
                sent,
                cleanups,
                posts,
            })
        })
    }

    /// Remembers that `profile_key`'s session posted `message_id` in
    /// `chat_id`, asking the question `ask_token` if it asks one.
    pub fn record_sent(
        &mut self,
        chat_id: i64,
        message_id: i64,
        profile_key: &str,
        ask_token: Option<&str>,
    ) -> Result<()> {
        self.write_unflushed(|tx| {
            tx.prepare_cached(
                "INSERT INTO sent (chat_id, message_id, profile_key, sent_ms, ask_token) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (chat_id, message_id) DO UPDATE SET \
                 profile_key = excluded.profile_key, sent_ms = excluded.sent_ms, \
                 ask_token = excluded.ask_token",
            )?
            .execute(params![
                chat_id,
                message_id,
                profile_key,
                now_ms(),
                ask_token
            ])?;
            Ok(())
        })
    }

    /// The message that asks the question `ask_token`, and whose it is.
    pub fn asked(&self, ask_token: &str) -> Result<Option<(i64, i64, String)>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT chat_id, message_id, profile_key FROM sent WHERE ask_token = ?1",
            )?;
            Ok(stmt
                .query_row([ask_token], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
                })
                .optional()?)
        })
    }

    /// The session a message of `chat_id` belongs to: the one that posted
    /// it, or the one its journal entry was for.
    pub fn message_owner(&self, chat_id: i64, message_id: i64) -> Result<Option<String>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT profile_key FROM sent WHERE chat_id = ?1 AND message_id = ?2 \
                 UNION ALL \
                 SELECT owner FROM journal WHERE chat_id = ?1 AND message_id = ?2 \
                     AND owner IS NOT NULL \
                 LIMIT 1",
            )?;
            Ok(stmt
                .query_row(params![chat_id, message_id], |row| row.get(0))
                .optional()?)
        })
    }

    /// Records that a topic must be deleted and returns the intent's id. A
    /// topic has at most one intent: adding it again returns the existing id
    /// and keeps the first reason.
    pub fn add_cleanup(&mut self, intent: &NewCleanup) -> Result<i64> {
        self.write(|tx| {
            tx.prepare_cached(
                "INSERT INTO cleanups (chat_id, thread_id, profile_key, reason, created_ms) \
                 VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (chat_id, thread_id) DO NOTHING",
            )?
            .execute(params![
                intent.chat_id,
                intent.thread_id,
                intent.profile_key,
                intent.reason,
                now_ms(),
            ])?;
            let id = tx
                .prepare_cached("SELECT id FROM cleanups WHERE chat_id = ?1 AND thread_id = ?2")?
                .query_row([intent.chat_id, intent.thread_id], |row| row.get(0))?;
            Ok(id)
        })
    }

    /// Every unfinished cleanup, oldest first.
    pub fn pending_cleanups(&self) -> Result<Vec<CleanupIntent>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT id, chat_id, thread_id, profile_key, reason, created_ms, attempts \
                 FROM cleanups ORDER BY id",
            )?;
            let rows = stmt.query_map([], |row| {
                Ok(CleanupIntent {
                    id: row.get(0)?,
                    chat_id: row.get(1)?,
                    thread_id: row.get(2)?,
                    profile_key: row.get(3)?,
                    reason: row.get(4)?,
                    created_ms: get_u64(row, 5)?,
                    attempts: row.get(6)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// Forgets an intent once Telegram confirmed the deletion (or the topic
    /// was already gone). Unknown ids are ignored.
    pub fn finish_cleanup(&mut self, id: i64) -> Result<()> {
        self.write(|tx| {
            tx.prepare_cached("DELETE FROM cleanups WHERE id = ?1")?
                .execute([id])?;
            Ok(())
        })
    }

    pub fn record_cleanup_attempt(&mut self, id: i64) -> Result<()> {
        self.write(|tx| {
            tx.prepare_cached("UPDATE cleanups SET attempts = attempts + 1 WHERE id = ?1")?
                .execute([id])?;
            Ok(())
        })
    }

    /// Users paired through `/start <code>`, ascending.
    pub fn allowed_users(&self) -> Result<Vec<i64>> {
        self.read(|conn| {
            let mut stmt =
                conn.prepare_cached("SELECT user_id FROM allowed_users ORDER BY user_id")?;
            let rows = stmt.query_map([], |row| row.get(0))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// Allows a user; adding one twice is not an error.
    pub fn add_allowed_user(&mut self, user_id: i64) -> Result<()> {
        self.write(|tx| {
            tx.prepare_cached(
                "INSERT INTO allowed_users (user_id, paired_ms) VALUES (?1, ?2) \
                 ON CONFLICT (user_id) DO NOTHING",
            )?
            .execute([user_id, now_ms()])?;
            Ok(())
        })
    }

    /// The names of the people seen, by user id.
    pub fn people(&self) -> Result<Vec<(i64, String)>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached("SELECT user_id, name FROM people")?;
            let rows = stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// Remembers `user`'s name (clipped to 256 characters; an empty one is
    /// not kept).
    pub fn set_person_name(&mut self, user_id: i64, name: &str) -> Result<()> {
        let name: String = name.chars().take(256).collect();
        if name.is_empty() {
            return Ok(());
        }
        self.write(|tx| {
            tx.prepare_cached(
                "INSERT INTO people (user_id, name, seen_ms) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (user_id) DO UPDATE SET name = ?2, seen_ms = ?3",
            )?
            .execute(rusqlite::params![user_id, name, now_ms()])?;
            Ok(())
        })
    }

    // ------------------------------------------------------------ internals

    fn connect(path: &Path, flags: OpenFlags) -> Result<Store> {
        let conn = Connection::open_with_flags(path, flags)
            .map_err(|source| Fault::Sql(source).at(path))?;
        let store = Store {
            conn,
            path: path.to_path_buf(),
        };
        store.read(|conn| {
            conn.busy_timeout(BUSY_TIMEOUT)?;
            // No table has a foreign key yet; on, so a future one is enforced.
            conn.pragma_update(None, "foreign_keys", true)?;
            conn.set_prepared_statement_cache_capacity(32);
            Ok(())
        })?;
        Ok(store)
    }

    /// Checks that the file is an intact agent-relay database this binary
    /// understands, before anything writes to it. Returns its schema version.
    fn verify(&self) -> Result<i64> {
        let (version, application_id, problems) = self.read(|conn| {
            // The first read of the header: a file that is not SQLite fails here.
            let version: i64 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
            let application_id: i32 =
                conn.pragma_query_value(None, "application_id", |row| row.get(0))?;
            let mut stmt = conn.prepare("PRAGMA quick_check(8)")?;
            let problems = stmt
                .query_map([], |row| row.get::<_, String>(0))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            Ok((version, application_id, problems))
        })?;
        if problems != ["ok"] {
            return Err(StoreError::Corrupt {
                path: self.path.clone(),
                message: format!("integrity check failed: {}", problems.join("; ")),
            });
        }
        let foreign = |message: String| StoreError::Foreign {
            path: self.path.clone(),
            message,
        };
        if application_id != 0 && application_id != APPLICATION_ID {
            return Err(foreign(format!("application id {application_id:#x}")));
        }
        if version < 0 || (version > 0 && application_id == 0) {
            return Err(foreign(format!(
                "schema version {version} without agent-relay's application id"
            )));
        }
        if version == 0 {
            let objects: i64 = self.read(|conn| {
                Ok(conn.query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))?)
            })?;
            if objects > 0 {
                return Err(foreign(format!(
                    "{objects} schema objects but no agent-relay schema version"
                )));
            }
        }
        if version > CURRENT_VERSION {
            return Err(StoreError::TooNew {
                path: self.path.clone(),
                found: version,
                supported: CURRENT_VERSION,
            });
        }
        Ok(version)
    }

    /// WAL lets diagnostic readers run beside the leader without blocking it.
    ///
    /// `synchronous = FULL` (an fsync of the WAL on every commit) rather than
    /// NORMAL: NORMAL keeps transactions atomic but may lose the last commits
    /// on power loss, and the poller confirms a batch to Telegram by its next
    /// `getUpdates` right after `journal_batch` returns. A batch lost after
    /// that confirmation is gone from both sides. Our write rate is a few
    /// transactions a second at most, so the fsync costs nothing noticeable.
    fn enable_wal(&self) -> Result<()> {
        self.read(|conn| {
            let mode: String =
                conn.pragma_update_and_check(None, "journal_mode", "wal", |row| row.get(0))?;
            if !mode.eq_ignore_ascii_case("wal") {
                // Still correct (rollback journal), only readers block the leader.
                tracing::warn!(path = %self.path.display(), %mode, "state database is not in WAL mode");
            }
            conn.pragma_update(None, "synchronous", "FULL")?;
            // The log is checkpointed every 1000 pages (SQLite's default);
            // without a limit its file keeps its largest size for good.
            conn.pragma_update(None, "journal_size_limit", WAL_LIMIT)?;
            Ok(())
        })
    }

    fn migrate(&mut self, found: i64) -> Result<()> {
        for (done, step) in (1..).zip(MIGRATIONS) {
            if done <= found {
                continue;
            }
            self.write(|tx| {
                // Re-read under the write lock: another opener may have
                // migrated the file since `verify` looked.
                let version: i64 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
                if version >= done {
                    return Ok(());
                }
                tx.execute_batch(step)?;
                tx.pragma_update(None, "application_id", APPLICATION_ID)?;
                tx.pragma_update(None, "user_version", done)?;
                Ok(())
            })?;
        }
        Ok(())
    }

    fn journal_query(&self, sql: &str, args: &[&dyn ToSql]) -> Result<Vec<JournalEntry>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(sql)?;
            let rows = stmt.query_map(args, journal_from_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    fn read<T>(&self, f: impl FnOnce(&Connection) -> Step<T>) -> Result<T> {
        f(&self.conn).map_err(|fault| fault.at(&self.path))
    }

    /// Like [`Store::write`], but the commit is not flushed to disk on its
    /// own (`synchronous = NORMAL`): still atomic, and durable at the next
    /// flushed commit or checkpoint. Only for bookkeeping whose loss on power
    /// failure costs a redelivery the session drops, never a message — the
    /// per-delivery writes, where an fsync each capped the relay near a
    /// thousand messages a second.
    fn write_unflushed<T>(&mut self, f: impl FnOnce(&Transaction<'_>) -> Step<T>) -> Result<T> {
        let path = self.path.clone();
        let relax = |conn: &Connection, mode: &str| {
            conn.pragma_update(None, "synchronous", mode)
                .map_err(|source| Fault::Sql(source).at(&path))
        };
        relax(&self.conn, "NORMAL")?;
        let result = self.write(f);
        relax(&self.conn, "FULL")?;
        result
    }

    /// Runs `f` in one IMMEDIATE transaction: the write lock is taken up
    /// front, so a concurrent reader can never turn the commit into a
    /// `SQLITE_BUSY` halfway. Any error rolls everything back.
    fn write<T>(&mut self, f: impl FnOnce(&Transaction<'_>) -> Step<T>) -> Result<T> {
        let path = &self.path;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|source| Fault::Sql(source).at(path))?;
        let value = f(&tx).map_err(|fault| fault.at(path))?;
        tx.commit().map_err(|source| Fault::Sql(source).at(path))?;
        Ok(value)
    }
}

/// An operation's failure before it is tied to the file's path.
enum Fault {
    Sql(rusqlite::Error),
    SlotTaken {
        slot: Slot,
        holder: String,
    },
    ThreadTaken {
        chat_id: i64,
        thread_id: i64,
        holder: String,
    },
}

type Step<T> = std::result::Result<T, Fault>;

impl From<rusqlite::Error> for Fault {
    fn from(e: rusqlite::Error) -> Self {
        Fault::Sql(e)
    }
}

impl Fault {
    fn at(self, path: &Path) -> StoreError {
        let path = path.to_path_buf();
        match self {
            Fault::SlotTaken { slot, holder } => StoreError::SlotTaken { slot, holder },
            Fault::ThreadTaken {
                chat_id,
                thread_id,
                holder,
            } => StoreError::ThreadTaken {
                chat_id,
                thread_id,
                holder,
            },
            Fault::Sql(source) if is_damage(&source) => StoreError::Corrupt {
                path,
                message: source.to_string(),
            },
            Fault::Sql(source) => StoreError::Sqlite { path, source },
        }
    }
}

/// Whether an error means the file's contents are damaged. Values the schema
/// forbids count too: this code never writes them, so something else did.
fn is_damage(e: &rusqlite::Error) -> bool {
    match e {
        rusqlite::Error::SqliteFailure(failure, _) => matches!(
            failure.code,
            ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase
        ),
        rusqlite::Error::FromSqlConversionFailure(..)
        | rusqlite::Error::IntegralValueOutOfRange(..)
        | rusqlite::Error::InvalidColumnType(..)
        | rusqlite::Error::Utf8Error(..) => true,
        _ => false,
    }
}

/// Creates the file with owner-only permissions, so SQLite (which gives the
/// `-wal` and `-shm` files the database's mode) never makes it world-readable:
/// it holds chat ids and message text.
fn create_private_file(path: &Path) -> Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    match options.open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(source) => Err(StoreError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            i64::try_from(elapsed.as_millis()).unwrap_or(i64::MAX)
        })
}

fn get_u64(row: &Row<'_>, index: usize) -> rusqlite::Result<u64> {
    let value: i64 = row.get(index)?;
    u64::try_from(value).map_err(|_| rusqlite::Error::IntegralValueOutOfRange(index, value))
}

const BINDING_COLUMNS: &str = "profile_key, instance_id, session_name, cwd, chat_id, thread_id, \
                               slot, topic_name, status, announced, created_ms, updated_ms, \
                               closed";

fn binding_from_row(row: &Row<'_>) -> rusqlite::Result<Binding> {
    let slot: String = row.get(6)?;
    let slot = Slot::try_from(slot).map_err(|message| {
        rusqlite::Error::FromSqlConversionFailure(6, Type::Text, message.into())
    })?;
    Ok(Binding {
        profile_key: row.get(0)?,
        instance_id: row.get(1)?,
        session_name: row.get(2)?,
        cwd: row.get(3)?,
        chat_id: row.get(4)?,
        thread_id: row.get(5)?,
        slot,
        topic_name: row.get(7)?,
        status: row.get(8)?,
        announced: row.get(9)?,
        created_ms: get_u64(row, 10)?,
        updated_ms: get_u64(row, 11)?,
        closed: row.get(12)?,
    })
}

const JOURNAL_COLUMNS: &str = "update_id, owner, chat_id, thread_id, user_id, message_id, text, \
                               state, attempts, drop_reason, received_ms, detail";

fn journal_from_row(row: &Row<'_>) -> rusqlite::Result<JournalEntry> {
    Ok(JournalEntry {
        update: NewUpdate {
            update_id: row.get(0)?,
            owner: row.get(1)?,
            chat_id: row.get(2)?,
            thread_id: row.get(3)?,
            user_id: row.get(4)?,
            message_id: row.get(5)?,
            text: row.get(6)?,
            detail: row.get(11)?,
        },
        state: row.get(7)?,
        attempts: row.get(8)?,
        drop_reason: row.get(9)?,
        received_ms: get_u64(row, 10)?,
    })
}

impl ToSql for BindingStatus {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::from(self.as_str()))
    }
}

impl FromSql for BindingStatus {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let text = value.as_str()?;
        Self::parse(text)
            .ok_or_else(|| FromSqlError::Other(format!("unknown binding status {text:?}").into()))
    }
}

impl FromSql for JournalState {
    fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
        let text = value.as_str()?;
        Self::parse(text)
            .ok_or_else(|| FromSqlError::Other(format!("unknown journal state {text:?}").into()))
    }
}

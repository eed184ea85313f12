//! The outbox of record (schema step 4): what sessions handed over for
//! their topics, and the leader's own notices, kept until Telegram took
//! them or a person was told they did not arrive.
//!
//! An entry goes `pending` → `sending` → `sent`, or ends `unknown` (a call
//! whose fate Telegram left open, or one a leader was making when it died)
//! or `failed` (refused for good). Writing `pending` and `sending` is
//! flushed before the caller goes on: a handed-over entry survives the
//! process, and a call is never made before the store says it may have
//! been. An entry of unknown fate or a failed one is kept (to be sent again
//! on request) and offered in its topic.

use rusqlite::{OptionalExtension, Row, params};

use super::{Result, Step, Store, now_ms};
use crate::ids::Place;

/// What an entry asks for in its topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// A message; `merge`: it may share a message with its neighbours.
    Text { reply_to: Option<i64>, merge: bool },
    /// A new text for message `message_id`: no buttons, or, with `settled`,
    /// one disabled button that says how a question was settled (kept in
    /// the `caption` column, which an edit has no other use for).
    Edit {
        message_id: i64,
        settled: Option<String>,
    },
    /// A short file the session made (a long answer's code).
    Document {
        file_name: String,
        caption: Option<String>,
    },
}

/// Where an entry goes: the lane it waits in, sent in order.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Lane {
    /// The topic of this session, as it is when the entry goes out.
    Session(String),
    /// A fixed place (the leader's own notices).
    Fixed(Place),
}

/// An entry to hand over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewOutboxEntry {
    pub lane: Lane,
    pub kind: EntryKind,
    pub body: String,
    pub html: bool,
    /// Who handed it over, once: the same origin again is the same entry
    /// (a hand-over repeated after a lost acknowledgement).
    pub origin: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryState {
    Pending,
    Sending,
    Sent,
    Unknown,
    Failed,
}

impl EntryState {
    fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Sending => "sending",
            Self::Sent => "sent",
            Self::Unknown => "unknown",
            Self::Failed => "failed",
        }
    }

    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "pending" => Self::Pending,
            "sending" => Self::Sending,
            "sent" => Self::Sent,
            "unknown" => Self::Unknown,
            "failed" => Self::Failed,
            _ => return None,
        })
    }
}

/// An entry as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEntry {
    pub id: i64,
    pub new: NewOutboxEntry,
    pub state: EntryState,
    /// Why it did not arrive (unknown, failed).
    pub why: Option<String>,
    /// Its topic was told it did not arrive.
    pub offered: bool,
    pub created_ms: i64,
}

/// Settled entries kept beyond the newest this many go at the next prune;
/// unknown and failed ones are kept for [`KEEP_KEPT_DAYS`].
pub const KEEP_SENT_POSTS: usize = 1_000;
/// How long an entry that did not arrive can be sent again (`/resend`).
pub const KEEP_KEPT_DAYS: u64 = 14;

const COLUMNS: &str = "id, profile_key, chat_id, thread_id, kind, body, html, message_ref, \
                       merge, file_name, caption, state, why, offered, created_ms";

fn post_from_row(row: &Row<'_>) -> rusqlite::Result<OutboxEntry> {
    let profile: Option<String> = row.get(1)?;
    let chat: Option<i64> = row.get(2)?;
    let lane = match (profile, chat) {
        (Some(profile), _) => Lane::Session(profile),
        (None, Some(chat_id)) => Lane::Fixed(Place {
            chat_id,
            thread_id: row.get(3)?,
        }),
        // The table's CHECK rules this out.
        (None, None) => {
            return Err(rusqlite::Error::FromSqlConversionFailure(
                1,
                rusqlite::types::Type::Null,
                "an outbox entry with no place".into(),
            ));
        }
    };
    let message_ref: Option<i64> = row.get(7)?;
    let kind: String = row.get(4)?;
    let kind = match kind.as_str() {
        "text" => EntryKind::Text {
            reply_to: message_ref,
            merge: row.get::<_, i64>(8)? == 1,
        },
        "edit" => EntryKind::Edit {
            message_id: message_ref.unwrap_or_default(),
            settled: row.get(10)?,
        },
        _ => EntryKind::Document {
            file_name: row.get::<_, Option<String>>(9)?.unwrap_or_default(),
            caption: row.get(10)?,
        },
    };
    let state: String = row.get(11)?;
    Ok(OutboxEntry {
        id: row.get(0)?,
        new: NewOutboxEntry {
            lane,
            kind,
            body: row.get(5)?,
            html: row.get::<_, i64>(6)? == 1,
            origin: None,
        },
        state: EntryState::parse(&state).unwrap_or(EntryState::Failed),
        why: row.get(12)?,
        offered: row.get::<_, i64>(13)? == 1,
        created_ms: row.get(14)?,
    })
}

impl Store {
    /// Hands `posts` over, in order, on disk before it returns; their ids.
    pub fn post(&mut self, posts: &[NewOutboxEntry]) -> Result<Vec<i64>> {
        let now = now_ms();
        self.write(|tx| {
            let mut insert = tx.prepare_cached(
                "INSERT INTO outbox (profile_key, chat_id, thread_id, kind, body, html, \
                 message_ref, merge, file_name, caption, created_ms, origin) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) \
                 ON CONFLICT (origin) WHERE origin IS NOT NULL DO NOTHING",
            )?;
            let mut existing = tx.prepare_cached("SELECT id FROM outbox WHERE origin = ?1")?;
            let mut ids = Vec::with_capacity(posts.len());
            for post in posts {
                let (profile, chat, thread) = match &post.lane {
                    Lane::Session(profile) => (Some(profile.as_str()), None, None),
                    Lane::Fixed(place) => (None, Some(place.chat_id), place.thread_id),
                };
                let (kind, message_ref, merge, file_name, caption) = match &post.kind {
                    EntryKind::Text { reply_to, merge } => ("text", *reply_to, *merge, None, None),
                    EntryKind::Edit {
                        message_id,
                        settled,
                    } => ("edit", Some(*message_id), false, None, settled.as_deref()),
                    EntryKind::Document { file_name, caption } => (
                        "document",
                        None,
                        false,
                        Some(file_name.as_str()),
                        caption.as_deref(),
                    ),
                };
                insert.execute(params![
                    profile,
                    chat,
                    thread,
                    kind,
                    post.body,
                    i64::from(post.html),
                    message_ref,
                    i64::from(merge),
                    file_name,
                    caption,
                    now,
                    post.origin
                ])?;
                let id = match &post.origin {
                    // Handed over before: the entry it made.
                    Some(origin) if tx.changes() == 0 => {
                        existing.query_row([origin], |row| row.get::<_, i64>(0))?
                    }
                    _ => tx.last_insert_rowid(),
                };
                ids.push(id);
            }
            Ok(ids)
        })
    }

    /// Every entry still to go (or going), oldest first.
    pub fn posts_due(&self) -> Result<Vec<OutboxEntry>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM outbox WHERE state IN ('pending', 'sending') ORDER BY id"
            ))?;
            let rows = stmt.query_map([], post_from_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// One entry, whatever its state.
    pub fn post_by_id(&self, id: i64) -> Result<Option<OutboxEntry>> {
        self.read(|conn| {
            let mut stmt =
                conn.prepare_cached(&format!("SELECT {COLUMNS} FROM outbox WHERE id = ?1"))?;
            Ok(stmt.query_row([id], post_from_row).optional()?)
        })
    }

    /// The entries of `profile_key` that did not arrive, oldest first.
    pub fn posts_kept(&self, profile_key: &str) -> Result<Vec<OutboxEntry>> {
        self.read(|conn| {
            let mut stmt = conn.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM outbox WHERE profile_key = ?1 \
                 AND state IN ('unknown', 'failed') ORDER BY id"
            ))?;
            let rows = stmt.query_map([profile_key], post_from_row)?;
            Ok(rows.collect::<rusqlite::Result<_>>()?)
        })
    }

    /// The entries are going out now: on disk before the call is made, so a
    /// leader that dies mid-call leaves them of unknown fate.
    pub fn posts_sending(&mut self, ids: &[i64]) -> Result<()> {
        self.set_state(ids, EntryState::Sending, None, None, true)
    }

    /// The entries went out as `message_id` (none for an edit).
    pub fn posts_sent(&mut self, ids: &[i64], message_id: Option<i64>) -> Result<()> {
        self.set_state(ids, EntryState::Sent, message_id, None, false)
    }

    /// The entries did not go: they wait again (nothing was posted).
    pub fn posts_back(&mut self, ids: &[i64]) -> Result<()> {
        self.set_state(ids, EntryState::Pending, None, None, true)
    }

    /// The entries did not arrive, or may not have (`unknown`), for `why`.
    pub fn posts_missing(&mut self, ids: &[i64], state: EntryState, why: &str) -> Result<()> {
        self.set_state(ids, state, None, Some(why), true)
    }

    /// A leader that starts finds what its predecessor was sending: of
    /// unknown fate now. Returns them.
    pub fn posts_orphaned(&mut self) -> Result<Vec<OutboxEntry>> {
        let orphaned: Vec<OutboxEntry> = self
            .posts_due()?
            .into_iter()
            .filter(|p| p.state == EntryState::Sending)
            .collect();
        let ids: Vec<i64> = orphaned.iter().map(|p| p.id).collect();
        self.posts_missing(
            &ids,
            EntryState::Unknown,
            "the relay stopped while it was sending it",
        )?;
        Ok(orphaned)
    }

    /// Whether the topic was told about the entries.
    pub fn posts_offered(&mut self, ids: &[i64], offered: bool) -> Result<()> {
        self.write_unflushed(|tx| {
            let mut update = tx.prepare_cached("UPDATE outbox SET offered = ?2 WHERE id = ?1")?;
            for id in ids {
                update.execute(params![id, i64::from(offered)])?;
            }
            Ok(())
        })
    }

    /// Sends again (a person asked) the entries of `profile_key` that did
    /// not arrive, or only `ids` of them; returns how many.
    pub fn posts_again(&mut self, profile_key: &str, ids: Option<&[i64]>) -> Result<usize> {
        let kept: Vec<i64> = self
            .posts_kept(profile_key)?
            .into_iter()
            .map(|p| p.id)
            .filter(|id| ids.is_none_or(|ids| ids.contains(id)))
            .collect();
        self.write(|tx| {
            let mut update = tx.prepare_cached(
                "UPDATE outbox SET state = 'pending', why = NULL, offered = 0, settled_ms = NULL \
                 WHERE id = ?1",
            )?;
            for id in &kept {
                update.execute([id])?;
            }
            Ok(kept.len())
        })
    }

    /// Gives up what waits for `profile_key`'s topic: the session was
    /// disconnected (its topic deleted) or its slot went to another. Its
    /// topic cannot be told: the caller tells the chat.
    pub fn posts_abandoned(&mut self, profile_key: &str, why: &str) -> Result<usize> {
        let now = now_ms();
        self.write(|tx| {
            Ok(tx
                .prepare_cached(
                    "UPDATE outbox SET state = 'failed', why = ?2, offered = 1, settled_ms = ?3 \
                     WHERE profile_key = ?1 AND state IN ('pending', 'sending')",
                )?
                .execute(params![profile_key, why, now])?)
        })
    }

    /// How many entries of `profile_key` did not arrive and were not
    /// offered in the topic either.
    pub fn posts_unoffered(&self, profile_key: &str) -> Result<u32> {
        self.read(|conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT count(*) FROM outbox WHERE profile_key = ?1 \
                     AND state IN ('unknown', 'failed') AND offered = 0",
                )?
                .query_row([profile_key], |row| row.get(0))?)
        })
    }

    /// Whether anything is still to go that a leader could send now (an
    /// entry for a session whose topic is gone waits for its session).
    pub fn posts_waiting(&self) -> Result<usize> {
        Ok(self.posts_due()?.len())
    }

    fn set_state(
        &mut self,
        ids: &[i64],
        state: EntryState,
        message_id: Option<i64>,
        why: Option<&str>,
        flush: bool,
    ) -> Result<()> {
        let settled = matches!(
            state,
            EntryState::Sent | EntryState::Unknown | EntryState::Failed
        )
        .then(now_ms);
        let step = |tx: &rusqlite::Transaction<'_>| -> Step<()> {
            let mut update = tx.prepare_cached(
                "UPDATE outbox SET state = ?2, message_id = coalesce(?3, message_id), \
                 why = ?4, settled_ms = ?5 WHERE id = ?1",
            )?;
            for id in ids {
                update.execute(params![id, state.as_str(), message_id, why, settled])?;
            }
            Ok(())
        };
        if flush {
            self.write(step)
        } else {
            self.write_unflushed(step)
        }
    }

    /// The outbox's share of [`Store::prune`]: sent entries beyond the
    /// newest [`KEEP_SENT_POSTS`], kept ones after [`KEEP_KEPT_DAYS`].
    pub(super) fn prune_posts(tx: &rusqlite::Transaction<'_>, now: i64) -> Step<usize> {
        let keep = i64::try_from(KEEP_SENT_POSTS).unwrap_or(i64::MAX);
        let kept_before =
            now.saturating_sub(i64::try_from(KEEP_KEPT_DAYS * 86_400_000).unwrap_or(0));
        let sent = tx
            .prepare_cached(
                "DELETE FROM outbox WHERE state = 'sent' AND id < coalesce( \
                 (SELECT id FROM outbox WHERE state = 'sent' \
                  ORDER BY id DESC LIMIT 1 OFFSET ?1 - 1), -1)",
            )?
            .execute([keep])?;
        let kept = tx
            .prepare_cached(
                "DELETE FROM outbox WHERE state IN ('unknown', 'failed') AND settled_ms < ?1",
            )?
            .execute([kept_before])?;
        Ok(sent + kept)
    }
}

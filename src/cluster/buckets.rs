//! The key-value operations every write to a bucket goes through, the
//! lease's and the claims' alike: a read with the revision to compare
//! against, create-if-absent, compare-and-set on a revision, and a delete
//! at a revision. Each is bounded by [`timed`]; each maps NATS's answer to
//! the one [`ClusterError`] callers branch on (`Taken`, `Changed`).

use async_nats::jetstream::kv;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{ClusterError, timed};

/// A key as read: its value and the revision to compare against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed<T> {
    pub value: T,
    pub revision: u64,
}

/// Reads `key` as JSON; `None` when it is absent or deleted.
pub(super) async fn read<T: DeserializeOwned>(
    kv: &kv::Store,
    key: &str,
) -> Result<Option<Claimed<T>>, ClusterError> {
    match timed(kv.entry(key)).await? {
        Some(entry) if entry.operation == kv::Operation::Put => {
            let value = serde_json::from_slice(&entry.value)
                .map_err(|e| ClusterError::unreadable(key, e))?;
            Ok(Some(Claimed {
                value,
                revision: entry.revision,
            }))
        }
        _ => Ok(None),
    }
}

/// Creates `key` if nobody holds it ([`ClusterError::Taken`] otherwise);
/// returns its revision.
pub(super) async fn create(
    kv: &kv::Store,
    key: &str,
    value: bytes::Bytes,
) -> Result<u64, ClusterError> {
    timed(async {
        kv.create(key, value).await.map_err(|e| match e.kind() {
            kv::CreateErrorKind::AlreadyExists => ClusterError::Taken {
                key: key.to_string(),
            },
            _ => ClusterError::unreachable(e),
        })
    })
    .await
}

/// Compare-and-set of `key` on `revision` (0: the key must not exist):
/// [`ClusterError::Changed`] when somebody wrote it since.
pub(super) async fn cas(
    kv: &kv::Store,
    key: &str,
    value: bytes::Bytes,
    revision: u64,
) -> Result<u64, ClusterError> {
    timed(async {
        kv.update(key, value, revision)
            .await
            .map_err(|e| changed_or_unreachable(key, e))
    })
    .await
}

/// Deletes `key` if it is still at `revision`.
pub(super) async fn delete_at(
    kv: &kv::Store,
    key: &str,
    revision: u64,
) -> Result<(), ClusterError> {
    timed(async {
        kv.delete_expect_revision(key, Some(revision))
            .await
            .map_err(|e| changed_or_unreachable(key, e))
    })
    .await
}

/// A write at a revision that lost ([`ClusterError::Changed`]), or one
/// that got no answer.
fn changed_or_unreachable(key: &str, e: kv::UpdateError) -> ClusterError {
    match e.kind() {
        kv::UpdateErrorKind::WrongLastRevision => ClusterError::Changed {
            key: key.to_string(),
        },
        _ => ClusterError::unreachable(e),
    }
}

/// A value as stored: its JSON.
pub(super) fn to_bytes<T: Serialize>(value: &T) -> Result<bytes::Bytes, ClusterError> {
    serde_json::to_vec(value)
        .map(Into::into)
        .map_err(|e| ClusterError::unreadable("a value to store", e))
}

impl From<kv::EntryError> for ClusterError {
    fn from(e: kv::EntryError) -> Self {
        ClusterError::unreachable(e)
    }
}

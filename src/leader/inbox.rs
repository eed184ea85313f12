//! The sessions' inboxes: where the files users send are saved. One private
//! folder (0700) per session under `<state>/inbox/<bot>/`, named after the
//! session's profile key; file names the relay makes from the update, the
//! file's place in the message and a sanitized form of the sender's name
//! (`4711-1-report.pdf`), never a path somebody chose. Each folder holds at
//! most `[files] inbox_max_mb`: the oldest files go first. Folders of
//! sessions that no longer have a binding go when the leader prunes.
//!
//! A file is downloaded next to its final name (`.<name>.part`), synced and
//! renamed: a name that exists is a complete file, so a fetch asked again
//! (a session that lost its leader mid-download) finds it and downloads
//! nothing twice.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest as _, Sha256};

use super::triage::JournaledFile;
use crate::files::safe_name;
use crate::ids::BotId;
use crate::paths::{Missing, Paths};
use crate::protocol::bus::{AttachmentKind, BusError, BusErrorCode};

/// A folder of a session without a binding stays this long after its last
/// change, so a session that is just registering never loses its files.
const ORPHAN_GRACE: Duration = Duration::from_secs(3600);

pub(super) struct FileInbox {
    /// `<state>/inbox/<bot>`.
    root: PathBuf,
    paths: Paths,
    /// Bytes one session's folder may hold.
    cap: u64,
}

impl FileInbox {
    pub fn new(paths: Paths, bot: BotId, cap: u64) -> Self {
        Self {
            root: paths.inbox_dir(bot),
            paths,
            cap,
        }
    }

    /// The relay's own files (its configuration holds the token): never
    /// files to send, under any name.
    pub fn relay_files(&self) -> crate::paths::RelayFiles {
        self.paths.relay_files()
    }

    /// The folder of one session: a readable part of its profile key and 16
    /// hex digits of the key's SHA-256, so two sessions never share one and
    /// the same session always finds its own.
    pub fn folder_name(profile_key: &str) -> String {
        let readable: String = profile_key
            .rsplit(['/', '#', ':'])
            .find(|part| !part.is_empty())
            .and_then(safe_name)
            .unwrap_or_else(|| "session".into())
            .chars()
            .map(|c| if c == ' ' { '_' } else { c })
            .take(40)
            .collect();
        let digest = Sha256::digest(profile_key.as_bytes());
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        format!("{readable}-{hex}")
    }

    /// The session's folder, created (0700) and checked with everything
    /// above it.
    pub async fn folder(&self, profile_key: &str) -> Result<PathBuf, BusError> {
        let dir = self.root.join(Self::folder_name(profile_key));
        let paths = self.paths.clone();
        let checked = dir.clone();
        blocking(move || paths.check_own_dir(&checked, Missing::Create))
            .await
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|e| BusError::new(BusErrorCode::Internal, format!("the inbox: {e}")))?;
        Ok(dir)
    }

    /// The name the `index`th file of update `update_id` is saved under.
    pub fn file_name(update_id: i64, index: usize, file: &JournaledFile) -> String {
        let given = file.name.as_deref().and_then(safe_name);
        let name = given.unwrap_or_else(|| {
            let (stem, default_extension) = match file.kind {
                AttachmentKind::Photo => ("photo", "jpg"),
                AttachmentKind::Document => ("file", "bin"),
                AttachmentKind::Voice => ("voice", "oga"),
                AttachmentKind::Audio => ("audio", "mp3"),
                AttachmentKind::Video => ("video", "mp4"),
                AttachmentKind::VideoNote => ("video-note", "mp4"),
                AttachmentKind::Animation => ("animation", "mp4"),
            };
            let from_type = file.mime_type.as_deref().and_then(extension_of_type);
            format!("{stem}.{}", from_type.unwrap_or(default_extension))
        });
        format!("{update_id}-{}-{name}", index + 1)
    }

    /// The size of a file a previous fetch saved completely, if `path` is
    /// one (and, when Telegram said how big it is, of that size).
    pub fn saved(path: &Path, expected: Option<u64>) -> Option<u64> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        let size = meta.len();
        (meta.is_file() && expected.is_none_or(|e| e == size)).then_some(size)
    }

    /// The file a download goes into before it is complete, emptied if a
    /// dead leader left one: private, never through a link.
    pub fn part_file(dir: &Path, name: &str) -> io::Result<(PathBuf, File)> {
        let path = dir.join(format!(".{name}.part"));
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(crate::sys::O_NOFOLLOW)
            .open(&path)?;
        Ok((path, file))
    }

    /// Makes room in `dir` for `incoming` more bytes by removing its oldest
    /// files first, never those in `keep` (the rest of the message being
    /// fetched).
    pub async fn make_room(&self, dir: PathBuf, incoming: u64, keep: Vec<PathBuf>) {
        let cap = self.cap;
        let removed = blocking(move || make_room(&dir, cap, incoming, &keep)).await;
        match removed {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(files = n, "the inbox was full; removed the oldest files"),
            Ok(Err(e)) => tracing::warn!("cannot make room in the inbox: {e}"),
            Err(e) => tracing::warn!("cannot make room in the inbox: {e}"),
        }
    }

    /// Removes the folders of sessions that are not among `live` (the
    /// profile keys with a binding) and did not change for an hour.
    pub async fn prune(&self, live: Vec<String>) {
        let root = self.root.clone();
        let keep: Vec<String> = live.iter().map(|key| Self::folder_name(key)).collect();
        match blocking(move || prune(&root, &keep)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => {
                tracing::info!(folders = n, "removed the inboxes of sessions that are gone")
            }
            Ok(Err(e)) if e.kind() == io::ErrorKind::NotFound => {}
            Ok(Err(e)) => tracing::warn!("cannot prune the inboxes: {e}"),
            Err(e) => tracing::warn!("cannot prune the inboxes: {e}"),
        }
    }
}

/// Runs file system work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| format!("the file task failed: {e}"))
}

/// The usual extension of a MIME type Telegram names for files it got
/// without a name.
fn extension_of_type(mime: &str) -> Option<&'static str> {
    Some(match mime {
        "audio/ogg" => "oga",
        "audio/mpeg" => "mp3",
        "audio/mp4" | "audio/x-m4a" => "m4a",
        "video/mp4" => "mp4",
        "video/quicktime" => "mov",
        "image/jpeg" => "jpg",
        "image/png" => "png",
        "application/pdf" => "pdf",
        "text/plain" => "txt",
        "application/zip" => "zip",
        _ => return None,
    })
}

fn make_room(dir: &Path, cap: u64, incoming: u64, keep: &[PathBuf]) -> io::Result<usize> {
    let mut files = Vec::new();
    let mut total = 0u64;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if !meta.is_file() {
            continue;
        }
        total += meta.len();
        let path = entry.path();
        if !keep.contains(&path) {
            files.push((
                meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                meta.len(),
                path,
            ));
        }
    }
    files.sort();
    let mut removed = 0;
    for (_, size, path) in files {
        if total.saturating_add(incoming) <= cap {
            break;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {
                total -= size;
                removed += 1;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => total -= size,
            Err(e) => return Err(e),
        }
    }
    Ok(removed)
}

fn prune(root: &Path, keep: &[String]) -> io::Result<usize> {
    let mut removed = 0;
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if keep.contains(&name) {
            continue;
        }
        let meta = entry.metadata()?;
        let idle = meta
            .modified()
            .ok()
            .and_then(|at| at.elapsed().ok())
            .is_some_and(|idle| idle > ORPHAN_GRACE);
        if !idle {
            continue;
        }
        // `remove_dir_all` does not follow links; anything that is not a
        // directory is removed as itself.
        let done = if meta.is_dir() {
            std::fs::remove_dir_all(entry.path())
        } else {
            std::fs::remove_file(entry.path())
        };
        match done {
            Ok(()) => removed += 1,
            Err(e) => tracing::warn!("cannot remove the inbox {name}: {e}"),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(kind: AttachmentKind, name: Option<&str>, mime: Option<&str>) -> JournaledFile {
        JournaledFile {
            kind,
            file_id: "id".into(),
            file_unique_id: "u".into(),
            size: None,
            name: name.map(String::from),
            mime_type: mime.map(String::from),
            duration_s: None,
        }
    }

    #[test]
    fn saved_names_are_the_relays_whatever_the_sender_called_them() {
        let name = |kind, given, mime| FileInbox::file_name(4711, 0, &file(kind, given, mime));
        assert_eq!(
            name(AttachmentKind::Photo, None, Some("image/jpeg")),
            "4711-1-photo.jpg"
        );
        assert_eq!(
            name(AttachmentKind::Voice, None, Some("audio/ogg")),
            "4711-1-voice.oga"
        );
        assert_eq!(
            name(AttachmentKind::Document, Some("../../.bashrc"), None),
            "4711-1-bashrc"
        );
        assert_eq!(
            name(
                AttachmentKind::Document,
                Some(".."),
                Some("application/pdf")
            ),
            "4711-1-file.pdf"
        );
        assert_eq!(
            FileInbox::file_name(
                9,
                2,
                &file(AttachmentKind::Document, Some("a/b/report.pdf"), None)
            ),
            "9-3-report.pdf"
        );
    }

    #[test]
    fn folders_are_one_per_profile_and_readable() {
        let a = FileInbox::folder_name("cwd:/home/ada/api#");
        let b = FileInbox::folder_name("cwd:/home/ada/api#2");
        assert!(a.starts_with("api-"), "{a}");
        assert_ne!(a, b);
        assert_eq!(a, FileInbox::folder_name("cwd:/home/ada/api#"));
        assert_eq!(FileInbox::folder_name("#").len(), "session-".len() + 16);
        assert!(safe_name(&FileInbox::folder_name("file:/x/../..")).is_some());
    }

    #[test]
    fn the_oldest_files_go_first_and_the_message_being_fetched_stays() {
        let dir = tempfile::tempdir().unwrap();
        let path = |n: &str| dir.path().join(n);
        for (i, n) in ["old", "keep", "mid", "new"].iter().enumerate() {
            std::fs::write(path(n), vec![0u8; 10]).unwrap();
            let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 + i as u64);
            File::options()
                .write(true)
                .open(path(n))
                .unwrap()
                .set_modified(at)
                .unwrap();
        }
        // 40 bytes held, a cap of 35, 10 coming: 15 must go, so two files.
        let removed = make_room(dir.path(), 35, 10, &[path("keep")]).unwrap();
        assert_eq!(removed, 2);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["keep", "new"]);
    }

    #[test]
    fn only_idle_folders_of_sessions_without_a_binding_are_pruned() {
        let root = tempfile::tempdir().unwrap();
        let live = FileInbox::folder_name("cwd:/a#");
        for name in [
            live.as_str(),
            "gone-0000000000000000",
            "fresh-0000000000000000",
        ] {
            std::fs::create_dir(root.path().join(name)).unwrap();
            std::fs::write(root.path().join(name).join("1-1-photo.jpg"), b"x").unwrap();
        }
        let long_ago = SystemTime::now() - ORPHAN_GRACE * 2;
        for name in [live.as_str(), "gone-0000000000000000"] {
            File::open(root.path().join(name))
                .unwrap()
                .set_modified(long_ago)
                .unwrap();
        }
        assert_eq!(prune(root.path(), std::slice::from_ref(&live)).unwrap(), 1);
        assert!(root.path().join(&live).exists());
        assert!(root.path().join("fresh-0000000000000000").exists());
        assert!(!root.path().join("gone-0000000000000000").exists());
    }
}

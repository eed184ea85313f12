//! `config.toml` as setup reads and writes it.
//!
//! Setup manages three keys — `bot_token`, `allowed_users`, `chat_id` — and
//! leaves everything else in the file as it was, comments included
//! (`toml_edit` edits the document in place). The file is read through
//! [`open_private_file`] (ours, not writable by others, no symlink) and
//! replaced only by a text that parses as a configuration, atomically and
//! 0600 ([`crate::paths::replace_file`]). A failure at any step leaves the
//! user's file as it was.

use std::io::Read;
use std::path::{Path, PathBuf};

use toml_edit::{DocumentMut, value};

use crate::config::ConfigFile;
use crate::paths::{UntrustedPath, open_private_file, replace_file};
use crate::redact::redact;

/// Why the file could not be read or written. None of the messages holds
/// the token: parse errors pass through [`redact`].
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(transparent)]
    Untrusted(#[from] UntrustedPath),
    #[error("cannot read {}: {message}", path.display())]
    Read { path: PathBuf, message: String },
    #[error("{} is not a valid configuration: {message}", path.display())]
    Invalid { path: PathBuf, message: String },
    #[error("cannot write {}: {message} (the old file is unchanged)", path.display())]
    Write { path: PathBuf, message: String },
}

/// Where the topics live, as setup writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chat {
    /// The private chat of the first allowed user: no `chat_id`.
    Private,
    /// A forum supergroup.
    Group(i64),
}

/// What setup writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Managed {
    pub token: String,
    /// The paired user; it goes first in `allowed_users`, since the first
    /// allowed user's private chat holds the topics when no chat is set.
    pub user: i64,
    pub chat: Chat,
}

/// The file as it is on disk: the editable document and its typed values.
#[derive(Debug, Clone)]
pub struct ConfigDocument {
    path: PathBuf,
    document: DocumentMut,
    /// What the file says (without the environment).
    pub values: ConfigFile,
    /// Whether the file existed.
    pub exists: bool,
}

impl ConfigDocument {
    /// Reads `path`; a missing file is an empty document.
    pub fn read(path: &Path) -> Result<Self, FileError> {
        let read_error = |e: std::io::Error| FileError::Read {
            path: path.to_path_buf(),
            message: e.to_string(),
        };
        let (text, exists) = match open_private_file(path)? {
            Some(mut file) => {
                let mut text = String::new();
                file.read_to_string(&mut text).map_err(read_error)?;
                (text, true)
            }
            None => (String::new(), false),
        };
        let invalid = |message: &str| FileError::Invalid {
            path: path.to_path_buf(),
            message: redact(message).into_owned(),
        };
        let values: ConfigFile = toml::from_str(&text).map_err(|e| invalid(e.message()))?;
        let document: DocumentMut = text
            .parse()
            .map_err(|e: toml_edit::TomlError| invalid(e.message()))?;
        Ok(Self {
            path: path.to_path_buf(),
            document,
            values,
            exists,
        })
    }

    /// Whether setup has run (or somebody wrote what it writes).
    pub fn is_configured(&self) -> bool {
        self.values.bot_token.is_some()
            || self.values.chat_id.is_some()
            || self
                .values
                .allowed_users
                .as_ref()
                .is_some_and(|u| !u.is_empty())
    }

    /// The text setup would write for `managed`: the managed keys set (the
    /// paired user first in `allowed_users`, the others kept after it;
    /// `chat_id` removed for the private chat), everything else untouched.
    pub fn edited(&self, managed: &Managed) -> String {
        let mut document = self.document.clone();
        document["bot_token"] = value(managed.token.as_str());
        let mut users = vec![managed.user];
        for user in self.values.allowed_users.iter().flatten() {
            if !users.contains(user) {
                users.push(*user);
            }
        }
        let mut array = toml_edit::Array::new();
        for user in users {
            array.push(user);
        }
        document["allowed_users"] = value(array);
        match managed.chat {
            Chat::Group(chat) => document["chat_id"] = value(chat),
            Chat::Private => {
                document.remove("chat_id");
            }
        }
        let mut text = document.to_string();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        text
    }

    /// Writes [`Self::edited`] atomically (see the module doc) and returns
    /// the document as it is now on disk.
    pub fn write(&self, managed: &Managed) -> Result<ConfigDocument, FileError> {
        let text = self.edited(managed);
        replace(&self.path, &text)?;
        let mut written = self.clone();
        written.values = toml::from_str(&text).map_err(|e| FileError::Invalid {
            path: self.path.clone(),
            message: redact(e.message()).into_owned(),
        })?;
        written.document = text.parse().unwrap_or_else(|_| self.document.clone());
        written.exists = true;
        Ok(written)
    }

    /// The keys of the file that setup does not manage, for the summary.
    pub fn other_keys(&self) -> Vec<String> {
        self.document
            .iter()
            .map(|(key, _)| key.to_string())
            .filter(|key| !matches!(key.as_str(), "bot_token" | "allowed_users" | "chat_id"))
            .collect()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Replaces `path` with `text` ([`replace_file`], 0600) once it is known
/// to parse as a configuration.
fn replace(path: &Path, text: &str) -> Result<(), FileError> {
    let failed = |message: String| FileError::Write {
        path: path.to_path_buf(),
        message,
    };
    // What the relay cannot read must not replace what it could.
    toml::from_str::<ConfigFile>(text).map_err(|e| {
        failed(format!(
            "the new text would not parse: {}",
            redact(e.message())
        ))
    })?;
    replace_file(path, text.as_bytes(), 0o600).map_err(|e| failed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::paths::ensure_private_dir;

    const TOKEN: &str = "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_";

    fn dir() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ensure_private_dir(&tmp.path().join("config")).unwrap();
        (tmp, dir)
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    fn managed(chat: Chat) -> Managed {
        Managed {
            token: TOKEN.into(),
            user: 1001,
            chat,
        }
    }

    #[test]
    fn a_new_file_is_private_and_holds_what_setup_manages() {
        let (_tmp, dir) = dir();
        let path = dir.join("config.toml");
        let doc = ConfigDocument::read(&path).unwrap();
        assert!(!doc.exists && !doc.is_configured());
        let written = doc.write(&managed(Chat::Private)).unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(written.values.bot_token.as_deref(), Some(TOKEN));
        assert_eq!(written.values.allowed_users, Some(vec![1001]));
        assert_eq!(written.values.chat_id, None);
        let again = ConfigDocument::read(&path).unwrap();
        assert_eq!(again.values, written.values);
        assert!(again.is_configured());
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().flatten().collect();
        assert_eq!(left.len(), 1, "no temp file is left: {left:?}");
    }

    #[test]
    fn other_keys_and_comments_stay_and_the_paired_user_goes_first() {
        let (_tmp, dir) = dir();
        let path = dir.join("config.toml");
        let before = "# my relay\nauto_connect = false # quiet\nchat_id = -100123\nallowed_users = [7, 1001]\napi_url = \"http://127.0.0.1:9\"\n";
        std::fs::write(&path, before).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let doc = ConfigDocument::read(&path).unwrap();
        assert_eq!(doc.other_keys(), ["auto_connect", "api_url"]);
        doc.write(&managed(Chat::Private)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("# my relay\nauto_connect = false # quiet\n"),
            "{text}"
        );
        assert!(text.contains("api_url = \"http://127.0.0.1:9\""), "{text}");
        assert!(
            !text.contains("chat_id"),
            "the private chat has no chat_id: {text}"
        );
        let values = ConfigDocument::read(&path).unwrap().values;
        assert_eq!(values.allowed_users, Some(vec![1001, 7]));
        assert_eq!(values.auto_connect, Some(false));

        ConfigDocument::read(&path)
            .unwrap()
            .write(&managed(Chat::Group(-100_555)))
            .unwrap();
        let values = ConfigDocument::read(&path).unwrap().values;
        assert_eq!(values.chat_id, Some(-100_555));
        assert_eq!(values.allowed_users, Some(vec![1001, 7]));
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_byte_for_byte() {
        let (_tmp, dir) = dir();
        let path = dir.join("config.toml");
        let before = "auto_connect = true\n";
        std::fs::write(&path, before).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let doc = ConfigDocument::read(&path).unwrap();
        // A text the relay could not read is refused before anything moves.
        let err = replace(&path, "bot_token = 5\n").unwrap_err();
        assert!(err.to_string().contains("unchanged"), "{err}");
        // Something planted where the temp file goes (a directory, which
        // no remove_file takes away): the write fails, the file stays.
        let temp = crate::paths::temp_file_for(&path);
        std::fs::create_dir(&temp).unwrap();
        let err = doc.write(&managed(Chat::Private)).unwrap_err();
        assert!(err.to_string().contains("unchanged"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), before);
        assert_eq!(mode(&path), 0o600);
    }

    #[test]
    fn a_planted_temp_file_or_a_symlinked_config_is_not_written_through() {
        let (tmp, dir) = dir();
        let path = dir.join("config.toml");
        let target = tmp.path().join("elsewhere");
        std::fs::write(&target, "").unwrap();
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let err = ConfigDocument::read(&path).unwrap_err();
        assert!(matches!(err, FileError::Untrusted(_)), "{err}");

        std::fs::remove_file(&path).unwrap();
        let temp = crate::paths::temp_file_for(&path);
        std::os::unix::fs::symlink(&target, &temp).unwrap();
        ConfigDocument::read(&path)
            .unwrap()
            .write(&managed(Chat::Private))
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            "",
            "not written through"
        );
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
    }

    #[test]
    fn a_broken_file_is_refused_without_echoing_the_token() {
        let (_tmp, dir) = dir();
        let path = dir.join("config.toml");
        std::fs::write(&path, format!("bot_token = {TOKEN}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let err = ConfigDocument::read(&path).unwrap_err().to_string();
        assert!(
            !err.contains("AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_"),
            "{err}"
        );
        assert!(err.contains("config.toml"), "{err}");
    }
}

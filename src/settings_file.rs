//! Another program's settings file that `agent-relay install` merges the
//! relay into (Claude Code's `settings.json` and `~/.claude.json`, Codex's
//! `hooks.json`): checked as the relay checks its own files, since hooks
//! are commands the program runs as the user; read as a JSON object; and
//! replaced atomically, keeping its mode and, for a link, the link.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::paths::replace_file;

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a JSON object ({why}); fix or move it, nothing was changed")]
    Malformed { path: PathBuf, why: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file or folder another user could have planted or may change:
    /// its hooks would be commands the program runs as this user.
    #[error("{}; nothing was changed", .0)]
    Untrusted(crate::paths::UntrustedPath),
}

/// The JSON object in `path`; a missing or empty file is an empty one.
pub fn read_object(path: &Path) -> Result<Map<String, Value>, InstallError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Map::new()),
        Err(source) => {
            return Err(InstallError::Read {
                path: path.into(),
                source,
            });
        }
    };
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(InstallError::Malformed {
            path: path.into(),
            why: "not an object".into(),
        }),
        Err(e) => Err(InstallError::Malformed {
            path: path.into(),
            why: e.to_string(),
        }),
    }
}

/// Replaces `path` (see [`replace_file`]), keeping the old file's mode
/// (0600 for a new one); a missing folder is made the user's alone
/// whatever the umask: hooks are commands.
pub fn write_object(path: &Path, value: &Map<String, Value>) -> Result<(), InstallError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let fail = |source| InstallError::Write {
        path: path.into(),
        source,
    };
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(fail)?;
    }
    let mode = std::fs::metadata(path).map_or(0o600, |m| m.permissions().mode() & 0o777);
    let mut text = serde_json::to_string_pretty(value).map_err(|e| fail(e.into()))?;
    text.push('\n');
    replace_file(path, text.as_bytes(), mode).map_err(fail)
}

/// Checks a file install reads and rewrites, and its folder, as the relay
/// checks its own: the file (or, for a symbolic link, the file it leads to)
/// and the folder must be the user's own and writable by nobody else (group
/// write is allowed for the user's own group, as a umask of 002 leaves it).
/// Another user's `settings.json` would have its hooks merged into a file
/// the user owns, and hooks are commands the program runs as the user.
/// Returns the path to read and write: a link is written through, so a
/// settings file kept elsewhere (a dotfiles repository) stays linked.
pub fn check_target(path: &Path) -> Result<PathBuf, InstallError> {
    use crate::paths::{Distrust, UntrustedPath};
    use std::os::unix::fs::MetadataExt;
    let me = crate::sys::euid();
    let my_group = crate::sys::egid();
    let untrusted = |path: &Path, reason: Distrust, fix: String| {
        InstallError::Untrusted(UntrustedPath {
            path: path.to_path_buf(),
            reason,
            fix,
        })
    };
    let judge = |shown: &Path, meta: &std::fs::Metadata, fix: &str| {
        let mode = meta.mode() & 0o7777;
        if meta.uid() != me {
            Err(untrusted(
                shown,
                Distrust::Owner {
                    owner: meta.uid(),
                    me,
                },
                fix.to_string(),
            ))
        } else if mode & 0o002 != 0 || (mode & 0o020 != 0 && meta.gid() != my_group) {
            Err(untrusted(
                shown,
                Distrust::Writable { mode },
                format!("run `chmod go-w {}`", shown.display()),
            ))
        } else {
            Ok(())
        }
    };
    let moved = |p: &Path| format!("move {} away and run install again", p.display());
    let target = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => path.to_path_buf(),
        Err(source) => {
            return Err(InstallError::Read {
                path: path.into(),
                source,
            });
        }
        Ok(meta) if meta.file_type().is_symlink() => {
            let resolved = std::fs::canonicalize(path).map_err(|source| InstallError::Read {
                path: path.into(),
                source,
            })?;
            let target = std::fs::metadata(&resolved).map_err(|source| InstallError::Read {
                path: resolved.clone(),
                source,
            })?;
            let fix = format!(
                "it is a symbolic link to {}; remove the link and run install again",
                resolved.display()
            );
            judge(path, &target, &fix)?;
            resolved
        }
        Ok(meta) if !meta.is_file() => {
            return Err(untrusted(path, Distrust::NotAFile, moved(path)));
        }
        Ok(meta) => {
            judge(path, &meta, &moved(path))?;
            path.to_path_buf()
        }
    };
    if let Some(dir) = target.parent()
        && let Ok(meta) = std::fs::metadata(dir)
    {
        judge(dir, &meta, &moved(dir))?;
    }
    Ok(target)
}

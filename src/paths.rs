//! Where agent-relay keeps its files (DESIGN §4, §8).
//!
//! `AGENT_RELAY_HOME` puts everything under one folder, which is how tests stay
//! isolated from each other and from the user's real relay. Otherwise the
//! platform's config and state directories are used, and the bus lives in the
//! runtime directory (`$XDG_RUNTIME_DIR/agent-relay`), else the state dir, else
//! `$TMPDIR/agent-relay-<uid>`.

use std::io;
use std::path::{Path, PathBuf};

use crate::config::BotId;

/// The directories of one user's relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub config_dir: PathBuf,
    pub state_dir: PathBuf,
    pub runtime_dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    #[error("cannot find a home directory; set AGENT_RELAY_HOME")]
    NoHome,
}

impl Paths {
    /// Resolves the directories from the process environment.
    pub fn from_env() -> Result<Self, PathsError> {
        Self::resolve(|key| {
            std::env::var_os(key)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
    }

    /// Resolves the directories from `env`, a lookup of environment variables.
    pub fn resolve(env: impl Fn(&str) -> Option<PathBuf>) -> Result<Self, PathsError> {
        if let Some(home) = env("AGENT_RELAY_HOME") {
            return Ok(Self::under(&home));
        }
        let dirs =
            directories::ProjectDirs::from("", "", "agent-relay").ok_or(PathsError::NoHome)?;
        let config_dir = dirs.config_dir().to_path_buf();
        let state_dir = dirs
            .state_dir()
            .unwrap_or_else(|| dirs.data_local_dir())
            .to_path_buf();
        let runtime_dir = match env("XDG_RUNTIME_DIR") {
            Some(dir) => dir.join("agent-relay"),
            None if dirs.state_dir().is_some() => state_dir.join("run"),
            None => {
                let tmp = env("TMPDIR").unwrap_or_else(std::env::temp_dir);
                // SAFETY: getuid has no preconditions and cannot fail.
                let uid = unsafe { libc::getuid() };
                tmp.join(format!("agent-relay-{uid}"))
            }
        };
        Ok(Self {
            config_dir,
            state_dir,
            runtime_dir,
        })
    }

    /// Every directory under `home` (the `AGENT_RELAY_HOME` layout).
    pub fn under(home: &Path) -> Self {
        Self {
            config_dir: home.join("config"),
            state_dir: home.join("state"),
            runtime_dir: home.join("run"),
        }
    }

    pub fn config_file(&self) -> PathBuf {
        self.config_dir.join("config.toml")
    }

    pub fn log_dir(&self) -> PathBuf {
        self.state_dir.join("logs")
    }

    /// The bus of one bot: `bus.lock`, `bus.sock` and `leader.json` live here.
    pub fn bus_dir(&self, bot: BotId) -> PathBuf {
        self.runtime_dir.join(bot.to_string())
    }

    /// The leader's SQLite database for one bot.
    pub fn store_file(&self, bot: BotId) -> PathBuf {
        self.state_dir.join(format!("{bot}.sqlite3"))
    }
}

/// Creates `dir` and its missing parents with mode 0700, and tightens `dir`
/// itself to 0700 if it already existed with looser bits.
pub fn ensure_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let meta = std::fs::metadata(dir)?;
    if meta.permissions().mode() & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn home_override_puts_everything_under_one_folder() {
        let p = Paths::resolve(|k| (k == "AGENT_RELAY_HOME").then(|| PathBuf::from("/h"))).unwrap();
        assert_eq!(p.config_file(), PathBuf::from("/h/config/config.toml"));
        assert_eq!(p.bus_dir(BotId(42)), PathBuf::from("/h/run/42"));
        assert_eq!(
            p.store_file(BotId(42)),
            PathBuf::from("/h/state/42.sqlite3")
        );
    }

    #[test]
    fn runtime_dir_prefers_xdg() {
        let p = Paths::resolve(|k| (k == "XDG_RUNTIME_DIR").then(|| PathBuf::from("/run/user/7")));
        assert_eq!(
            p.unwrap().runtime_dir,
            PathBuf::from("/run/user/7/agent-relay")
        );
    }

    #[test]
    fn private_dirs_are_0700() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        ensure_private_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }
}

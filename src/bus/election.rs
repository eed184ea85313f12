//! Leader election through a kernel file lock (DESIGN §4).
//!
//! Whoever holds `bus.lock` is the leader. The kernel releases the lock when
//! the holder dies, even on SIGKILL, so failover needs no lease and no timer:
//! the survivors notice the socket closing and race for the lock. Only the
//! holder may touch the control files (`bus.sock`, `leader.json`).

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use interprocess::local_socket::{GenericFilePath, ListenerOptions, Name, ToFsName};
use interprocess::os::unix::local_socket::ListenerOptionsExt;
use serde::{Deserialize, Serialize};

use crate::ids::Epoch;
use crate::paths::ensure_private_dir;

/// The files of one bot's bus.
#[derive(Debug, Clone)]
pub struct BusDir {
    dir: PathBuf,
}

/// Proof of leadership: the open, locked `bus.lock`. Dropping it releases
/// the lock.
#[derive(Debug)]
pub struct LeaderLock {
    _file: File,
    dir: BusDir,
}

/// What `leader.json` says. For people and `doctor` only: nothing decides
/// anything from it (the lock is the only truth).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaderInfo {
    pub pid: u32,
    pub epoch: Epoch,
    pub instance: String,
    /// Unix milliseconds.
    pub started: u64,
}

/// The longest socket path the kernel accepts (`sun_path` less its NUL).
const MAX_SOCKET_PATH: usize = 107;

impl BusDir {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn lock_path(&self) -> PathBuf {
        self.dir.join("bus.lock")
    }

    pub fn socket_path(&self) -> PathBuf {
        self.dir.join("bus.sock")
    }

    pub fn leader_file(&self) -> PathBuf {
        self.dir.join("leader.json")
    }

    /// The socket's name for interprocess, checked against the kernel's limit.
    pub fn socket_name(&self) -> io::Result<Name<'static>> {
        let path = self.socket_path();
        if path.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "bus socket path {} is longer than {MAX_SOCKET_PATH} bytes; set AGENT_RELAY_HOME or XDG_RUNTIME_DIR to a shorter directory",
                    path.display()
                ),
            ));
        }
        path.to_fs_name::<GenericFilePath>().map(|n| n.into_owned())
    }

    /// Tries to become leader. `Ok(None)`: somebody else holds the lock.
    pub fn try_lock(&self) -> io::Result<Option<LeaderLock>> {
        ensure_private_dir(&self.dir)?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(self.lock_path())?;
        match file.try_lock() {
            Ok(()) => Ok(Some(LeaderLock {
                _file: file,
                dir: self.clone(),
            })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }

    /// Reads `leader.json`, if there is a readable one.
    pub fn leader_info(&self) -> Option<LeaderInfo> {
        let text = std::fs::read_to_string(self.leader_file()).ok()?;
        serde_json::from_str(&text).ok()
    }
}

impl LeaderLock {
    pub fn dir(&self) -> &BusDir {
        &self.dir
    }

    /// Binds `bus.sock` (0600), replacing a stale file a dead leader left.
    /// Only the lock holder may do this, which is why it lives here.
    pub fn bind(&self) -> io::Result<interprocess::local_socket::tokio::Listener> {
        ListenerOptions::new()
            .name(self.dir.socket_name()?)
            .try_overwrite(true)
            .mode(0o600)
            .create_tokio()
    }

    /// Writes `leader.json` atomically (temp file + rename).
    pub fn write_info(&self, info: &LeaderInfo) -> io::Result<()> {
        let tmp = self
            .dir
            .dir
            .join(format!(".leader.json.{}", std::process::id()));
        {
            let mut file = File::create(&tmp)?;
            file.write_all(&serde_json::to_vec_pretty(info).map_err(io::Error::other)?)?;
            file.sync_all()?;
        }
        std::fs::rename(&tmp, self.dir.leader_file())
    }

    /// Removes the control files before the lock is released on purpose.
    pub fn remove_control_files(&self) {
        for path in [self.dir.leader_file(), self.dir.socket_path()] {
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!("cannot remove {}: {e}", path.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_at_a_time_and_release_on_drop() {
        let tmp = tempfile::tempdir().unwrap();
        let bus = BusDir::new(tmp.path().join("42"));
        let first = bus.try_lock().unwrap().expect("free lock");
        assert!(
            bus.try_lock().unwrap().is_none(),
            "second open file description must not get it"
        );
        drop(first);
        assert!(bus.try_lock().unwrap().is_some());
    }

    #[test]
    fn bus_dir_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let bus = BusDir::new(tmp.path().join("7"));
        let _lock = bus.try_lock().unwrap();
        let mode = std::fs::metadata(bus.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
    }

    #[test]
    fn overlong_socket_paths_are_a_clear_error() {
        let bus = BusDir::new(PathBuf::from(format!("/tmp/{}", "x".repeat(120))));
        let err = bus.socket_name().unwrap_err().to_string();
        assert!(err.contains("longer than"), "{err}");
    }
}

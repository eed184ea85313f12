//! Leader election through a kernel file lock (docs/DESIGN.md, *The bus*: Election).
//!
//! Whoever holds `bus.lock` is the leader. The kernel releases the lock when
//! the holder dies, even on SIGKILL, so failover needs no lease and no timer:
//! the survivors notice the socket closing and race for the lock. Only the
//! holder may touch the control files (`bus.sock`, `leader.json`).
//!
//! Nothing here trusts the directory by its name. The bus directory and the
//! runtime directory above it must be the user's own (see [`crate::paths`]):
//! [`BusDir::try_lock`] creates and checks them, and [`BusDir::socket_name`]
//! checks them before it hands out the socket's name, so neither binding
//! nor connecting can happen in a directory another user controls. After
//! connecting, [`BusDir::connect`] checks that the process serving the
//! socket runs as the same user ([`check_peer_is_me`]).

use std::fs::{File, TryLockError};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use interprocess::local_socket::tokio::Stream;
use interprocess::local_socket::traits::StreamCommon as _;
use interprocess::local_socket::traits::tokio::Stream as _;
use interprocess::local_socket::{GenericFilePath, ListenerOptions, Name, ToFsName};
use interprocess::os::unix::local_socket::ListenerOptionsExt;
use serde::{Deserialize, Serialize};

use crate::ids::Epoch;
use crate::paths::{
    Missing, UntrustedPath, check_dir, open_private_file, open_private_rw, replace_hint_file,
};

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

/// `serve.lock`, held for as long as `agent-relay serve` runs.
#[derive(Debug)]
pub struct ServeLock {
    _file: File,
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
    /// The bus in `dir`, unchecked: every use checks it (see the module doc).
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The bus in `dir`, created if missing and checked: an error names the
    /// directory that fails and the fix. For a member before it joins.
    pub fn open_checked(dir: PathBuf) -> Result<Self, UntrustedPath> {
        let bus = Self { dir };
        bus.check(Missing::Create)?;
        Ok(bus)
    }

    /// Checks the bus directory and the runtime directory holding it (the
    /// relay's own) and everything above. `Ok(false)`: with
    /// [`Missing::Leave`], it does not exist.
    pub fn check(&self, missing: Missing) -> Result<bool, UntrustedPath> {
        let own = self.dir.parent().unwrap_or(&self.dir);
        check_dir(own, &self.dir, missing)
    }

    /// Connects to the leader: only in a directory that passes the checks,
    /// and only to a process of the same user. An error of kind
    /// `PermissionDenied` means someone else's directory or socket: do not
    /// retry it as if the leader were just gone.
    pub async fn connect(&self) -> io::Result<Stream> {
        let stream = Stream::connect(self.socket_name()?).await?;
        check_peer_is_me(&stream)?;
        Ok(stream)
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

    /// The socket's name for interprocess, checked against the kernel's
    /// limit, once the directory passed the checks (`NotFound` when it does
    /// not exist, `PermissionDenied` when it is not trusted).
    pub fn socket_name(&self) -> io::Result<Name<'static>> {
        self.name_of(self.socket_path())
    }

    /// The name of another socket in this directory (a Claude Code session's
    /// hook socket), with the same checks as the bus socket's.
    pub fn side_socket_name(&self, file_name: &str) -> io::Result<Name<'static>> {
        self.name_of(self.dir.join(file_name))
    }

    fn name_of(&self, path: PathBuf) -> io::Result<Name<'static>> {
        if path.as_os_str().len() > MAX_SOCKET_PATH {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "socket path {} is longer than {MAX_SOCKET_PATH} bytes; set AGENT_RELAY_HOME or XDG_RUNTIME_DIR to a shorter directory",
                    path.display()
                ),
            ));
        }
        if !self.check(Missing::Leave)? {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} does not exist", self.dir.display()),
            ));
        }
        path.to_fs_name::<GenericFilePath>().map(|n| n.into_owned())
    }

    /// Tries to become leader, creating and checking the directory first.
    /// `Ok(None)`: somebody else holds the lock. An error means this bus
    /// cannot be used at all (an untrusted directory or lock file is
    /// `PermissionDenied`): a member must not join it.
    pub fn try_lock(&self) -> io::Result<Option<LeaderLock>> {
        self.check(Missing::Create)?;
        let file = open_private_rw(&self.lock_path())?;
        match file.try_lock() {
            Ok(()) => Ok(Some(LeaderLock {
                _file: file,
                dir: self.clone(),
            })),
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }

    /// `serve.lock`: held by `agent-relay serve` while it runs, so there
    /// is one per bus (docs/DESIGN.md, *Launching*).
    pub fn serve_lock_path(&self) -> PathBuf {
        self.dir.join("serve.lock")
    }

    /// Takes `serve.lock` and writes this process's id into it. `Ok(None)`:
    /// another `serve` holds it (its pid in the second value of
    /// [`BusDir::serve_running`]).
    pub fn try_lock_serve(&self) -> io::Result<Option<ServeLock>> {
        use std::io::{Seek, Write};
        self.check(Missing::Create)?;
        let mut file = open_private_rw(&self.serve_lock_path())?;
        match file.try_lock() {
            Ok(()) => {
                file.set_len(0)?;
                file.seek(io::SeekFrom::Start(0))?;
                write!(file, "{}", std::process::id())?;
                file.flush()?;
                Ok(Some(ServeLock { _file: file }))
            }
            Err(TryLockError::WouldBlock) => Ok(None),
            Err(TryLockError::Error(e)) => Err(e),
        }
    }

    /// Whether an `agent-relay serve` holds `serve.lock`, and the pid it
    /// wrote there. Asked by `doctor`; takes the lock for a moment when
    /// nobody holds it.
    pub fn serve_running(&self) -> Option<u32> {
        if !self.check(Missing::Leave).ok()? {
            return None;
        }
        let mut file = open_private_file(&self.serve_lock_path()).ok()??;
        let mut text = String::new();
        file.read_to_string(&mut text).ok()?;
        match file.try_lock_shared() {
            Ok(()) => None,
            Err(_) => Some(text.trim().parse().unwrap_or(0)),
        }
    }

    /// Reads `leader.json`, if there is a readable one of the user's own.
    pub fn leader_info(&self) -> Option<LeaderInfo> {
        if !self.check(Missing::Leave).ok()? {
            return None;
        }
        let mut text = String::new();
        open_private_file(&self.leader_file())
            .ok()??
            .read_to_string(&mut text)
            .ok()?;
        serde_json::from_str(&text).ok()
    }
}

/// Checks that the process at the other end of `stream` runs as the same
/// user: a member calls this after connecting (see [`BusDir::connect`]), as
/// the leader does for every connection it accepts, so that another user
/// who got a socket in place can neither serve nor join the bus.
pub fn check_peer_is_me(stream: &Stream) -> io::Result<()> {
    check_peer_uid(stream.peer_creds()?.euid(), "the bus socket")
}

/// Checks that `uid`, what the kernel says the other end of `socket` (a
/// unix socket of the relay's) runs as, is the user's own: the check
/// behind [`check_peer_is_me`], for a socket of another kind too (Codex's
/// tool socket).
pub fn check_peer_uid(uid: Option<u32>, socket: &str) -> io::Result<()> {
    let me = crate::sys::euid();
    match uid {
        Some(uid) if uid == me => Ok(()),
        Some(uid) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("the other end of {socket} runs as uid {uid}, not as you (uid {me})"),
        )),
        None => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("the kernel does not say who is on the other end of {socket}"),
        )),
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

    /// Writes `leader.json` atomically and 0600 ([`replace_hint_file`]).
    pub fn write_info(&self, info: &LeaderInfo) -> io::Result<()> {
        let text = serde_json::to_vec_pretty(info).map_err(io::Error::other)?;
        // Who leads is what the lock says; this file only names it.
        replace_hint_file(&self.dir.leader_file(), &text, 0o600)
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
    fn lock_and_leader_files_are_0600_and_never_followed() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let bus = BusDir::new(tmp.path().join("run/8"));
        let lock = bus.try_lock().unwrap().expect("free lock");
        let info = LeaderInfo {
            pid: 1,
            epoch: 2,
            instance: "i".into(),
            started: 3,
        };
        lock.write_info(&info).unwrap();
        let mode = |p: PathBuf| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(bus.lock_path()), 0o600);
        assert_eq!(mode(bus.leader_file()), 0o600);
        assert_eq!(bus.leader_info(), Some(info));
        drop(lock);

        // A leader.json that is a link is not read; a lock that is one is
        // not opened.
        std::fs::remove_file(bus.leader_file()).unwrap();
        std::fs::remove_file(bus.lock_path()).unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::write(
            &elsewhere,
            r#"{"pid":9,"epoch":9,"instance":"x","started":9}"#,
        )
        .unwrap();
        std::os::unix::fs::symlink(&elsewhere, bus.leader_file()).unwrap();
        std::os::unix::fs::symlink(&elsewhere, bus.lock_path()).unwrap();
        assert_eq!(bus.leader_info(), None);
        let err = bus.try_lock().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
    }

    #[test]
    fn an_untrusted_bus_dir_gets_no_socket_name_and_no_lock() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        let bus = BusDir::open_checked(run.join("3")).unwrap();
        bus.socket_name().unwrap();
        std::fs::set_permissions(&run, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = bus.socket_name().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied, "{err}");
        assert!(err.to_string().contains("mode 0777"), "{err}");
        assert!(bus.try_lock().is_err());
        assert!(BusDir::open_checked(run.join("4")).is_err());
        assert!(!run.join("4").exists());
        let missing = BusDir::new(tmp.path().join("nothing/5"));
        assert_eq!(
            missing.socket_name().unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn overlong_socket_paths_are_a_clear_error() {
        let bus = BusDir::new(PathBuf::from(format!("/tmp/{}", "x".repeat(120))));
        let err = bus.socket_name().unwrap_err().to_string();
        assert!(err.contains("longer than"), "{err}");
    }
}

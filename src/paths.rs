//! Where agent-relay keeps its files (docs/DESIGN.md, *The bus* and *Trust*), and whether they can be
//! trusted.
//!
//! `AGENT_RELAY_HOME` puts everything under one folder, which is how tests stay
//! isolated from each other and from the user's real relay. Otherwise the
//! platform's config and state directories are used, and the bus lives in the
//! runtime directory (`$XDG_RUNTIME_DIR/agent-relay`), else the state dir, else
//! `$TMPDIR/agent-relay-<uid>`.
//!
//! # Trust
//!
//! Another local user who can put a directory, a file or a symlink where the
//! relay looks can play the leader or feed it a configuration. So nothing is
//! used before it is checked, with `lstat` (never following a link):
//!
//! * The relay's *own* directories — `AGENT_RELAY_HOME` and everything under
//!   it; without it, the config dir, the state dir and the runtime dir and
//!   everything under them — must be real directories (no symlink) owned by
//!   the effective uid and not writable by group or others.
//! * Their *ancestors* (`/home/me`, `/tmp`, `/`) must be owned by root or the
//!   effective uid, and not writable by group or others, unless sticky (like
//!   `/tmp`) with the next component the user's own (or root's): in a
//!   sticky directory nobody else can rename or remove that entry. Symlinks among the ancestors
//!   (`/tmp` → `/private/tmp`) are resolved once, by `realpath`, and the
//!   resolved path is checked and used from then on.
//! * Files (`config.toml`, `bus.lock`, `leader.json`, the store) must be
//!   regular files owned by the effective uid and not writable by group or
//!   others; they are opened with `O_NOFOLLOW` and checked on the open
//!   descriptor, and created with mode 0600 whatever the umask.
//!
//! Missing directories are created one component at a time (`mkdir` 0700)
//! and each is `lstat`-checked right after: whatever someone planted before
//! or in between is found by the check, and once a directory passes, its
//! parent being trusted, nobody else can replace it. This is the walk OpenSSH
//! uses for `authorized_keys` (`safe_path`), extended with the sticky rule for
//! shared temp directories. It defends against other users, not against
//! processes of the same uid, nor root; ACLs are not consulted.

use std::ffi::OsString;
use std::fs::{File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::ids::BotId;
use crate::sys::{self, euid};

/// The directories of one user's relay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    pub config_dir: PathBuf,
    pub state_dir: PathBuf,
    pub runtime_dir: PathBuf,
    /// The relay's own top directories: everything at or below one of them
    /// must be the user's own, everything above is judged as an ancestor.
    roots: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    #[error("cannot find a home directory; set AGENT_RELAY_HOME")]
    NoHome,
    #[error("cannot find the current directory to resolve {0}: {1}")]
    Relative(String, String),
}

/// What a check does about a directory that does not exist yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// Create it (mode 0700) and check it: the sidecar, which needs it.
    Create,
    /// Leave it: `status` and `doctor`, which change nothing.
    Leave,
}

/// A path the relay refuses to use, why, and what the user can do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} {reason}: {fix}", path.display())]
pub struct UntrustedPath {
    pub path: PathBuf,
    pub reason: Distrust,
    pub fix: String,
}

/// Why a path is not trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Distrust {
    #[error("is owned by uid {owner}, not you (uid {me})")]
    Owner { owner: u32, me: u32 },
    #[error("can be written by other users (mode {mode:04o})")]
    Writable { mode: u32 },
    #[error("can be read by other users (mode {mode:04o})")]
    Readable { mode: u32 },
    #[error("is a symbolic link")]
    Symlink,
    #[error("is not a directory")]
    NotADirectory,
    #[error("is not a regular file")]
    NotAFile,
    #[error("cannot be checked or created ({0})")]
    Io(String),
}

impl UntrustedPath {
    /// The problem without the fix: `/x is owned by uid 7, not you (uid 0)`.
    pub fn problem(&self) -> String {
        format!("{} {}", self.path.display(), self.reason)
    }
}

impl From<UntrustedPath> for io::Error {
    fn from(error: UntrustedPath) -> Self {
        io::Error::new(io::ErrorKind::PermissionDenied, error)
    }
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
            return Ok(Self::under(&absolute(&home)?));
        }
        let dirs =
            directories::ProjectDirs::from("", "", "agent-relay").ok_or(PathsError::NoHome)?;
        let config_dir = dirs.config_dir().to_path_buf();
        let state_dir = dirs
            .state_dir()
            .unwrap_or_else(|| dirs.data_local_dir())
            .to_path_buf();
        let runtime_dir = match env("XDG_RUNTIME_DIR") {
            Some(dir) => absolute(&dir)?.join("agent-relay"),
            None if dirs.state_dir().is_some() => state_dir.join("run"),
            None => {
                let tmp = env("TMPDIR").unwrap_or_else(std::env::temp_dir);
                // The shared temp directory is an ancestor like any other: it
                // passes as sticky only if `agent-relay-<uid>` is our own.
                absolute(&tmp)?.join(format!("agent-relay-{}", euid()))
            }
        };
        Ok(Self {
            roots: vec![config_dir.clone(), state_dir.clone(), runtime_dir.clone()],
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
            roots: vec![home.to_path_buf()],
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

    /// What the last leader of one bot spent of Telegram's message budget
    /// (`leader/budget.rs`).
    pub fn budget_file(&self, bot: BotId) -> PathBuf {
        self.state_dir.join(format!("{bot}.budget.json"))
    }

    /// Where the files users send to one bot's sessions are saved, one
    /// folder per session.
    pub fn inbox_dir(&self, bot: BotId) -> PathBuf {
        self.state_dir.join("inbox").join(bot.to_string())
    }

    /// Checks `dir`, one of the relay's own directories or a directory
    /// below one, and every directory above it, creating what is missing
    /// if `missing` says so (see the module doc).
    pub fn check_own_dir(&self, dir: &Path, missing: Missing) -> Result<bool, UntrustedPath> {
        check_dir(&self.root_of(dir), dir, missing)
    }

    /// Checks the config, state, log and runtime directories and everything
    /// above them (see the module doc), creating missing ones if `missing`
    /// says so, and returns the paths with their ancestors resolved.
    pub fn checked(&self, missing: Missing) -> Result<Paths, UntrustedPath> {
        let roots = self
            .roots
            .iter()
            .map(|root| resolve_own(root).map(|resolved| (root, resolved)))
            .collect::<Result<Vec<_>, _>>()?;
        // Each directory moves to its root's resolved path.
        let moved = |dir: &Path| -> (PathBuf, PathBuf) {
            roots
                .iter()
                .filter(|(root, _)| dir.starts_with(root))
                .max_by_key(|(root, _)| root.as_os_str().len())
                .map_or_else(
                    || (dir.to_path_buf(), dir.to_path_buf()),
                    |(root, resolved)| {
                        let below = dir.strip_prefix(root).unwrap_or(Path::new(""));
                        (resolved.clone(), resolved.join(below))
                    },
                )
        };
        let checked = Paths {
            config_dir: moved(&self.config_dir).1,
            state_dir: moved(&self.state_dir).1,
            runtime_dir: moved(&self.runtime_dir).1,
            roots: roots.iter().map(|(_, resolved)| resolved.clone()).collect(),
        };
        for dir in [
            &self.config_dir,
            &self.state_dir,
            &self.log_dir(),
            &self.runtime_dir,
        ] {
            let (root, dir) = moved(dir);
            check_dir(&root, &dir, missing)?;
        }
        Ok(checked)
    }

    /// Checks what belongs to one bot: its bus directory (created if
    /// `missing` says so) and its store with SQLite's companion files, where
    /// they exist.
    pub fn check_bot(&self, bot: BotId, missing: Missing) -> Result<(), UntrustedPath> {
        let bus = self.bus_dir(bot);
        check_dir(&self.root_of(&bus), &bus, missing)?;
        let store = self.store_file(bot);
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut file = store.clone().into_os_string();
            file.push(suffix);
            check_private_file(Path::new(&file))?;
        }
        Ok(())
    }

    /// The root `dir` lies under, or `dir` itself.
    fn root_of(&self, dir: &Path) -> PathBuf {
        self.roots
            .iter()
            .filter(|root| dir.starts_with(root))
            .max_by_key(|root| root.as_os_str().len())
            .cloned()
            .unwrap_or_else(|| dir.to_path_buf())
    }
}

fn absolute(path: &Path) -> Result<PathBuf, PathsError> {
    std::path::absolute(path)
        .map_err(|e| PathsError::Relative(path.display().to_string(), e.to_string()))
}

/// What the user can do about `path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// One of the relay's own directories.
    Own,
    /// A directory above them.
    Ancestor,
    /// A directory in a shared sticky one (`/tmp/x`): it must be ours.
    Shared,
    /// A file of the relay.
    File,
}

fn untrusted(path: &Path, reason: Distrust, role: Role) -> UntrustedPath {
    let quoted = shell_quote(&path.display().to_string());
    let elsewhere = "set AGENT_RELAY_HOME to a directory you own";
    let fix = match (&reason, role) {
        (Distrust::Owner { .. }, Role::Own | Role::Shared) => {
            format!("remove it or {elsewhere}")
        }
        (Distrust::Owner { .. }, Role::Ancestor) => elsewhere.to_string(),
        (Distrust::Owner { .. }, Role::File) => {
            "remove it and write your own (it may have been planted by another user)".into()
        }
        (Distrust::Writable { .. }, Role::Own | Role::Shared) => {
            format!(
                "run `chmod 700 {quoted}` and check what others may have put there, or {elsewhere}"
            )
        }
        (Distrust::Writable { .. }, Role::Ancestor) => {
            format!("run `chmod go-w {quoted}` if it is yours, or {elsewhere}")
        }
        (Distrust::Writable { .. } | Distrust::Readable { .. }, Role::File) => {
            format!("run `chmod 600 {quoted}`")
        }
        (Distrust::Readable { .. }, _) => format!("run `chmod go-rwx {quoted}`"),
        (Distrust::Symlink, Role::File) => "replace the link with the file itself".into(),
        (Distrust::Symlink | Distrust::NotADirectory, _) => {
            format!("replace it with a directory of your own, or {elsewhere}")
        }
        (Distrust::NotAFile, _) => "replace it with a regular file".into(),
        (Distrust::Io(_), _) => format!("check that you may create and read it, or {elsewhere}"),
    };
    UntrustedPath {
        path: path.to_path_buf(),
        reason,
        fix,
    }
}

fn io_error(path: &Path, error: &io::Error, role: Role) -> UntrustedPath {
    untrusted(path, Distrust::Io(error.to_string()), role)
}

/// `text` (a path) quoted for a POSIX shell: as it is when every character
/// is one no shell treats specially, else in single quotes. For the
/// commands in fixes, and the hook commands Claude Code runs.
pub fn shell_quote(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:@".contains(c))
    {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// `own` with its parent resolved by `realpath` as far as it exists; `own`
/// itself is never resolved (a symlink there is refused by the walk).
fn resolve_own(own: &Path) -> Result<PathBuf, UntrustedPath> {
    let (Some(parent), Some(name)) = (own.parent(), own.file_name()) else {
        return Err(untrusted(own, Distrust::NotADirectory, Role::Own));
    };
    let mut existing = parent.to_path_buf();
    let mut rest: Vec<OsString> = Vec::new();
    let resolved = loop {
        match std::fs::canonicalize(&existing) {
            Ok(resolved) => break resolved,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let Some(last) = existing.file_name() else {
                    return Err(io_error(&existing, &e, Role::Ancestor));
                };
                rest.push(last.to_owned());
                existing.pop();
            }
            Err(e) => return Err(io_error(&existing, &e, Role::Ancestor)),
        }
    };
    let mut out = resolved;
    out.extend(rest.iter().rev());
    out.push(name);
    Ok(out)
}

/// Checks `dir` and every directory above it, `own` being the relay's own
/// top directory (`dir` or one of its ancestors): see the module doc. With
/// [`Missing::Create`] missing directories are created (0700) and checked,
/// and the relay's own directories are tightened to 0700 if they let others
/// read. Returns `false` when something is missing and left so.
pub fn check_dir(own: &Path, dir: &Path, missing: Missing) -> Result<bool, UntrustedPath> {
    let resolved = resolve_own(own)?;
    let below = dir.strip_prefix(own).map_err(|_| {
        untrusted(
            dir,
            Distrust::Io(format!("not under {}", own.display())),
            Role::Own,
        )
    })?;
    let ancestors = resolved.components().count().saturating_sub(2);
    walk(&resolved.join(below), ancestors, missing)
}

/// Checks `dir` as the relay's own and creates it (and its missing parents)
/// if needed. Returns it with its ancestors resolved.
pub fn ensure_private_dir(dir: &Path) -> Result<PathBuf, UntrustedPath> {
    check_dir(dir, dir, Missing::Create)?;
    resolve_own(dir)
}

/// The `lstat` walk from `/` down `path`, whose components from index
/// `ancestors` on (0 = the first below `/`) are the relay's own.
fn walk(path: &Path, ancestors: usize, missing: Missing) -> Result<bool, UntrustedPath> {
    let me = euid();
    let mut current = PathBuf::from("/");
    let meta = lstat(&current, Role::Ancestor)?;
    // Set when the directory just checked is writable by others but sticky:
    // the next component must then be ours.
    let mut shared = judge_ancestor(&current, &meta, me)?;
    for (index, component) in path.components().skip(1).enumerate() {
        let Component::Normal(name) = component else {
            return Err(untrusted(
                path,
                Distrust::Io("not a plain absolute path".into()),
                Role::Own,
            ));
        };
        current.push(name);
        let own = index >= ancestors;
        let role = match (own, shared) {
            (_, true) => Role::Shared,
            (true, false) => Role::Own,
            (false, false) => Role::Ancestor,
        };
        let meta = match std::fs::symlink_metadata(&current) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => match missing {
                Missing::Leave => return Ok(false),
                Missing::Create => {
                    create_dir(&current).map_err(|e| io_error(&current, &e, role))?;
                    lstat(&current, role)?
                }
            },
            Err(e) => return Err(io_error(&current, &e, role)),
        };
        if meta.file_type().is_symlink() {
            return Err(untrusted(&current, Distrust::Symlink, role));
        }
        if !meta.is_dir() {
            return Err(untrusted(&current, Distrust::NotADirectory, role));
        }
        // Ours if it is the relay's own; in a shared sticky directory ours
        // or root's, the only ones nobody else can have made.
        if (own || shared) && meta.uid() != me && (own || meta.uid() != 0) {
            return Err(untrusted(
                &current,
                Distrust::Owner {
                    owner: meta.uid(),
                    me,
                },
                role,
            ));
        }
        if own {
            let mode = meta.mode() & 0o7777;
            if mode & 0o022 != 0 {
                return Err(untrusted(&current, Distrust::Writable { mode }, role));
            }
            if missing == Missing::Create && mode & 0o077 != 0 {
                // Ours, in a trusted parent: nobody can swap it for a link
                // between the check and the chmod.
                std::fs::set_permissions(&current, std::fs::Permissions::from_mode(0o700))
                    .map_err(|e| io_error(&current, &e, role))?;
            }
            shared = false;
        } else {
            shared = judge_ancestor(&current, &meta, me)?;
        }
    }
    Ok(true)
}

/// An ancestor must be root's or ours, and not writable by others unless
/// sticky. Returns whether it is such a shared sticky directory.
fn judge_ancestor(path: &Path, meta: &Metadata, me: u32) -> Result<bool, UntrustedPath> {
    if meta.uid() != 0 && meta.uid() != me {
        return Err(untrusted(
            path,
            Distrust::Owner {
                owner: meta.uid(),
                me,
            },
            Role::Ancestor,
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 == 0 {
        return Ok(false);
    }
    if mode & sys::S_ISVTX != 0 {
        return Ok(true);
    }
    Err(untrusted(path, Distrust::Writable { mode }, Role::Ancestor))
}

fn lstat(path: &Path, role: Role) -> Result<Metadata, UntrustedPath> {
    std::fs::symlink_metadata(path).map_err(|e| io_error(path, &e, role))
}

fn create_dir(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        // Someone (maybe another sidecar) was first: the check decides.
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        done => done,
    }
}

/// Checks an open file: regular, ours, and (unless `tighten`, which makes
/// it 0600) not writable by others.
fn check_open_file(path: &Path, file: &File, tighten: bool) -> Result<(), UntrustedPath> {
    let meta = file
        .metadata()
        .map_err(|e| io_error(path, &e, Role::File))?;
    match judge_file(path, &meta) {
        Err(error) if !(tighten && matches!(error.reason, Distrust::Writable { .. })) => {
            return Err(error);
        }
        _ => {}
    }
    if tighten && meta.mode() & 0o7777 != 0o600 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| io_error(path, &e, Role::File))?;
    }
    Ok(())
}

fn judge_file(path: &Path, meta: &Metadata) -> Result<(), UntrustedPath> {
    let me = euid();
    let reason = if meta.file_type().is_symlink() {
        Distrust::Symlink
    } else if !meta.is_file() {
        Distrust::NotAFile
    } else if meta.uid() != me {
        Distrust::Owner {
            owner: meta.uid(),
            me,
        }
    } else if meta.mode() & 0o022 != 0 {
        Distrust::Writable {
            mode: meta.mode() & 0o7777,
        }
    } else {
        return Ok(());
    };
    Err(untrusted(path, reason, Role::File))
}

fn open_error(path: &Path, error: io::Error) -> UntrustedPath {
    if error.raw_os_error() == Some(sys::ELOOP) {
        untrusted(path, Distrust::Symlink, Role::File)
    } else {
        io_error(path, &error, Role::File)
    }
}

/// Opens a file of the relay for reading (`config.toml`, `leader.json`):
/// not through a symlink, and only if it is a regular file of ours that
/// others cannot write. `Ok(None)` when it does not exist.
pub fn open_private_file(path: &Path) -> Result<Option<File>, UntrustedPath> {
    // O_NONBLOCK: a FIFO planted here must not hang the open; it is then
    // refused as not a regular file.
    let file = match OpenOptions::new()
        .read(true)
        .custom_flags(sys::O_NOFOLLOW | sys::O_NONBLOCK)
        .open(path)
    {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(open_error(path, e)),
    };
    check_open_file(path, &file, false)?;
    Ok(Some(file))
}

/// Opens a secret of the user's for reading (a NATS `.creds` file, a TLS
/// private key), checked as [`open_private_file`] does and, since what it
/// holds lets anybody in, refused if group or others may read it at all
/// (the fix is `chmod 600 …`). `Ok(None)` when it does not exist.
pub fn open_secret_file(path: &Path) -> Result<Option<File>, UntrustedPath> {
    let Some(file) = open_private_file(path)? else {
        return Ok(None);
    };
    let mode = file
        .metadata()
        .map_err(|e| io_error(path, &e, Role::File))?
        .mode()
        & 0o7777;
    if mode & 0o077 != 0 {
        return Err(untrusted(path, Distrust::Readable { mode }, Role::File));
    }
    Ok(Some(file))
}

/// Opens a file of the relay for reading and writing, creating it with mode
/// 0600 (`bus.lock`). An existing file must be a regular file of ours; it is
/// tightened to 0600.
pub fn open_private_rw(path: &Path) -> Result<File, UntrustedPath> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(sys::O_NOFOLLOW)
        .open(path)
        .map_err(|e| open_error(path, e))?;
    check_open_file(path, &file, true)?;
    Ok(file)
}

/// Creates a new file of the relay with mode 0600 whatever the umask
/// (`leader.json`'s temp file). Fails if anything exists at `path`.
pub fn create_private_file(path: &Path) -> Result<File, UntrustedPath> {
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(sys::O_NOFOLLOW)
        .open(path)
        .map_err(|e| open_error(path, e))?;
    check_open_file(path, &file, true)?;
    Ok(file)
}

/// Serializes this process's [`replace_file`] calls: with the pid in the
/// temp file's name, no two writers anywhere share one.
static REPLACING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Where [`replace_file`] writes before the rename: beside `path` (a rename
/// across file systems would not be atomic), hidden, named for the file and
/// this process.
pub fn temp_file_for(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

/// Replaces `path` with `bytes` atomically: a reader sees the old file or
/// the new one, never a part, and after a crash the new one is there once
/// this returned. The one file writer of the relay (`config.toml`, Claude
/// Code's settings; `leader.json` through [`replace_hint_file`]).
///
/// The temp file ([`temp_file_for`]) is created afresh with `O_NOFOLLOW`,
/// so a link planted there is never written through; a leftover there (of
/// a dead process that had our pid) is removed first, and ours is removed
/// on any failure. It gets `mode` exactly, whatever the umask (0600 for
/// the relay's private files), is written and synced, renamed over `path`,
/// and the directory is synced so the rename itself is on disk.
pub fn replace_file(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    replace(path, bytes, mode, Durable::Synced)
}

/// [`replace_file`] for a file that is a hint, rewritten by whoever comes
/// next (`leader.json`): atomic for readers all the same, but not synced,
/// so after a crash of the machine it may hold an earlier version, or be
/// empty (its readers take that as nothing known). Saves a new leader the
/// two syncs on its way to serving.
pub fn replace_hint_file(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    replace(path, bytes, mode, Durable::Hint)
}

#[derive(PartialEq)]
enum Durable {
    Synced,
    Hint,
}

fn replace(path: &Path, bytes: &[u8], mode: u32, durable: Durable) -> io::Result<()> {
    use std::io::Write;
    let _one_at_a_time = REPLACING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let temp = temp_file_for(path);
    match std::fs::remove_file(&temp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(sys::O_NOFOLLOW)
            .open(&temp)
            .map_err(|e| io::Error::from(open_error(&temp, e)))?;
        file.set_permissions(std::fs::Permissions::from_mode(mode))?;
        file.write_all(bytes)?;
        if durable == Durable::Synced {
            file.sync_all()?;
        }
        std::fs::rename(&temp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    if durable == Durable::Hint {
        return Ok(());
    }
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// Checks a file of the relay that something else opens (the SQLite store):
/// `Ok(false)` when it does not exist.
pub fn check_private_file(path: &Path) -> Result<bool, UntrustedPath> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) => judge_file(path, &meta).map(|()| true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(io_error(path, &e, Role::File)),
    }
}

/// A file the agent may send to Telegram, opened: its descriptor is what
/// was checked and what is sent.
#[derive(Debug)]
pub struct Sendable {
    pub file: File,
    /// Bytes, from the open descriptor.
    pub len: u64,
    /// The path with every symbolic link resolved.
    pub path: PathBuf,
}

/// Why a file may not be sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendRefused {
    #[error("{} does not exist", path.display())]
    Missing { path: PathBuf },
    #[error(
        "{} is outside {allowed}; set `[files] send_from` in config.toml to allow another folder",
        path.display()
    )]
    Outside { path: PathBuf, allowed: String },
    #[error("{} is one of agent-relay's own files (its configuration holds the bot token)", path.display())]
    RelayFile { path: PathBuf },
    #[error(
        "{} is agent-relay's {what} under another name (a hard link): it is never sent",
        path.display()
    )]
    RelayFileLinked { path: PathBuf, what: String },
    #[error(
        "{} changed while it was opened (a symbolic link appeared on its way); nothing was sent",
        path.display()
    )]
    Changed { path: PathBuf },
    #[error("{} is not a regular file", path.display())]
    NotAFile { path: PathBuf },
    #[error("{} is owned by uid {owner}, not you (uid {me})", path.display())]
    NotYours { path: PathBuf, owner: u32, me: u32 },
    #[error("{} cannot be read: {message}", path.display())]
    Unreadable { path: PathBuf, message: String },
}

/// The relay's own files, which `file/send` never sends: nothing under the
/// configuration directory (by path), and no file that *is* one of the
/// relay's — the config file, the store and its companions, a log file —
/// under another name (by device and inode: a hard link has a path of its
/// own, and the same inode).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelayFiles {
    /// Refused by path, with everything under them.
    pub dirs: Vec<PathBuf>,
    /// Folders whose regular files are refused by identity, wherever a
    /// link to them lies; each with what its files are, for the refusal.
    pub holders: Vec<(PathBuf, &'static str)>,
}

impl Paths {
    /// What `file/send` never sends (see [`RelayFiles`]).
    pub fn relay_files(&self) -> RelayFiles {
        RelayFiles {
            dirs: vec![self.config_dir.clone()],
            holders: vec![
                (
                    self.config_dir.clone(),
                    "configuration (it holds the bot token)",
                ),
                (self.state_dir.clone(), "store"),
                (self.log_dir(), "log"),
            ],
        }
    }
}

impl RelayFiles {
    /// What the relay's file with this device and inode is, if it is one.
    fn identify(&self, dev: u64, ino: u64) -> Option<&'static str> {
        self.holders.iter().find_map(|(dir, what)| {
            let entries = std::fs::read_dir(dir).ok()?;
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| std::fs::symlink_metadata(entry.path()).ok())
                .any(|meta| meta.is_file() && meta.dev() == dev && meta.ino() == ino)
                .then_some(*what)
        })
    }
}

/// Opens `path` (absolute) for sending, if it may be sent: with every
/// symbolic link resolved it must lie under one of `roots` (the session's
/// working directory, `[files] send_from`), outside the relay's own
/// directories, and be a regular file of the effective user's that is none
/// of the relay's files under another name ([`RelayFiles`]).
///
/// The resolved path is then opened from the root it lies under without
/// following any link on the way ([`open_beneath`]), and the open
/// descriptor is what is checked and sent: a directory swapped for a link
/// between the resolution and the open is refused, never followed.
pub fn open_sendable(
    path: &Path,
    roots: &[PathBuf],
    relay: &RelayFiles,
) -> Result<Sendable, SendRefused> {
    let unreadable = |path: &Path, e: &io::Error| SendRefused::Unreadable {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let resolved = match std::fs::canonicalize(path) {
        Ok(resolved) => resolved,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(SendRefused::Missing {
                path: path.to_path_buf(),
            });
        }
        Err(e) => return Err(unreadable(path, &e)),
    };
    let root = root_of(&resolved, roots)?;
    let relay_file = relay
        .dirs
        .iter()
        .filter_map(|dir| std::fs::canonicalize(dir).ok())
        .any(|dir| resolved.starts_with(dir));
    if relay_file {
        return Err(SendRefused::RelayFile { path: resolved });
    }
    let file = open_resolved(&root, &resolved)?;
    let meta = file.metadata().map_err(|e| unreadable(&resolved, &e))?;
    if !meta.is_file() {
        return Err(SendRefused::NotAFile { path: resolved });
    }
    let me = euid();
    if meta.uid() != me {
        return Err(SendRefused::NotYours {
            path: resolved,
            owner: meta.uid(),
            me,
        });
    }
    if let Some(what) = relay.identify(meta.dev(), meta.ino()) {
        return Err(SendRefused::RelayFileLinked {
            path: resolved,
            what: what.into(),
        });
    }
    Ok(Sendable {
        file,
        len: meta.len(),
        path: resolved,
    })
}

/// The allowed root `resolved` lies under (the deepest, if several do);
/// roots that do not exist allow nothing.
fn root_of(resolved: &Path, roots: &[PathBuf]) -> Result<PathBuf, SendRefused> {
    let roots: Vec<PathBuf> = roots
        .iter()
        .filter_map(|root| std::fs::canonicalize(root).ok())
        .collect();
    if let Some(root) = roots
        .iter()
        .filter(|root| resolved.starts_with(root))
        .max_by_key(|root| root.as_os_str().len())
    {
        return Ok(root.clone());
    }
    let allowed = roots
        .iter()
        .map(|r| r.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    Err(SendRefused::Outside {
        path: resolved.to_path_buf(),
        allowed: if allowed.is_empty() {
            "every allowed folder (none exists)".into()
        } else {
            allowed
        },
    })
}

/// Opens `resolved` from `root` without following a link on the way: one
/// that appeared since the path was resolved is refused as a change.
fn open_resolved(root: &Path, resolved: &Path) -> Result<File, SendRefused> {
    let below = resolved.strip_prefix(root).unwrap_or(Path::new(""));
    open_dir(root)
        .and_then(|dir| {
            if below.as_os_str().is_empty() {
                // The root itself: a directory, refused later as such.
                Ok(dir)
            } else {
                open_beneath(&dir, below, sys::O_RDONLY | sys::O_NONBLOCK)
            }
        })
        .map_err(|e| match e.raw_os_error() {
            Some(sys::ELOOP | sys::ENOTDIR | sys::EXDEV) => SendRefused::Changed {
                path: resolved.to_path_buf(),
            },
            _ if e.kind() == io::ErrorKind::NotFound => SendRefused::Missing {
                path: resolved.to_path_buf(),
            },
            _ => SendRefused::Unreadable {
                path: resolved.to_path_buf(),
                message: e.to_string(),
            },
        })
}

/// Opens the directory at `path`, which has no symbolic link in it (a
/// resolved path), walking down from `/` without following one: if a link
/// appeared meanwhile, the open fails.
fn open_dir(path: &Path) -> io::Result<File> {
    let top = OpenOptions::new()
        .read(true)
        .custom_flags(sys::O_PATH | sys::O_DIRECTORY)
        .open("/")?;
    let below = path
        .strip_prefix("/")
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "not an absolute path"))?;
    if below.as_os_str().is_empty() {
        return Ok(top);
    }
    open_beneath(&top, below, sys::O_PATH | sys::O_DIRECTORY)
}

/// Opens `relative` beneath the directory `dir` with `flags`, following no
/// symbolic link on the way (nor at the end) and never leaving `dir`:
/// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (which implies no
/// magic links either), or, where the kernel lacks it (before Linux 5.6,
/// or a sandbox that refuses it), one `openat` per component with
/// `O_NOFOLLOW`. A link anywhere fails with `ELOOP` or `ENOTDIR`; `..`
/// and absolute paths are refused.
pub fn open_beneath(dir: &File, relative: &Path, flags: sys::c_int) -> io::Result<File> {
    use std::os::unix::ffi::OsStrExt;
    if relative.is_absolute()
        || relative
            .components()
            .any(|part| !matches!(part, Component::Normal(_)))
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "only a path of plain names can be opened beneath a directory",
        ));
    }
    let c_path = |part: &std::ffi::OsStr| {
        std::ffi::CString::new(part.as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a path"))
    };
    #[cfg(target_os = "linux")]
    match sys::openat2_beneath(dir, &c_path(relative.as_os_str())?, flags) {
        // ENOSYS: an older kernel; EPERM: a seccomp filter that does not
        // know the call (container runtimes did so for a while).
        Err(e) if matches!(e.raw_os_error(), Some(sys::ENOSYS | sys::EPERM)) => {}
        opened => return opened,
    }
    walk_beneath(dir, relative, flags)
}

/// [`open_beneath`] one component at a time: each directory on the way
/// opened with `O_NOFOLLOW | O_DIRECTORY` from the one before, the file
/// with `O_NOFOLLOW`.
fn walk_beneath(dir: &File, relative: &Path, flags: sys::c_int) -> io::Result<File> {
    use std::os::unix::ffi::OsStrExt;
    let parts: Vec<_> = relative.components().collect();
    let mut current: Option<File> = None;
    for (index, part) in parts.iter().enumerate() {
        let last = index + 1 == parts.len();
        let part_flags = if last {
            flags | sys::O_NOFOLLOW
        } else {
            sys::O_PATH | sys::O_DIRECTORY | sys::O_NOFOLLOW
        };
        let name = std::ffi::CString::new(part.as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a path"))?;
        current = Some(sys::openat(
            current.as_ref().unwrap_or(dir),
            &name,
            part_flags,
        )?);
    }
    current.ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "an empty path"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    fn set_mode(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// A uid nobody has, for files that must belong to someone else.
    const STRANGER: u32 = 54_321;

    fn root() -> bool {
        euid() == 0
    }

    #[test]
    fn home_override_puts_everything_under_one_folder() {
        let p = Paths::resolve(|k| (k == "AGENT_RELAY_HOME").then(|| PathBuf::from("/h"))).unwrap();
        assert_eq!(p.config_file(), PathBuf::from("/h/config/config.toml"));
        assert_eq!(p.bus_dir(BotId(42)), PathBuf::from("/h/run/42"));
        assert_eq!(
            p.store_file(BotId(42)),
            PathBuf::from("/h/state/42.sqlite3")
        );
        assert_eq!(p.roots, vec![PathBuf::from("/h")]);
    }

    #[test]
    fn only_regular_files_under_the_roots_may_be_sent_links_resolved() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("project");
        let secret = dir.path().join("secret");
        let relay = project.join("relay-config");
        for d in [&project, &secret, &relay] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(project.join("plot.png"), b"png").unwrap();
        std::fs::write(secret.join("id_rsa"), b"key").unwrap();
        std::fs::write(relay.join("config.toml"), b"token").unwrap();
        std::os::unix::fs::symlink(secret.join("id_rsa"), project.join("innocent.txt")).unwrap();
        std::os::unix::fs::symlink(&secret, project.join("docs")).unwrap();
        std::fs::create_dir(project.join("sub")).unwrap();
        let roots = [project.clone()];
        let forbidden = RelayFiles {
            dirs: vec![relay.clone()],
            holders: vec![(relay.clone(), "configuration")],
        };
        let open = |p: &Path| open_sendable(p, &roots, &forbidden);

        let sent = open(&project.join("sub/../plot.png")).unwrap();
        assert_eq!(sent.len, 3);
        assert_eq!(sent.path, project.join("plot.png").canonicalize().unwrap());
        for outside in [
            secret.join("id_rsa"),
            project.join("innocent.txt"),
            project.join("docs/id_rsa"),
            project.join("../secret/id_rsa"),
        ] {
            assert!(
                matches!(open(&outside), Err(SendRefused::Outside { .. })),
                "{outside:?}: {:?}",
                open(&outside)
            );
        }
        assert!(matches!(
            open(&relay.join("config.toml")),
            Err(SendRefused::RelayFile { .. })
        ));
        assert!(matches!(
            open(&project.join("nope.txt")),
            Err(SendRefused::Missing { .. })
        ));
        assert!(matches!(
            open(&project.join("sub")),
            Err(SendRefused::NotAFile { .. })
        ));
        // Allowed once the secret folder is configured.
        let more = [project.clone(), secret.clone()];
        assert!(open_sendable(&project.join("innocent.txt"), &more, &forbidden).is_ok());
        let refusal = open(&secret.join("id_rsa")).unwrap_err().to_string();
        assert!(refusal.contains("send_from"), "{refusal}");
    }

    /// A hard link has a path of its own: the relay's config, store and log
    /// are refused under any name, by device and inode.
    #[test]
    fn a_hard_link_to_the_relays_files_is_refused_by_identity() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join("home");
        let paths = Paths::under(&home);
        let project = dir.path().join("project");
        for d in [&paths.config_dir, &paths.log_dir(), &project] {
            std::fs::create_dir_all(d).unwrap();
        }
        let token = "bot_token = \"123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_\"\n";
        std::fs::write(paths.config_file(), token).unwrap();
        std::fs::write(paths.store_file(BotId(1)), b"SQLite format 3").unwrap();
        std::fs::write(paths.log_dir().join("agent-relay.log"), b"a log line").unwrap();
        let relay = paths.relay_files();
        let roots = [project.clone()];
        for (file, name, what) in [
            (paths.config_file(), "notes.txt", "configuration"),
            (paths.store_file(BotId(1)), "data.bin", "store"),
            (paths.log_dir().join("agent-relay.log"), "out.log", "log"),
        ] {
            std::fs::hard_link(&file, project.join(name)).unwrap();
            let refused = open_sendable(&project.join(name), &roots, &relay).unwrap_err();
            assert!(
                matches!(&refused, SendRefused::RelayFileLinked { what: w, .. } if w.starts_with(what)),
                "{name}: {refused:?}"
            );
            assert!(refused.to_string().contains("hard link"), "{refused}");
        }
        // A copy is a file of its own: the user's to send.
        std::fs::copy(paths.config_file(), project.join("copy.txt")).unwrap();
        assert!(open_sendable(&project.join("copy.txt"), &roots, &relay).is_ok());
    }

    /// A directory on the way swapped for a link to a secret folder, again
    /// and again, while the relay opens a file through it: the file opened
    /// is always the one under the root, never the secret. (The open with
    /// `O_NOFOLLOW` on the last component alone let about 1 in 7 escape.)
    #[test]
    fn a_directory_swapped_for_a_link_while_opening_never_escapes() {
        use std::io::Read;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("project");
        let secret = dir.path().join("secret");
        std::fs::create_dir_all(project.join("docs")).unwrap();
        std::fs::create_dir_all(&secret).unwrap();
        std::fs::write(project.join("docs/notes.txt"), b"harmless").unwrap();
        std::fs::write(secret.join("notes.txt"), b"SECRET").unwrap();
        std::os::unix::fs::symlink(&secret, project.join("swap")).unwrap();
        let relay = RelayFiles {
            dirs: vec![],
            holders: vec![],
        };
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let stop = stop.clone();
            let a = std::ffi::CString::new(project.join("docs").as_os_str().as_encoded_bytes())
                .unwrap();
            let b = std::ffi::CString::new(project.join("swap").as_os_str().as_encoded_bytes())
                .unwrap();
            std::thread::spawn(move || {
                let mut swaps = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: two valid NUL-terminated paths.
                    let rc = unsafe {
                        libc::renameat2(
                            libc::AT_FDCWD,
                            a.as_ptr(),
                            libc::AT_FDCWD,
                            b.as_ptr(),
                            libc::RENAME_EXCHANGE,
                        )
                    };
                    assert_eq!(rc, 0, "{}", io::Error::last_os_error());
                    swaps += 1;
                }
                swaps
            })
        };
        let (mut sent, mut refused, mut escaped) = (0, 0, 0);
        let tries = 3000;
        for _ in 0..tries {
            match open_sendable(
                &project.join("docs/notes.txt"),
                std::slice::from_ref(&project),
                &relay,
            ) {
                Ok(mut opened) => {
                    let mut text = String::new();
                    opened.file.read_to_string(&mut text).unwrap();
                    if text == "SECRET" {
                        escaped += 1;
                    } else {
                        sent += 1;
                    }
                }
                Err(_) => refused += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        println!(
            "{tries} opens under {swaps} swaps: {sent} sent the project's file, {refused} refused, {escaped} escaped"
        );
        assert_eq!(escaped, 0, "the secret was opened {escaped} times");
    }

    /// The component walk, which stands in where `openat2` is missing,
    /// refuses a link anywhere on the way, as `openat2` does.
    #[test]
    fn the_walk_beneath_a_directory_follows_no_link() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        std::fs::write(dir.path().join("a/b/f"), b"x").unwrap();
        std::os::unix::fs::symlink(dir.path().join("a/b"), dir.path().join("a/link")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("a/b/f"), dir.path().join("a/flink")).unwrap();
        let top = File::open(dir.path()).unwrap();
        for open in [walk_beneath, open_beneath] {
            assert!(open(&top, Path::new("a/b/f"), libc::O_RDONLY).is_ok());
            for linked in ["a/link/f", "a/flink"] {
                let error = open(&top, Path::new(linked), libc::O_RDONLY).unwrap_err();
                assert!(
                    matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)),
                    "{linked}: {error}"
                );
            }
        }
        for escaping in ["../x", "/etc/passwd", "a/../a/b/f"] {
            assert!(open_beneath(&top, Path::new(escaping), libc::O_RDONLY).is_err());
        }
    }

    #[test]
    fn a_relative_home_is_made_absolute() {
        let p =
            Paths::resolve(|k| (k == "AGENT_RELAY_HOME").then(|| PathBuf::from("rel"))).unwrap();
        assert!(p.config_dir.is_absolute(), "{p:?}");
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
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        std::fs::create_dir_all(&dir).unwrap();
        set_mode(&dir, 0o755);
        ensure_private_dir(&dir).unwrap();
        assert_eq!(mode(&dir), 0o700);
        // Created ones too, whatever the umask would have made them.
        let fresh = tmp.path().join("c/d");
        ensure_private_dir(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        assert_eq!(mode(&tmp.path().join("c")), 0o700);
    }

    #[test]
    fn a_home_creates_and_passes_and_comes_back_resolved() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        let paths = Paths::under(&home);
        assert!(paths.checked(Missing::Leave).is_ok());
        assert!(!home.exists(), "Leave creates nothing");
        let checked = paths.checked(Missing::Create).unwrap();
        for dir in [
            &home.join("config"),
            &home.join("state/logs"),
            &home.join("run"),
        ] {
            assert_eq!(mode(dir), 0o700, "{}", dir.display());
        }
        assert_eq!(
            checked.config_dir,
            std::fs::canonicalize(&home).unwrap().join("config")
        );
        checked.check_bot(BotId(9), Missing::Create).unwrap();
        assert_eq!(mode(&home.join("run/9")), 0o700);
    }

    #[test]
    fn group_or_other_write_on_an_own_directory_is_refused_with_the_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        Paths::under(&home).checked(Missing::Create).unwrap();
        set_mode(&home.join("run"), 0o770);
        let err = Paths::under(&home).checked(Missing::Create).unwrap_err();
        assert_eq!(err.path, std::fs::canonicalize(home.join("run")).unwrap());
        assert_eq!(err.reason, Distrust::Writable { mode: 0o770 });
        assert!(err.to_string().contains("chmod 700"), "{err}");
        assert_eq!(mode(&home.join("run")), 0o770, "refused, not repaired");
    }

    #[test]
    fn symlinks_are_refused_in_the_relays_own_part() {
        let tmp = tempfile::tempdir().unwrap();
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        set_mode(&elsewhere, 0o700);
        // The home itself a link…
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
        let err = Paths::under(&link).checked(Missing::Create).unwrap_err();
        assert_eq!(err.reason, Distrust::Symlink, "{err}");
        // …or a directory in it.
        let home = tmp.path().join("home");
        std::fs::create_dir(&home).unwrap();
        std::os::unix::fs::symlink(&elsewhere, home.join("run")).unwrap();
        let err = Paths::under(&home).checked(Missing::Leave).unwrap_err();
        assert_eq!(err.reason, Distrust::Symlink, "{err}");
        assert!(err.path.ends_with("home/run"), "{err}");
    }

    #[test]
    fn a_symlinked_ancestor_is_resolved_and_the_real_path_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let alias = tmp.path().join("alias");
        std::os::unix::fs::symlink(&real, &alias).unwrap();
        let checked = Paths::under(&alias.join("home"))
            .checked(Missing::Create)
            .unwrap();
        assert!(
            checked
                .config_dir
                .starts_with(std::fs::canonicalize(&real).unwrap()),
            "{checked:?}"
        );
    }

    #[test]
    fn ancestors_writable_by_others_pass_only_when_sticky_and_the_next_is_ours() {
        let tmp = tempfile::tempdir().unwrap();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        set_mode(&open, 0o777);
        let err = ensure_private_dir(&open.join("relay")).unwrap_err();
        assert_eq!(err.reason, Distrust::Writable { mode: 0o777 }, "{err}");
        assert!(err.to_string().contains("AGENT_RELAY_HOME"), "{err}");

        set_mode(&open, 0o1777);
        ensure_private_dir(&open.join("relay")).unwrap();
        assert_eq!(mode(&open.join("relay")), 0o700);
    }

    #[test]
    fn a_directory_of_another_uid_is_refused_as_own_ancestor_or_in_a_sticky_dir() {
        if !root() {
            eprintln!("skipped: making a directory of another uid needs root (CI runs as root)");
            return;
        }
        let chown = |path: &Path| std::os::unix::fs::chown(path, Some(STRANGER), None).unwrap();
        let tmp = tempfile::tempdir().unwrap();
        // Own: the bus directory another uid made.
        let home = tmp.path().join("home");
        Paths::under(&home).checked(Missing::Create).unwrap();
        std::fs::create_dir(home.join("run/5")).unwrap();
        chown(&home.join("run/5"));
        let err = Paths::under(&home)
            .check_bot(BotId(5), Missing::Create)
            .unwrap_err();
        assert_eq!(
            err.reason,
            Distrust::Owner {
                owner: STRANGER,
                me: 0
            }
        );
        assert!(
            err.to_string().ends_with(
                "is owned by uid 54321, not you (uid 0): remove it or set AGENT_RELAY_HOME to a directory you own"
            ),
            "{err}"
        );
        // Shared: another uid was first in a sticky directory.
        let shared = tmp.path().join("shared");
        std::fs::create_dir(&shared).unwrap();
        set_mode(&shared, 0o1777);
        std::fs::create_dir(shared.join("agent-relay-0")).unwrap();
        chown(&shared.join("agent-relay-0"));
        let err = ensure_private_dir(&shared.join("agent-relay-0")).unwrap_err();
        assert!(
            matches!(
                err.reason,
                Distrust::Owner {
                    owner: STRANGER,
                    ..
                }
            ),
            "{err}"
        );
        // Ancestor: a parent of another (non-root) uid.
        let theirs = tmp.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        chown(&theirs);
        let err = ensure_private_dir(&theirs.join("relay")).unwrap_err();
        assert_eq!(err.path, std::fs::canonicalize(&theirs).unwrap());
        assert!(!theirs.join("relay").exists(), "nothing created under it");
    }

    #[test]
    fn files_are_created_0600_and_planted_ones_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ensure_private_dir(&tmp.path().join("d")).unwrap();
        // Loose modes of an old file of ours are tightened.
        let lock = dir.join("bus.lock");
        std::fs::write(&lock, "").unwrap();
        set_mode(&lock, 0o666);
        open_private_rw(&lock).unwrap();
        assert_eq!(mode(&lock), 0o600);
        let fresh = dir.join("fresh");
        create_private_file(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o600);
        assert!(create_private_file(&fresh).is_err(), "never reused");

        // A symlink is neither followed for reading nor for writing.
        let target = dir.join("target");
        std::fs::write(&target, "x").unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for err in [
            open_private_file(&link).unwrap_err(),
            open_private_rw(&link).unwrap_err(),
            create_private_file(&link).unwrap_err(),
        ] {
            assert!(
                matches!(err.reason, Distrust::Symlink | Distrust::Io(_)),
                "{err}"
            );
        }
        assert_eq!(
            check_private_file(&link).unwrap_err().reason,
            Distrust::Symlink
        );

        // A config others may write is refused, not repaired.
        let config = dir.join("config.toml");
        std::fs::write(&config, "").unwrap();
        set_mode(&config, 0o620);
        let err = open_private_file(&config).unwrap_err();
        assert_eq!(err.reason, Distrust::Writable { mode: 0o620 });
        assert!(err.to_string().contains("chmod 600"), "{err}");
        assert_eq!(mode(&config), 0o620);
        assert!(open_private_file(&dir.join("absent")).unwrap().is_none());

        // A FIFO does not hang the open.
        let fifo = dir.join("fifo");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        assert_eq!(
            open_private_file(&fifo).unwrap_err().reason,
            Distrust::NotAFile
        );

        if root() {
            std::os::unix::fs::chown(&config, Some(STRANGER), None).unwrap();
            set_mode(&config, 0o600);
            let err = open_private_file(&config).unwrap_err();
            assert!(
                matches!(
                    err.reason,
                    Distrust::Owner {
                        owner: STRANGER,
                        ..
                    }
                ),
                "{err}"
            );
        }
    }

    /// A private directory for a file test, and its temporary home.
    fn private_dir() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = ensure_private_dir(&tmp.path().join("d")).unwrap();
        (tmp, dir)
    }

    #[test]
    fn a_replaced_file_has_the_new_bytes_the_callers_mode_and_no_temp_beside_it() {
        let (_tmp, dir) = private_dir();
        let path = dir.join("leader.json");
        replace_file(&path, b"first", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        assert_eq!(mode(&path), 0o600);
        replace_file(&path, b"second", 0o664).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert_eq!(mode(&path), 0o664, "the caller's mode, not the umask's");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["leader.json"], "no temp file is left");
    }

    #[test]
    fn a_stale_temp_file_is_removed_and_a_planted_link_never_written_through() {
        let (tmp, dir) = private_dir();
        let path = dir.join("config.toml");
        let temp = temp_file_for(&path);
        assert_eq!(temp.parent(), Some(dir.as_path()), "beside the file");
        std::fs::write(&temp, "left by a dead process").unwrap();
        replace_file(&path, b"new", 0o600).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        assert!(!temp.exists());

        let target = tmp.path().join("elsewhere");
        std::fs::write(&target, "theirs").unwrap();
        std::os::unix::fs::symlink(&target, &temp).unwrap();
        replace_file(&path, b"newer", 0o600).unwrap();
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "theirs");
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file());
        assert_eq!(std::fs::read(&path).unwrap(), b"newer");
    }

    #[test]
    fn a_failed_replace_leaves_what_was_there_and_no_temp() {
        let (_tmp, dir) = private_dir();
        // A directory with something in it where the file goes: the rename
        // fails after the temp file was written.
        let blocked = dir.join("settings.json");
        std::fs::create_dir(&blocked).unwrap();
        std::fs::write(blocked.join("inside"), "x").unwrap();
        assert!(replace_file(&blocked, b"new", 0o600).is_err());
        assert!(!temp_file_for(&blocked).exists());
        assert_eq!(std::fs::read(blocked.join("inside")).unwrap(), b"x");
    }

    #[test]
    fn fixes_quote_paths_for_the_shell() {
        assert_eq!(shell_quote("/a/b-c.d"), "/a/b-c.d");
        assert_eq!(shell_quote("/a b/it's"), r"'/a b/it'\''s'");
        assert_eq!(shell_quote("$(rm -rf ~)"), "'$(rm -rf ~)'");
        assert_eq!(shell_quote(""), "''");
    }
}

//! Every call into the C library, each behind a safe function: who we
//! are (`euid`, `egid`, the host name), the umask, signals to a process
//! or its group, what a child does between fork and exec (its umask, its
//! death with the parent), the terminal's mode, and the two `openat`
//! calls that open a file beneath a directory without following a link.
//!
//! The crate names `libc` nowhere else (`tests/tidy.rs`), so every
//! `unsafe` of the crate is here, with its reason beside it. The constants
//! the rest passes to the standard library (open flags, error numbers,
//! signal numbers) are re-exported from here for the same reason.

use std::ffi::CStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};

pub use libc::{
    ELOOP, ENOSYS, ENOTDIR, EPERM, EXDEV, O_DIRECTORY, O_NOFOLLOW, O_NONBLOCK, O_PATH, O_RDONLY,
    S_ISVTX, SIGCONT, SIGHUP, SIGINT, SIGKILL, SIGTERM, c_int,
};

/// The effective uid: the only owner the relay trusts besides root (for
/// ancestors).
pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// The effective gid.
pub fn egid() -> u32 {
    // SAFETY: getegid has no preconditions and cannot fail.
    unsafe { libc::getegid() }
}

/// Sets this process's umask; the one it replaces.
pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: umask has no preconditions and cannot fail.
    (unsafe { libc::umask(mask as libc::mode_t) }) as u32
}

/// This machine's host name, if the system tells it.
pub fn host_name() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname writes at
    // most that many bytes and we read only up to the first NUL.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8(buf[..end].to_vec()).ok()
}

/// Sends `signal` to the process `pid` (a child of ours, not reaped yet);
/// false when it is gone, or `pid` names no single process.
pub fn signal(pid: u32, signal: c_int) -> bool {
    let Some(pid) = one_process(pid) else {
        return false;
    };
    // SAFETY: kill(2) has no memory effects.
    unsafe { libc::kill(pid, signal) == 0 }
}

/// Sends `signal` to the process group `leader` leads (a child of ours
/// spawned with `process_group(0)`: the agent and what it started).
/// False when the group is gone, or `leader` names no single process.
pub fn signal_group(leader: u32, signal: c_int) -> bool {
    let Some(group) = one_process(leader) else {
        return false;
    };
    // SAFETY: killpg(2) has no memory effects; the group is the child's
    // own, so nothing else is hit.
    unsafe { libc::killpg(group, signal) == 0 }
}

/// A pid that names one process: not 0 (our group), not negative (a
/// group), not -1 (everything we may signal).
fn one_process(pid: u32) -> Option<i32> {
    i32::try_from(pid).ok().filter(|pid| *pid > 0)
}

/// Whether a process `pid` exists (ours or another user's).
pub fn exists(pid: u32) -> bool {
    let Some(pid) = one_process(pid) else {
        return false;
    };
    // SAFETY: kill(2) with signal 0 only asks whether the process exists.
    let asked = unsafe { libc::kill(pid, 0) };
    asked == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// The child `command` spawns gets `SIGTERM` when this process dies
/// (Linux): the thread that forks must live as long as the process (a
/// current-thread runtime's, or a wrapper's main thread).
pub fn dies_with_parent(command: &mut tokio::process::Command) {
    // SAFETY: prctl(2) is async-signal-safe and touches only the child.
    unsafe {
        command.pre_exec(|| {
            #[cfg(target_os = "linux")]
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The child `command` spawns starts a session of its own: out of reach of
/// the signals sent to this process's group (a host ending its children).
pub fn own_session(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid(2) is async-signal-safe and touches nothing of the
    // parent's.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The child `command` spawns starts with `mask` as its umask.
pub fn with_umask(command: &mut tokio::process::Command, mask: u32) {
    let mask = mask as libc::mode_t;
    // SAFETY: umask(2) is async-signal-safe and touches only the child.
    unsafe {
        command.pre_exec(move || {
            libc::umask(mask);
            Ok(())
        });
    }
}

/// The mode of the terminal on stdin, saved to be put back.
#[derive(Clone, Copy)]
pub struct TerminalMode(libc::termios);

impl TerminalMode {
    /// The terminal's mode now; `None` when stdin is no terminal.
    pub fn save() -> Option<Self> {
        // SAFETY: termios is plain data, all-zero a valid value of it;
        // tcgetattr(3) fills it or fails (stdin no terminal).
        unsafe {
            let mut termios = std::mem::zeroed::<libc::termios>();
            (libc::tcgetattr(libc::STDIN_FILENO, &mut termios) == 0).then_some(Self(termios))
        }
    }

    /// This mode without echo, line editing or signals: each key as it is
    /// typed.
    pub fn raw(self) -> Self {
        let mut raw = self.0;
        raw.c_lflag &= !(libc::ECHO | libc::ICANON | libc::ISIG);
        raw.c_cc[libc::VMIN] = 1;
        raw.c_cc[libc::VTIME] = 0;
        Self(raw)
    }

    /// Puts the terminal on stdin in this mode.
    pub fn apply(&self) {
        // SAFETY: fd 0 and a valid termios.
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &self.0) };
    }
}

/// Whether stdout is a terminal.
pub fn stdout_is_terminal() -> bool {
    // SAFETY: isatty(3) only asks.
    unsafe { libc::isatty(libc::STDOUT_FILENO) == 1 }
}

/// `openat(2)` of `name` (one component) in `dir` with `flags` (and
/// `O_CLOEXEC`).
pub fn openat(dir: &File, name: &CStr, flags: c_int) -> io::Result<File> {
    // SAFETY: the descriptor is open and borrowed for the call, `name` a
    // NUL-terminated string that outlives it.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `openat2(2)` of `path` beneath `dir` with `flags` (and `O_CLOEXEC`),
/// following no symbolic link (nor magic link) and never leaving `dir`.
/// `ENOSYS` (before Linux 5.6) or `EPERM` (a seccomp filter that does not
/// know the call) where the kernel will not.
#[cfg(target_os = "linux")]
pub fn openat2_beneath(dir: &File, path: &CStr, flags: c_int) -> io::Result<File> {
    // SAFETY: open_how is plain data; all-zero is its "nothing set".
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: the descriptor and the string are valid for the call, `how`
    // is an initialised open_how and its size is passed with it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("openat2 returned no descriptor"))?;
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_pid_that_names_a_group_or_everything_is_signalled() {
        for pid in [0, u32::MAX, 1 << 31] {
            assert!(!signal(pid, 0), "{pid}");
            assert!(!signal_group(pid, 0), "{pid}");
            assert!(!exists(pid), "{pid}");
        }
        assert!(exists(std::process::id()));
        // No process has pid 2^22 + 1 (above Linux's pid_max).
        assert!(!exists(4_194_305));
    }

    #[test]
    fn the_host_name_is_the_systems() {
        let name = host_name().expect("a host name");
        assert!(!name.is_empty() && !name.contains('\0'), "{name:?}");
    }
}

//! What ends an agent's whole process group when `serve` cannot (issue
//! 37): `serve` killed outright (`SIGKILL`, the OOM killer) ends nothing
//! itself, and the kernel's death signal (`PR_SET_PDEATHSIG`, Linux) reaches
//! only its direct children — the agents — never what they started (a
//! command's `sleep`, a language server, pi's sidecar). So `serve` starts
//! one **watcher** beside it: `agent-relay serve-watcher`, in a process
//! group of its own (a Ctrl-C at `serve`'s terminal is `serve`'s to handle),
//! which reads the groups to watch on its stdin (`+<pgid>`, `-<pgid>`, one
//! a line) and, once that pipe closes — `serve` gone, however it went —
//! ends each group still there: `SIGTERM`, up to [`TERM`] to leave, then
//! `SIGKILL`. It holds none of `serve`'s files (every descriptor is opened
//! close-on-exec), so no lock outlives `serve` with it.
//!
//! While `serve` runs it ends each agent's group itself (`child.rs`) and
//! tells the watcher to forget it; a watcher that died is started again at
//! the next change, told every group anew.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use crate::sys;

/// How long the groups have to leave after `SIGTERM`.
pub const TERM: Duration = Duration::from_secs(5);
/// How often the watcher looks whether they left.
const LOOK_EVERY: Duration = Duration::from_millis(50);

/// `serve`'s end of its watcher.
struct Watcher {
    groups: BTreeSet<u32>,
    process: Option<(Child, ChildStdin)>,
}

static WATCHER: OnceLock<Mutex<Watcher>> = OnceLock::new();

/// Starts this process's watcher: from now on the groups of the agents it
/// spawns are ended even if it is killed. `serve` calls it once.
pub fn start() {
    let watcher = WATCHER.get_or_init(|| {
        Mutex::new(Watcher {
            groups: BTreeSet::new(),
            process: None,
        })
    });
    watcher
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .tell(None);
}

/// Watches the process group `pgid` (an agent just spawned).
pub(super) fn watch(pgid: u32) {
    change(pgid, true);
}

/// Forgets `pgid` (the group is gone).
pub(super) fn forget(pgid: u32) {
    change(pgid, false);
}

fn change(pgid: u32, add: bool) {
    let Some(watcher) = WATCHER.get() else {
        return;
    };
    let mut watcher = watcher.lock().unwrap_or_else(PoisonError::into_inner);
    let changed = if add {
        watcher.groups.insert(pgid)
    } else {
        watcher.groups.remove(&pgid)
    };
    if changed {
        watcher.tell(Some(line(pgid, add)));
    }
}

/// One line of what the watcher reads.
fn line(pgid: u32, add: bool) -> String {
    format!("{}{pgid}\n", if add { '+' } else { '-' })
}

impl Watcher {
    /// Writes `line` to the watcher; one that is gone (or none yet) is
    /// started and told every group.
    fn tell(&mut self, change: Option<String>) {
        if let (Some((child, stdin)), Some(change)) = (self.process.as_mut(), &change) {
            let alive = matches!(child.try_wait(), Ok(None));
            if alive && stdin.write_all(change.as_bytes()).is_ok() {
                return;
            }
        }
        if let Some((mut child, stdin)) = self.process.take() {
            drop(stdin);
            let _ = child.kill();
            let _ = child.wait();
        }
        match spawn() {
            Ok((child, mut stdin)) => {
                let all: String = self.groups.iter().map(|g| line(*g, true)).collect();
                if let Err(e) = stdin.write_all(all.as_bytes()) {
                    tracing::warn!("cannot tell the agents' watcher their groups: {e}");
                }
                self.process = Some((child, stdin));
            }
            Err(e) => tracing::warn!(
                "cannot start the agents' watcher: {e}; if agent-relay serve is killed, what its agents started may live on"
            ),
        }
    }
}

/// `agent-relay serve-watcher`, in a process group of its own.
fn spawn() -> std::io::Result<(Child, ChildStdin)> {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(own_binary()?)
        .arg("serve-watcher")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("no pipe to the watcher"))?;
    Ok((child, stdin))
}

/// This program: on Linux the running binary even if an upgrade replaced
/// its file meanwhile.
fn own_binary() -> std::io::Result<std::path::PathBuf> {
    if cfg!(target_os = "linux") {
        Ok("/proc/self/exe".into())
    } else {
        std::env::current_exe()
    }
}

/// The watcher's life (`agent-relay serve-watcher`): groups from stdin
/// until it closes, then each one still there ended.
pub fn run() -> ExitCode {
    let mut groups = BTreeSet::new();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        read(&line, &mut groups);
    }
    end_groups(&groups, TERM);
    ExitCode::SUCCESS
}

/// Applies one line (`+<pgid>` or `-<pgid>`); anything else is ignored.
fn read(line: &str, groups: &mut BTreeSet<u32>) {
    let (add, pgid) = match line.trim().split_at_checked(1) {
        Some(("+", pgid)) => (true, pgid),
        Some(("-", pgid)) => (false, pgid),
        _ => return,
    };
    let Ok(pgid) = pgid.parse::<u32>() else {
        return;
    };
    if add {
        groups.insert(pgid);
    } else {
        groups.remove(&pgid);
    }
}

/// `SIGTERM` to every group, up to `term` for them to leave, then
/// `SIGKILL` to what is left.
fn end_groups(groups: &BTreeSet<u32>, term: Duration) {
    let alive = |g: &&u32| sys::signal_group(**g, 0);
    for group in groups.iter().filter(alive) {
        sys::signal_group(*group, sys::SIGTERM);
    }
    let until = Instant::now() + term;
    while Instant::now() < until && groups.iter().any(|g| alive(&g)) {
        std::thread::sleep(LOOK_EVERY);
    }
    for group in groups.iter().filter(alive) {
        sys::signal_group(*group, sys::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watcher_reads_groups_added_and_forgotten_and_nothing_else() {
        let mut groups = BTreeSet::new();
        for l in ["+12", "+34", "-12", "+", "12", "+x", "-99", " +56 ", "+-1"] {
            read(l, &mut groups);
        }
        assert_eq!(groups.into_iter().collect::<Vec<_>>(), [34, 56]);
        assert_eq!(line(7, true), "+7\n");
        assert_eq!(line(7, false), "-7\n");
    }

    #[test]
    fn a_group_that_ignores_sigterm_is_killed() {
        use std::os::unix::process::CommandExt;
        // A group whose leader ignores SIGTERM and whose member is a child.
        // It says when it ignores SIGTERM and has its child, so the test
        // ends a group that needs SIGKILL, not one still starting.
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("ready");
        let mut leader = Command::new("/bin/sh")
            .args(["-c", "trap '' TERM; sleep 600 & : > \"$1\"; wait", "sh"])
            .arg(&ready)
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = leader.id();
        let started = Instant::now();
        while !ready.exists() && started.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(LOOK_EVERY);
        }
        assert!(ready.exists(), "the group started");
        end_groups(&BTreeSet::from([pgid]), Duration::from_millis(300));
        leader.wait().unwrap();
        // The orphaned `sleep`, killed, is a zombie until init reaps it, and
        // a zombie still answers signal 0: its reaping is not ours to time.
        let killed = Instant::now();
        while sys::signal_group(pgid, 0) && killed.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(LOOK_EVERY);
        }
        assert!(!sys::signal_group(pgid, 0), "nothing of the group is left");
    }
}

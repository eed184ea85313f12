//! When the last relay process of a bot goes away with messages still to
//! go (docs/DESIGN.md, *Outbound*): the answer Claude Code's `-p` handed
//! over the moment before it exits, a notice, the closing of a question.
//! They are in the store already; what is missing is a leader to send
//! them. So a leader that leaves for good while no other session is on
//! the bus starts a *drain*: `agent-relay drain`, a process of its own in
//! a session of its own (the host's signals to its process group do not
//! reach it), which waits for the lock, leads until nothing it can send
//! is left or [`DRAIN_FOR`] passed, and exits. A session that starts
//! meanwhile registers with the drain as with any leader and takes over
//! when it leaves.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::{Leader, LeaderError};
use crate::bus::election::BusDir;
use crate::config::Config;
use crate::paths::Paths;

/// How long a drain leads at most.
pub const DRAIN_FOR: Duration = Duration::from_secs(120);
/// How long a drain waits for the lock while messages still wait: its
/// parent holds the lock for a moment yet, and another session may lead
/// and leave. Once nothing waits, it ends at once.
const LOCK_WAIT: Duration = Duration::from_secs(10);
/// How often a drain looks whether it is done.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drained {
    /// Another process leads: it sends what waits.
    Led,
    /// Everything that could go went.
    Done,
    /// [`DRAIN_FOR`] passed with this many messages still waiting (the next
    /// relay process sends them).
    TimedOut(usize),
    /// The relay's folder is gone (removed with its home): nothing to
    /// send for any more.
    Removed,
}

/// Starts `agent-relay drain` for this leader's bot: detached (a session of
/// its own, no terminal, no pipes), with this process's environment.
pub(super) fn spawn(leader: &Leader) {
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => {
            tracing::error!(
                "cannot start a drain: {e}; what waits goes with the next relay process"
            );
            return;
        }
    };
    match detached(exe) {
        Ok(pid) => tracing::info!(
            pid,
            waiting = leader.courier.sendable(),
            "the last session leaves with messages still to go: a drain sends them"
        ),
        Err(e) => tracing::error!(
            "cannot start a drain: {e}; what waits goes with the next relay process"
        ),
    }
}

fn detached(exe: PathBuf) -> std::io::Result<u32> {
    use std::process::{Command, Stdio};
    let mut command = Command::new(exe);
    command
        .arg("drain")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // Out of reach of the signals sent to the host's process group.
    crate::sys::own_session(&mut command);
    let child = command.spawn()?;
    // Not waited for: when this process exits first, init reaps it.
    Ok(child.id())
}

/// `agent-relay drain`: waits for the lock, leads until nothing that can go
/// waits (or [`DRAIN_FOR`]), steps down.
pub(crate) async fn drain(paths: &Paths, config: &Config) -> Result<Drained, LeaderError> {
    let Some(bot) = config.bot_id() else {
        return Ok(Drained::Done);
    };
    let bus = BusDir::open_checked(paths.bus_dir(bot))
        .map_err(|e| LeaderError::Bind(std::io::Error::other(e.to_string())))?;
    let store = paths.store_file(bot);
    let give_up = tokio::time::Instant::now() + LOCK_WAIT;
    let lock = loop {
        if let Some(lock) = bus.try_lock().map_err(LeaderError::Bind)? {
            break lock;
        }
        // Another process leads: once it sent everything, nothing is left
        // to a drain.
        let waiting = crate::store::Store::open_read_only(&store)
            .and_then(|s| s.posts_due())
            .map_or(1, |due| due.len());
        if waiting == 0 || tokio::time::Instant::now() >= give_up {
            return Ok(Drained::Led);
        }
        tokio::time::sleep(CHECK_EVERY).await;
    };
    let instance = format!("drain-{}", uuid::Uuid::new_v4().simple());
    let handle = super::start_with(lock, paths, instance, config, true).await?;
    let leader: Arc<Leader> = handle.leader.clone();
    let until = tokio::time::Instant::now() + DRAIN_FOR;
    let drained = loop {
        if !bus.path().exists() {
            break Drained::Removed;
        }
        let waiting = leader.courier.sendable();
        if waiting == 0 {
            break Drained::Done;
        }
        if tokio::time::Instant::now() >= until || !handle.is_running() {
            break Drained::TimedOut(waiting);
        }
        tokio::time::sleep(CHECK_EVERY).await;
    };
    handle.stop().await;
    Ok(drained)
}

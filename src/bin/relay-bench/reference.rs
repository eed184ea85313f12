//! Same-run references: what the machine itself does for the operations a
//! figure is built from, so a figure reads as "x times the floor" on any
//! machine. Blocking std I/O on threads: no runtime in the way.

use std::fs::File;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use crate::world::TempHome;

/// A line about as long as a relayed delivery frame.
fn frame() -> Vec<u8> {
    let mut line = vec![b'x'; 200];
    line.push(b'\n');
    line
}

/// An echo server on a fresh socket: every line comes back.
fn echo_server(dir: &Path) -> anyhow::Result<UnixStream> {
    let path = dir.join("echo.sock");
    let listener =
        UnixListener::bind(&path).with_context(|| format!("binding {}", path.display()))?;
    std::thread::spawn(move || {
        let Ok((stream, _)) = listener.accept() else {
            return;
        };
        let Ok(mut out) = stream.try_clone() else {
            return;
        };
        let mut lines = BufReader::new(stream);
        let mut line = Vec::new();
        while matches!(lines.read_until(b'\n', &mut line), Ok(n) if n > 0) {
            if out.write_all(&line).is_err() {
                break;
            }
            line.clear();
        }
    });
    Ok(UnixStream::connect(&path)?)
}

/// Round trips of one line through a unix-socket echo, one at a time.
pub fn echo_rtt(round_trips: usize) -> anyhow::Result<Vec<Duration>> {
    let dir = TempHome::new("echo")?;
    let stream = echo_server(dir.path())?;
    let mut out = stream.try_clone()?;
    let mut back = BufReader::new(stream);
    let frame = frame();
    let mut line = Vec::new();
    let mut samples = Vec::with_capacity(round_trips);
    // The first few warm the caches and the scheduler.
    for i in 0..round_trips + 100 {
        let start = Instant::now();
        out.write_all(&frame)?;
        line.clear();
        if back.read_until(b'\n', &mut line)? == 0 {
            bail!("the echo server went away");
        }
        if i >= 100 {
            samples.push(start.elapsed());
        }
    }
    Ok(samples)
}

/// Lines per second through a unix-socket echo, pipelined.
pub fn echo_throughput(lines: usize) -> anyhow::Result<(u64, Duration)> {
    let dir = TempHome::new("echo")?;
    let stream = echo_server(dir.path())?;
    let mut out = stream.try_clone()?;
    let frame = frame();
    let start = Instant::now();
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut batch = Vec::with_capacity(frame.len() * 64);
        for _ in 0..lines / 64 {
            batch.clear();
            for _ in 0..64 {
                batch.extend_from_slice(&frame);
            }
            out.write_all(&batch)?;
        }
        Ok(())
    });
    let expected = lines / 64 * 64;
    let mut back = BufReader::new(stream);
    let mut line = Vec::new();
    for _ in 0..expected {
        line.clear();
        if back.read_until(b'\n', &mut line)? == 0 {
            bail!("the echo server went away");
        }
    }
    let elapsed = start.elapsed();
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("echo writer panicked"))??;
    Ok((expected as u64, elapsed))
}

/// The floor under failover: a process holding a flock is SIGKILLed; a
/// waiter blocked on the same lock takes it, binds a fresh socket and
/// connects to it. Measured from the kill to the connection.
pub fn flock_handover(trials: usize) -> anyhow::Result<Vec<Duration>> {
    let dir = TempHome::new("flock")?;
    let lock_path = dir.path().join("bus.lock");
    let socket_path = dir.path().join("bus.sock");
    let mut samples = Vec::with_capacity(trials);
    for _ in 0..trials {
        let held = File::create(&lock_path)?;
        flock(&held)?;
        // The lock lives in the open file description, which the child
        // inherits as its stdin: it holds the lock once ours is closed.
        let mut holder = Holder(
            Command::new("sleep")
                .arg("600")
                .stdin(Stdio::from(held))
                .stdout(Stdio::null())
                .spawn()
                .context("spawning `sleep` to hold the lock")?,
        );
        let waiter = {
            let lock_path = lock_path.clone();
            let socket_path = socket_path.clone();
            std::thread::spawn(
                move || -> anyhow::Result<(Instant, File, UnixListener, UnixStream)> {
                    let file = File::options().write(true).open(&lock_path)?;
                    flock(&file)?;
                    let _ = std::fs::remove_file(&socket_path);
                    let listener = UnixListener::bind(&socket_path)?;
                    let stream = UnixStream::connect(&socket_path)?;
                    Ok((Instant::now(), file, listener, stream))
                },
            )
        };
        // Give the waiter time to block on the lock; the floor we want is
        // the wake-up, not the thread start.
        std::thread::sleep(Duration::from_millis(20));
        let killed = Instant::now();
        holder.0.kill()?;
        let done = waiter
            .join()
            .map_err(|_| anyhow::anyhow!("lock waiter panicked"))?;
        let (connected, ..) = done?;
        samples.push(connected.saturating_duration_since(killed));
    }
    Ok(samples)
}

/// The lock holder; killed and reaped however the trial ends.
struct Holder(std::process::Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn flock(file: &File) -> anyhow::Result<()> {
    // SAFETY: flock(2) on a descriptor we own for the duration of the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    if rc != 0 {
        bail!("flock: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// `node -e ''`: spawn to exit.
pub fn node_start(runs: usize) -> anyhow::Result<Vec<Duration>> {
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        let status = Command::new("node")
            .args(["-e", ""])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .context("running `node -e ''` (is Node.js installed?)")?;
        samples.push(start.elapsed());
        if !status.success() {
            bail!("`node -e ''` failed: {status}");
        }
    }
    Ok(samples)
}

/// An idle Node.js process, as a host extension written in JavaScript
/// would sit; killed on drop.
pub struct IdleNode {
    child: tokio::process::Child,
}

impl IdleNode {
    pub fn spawn() -> anyhow::Result<IdleNode> {
        let child = tokio::process::Command::new("node")
            .args(["-e", "setInterval(()=>{},1e3)"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("running `node` (is Node.js installed?)")?;
        Ok(IdleNode { child })
    }

    pub fn rss_kib(&self) -> anyhow::Result<u64> {
        let pid = self.child.id().context("node exited")?;
        crate::host::rss_kib(pid)
    }
}

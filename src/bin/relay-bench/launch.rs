//! Sessions the relay launches, with the real pi: `/new` → first answer
//! beside pi alone doing the same work, and `serve` SIGKILLed and started
//! again with launched sessions. Measured by `tests/pi/bench.mjs` in the
//! world of the pi end-to-end tests (fake Bot API, fake model, real pi,
//! `agent-relay serve`); this module runs it and turns its samples into
//! the table's measures.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Deserialize;

use crate::report::Measure;
use crate::stats::Summary;

/// How long the whole script may take: pi starts a few dozen times.
const SCRIPT: Duration = Duration::from_secs(30 * 60);

/// The pi end-to-end tests' folder, where the script and pi live.
fn tests_pi() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("pi")
}

/// One step of a launch, each sample measured from `/new` injected (or,
/// for pi alone, from its spawn).
#[derive(Debug, Deserialize)]
pub struct Point {
    pub name: String,
    pub how: String,
    ms: Vec<f64>,
}

impl Point {
    pub fn measure(&self) -> Measure {
        latency_ms(&self.ms, "not seen")
    }
}

/// `/new` → first answer, with pi alone in the same run.
#[derive(Debug, Deserialize)]
pub struct Launches {
    total_ms: Vec<f64>,
    alone_ms: Vec<f64>,
    /// Each trial's total minus the pi alone run just before it.
    share_ms: Vec<f64>,
    /// Each trial's steps that are the relay's alone (`tests/pi/bench.mjs`).
    own_ms: Vec<f64>,
    pub points: Vec<Point>,
    pub alone_points: Vec<Point>,
}

impl Launches {
    pub fn total(&self) -> Measure {
        latency_ms(&self.total_ms, "no trial")
    }

    pub fn alone(&self) -> Measure {
        latency_ms(&self.alone_ms, "no trial")
    }

    /// The relay's share: may be below zero in a trial where pi alone was
    /// the slower, which the median weighs as it should.
    pub fn share(&self) -> Measure {
        Summary::of_ms(&self.share_ms).map_or_else(|| Measure::na("no trial"), Measure::Latency)
    }

    /// The relay's own steps, with nothing of pi's start-up in them (its
    /// extension's loading aside): a floor under the share that pi's
    /// start-up time does not blur.
    pub fn own_steps(&self) -> Measure {
        Summary::of_ms(&self.own_ms).map_or_else(|| Measure::na("no trial"), Measure::Latency)
    }
}

/// `serve` restarted with `sessions` launched sessions.
#[derive(Debug, Deserialize)]
pub struct Restart {
    pub sessions: usize,
    /// Per session: its sidecar joined again → the message typed while
    /// `serve` was down answered in its topic.
    joined_to_answer_ms: Vec<f64>,
    /// Per session: `serve` started again → that answer.
    serve_to_answer_ms: Vec<f64>,
    /// A message → its answer, `serve` never killed.
    reference_ms: Vec<f64>,
}

impl Restart {
    pub fn joined_to_answer(&self) -> Measure {
        latency_ms(&self.joined_to_answer_ms, "no session joined")
    }

    pub fn serve_to_answer(&self) -> Measure {
        latency_ms(&self.serve_to_answer_ms, "no session answered")
    }

    pub fn reference(&self) -> Measure {
        latency_ms(&self.reference_ms, "no message")
    }
}

#[derive(Debug, Deserialize)]
pub struct Figures {
    pub launch: Launches,
    pub restarts: Vec<Restart>,
}

/// Runs `tests/pi/bench.mjs` with this `relay` (and the fake Bot API
/// beside it): `trials` launches, then `serve` restarted `rounds` times
/// with each count of `sessions`. Not available, with the command that
/// fixes it, when Node.js or the pinned pi is missing. Its samples are
/// kept in `keep_in`/pi-launch.json.
pub async fn measure(
    relay: &Path,
    keep_in: &Path,
    trials: usize,
    sessions: &[usize],
    rounds: usize,
) -> anyhow::Result<Figures> {
    // The script runs in its own folders: the binaries by absolute paths.
    let relay = std::path::absolute(relay).context("the relay binary's path")?;
    let dir = tests_pi();
    let pi = dir.join("node_modules/@mariozechner/pi-coding-agent/dist/cli.js");
    if !pi.is_file() {
        bail!("pi is not installed for the tests: run `npm ci --prefix tests/pi`");
    }
    let fake = relay.with_file_name("fake-bot-api");
    if !fake.is_file() {
        bail!(
            "no fake-bot-api beside {} (build with `cargo build --release --bins`)",
            relay.display()
        );
    }
    let sessions: Vec<String> = sessions.iter().map(ToString::to_string).collect();
    let child = tokio::process::Command::new("node")
        .arg(dir.join("bench.mjs"))
        .args([trials.to_string(), sessions.join(","), rounds.to_string()])
        .env("AGENT_RELAY_BIN", &relay)
        .env("FAKE_BOT_API_BIN", &fake)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        // Its progress lines join the bench's own.
        .stderr(Stdio::inherit())
        // Its own group, which dies with the bench: the script's fake Bot
        // API, `serve` and pi are in it (`serve`'s agents die with `serve`).
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .context("running `node` (is Node.js installed?)")?;
    let _group = Group(child.id().context("node exited at once")?);
    let out = tokio::time::timeout(SCRIPT, child.wait_with_output())
        .await
        .with_context(|| format!("tests/pi/bench.mjs took over {} min", SCRIPT.as_secs() / 60))??;
    if !out.status.success() {
        bail!(
            "tests/pi/bench.mjs failed ({}): see its stderr above",
            out.status
        );
    }
    std::fs::create_dir_all(keep_in)
        .and_then(|()| std::fs::write(keep_in.join("pi-launch.json"), &out.stdout))
        .with_context(|| format!("keeping the samples in {}", keep_in.display()))?;
    serde_json::from_slice(&out.stdout).context("reading tests/pi/bench.mjs's figures")
}

/// A process group, SIGKILLed when dropped: an interrupted or failed run
/// leaves nothing behind (the script cleans up itself when it can).
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        if let Ok(pgid) = i32::try_from(self.0) {
            // SAFETY: kill(2) with a negative pid signals that group only.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
    }
}

/// Samples in milliseconds, none below zero, as a latency.
fn latency_ms(samples: &[f64], empty: &str) -> Measure {
    let samples: Vec<Duration> = samples
        .iter()
        .map(|ms| Duration::from_secs_f64(ms.max(0.0) / 1e3))
        .collect();
    Measure::latency(&samples, empty)
}

//! `relay-bench`: makes the relay's performance visible and comparable.
//!
//! Everything runs on this machine against the in-process fake Bot API:
//! real `agent-relay stdio` sidecars (release build) driven by a lean
//! scripted host, each figure printed beside a reference measured in the
//! same run, and the whole table written as JSON. `scripts/bench` builds
//! and runs it. Every wait is bounded; every child dies with the bench.
//!
//! Modules, one per figure family: `failover`, `restart`, `inbound`
//! (latency and fan-out), `proxied` (follower `sendMessage` through the
//! leader), `files` (a photo in, a file out), `footprint` (cold start, idle
//! RSS), `cluster` (one bot across machines over NATS), `turns` (what a
//! turn costs in Telegram's budget, the limits on), `launch` (`/new` → first
//! answer and `serve` restarted, with the real pi); `reference` holds
//! the same-run floors; `world`, `host`, `stats` and `report` are the
//! harness.

#[path = "relay-bench/cluster.rs"]
mod cluster;
#[path = "relay-bench/failover.rs"]
mod failover;
#[path = "relay-bench/files.rs"]
mod files;
#[path = "relay-bench/footprint.rs"]
mod footprint;
#[path = "relay-bench/host.rs"]
mod host;
#[path = "relay-bench/inbound.rs"]
mod inbound;
#[path = "relay-bench/launch.rs"]
mod launch;
#[path = "relay-bench/milestones.rs"]
mod milestones;
#[path = "relay-bench/proxied.rs"]
mod proxied;
#[path = "relay-bench/reference.rs"]
mod reference;
#[path = "relay-bench/report.rs"]
mod report;
#[path = "relay-bench/restart.rs"]
mod restart;
#[path = "relay-bench/stats.rs"]
mod stats;
#[path = "relay-bench/turns.rs"]
mod turns;
#[path = "relay-bench/world.rs"]
mod world;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Parser, ValueEnum};

use report::{Goal, Measure, Report, Row};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Figure {
    Failover,
    Restart,
    Inbound,
    Fanout,
    Proxied,
    Files,
    Idle,
    Cold,
    Cluster,
    Turns,
    Launch,
}

/// Benchmarks agent-relay against the fake Bot API and prints a table.
#[derive(Debug, Parser)]
struct Args {
    /// The `agent-relay` binary (default: next to this one).
    #[arg(long)]
    relay: Option<PathBuf>,
    /// A second binary (the `dist` profile's) whose idle memory is shown
    /// beside the first's.
    #[arg(long)]
    dist_relay: Option<PathBuf>,
    /// Where results.json goes.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Fewer trials and messages: a smoke run, not a measurement.
    #[arg(long)]
    quick: bool,
    /// Only these figures (comma-separated); all by default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<Figure>,
}

/// How much of everything to do.
struct Plan {
    failover_trials: usize,
    growth_trials: usize,
    restart_trials: usize,
    inbound_messages: usize,
    growth_messages: usize,
    fanout_per_follower: usize,
    proxied_latency: usize,
    proxied_per_follower: usize,
    idle: Duration,
    cold_runs: usize,
    echo_round_trips: usize,
    file_trials: usize,
    photo_bytes: usize,
    upload_bytes: usize,
    cluster_trials: usize,
    cluster_messages: usize,
    turn_rounds: usize,
    launch_trials: usize,
    relaunch_rounds: usize,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        if quick {
            Plan {
                failover_trials: 4,
                growth_trials: 2,
                restart_trials: 2,
                inbound_messages: 100,
                growth_messages: 5,
                fanout_per_follower: 30,
                proxied_latency: 20,
                proxied_per_follower: 10,
                idle: Duration::from_secs(2),
                cold_runs: 5,
                echo_round_trips: 1000,
                file_trials: 3,
                photo_bytes: 1024 * 1024,
                upload_bytes: 5 * 1024 * 1024,
                cluster_trials: 1,
                cluster_messages: 10,
                turn_rounds: 1,
                launch_trials: 2,
                relaunch_rounds: 1,
            }
        } else {
            Plan {
                failover_trials: 20,
                growth_trials: 10,
                restart_trials: 10,
                inbound_messages: 1000,
                growth_messages: 10,
                fanout_per_follower: 300,
                proxied_latency: 200,
                proxied_per_follower: 100,
                idle: Duration::from_secs(10),
                cold_runs: 20,
                echo_round_trips: 10_000,
                file_trials: 20,
                photo_bytes: 1024 * 1024,
                upload_bytes: 20 * 1024 * 1024,
                cluster_trials: 5,
                cluster_messages: 100,
                turn_rounds: 3,
                launch_trials: 10,
                relaunch_rounds: 2,
            }
        }
    }
}

/// Sessions in the world of the inbound and proxied figures: a leader and
/// ten followers.
const FAN_OUT_SESSIONS: usize = 11;

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // reqwest is built without a TLS provider of its own; the bench only
    // speaks plain HTTP to 127.0.0.1, but the client still wants one.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(async {
        tokio::select! {
            result = run(args) => result,
            // Dropping `run` drops every sidecar: they are killed on drop.
            _ = tokio::signal::ctrl_c() => anyhow::bail!("interrupted"),
        }
    })
}

async fn run(args: Args) -> anyhow::Result<()> {
    let relay = relay_binary(args.relay.clone())?;
    let plan = Plan::new(args.quick);
    let wanted = |f: Figure| args.only.is_empty() || args.only.contains(&f);
    let started = Instant::now();
    let started_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut rows = Vec::new();
    let step = |what: &str| eprintln!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());

    step("references: unix-socket echo, flock hand-over");
    let (echo_twice, echo_rate) = echo_references(&plan);
    if wanted(Figure::Failover) {
        failover_rows(&relay, &plan, &mut rows, &step).await;
    }

    if wanted(Figure::Restart) {
        restart_rows(&relay, &plan, &mut rows, &step).await;
    }

    let needs_world = [
        Figure::Inbound,
        Figure::Fanout,
        Figure::Proxied,
        Figure::Files,
    ]
    .into_iter()
    .any(wanted);
    if needs_world {
        let echo = (&echo_twice, &echo_rate);
        world_rows(&relay, &plan, &wanted, echo, &mut rows, &step).await;
    }

    if wanted(Figure::Turns) {
        turn_rows(&relay, &plan, &mut rows, &step).await;
    }

    if wanted(Figure::Launch) {
        launch_rows(&relay, &args.out, &plan, &mut rows, &step).await;
    }

    if wanted(Figure::Idle) {
        idle_rows(&relay, args.dist_relay.as_deref(), &plan, &mut rows, &step).await;
    }

    if wanted(Figure::Cold) {
        cold_rows(&relay, &plan, &mut rows, &step).await;
    }

    if wanted(Figure::Cluster) {
        cluster_rows(&relay, &plan, &mut rows, &step).await;
    }

    let report = Report {
        relay_version: env!("CARGO_PKG_VERSION"),
        started_unix_ms,
        elapsed_s: started.elapsed().as_secs_f64(),
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        quick: args.quick,
        rows,
    };
    println!();
    report.print();
    let path = report.write_json(&args.out)?;
    println!("\n{} · {:.0} s", path.display(), report.elapsed_s);
    Ok(())
}

/// The failover rows: a leader killed, with 10 sessions (the goal) and 2
/// and 25 (how it grows), beside the kernel's own lock hand-over.
/// The relay binary measured: the one named, else the one beside the bench.
fn relay_binary(named: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let relay = match named {
        Some(path) => path,
        None => std::env::current_exe()?
            .parent()
            .context("the bench binary has no directory")?
            .join("agent-relay"),
    };
    anyhow::ensure!(
        relay.is_file(),
        "no agent-relay binary at {} (build with `cargo build --release --bins`)",
        relay.display()
    );
    Ok(relay)
}

/// The unix-socket echo's references: two round trips (a message in and
/// its answer), and its rate.
fn echo_references(plan: &Plan) -> (Measure, Measure) {
    let echo_rtt = Measure::from_result(
        reference::echo_rtt(plan.echo_round_trips).map(|s| Measure::latency(&s, "no round trip")),
    );
    let echo_twice = match &echo_rtt {
        Measure::Latency(s) => Measure::Latency(s.scaled(2.0)),
        other => other.clone(),
    };
    let echo_rate =
        Measure::from_result(reference::echo_throughput(200_000).map(|(n, t)| Measure::rate(n, t)));
    (echo_twice, echo_rate)
}

async fn failover_rows(relay: &Path, plan: &Plan, rows: &mut Vec<Row>, step: &impl Fn(&str)) {
    let floor = Measure::from_result(
        reference::flock_handover(plan.failover_trials).map(|s| Measure::latency(&s, "no trial")),
    );
    for (sessions, trials) in [
        (10, plan.failover_trials),
        (2, plan.growth_trials),
        (25, plan.growth_trials),
    ] {
        step(&format!("failover: {sessions} sessions, {trials} trials"));
        let measured = failover::measure(relay, sessions, trials).await;
        let (value, lag, steps) = match measured {
            Ok(f) => (
                Measure::latency(&f.takeover, "no trial"),
                Measure::latency(&f.status_lag, "no survivor"),
                f.steps,
            ),
            Err(e) => {
                let why = format!("{e:#}");
                (Measure::na(why.clone()), Measure::na(why), Vec::new())
            }
        };
        let mut row = Row::new(
            format!("failover, {sessions} sessions"),
            "SIGKILL leader → a new leader accepts a registration and polls getUpdates",
            value,
        )
        .reference("flock+connect", floor.clone());
        let mut lag_row = Row::new(
            format!("status line after failover, {sessions} sessions"),
            "new leader's first getUpdates → each survivor's host reads a connected status line (0 if it was back before)",
            lag,
        );
        if sessions == 10 {
            row = row.goal(Goal::MedianAtMost { ms: 10.0 });
            lag_row = lag_row.goal(Goal::PercentilesAtMost {
                p50_ms: 5.0,
                p99_ms: 20.0,
            });
        }
        rows.push(row);
        rows.push(lag_row);
        if sessions == 10 {
            for (what, samples) in steps {
                rows.push(Row::new(
                    format!("  ↳ {what}"),
                    "a step of the failover of 10 sessions, from the new leader's milestones",
                    Measure::latency(&samples, "not logged"),
                ));
            }
        }
    }
}

/// The restart rows: `/relay restart` converging, with 25 sessions (the
/// goal) and 2 and 10.
async fn restart_rows(relay: &Path, plan: &Plan, rows: &mut Vec<Row>, step: &impl Fn(&str)) {
    for (sessions, trials) in [
        (25, plan.restart_trials),
        (2, plan.growth_trials),
        (10, plan.growth_trials),
    ] {
        step(&format!("restart: {sessions} sessions, {trials} trials"));
        let value = Measure::from_result(restart::measure(relay, sessions, trials).await);
        let mut row = Row::new(
            format!("restart convergence, {sessions} sessions"),
            "/relay restart from a follower's host → its answer says complete",
            value,
        );
        if sessions == 25 {
            row = row.goal(Goal::MedianAtMost { ms: 1000.0 });
        }
        rows.push(row);
    }
}

/// The rows measured on one bus of [`FAN_OUT_SESSIONS`] sessions:
/// inbound, fan-out, proxied calls, files.
async fn world_rows(
    relay: &Path,
    plan: &Plan,
    wanted: &impl Fn(Figure) -> bool,
    (echo_twice, echo_rate): (&Measure, &Measure),
    rows: &mut Vec<Row>,
    step: &impl Fn(&str),
) {
    step(&format!("starting a bus of {FAN_OUT_SESSIONS} sessions"));
    match world::World::start(relay, FAN_OUT_SESSIONS).await {
        Ok(mut world) => {
            if wanted(Figure::Inbound) {
                inbound_rows(&mut world, plan, echo_twice, rows, step).await;
                hop_rows(relay, plan, rows, step).await;
            }
            if wanted(Figure::Fanout) {
                step("fan-out: leader → 10 followers");
                let value = Measure::from_result(
                    inbound::fan_out(&mut world, plan.fanout_per_follower).await,
                );
                rows.push(
                    Row::new(
                        "fan-out to 10 followers",
                        "messages injected at once into 10 followers' topics → all at their hosts",
                        value,
                    )
                    .reference("echo", echo_rate.clone())
                    .goal(Goal::RateAtLeast { per_s: 20_000.0 }),
                );
            }
            if wanted(Figure::Proxied) {
                proxied_rows(&mut world, plan, rows, step).await;
            }
            if wanted(Figure::Files) {
                file_rows(relay, &mut world, plan, rows, step).await;
            }
        }
        Err(e) => {
            let why = format!("{e:#}");
            rows.push(Row::new(
                "inbound / fan-out / proxied",
                "",
                Measure::na(why),
            ));
        }
    }
}

/// The turn rows: what one turn costs in Telegram calls, one session at
/// a time and five at once.
async fn turn_rows(relay: &Path, plan: &Plan, rows: &mut Vec<Row>, step: &impl Fn(&str)) {
    // One session turn after turn; five sessions each with one turn
    // at the same moment (their answers share the group's minute).
    for (sessions, rounds) in [(1, plan.turn_rounds), (5, 1)] {
        step(&format!(
            "turns: {sessions} session(s), {rounds} round(s), Telegram's limits on"
        ));
        let value = Measure::from_result(turns::measure(relay, sessions, rounds).await);
        rows.push(Row::new(
            format!("a turn's cost, {sessions} session(s) at once"),
            "a line before each of 3 tools, then the answer; group limits on in the fake and the relay: sendMessage and edits into the topics per turn, 429s, longest agent/ended → answer in the topic",
            value,
        ));
    }
}

/// Launched pi sessions waited on with `serve` restarted: 2 and 6.
const RELAUNCHED: [usize; 2] = [2, 6];

/// The launch rows, with the real pi: `/new` → first answer (the relay's
/// share: the same run's pi alone taken off) and where it goes; `serve`
/// SIGKILLed and started again with 2 and 6 launched sessions.
async fn launch_rows(
    relay: &Path,
    out: &Path,
    plan: &Plan,
    rows: &mut Vec<Row>,
    step: &impl Fn(&str),
) {
    step(&format!(
        "launch: /new × {} beside pi alone, then serve restarted with {RELAUNCHED:?} sessions × {}",
        plan.launch_trials, plan.relaunch_rounds
    ));
    let figures = match launch::measure(
        relay,
        out,
        plan.launch_trials,
        &RELAUNCHED,
        plan.relaunch_rounds,
    )
    .await
    {
        Ok(figures) => figures,
        Err(e) => {
            let why = format!("{e:#}");
            rows.push(
                Row::new(
                    "/new → first answer, the relay's share",
                    "",
                    Measure::na(why.clone()),
                )
                .goal(Goal::MedianAtMost { ms: 50.0 }),
            );
            rows.push(
                Row::new("serve restarted, launched sessions", "", Measure::na(why))
                    .goal(Goal::MedianAtMost { ms: 5000.0 }),
            );
            return;
        }
    };
    new_rows(&figures.launch, rows);
    for restart in &figures.restarts {
        relaunch_rows(restart, rows);
    }
}

/// `/new` → first answer: the relay's share, the total, and where it goes
/// beside where pi alone's goes.
fn new_rows(new: &launch::Launches, rows: &mut Vec<Row>) {
    rows.push(
        Row::new(
            "/new → first answer, the relay's share",
            "each trial: `/new <folder> <prompt>` injected → the answer in the new topic, minus pi alone just before (spawned in RPC mode, the same prompt and fake model → agent_end); relay limiter off",
            new.share(),
        )
        .reference("pi alone", new.alone())
        .goal(Goal::MedianAtMost { ms: 50.0 }),
    );
    rows.push(Row::new(
        "  ↳ the relay's own steps",
        "each trial: /new injected → pi spawned, + pi answered serve → the prompt at the session's sidecar, + the answer's way from the model to the topic beyond pi alone's from the model to agent_end; pi's start-up is not in it, nor the extension's loading within it",
        new.own_steps(),
    ));
    rows.push(
        Row::new(
            "/new → first answer",
            "`/new <folder> <prompt>` injected → the answer's sendMessage into the new topic answered",
            new.total(),
        )
        .reference("pi alone", new.alone()),
    );
    for point in &new.points {
        rows.push(Row::new(
            format!("  ↳ {} (since /new)", point.name),
            point.how.clone(),
            point.measure(),
        ));
    }
    for point in &new.alone_points {
        rows.push(Row::new(
            format!("  ↳ pi alone: {} (since its spawn)", point.name),
            point.how.clone(),
            point.measure(),
        ));
    }
}

/// `serve` SIGKILLed and started again with `restart.sessions` launched
/// sessions, beside a message's answer with `serve` never killed.
fn relaunch_rows(restart: &launch::Restart, rows: &mut Vec<Row>) {
    let n = restart.sessions;
    rows.push(
        Row::new(
            format!("serve restarted, {n} launched sessions"),
            "serve SIGKILLed, a message typed into each topic, serve started again: per session, its sidecar registered again → that message answered in its topic; reference: a message → its answer, serve never killed; relay limiter off",
            restart.joined_to_answer(),
        )
        .reference("serve never killed", restart.reference())
        .goal(Goal::MedianAtMost { ms: 5000.0 }),
    );
    rows.push(Row::new(
        format!("  ↳ serve started again → answered, {n} sessions"),
        "per session, from `agent-relay serve` spawned again: what the person waits",
        restart.serve_to_answer(),
    ));
}

/// The idle rows: a follower's and a leader's memory after the idle
/// period, and the `dist` build's when it is given.
async fn idle_rows(
    relay: &Path,
    dist: Option<&Path>,
    plan: &Plan,
    rows: &mut Vec<Row>,
    step: &impl Fn(&str),
) {
    step(&format!("idle RSS after {:?}", plan.idle));
    match footprint::idle_rss(relay, plan.idle).await {
        Ok(idle) => {
            rows.push(
                Row::new(
                    "idle RSS, follower",
                    "VmRSS after the idle period",
                    idle.follower,
                )
                .reference("idle node", idle.node.clone())
                .goal(Goal::MemoryAtMost { kib: 8 * 1024 }),
            );
            rows.push(Row::new(
                "idle private memory, follower",
                "Private_Clean + Private_Dirty (smaps_rollup): what one more session adds; its code pages are shared with every sidecar",
                idle.follower_private,
            ));
            rows.push(
                Row::new(
                    "idle RSS, leader",
                    "VmRSS after the idle period",
                    idle.leader,
                )
                .reference("idle node", idle.node)
                .goal(Goal::MemoryAtMost { kib: 16 * 1024 }),
            );
        }
        Err(e) => rows.push(Row::new("idle RSS", "", Measure::na(format!("{e:#}")))),
    }
    if let Some(dist) = dist {
        step("idle RSS of the dist build");
        match footprint::idle_rss(dist, plan.idle).await {
            Ok(idle) => {
                rows.push(Row::new(
                    "idle RSS, follower (dist build)",
                    "the `dist` profile (opt-level s, fat LTO): VmRSS after the idle period",
                    idle.follower,
                ));
                rows.push(Row::new(
                    "idle private memory, follower (dist build)",
                    "the `dist` profile: Private_Clean + Private_Dirty",
                    idle.follower_private,
                ));
                rows.push(Row::new(
                    "idle RSS, leader (dist build)",
                    "the `dist` profile: VmRSS after the idle period",
                    idle.leader,
                ));
            }
            Err(e) => rows.push(Row::new(
                "idle RSS (dist build)",
                "",
                Measure::na(format!("{e:#}")),
            )),
        }
    }
}

/// The cold-start row, beside node's own start.
async fn cold_rows(relay: &Path, plan: &Plan, rows: &mut Vec<Row>, step: &impl Fn(&str)) {
    step(&format!("cold start × {}", plan.cold_runs));
    let value = Measure::from_result(
        footprint::cold_start(relay, plan.cold_runs)
            .await
            .map(|s| Measure::latency(&s, "no run")),
    );
    let node = Measure::from_result(
        reference::node_start(plan.cold_runs).map(|s| Measure::latency(&s, "no run")),
    );
    rows.push(
        Row::new("cold start", "spawn → initialize answered", value)
            .reference("node -e ''", node)
            .goal(Goal::MedianAtMost { ms: 20.0 }),
    );
}

async fn inbound_rows(
    world: &mut world::World,
    plan: &Plan,
    echo_twice: &Measure,
    rows: &mut Vec<Row>,
    step: &impl Fn(&str),
) {
    for (rate, count) in [
        (100.0, plan.inbound_messages),
        (1.0, plan.growth_messages),
        (10.0, plan.growth_messages * 10),
    ] {
        step(&format!("inbound latency: {count} messages at {rate}/s"));
        let value = Measure::from_result(inbound::latency(world, rate, count).await);
        let unavailable = matches!(value, Measure::NotAvailable { .. });
        let mut row = Row::new(
            format!("inbound latency, {rate}/s"),
            "message injected into the fake (its poll answers) → follower's host reads agent/sendUserMessage",
            value,
        )
        .reference("2×echo RTT", echo_twice.clone());
        if rate == 100.0 {
            row = row.goal(Goal::PercentilesAtMost {
                p50_ms: 1.0,
                p99_ms: 3.0,
            });
        }
        rows.push(row);
        if unavailable {
            // The other rates would only wait for the same timeout.
            break;
        }
    }
}

/// Where an inbound message's time goes, on a bus of its own whose
/// sidecars log their milestones (the figure above runs without them).
async fn hop_rows(relay: &Path, plan: &Plan, rows: &mut Vec<Row>, step: &impl Fn(&str)) {
    let count = plan.inbound_messages / 5;
    step(&format!(
        "inbound breakdown: {count} messages at 100/s, milestones on"
    ));
    match inbound::hop_breakdown(relay, 100.0, count).await {
        Ok(steps) => {
            for (what, samples) in steps {
                rows.push(Row::new(
                    format!("  ↳ {what}"),
                    "a step of an inbound message at 100/s, from the sidecars' milestones",
                    Measure::latency(&samples, "not logged"),
                ));
            }
        }
        Err(e) => rows.push(Row::new(
            "  inbound steps",
            "",
            Measure::na(format!("{e:#}")),
        )),
    }
}

async fn file_rows(
    relay: &Path,
    world: &mut world::World,
    plan: &Plan,
    rows: &mut Vec<Row>,
    step: &impl Fn(&str),
) {
    let mib = |bytes: usize| bytes / (1024 * 1024);
    step(&format!("files: {} photos in", plan.file_trials));
    let (relayed, direct) = match files::inbound(world, plan.file_trials, plan.photo_bytes).await {
        Ok(pair) => pair,
        Err(e) => (Measure::na(format!("{e:#}")), Measure::None),
    };
    rows.push(
        Row::new(
            format!("photo in, {} MiB", mib(plan.photo_bytes)),
            "photo injected into a follower's topic → its host reads the prompt naming the saved file; reference: getFile + download by hand",
            relayed,
        )
        .reference("direct download", direct),
    );
    step(&format!("files: {} files out", plan.file_trials));
    let (relayed, direct) = match files::outbound(world, plan.file_trials, plan.upload_bytes).await
    {
        Ok(pair) => pair,
        Err(e) => (Measure::na(format!("{e:#}")), Measure::None),
    };
    rows.push(
        Row::new(
            format!("file out, {} MiB", mib(plan.upload_bytes)),
            "file/send at a follower's host → answered (the fake stored it); reference: a multipart sendDocument by hand",
            relayed,
        )
        .reference("direct upload", direct)
        .goal(Goal::MedianTimesReferenceAtMost { times: 4.0 }),
    );
    step(&format!(
        "files: breakdown of {} files out, milestones on",
        plan.file_trials
    ));
    match files::outbound_breakdown(relay, plan.file_trials, plan.upload_bytes).await {
        Ok(steps) => {
            for (what, samples) in steps {
                rows.push(Row::new(
                    format!("  ↳ {what}"),
                    "a step of a file/send, from the sidecars' milestones",
                    Measure::latency(&samples, "not logged"),
                ));
            }
        }
        Err(e) => rows.push(Row::new(
            "  file-out steps",
            "",
            Measure::na(format!("{e:#}")),
        )),
    }
}

async fn proxied_rows(
    world: &mut world::World,
    plan: &Plan,
    rows: &mut Vec<Row>,
    step: &impl Fn(&str),
) {
    step("proxied sendMessage: latency");
    let (proxied, direct) = match proxied::latency(world, plan.proxied_latency).await {
        Ok(l) => (l.proxied, l.direct),
        Err(e) => (Measure::na(format!("{e:#}")), Measure::None),
    };
    let added = match (&proxied, &direct) {
        (Measure::Latency(p), Measure::Latency(d)) => format!(
            "; added median {}",
            stats::fmt_ms(p.median_ms - d.median_ms)
        ),
        _ => String::new(),
    };
    let works = matches!(proxied, Measure::Latency(_));
    rows.push(
        Row::new(
            format!("follower sendMessage latency{added}"),
            "turn/ended at a follower's host → the fake stores the text; direct: bench POSTs sendMessage → stored",
            proxied,
        )
        .reference("direct call", direct),
    );
    step("proxied sendMessage: throughput");
    let value = if works {
        Measure::from_result(proxied::throughput(world, plan.proxied_per_follower).await)
    } else {
        Measure::na("follower sendMessage does not work (see above)")
    };
    rows.push(Row::new(
        "follower answer throughput, 10 followers",
        "turn/ended at once at every follower → every answer stored by the fake (answers that queue behind a send are merged into fewer messages); relay limiter off",
        value,
    ));
}

/// One bot across two machines over NATS, each figure beside the same
/// figure of one machine, measured in the same run.
async fn cluster_rows(
    relay: &std::path::Path,
    plan: &Plan,
    rows: &mut Vec<Row>,
    step: &impl Fn(&str),
) {
    const RATE: f64 = 10.0;
    step("one machine, for the cluster's references");
    let one_failover = Measure::from_result(
        failover::measure(relay, 2, plan.cluster_trials.max(3))
            .await
            .map(|f| Measure::latency(&f.takeover, "no trial")),
    );
    let one_inbound = match world::World::start(relay, 2).await {
        Ok(mut world) => {
            Measure::from_result(inbound::latency(&mut world, RATE, plan.cluster_messages).await)
        }
        Err(e) => Measure::na(format!("{e:#}")),
    };
    step(&format!(
        "cluster: 2 machines over nats-server, {} failovers",
        plan.cluster_trials
    ));
    let (failover, polling, other, traffic) =
        match cluster::measure(relay, plan.cluster_trials, plan.cluster_messages, RATE).await {
            Ok(f) => (f.failover, f.inbound_polling, f.inbound_other, f.traffic),
            Err(e) => {
                let why = Measure::na(format!("{e:#}"));
                (why.clone(), why.clone(), why.clone(), why)
            }
        };
    rows.push(
        Row::new(
            "failover across machines",
            "SIGKILL every sidecar of the machine that polls → a message typed then reaches the other machine's session (found gone from NATS; a partition waits for the 6 s lease)",
            failover,
        )
        .reference("one machine", one_failover)
        .goal(Goal::MedianAtMost { ms: 1000.0 }),
    );
    rows.push(
        Row::new(
            format!("inbound via JetStream, polling machine, {RATE}/s"),
            "message injected → the poller publishes it, its own machine's consumer journals it → host reads it",
            polling,
        )
        .reference("one machine", one_inbound.clone()),
    );
    rows.push(
        Row::new(
            format!("inbound via JetStream, other machine, {RATE}/s"),
            "message injected → published by the polling machine → the other machine's consumer → host reads it",
            other,
        )
        .reference("one machine", one_inbound),
    );
    rows.push(Row::new(
        "NATS traffic per inbound update",
        "messages and bytes in and out of nats-server (/varz) during both inbound runs, minus an idle window as long, per update",
        traffic,
    ));
}

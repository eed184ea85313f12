//! Slash commands: what the host offers its user, how their text is parsed,
//! and how their reports read. Executing them is the session's job; this
//! module knows no sockets and no host framing.

use crate::protocol::bus::{
    BusStatus, ChatPacing, ClusterLinkState, Health, PollReport, RestartOutcome, SessionStatus,
};
use crate::protocol::host::CommandSpec;

/// A parsed command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `/telegram-connect`: join the relay and get this session's topic.
    Connect,
    /// `/telegram-disconnect`: delete this session's topic and stop relaying.
    Disconnect,
    /// `/telegram-status [--debug]`.
    Status { debug: bool },
    /// `/relay status`: every session on the bus.
    RelayStatus,
    /// `/relay restart`: restart the shared relay.
    RelayRestart,
}

/// Why a command line could not be parsed; the message includes the usage.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}\n{}", usage())]
pub struct UsageError {
    message: String,
}

/// The commands, in the order hosts should list them.
pub fn specs() -> Vec<CommandSpec> {
    let spec = |name: &str, description: &str, args: Option<&str>| CommandSpec {
        name: name.into(),
        description: description.into(),
        args: args.map(Into::into),
    };
    vec![
        spec(
            "telegram-connect",
            "Relay this session through Telegram in a topic of its own",
            None,
        ),
        spec(
            "telegram-disconnect",
            "Delete this session's Telegram topic and stop relaying",
            None,
        ),
        spec(
            "telegram-status",
            "Show this session's binding, transport and sync state",
            Some("[--debug]"),
        ),
        spec(
            "relay",
            "Inspect or restart the shared relay",
            Some("status | restart"),
        ),
    ]
}

/// One line per command, for error messages.
pub fn usage() -> String {
    let mut out = String::from("Commands:");
    for spec in specs() {
        out.push_str("\n  /");
        out.push_str(&spec.name);
        if let Some(args) = &spec.args {
            out.push(' ');
            out.push_str(args);
        }
        out.push_str(" — ");
        out.push_str(&spec.description);
    }
    out
}

/// Parses a command as a host sends it: `name` with or without its slash, and
/// `args`. A host may also put the arguments in `name` (`"/relay restart"`).
pub fn parse(name: &str, args: &str) -> Result<Command, UsageError> {
    let name = name.trim();
    let (name, inline_args) = name.split_once(char::is_whitespace).unwrap_or((name, ""));
    let name = name.strip_prefix('/').unwrap_or(name);
    let words: Vec<&str> = inline_args
        .split_whitespace()
        .chain(args.split_whitespace())
        .collect();
    let error = |message: String| Err(UsageError { message });
    let no_args = |cmd: Command| match words.as_slice() {
        [] => Ok(cmd),
        extra => error(format!(
            "/{name} takes no arguments, got {:?}",
            extra.join(" ")
        )),
    };
    match name {
        "telegram-connect" => no_args(Command::Connect),
        "telegram-disconnect" => no_args(Command::Disconnect),
        "telegram-status" => match words.as_slice() {
            [] => Ok(Command::Status { debug: false }),
            ["--debug"] => Ok(Command::Status { debug: true }),
            other => error(format!(
                "/telegram-status: unknown argument {:?}",
                other.join(" ")
            )),
        },
        "relay" => match words.as_slice() {
            ["status"] => Ok(Command::RelayStatus),
            ["restart"] => Ok(Command::RelayRestart),
            [] => error("/relay needs a subcommand: status or restart".into()),
            other => error(format!("/relay: unknown subcommand {:?}", other.join(" "))),
        },
        "" => error("empty command".into()),
        other => error(format!("unknown command /{other}")),
    }
}

/// The `/relay status` table: this machine's sessions, or every machine's
/// when the relay spans machines.
pub fn relay_status_text(status: &BusStatus) -> String {
    let Some(cluster) = &status.cluster else {
        let mut out = format!(
            "relay: leader pid {} · epoch {} · {} session(s)\n",
            status.leader_pid,
            status.epoch,
            status.sessions.iter().filter(|s| s.live).count()
        );
        leader_lines(&mut out, status);
        session_table(&mut out, &status.sessions);
        out.truncate(out.trim_end().len());
        return out;
    };
    let live: usize = cluster
        .machines
        .iter()
        .flat_map(|m| &m.sessions)
        .filter(|s| s.live)
        .count();
    let polled = match (&cluster.polled_by, cluster.term) {
        (Some(node), Some(term)) => format!("{node} polls Telegram (term {term})"),
        (Some(node), None) => format!("{node} polls Telegram"),
        _ => "no machine polls Telegram now".to_string(),
    };
    let mut out = format!(
        "relay: {} machine(s) · {polled} · {live} session(s)\n",
        cluster.machines.len()
    );
    leader_lines(&mut out, status);
    if cluster.link == ClusterLinkState::Down {
        out.push_str(&format!(
            "⚠ machine {} is cut off from the cluster: only its own sessions are shown\n",
            cluster.node
        ));
    }
    for m in &cluster.machines {
        let this = if m.node == cluster.node {
            format!(" (this one) · leader pid {}", status.leader_pid)
        } else {
            String::new()
        };
        match m.epoch {
            Some(epoch) if m.answered => {
                out.push_str(&format!("machine {}{this} · epoch {epoch}\n", m.node));
                session_table(&mut out, &m.sessions);
            }
            _ => out.push_str(&format!("machine {} · not answering\n", m.node)),
        }
    }
    out.truncate(out.trim_end().len());
    out
}

fn session_table(out: &mut String, sessions: &[SessionStatus]) {
    if sessions.is_empty() {
        out.push_str("  no sessions\n");
        return;
    }
    out.push_str("slot  topic                     health        cwd\n");
    for s in sessions {
        let health = match (&s.launch, s.live) {
            (_, true) => format!("live {:.1}s", s.heartbeat_age_ms as f64 / 1000.0),
            (Some(launch), false) => launch.state.clone(),
            (None, false) => "offline".into(),
        };
        out.push_str(&format!(
            "{:<5} {:<25} {:<13} {}\n",
            s.slot.to_string(),
            truncate(&s.topic_name, 25),
            health,
            s.cwd
        ));
    }
}

/// This machine's leader: its poll of Telegram and the chats' budgets.
fn leader_lines(out: &mut String, status: &BusStatus) {
    if let Some(poll) = &status.poll {
        out.push_str(&format!("poll: {}\n", poll_text(poll)));
    }
    for chat in &status.pacing {
        out.push_str(&format!("pacing: {}\n", pacing_text(chat)));
    }
    match &status.serve {
        Some(serve) => out.push_str(&format!(
            "serve: pid {} · starts {}\n",
            serve.pid,
            serve.engines.join(", ")
        )),
        None => out.push_str("serve: not running (/new needs agent-relay serve)\n"),
    }
    for what in &status.lacking {
        out.push_str(&format!("the Bot API server lacks: {what}\n"));
    }
}

/// How the leader's poll is doing: its health, when it last answered and
/// what waits at Telegram.
fn poll_text(poll: &PollReport) -> String {
    let mut out = match &poll.health {
        Health::Ok => "ok".to_string(),
        Health::Starting => "starting".into(),
        Health::Conflict => "⚠ 409 conflict: another process polls this bot".into(),
        Health::Offline { reason } => format!("offline: {reason}"),
        Health::Unauthorized => "✕ Telegram rejected the bot token (run agent-relay doctor)".into(),
        Health::Deaf { .. } => "⚠ not receiving: polls come back empty while updates wait".into(),
    };
    match poll.last_ok_age_ms {
        Some(ms) => out.push_str(&format!(" · last answer {} ago", seconds(ms))),
        None => out.push_str(" · no answer yet"),
    }
    if let Some(pending) = poll.pending_updates {
        out.push_str(&format!(" · {pending} waiting at Telegram"));
    }
    if poll.restarts > 0 {
        out.push_str(&format!(" · restarted {} time(s)", poll.restarts));
    }
    out
}

/// One chat's message budget: what it allows, how much is used, who waits.
fn pacing_text(chat: &ChatPacing) -> String {
    let mut out = format!(
        "chat {}: {}/{} messages in {}",
        chat.chat_id,
        chat.used,
        chat.capacity,
        seconds(chat.window_ms)
    );
    if chat.waiting > 0 {
        out.push_str(&format!(
            " · {} waiting, next in {}",
            chat.waiting,
            seconds(chat.next_free_ms)
        ));
    }
    if chat.paced > 0 {
        out.push_str(&format!(
            " · {} paced, longest wait {}",
            chat.paced,
            seconds(chat.longest_wait_ms)
        ));
    }
    out
}

fn seconds(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

fn truncate(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_string();
    }
    let mut out: String = text.chars().take(max - 1).collect();
    out.push('…');
    out
}

/// The `/relay restart` report.
pub fn restart_text(outcome: &RestartOutcome) -> (bool, String) {
    match outcome {
        RestartOutcome::Complete { routes, elapsed_ms } => (
            true,
            format!("Relay restarted: complete {routes}/{routes} routes back in {elapsed_ms} ms."),
        ),
        RestartOutcome::PartialTimeout {
            back,
            expected,
            missing,
            elapsed_ms,
        } => (
            false,
            format!(
                "Relay restarted: partial-timeout {back}/{expected} routes back after {elapsed_ms} ms (missing: {}).",
                missing.join(", ")
            ),
        ),
        RestartOutcome::Failed { reason, elapsed_ms } => (
            false,
            format!("Relay restart failed after {elapsed_ms} ms: {reason}"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_command_with_or_without_slash() {
        assert_eq!(parse("/telegram-connect", ""), Ok(Command::Connect));
        assert_eq!(parse("telegram-disconnect", " "), Ok(Command::Disconnect));
        assert_eq!(
            parse("telegram-status", ""),
            Ok(Command::Status { debug: false })
        );
        assert_eq!(
            parse("telegram-status", "--debug"),
            Ok(Command::Status { debug: true })
        );
        assert_eq!(parse("relay", "status"), Ok(Command::RelayStatus));
        assert_eq!(parse("/relay restart", ""), Ok(Command::RelayRestart));
        assert_eq!(parse("relay", " restart "), Ok(Command::RelayRestart));
    }

    #[test]
    fn errors_say_what_is_wrong_and_show_usage() {
        let err = parse("relay", "reboot").unwrap_err().to_string();
        assert!(err.contains("unknown subcommand \"reboot\""), "{err}");
        assert!(err.contains("/relay status | restart"), "{err}");

        let err = parse("/telegram-frobnicate", "").unwrap_err().to_string();
        assert!(
            err.starts_with("unknown command /telegram-frobnicate"),
            "{err}"
        );

        assert!(parse("relay", "").is_err());
        assert!(parse("telegram-connect", "now").is_err());
        assert!(parse("telegram-status", "--verbose").is_err());
        assert!(parse("", "").is_err());
    }
}

//! The facts a session shows — binding, transport, sync, and what waits to
//! be sent — and how they read in the status line and in
//! `/telegram-status`. Never conflated: each changes on its own and each is
//! shown on its own.

use std::time::{Duration, Instant};

use crate::protocol::bus::{Blocker, ClusterLink, ClusterLinkState, Epoch, Slot};
use crate::protocol::host::Tone;

/// Whether and how this session is bound to a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingFact {
    /// No token, or a configuration error (`problem`).
    Unconfigured {
        problem: Option<String>,
    },
    /// Configured but not joined yet (`auto_connect = false`).
    Idle,
    /// Joining the bus, no slot yet.
    Connecting,
    /// On the bus, but nobody is paired to drive sessions yet.
    Unpaired,
    Bound {
        slot: Slot,
        name: String,
    },
    /// No topic until the user fixes what `problem` says.
    Blocked {
        blocker: Blocker,
        problem: String,
    },
    /// The user disconnected this session.
    Disconnected,
}

/// How this session reaches Telegram.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportFact {
    /// Not on the bus.
    None,
    Leader,
    Follower,
    Reconnecting,
    /// Another process polls the same bot (Telegram's 409).
    Conflict,
    /// Telegram cannot be reached.
    Offline,
    /// Telegram rejected the bot token.
    Unauthorized,
    /// The leader's poll hears nothing while `pending` updates wait.
    Deaf {
        pending: u32,
    },
    /// This machine is cut off from the others of the relay: it sends its
    /// sessions' text itself and receives nothing until the link is back
    /// (docs/CLUSTER.md, *When the cluster connection is down*).
    ClusterDown,
}

/// Whether this session's routes agree with the leader's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SyncFact {
    None,
    Synced(Epoch),
    Syncing,
    Stale(String),
}

/// What this session sends that has not reached its topic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboxFact {
    /// Something waits for the chat's message budget until then.
    pub paced_until: Option<Instant>,
    /// Answers that could not be sent, nor a notice about them.
    pub undelivered: u32,
}

/// The facts the status line shows, never conflated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub binding: BindingFact,
    pub transport: TransportFact,
    pub sync: SyncFact,
    pub outbox: OutboxFact,
}

impl Facts {
    /// The short status-line text and its tone, e.g. `TG A·api ● leader`.
    pub fn render(&self) -> (String, Tone) {
        self.render_at(Instant::now())
    }

    /// What the host should be told once, with its level, while it holds:
    /// something only the user can fix.
    pub fn notice(&self) -> Option<String> {
        match (&self.binding, &self.transport) {
            (BindingFact::Blocked { problem, .. }, _) => Some(format!("Telegram relay: {problem}")),
            (_, TransportFact::Unauthorized) => Some(TOKEN_REJECTED.into()),
            _ => None,
        }
    }

    /// [`Facts::render`] at `now` (the pacing countdown depends on it).
    pub fn render_at(&self, now: Instant) -> (String, Tone) {
        if self.transport == TransportFact::Unauthorized {
            return ("TG ✕ token rejected".into(), Tone::Error);
        }
        let who = match &self.binding {
            BindingFact::Unconfigured { problem: None } => {
                return ("TG ○ not configured".into(), Tone::Muted);
            }
            BindingFact::Unconfigured { problem: Some(_) } => {
                return ("TG ⚠ config error".into(), Tone::Error);
            }
            BindingFact::Idle => return ("TG ○ not connected".into(), Tone::Muted),
            BindingFact::Disconnected => return ("TG ○ disconnected".into(), Tone::Muted),
            BindingFact::Blocked { blocker, .. } => {
                return (format!("TG ✕ {}", blocker_text(*blocker)), Tone::Error);
            }
            BindingFact::Connecting => "TG".to_string(),
            BindingFact::Unpaired => "TG ○ unpaired".to_string(),
            BindingFact::Bound { slot, name } => format!("TG {slot}·{}", short(name)),
        };
        let deaf;
        let (transport, mut tone) = match self.transport {
            TransportFact::None | TransportFact::Reconnecting => ("◌ reconnecting", Tone::Warning),
            TransportFact::Leader => ("● leader", Tone::Success),
            TransportFact::Follower => ("● follower", Tone::Success),
            TransportFact::Conflict => ("⚠ 409 conflict", Tone::Warning),
            TransportFact::Offline => ("○ offline", Tone::Error),
            TransportFact::Unauthorized => ("✕ token rejected", Tone::Error),
            TransportFact::Deaf { pending } => {
                deaf = format!("⚠ not receiving ({pending} waiting)");
                (deaf.as_str(), Tone::Warning)
            }
            TransportFact::ClusterDown => ("◐ cluster down — sending only", Tone::Warning),
        };
        let transport = if self.binding == BindingFact::Connecting
            && self.transport != TransportFact::Conflict
        {
            "◌ connecting"
        } else {
            transport
        };
        if self.binding == BindingFact::Unpaired {
            tone = tone.max_severity(Tone::Warning);
        }
        let sync = match &self.sync {
            SyncFact::None | SyncFact::Synced(_) => "",
            SyncFact::Syncing => {
                tone = tone.max_severity(Tone::Info);
                " ◌ syncing"
            }
            SyncFact::Stale(_) => {
                tone = tone.max_severity(Tone::Warning);
                " ⚠ stale"
            }
        };
        let mut outbox = String::new();
        if let Some(left) = self
            .outbox
            .paced_until
            .map(|until| until.saturating_duration_since(now))
            && !left.is_zero()
        {
            tone = tone.max_severity(Tone::Info);
            outbox.push_str(&format!(" ⏳ paced {} s", seconds(left)));
        }
        match self.outbox.undelivered {
            0 => {}
            n => {
                tone = tone.max_severity(Tone::Warning);
                let what = if n == 1 { "answer" } else { "answers" };
                outbox.push_str(&format!(" ⚠ {n} {what} not delivered"));
            }
        }
        (format!("{who} {transport}{sync}{outbox}"), tone)
    }
}

/// What the host hears when Telegram rejects the token.
const TOKEN_REJECTED: &str = "Telegram relay: Telegram rejected the bot token (401 Unauthorized), so nothing reaches Telegram. Put a valid token from @BotFather in bot_token (config.toml) or TELEGRAM_BOT_TOKEN, then run /telegram-connect; `agent-relay doctor` checks it.";

/// Whole seconds, rounded up: "paced 1 s" until it goes.
fn seconds(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000) as u64
}

fn blocker_text(blocker: Blocker) -> &'static str {
    match blocker {
        Blocker::TokenRejected => "token rejected",
        Blocker::NoTopicRights => "no right to manage topics",
        Blocker::NotAForum => "chat has no topics",
        Blocker::ChatNotFound => "chat not reachable",
    }
}

impl Tone {
    fn severity(self) -> u8 {
        match self {
            Tone::Muted => 0,
            Tone::Success => 1,
            Tone::Info => 2,
            Tone::Warning => 3,
            Tone::Error => 4,
        }
    }

    fn max_severity(self, other: Tone) -> Tone {
        if other.severity() > self.severity() {
            other
        } else {
            self
        }
    }
}

/// At most 16 characters of a session name, for the status line.
fn short(name: &str) -> String {
    let mut out: String = name.chars().take(16).collect();
    if name.chars().count() > 16 {
        out.pop();
        out.push('…');
    }
    out
}

pub fn describe_binding(b: &BindingFact) -> String {
    match b {
        BindingFact::Unconfigured { problem: None } => "unconfigured".into(),
        BindingFact::Unconfigured { problem: Some(p) } => format!("unconfigured ({p})"),
        BindingFact::Idle => "not connected (run /telegram-connect)".into(),
        BindingFact::Connecting => "connecting".into(),
        BindingFact::Unpaired => "unpaired (run /telegram-connect for a pairing link)".into(),
        BindingFact::Bound { slot, name } => format!("bound {slot} · {name}"),
        BindingFact::Blocked { blocker, problem } => {
            format!("no topic: {} — {problem}", blocker_text(*blocker))
        }
        BindingFact::Disconnected => "disconnected".into(),
    }
}

pub fn describe_transport(t: &TransportFact) -> String {
    match t {
        TransportFact::None => "none".into(),
        TransportFact::Leader => "leader (this process polls Telegram)".into(),
        TransportFact::Follower => "follower (through the leader)".into(),
        TransportFact::Reconnecting => "reconnecting".into(),
        TransportFact::Conflict => "conflict (409: another process polls this bot)".into(),
        TransportFact::Offline => "offline (Telegram unreachable)".into(),
        TransportFact::Unauthorized => "unauthorized: Telegram rejected the bot token (401); put a valid token from @BotFather in bot_token, then run /telegram-connect; `agent-relay doctor` checks it".into(),
        TransportFact::Deaf { pending } => format!(
            "not receiving: {pending} update(s) wait at Telegram while its polls come back empty; the leader restarts its poll (see /relay status)"
        ),
        TransportFact::ClusterDown => {
            "cluster down (sending this machine's answers straight to Telegram; your messages wait until the link is back)".into()
        }
    }
}

/// The outbox line of `/telegram-status`; `chat` is whether the topics
/// are in a private chat (paced per chat) or a group (shared by all).
pub fn describe_outbox(o: &OutboxFact, private: bool, now: Instant) -> String {
    let budget = if private {
        "about one message a second in a private chat"
    } else {
        "about 20 messages a minute in a group, shared by every topic"
    };
    let mut out = match o.paced_until.map(|u| u.saturating_duration_since(now)) {
        Some(left) if !left.is_zero() => format!(
            "paced — Telegram allows {budget}; the next message goes in {} s, and messages that pile up meanwhile go out together",
            seconds(left)
        ),
        _ => format!("clear (Telegram allows {budget})"),
    };
    if o.undelivered > 0 {
        out.push_str(&format!(
            "; {} answer(s) could not be sent, nor a notice about them: they are offered again (/resend in the topic) once the topic can be reached",
            o.undelivered
        ));
    }
    out
}

/// This machine's place in a relay that spans machines.
pub fn describe_cluster(link: &ClusterLink) -> String {
    let state = match (link.state, &link.reason) {
        (ClusterLinkState::Connecting, _) => "connecting".to_string(),
        (ClusterLinkState::Up, _) => "connected".to_string(),
        (ClusterLinkState::Down, Some(reason)) => format!("down ({reason})"),
        (ClusterLinkState::Down, None) => "down".to_string(),
    };
    let polled = match &link.polled_by {
        Some(node) if *node == link.node => " · this machine polls Telegram".to_string(),
        Some(node) => format!(" · machine {node} polls Telegram"),
        None => String::new(),
    };
    format!("machine {} · {state}{polled}", link.node)
}

pub fn describe_sync(s: &SyncFact) -> String {
    match s {
        SyncFact::None => "none".into(),
        SyncFact::Synced(epoch) => format!("synced@{epoch}"),
        SyncFact::Syncing => "syncing".into(),
        SyncFact::Stale(reason) => format!("stale ({reason})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(binding: BindingFact, transport: TransportFact, sync: SyncFact) -> (String, Tone) {
        Facts {
            binding,
            transport,
            sync,
            outbox: OutboxFact::default(),
        }
        .render()
    }

    fn bound(slot: usize, name: &str) -> BindingFact {
        BindingFact::Bound {
            slot: Slot::from_index(slot).unwrap(),
            name: name.into(),
        }
    }

    #[test]
    fn each_fact_shows_on_its_own() {
        assert_eq!(
            facts(bound(0, "api"), TransportFact::Leader, SyncFact::Synced(3)),
            ("TG A·api ● leader".into(), Tone::Success)
        );
        assert_eq!(
            facts(
                bound(1, "web"),
                TransportFact::Follower,
                SyncFact::Synced(3)
            ),
            ("TG B·web ● follower".into(), Tone::Success)
        );
        assert_eq!(
            facts(
                bound(1, "web"),
                TransportFact::Reconnecting,
                SyncFact::Syncing
            ),
            ("TG B·web ◌ reconnecting ◌ syncing".into(), Tone::Warning)
        );
        assert_eq!(
            facts(
                bound(1, "web"),
                TransportFact::Conflict,
                SyncFact::Synced(2)
            ),
            ("TG B·web ⚠ 409 conflict".into(), Tone::Warning)
        );
        assert_eq!(
            facts(
                bound(1, "web"),
                TransportFact::Follower,
                SyncFact::Stale("x".into())
            ),
            ("TG B·web ● follower ⚠ stale".into(), Tone::Warning)
        );
        assert_eq!(
            facts(
                bound(0, "laptop·api"),
                TransportFact::ClusterDown,
                SyncFact::Synced(2)
            ),
            (
                "TG A·laptop·api ◐ cluster down — sending only".into(),
                Tone::Warning
            )
        );
        assert_eq!(
            facts(
                BindingFact::Unconfigured { problem: None },
                TransportFact::None,
                SyncFact::None
            ),
            ("TG ○ not configured".into(), Tone::Muted)
        );
        assert_eq!(
            facts(
                BindingFact::Unpaired,
                TransportFact::Leader,
                SyncFact::Synced(1)
            )
            .1,
            Tone::Warning
        );
    }

    #[test]
    fn what_only_the_user_can_fix_is_said_as_such() {
        let blocked = BindingFact::Blocked {
            blocker: Blocker::NoTopicRights,
            problem: "make the bot an administrator".into(),
        };
        assert_eq!(
            facts(blocked.clone(), TransportFact::Leader, SyncFact::Synced(2)),
            ("TG ✕ no right to manage topics".into(), Tone::Error)
        );
        assert_eq!(
            facts(
                bound(0, "api"),
                TransportFact::Unauthorized,
                SyncFact::Syncing
            ),
            ("TG ✕ token rejected".into(), Tone::Error)
        );
        assert_eq!(
            facts(
                bound(0, "api"),
                TransportFact::Deaf { pending: 3 },
                SyncFact::Synced(2)
            ),
            ("TG A·api ⚠ not receiving (3 waiting)".into(), Tone::Warning)
        );
        let f = Facts {
            binding: blocked,
            transport: TransportFact::Leader,
            sync: SyncFact::Synced(2),
            outbox: OutboxFact::default(),
        };
        assert_eq!(
            f.notice().as_deref(),
            Some("Telegram relay: make the bot an administrator")
        );
    }

    #[test]
    fn pacing_and_undelivered_answers_show_beside_the_route() {
        let now = Instant::now();
        let f = Facts {
            binding: bound(0, "api"),
            transport: TransportFact::Follower,
            sync: SyncFact::Synced(2),
            outbox: OutboxFact {
                paced_until: Some(now + Duration::from_millis(41_200)),
                undelivered: 0,
            },
        };
        assert_eq!(
            f.render_at(now),
            ("TG A·api ● follower ⏳ paced 42 s".into(), Tone::Info)
        );
        assert_eq!(
            f.render_at(now + Duration::from_secs(60)).0,
            "TG A·api ● follower",
            "a wait that is over shows no more"
        );
        let f = Facts {
            outbox: OutboxFact {
                paced_until: None,
                undelivered: 2,
            },
            ..f
        };
        assert_eq!(
            f.render_at(now),
            (
                "TG A·api ● follower ⚠ 2 answers not delivered".into(),
                Tone::Warning
            )
        );
    }

    #[test]
    fn long_names_are_shortened() {
        let (text, _) = facts(
            bound(2, "a-very-long-session-name"),
            TransportFact::Leader,
            SyncFact::None,
        );
        assert_eq!(text, "TG C·a-very-long-ses… ● leader");
    }
}

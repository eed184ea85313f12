//! The three facts a session shows — binding, transport, sync — and how they
//! read in the status line and in `/telegram-status`. Never conflated: each
//! changes on its own and each is shown on its own.

use crate::protocol::bus::{ClusterLink, ClusterLinkState, Epoch, Slot};
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

/// The three facts the status line shows, never conflated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    pub binding: BindingFact,
    pub transport: TransportFact,
    pub sync: SyncFact,
}

impl Facts {
    /// The short status-line text and its tone, e.g. `TG A·api ● leader`.
    pub fn render(&self) -> (String, Tone) {
        let who = match &self.binding {
            BindingFact::Unconfigured { problem: None } => {
                return ("TG ○ not configured".into(), Tone::Muted);
            }
            BindingFact::Unconfigured { problem: Some(_) } => {
                return ("TG ⚠ config error".into(), Tone::Error);
            }
            BindingFact::Idle => return ("TG ○ not connected".into(), Tone::Muted),
            BindingFact::Disconnected => return ("TG ○ disconnected".into(), Tone::Muted),
            BindingFact::Connecting => "TG".to_string(),
            BindingFact::Unpaired => "TG ○ unpaired".to_string(),
            BindingFact::Bound { slot, name } => format!("TG {slot}·{}", short(name)),
        };
        let (transport, mut tone) = match self.transport {
            TransportFact::None | TransportFact::Reconnecting => ("◌ reconnecting", Tone::Warning),
            TransportFact::Leader => ("● leader", Tone::Success),
            TransportFact::Follower => ("● follower", Tone::Success),
            TransportFact::Conflict => ("⚠ 409 conflict", Tone::Warning),
            TransportFact::Offline => ("○ offline", Tone::Error),
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
        (format!("{who} {transport}{sync}"), tone)
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
        BindingFact::Disconnected => "disconnected".into(),
    }
}

pub fn describe_transport(t: &TransportFact) -> &'static str {
    match t {
        TransportFact::None => "none",
        TransportFact::Leader => "leader (this process polls Telegram)",
        TransportFact::Follower => "follower (through the leader)",
        TransportFact::Reconnecting => "reconnecting",
        TransportFact::Conflict => "conflict (409: another process polls this bot)",
        TransportFact::Offline => "offline (Telegram unreachable)",
        TransportFact::ClusterDown => {
            "cluster down (sending this machine's answers straight to Telegram; your messages wait until the link is back)"
        }
    }
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
    fn long_names_are_shortened() {
        let (text, _) = facts(
            bound(2, "a-very-long-session-name"),
            TransportFact::Leader,
            SyncFact::None,
        );
        assert_eq!(text, "TG C·a-very-long-ses… ● leader");
    }
}

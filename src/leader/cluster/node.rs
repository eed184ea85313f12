//! This machine as its leader sees it in the cluster: the connection once
//! made, who holds the bot-wide lease, and the link the status line shows.

use std::path::Path;
use std::time::Duration;

use tokio::sync::watch;

use crate::cluster::lease::Leadership;
use crate::cluster::{BotId, Cluster, ClusterConfig, NodeName};
use crate::protocol::bus::{ClusterLink, ClusterLinkState};

/// How long a registration waits for the first connection to the cluster
/// before it goes on without (a leader that just started connects in
/// milliseconds; an unreachable cluster should not hold a session up).
const FIRST_CONNECT: Duration = Duration::from_secs(3);

/// This machine in the cluster, as its leader sees it.
pub(in crate::leader) struct ClusterNode {
    pub(super) config: ClusterConfig,
    pub(super) bot: BotId,
    /// This machine's id (docs/CLUSTER.md, *The lease*), or why it has none.
    pub(super) node_id: Result<String, String>,
    pub(super) cluster: watch::Sender<Option<Cluster>>,
    leadership: watch::Sender<Leadership>,
    link: watch::Sender<ClusterLink>,
}

impl ClusterNode {
    /// This machine's side of the cluster; its id is kept in a private
    /// file beside the store (`<bot>.node-id`), made the first time.
    pub fn new(config: ClusterConfig, bot: BotId, store_path: &Path) -> Self {
        let node_id = node_id(&store_path.with_extension("node-id"));
        let link = ClusterLink {
            node: config.node.to_string(),
            state: ClusterLinkState::Connecting,
            reason: None,
            polled_by: None,
        };
        Self {
            config,
            bot,
            node_id,
            cluster: watch::channel(None).0,
            leadership: watch::channel(Leadership::Unknown).0,
            link: watch::channel(link).0,
        }
    }

    pub fn name(&self) -> &NodeName {
        &self.config.node
    }

    /// The connection, once made.
    pub fn cluster(&self) -> Option<Cluster> {
        self.cluster.borrow().clone()
    }

    /// The connection, waiting a little for the first one.
    pub async fn connected(&self) -> Option<Cluster> {
        let mut cluster = self.cluster.subscribe();
        let found = tokio::time::timeout(FIRST_CONNECT, cluster.wait_for(Option::is_some)).await;
        found.ok().and_then(Result::ok).and_then(|c| c.clone())
    }

    pub fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership.subscribe()
    }

    /// The link as the status line shows it, and every change.
    pub fn link(&self) -> watch::Receiver<ClusterLink> {
        self.link.subscribe()
    }

    pub fn is_up(&self) -> bool {
        self.link.borrow().state == ClusterLinkState::Up
    }

    pub(super) fn set_link(&self, state: ClusterLinkState, reason: Option<String>) {
        self.link.send_if_modified(|l| {
            let changed = l.state != state || l.reason != reason;
            l.state = state;
            l.reason = reason;
            changed
        });
    }

    pub(super) fn set_leadership(&self, now: Leadership) {
        let polled_by = match &now {
            Leadership::Leading { .. } => Some(self.name().to_string()),
            Leadership::Follower { leader } => leader.as_ref().map(|(n, _)| n.to_string()),
            Leadership::Unknown => None,
        };
        self.leadership.send_replace(now);
        self.link.send_if_modified(|l| {
            let changed = l.polled_by != polled_by;
            l.polled_by = polled_by;
            changed
        });
    }
}

/// Reads this machine's id, or makes one: a random id in a file of the
/// user's own that nobody else can write (`paths`' checks).
fn node_id(path: &Path) -> Result<String, String> {
    use std::io::{Read, Write};
    let shown = path.display();
    match crate::paths::open_private_file(path) {
        Ok(Some(mut file)) => {
            let mut text = String::new();
            file.read_to_string(&mut text)
                .map_err(|e| format!("cannot read {shown}: {e}"))?;
            let id = text.trim();
            let shaped = !id.is_empty()
                && id.len() <= 64
                && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
            if shaped {
                Ok(id.to_string())
            } else {
                Err(format!(
                    "{shown} does not hold a node id; remove it and this machine joins as a new one (run `agent-relay cluster forget <name>` for its old name first)"
                ))
            }
        }
        Ok(None) => {
            let id = uuid::Uuid::new_v4().to_string();
            let mut file = crate::paths::create_private_file(path).map_err(|e| e.to_string())?;
            file.write_all(format!("{id}\n").as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("cannot write {shown}: {e}"))?;
            Ok(id)
        }
        Err(e) => Err(e.to_string()),
    }
}

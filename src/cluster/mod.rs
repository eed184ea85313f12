//! One bot across several machines, over NATS JetStream (docs/CLUSTER.md).
//!
//! This is the NATS layer the leader uses, behind a small typed API;
//! it knows nothing of the bus, sessions, hosts or Telegram, and carries
//! whatever the leader gives it as opaque JSON or bytes:
//!
//! * [`Cluster::connect`] — the connection, with credentials and TLS from
//!   [`ClusterConfig`], the buckets and the stream made if missing, and this
//!   machine's name claimed, so two machines never share one.
//! * [`lease`] — the bot-wide lease: who polls Telegram, its term as the
//!   fencing token, a watch of who leads.
//! * [`inbound`] — updates into the stream deduplicated by update id, and a
//!   durable pull consumer per node.
//! * [`claims`] — slots, topics and the offset in a key-value bucket, by
//!   compare-and-set; the offset fenced by the lease term.
//! * [`calls`] — Bot API calls from any node to the leader of a term, by
//!   request/reply.
//! * [`nodes`] — questions to every machine at once (`/relay status`,
//!   `/relay restart`), and forgetting a machine for good.
//! * [`server`] — the one request/reply server both answer with.
//! * `buckets` — every write to a key-value bucket, by compare-and-set.
//!
//! The leader uses it from `src/leader/cluster/`, at the seams
//! docs/CLUSTER.md names (*Where it plugs in*). The module is
//! public so that its own tests (`tests/cluster.rs`, against a real
//! `nats-server -js`) use it as the leader does.

mod buckets;
pub mod calls;
pub mod claims;
pub mod inbound;
pub mod lease;
pub mod nodes;
pub mod server;

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream};
use tokio::sync::watch;

use crate::backoff::Backoff;
pub use crate::config::{
    ClusterConfig, ClusterTlsFile, NatsCredentials, NatsUrl, NatsUrlAuth, NkeySeed,
};
pub use crate::ids::{BotId, NodeName};
use crate::redact::redact;

/// How long one request to NATS may take before it counts as failed. The
/// lease renews every second and steps down after three without an
/// answer, so no single request may hang longer than that.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Bounds one NATS operation by [`REQUEST_TIMEOUT`].
async fn timed<T, E>(op: impl std::future::Future<Output = Result<T, E>>) -> Result<T, ClusterError>
where
    E: Into<ClusterError>,
{
    match tokio::time::timeout(REQUEST_TIMEOUT, op).await {
        Ok(result) => result.map_err(Into::into),
        Err(_) => Err(ClusterError::Unreachable(format!(
            "no answer within {REQUEST_TIMEOUT:?}"
        ))),
    }
}

/// Why a cluster operation failed. Messages never carry a secret: they
/// pass through [`redact`], and URLs are shown without credentials.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterError {
    /// NATS cannot be reached, or did not answer in time.
    #[error("the cluster is unreachable: {0}")]
    Unreachable(String),
    /// NATS answered with an error.
    #[error("NATS refused: {0}")]
    Refused(String),
    /// Another machine already uses this node name.
    #[error(
        "node name `{name}` is taken by another machine in this cluster; set cluster.node_name (or AGENT_RELAY_NODE_NAME) to a name of its own"
    )]
    NodeNameTaken { name: NodeName },
    /// A claim is held by somebody else (create-if-absent lost).
    #[error("`{key}` is already claimed")]
    Taken { key: String },
    /// A compare-and-set found another revision: somebody wrote since it
    /// was read.
    #[error("`{key}` changed since it was read")]
    Changed { key: String },
    /// A fenced write by a term that is not (or no longer) the lease's.
    #[error("term {term} is fenced off: {why}")]
    Fenced { term: u64, why: String },
    /// A credentials or key file that is not the user's own private file
    /// (docs/DESIGN.md, *Trust*), or not what it should be.
    #[error("{0}")]
    Untrusted(String),
    /// Something in NATS that the relay did not write as it is.
    #[error("cannot read `{what}` from the cluster: {message}")]
    Decode { what: String, message: String },
}

impl ClusterError {
    fn unreachable(e: impl std::fmt::Display) -> Self {
        Self::Unreachable(redact(&e.to_string()).into_owned())
    }

    fn refused(e: impl std::fmt::Display) -> Self {
        Self::Refused(redact(&e.to_string()).into_owned())
    }

    fn unreadable(what: &str, e: impl std::fmt::Display) -> Self {
        Self::Decode {
            what: what.to_string(),
            message: redact(&e.to_string()).into_owned(),
        }
    }
}

/// A machine's identity: its configured name and a random id it keeps in
/// its state directory, so a local failover keeps the lease and two
/// machines under one name are told apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub name: NodeName,
    pub id: String,
}

/// Whether the connection to NATS is up, for the status line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Up,
    Down,
}

/// The names of one bot's things on NATS (docs/CLUSTER.md, *Names on NATS*).
#[derive(Debug, Clone)]
struct Names {
    bot: BotId,
}

impl Names {
    fn lease_bucket(&self) -> String {
        format!("relay-{}-lease", self.bot)
    }
    fn claims_bucket(&self) -> String {
        format!("relay-{}-claims", self.bot)
    }
    fn inbound_stream(&self) -> String {
        format!("RELAY_{}_IN", self.bot)
    }
    fn inbound_subject(&self, node: &NodeName) -> String {
        format!("relay.{}.in.{node}", self.bot)
    }
    fn call_subject(&self, term: lease::Term) -> String {
        format!("relay.{}.call.{}", self.bot, term.0)
    }
    /// Answered by the machine's relay while it is connected: how other
    /// machines learn that a holder's process is gone
    /// ([`lease::Presence`]).
    fn presence_subject(&self, node_id: &str) -> String {
        format!("relay.{}.present.{node_id}", self.bot)
    }
    fn question_subject(&self, question: nodes::Question) -> String {
        format!("relay.{}.{}", self.bot, question.word())
    }
    fn consumer(&self, node: &NodeName) -> String {
        format!("node-{node}")
    }
}

/// A connection to the cluster for one bot and one node. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    client: async_nats::Client,
    js: jetstream::Context,
    node: Node,
    names: Names,
    lease_kv: kv::Store,
    claims_kv: kv::Store,
    inbound: stream::Stream,
    link: watch::Receiver<Link>,
}

impl Cluster {
    /// Connects, makes the buckets and the stream if they are missing
    /// (three replicas when the NATS deployment is a cluster that can hold
    /// them, else one), and claims this node's name.
    pub async fn connect(
        config: &ClusterConfig,
        bot: BotId,
        node_id: &str,
    ) -> Result<Self, ClusterError> {
        let cluster = Self::connect_unclaimed(config, bot, node_id).await?;
        cluster.claims().claim_node(&cluster.node).await?;
        Ok(cluster)
    }

    /// [`Cluster::connect`] without claiming the node's name: for looking
    /// after the cluster from a terminal (`agent-relay cluster`), never for
    /// a relay.
    pub async fn connect_unclaimed(
        config: &ClusterConfig,
        bot: BotId,
        node_id: &str,
    ) -> Result<Self, ClusterError> {
        let (link_tx, link) = watch::channel(Link::Up);
        let client = connect_client(config, link_tx).await?;
        let js = jetstream::ContextBuilder::new()
            .timeout(REQUEST_TIMEOUT)
            .build(client.clone());
        let names = Names { bot };
        let lease_kv = bucket(
            &js,
            kv::Config {
                bucket: names.lease_bucket(),
                description: "agent-relay: the bot-wide lease (docs/CLUSTER.md)".into(),
                history: 1,
                max_age: lease::LEASE_TIME,
                ..Default::default()
            },
        )
        .await?;
        let claims_kv = bucket(
            &js,
            kv::Config {
                bucket: names.claims_bucket(),
                description: "agent-relay: nodes, slots, topics, offset (docs/CLUSTER.md)".into(),
                history: 1,
                ..Default::default()
            },
        )
        .await?;
        let inbound = inbound::ensure_stream(&js, &names).await?;
        let cluster = Self {
            client,
            js,
            node: Node {
                name: config.node.clone(),
                id: node_id.to_string(),
            },
            names,
            lease_kv,
            claims_kv,
            inbound,
            link,
        };
        Ok(cluster)
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    /// Whether the connection is up now, and every change.
    pub fn link(&self) -> watch::Receiver<Link> {
        self.link.clone()
    }

    /// Waits until the server has processed everything this connection
    /// sent before (a subscription, say): a request and its answer on the
    /// same connection, which the server handles in order. (The client's
    /// `flush` only waits for the socket write.)
    pub async fn round_trip(&self) -> Result<(), ClusterError> {
        timed(async {
            self.client
                .request("$JS.API.INFO", bytes::Bytes::new())
                .await
                .map(drop)
                .map_err(ClusterError::unreachable)
        })
        .await
    }
}

/// The NATS client's options from `[cluster]`: how it proves itself (a
/// creds file, an nkey, or a user and password or token from the URL) and
/// its TLS.
fn connect_options(config: &ClusterConfig) -> Result<async_nats::ConnectOptions, ClusterError> {
    let mut options = match &config.credentials {
        Some(NatsCredentials::CredsFile(path)) => {
            let creds = read_private(path)?;
            async_nats::ConnectOptions::with_credentials(&creds).map_err(|e| {
                ClusterError::Untrusted(format!(
                    "{} is not a NATS creds file: {}",
                    path.display(),
                    redact(&e.to_string())
                ))
            })?
        }
        Some(NatsCredentials::Nkey(seed)) => {
            async_nats::ConnectOptions::with_nkey(seed.expose().to_string())
        }
        // A user and password (or a token) written into the URL go as
        // options, never in the address the client logs.
        None => match config.servers.iter().find_map(NatsUrl::auth) {
            Some(NatsUrlAuth::UserPassword { user, password }) => {
                async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
            }
            Some(NatsUrlAuth::Token(token)) => {
                async_nats::ConnectOptions::with_token(token.clone())
            }
            None => async_nats::ConnectOptions::new(),
        },
    };
    if config.require_tls {
        options = options.require_tls(true);
    }
    if let Some(ca) = &config.tls.ca_file {
        options = options.add_root_certificates(ca.clone());
    }
    if let (Some(cert), Some(key)) = (&config.tls.cert_file, &config.tls.key_file) {
        // The private key is a secret of the user's: checked like the
        // creds file before the TLS library reads it.
        read_private(key)?;
        options = options.add_client_certificate(cert.clone(), key.clone());
    }
    Ok(options)
}

/// Connects to the cluster's NATS servers; `link` follows the connection
/// from then on.
async fn connect_client(
    config: &ClusterConfig,
    link: watch::Sender<Link>,
) -> Result<async_nats::Client, ClusterError> {
    let options = connect_options(config)?;
    let link_tx = std::sync::Arc::new(link);
    let servers: Vec<async_nats::ServerAddr> = config
        .servers
        .iter()
        .map(|u| u.address().parse::<async_nats::ServerAddr>())
        .collect::<Result<_, _>>()
        .map_err(|e: std::io::Error| {
            ClusterError::Unreachable(format!("bad NATS URL: {}", redact(&e.to_string())))
        })?;
    let shown: Vec<String> = config.servers.iter().map(ToString::to_string).collect();
    options
        .name(format!("agent-relay {}", config.node))
        .connection_timeout(REQUEST_TIMEOUT)
        .request_timeout(Some(REQUEST_TIMEOUT))
        .event_callback(move |event| {
            let link_tx = link_tx.clone();
            async move {
                match event {
                    async_nats::Event::Connected => {
                        link_tx.send_replace(Link::Up);
                    }
                    async_nats::Event::Disconnected | async_nats::Event::Closed => {
                        link_tx.send_replace(Link::Down);
                    }
                    other => tracing::debug!("NATS: {}", redact(&other.to_string())),
                }
            }
        })
        .connect(servers)
        .await
        .map_err(|e| {
            let said = redact(&e.to_string()).into_owned();
            ClusterError::Unreachable(format!("{}: {said}", shown.join(", ")))
        })
}

/// Reads a secret file of the user's, only after `paths` checked it: a
/// regular file of the user's own that nobody else can read or write, not
/// a symlink.
fn read_private(path: &std::path::Path) -> Result<String, ClusterError> {
    use std::io::Read;
    let mut file = crate::paths::open_secret_file(path)
        .map_err(|e| ClusterError::Untrusted(e.to_string()))?
        .ok_or_else(|| ClusterError::Untrusted(format!("{} does not exist", path.display())))?;
    let mut text = String::new();
    file.read_to_string(&mut text)
        .map_err(|e| ClusterError::Untrusted(format!("cannot read {}: {e}", path.display())))?;
    Ok(text)
}

/// Replicas for what the relay creates: three when the deployment can
/// hold them, else one (a single server refuses more than one).
const REPLICAS: [usize; 2] = [3, 1];

/// Opens a key-value bucket, creating it if it is missing.
///
/// The bucket's stream is made here, with the settings the key-value API
/// gives a bucket (one subject per key, rollups allowed, deletes as
/// markers, direct gets, discard new), rather than by
/// `create_key_value`: that asks for the account's info first and cannot
/// read the answer of Debian's nats-server 2.9 (it lacks the reserved
/// storage fields).
async fn bucket(js: &jetstream::Context, config: kv::Config) -> Result<kv::Store, ClusterError> {
    let name = config.bucket.clone();
    open_or_create(
        js,
        &format!("the bucket {name}"),
        || async { js.get_key_value(&name).await },
        |replicas| stream::Config {
            name: format!("KV_{name}"),
            description: Some(config.description.clone()),
            subjects: vec![format!("$KV.{name}.>")],
            max_messages_per_subject: config.history.max(1),
            max_age: config.max_age,
            storage: stream::StorageType::File,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            discard: stream::DiscardPolicy::New,
            num_replicas: replicas,
            ..Default::default()
        },
    )
    .await
}

/// How long a stream is asked for with three replicas while the NATS
/// cluster has too few servers to place them (one that just started is
/// still forming) before it is made with one.
const PLACEMENT_WAIT: Duration = Duration::from_secs(10);

/// What `open` finds, else what it finds once the stream `config` gives is
/// made: with three replicas, else one ([`REPLICAS`]). One replica only
/// when three cannot be: a server that is no cluster says so at once; a
/// cluster that cannot place three yet is asked again for
/// [`PLACEMENT_WAIT`] (a fresh one is still forming, and a bucket made
/// with one replica would stay so). Another node may make the stream
/// meanwhile, so a create that fails is followed by another look. Every
/// step is bounded by [`timed`]: no create hangs a connect.
async fn open_or_create<T, E, Found>(
    js: &jetstream::Context,
    what: &str,
    open: impl Fn() -> Found,
    config: impl Fn(usize) -> stream::Config,
) -> Result<T, ClusterError>
where
    Found: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let look = || timed(async { open().await.map_err(ClusterError::unreachable) });
    if let Ok(found) = look().await {
        return Ok(found);
    }
    let mut last = String::new();
    for replicas in REPLICAS {
        let placing_until = Instant::now() + PLACEMENT_WAIT;
        let mut retry = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        loop {
            let created =
                tokio::time::timeout(REQUEST_TIMEOUT, js.create_stream(config(replicas))).await;
            let unplaced = match created {
                Ok(Ok(_)) => false,
                Ok(Err(e)) => {
                    last = e.to_string();
                    replicas > 1 && cannot_place_yet(&e)
                }
                Err(_) => {
                    last = format!("no answer within {REQUEST_TIMEOUT:?}");
                    false
                }
            };
            if let Ok(found) = look().await {
                return Ok(found);
            }
            if !unplaced || Instant::now() >= placing_until {
                break;
            }
            tokio::time::sleep(retry.step()).await;
        }
    }
    Err(ClusterError::refused(format!(
        "cannot create {what}: {last}"
    )))
}

/// Whether a refused create means "not enough servers yet" (a cluster
/// still forming), rather than "this server is no cluster".
fn cannot_place_yet(e: &jetstream::context::CreateStreamError) -> bool {
    use jetstream::ErrorCode;
    use jetstream::context::CreateStreamErrorKind;
    match e.kind() {
        CreateStreamErrorKind::JetStream(e) => matches!(
            e.error_code(),
            ErrorCode::CLUSTER_NO_PEERS | ErrorCode::INSUFFICIENT_RESOURCES
        ),
        _ => false,
    }
}

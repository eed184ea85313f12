//! The outbox's remote twin (docs/CLUSTER.md, *Outbound*): every Bot API
//! call of this leader, with the same methods as [`Outbox`]. Without a
//! cluster, or while this machine holds the bot-wide lease, they are the
//! local outbox's. Otherwise each call goes to the leader of the current
//! term over NATS and runs through its outbox, so one rate limiter paces
//! the whole bot and the one decision of what a failure means is made
//! there and carried back as it was made.
//!
//! While the cluster link is down the machine is *sending only*: its
//! sessions' text, edits and chat actions go straight to Telegram through
//! the local outbox (Telegram refuses a second poller, not a second
//! sender), paced by the local limiter and every `retry_after`; topics are
//! neither created nor deleted, since their claims need NATS.
//!
//! Files are the exception: the bytes are on this machine, so downloads
//! and uploads use the local outbox (its own limiter and every
//! `retry_after`), as do closing and reopening a topic. A request made
//! through another machine is paced there with its priority, but the
//! session hears no `paced` frame for it: the wait is not shown.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Leader;
use super::cluster::ClusterNode;
use super::outbox::{BotCache, MANAGE_DEADLINE, Outbox, TOPIC_DEADLINE, Upload};
use crate::backoff::Backoff;
use crate::cluster::Cluster;
use crate::cluster::calls::CallError;
use crate::cluster::lease::{Leadership, Term};
use crate::protocol::bus::*;
use crate::telegram::{BotApi, BotInfo, ChatBudget, Priority, TelegramError};

/// How much longer a caller waits than the leader's own deadline, so that
/// the leader's answer (sent, or why not) is what it hears.
const ANSWER_MARGIN: Duration = Duration::from_secs(10);

/// A call as it travels to the leader.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "camelCase")]
pub(super) enum Call {
    Perform {
        target: Target,
        op: TopicOp,
        priority: Priority,
    },
    Say {
        chat: i64,
        thread: Option<i64>,
        text: String,
    },
    AnswerCallback {
        callback_id: String,
        text: Option<String>,
        alert: bool,
    },
    CreateTopic {
        chat: i64,
        name: String,
    },
    DeleteTopic {
        target: Target,
    },
    Probe {
        target: Target,
    },
    Bot,
}

impl Call {
    /// Whether a call that got no answer may have taken effect: then it
    /// is never asked again (a duplicate is worse than a gap).
    fn ambiguous(&self) -> bool {
        matches!(
            self,
            Call::Perform {
                op: TopicOp::SendText(_),
                ..
            } | Call::Say { .. }
                | Call::CreateTopic { .. }
        )
    }

    /// Whether the machine makes it itself while the cluster link is down.
    fn sends_without_cluster(&self) -> bool {
        !matches!(self, Call::CreateTopic { .. } | Call::DeleteTopic { .. })
    }

    /// How long the leader's outbox may take, and the caller a little longer.
    fn budget(&self) -> Duration {
        let leader = match self {
            Call::Perform { .. } | Call::Say { .. } => TOPIC_DEADLINE,
            _ => MANAGE_DEADLINE,
        };
        leader + ANSWER_MARGIN
    }
}

/// The leader's answer: a result, its decision about a topic request, or
/// Telegram's failure.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub(super) enum Answer {
    Done { value: Value },
    Refused { error: BusError },
    Failed { error: Failure },
}

/// A Telegram failure as it travels: enough of it for every decision the
/// caller makes (gone, closed, rate limited, ambiguous, transient).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Failure {
    kind: FailureKind,
    message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
enum FailureKind {
    TopicGone,
    TopicClosed,
    RateLimited,
    Ambiguous,
    Transient,
    Rights,
    Other,
}

impl From<&TelegramError> for Failure {
    fn from(e: &TelegramError) -> Self {
        let kind = match e {
            TelegramError::ThreadGone { .. } => FailureKind::TopicGone,
            TelegramError::TopicClosed { .. } => FailureKind::TopicClosed,
            TelegramError::RateLimited { .. } => FailureKind::RateLimited,
            TelegramError::NotEnoughRights { .. } => FailureKind::Rights,
            _ if e.commit_unknown() => FailureKind::Ambiguous,
            _ if e.is_transient() => FailureKind::Transient,
            _ => FailureKind::Other,
        };
        Self {
            kind,
            message: e.to_string(),
            retry_after_ms: e.retry_after().map(|d| d.as_millis() as u64),
        }
    }
}

impl From<Failure> for TelegramError {
    fn from(f: Failure) -> Self {
        let description = f.message;
        match f.kind {
            FailureKind::TopicGone => TelegramError::ThreadGone { description },
            FailureKind::TopicClosed => TelegramError::TopicClosed { description },
            FailureKind::RateLimited => TelegramError::RateLimited {
                retry_after: Duration::from_millis(f.retry_after_ms.unwrap_or(1000)),
            },
            FailureKind::Rights => TelegramError::NotEnoughRights { description },
            FailureKind::Ambiguous => TelegramError::Network {
                message: description,
                commit_unknown: true,
            },
            FailureKind::Transient => TelegramError::Network {
                message: description,
                commit_unknown: false,
            },
            FailureKind::Other => TelegramError::BadRequest { description },
        }
    }
}

/// How a call through the cluster came out.
enum Outcome {
    /// Make it here (no cluster, this machine leads, or sending only).
    Local,
    Answered(Answer),
    /// Nothing was sent: no leader in time, or no cluster for a call that needs one.
    NotSent(String),
    /// No answer: it may or may not have happened.
    Unknown(String),
}

/// Every Bot API call of this leader: its own outbox, or the bot-wide
/// leader's through the cluster.
pub(super) struct Outbound {
    local: Outbox,
    node: Option<Arc<ClusterNode>>,
    /// `getMe`, kept as the local outbox keeps it.
    bot: BotCache,
}

impl Outbound {
    pub fn new(local: Outbox, node: Option<Arc<ClusterNode>>) -> Self {
        Self {
            local,
            node,
            bot: BotCache::default(),
        }
    }

    /// The local client, for the poller (which runs only where the lease is).
    pub fn api(&self) -> &BotApi {
        self.local.api()
    }

    /// The chats' message budgets of this machine's limiter.
    pub fn budgets(&self) -> Vec<ChatBudget> {
        self.local.budgets()
    }

    pub async fn perform(
        &self,
        target: Target,
        op: &TopicOp,
        priority: Priority,
        waiting: impl Fn(Duration) + Sync,
    ) -> Result<TopicDone, BusError> {
        let call = Call::Perform {
            target,
            op: op.clone(),
            priority,
        };
        match self.through_cluster(&call).await {
            Outcome::Local => self.local.perform(target, op, priority, waiting).await,
            Outcome::Answered(Answer::Done { value }) => serde_json::from_value(value)
                .map_err(|e| BusError::new(BusErrorCode::Internal, e.to_string())),
            Outcome::Answered(Answer::Refused { error }) => Err(error),
            Outcome::Answered(Answer::Failed { error }) => Err(super::outbox::decide(error.into())),
            Outcome::NotSent(why) => Err(BusError::new(BusErrorCode::Unavailable, why)),
            Outcome::Unknown(why) => Err(BusError::new(BusErrorCode::CommitUnknown, why)),
        }
    }

    pub async fn say(
        &self,
        chat: i64,
        thread: Option<i64>,
        text: &str,
    ) -> Result<(), TelegramError> {
        let call = Call::Say {
            chat,
            thread,
            text: text.to_string(),
        };
        match self.through_cluster(&call).await {
            Outcome::Local => self.local.say(chat, thread, text).await,
            other => telegram(other).map(drop),
        }
    }

    pub async fn answer_callback(
        &self,
        callback_id: &str,
        text: Option<&str>,
        alert: bool,
    ) -> Result<(), TelegramError> {
        let call = Call::AnswerCallback {
            callback_id: callback_id.to_string(),
            text: text.map(String::from),
            alert,
        };
        match self.through_cluster(&call).await {
            Outcome::Local => self.local.answer_callback(callback_id, text, alert).await,
            other => telegram(other).map(drop),
        }
    }

    pub async fn create_topic(&self, chat: i64, name: &str) -> Result<Target, TelegramError> {
        let call = Call::CreateTopic {
            chat,
            name: name.to_string(),
        };
        match self.through_cluster(&call).await {
            Outcome::Local => self.local.create_topic(chat, name).await,
            other => decode(telegram(other)?),
        }
    }

    pub async fn delete_topic(&self, target: Target) -> Result<(), TelegramError> {
        match self.through_cluster(&Call::DeleteTopic { target }).await {
            Outcome::Local => self.local.delete_topic(target).await,
            other => telegram(other).map(drop),
        }
    }

    pub async fn probe(&self, target: Target) -> Result<bool, TelegramError> {
        match self.through_cluster(&Call::Probe { target }).await {
            Outcome::Local => self.local.probe(target).await,
            other => decode(telegram(other)?),
        }
    }

    /// `getMe`, asked once per leader — and again while the bot has no
    /// topics in private chats (the user may switch them on meanwhile).
    pub async fn bot(&self) -> Result<BotInfo, TelegramError> {
        self.bot
            .get(|| async {
                match self.through_cluster(&Call::Bot).await {
                    Outcome::Local => self.local.bot().await,
                    other => decode(telegram(other)?),
                }
            })
            .await
    }

    /// Sends a file from this machine (see the module docs).
    pub async fn send_file(&self, target: Target, upload: &Upload) -> Result<TopicDone, BusError> {
        self.local.send_file(target, upload).await
    }

    /// Downloads a file into this machine's inbox (see the module docs).
    pub async fn download(&self, file_id: &str, dir: &Path, name: &str) -> Result<u64, BusError> {
        self.local.download(file_id, dir, name).await
    }

    pub async fn close_topic(&self, target: Target) -> Result<(), TelegramError> {
        self.local.close_topic(target).await
    }

    pub async fn reopen_topic(&self, target: Target) -> Result<(), TelegramError> {
        self.local.reopen_topic(target).await
    }

    /// Makes a call another machine asked for, here: this machine leads.
    async fn answer_locally(&self, call: &Call) -> Answer {
        fn done<T: Serialize>(r: Result<T, TelegramError>) -> Answer {
            match r {
                Ok(value) => Answer::Done {
                    value: serde_json::to_value(value).unwrap_or(Value::Null),
                },
                Err(e) => Answer::Failed {
                    error: Failure::from(&e),
                },
            }
        }
        match call {
            Call::Perform {
                target,
                op,
                priority,
            } => match self.local.perform(*target, op, *priority, |_| {}).await {
                Ok(value) => Answer::Done {
                    value: serde_json::to_value(value).unwrap_or(Value::Null),
                },
                Err(error) => Answer::Refused { error },
            },
            Call::Say { chat, thread, text } => done(self.local.say(*chat, *thread, text).await),
            Call::AnswerCallback {
                callback_id,
                text,
                alert,
            } => done(
                self.local
                    .answer_callback(callback_id, text.as_deref(), *alert)
                    .await,
            ),
            Call::CreateTopic { chat, name } => done(self.local.create_topic(*chat, name).await),
            Call::DeleteTopic { target } => done(self.local.delete_topic(*target).await),
            Call::Probe { target } => done(self.local.probe(*target).await),
            Call::Bot => done(self.local.bot().await),
        }
    }

    /// Where a call is made: here, or by the leader of the current term,
    /// asked again when that leader is gone before it answered and the
    /// call may safely be repeated.
    async fn through_cluster(&self, call: &Call) -> Outcome {
        let Some(node) = &self.node else {
            return Outcome::Local;
        };
        let deadline = Instant::now() + call.budget();
        let mut leadership = node.leadership();
        loop {
            let term = match leader_term(node, &mut leadership, call, deadline).await {
                Ok(Some(term)) => term,
                Ok(None) => return Outcome::Local,
                Err(why) => return Outcome::NotSent(why),
            };
            let Some(calls) = node.cluster().map(|c| c.calls()) else {
                return Outcome::NotSent("the cluster is not connected".into());
            };
            let left = deadline.saturating_duration_since(Instant::now());
            let asked = calls.call::<_, Answer>(term, call, left);
            // A leader that loses its lease mid-call never answers: stop
            // waiting when the lease names another term.
            let moved = async {
                let _ = leadership
                    .wait_for(|l| l.term().is_some_and(|t| t != term))
                    .await;
            };
            let result = tokio::select! {
                result = asked => result,
                () = moved => Err(CallError::TimedOut(left)),
            };
            match result {
                Ok(answer) => return Outcome::Answered(answer),
                // Nobody serves that term (yet, or any more): nothing was sent.
                Err(CallError::NoLeader(_)) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(CallError::TimedOut(_)) if call.ambiguous() => {
                    return Outcome::Unknown(format!(
                        "the machine that polls Telegram (term {term}) did not answer; the message may or may not have been sent"
                    ));
                }
                Err(CallError::TimedOut(_)) => {}
                Err(CallError::Cluster(e)) => {
                    tracing::debug!(%term, "a call through the cluster failed: {e}");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
            }
            if Instant::now() >= deadline {
                return Outcome::NotSent(format!(
                    "no machine that polls Telegram answered within {:?}",
                    call.budget()
                ));
            }
        }
    }
}

/// The term of the machine to ask, `None` to make the call here, or why
/// it cannot be made at all.
async fn leader_term(
    node: &ClusterNode,
    leadership: &mut tokio::sync::watch::Receiver<Leadership>,
    call: &Call,
    deadline: Instant,
) -> Result<Option<Term>, String> {
    let mut link = node.link();
    loop {
        let state = link.borrow_and_update().state;
        if state == ClusterLinkState::Down {
            return if call.sends_without_cluster() {
                Ok(None)
            } else {
                let reason = link.borrow().reason.clone().unwrap_or_default();
                Err(format!(
                    "the cluster is unreachable ({reason}): topics are created and deleted only with it"
                ))
            };
        }
        match leadership.borrow_and_update().clone() {
            Leadership::Leading { .. } => return Ok(None),
            Leadership::Follower {
                leader: Some((_, term)),
            } if state == ClusterLinkState::Up => return Ok(Some(term)),
            _ => {}
        }
        // Connecting, or between two leaders: wait for the lease to name one.
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {
                return Err("no machine holds the bot-wide lease".into());
            }
            _ = leadership.changed() => {}
            _ = link.changed() => {}
        }
    }
}

/// A Telegram-shaped result of a call made elsewhere.
fn telegram(outcome: Outcome) -> Result<Value, TelegramError> {
    match outcome {
        Outcome::Answered(Answer::Done { value }) => Ok(value),
        Outcome::Answered(Answer::Failed { error }) => Err(error.into()),
        Outcome::Answered(Answer::Refused { error }) => Err(TelegramError::BadRequest {
            description: error.message,
        }),
        Outcome::NotSent(message) => Err(TelegramError::Network {
            message,
            commit_unknown: false,
        }),
        Outcome::Unknown(message) => Err(TelegramError::Network {
            message,
            commit_unknown: true,
        }),
        Outcome::Local => Err(TelegramError::Refused {
            reason: "a local call reached the cluster's path",
        }),
    }
}

fn decode<T: serde::de::DeserializeOwned>(value: Value) -> Result<T, TelegramError> {
    serde_json::from_value(value).map_err(|e| TelegramError::Malformed {
        message: format!("an answer through the cluster: {e}"),
        commit_unknown: false,
    })
}

/// The leading machine's end: the other machines' calls for `term`, each
/// made by this machine's outbox as its own sessions' calls are, until
/// the term ends. Calls under way then end with it: their callers see the
/// lease move and decide (a send is `commitUnknown`, never repeated).
pub(super) async fn serve(
    leader: Arc<Leader>,
    cluster: Cluster,
    term: Term,
    stop: CancellationToken,
) {
    // NATS may be electing its own leaders right now (a server of its
    // cluster was lost): the other machines' calls wait meanwhile.
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
    let mut server = loop {
        match cluster.calls().serve(term).await {
            Ok(server) => break server,
            Err(e) => {
                tracing::warn!(%term, "cannot serve the other machines' calls yet: {e}");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(backoff.step()) => {}
                }
            }
        }
    };
    let mut running = JoinSet::new();
    loop {
        let next = tokio::select! {
            () = stop.cancelled() => break,
            Some(_) = running.join_next(), if !running.is_empty() => continue,
            next = server.next::<Call>() => next,
        };
        let Some(incoming) = next else { break };
        let leader = leader.clone();
        running.spawn(async move {
            tracing::debug!(from = %incoming.from, "a call from another machine");
            let answer = leader.outbox.answer_locally(&incoming.request).await;
            if let Err(e) = incoming.answer(&answer).await {
                tracing::debug!("cannot answer a call: {e}");
            }
        });
    }
    running.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_travels_with_every_decision_it_carries() {
        let cases = [
            TelegramError::ThreadGone {
                description: "gone".into(),
            },
            TelegramError::RateLimited {
                retry_after: Duration::from_secs(7),
            },
            TelegramError::Timeout {
                commit_unknown: true,
            },
            TelegramError::Network {
                message: "reset".into(),
                commit_unknown: false,
            },
            TelegramError::NotEnoughRights {
                description: "no".into(),
            },
        ];
        for e in cases {
            let wire: Failure =
                serde_json::from_str(&serde_json::to_string(&Failure::from(&e)).unwrap()).unwrap();
            let back = TelegramError::from(wire);
            assert_eq!(back.commit_unknown(), e.commit_unknown(), "{e}");
            assert_eq!(back.is_transient(), e.is_transient(), "{e}");
            assert_eq!(back.retry_after(), e.retry_after(), "{e}");
            assert_eq!(
                matches!(back, TelegramError::ThreadGone { .. }),
                matches!(e, TelegramError::ThreadGone { .. })
            );
        }
    }

    #[test]
    fn only_sends_that_may_have_happened_are_never_asked_again() {
        let target = Target {
            chat_id: 1,
            thread_id: 2,
        };
        let send = Call::Perform {
            target,
            op: TopicOp::SendText(SendText {
                text: "hi".into(),
                format: TextFormat::Plain,
                buttons: None,
                reply_to: None,
            }),
            priority: Priority::High,
        };
        assert!(send.ambiguous() && send.sends_without_cluster());
        let typing = Call::Perform {
            target,
            op: TopicOp::Typing,
            priority: Priority::Background,
        };
        assert!(!typing.ambiguous() && typing.sends_without_cluster());
        let create = Call::CreateTopic {
            chat: 1,
            name: "A · x".into(),
        };
        assert!(create.ambiguous() && !create.sends_without_cluster());
        assert!(!Call::DeleteTopic { target }.sends_without_cluster());
    }
}

//! Bot API calls through the machine that polls (docs/CLUSTER.md,
//! *Outbound*). Without a cluster, or while this machine holds the
//! bot-wide lease, a call is made here ([`Where::Here`]). Otherwise it goes
//! to the leader of the current term over NATS as the [`BotCall`] it is,
//! and runs through that machine's outbox, so one rate limiter paces the
//! whole bot; the [`Failure`] that decides it is made there and comes back
//! as it was made.
//!
//! While the cluster link is down the machine is *sending only*: its
//! sessions' calls are made here, straight to Telegram (Telegram refuses a
//! second poller, not a second sender), paced by the local limiter and
//! every `retry_after`; topics are neither created nor deleted, since their
//! claims need NATS. A call made through another machine is paced there
//! with its priority, but the session hears no `paced` frame for it.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::super::failure::{Failure, FailureKind, Performed};
use super::Machine;
use super::node::ClusterNode;
use crate::backoff::Backoff;
use crate::cluster::Cluster;
use crate::cluster::calls::CallError;
use crate::cluster::lease::{Leadership, Term};
use crate::protocol::bus::ClusterLinkState;
use crate::telegram::{BotCall, Priority};

/// How much longer a caller waits than the leader's own deadline, so that
/// the leader's answer (made, or why not) is what it hears.
const ANSWER_MARGIN: Duration = Duration::from_secs(10);

/// A call as it travels to the leader of the term.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(in crate::leader) struct RemoteCall {
    call: BotCall,
    priority: Priority,
    deadline_ms: u64,
}

/// The leader's answer, typed as its outbox made it.
type RemoteAnswer = Result<Performed, Failure>;

/// Where a call is made.
pub(in crate::leader) enum Where {
    /// By this machine's outbox.
    Here,
    /// By another machine's, which answered this (or nobody answered, and
    /// the failure says what that means).
    There(RemoteAnswer),
}

/// Whether the machine makes `call` itself while the cluster link is down:
/// everything but creating and deleting topics, whose claims need NATS.
fn sends_without_cluster(call: &BotCall) -> bool {
    !matches!(
        call,
        BotCall::CreateForumTopic(_) | BotCall::DeleteForumTopic(_)
    )
}

/// Where `call` is made, and the answer when another machine made it:
/// asked again when that machine is gone before it answered and the call
/// may safely be repeated. Long because every way a call through another
/// machine can end is decided here, beside the others.
pub(in crate::leader) async fn through(
    node: &ClusterNode,
    call: &BotCall,
    priority: Priority,
    deadline: Duration,
) -> Where {
    let budget = deadline + ANSWER_MARGIN;
    let give_up = Instant::now() + budget;
    let request = RemoteCall {
        call: call.clone(),
        priority,
        deadline_ms: deadline.as_millis() as u64,
    };
    let not_sent = |why: String| Where::There(Err(Failure::new(FailureKind::Unavailable, why)));
    let mut leadership = node.leadership();
    let mut retry = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
    loop {
        let term = match leader_term(node, &mut leadership, call, give_up).await {
            Ok(Some(term)) => term,
            Ok(None) => return Where::Here,
            Err(why) => return not_sent(why),
        };
        let Some(calls) = node.cluster().map(|c| c.calls()) else {
            return not_sent("the cluster is not connected".into());
        };
        let left = give_up.saturating_duration_since(Instant::now());
        let asked = calls.call::<_, RemoteAnswer>(term, &request, left);
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
            Ok(answer) => return Where::There(answer),
            Err(CallError::TimedOut(_)) if call.may_have_happened() => {
                return Where::There(Err(Failure::new(
                    FailureKind::CommitUnknown,
                    format!(
                        "the machine that polls Telegram (term {term}) did not answer; the message may or may not have been sent"
                    ),
                )));
            }
            // Nobody serves that term (yet, or any more), or it did not
            // answer a call that may be repeated: ask again.
            Err(CallError::NoLeader(_) | CallError::TimedOut(_)) => {}
            Err(CallError::Cluster(e)) => {
                tracing::debug!(%term, "a call through the cluster failed: {e}");
            }
        }
        let wait = retry.step();
        if Instant::now() + wait >= give_up {
            return not_sent(format!(
                "no machine that polls Telegram answered within {budget:?}"
            ));
        }
        tokio::time::sleep(wait).await;
    }
}

/// The term of the machine to ask, `None` to make the call here, or why
/// it cannot be made at all.
async fn leader_term(
    node: &ClusterNode,
    leadership: &mut tokio::sync::watch::Receiver<Leadership>,
    call: &BotCall,
    give_up: Instant,
) -> Result<Option<Term>, String> {
    let mut link = node.link();
    loop {
        let state = link.borrow_and_update().state;
        if state == ClusterLinkState::Down {
            return if sends_without_cluster(call) {
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
            () = tokio::time::sleep_until(give_up) => {
                return Err("no machine holds the bot-wide lease".into());
            }
            _ = leadership.changed() => {}
            _ = link.changed() => {}
        }
    }
}

/// The leading machine's end: the other machines' calls for `term`, each
/// made by this machine's outbox as its own sessions' calls are, until
/// the term ends. Calls under way then end with it: their callers see the
/// lease move and decide (a send is `commitUnknown`, never repeated).
pub(in crate::leader) async fn serve<M: Machine>(
    machine: Arc<M>,
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
            next = server.next::<RemoteCall>() => next,
        };
        let Some(incoming) = next else { break };
        let machine = machine.clone();
        running.spawn(crate::tasks::boxed(async move {
            tracing::debug!(from = %incoming.from, "a call from another machine");
            let RemoteCall {
                call,
                priority,
                deadline_ms,
            } = incoming.request.clone();
            let deadline = Duration::from_millis(deadline_ms);
            let answer: RemoteAnswer = machine.call(call, priority, deadline).await;
            if let Err(e) = incoming.answer(&answer).await {
                tracing::debug!("cannot answer a call: {e}");
            }
        }));
    }
    running.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telegram::BotReply;
    use crate::telegram::call::{ChatAction, CreateForumTopic, InTopic, SendChatAction};

    #[test]
    fn only_topic_management_waits_for_the_cluster() {
        let typing = BotCall::SendChatAction(SendChatAction {
            chat_id: 1,
            message_thread_id: Some(2),
            action: ChatAction::Typing,
        });
        assert!(sends_without_cluster(&typing) && !typing.may_have_happened());
        let create = BotCall::CreateForumTopic(CreateForumTopic {
            chat_id: 1,
            name: "A · x".into(),
        });
        assert!(!sends_without_cluster(&create) && create.may_have_happened());
        let delete = BotCall::DeleteForumTopic(InTopic {
            chat_id: 1,
            message_thread_id: 2,
        });
        assert!(!sends_without_cluster(&delete));
    }

    #[test]
    fn answers_travel_typed() {
        let answers: [RemoteAnswer; 2] = [
            Ok(Performed {
                reply: BotReply::Posted { message_id: 7 },
                plain: true,
            }),
            Err(Failure::new(FailureKind::TokenRejected, "401")),
        ];
        for answer in answers {
            let wire = serde_json::to_vec(&answer).unwrap();
            assert_eq!(
                serde_json::from_slice::<RemoteAnswer>(&wire).unwrap(),
                answer
            );
        }
    }
}

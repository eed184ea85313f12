//! This machine's second source of updates besides its own poller: its
//! durable consumer of the cluster's stream (docs/CLUSTER.md, *Inbound*).
//! Each batch is triaged against this machine's own sessions and users,
//! journaled, handed to the router like a poller's batch, and only
//! acknowledged to JetStream once the journal is on disk.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

use super::super::Leader;
use super::super::batch::{Batch, route_then_flush};
use super::super::triage::Triage;
use crate::backoff::Backoff;
use crate::cluster::{Cluster, Link};
use crate::store::StoreError;
use crate::telegram::Update;

/// How long one fetch from this machine's consumer waits for updates.
/// Short: a pull request waiting at a NATS server that is lost (or whose
/// consumer moves to another server of a NATS cluster) is never answered,
/// and costs at most this much delay. One pull request per interval while
/// idle is ~100 bytes.
const FETCH_WAIT: Duration = Duration::from_secs(5);
/// Most updates one fetch takes.
const FETCH_MAX: usize = 100;

/// This machine's second source of updates: its durable consumer. Each
/// batch is triaged against this machine's own sessions and users,
/// journaled, handed to the router like a poller's batch, and only
/// acknowledged to JetStream once the journal is on disk.
pub(super) async fn consume(
    leader: Arc<Leader>,
    cluster: Cluster,
    batches: mpsc::Sender<Batch>,
) -> Result<(), StoreError> {
    let name = cluster.node().name.clone();
    let inbound = cluster.inbound();
    let mut triage = Triage::new(leader.store.clone(), leader.access.clone());
    let mut backoff = Backoff::new(Duration::from_millis(250), Duration::from_secs(5));
    let mut consumer = None;
    // The first consumer of this process is made afresh: a predecessor
    // that died (a local failover) may hold deliveries it never acknowledged.
    let mut fresh = true;
    let mut link = cluster.link();
    while !leader.stop.is_cancelled() {
        if *link.borrow_and_update() == Link::Down {
            tokio::select! {
                () = leader.stop.cancelled() => break,
                _ = link.changed() => continue,
            }
        }
        let reader = match &consumer {
            Some(reader) => reader,
            None => {
                let made = tokio::select! {
                    () = leader.stop.cancelled() => break,
                    made = async {
                        if fresh {
                            inbound.fresh_consumer(&name).await
                        } else {
                            inbound.consumer(&name).await
                        }
                    } => made,
                };
                match made {
                    Ok(made) => {
                        fresh = false;
                        consumer.insert(made)
                    }
                    Err(e) => {
                        tracing::debug!("cannot open this machine's consumer: {e}");
                        tokio::select! {
                            () = leader.stop.cancelled() => break,
                            () = tokio::time::sleep(backoff.step()) => {}
                        }
                        continue;
                    }
                }
            }
        };
        let fetched = tokio::select! {
            () = leader.stop.cancelled() => break,
            fetched = reader.fetch(FETCH_MAX, FETCH_WAIT) => fetched,
            // A pull request does not survive a lost connection (nor a
            // restarted server): ask again once the link is back.
            _ = link.changed() => continue,
        };
        let deliveries = match fetched {
            Ok(deliveries) => deliveries,
            Err(e) => {
                tracing::debug!("fetching this machine's updates failed: {e}");
                consumer = None;
                tokio::select! {
                    () = leader.stop.cancelled() => break,
                    () = tokio::time::sleep(backoff.step()) => {}
                }
                continue;
            }
        };
        backoff.reset();
        if deliveries.is_empty() {
            continue;
        }
        let updates = deliveries.iter().filter_map(|delivery| {
            let decoded = serde_json::from_slice::<Value>(&delivery.payload)
                .map_err(|e| e.to_string())
                .and_then(|v| Update::decode(&v).map_err(|e| e.to_string()));
            match decoded {
                // A tap, a message nobody here journals, a file too big to
                // fetch are answered once: a redelivery is a repeat.
                Ok(update) => Some((update, delivery.delivered <= 1)),
                Err(e) => {
                    tracing::warn!(
                        update = delivery.update_id,
                        "an unreadable update from the cluster: {e}"
                    );
                    None
                }
            }
        });
        let batch = triage.sort(updates);
        let written = leader
            .store()
            .journal_received_unflushed(batch.journaled.iter().map(|e| &e.update))?;
        // A runtime shutting down: nothing is acknowledged, so JetStream
        // hands the batch out again.
        if !route_then_flush(&batches, batch, written).await? {
            break;
        }
        // On disk: JetStream may forget them (docs/CLUSTER.md, *Inbound*).
        let acks = deliveries.iter().map(|d| d.ack());
        for (delivery, acked) in deliveries.iter().zip(futures::future::join_all(acks).await) {
            if let Err(e) = acked {
                tracing::debug!(
                    update = delivery.update_id,
                    "not acknowledged; it comes again and the journal drops it: {e}"
                );
            }
        }
    }
    Ok(())
}

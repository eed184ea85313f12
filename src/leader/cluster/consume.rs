//! This machine's second source of updates besides its own poller: its
//! durable consumer of the cluster's stream (docs/CLUSTER.md, *Inbound*).
//! Each batch is triaged against this machine's own sessions and users,
//! journaled, handed to the router like a poller's batch, and only
//! acknowledged to JetStream once the journal is on disk.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::super::batch::{Batch, route_then_flush};
use super::super::triage::Triage;
use super::Ground;
use crate::backoff::Backoff;
use crate::cluster::inbound::{Delivery, NodeConsumer};
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

/// Reads this machine's consumer until the leader stops (see the module
/// docs). Returns early only with a journal that failed.
pub(super) async fn consume(
    ground: Arc<Ground>,
    cluster: Cluster,
    batches: mpsc::Sender<Batch>,
) -> Result<(), StoreError> {
    let mut reading = Reading {
        triage: Triage::new(ground.store.clone(), ground.access.clone()),
        backoff: Backoff::new(Duration::from_millis(250), Duration::from_secs(5)),
        consumer: None,
        // The first consumer of this process is made afresh: a predecessor
        // that died (a local failover) may hold deliveries it never
        // acknowledged.
        fresh: true,
        ground,
        cluster,
        batches,
    };
    reading.run().await
}

/// This machine's consumer and what reading it needs.
struct Reading {
    ground: Arc<Ground>,
    cluster: Cluster,
    batches: mpsc::Sender<Batch>,
    triage: Triage,
    backoff: Backoff,
    consumer: Option<NodeConsumer>,
    fresh: bool,
}

impl Reading {
    async fn run(&mut self) -> Result<(), StoreError> {
        let stop = self.ground.stop.clone();
        let mut link = self.cluster.link();
        while !stop.is_cancelled() {
            if *link.borrow_and_update() == Link::Down {
                tokio::select! {
                    () = stop.cancelled() => break,
                    _ = link.changed() => continue,
                }
            }
            if self.consumer.is_none() && !self.open().await {
                continue;
            }
            let Some(reader) = &self.consumer else {
                continue;
            };
            let fetched = tokio::select! {
                () = stop.cancelled() => break,
                fetched = reader.fetch(FETCH_MAX, FETCH_WAIT) => fetched,
                // A pull request does not survive a lost connection (nor a
                // restarted server): ask again once the link is back.
                _ = link.changed() => continue,
            };
            match fetched {
                Ok(deliveries) => {
                    self.backoff.reset();
                    if !self.journal(&deliveries).await? {
                        break;
                    }
                }
                Err(e) => {
                    tracing::debug!("fetching this machine's updates failed: {e}");
                    self.consumer = None;
                    self.pause().await;
                }
            }
        }
        Ok(())
    }

    /// Opens this machine's consumer; false (after a pause) when it cannot.
    async fn open(&mut self) -> bool {
        let inbound = self.cluster.inbound();
        let name = &self.cluster.node().name;
        let made = tokio::select! {
            () = self.ground.stop.cancelled() => return false,
            made = async {
                if self.fresh {
                    inbound.fresh_consumer(name).await
                } else {
                    inbound.consumer(name).await
                }
            } => made,
        };
        match made {
            Ok(made) => {
                self.fresh = false;
                self.consumer = Some(made);
                true
            }
            Err(e) => {
                tracing::debug!("cannot open this machine's consumer: {e}");
                self.pause().await;
                false
            }
        }
    }

    async fn pause(&mut self) {
        tokio::select! {
            () = self.ground.stop.cancelled() => {}
            () = tokio::time::sleep(self.backoff.step()) => {}
        }
    }

    /// Journals and routes what was fetched, then acknowledges it once it
    /// is on disk. False when the runtime is shutting down: nothing is
    /// acknowledged, so JetStream hands the batch out again.
    async fn journal(&mut self, deliveries: &[Delivery]) -> Result<bool, StoreError> {
        if deliveries.is_empty() {
            return Ok(true);
        }
        let updates = deliveries.iter().filter_map(|delivery| {
            match Update::from_slice(&delivery.payload) {
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
        let batch = Batch::sorted(&mut self.triage, updates);
        let written = self
            .ground
            .store
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .journal_received_unflushed(batch.journaled.iter().map(|e| &e.update))?;
        if !route_then_flush(&self.batches, batch, written).await? {
            return Ok(false);
        }
        // On disk: JetStream may forget them (docs/CLUSTER.md, *Inbound*).
        let acks = deliveries.iter().map(Delivery::ack);
        for (delivery, acked) in deliveries.iter().zip(futures::future::join_all(acks).await) {
            if let Err(e) = acked {
                tracing::debug!(
                    update = delivery.update_id,
                    "not acknowledged; it comes again and the journal drops it: {e}"
                );
            }
        }
        Ok(true)
    }
}

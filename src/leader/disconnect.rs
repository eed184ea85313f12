//! A session leaves for good (`/telegram-disconnect`): its topic is
//! deleted, its binding goes offline and its registration ends — in that
//! order, and only when Telegram confirmed the deletion. The only way a
//! topic is ever deleted.
//!
//! The leader's own session writes a cleanup intent first: its leader
//! steps down whatever Telegram says, and the next leader finishes a
//! deletion this one could not confirm ([`finish_cleanups`]) before it
//! provisions anything.

use std::sync::Arc;

use super::context::Context;
use super::failure::store_error;
use super::register::Registrations;
use super::registry::{ConnId, Registration};
use crate::protocol::bus::*;
use crate::store::{BindingStatus, NewCleanup};

impl Registrations {
    /// Deletes the session's topic, marks its binding offline and ends its
    /// registration (see the module docs).
    pub async fn disconnect(
        &self,
        conn: ConnId,
        generation: Generation,
    ) -> Result<Disconnected, BusError> {
        let base_key = self.cx.registry.session(conn, generation)?.base_key;
        let lock = self.cx.registry.profile_lock(&base_key);
        let _serialized = lock.lock().await;
        // Checked again under the profile lock: a re-register may have won.
        let session = self.cx.registry.session(conn, generation)?;
        let (deleted, cleanup_pending) = match session.route.target {
            Some(target) => self.delete_topic_of(&session, target).await?,
            None => (None, false),
        };
        self.set_offline(conn, &session)?;
        self.claims().release(
            &session.route.profile_key,
            Some(session.route.slot),
            session.route.target,
        );
        tracing::info!(slot = %session.route.slot, "session disconnected; its topic is deleted");
        // What it had not taken yet has nobody to go to any more; its
        // topic is gone, so the chat is told outside the topics — before
        // answering, since a leader whose own session this was steps down
        // next, and a reply still on its way would go with it.
        let pending = self.cx.store().pending_for(&session.route.profile_key);
        match pending {
            Ok(pending) => {
                self.router
                    .give_up_now(
                        pending.into_iter().map(|e| e.update).collect(),
                        &format!("{} was disconnected", session.route.topic_name),
                        deleted.is_none() && !cleanup_pending,
                    )
                    .await;
            }
            Err(e) => tracing::error!("cannot read what the session left behind: {e}"),
        }
        Ok(Disconnected {
            deleted,
            cleanup_pending,
        })
    }

    /// Deletes the topic of a session that disconnects: the topic deleted,
    /// or (for the leader's own session) whether its successor finishes it.
    async fn delete_topic_of(
        &self,
        session: &Registration,
        target: Target,
    ) -> Result<(Option<Target>, bool), BusError> {
        let intent = if session.instance_id == self.cx.instance_id {
            let intent = NewCleanup {
                chat_id: target.chat_id,
                thread_id: target.thread_id,
                profile_key: session.route.profile_key.clone(),
                reason: "the leader's session disconnected".into(),
            };
            Some(self.cx.store().add_cleanup(&intent).map_err(store_error)?)
        } else {
            None
        };
        match (self.cx.outbox.delete_topic(target).await, intent) {
            (Ok(()), intent) => {
                if let Some(intent) = intent {
                    self.cx
                        .store()
                        .finish_cleanup(intent)
                        .map_err(store_error)?;
                }
                Ok((Some(target), false))
            }
            (Err(e), Some(intent)) => {
                tracing::warn!("topic deletion not confirmed; the next leader finishes it: {e}");
                self.cx
                    .store()
                    .record_cleanup_attempt(intent)
                    .map_err(store_error)?;
                Ok((None, true))
            }
            (Err(e), None) => Err(BusError::new(
                BusErrorCode::Telegram,
                format!("topic deletion not confirmed: {e}"),
            )),
        }
    }

    /// The binding goes offline (its topic deleted or about to be) and the
    /// registration ends.
    fn set_offline(&self, conn: ConnId, session: &Registration) -> Result<(), BusError> {
        {
            let mut store = self.cx.store();
            match store
                .binding(&session.route.profile_key)
                .map_err(store_error)?
            {
                Some(mut binding) => {
                    binding.status = BindingStatus::Offline;
                    binding.chat_id = None;
                    binding.thread_id = None;
                    store.upsert_binding(&binding).map_err(store_error)?;
                    // Its topic is gone with it: what still waited to go
                    // there does not go.
                    let abandoned = store
                        .posts_abandoned(&session.route.profile_key, "its session was disconnected")
                        .map_err(store_error)?;
                    if abandoned > 0 {
                        tracing::info!(
                            abandoned,
                            "messages for a disconnected session's topic are given up"
                        );
                    }
                }
                None => tracing::warn!("disconnecting a session without a stored binding"),
            }
        }
        if let Some(c) = self.cx.registry.lock().map.get_mut(&conn) {
            c.session = None;
        }
        Ok(())
    }

    /// Finishes the deletions a predecessor left. The cleanup lock is taken
    /// before the first accept, so no registration provisions anything
    /// until they are done.
    pub fn start_cleanups(self: &Arc<Self>) {
        match self.cleanup.clone().try_lock_owned() {
            Ok(guard) => {
                let registrations = self.clone();
                crate::tasks::spawn(async move {
                    finish_cleanups(&registrations.cx).await;
                    drop(guard);
                });
            }
            Err(_) => tracing::error!("the cleanup lock is taken before the leader started"),
        }
    }
}

/// Finishes the topic deletions a previous leader promised but could not
/// confirm, before anything is provisioned.
async fn finish_cleanups(cx: &Context) {
    let intents = match cx.store().pending_cleanups() {
        Ok(intents) => intents,
        Err(e) => {
            tracing::error!("cannot read cleanup intents: {e}");
            return;
        }
    };
    for intent in intents {
        let target = Target {
            chat_id: intent.chat_id,
            thread_id: intent.thread_id,
        };
        let result = tokio::select! {
            () = cx.stop.cancelled() => return,
            r = cx.outbox.delete_topic(target) => r,
        };
        let mut store = cx.store();
        let recorded = match result {
            Ok(()) => {
                tracing::info!(
                    thread = intent.thread_id,
                    "finished a predecessor's topic deletion"
                );
                store.finish_cleanup(intent.id)
            }
            Err(e) => {
                tracing::warn!(
                    thread = intent.thread_id,
                    "a pending topic deletion failed again: {e}"
                );
                store.record_cleanup_attempt(intent.id)
            }
        };
        if let Err(e) = recorded {
            tracing::error!("cannot update a cleanup intent: {e}");
        }
    }
}

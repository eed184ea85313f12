//! One batch of updates on its way from where it was read to the router:
//! the poller's `getUpdates` on a single machine, or this machine's
//! consumer of the cluster's stream. Both journal it the same way
//! (docs/DESIGN.md, "Inbound"): written to the journal in one transaction,
//! handed to the router, then synced to disk while the router works — and
//! only once it is on disk may anything confirm it (the next `getUpdates`,
//! or a JetStream acknowledgement).

use tokio::sync::mpsc;

use super::triage::{Entry, Notice, Triage, Triaged};
use crate::phone::PhoneCommand;
use crate::store::{StoreError, Unflushed};
use crate::telegram::Update;

/// One journaled batch, handed to the router after the transaction.
#[derive(Debug, Default)]
pub(super) struct Batch {
    /// Entries newly written to the journal, in update order.
    pub journaled: Vec<Entry>,
    /// What topics are told instead of journaling (a file too big to
    /// download, a sticker).
    pub notices: Vec<Notice>,
    /// Commands the leader answers, each read once by the triage.
    pub commands: Vec<(Update, PhoneCommand)>,
    /// Decoded updates the triage did not journal (a tap, a message in
    /// General, …).
    pub others: Vec<Update>,
}

impl Batch {
    /// Sorts `updates` by the triage: each is journaled, told in its
    /// topic, or left to the leader. `first` says whether an update is seen
    /// for the first time: a repeat (a stream's redelivery) journals again
    /// — the journal drops it — but is not told or answered twice.
    pub fn sorted(triage: &mut Triage, updates: impl IntoIterator<Item = (Update, bool)>) -> Self {
        triage.prepare();
        let mut batch = Self::default();
        for (update, first) in updates {
            match triage.triage(&update) {
                Triaged::Journal(entry) => {
                    // A tap journaled (⚡ Steer now) still wants its
                    // spinner ended, which is the leader's.
                    if first && matches!(update.kind, crate::telegram::UpdateKind::CallbackQuery(_))
                    {
                        batch.others.push(update);
                    }
                    batch.journaled.push(entry);
                }
                Triaged::Notice(notice) if first => batch.notices.push(notice),
                Triaged::Command(command) if first => batch.commands.push((update, command)),
                Triaged::Leader if first => batch.others.push(update),
                Triaged::Notice(_) | Triaged::Command(_) | Triaged::Leader => {}
            }
        }
        batch
    }
}

impl Batch {
    /// Updates no session of this machine takes (across machines: in no
    /// machine's topic): the commands among them read, the rest as they are.
    pub fn unowned(updates: Vec<Update>) -> Self {
        let mut batch = Self::default();
        for update in updates {
            match super::triage::command_of(&update) {
                Some(command) => batch.commands.push((update, command)),
                None => batch.others.push(update),
            }
        }
        batch
    }
}

/// Hands what the journal newly wrote (`inserted`) to the router with the
/// notices and the updates the leader answers itself, then syncs the
/// journal on a blocking thread while the leader routes. `Ok(false)` when
/// the runtime is shutting down and cancelled the sync: nothing may be
/// confirmed then. A panic in the sync is raised again.
pub(super) async fn route_then_flush(
    batches: &mpsc::Sender<Batch>,
    mut batch: Batch,
    (inserted, unflushed): (Vec<i64>, Unflushed),
) -> Result<bool, StoreError> {
    batch
        .journaled
        .retain(|e| inserted.contains(&e.update.update_id));
    // The router may be gone when the leader is stopping; the journal
    // already holds everything, so nothing is lost.
    let _ = batches.send(batch).await;
    match tokio::task::spawn_blocking(move || unflushed.flush()).await {
        Ok(flushed) => flushed.map(|()| {
            if crate::logging::milestones_on() {
                for id in &inserted {
                    crate::logging::milestone("synced", *id);
                }
            }
            true
        }),
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => Ok(false),
        },
    }
}

//! Answers that did not reach the topic, or may not have: nothing the agent
//! said disappears with only a line in the log.
//!
//! A send whose fate Telegram left open (`commitUnknown`: a 429, a 429 and
//! then a 500, say) is never replayed blindly — a duplicate is worse than a
//! gap — and one that failed for good was not sent at all. Either way the
//! session keeps the text and says so in the topic, with a button that
//! sends it again (an ask: the tap is checked and answered like any other);
//! `/resend` in the topic sends every kept one again. If not even that
//! notice can be posted, the host is told (`ui/notify`) and the status line
//! counts the answers not delivered; the notice follows as soon as anything
//! reaches the topic again.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Session;
use super::dialog::{self, Options, Question, Terminal};
use super::outbound::ToTopic;
use crate::protocol::host::{NotifyLevel, NotifyParams, method};

/// Answers kept to be sent again, at most; the oldest goes first.
const KEEP: usize = 8;
/// How long the button of a notice works.
const OFFER_FOR: Duration = Duration::from_secs(12 * 3600);
/// How much of the answer the notice quotes, so the user knows which.
const QUOTE: usize = 80;

/// Text that did not reach the topic, or may not have.
#[derive(Debug, Clone)]
pub(super) struct Unsent {
    /// Telegram HTML, as it was to be sent.
    pub html: String,
    /// Telegram may have posted it after all.
    pub maybe_sent: bool,
    /// What went wrong, in the leader's words.
    pub why: String,
}

struct Kept {
    id: u64,
    unsent: Unsent,
    /// The notice in the topic is posted (or being posted).
    offered: bool,
    /// Ends the notice's wait: the answer was sent again another way.
    withdraw: CancellationToken,
}

#[derive(Default)]
pub(super) struct Held {
    next_id: u64,
    kept: VecDeque<Kept>,
}

impl Held {
    /// Kept answers whose notice could not be posted.
    fn unoffered(&self) -> u32 {
        self.kept.iter().filter(|k| !k.offered).count() as u32
    }
}

impl Session {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `unsent` and offers it again in the topic.
    pub(super) fn hold_unsent(&self, unsent: Unsent) {
        let Some(me) = self.me() else { return };
        let (id, withdraw) = {
            let mut held = self.held();
            held.next_id += 1;
            let id = held.next_id;
            if held.kept.len() >= KEEP
                && let Some(oldest) = held.kept.pop_front()
            {
                tracing::warn!(
                    "more than {KEEP} answers wait to be sent again; forgetting the oldest"
                );
                oldest.withdraw.cancel();
            }
            let withdraw = CancellationToken::new();
            held.kept.push_back(Kept {
                id,
                unsent,
                offered: true,
                withdraw: withdraw.clone(),
            });
            (id, withdraw)
        };
        tokio::spawn(async move { me.offer(id, withdraw).await });
    }

    /// Something reached the topic: notices that could not be posted are
    /// tried again.
    pub(super) fn topic_reachable(&self) {
        let Some(me) = self.me() else { return };
        let retry: Vec<(u64, CancellationToken)> = {
            let mut held = self.held();
            held.kept
                .iter_mut()
                .filter(|k| !k.offered)
                .map(|k| {
                    k.offered = true;
                    (k.id, k.withdraw.clone())
                })
                .collect()
        };
        if retry.is_empty() {
            return;
        }
        self.show_undelivered();
        for (id, withdraw) in retry {
            let me = me.clone();
            tokio::spawn(async move { me.offer(id, withdraw).await });
        }
    }

    /// `/resend` in the topic: every kept answer again, oldest first. The
    /// number sent.
    pub(super) fn resend_all(&self) -> usize {
        let kept: Vec<Kept> = self.held().kept.drain(..).collect();
        self.show_undelivered();
        for k in &kept {
            k.withdraw.cancel();
            self.send_out(ToTopic::Again(k.unsent.html.clone()));
        }
        kept.len()
    }

    fn show_undelivered(&self) {
        let undelivered = self.held().unoffered();
        self.facts.send_if_modified(|f| {
            std::mem::replace(&mut f.outbox.undelivered, undelivered) != undelivered
        });
    }

    /// Posts the notice for kept answer `id` and waits for its button.
    async fn offer(self: Arc<Self>, id: u64, withdraw: CancellationToken) {
        let Some(unsent) = self
            .held()
            .kept
            .iter()
            .find(|k| k.id == id)
            .map(|k| k.unsent.clone())
        else {
            return;
        };
        let question = notice(&unsent);
        let deadline = Instant::now() + OFFER_FOR;
        let member = self.member();
        let posted = match &member {
            Some(member) => dialog::post(member, &question, deadline)
                .await
                .map_err(|e| e.to_string()),
            None => Err("this session is not on the relay".into()),
        };
        let (Some(member), Ok(posted)) = (member, posted.as_ref()) else {
            let why = posted.err().unwrap_or_default();
            tracing::warn!("cannot offer an answer again in the topic: {why}");
            if let Some(k) = self.held().kept.iter_mut().find(|k| k.id == id) {
                k.offered = false;
            }
            self.show_undelivered();
            self.host.notify(
                method::UI_NOTIFY,
                &NotifyParams {
                    message: format!(
                        "Telegram relay: an answer did not reach the topic ({}), nor a notice about it ({why}). It is kept and offered again there once the topic can be reached.",
                        unsent.why
                    ),
                    level: NotifyLevel::Warning,
                },
            );
            return;
        };
        tokio::select! {
            answered = dialog::wait_phone(&member, posted, deadline) => {
                let taken = {
                    let mut held = self.held();
                    let at = held.kept.iter().position(|k| k.id == id);
                    at.and_then(|at| held.kept.remove(at))
                };
                match (answered, taken) {
                    // The notice has one button.
                    (Ok(_), Some(kept)) => self.send_out(ToTopic::Again(kept.unsent.html)),
                    (Err(e), Some(_)) => {
                        tracing::debug!("the offer to send an answer again ended: {e}");
                    }
                    (_, None) => {}
                }
            }
            () = withdraw.cancelled() => {
                dialog::close(&member, posted, "↻ Sent again").await;
            }
            () = self.stop.cancelled() => {}
        }
    }
}

/// The notice for an answer that did not arrive, or may not have: one
/// button, so there is no choice to tell apart.
fn notice(unsent: &Unsent) -> Question<()> {
    let quote = crate::policy::clip(
        crate::render::to_plain(&unsent.html)
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or_default()
            .trim(),
        QUOTE,
    );
    let (head, tail) = if unsent.maybe_sent {
        (
            "An answer may be missing",
            "Telegram did not confirm it, so it may or may not have arrived; sending it again could show it twice.",
        )
    } else {
        ("An answer could not be sent", "Nothing of it arrived.")
    };
    let html = format!(
        "⚠️ <b>{head}</b> ({}): “{}”\n{tail} Tap to send it again, or write /resend.",
        crate::render::escape(&unsent.why),
        crate::render::escape(&quote)
    );
    Question {
        title: head.into(),
        html,
        detail: None,
        options: Options::new([((), "↻ Send it again".into())]),
        free_text: false,
        timeout: OFFER_FOR,
        terminal: Terminal::No,
        timeout_outcome: "⌛ Not sent again".into(),
        elsewhere: None,
    }
}

//! Messages that did not reach the topic, or may not have: nothing the
//! agent said disappears with only a line in the log.
//!
//! The leader keeps what it was handed and could not send, or whose fate
//! Telegram left open (never replayed blindly: a duplicate is worse than a
//! gap), and offers it again in the topic with a button (`leader::courier`);
//! `/resend` in the topic sends every kept one again. When not even that
//! notice can be posted, the leader says how many such messages there are,
//! the status line counts them and the host is told once per new one. A
//! message the relay would not take at all (no relay for a while) is
//! counted and told to the host here.

use std::sync::atomic::Ordering;

use super::Session;
use crate::protocol::host::{NotifyLevel, NotifyParams, method};

/// How much of a message a note about it quotes, so the user knows which.
const QUOTE: usize = 80;

impl Session {
    /// A message the relay would not take (`shown`, Telegram HTML): the
    /// status line counts it and the host is told.
    pub(super) fn not_handed_over(&self, shown: &str, why: &str) {
        self.not_taken.fetch_add(1, Ordering::Relaxed);
        self.show_undelivered(self.leader_undelivered.load(Ordering::Relaxed));
        let quote = crate::policy::clip(crate::render::to_plain(shown).trim(), QUOTE);
        self.host.notify(
            method::UI_NOTIFY,
            &NotifyParams {
                message: format!(
                    "Telegram relay: a message did not reach the relay ({why}), so it will not reach the topic: “{quote}”"
                ),
                level: NotifyLevel::Warning,
            },
        );
    }

    /// The leader's count of this session's messages that reached neither
    /// the topic nor a notice about them; the host hears of each new one.
    pub(super) fn leader_reports_undelivered(&self, undelivered: u32) {
        let before = self.leader_undelivered.swap(undelivered, Ordering::Relaxed);
        if undelivered > before {
            self.host.notify(
                method::UI_NOTIFY,
                &NotifyParams {
                    message: "Telegram relay: an answer did not reach the topic, nor a notice about it. It is kept and offered again there once the topic can be reached.".into(),
                    level: NotifyLevel::Warning,
                },
            );
        }
        self.show_undelivered(undelivered);
    }

    fn show_undelivered(&self, at_the_leader: u32) {
        let undelivered = at_the_leader + self.not_taken.load(Ordering::Relaxed);
        self.facts.send_if_modified(|f| {
            std::mem::replace(&mut f.outbox.undelivered, undelivered) != undelivered
        });
    }

    /// `/resend` in the topic: what the leader kept goes again; how many.
    pub(super) async fn resend(&self) -> Result<u32, String> {
        let member = self
            .member()
            .ok_or_else(|| "this session is not on the relay".to_string())?;
        member
            .resend()
            .await
            .map(|resent| resent.count)
            .map_err(|e| e.to_string())
    }
}

//! What a session sends into its topic: the agent's answers (Markdown →
//! Telegram HTML, split under the message limit), mirrored local prompts,
//! and `typing` while the agent works. One task per session keeps the order
//! of messages and never blocks the host.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::bus::{Member, MemberError};
use crate::protocol::bus::{BusErrorCode, SendText, Target, TextFormat, TopicOp};
use crate::render;

/// Telegram shows `typing` for about 5 s; renew a little before.
const TYPING_EVERY: Duration = Duration::from_secs(4);
/// How long a new topic may take to appear after the old one vanished.
const REPROVISION_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub enum Outgoing {
    /// The agent's answer, as Markdown.
    Answer(String),
    /// Plain text (status replies, mirrored prompts).
    Plain(String),
    /// The agent started (true) or stopped (false) working.
    Busy(bool),
}

pub fn spawn(member: Arc<Member>, stop: CancellationToken) -> mpsc::UnboundedSender<Outgoing> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(member, rx, stop));
    tx
}

async fn run(
    member: Arc<Member>,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    stop: CancellationToken,
) {
    let mut typing: Option<tokio::time::Interval> = None;
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            next = rx.recv() => match next {
                None => break,
                Some(Outgoing::Answer(markdown)) => {
                    for chunk in render::split(&render::render(&markdown), render::MESSAGE_LIMIT) {
                        send(&member, &chunk, TextFormat::Html).await;
                    }
                }
                Some(Outgoing::Plain(text)) => {
                    for chunk in plain_chunks(&text) {
                        send(&member, &chunk, TextFormat::Plain).await;
                    }
                }
                Some(Outgoing::Busy(busy)) => {
                    typing = busy.then(|| tokio::time::interval(TYPING_EVERY));
                }
            },
            _ = async { typing.as_mut().expect("guarded").tick().await }, if typing.is_some() => {
                if target(&member).is_some()
                    && let Err(e) = member.topic(TopicOp::Typing).await
                {
                    tracing::debug!("typing indicator failed: {e}");
                }
            }
        }
    }
}

fn target(member: &Member) -> Option<Target> {
    member
        .watch()
        .borrow()
        .route
        .as_ref()
        .and_then(|r| r.target)
}

/// Plain text split the same way as HTML (escaping first keeps the splitter
/// honest about what Telegram will count).
fn plain_chunks(text: &str) -> Vec<String> {
    let escaped = text
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    render::split(&escaped, render::MESSAGE_LIMIT)
        .iter()
        .map(|chunk| render::to_plain(chunk))
        .collect()
}

/// Sends one chunk into the session's topic. The leader paces it, falls
/// back to plain text and retries what can be retried; what is left to the
/// session is a topic that is gone: it registers again once for a new one.
async fn send(member: &Member, text: &str, format: TextFormat) {
    let op = || {
        TopicOp::SendText(SendText {
            text: text.to_string(),
            format,
            buttons: None,
            reply_to: None,
        })
    };
    let mut result = member.topic(op()).await;
    if result.as_ref().err().and_then(MemberError::code) == Some(BusErrorCode::TopicGone) {
        tracing::info!("the topic is gone; asking for a new one");
        let old = target(member);
        if let Err(e) = member.reregister().await {
            tracing::warn!("cannot register again: {e}");
            return;
        }
        let mut states = member.watch();
        let fresh = states.wait_for(|s| {
            s.role.is_connected()
                && s.route
                    .as_ref()
                    .and_then(|r| r.target)
                    .is_some_and(|t| Some(t) != old)
        });
        if tokio::time::timeout(REPROVISION_WAIT, fresh).await.is_err() {
            tracing::warn!("no new topic appeared; dropping the message");
            return;
        }
        result = member.topic(op()).await;
    }
    if let Err(e) = result {
        // Ambiguous failures are not replayed: a duplicate answer is
        // worse than a missing one the user can ask for again.
        tracing::warn!("cannot send into the topic: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_chunks_keep_the_text_and_the_limit() {
        let text = "a < b & c\n".repeat(1000);
        let chunks = plain_chunks(&text);
        assert!(chunks.len() > 1);
        for chunk in &chunks {
            assert!(chunk.encode_utf16().count() <= render::MESSAGE_LIMIT);
        }
        let joined: String = chunks.concat();
        assert_eq!(
            joined.split_whitespace().collect::<Vec<_>>(),
            text.split_whitespace().collect::<Vec<_>>()
        );
    }
}

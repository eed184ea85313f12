//! Inbound routing: journaled messages to the session that owns their topic,
//! acknowledgements back into the journal, and what the leader answers
//! itself (pairing, messages outside any session's topic).

use std::sync::Arc;

use super::{ConnId, Shared, error, registry, store_error};
use crate::protocol::bus::*;
use crate::store::NewUpdate;
use crate::telegram::poller::Batch;
use crate::telegram::{ChatKind, Update};

/// What the topic is told when its session is away.
const AWAY_NOTICE: &str =
    "⏸ This session is offline. Your message is kept and will be delivered when it comes back.";

/// Routes one journaled batch. The journal already holds it durably, so a
/// failure here only delays delivery until the owner registers again.
pub(super) async fn route(shared: &Arc<Shared>, batch: Batch) {
    let sent: Vec<i64> = batch
        .journaled
        .into_iter()
        .filter_map(|update| deliver_new(shared, update))
        .collect();
    if let Err(e) = shared.store().record_attempts(&sent) {
        tracing::warn!("cannot count delivery attempts: {e}");
    }
    for update in batch.others {
        answer_directly(shared, &update).await;
    }
}

/// Sends a new message to its live owner; returns its id when it was sent.
fn deliver_new(shared: &Arc<Shared>, update: NewUpdate) -> Option<i64> {
    let owner = update.owner.clone()?;
    let conn = shared
        .registry()
        .owner_of(&owner)
        .filter(|(_, s)| s.ready)
        .map(|(conn, _)| conn);
    let Some(conn) = conn else {
        tell_away(shared, &owner, update.chat_id, update.thread_id);
        return None;
    };
    shared.send(
        conn,
        FromLeader::Deliver(Deliver {
            delivery_id: update.update_id as u64,
            update_id: update.update_id,
            message: InboundMessage {
                chat_id: update.chat_id,
                thread_id: update.thread_id,
                user_id: update.user_id,
                message_id: update.message_id,
                text: update.text,
            },
        }),
    );
    Some(update.update_id)
}

/// Tells a topic once per absence that its session is away.
fn tell_away(shared: &Arc<Shared>, owner: &str, chat: i64, thread: Option<i64>) {
    let first = shared
        .told_offline
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(owner.to_string());
    if !first {
        return;
    }
    let shared = shared.clone();
    tokio::spawn(async move {
        if let Err(e) = shared.relay.say(chat, thread, AWAY_NOTICE).await {
            tracing::warn!("cannot tell the topic its session is away: {e}");
        }
    });
}

/// Makes a just-registered session live: delivers, in order, everything
/// the journal holds for it, and only then lets new messages through. Both
/// happen under the registry lock, so a message arriving meanwhile can come
/// twice (the session drops the repeat) but never ahead of older ones.
pub(super) fn go_live(shared: &Shared, conn: ConnId, generation: Generation) {
    let mut delivered = Vec::new();
    {
        let mut registry = shared.registry();
        let Some(c) = registry.conns.get_mut(&conn) else {
            return;
        };
        let Some(session) = c.session.as_mut().filter(|s| s.generation == generation) else {
            return;
        };
        let pending = match shared.store().pending_for(&session.route.profile_key) {
            Ok(pending) => pending,
            Err(e) => {
                tracing::error!("cannot read the journal: {e}");
                return;
            }
        };
        for entry in pending {
            let frame = FromLeader::Deliver(Deliver {
                delivery_id: entry.update_id as u64,
                update_id: entry.update_id,
                message: InboundMessage {
                    chat_id: entry.chat_id,
                    thread_id: entry.thread_id,
                    user_id: entry.user_id,
                    message_id: entry.message_id,
                    text: entry.text,
                },
            });
            if c.outbox.try_send(frame).is_err() {
                tracing::warn!(conn, "follower is not reading; dropping its connection");
                c.close.cancel();
                return;
            }
            delivered.push(entry.update_id);
        }
        session.ready = true;
    }
    if let Err(e) = shared.store().record_attempts(&delivered) {
        tracing::warn!("cannot count delivery attempts: {e}");
    }
}

/// A follower handed a delivery to its host: queue it to be settled in the
/// journal. Acks are written in batches (see [`settle`]): one fsync per
/// batch instead of per message. An ack lost with a crashing leader only
/// means the message comes again, and the session drops the repeat.
pub(super) fn delivered(shared: &Shared, conn: ConnId, ack: &DeliveryAck) {
    let Ok(session) = registry::check_generation(shared, conn, ack.generation) else {
        tracing::debug!("delivery ack with a stale generation ignored");
        return;
    };
    let _ = shared
        .settle
        .send((session.route.profile_key, ack.delivery_id as i64));
}

/// Writes a batch of acknowledgements: pending → delivered, each only for
/// the session that owns the entry.
pub(super) fn settle(shared: &Shared, acks: &[(String, i64)]) {
    match shared.store().mark_delivered(acks) {
        Ok(changed) if changed < acks.len() => tracing::debug!(
            acks = acks.len(),
            changed,
            "some acknowledgements were repeats or not the session's own"
        ),
        Ok(_) => {}
        Err(e) => tracing::error!("cannot settle {} deliveries: {e}", acks.len()),
    }
}

/// A one-time pairing link for `/telegram-connect` when nobody is paired.
pub(super) async fn pair(
    shared: &Shared,
    conn: ConnId,
    generation: Generation,
) -> Result<PairingLink, BusError> {
    registry::check_generation(shared, conn, generation)?;
    let bot = shared
        .relay
        .bot()
        .await
        .map_err(super::relay::telegram_error)?;
    let username = bot.username.clone();
    if username.is_empty() {
        return Err(error(
            BusErrorCode::Telegram,
            "the bot has no username, so it cannot be paired by link",
        ));
    }
    let code = shared.relay.new_pairing_code();
    Ok(PairingLink {
        url: format!("https://t.me/{username}?start={code}"),
        expires_in_s: super::relay::PAIRING_TTL.as_secs(),
    })
}

/// Posts the "connected" notice in a topic that was just bound.
pub(super) fn announce(
    shared: &Arc<Shared>,
    target: Target,
    profile_key: &str,
    topic_name: &str,
    cwd: &str,
) {
    let shared = shared.clone();
    let profile_key = profile_key.to_string();
    let text = format!("🟢 {topic_name} connected\n{cwd}");
    tokio::spawn(async move {
        match shared
            .relay
            .say(target.chat_id, Some(target.thread_id), &text)
            .await
        {
            Ok(()) => {
                let mut store = shared.store();
                let marked = store.binding(&profile_key).and_then(|b| match b {
                    Some(mut b) if b.target() == Some(target) => {
                        b.announced = true;
                        store.upsert_binding(&b)
                    }
                    _ => Ok(()),
                });
                if let Err(e) = marked {
                    tracing::warn!(
                        "cannot remember the topic was announced: {}",
                        store_error(e)
                    );
                }
            }
            Err(e) => tracing::warn!("cannot post the connected notice: {e}"),
        }
    });
}

/// Updates that are not for a session: pairing, and messages outside any
/// session's topic from allowed users, who get the list of sessions.
async fn answer_directly(shared: &Arc<Shared>, update: &Update) {
    let Some(message) = update.message() else {
        return;
    };
    let Some(user) = message.from.as_ref().filter(|u| !u.is_bot) else {
        return;
    };
    let text = message.text.as_deref().unwrap_or_default().trim();
    if message.chat.kind == ChatKind::Private
        && let Some(code) = text.strip_prefix("/start")
    {
        let code = code.trim();
        if !code.is_empty() {
            pair_user(shared, user.id, message.chat.id, code).await;
            return;
        }
    }
    let allowed = shared.relay.allowed_users(&shared.store).contains(&user.id);
    if !allowed || text.is_empty() {
        return;
    }
    let reply = sessions_overview(shared);
    if let Err(e) = shared
        .relay
        .say(message.chat.id, message.topic(), &reply)
        .await
    {
        tracing::warn!("cannot answer outside a topic: {e}");
    }
}

async fn pair_user(shared: &Shared, user: i64, chat: i64, code: &str) {
    let reply = if shared.relay.redeem(code) {
        match shared.store().add_allowed_user(user) {
            Ok(()) => {
                tracing::info!(user, "paired a Telegram user");
                shared.broadcast(&FromLeader::Paired(Paired { user_id: user }));
                "✅ Paired. Your agent sessions will appear here as topics."
            }
            Err(e) => {
                tracing::error!("cannot store the paired user: {e}");
                "⚠️ Pairing failed: the relay could not save it. Try /telegram-connect again."
            }
        }
    } else {
        "That pairing code is wrong or has expired. Run /telegram-connect in your agent for a new link."
    };
    if let Err(e) = shared.relay.say(chat, None, reply).await {
        tracing::warn!("cannot answer the pairing request: {e}");
    }
}

fn sessions_overview(shared: &Shared) -> String {
    let status = match registry::status(shared) {
        Ok(status) => status,
        Err(e) => return format!("The relay cannot list its sessions: {}", e.message),
    };
    if status.sessions.is_empty() {
        return "No agent sessions are connected. Run /telegram-connect in one.".into();
    }
    let mut out = String::from("Write in a session's topic to talk to it:\n");
    for s in &status.sessions {
        let state = if s.live { "live" } else { "offline" };
        out.push_str(&format!("• {} — {state} — {}\n", s.topic_name, s.cwd));
    }
    out.trim_end().to_string()
}

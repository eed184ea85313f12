//! Pairing (docs/DESIGN.md, *Pairing*): two flows around the one code
//! [`Access`](super::access::Access) keeps. A session asks for a link
//! (`/telegram-connect` while nobody is paired), and the person presses
//! Start on it (`/start <code>` in the bot's private chat).

use super::access::PAIRING_TTL;
use super::context::Context;
use super::errands::Refusal;
use super::registry::ConnId;
use crate::ids::Place;
use crate::protocol::bus::*;

/// A one-time pairing link for `/telegram-connect`, only while nobody
/// may drive sessions: a paired relay never hands out another code.
pub(super) async fn link(
    cx: &Context,
    conn: ConnId,
    generation: Generation,
) -> Result<PairingLink, BusError> {
    cx.registry.session(conn, generation)?;
    if cx.cluster.is_some() {
        // The machine that polls would get the link's code, and each
        // machine keeps its own users: a pairing made here would reach
        // one machine at most.
        return Err(BusError::new(
            BusErrorCode::Forbidden,
            "this relay spans machines: put your Telegram user id in allowed_users in config.toml on every machine (agent-relay setup writes it)",
        ));
    }
    if !cx.access.needs_pairing() {
        return Err(BusError::new(
            BusErrorCode::Forbidden,
            "somebody is paired already; add more users with allowed_users in config.toml",
        ));
    }
    let bot = cx.outbox.bot().await?;
    if bot.username.is_empty() {
        return Err(BusError::new(
            BusErrorCode::Telegram,
            "the bot has no username, so it cannot be paired by link",
        ));
    }
    let code = cx.access.new_pairing_code();
    Ok(PairingLink {
        url: format!("https://t.me/{}?start={code}", bot.username),
        expires_in_s: PAIRING_TTL.as_secs(),
    })
}

/// `/start <code>` from `user` in the bot's private chat `chat`.
pub(super) fn redeem(cx: &Context, user: i64, chat: i64, code: &str) {
    let reply = match cx.access.pair(&cx.shared_store(), user, code) {
        Ok(true) => {
            tracing::info!(user, "paired a Telegram user");
            cx.registry
                .broadcast(&FromLeader::Paired(Paired { user_id: user }));
            "✅ Paired. Your agent sessions will appear here as topics."
        }
        Ok(false) => {
            if !cx.errands.admit(chat, Refusal::Guess) {
                return;
            }
            "That pairing code is wrong or has expired. Run /telegram-connect in your agent for a new link."
        }
        Err(e) => {
            tracing::error!("cannot store the paired user: {e}");
            "⚠️ Pairing failed: the relay could not save it. Try /telegram-connect again."
        }
    };
    cx.speaker.later(Place::chat(chat), reply.into());
}

//! Who may drive sessions: the one computation of it, and pairing.
//!
//! The users in `allowed_users` of the configuration and the users paired
//! through a one-time `/start <code>` link may write into topics and tap
//! buttons; everybody else is a stranger. The set is read from the store
//! once, when the leader starts, and kept current by [`Access::pair`]:
//! nothing asks the store per update.
//!
//! Pairing is two flows of the leader: a session asks for a link
//! (`/telegram-connect` while nobody is paired), and the person presses
//! Start on it (`/start <code>` in the bot's private chat).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::Leader;
use super::registry::ConnId;
use super::replies::Refusal;
use crate::protocol::bus::*;
use crate::store::{Store, StoreError};

/// How long a pairing code stays valid.
pub(super) const PAIRING_TTL: Duration = Duration::from_secs(600);

pub(super) struct Access {
    configured: Vec<i64>,
    allowed: Mutex<HashSet<i64>>,
    pairing: Mutex<Pairing>,
}

impl Access {
    /// The configured users plus those paired earlier.
    pub fn load(configured: &[i64], store: &Store) -> Result<Self, StoreError> {
        let mut allowed: HashSet<i64> = configured.iter().copied().collect();
        allowed.extend(store.allowed_users()?);
        Ok(Self {
            configured: configured.to_vec(),
            allowed: Mutex::new(allowed),
            pairing: Mutex::default(),
        })
    }

    pub fn is_allowed(&self, user: i64) -> bool {
        self.allowed().contains(&user)
    }

    /// A copy of the allowed users, for a batch of decisions.
    pub fn snapshot(&self) -> HashSet<i64> {
        self.allowed().clone()
    }

    /// Nobody may drive sessions yet: `/telegram-connect` offers pairing.
    pub fn needs_pairing(&self) -> bool {
        self.allowed().is_empty()
    }

    /// The user whose private chat holds the topics when no group is
    /// configured: the first configured user, else the first paired one.
    pub fn owner(&self) -> Option<i64> {
        self.configured
            .first()
            .copied()
            .or_else(|| self.allowed().iter().min().copied())
    }

    /// A fresh one-time pairing code (replacing any earlier one).
    pub fn new_pairing_code(&self) -> String {
        self.pairing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .issue(Instant::now())
    }

    /// Redeems `code` for `user`: stores the user and allows it. `Ok(false)`
    /// for a wrong or expired code.
    pub fn pair(
        &self,
        store: &Arc<Mutex<Store>>,
        user: i64,
        code: &str,
    ) -> Result<bool, StoreError> {
        let redeemed = self
            .pairing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .redeem(code, Instant::now());
        if !redeemed {
            return Ok(false);
        }
        store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add_allowed_user(user)?;
        self.allowed().insert(user);
        Ok(true)
    }

    fn allowed(&self) -> std::sync::MutexGuard<'_, HashSet<i64>> {
        self.allowed.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Leader {
    /// A one-time pairing link for `/telegram-connect`, only while nobody
    /// may drive sessions: a paired relay never hands out another code.
    pub(super) async fn pair(
        &self,
        conn: ConnId,
        generation: Generation,
    ) -> Result<PairingLink, BusError> {
        self.registry.session(conn, generation)?;
        if self.cluster.is_some() {
            // The machine that polls would get the link's code, and each
            // machine keeps its own users: a pairing made here would reach
            // one machine at most.
            return Err(BusError::new(
                BusErrorCode::Forbidden,
                "this relay spans machines: put your Telegram user id in allowed_users in config.toml on every machine (agent-relay setup writes it)",
            ));
        }
        if !self.access.needs_pairing() {
            return Err(BusError::new(
                BusErrorCode::Forbidden,
                "somebody is paired already; add more users with allowed_users in config.toml",
            ));
        }
        let bot = self.outbox.bot().await?;
        if bot.username.is_empty() {
            return Err(BusError::new(
                BusErrorCode::Telegram,
                "the bot has no username, so it cannot be paired by link",
            ));
        }
        let code = self.access.new_pairing_code();
        Ok(PairingLink {
            url: format!("https://t.me/{}?start={code}", bot.username),
            expires_in_s: PAIRING_TTL.as_secs(),
        })
    }

    /// `/start <code>` from `user` in the bot's private chat.
    pub(super) fn pair_user(self: &Arc<Self>, user: i64, chat: i64, code: &str) {
        let reply = match self.access.pair(&self.store, user, code) {
            Ok(true) => {
                tracing::info!(user, "paired a Telegram user");
                self.registry
                    .broadcast(&FromLeader::Paired(Paired { user_id: user }));
                "✅ Paired. Your agent sessions will appear here as topics."
            }
            Ok(false) => {
                if !self.router.replies.admit(chat, Refusal::Guess) {
                    return;
                }
                "That pairing code is wrong or has expired. Run /telegram-connect in your agent for a new link."
            }
            Err(e) => {
                tracing::error!("cannot store the paired user: {e}");
                "⚠️ Pairing failed: the relay could not save it. Try /telegram-connect again."
            }
        };
        self.router.replies.say(self, chat, None, reply.into());
    }
}

/// The one pairing code a leader has out at a time.
#[derive(Default)]
struct Pairing {
    current: Option<(String, Instant)>,
}

impl Pairing {
    /// A fresh one-time code, replacing any earlier one. It grants control
    /// of the user's agents, so it comes from the OS's CSPRNG (122 random
    /// bits via UUID v4), never from a fast PRNG.
    fn issue(&mut self, now: Instant) -> String {
        let code = uuid::Uuid::new_v4().simple().to_string();
        self.current = Some((code.clone(), now + PAIRING_TTL));
        code
    }

    /// Consumes `code` if it is the current one and `now` is before it expires.
    fn redeem(&mut self, code: &str, now: Instant) -> bool {
        let valid = self
            .current
            .as_ref()
            .is_some_and(|(current, expires)| current == code && now < *expires);
        if valid {
            self.current = None;
        }
        valid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairing_codes_are_single_use_and_expire() {
        let start = Instant::now();
        let mut pairing = Pairing::default();
        let code = pairing.issue(start);
        assert_eq!(code.len(), 32);
        assert!(!pairing.redeem("wrong", start), "a wrong code binds nobody");
        assert!(pairing.redeem(&code, start + Duration::from_secs(60)));
        assert!(
            !pairing.redeem(&code, start + Duration::from_secs(61)),
            "single use"
        );

        let code = pairing.issue(start);
        assert!(
            !pairing.redeem(&code, start + PAIRING_TTL),
            "an expired code binds nobody"
        );
        let newer = pairing.issue(start);
        assert_ne!(code, newer);
        let replaced = pairing.issue(start);
        assert!(
            !pairing.redeem(&newer, start),
            "a new code replaces the old one"
        );
        assert!(pairing.redeem(&replaced, start));
    }

    #[test]
    fn pairing_allows_the_user_at_once_and_for_good() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Mutex::new(
            Store::open(&dir.path().join("s.sqlite3")).unwrap(),
        ));
        let access = Access::load(&[], &store.lock().unwrap()).unwrap();
        assert!(access.needs_pairing());
        let code = access.new_pairing_code();
        assert!(!access.pair(&store, 7, "guess").unwrap());
        assert!(access.pair(&store, 7, &code).unwrap());
        assert!(access.is_allowed(7) && !access.needs_pairing());
        assert_eq!(access.owner(), Some(7));
        let reloaded = Access::load(&[3], &store.lock().unwrap()).unwrap();
        assert!(reloaded.is_allowed(7) && reloaded.is_allowed(3));
        assert_eq!(reloaded.owner(), Some(3), "the configured user comes first");
    }
}

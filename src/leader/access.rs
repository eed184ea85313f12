//! Who may drive sessions: the one computation of it, and the pairing
//! code (the flows that hand one out and redeem it are `pairing.rs`).
//!
//! The users in `allowed_users` of the configuration and the users paired
//! through a one-time `/start <code>` link may write into topics and tap
//! buttons; everybody else is a stranger. The set is read from the store
//! once, when the leader starts, and kept current by [`Access::pair`]:
//! nothing asks the store per update.
//!

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

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

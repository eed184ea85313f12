//! Who may drive sessions: the one computation of it, and the pairing
//! code (the flows that hand one out and redeem it are `pairing.rs`).
//!
//! The users in `allowed_users` of the configuration (and those `[access]`
//! gives a role) and the users paired through a one-time `/start <code>`
//! link may use the bot; everybody else is a stranger. Each allowed user
//! has a [`Role`]: an owner (everything: the default, so one person's relay
//! needs no roles), a driver (writes to sessions, answers their
//! questions) or a viewer (reads only). The set is read from the store
//! once, when the leader starts, and kept current by [`Access::pair`]:
//! nothing asks the store per update.
//!

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::config::{Role, Roles};
use crate::phone::PhoneCommand;
use crate::policy::ApproveBy;
use crate::protocol::bus::Concerns;
use crate::store::{Store, StoreError};

/// The least role `command` needs: reading lists is anyone's, steering a
/// session's turn or model a driver's, starting, ending and scheduling
/// agents an owner's.
fn needs(command: &PhoneCommand) -> Role {
    match command {
        PhoneCommand::Start(_)
        | PhoneCommand::Sessions
        | PhoneCommand::Status
        | PhoneCommand::Schedules => Role::Viewer,
        PhoneCommand::Stop
        | PhoneCommand::Resend
        | PhoneCommand::Steer(_)
        | PhoneCommand::Model => Role::Driver,
        PhoneCommand::New(_)
        | PhoneCommand::Resume(_)
        | PhoneCommand::End
        | PhoneCommand::Every(_)
        | PhoneCommand::At(_) => Role::Owner,
    }
}

/// How long a pairing code stays valid.
pub(super) const PAIRING_TTL: Duration = Duration::from_secs(600);

pub(super) struct Access {
    configured: Vec<i64>,
    roles: Roles,
    /// Who may answer an approval (`[approvals] by`).
    approve_by: ApproveBy,
    allowed: Mutex<HashSet<i64>>,
    /// The allowed users' names as last seen, for saying who did what.
    names: Mutex<HashMap<i64, String>>,
    pairing: Mutex<Pairing>,
}

impl Access {
    /// The configured users (and those with a role) plus those paired
    /// earlier.
    pub fn load(
        configured: &[i64],
        roles: Roles,
        approve_by: ApproveBy,
        store: &Store,
    ) -> Result<Self, StoreError> {
        let mut allowed: HashSet<i64> = configured.iter().copied().collect();
        allowed.extend(roles.users());
        allowed.extend(store.allowed_users()?);
        let names = store.people()?.into_iter().collect();
        Ok(Self {
            configured: configured.to_vec(),
            roles,
            approve_by,
            allowed: Mutex::new(allowed),
            names: Mutex::new(names),
            pairing: Mutex::default(),
        })
    }

    pub fn is_allowed(&self, user: i64) -> bool {
        self.allowed().contains(&user)
    }

    /// What `user` may do; `None` for a stranger.
    pub fn role(&self, user: i64) -> Option<Role> {
        self.is_allowed(user).then(|| self.roles.of(user))
    }

    /// `user` wrote as `name`: kept (on disk too, when it is new) for an
    /// allowed user.
    pub fn saw(&self, store: &Arc<Mutex<Store>>, user: i64, name: &str) {
        if !self.is_allowed(user) {
            return;
        }
        {
            // Let go before the store is taken: readers take the store
            // first, then a name.
            let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
            if names.get(&user).is_some_and(|known| known == name) {
                return;
            }
            names.insert(user, name.to_string());
        }
        let stored = store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .set_person_name(user, name);
        if let Err(e) = stored {
            tracing::warn!("cannot remember a user's name: {e}");
        }
    }

    /// `user`'s name as last seen, else their id.
    pub fn name_of(&self, user: i64) -> String {
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&user)
            .cloned()
            .unwrap_or_else(|| format!("user {user}"))
    }

    /// Whether `user`, allowed, may answer an ask that `concerns` whom it
    /// says, in a session `launcher` started (when `serve` did): an owner
    /// answers anything; a viewer nothing; a driver a question, and an
    /// approval as `[approvals] by` says.
    pub fn may_answer(
        &self,
        user: i64,
        concerns: Concerns,
        launcher: impl FnOnce() -> Option<i64>,
    ) -> bool {
        match self.role(user) {
            None | Some(Role::Viewer) => false,
            Some(Role::Owner) => true,
            Some(Role::Driver) => match (concerns, self.approve_by) {
                (Concerns::Anyone, _) | (Concerns::Approval { .. }, ApproveBy::Anyone) => true,
                (Concerns::Owners, _) | (Concerns::Approval { .. }, ApproveBy::Owners) => false,
                (Concerns::Approval { requester }, ApproveBy::Requester) => {
                    requester == Some(user) || launcher() == Some(user)
                }
            },
        }
    }

    /// Why `user` may not run `command`, in words; `None` when they may.
    pub fn refuses_command(&self, user: i64, command: &PhoneCommand) -> Option<String> {
        self.refuses(user, needs(command))
    }

    /// Why `user` may not do what needs `needed`, in words; `None` when
    /// they may.
    pub fn refuses(&self, user: i64, needed: Role) -> Option<String> {
        let role = self.role(user)?;
        (!role.covers(needed)).then(|| {
            format!(
                "🔒 You are {} here ([access] in config.toml); this needs {}.",
                role.name(),
                needed.name()
            )
        })
    }

    /// The users whose messages are prompts (owners and drivers), for a
    /// batch of decisions.
    pub fn writers(&self) -> HashSet<i64> {
        self.allowed()
            .iter()
            .copied()
            .filter(|user| self.roles.of(*user).writes())
            .collect()
    }

    /// Nobody may drive sessions yet: `/telegram-connect` offers pairing.
    pub fn needs_pairing(&self) -> bool {
        self.allowed().is_empty()
    }

    /// The user whose private chat holds the topics when no group is
    /// configured: the first configured user, else the first paired one.
    pub fn topics_user(&self) -> Option<i64> {
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
        let access = Access::load(
            &[],
            Roles::default(),
            ApproveBy::Requester,
            &store.lock().unwrap(),
        )
        .unwrap();
        assert!(access.needs_pairing());
        let code = access.new_pairing_code();
        assert!(!access.pair(&store, 7, "guess").unwrap());
        assert!(access.pair(&store, 7, &code).unwrap());
        assert!(access.is_allowed(7) && !access.needs_pairing());
        assert_eq!(access.topics_user(), Some(7));
        assert_eq!(
            access.role(7),
            Some(Role::Owner),
            "a paired user owns the bot"
        );
        let roles = Roles {
            viewers: vec![9],
            ..Roles::default()
        };
        let reloaded =
            Access::load(&[3], roles, ApproveBy::Requester, &store.lock().unwrap()).unwrap();
        assert!(reloaded.is_allowed(7) && reloaded.is_allowed(3));
        assert_eq!(
            reloaded.topics_user(),
            Some(3),
            "the configured user comes first"
        );
        assert_eq!(
            reloaded.role(9),
            Some(Role::Viewer),
            "a role allows its user"
        );
        assert!(!reloaded.writers().contains(&9) && reloaded.writers().contains(&7));
        assert_eq!(reloaded.role(4), None, "a stranger");
    }

    #[test]
    fn an_approval_is_answered_by_its_requester_its_launcher_or_an_owner() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.sqlite3")).unwrap();
        let roles = Roles {
            owners: vec![1],
            drivers: vec![2, 3],
            viewers: vec![4],
        };
        let by = |approve_by| Access::load(&[], roles.clone(), approve_by, &store).unwrap();
        let approval = |requester| Concerns::Approval { requester };
        let requester = by(ApproveBy::Requester);
        assert!(
            requester.may_answer(2, approval(Some(2)), || None),
            "the requester"
        );
        assert!(
            !requester.may_answer(3, approval(Some(2)), || None),
            "another driver"
        );
        assert!(
            requester.may_answer(3, approval(Some(2)), || Some(3)),
            "the launcher"
        );
        assert!(
            requester.may_answer(1, approval(Some(2)), || None),
            "an owner"
        );
        assert!(
            !requester.may_answer(3, approval(None), || None),
            "a keyboard turn's"
        );
        assert!(
            !requester.may_answer(4, Concerns::Anyone, || None),
            "a viewer"
        );
        assert!(
            requester.may_answer(3, Concerns::Anyone, || None),
            "a question"
        );
        assert!(!requester.may_answer(3, Concerns::Owners, || Some(3)));
        assert!(
            !requester.may_answer(9, Concerns::Anyone, || None),
            "a stranger"
        );
        let owners = by(ApproveBy::Owners);
        assert!(!owners.may_answer(2, approval(Some(2)), || Some(2)));
        assert!(owners.may_answer(1, approval(Some(2)), || None));
        let anyone = by(ApproveBy::Anyone);
        assert!(anyone.may_answer(3, approval(Some(2)), || None));
        assert!(
            !anyone.may_answer(4, approval(Some(4)), || None),
            "never a viewer"
        );
    }
}

//! The leader's side of Telegram: one paced outbox for every Bot API call
//! (its own and its followers'), topic provisioning, the triage that decides
//! what enters the journal, and pairing.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{OnceCell, watch};

use crate::config::Config;
use crate::protocol::bus::{BusError, BusErrorCode, Health, Target};
use crate::store::{BindingStatus, NewUpdate, Store};
use crate::telegram::poller::{PollHealth, Triage};
use crate::telegram::{BotApi, BotInfo, RateLimiter, SetupError, TelegramError, Update};

/// How long a pairing code stays valid.
pub const PAIRING_TTL: Duration = Duration::from_secs(600);

/// Methods a follower may call through the leader, each scoped to its own
/// topic. Everything else (deleting topics, changing the bot) is the
/// leader's alone.
const FOLLOWER_METHODS: &[&str] = &["sendMessage", "editMessageText", "sendChatAction"];

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

pub struct Relay {
    api: BotApi,
    limiter: RateLimiter,
    chat_id: Option<i64>,
    config_allowed: Vec<i64>,
    pub health: watch::Sender<PollHealth>,
    pairing: Mutex<Pairing>,
    bot: OnceCell<BotInfo>,
}

impl Relay {
    pub fn new(config: &Config) -> Result<Self, SetupError> {
        let token = config.token.as_ref().ok_or(SetupError::Http {
            message: "no bot token".into(),
        })?;
        let (health, _) = watch::channel(PollHealth::Starting);
        // Benchmarks measure the relay itself, not Telegram's pacing.
        let limiter = if std::env::var_os("AGENT_RELAY_UNLIMITED").is_some_and(|v| v == "1") {
            RateLimiter::unlimited()
        } else {
            RateLimiter::new()
        };
        Ok(Self {
            api: BotApi::new(&config.api_url, token)?,
            limiter,
            chat_id: config.chat_id,
            config_allowed: config.allowed_users.clone(),
            health,
            pairing: Mutex::default(),
            bot: OnceCell::new(),
        })
    }

    pub fn api(&self) -> &BotApi {
        &self.api
    }

    /// Every Bot API call of the bus goes through here: paced per chat and
    /// globally, and a `retry_after` answer holds back that chat (or all).
    pub async fn call(&self, method: &str, params: &Value) -> Result<Value, TelegramError> {
        let chat = params.get("chat_id").and_then(Value::as_i64);
        self.limiter.acquire(chat, method).await;
        let result = self.api.call(method, params).await;
        if let Err(e) = &result
            && let Some(wait) = e.retry_after()
        {
            self.limiter.penalize(chat, wait);
        }
        result
    }

    /// A follower's call, refused unless it stays inside the caller's topic.
    pub async fn call_for(
        &self,
        target: Option<Target>,
        method: &str,
        params: &Value,
    ) -> Result<Value, BusError> {
        if !FOLLOWER_METHODS.contains(&method) {
            return Err(forbidden(format!("{method} is not available to sessions")));
        }
        let target = target.ok_or_else(|| forbidden("this session has no topic yet".into()))?;
        let chat = params.get("chat_id").and_then(Value::as_i64);
        let thread = params.get("message_thread_id").and_then(Value::as_i64);
        if chat != Some(target.chat_id) || thread != Some(target.thread_id) {
            return Err(forbidden(format!(
                "{method} must target this session's topic ({}/{})",
                target.chat_id, target.thread_id
            )));
        }
        self.call(method, params).await.map_err(telegram_error)
    }

    /// `getMe`, asked once per leader.
    pub async fn bot(&self) -> Result<&BotInfo, TelegramError> {
        self.bot.get_or_try_init(|| self.api.get_me()).await
    }

    /// The chat that holds the topics: the configured one, else the private
    /// chat with the paired user when the bot has topics enabled there.
    pub async fn topic_chat(&self, store: &Arc<Mutex<Store>>) -> Result<i64, String> {
        if let Some(chat) = self.chat_id {
            return Ok(chat);
        }
        let paired = self.allowed_users(store).first().copied();
        let Some(user) = paired else {
            return Err("no chat configured and nobody paired: set chat_id or run /telegram-connect to pair".into());
        };
        match self.bot().await {
            Ok(bot) if bot.has_topics_enabled => Ok(user),
            Ok(_) => Err("no chat_id configured, and the bot has no topics in private chats; set chat_id to a forum supergroup".into()),
            Err(e) => Err(format!("cannot ask Telegram about the bot: {e}")),
        }
    }

    /// Users allowed to drive sessions: configured ones plus paired ones.
    pub fn allowed_users(&self, store: &Arc<Mutex<Store>>) -> Vec<i64> {
        let mut users = self.config_allowed.clone();
        match store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .allowed_users()
        {
            Ok(paired) => users.extend(paired),
            Err(e) => tracing::error!("cannot read paired users: {e}"),
        }
        users
    }

    /// A fresh one-time pairing code (replacing any earlier one).
    pub fn new_pairing_code(&self) -> String {
        self.pairing().issue(Instant::now())
    }

    /// Consumes `code` if it is the current, unexpired one.
    pub fn redeem(&self, code: &str) -> bool {
        self.pairing().redeem(code, Instant::now())
    }

    fn pairing(&self) -> std::sync::MutexGuard<'_, Pairing> {
        self.pairing.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Probes a stored topic with a chat action: `Ok(true)` it exists,
    /// `Ok(false)` it is gone, `Err` the answer was ambiguous.
    pub async fn probe(&self, target: Target) -> Result<bool, TelegramError> {
        let params = json!({"chat_id": target.chat_id, "message_thread_id": target.thread_id, "action": "typing"});
        match self.call("sendChatAction", &params).await {
            Ok(_) => Ok(true),
            Err(TelegramError::ThreadGone { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub async fn create_topic(&self, chat: i64, name: &str) -> Result<Target, TelegramError> {
        let result = self
            .call("createForumTopic", &json!({"chat_id": chat, "name": name}))
            .await?;
        let thread_id = result
            .get("message_thread_id")
            .and_then(Value::as_i64)
            .ok_or_else(|| TelegramError::Malformed {
                message: "createForumTopic answered without message_thread_id".into(),
                // It said ok: a topic exists that we cannot name.
                commit_unknown: true,
            })?;
        Ok(Target {
            chat_id: chat,
            thread_id,
        })
    }

    /// Sends plain text into a topic (or a chat's General when `thread` is None).
    pub async fn say(
        &self,
        chat: i64,
        thread: Option<i64>,
        text: &str,
    ) -> Result<(), TelegramError> {
        let mut params = json!({"chat_id": chat, "text": text});
        if let Some(thread) = thread.filter(|t| *t != 1) {
            params["message_thread_id"] = json!(thread);
        }
        self.call("sendMessage", &params).await.map(drop)
    }

    /// The poll health as the bus wire states it.
    pub fn wire_health(&self) -> Health {
        match &*self.health.borrow() {
            PollHealth::Starting => Health::Starting,
            PollHealth::Ok => Health::Ok,
            PollHealth::Conflict => Health::Conflict,
            PollHealth::Offline(reason) => Health::Offline {
                reason: reason.clone(),
            },
        }
    }
}

fn forbidden(message: String) -> BusError {
    BusError {
        code: BusErrorCode::Forbidden,
        message,
        retry_after: None,
        commit_unknown: false,
    }
}

/// A Bot API failure as a bus error, keeping what a caller must know.
pub fn telegram_error(e: TelegramError) -> BusError {
    let code = match e {
        TelegramError::ParseEntities { .. } => BusErrorCode::BadMarkup,
        TelegramError::ThreadGone { .. } => BusErrorCode::TopicGone,
        _ => BusErrorCode::Telegram,
    };
    BusError {
        code,
        retry_after: e.retry_after().map(|d| d.as_secs().max(1)),
        commit_unknown: e.commit_unknown(),
        message: e.to_string(),
    }
}

/// What enters the journal: text from an allowed user in a topic that a
/// binding owns. Everything else goes to the leader's own handling.
pub struct Journaling {
    store: Arc<Mutex<Store>>,
    configured: Vec<i64>,
    /// Read once per batch: configured and paired users.
    allowed: HashSet<i64>,
    /// Read once per batch: which session owns which topic.
    owners: HashMap<(i64, i64), String>,
}

impl Journaling {
    pub fn new(store: Arc<Mutex<Store>>, configured: Vec<i64>) -> Self {
        Self {
            store,
            configured,
            allowed: HashSet::new(),
            owners: HashMap::new(),
        }
    }
}

impl Triage for Journaling {
    fn prepare(&mut self) {
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        self.allowed = self.configured.iter().copied().collect();
        match store.allowed_users() {
            Ok(paired) => self.allowed.extend(paired),
            Err(e) => tracing::error!("cannot read paired users: {e}"),
        }
        self.owners.clear();
        match store.bindings() {
            Ok(bindings) => self.owners.extend(
                bindings
                    .into_iter()
                    .filter(|b| b.status != BindingStatus::Offline)
                    .filter_map(|b| Some(((b.chat_id?, b.thread_id?), b.profile_key))),
            ),
            Err(e) => tracing::error!("cannot read the topics' owners: {e}"),
        }
    }

    fn journal(&mut self, update: &Update) -> Option<NewUpdate> {
        let message = update.message()?;
        let text = message.text.as_ref()?;
        let user = message.from.as_ref().filter(|u| !u.is_bot)?;
        let thread = message.topic()?;
        if !self.allowed.contains(&user.id) {
            return None;
        }
        let owner = self.owners.get(&(message.chat.id, thread))?.clone();
        let text = match update.kind {
            crate::telegram::UpdateKind::EditedMessage(_) => format!("(edited) {text}"),
            _ => text.clone(),
        };
        Some(NewUpdate {
            update_id: update.update_id,
            owner: Some(owner),
            chat_id: message.chat.id,
            thread_id: Some(thread),
            user_id: user.id,
            message_id: message.message_id,
            text,
        })
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
}

//! The leader's side of Telegram: one paced outbox for every Bot API call
//! (its own and its followers'), topic provisioning, the triage that decides
//! what enters the journal, and pairing.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::{OnceCell, watch};

use crate::config::Config;
use crate::protocol::bus::{BusError, BusErrorCode, Health, Target};
use crate::store::{NewUpdate, Store};
use crate::telegram::poller::{PollHealth, Triage};
use crate::telegram::{BotApi, BotInfo, RateLimiter, SetupError, TelegramError, Update};

/// How long a pairing code stays valid.
pub const PAIRING_TTL: Duration = Duration::from_secs(600);

/// Methods a follower may call through the leader, each scoped to its own
/// topic. Everything else (deleting topics, changing the bot) is the
/// leader's alone.
const FOLLOWER_METHODS: &[&str] = &["sendMessage", "editMessageText", "sendChatAction"];

struct Pairing {
    code: String,
    expires: Instant,
}

pub struct Relay {
    api: BotApi,
    limiter: RateLimiter,
    chat_id: Option<i64>,
    config_allowed: Vec<i64>,
    pub health: watch::Sender<PollHealth>,
    pairing: Mutex<Option<Pairing>>,
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
            pairing: Mutex::new(None),
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
        let code: String = std::iter::repeat_with(fastrand::alphanumeric)
            .take(24)
            .collect();
        *self.pairing.lock().unwrap_or_else(|e| e.into_inner()) = Some(Pairing {
            code: code.clone(),
            expires: Instant::now() + PAIRING_TTL,
        });
        code
    }

    /// Consumes `code` if it is the current, unexpired one.
    pub fn redeem(&self, code: &str) -> bool {
        let mut pairing = self.pairing.lock().unwrap_or_else(|e| e.into_inner());
        let valid = pairing
            .as_ref()
            .is_some_and(|p| p.code == code && Instant::now() < p.expires);
        if valid {
            *pairing = None;
        }
        valid
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
    pub store: Arc<Mutex<Store>>,
    pub allowed: Vec<i64>,
}

impl Triage for Journaling {
    fn journal(&mut self, update: &Update) -> Option<NewUpdate> {
        let message = update.message()?;
        let text = message.text.as_ref()?;
        let user = message.from.as_ref()?;
        let thread = message.topic()?;
        let store = self.store.lock().unwrap_or_else(|e| e.into_inner());
        let allowed = self.allowed.contains(&user.id)
            || store
                .allowed_users()
                .is_ok_and(|paired| paired.contains(&user.id));
        if !allowed || user.is_bot {
            return None;
        }
        let owner = match store.binding_by_thread(message.chat.id, thread) {
            Ok(Some(binding)) => binding.profile_key,
            Ok(None) => return None,
            Err(e) => {
                tracing::error!("cannot look up the topic's owner: {e}");
                return None;
            }
        };
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

//! The open asks of this leader, by token: who asked, where, which
//! message, and how each ended. Bookkeeping only, under one mutex: no
//! Telegram, no store. The first answer wins; every later tap or reply
//! changes nothing and is told so.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use crate::protocol::bus::*;

/// Most asks open at once, bot-wide (beyond, an ask is refused).
const MAX_OPEN: usize = 256;
/// How long an answered or closed ask is remembered, so a late tap hears
/// "already answered" and a late `awaitAnswer` still gets the answer.
const REMEMBER: Duration = Duration::from_secs(600);
/// Longest an ask may stay open at the leader.
const MAX_EXPIRY: Duration = Duration::from_secs(24 * 3600);

/// What the button data of an ask looks like: `a:<token>:<index>`.
pub(in crate::leader) fn button_data(token: &str, index: usize) -> String {
    format!("a:{token}:{index}")
}

/// The token and option of an ask button's data.
pub(in crate::leader) fn parse_button(data: &str) -> Option<(&str, u32)> {
    let rest = data.strip_prefix("a:")?;
    let (token, index) = rest.split_once(':')?;
    Some((token, index.parse().ok()?))
}

/// Whether `token` has the shape of one: 32 hex digits (128 random bits).
fn well_formed(token: &str) -> bool {
    token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit())
}

struct Open {
    profile: String,
    target: Target,
    message_id: i64,
    ask: Ask,
    expires: Instant,
    state: State,
    waiters: Vec<oneshot::Sender<Result<AskAnswer, BusError>>>,
}

#[derive(Clone)]
enum State {
    Open,
    Answered(AskAnswer),
    Closed(String),
}

/// What a tap or a reply did to an ask.
pub(in crate::leader) enum Taken {
    /// The first answer: show it and answer the tap.
    Answered {
        target: Target,
        message_id: i64,
        /// The tapped message, when it is another copy of the question (an
        /// asker that lost its leader while posting may have posted twice).
        copy: Option<i64>,
        text: String,
        label: String,
    },
    /// Answered or closed before.
    Settled,
    /// No open ask has that token, or it is not this message's or topic's.
    Unknown,
}

/// The open asks of this leader.
#[derive(Default)]
pub(in crate::leader) struct OpenAsks {
    open: Mutex<HashMap<String, Open>>,
}

impl OpenAsks {
    fn open(&self) -> MutexGuard<'_, HashMap<String, Open>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The buttons of a new ask, carrying its token.
    pub fn buttons(&self, ask: &Ask) -> Result<Keyboard, BusError> {
        if !well_formed(&ask.token) {
            return Err(BusError::new(
                BusErrorCode::BadFrame,
                "an ask's token is 32 hex digits",
            ));
        }
        if ask.options.is_empty() && !ask.free_text {
            return Err(BusError::new(
                BusErrorCode::BadFrame,
                "an ask needs options or free text",
            ));
        }
        if self.open().len() >= MAX_OPEN {
            return Err(BusError::new(
                BusErrorCode::Unavailable,
                format!("{MAX_OPEN} questions are open already"),
            ));
        }
        let rows = ask
            .options
            .iter()
            .enumerate()
            .map(|(i, label)| {
                vec![Button {
                    text: label.clone(),
                    data: button_data(&ask.token, i),
                }]
            })
            .collect();
        Ok(Keyboard { rows })
    }

    /// Opens an ask whose message was posted (or adopts one after a
    /// failover).
    pub fn insert(&self, profile: &str, target: Target, message_id: i64, ask: Ask) {
        let token = ask.token.clone();
        let expires = Instant::now() + Duration::from_millis(ask.expires_in_ms).min(MAX_EXPIRY);
        let mut open = self.open();
        open.entry(token).or_insert(Open {
            profile: profile.to_string(),
            target,
            message_id,
            ask,
            expires,
            state: State::Open,
            waiters: Vec::new(),
        });
    }

    /// Whether the leader knows the ask (it may have been asked of its
    /// predecessor).
    /// The session and the ask that `token` opens, for deciding who may
    /// answer it.
    pub fn concerning(&self, token: &str) -> Option<(String, Concerns)> {
        self.open()
            .get(token)
            .map(|o| (o.profile.clone(), o.ask.concerns))
    }

    pub fn knows(&self, token: &str) -> bool {
        self.open().contains_key(token)
    }

    /// Waits for the answer to `token`, asked by `profile`.
    pub fn wait(
        &self,
        token: &str,
        profile: &str,
    ) -> Result<oneshot::Receiver<Result<AskAnswer, BusError>>, BusError> {
        let mut open = self.open();
        let entry = open
            .get_mut(token)
            .filter(|o| o.profile == profile)
            .ok_or_else(not_yours)?;
        let (tx, rx) = oneshot::channel();
        match &entry.state {
            State::Open => entry.waiters.push(tx),
            State::Answered(answer) => {
                let _ = tx.send(Ok(answer.clone()));
            }
            State::Closed(why) => {
                let _ = tx.send(Err(closed(why)));
            }
        }
        Ok(rx)
    }

    /// A tap on an ask button, or a reply to an ask message, by `user`
    /// (allowed) in `chat`/`thread`. Long because every check a tap must
    /// pass (token, option, topic, state) and the answer it records sit
    /// under one lock, in the order a reader checks them.
    pub fn take(
        &self,
        token_or_message: Key<'_>,
        chat: i64,
        thread: Option<i64>,
        user_id: i64,
        user_name: &str,
    ) -> Taken {
        let mut open = self.open();
        let found = match token_or_message {
            Key::Tap { token, .. } => open.get_mut(token).map(|o| (token.to_string(), o)),
            Key::Reply { message_id, .. } => open
                .iter_mut()
                .find(|(_, o)| o.message_id == message_id && o.target.chat_id == chat)
                .map(|(t, o)| (t.clone(), o)),
        };
        let Some((_, entry)) = found else {
            return Taken::Unknown;
        };
        let here = entry.target.chat_id == chat && Some(entry.target.thread_id) == thread;
        let mut copy = None;
        let (choice, text) = match token_or_message {
            // The token is unguessable and the topic checked: a tap on
            // another message carrying it is on a copy of the question.
            Key::Tap {
                message_id, choice, ..
            } => {
                if choice as usize >= entry.ask.options.len() {
                    return Taken::Unknown;
                }
                copy = (message_id != entry.message_id).then_some(message_id);
                (Some(choice), None)
            }
            Key::Reply { text, .. } => {
                if !entry.ask.free_text {
                    return Taken::Unknown;
                }
                (None, Some(text.to_string()))
            }
        };
        if !here {
            return Taken::Unknown;
        }
        if !matches!(entry.state, State::Open) {
            return Taken::Settled;
        }
        let answer = AskAnswer {
            choice,
            text: text.clone(),
            user_id,
            user_name: user_name.to_string(),
            at_ms: super::now_ms(),
        };
        entry.state = State::Answered(answer.clone());
        entry.expires = Instant::now() + REMEMBER;
        for waiter in entry.waiters.drain(..) {
            let _ = waiter.send(Ok(answer.clone()));
        }
        let label = match (choice, text) {
            (Some(i), _) => entry.ask.options[i as usize].clone(),
            (None, Some(text)) => format!("“{}”", crate::policy::clip(&text, 200)),
            (None, None) => String::new(),
        };
        Taken::Answered {
            target: entry.target,
            message_id: entry.message_id,
            copy,
            text: entry.ask.text.clone(),
            label,
        }
    }

    /// Closes `token` for `profile`. `Ok(Some(answer))` when the phone
    /// answered first; `Ok(None)` when it is closed now, and the message
    /// (target, id, original text) should show the outcome.
    pub fn close(
        &self,
        token: &str,
        profile: &str,
        outcome: &str,
    ) -> Result<Result<(Target, i64, String), AskAnswer>, BusError> {
        let mut open = self.open();
        let entry = open
            .get_mut(token)
            .filter(|o| o.profile == profile)
            .ok_or_else(not_yours)?;
        match &entry.state {
            State::Answered(answer) => return Ok(Err(answer.clone())),
            State::Closed(_) => {
                return Ok(Ok((entry.target, entry.message_id, entry.ask.text.clone())));
            }
            State::Open => {}
        }
        entry.state = State::Closed(outcome.to_string());
        entry.expires = Instant::now() + REMEMBER;
        for waiter in entry.waiters.drain(..) {
            let _ = waiter.send(Err(closed(outcome)));
        }
        Ok(Ok((entry.target, entry.message_id, entry.ask.text.clone())))
    }

    /// Forgets what has been settled long enough, and closes open asks
    /// past their expiry; returns the messages of those, to show it.
    pub fn sweep(&self) -> Vec<(Target, i64, String)> {
        let now = Instant::now();
        let mut expired = Vec::new();
        self.open().retain(|_, entry| {
            if entry.expires > now {
                return true;
            }
            if matches!(entry.state, State::Open) {
                for waiter in entry.waiters.drain(..) {
                    let _ = waiter.send(Err(closed("expired")));
                }
                expired.push((entry.target, entry.message_id, entry.ask.text.clone()));
            }
            false
        });
        expired
    }
}

/// How a tap or a reply names its ask.
#[derive(Clone, Copy)]
pub(in crate::leader) enum Key<'a> {
    Tap {
        token: &'a str,
        message_id: i64,
        choice: u32,
    },
    Reply {
        message_id: i64,
        text: &'a str,
    },
}

fn not_yours() -> BusError {
    BusError::new(
        BusErrorCode::Forbidden,
        "no ask of this session has that token",
    )
}

fn closed(why: &str) -> BusError {
    BusError::new(
        BusErrorCode::AskClosed,
        format!("the question is closed: {why}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TARGET: Target = Target {
        chat_id: -100,
        thread_id: 7,
    };

    fn ask(free_text: bool) -> Ask {
        Ask {
            token: uuid::Uuid::new_v4().simple().to_string(),
            text: "Run <code>rm</code>?".into(),
            options: vec!["Allow".into(), "Deny".into()],
            free_text,
            concerns: Concerns::Anyone,
            expires_in_ms: 60_000,
        }
    }

    fn tap(token: &str, message_id: i64, choice: u32) -> Key<'_> {
        Key::Tap {
            token,
            message_id,
            choice,
        }
    }

    #[test]
    fn button_data_fits_telegram_and_parses_back() {
        let asks = OpenAsks::default();
        let question = ask(false);
        let token = question.token.clone();
        let keyboard = asks.buttons(&question).unwrap();
        for (i, row) in keyboard.rows.iter().enumerate() {
            assert!(row[0].data.len() <= 64, "{}", row[0].data);
            assert_eq!(parse_button(&row[0].data), Some((token.as_str(), i as u32)));
        }
        assert_eq!(parse_button("x:1:2"), None);
        let forged = Ask {
            token: "short".into(),
            ..ask(false)
        };
        assert_eq!(
            asks.buttons(&forged).unwrap_err().code,
            BusErrorCode::BadFrame
        );
        assert_eq!(parse_button("a:tok:nan"), None);
    }

    #[test]
    fn the_first_answer_wins_and_every_later_one_changes_nothing() {
        let asks = OpenAsks::default();
        let question = ask(false);
        let token = question.token.clone();
        asks.insert("api", TARGET, 5, question);
        let mut waiting = asks.wait(&token, "api").unwrap();
        // Forged and misplaced taps first: nothing happens.
        assert!(matches!(
            asks.take(tap("forged", 5, 0), -100, Some(7), 1, "A"),
            Taken::Unknown
        ));
        assert!(matches!(
            asks.take(tap(&token, 5, 0), -100, Some(8), 1, "A"),
            Taken::Unknown
        ));
        assert!(matches!(
            asks.take(tap(&token, 5, 9), -100, Some(7), 1, "A"),
            Taken::Unknown
        ));
        assert!(waiting.try_recv().is_err());
        // A tap on a copy of the question (posted twice across a failover).
        let Taken::Answered { label, copy, .. } =
            asks.take(tap(&token, 9, 1), -100, Some(7), 1, "Ada")
        else {
            panic!("the first tap answers");
        };
        assert_eq!((label.as_str(), copy), ("Deny", Some(9)));
        let answer = waiting.try_recv().unwrap().unwrap();
        assert_eq!((answer.choice, answer.user_name.as_str()), (Some(1), "Ada"));
        assert!(matches!(
            asks.take(tap(&token, 5, 0), -100, Some(7), 1, "Ada"),
            Taken::Settled
        ));
        // Closing after the phone answered returns the phone's answer.
        assert_eq!(
            asks.close(&token, "api", "x").unwrap().unwrap_err().choice,
            Some(1)
        );
    }

    #[test]
    fn only_the_asker_waits_or_closes_and_a_close_wakes_the_waiter() {
        let asks = OpenAsks::default();
        let question = ask(true);
        let token = question.token.clone();
        asks.insert("api", TARGET, 5, question);
        assert_eq!(
            asks.wait(&token, "web").unwrap_err().code,
            BusErrorCode::Forbidden
        );
        assert_eq!(
            asks.close(&token, "web", "x").unwrap_err().code,
            BusErrorCode::Forbidden
        );
        let mut waiting = asks.wait(&token, "api").unwrap();
        assert!(
            asks.close(&token, "api", "✅ at the terminal")
                .unwrap()
                .is_ok()
        );
        assert_eq!(
            waiting.try_recv().unwrap().unwrap_err().code,
            BusErrorCode::AskClosed
        );
        let reply = Key::Reply {
            message_id: 5,
            text: "too late",
        };
        assert!(matches!(
            asks.take(reply, -100, Some(7), 1, "Ada"),
            Taken::Settled
        ));
    }

    #[test]
    fn a_reply_answers_a_free_text_ask_only() {
        let asks = OpenAsks::default();
        let free_question = ask(true);
        let free = free_question.token.clone();
        asks.insert("api", TARGET, 5, free_question);
        asks.insert("api", TARGET, 6, ask(false));
        let reply = |message_id| Key::Reply {
            message_id,
            text: "use the staging db",
        };
        assert!(matches!(
            asks.take(reply(6), -100, Some(7), 1, "Ada"),
            Taken::Unknown
        ));
        let mut waiting = asks.wait(&free, "api").unwrap();
        let Taken::Answered { label, .. } = asks.take(reply(5), -100, Some(7), 1, "Ada") else {
            panic!("a reply answers a free-text ask");
        };
        assert_eq!(label, "“use the staging db”");
        let answer = waiting.try_recv().unwrap().unwrap();
        assert_eq!(answer.text.as_deref(), Some("use the staging db"));
    }

    #[test]
    fn open_asks_expire_and_are_reported_once() {
        let asks = OpenAsks::default();
        let quick = Ask {
            expires_in_ms: 0,
            ..ask(false)
        };
        let token = quick.token.clone();
        asks.insert("api", TARGET, 5, quick);
        let mut waiting = asks.wait(&token, "api").unwrap();
        let expired = asks.sweep();
        assert_eq!(expired.len(), 1);
        assert_eq!(
            waiting.try_recv().unwrap().unwrap_err().code,
            BusErrorCode::AskClosed
        );
        assert!(asks.sweep().is_empty());
        assert!(!asks.knows(&token));
    }
}

//! Everything that speaks to the Telegram Bot API. The leader makes every
//! call a session needs; besides it, only `doctor` and `setup` (their read
//! calls) and `agent-relay cluster forget` (its word in the topics of a
//! forgotten machine) call Telegram.
//!
//! * [`call`] — [`BotCall`], every call the relay makes for sessions and
//!   for itself as one type, and [`BotReply`], what it answered.
//! * [`client`] — [`BotApi`], a thin reqwest client: one POST per call, no
//!   retries of its own, client-side refusals (the General topic, negative
//!   offsets); file downloads streamed to disk under a size limit and
//!   multipart uploads streamed from disk (`upload`: a file's bytes
//!   read in large chunks, never sent other than whole and as checked).
//! * [`error`] — [`TelegramError`], the one classifier of failed calls:
//!   retryable or not, `commit_unknown` for ambiguous non-idempotent calls,
//!   `retry_after` for 429s. Every message in it is redacted.
//! * [`types`] — the Bot API objects the relay reads; updates decode one at
//!   a time and unknown kinds are skipped, never fatal.
//! * [`ratelimit`] — [`RateLimiter`], the leader's outbox pacing: per-chat
//!   windows, a global cap and `retry_after` penalties.
//!
//! It knows nothing of the bus, the store or the host: the leader's poller
//! (`leader::poller`) and outbox (`leader::outbox`) build on it.

pub mod call;
pub mod client;
pub mod error;
pub mod ratelimit;
pub mod types;
mod upload;

pub use call::{BotCall, BotReply};
pub use client::{BotApi, DownloadError, SendFile, SetupError, UploadSource};
pub use error::TelegramError;
pub use ratelimit::{ChatBudget, Priority, RateLimiter, Spent};
/// How a user gives the bot topics in private chats (`has_topics_enabled`),
/// as doctor, setup and the leader say it.
pub const TOPICS_SWITCH: &str = "in @BotFather, open your bot's settings (the Open button, or /mybots → your bot → Bot Settings) and turn on Threaded Mode (topics in private chats)";

pub use types::{
    BotInfo, CallbackQuery, ChatKind, ChatMemberStatus, FileRef, MediaKind, Message, Update,
    UpdateKind,
};

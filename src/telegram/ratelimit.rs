//! (in progress)
pub struct RateLimiter;

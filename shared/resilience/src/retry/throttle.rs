//! gRPC's retry throttling: no retries while most recent attempts fail.
//!
//! Why on top of the budget? The budget is measured against requests, and in an outage requests
//! keep coming: it settles at its share plus its floor and never reaches zero. The throttle counts
//! outcomes instead, as gRPC's retry design does ("Throttling Retry Attempts" in A6): it starts
//! with `max_tokens` tokens and holds no more; each attempt that fails the way a retry could fix
//! takes one, each success gives `token_ratio` back, and retries are refused while the tokens are
//! at most half of `max_tokens`. Other answers (NOT_FOUND, a declined payment) change nothing.
//!
//! Where it trips: with a share `f` of attempts failing, the tokens sink when `f > r·(1 − f)`,
//! that is `f > r / (1 + r)`. A6's example ratio, 0.1, trips at 9 %, so it would stop the retries
//! that win back orders when 30 % of bank calls fail; our default ratio 1.0 trips at 50 %, when
//! failures outnumber successes. The tokens are a random walk around that drift, and `max_tokens`
//! sets how far a run of bad luck must go: with A6's example 10, 30 % failing attempts still
//! closed the throttle for 1.5 % of attempts (which cost 2 % of the budget's retries at 40
//! requests/s); our default 20 makes that 0.02 % at 30 % and 1.7 % at 40 %, while at 50 %
//! it is closed half of the time and at 60 % 99 % of it. In a total outage, retries stop after
//! `max_tokens / 2` failed attempts (10); once attempts succeed again, they resume after the
//! successes that lift the tokens above half (11 from none).

use std::sync::atomic::{AtomicU32, Ordering};

/// Tokens are kept in thousandths: A6 counts `token_ratio` to three decimals, and integer
/// updates cannot drift.
const TOKEN: u32 = 1_000;

/// Retry throttling shared by every request of one policy; see the module docs.
#[derive(Debug)]
pub struct RetryThrottle {
    tokens: AtomicU32,
    max_tokens: u32,
    token_ratio: u32,
}

impl RetryThrottle {
    /// `max_tokens` at most 1000 and `token_ratio` 0.001 to 1000, as [`RetrySettings`] checks.
    ///
    /// [`RetrySettings`]: super::RetrySettings
    pub fn new(max_tokens: u32, token_ratio: f32) -> Self {
        let max_tokens = max_tokens.min(1_000) * TOKEN;
        let token_ratio = (token_ratio.clamp(0.001, 1_000.0) * TOKEN as f32).round() as u32;
        Self {
            tokens: AtomicU32::new(max_tokens),
            max_tokens,
            token_ratio,
        }
    }

    /// An attempt failed in a way a retry could fix.
    pub fn failed(&self) {
        let _ = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tokens| {
                Some(tokens.saturating_sub(TOKEN))
            });
    }

    /// An attempt succeeded.
    pub fn succeeded(&self) {
        let _ = self
            .tokens
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tokens| {
                Some((tokens + self.token_ratio).min(self.max_tokens))
            });
    }

    /// The tokens left, and the most there can be.
    pub fn tokens(&self) -> (f64, f64) {
        let tokens = |thousandths: u32| f64::from(thousandths) / f64::from(TOKEN);
        (
            tokens(self.tokens.load(Ordering::Relaxed)),
            tokens(self.max_tokens),
        )
    }

    /// Whether a retry may be made: more than half of the tokens are left.
    pub fn allows_retry(&self) -> bool {
        self.tokens.load(Ordering::Relaxed) > self.max_tokens / 2
    }
}

//! The gateway's retry policy, as a `tower::retry::Policy`.
//!
//! Why here and nowhere else? Retries multiply along a chain: three attempts at each of three
//! levels turn one user attempt into 27 bank calls, the load that finishes off a struggling
//! service. So only the edge retries, and only
//! - transient failures (UNAVAILABLE; RESOURCE_EXHAUSTED when the server names a wait; and
//!   DEADLINE_EXCEEDED only as below), of idempotent operations (reads, writes with an
//!   idempotency key);
//! - a few times (3 attempts by default), waiting `base·2^(n−1)` plus a random part of the same
//!   size, capped, so that clients that failed together do not come back together;
//! - exactly as long as the server's pushback says, when it says one;
//! - when, at the moment the retry would start, what the hop would forward (its own reserve
//!   taken, the dependency's minimum met) holds a typical successful attempt of this operation (a
//!   moving average per operation: a create is not a read, and an instant refusal says nothing
//!   about how long an answer takes), and never after a hop failed fast for lack of budget (a
//!   retry would have even less), and never through an open circuit breaker;
//! - a DEADLINE_EXCEEDED only when the attempt's slice was capped below what was left
//!   ([`deadline::Slice`]) and the retry can be given that slice again: an attempt that had all
//!   the time there was expired because the budget ran out, and a retry would have less of it
//!   (AIP-194 advises against retrying such an expiry); a capped slice that expired may have hit
//!   one slow instance, and a second try of the same length can still succeed;
//! - within a budget ([`RetryBudget`], ours: tower's `TpsBudget` allows more than it says): over
//!   a 10 s sliding window retries are at most 10 % of requests, plus a floor of 2 retries per
//!   second for quiet times;
//! - to another replica than the attempts before it, where the dependency has another: every
//!   attempt carries the replicas its call has tried ([`PreviousReplicas`]), which the balancer
//!   under the client skips;
//! - while gRPC's retry throttling allows ([`RetryThrottle`]): an attempt failing the way a
//!   retry could fix takes one of 20 tokens, a success gives one back, and with half or fewer
//!   left nothing is retried. A budget measured against requests never reaches zero in an outage
//!   (it settles at 10 % plus the floor); the throttle stops retries once failures outnumber
//!   successes by ten, and leaves them to the budget while clearly fewer than half of the
//!   attempts fail (30 % of bank calls failing, say).
//!
//! Every operation ends with a [`StopReason`], logged and counted. When the edge stops for its
//! budget, its attempts or an open breaker, the failure is marked ([`wire::RETRIES_SPENT`]) so
//! that the edge's gRPC face tells its own clients not to retry what it already retried as far as
//! it should. A failure after retries also carries `grpc-previous-rpc-attempts`, as A6 exposes
//! it to the application: the caller learns that attempts were made whose answers it never sees
//! (a create's gateway needs it to say what a failure left behind).

mod attempt_time;
mod budget;
mod call;
mod classify;
mod stats;
mod throttle;

pub use budget::RetryBudget;
pub use call::{Call, PreviousReplicas};
pub use classify::{MAX_PUSHBACK, Pushback, is_transient, pushback};
pub use stats::{RetryStats, RetryStatsSnapshot, StopReason};
pub use throttle::RetryThrottle;

use std::{sync::Arc, time::Duration};

use attempt_time::AttemptTime;
use deadline::{ForwardPolicy, Slice};

use serde::{Deserialize, Serialize};
use tokio::time::{Instant, Sleep, sleep};
use tonic::{Code, Status, metadata::MetadataValue};
use tower::retry::{
    Policy,
    backoff::{Backoff, ExponentialBackoff, ExponentialBackoffMaker, InvalidBackoff, MakeBackoff},
    budget::Budget,
};
use tower::util::rng::HasherRng;

/// A wait as whole milliseconds, rounded up: a client told to come back after a truncated wait
/// comes back early and is refused again.
pub fn wait_millis(wait: Duration) -> u64 {
    wait.as_nanos().div_ceil(1_000_000) as u64
}

/// Settings of one retry policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySettings {
    /// Attempts in total, the first included (1 disables retries).
    pub max_attempts: u32,
    /// Base of the first retry's wait; each further retry doubles it.
    pub backoff_base_ms: u64,
    /// Longest wait between attempts, jitter included.
    pub backoff_max_ms: u64,
    /// Share of requests that may be retried over the window, 0 to 1.
    pub budget_percent: f32,
    /// Retries per second allowed beyond the share, with a burst of at most one second's worth
    /// (the budget's floor, a rate: what keeps retries possible with little traffic).
    pub budget_min_per_sec: u32,
    /// The budget's sliding window (1 to 60 s).
    pub budget_window_ms: u64,
    /// The retry throttle's tokens (A6's `maxTokens`, at most 1000): retries stop while half or
    /// fewer are left. 0 turns the throttle off.
    pub throttle_max_tokens: u32,
    /// Tokens a success gives back; a failure takes 1 (A6's `tokenRatio`, 0.001 to 1000). The
    /// throttle trips when more than `ratio / (1 + ratio)` of attempts fail: 50 % with 1.
    pub throttle_token_ratio: f32,
    /// Time an attempt is assumed to need before one has been observed, and at least.
    pub min_attempt_ms: u64,
}

impl Default for RetrySettings {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            backoff_base_ms: 200,
            backoff_max_ms: 2_000,
            budget_percent: 0.1,
            budget_min_per_sec: 2,
            budget_window_ms: 10_000,
            throttle_max_tokens: 20,
            throttle_token_ratio: 1.0,
            min_attempt_ms: 50,
        }
    }
}

/// Settings that cannot work.
#[derive(Debug, thiserror::Error)]
pub enum InvalidRetrySettings {
    #[error("retry: max_attempts must be at least 1")]
    NoAttempts,
    #[error("retry: budget_window_ms must be 1000 to 60000")]
    Window,
    #[error("retry: budget_percent must be 0 to 1")]
    Percent,
    #[error("retry: throttle_max_tokens must be at most 1000")]
    ThrottleTokens,
    #[error("retry: throttle_token_ratio must be 0.001 to 1000")]
    ThrottleRatio,
    #[error("retry: {0}")]
    Backoff(#[from] InvalidBackoff),
}

#[derive(Debug)]
struct Shared {
    max_attempts: u32,
    min_attempt: Duration,
    /// How the hop forwards its deadline to the dependency these calls go to.
    forward: ForwardPolicy,
    budget: RetryBudget,
    /// `None` when `throttle_max_tokens` is 0.
    throttle: Option<RetryThrottle>,
    backoff_base: Duration,
    backoff_max: Duration,
    stats: RetryStats,
}

/// The policy of the calls to one dependency: one budget, throttle and counters for all of them.
/// Give each operation its own [`RetryPolicy::for_operation`]; tower clones it again per request.
#[derive(Debug, Clone)]
pub struct RetryPolicy {
    shared: Arc<Shared>,
    /// How long a successful attempt of this operation takes.
    attempt_time: Arc<AttemptTime>,
    /// This request's backoff sequence, made at its first retry.
    backoff: Option<ExponentialBackoff>,
    attempt_started: Option<Instant>,
}

impl RetryPolicy {
    /// The policy of the calls a hop makes to one dependency, to which it forwards its deadline
    /// with `forward`.
    pub fn new(
        settings: &RetrySettings,
        forward: ForwardPolicy,
    ) -> Result<Self, InvalidRetrySettings> {
        if settings.max_attempts == 0 {
            return Err(InvalidRetrySettings::NoAttempts);
        }
        if !(1_000..=60_000).contains(&settings.budget_window_ms) {
            return Err(InvalidRetrySettings::Window);
        }
        if !(0.0..=1.0).contains(&settings.budget_percent) {
            return Err(InvalidRetrySettings::Percent);
        }
        if settings.throttle_max_tokens > 1_000 {
            return Err(InvalidRetrySettings::ThrottleTokens);
        }
        if !(0.001..=1_000.0).contains(&settings.throttle_token_ratio) {
            return Err(InvalidRetrySettings::ThrottleRatio);
        }
        let budget = RetryBudget::new(
            Duration::from_millis(settings.budget_window_ms),
            settings.budget_min_per_sec,
            settings.budget_percent,
        );
        let throttle = (settings.throttle_max_tokens > 0).then(|| {
            RetryThrottle::new(settings.throttle_max_tokens, settings.throttle_token_ratio)
        });
        let backoff_base = Duration::from_millis(settings.backoff_base_ms);
        let backoff_max =
            Duration::from_millis(settings.backoff_max_ms.max(settings.backoff_base_ms).max(1));
        backoff_maker(backoff_base, backoff_max)?;
        let min_attempt = Duration::from_millis(settings.min_attempt_ms);
        Ok(Self {
            shared: Arc::new(Shared {
                max_attempts: settings.max_attempts,
                min_attempt,
                forward,
                budget,
                throttle,
                backoff_base,
                backoff_max,
                stats: RetryStats::new(),
            }),
            attempt_time: Arc::new(AttemptTime::new(min_attempt)),
            backoff: None,
            attempt_started: None,
        })
    }

    /// The policy for one operation (a create, a read): the same budget, throttle and counters,
    /// with its own estimate of how long an attempt takes.
    pub fn for_operation(&self) -> Self {
        Self {
            attempt_time: Arc::new(AttemptTime::new(self.shared.min_attempt)),
            ..self.clone()
        }
    }

    pub fn stats(&self) -> RetryStatsSnapshot {
        self.shared.stats.snapshot()
    }

    /// What the budget and the throttle would allow now.
    pub fn balance(&self) -> RetryBalance {
        let throttle = self.shared.throttle.as_ref().map(|throttle| {
            let (tokens, max_tokens) = throttle.tokens();
            ThrottleBalance {
                tokens,
                max_tokens,
                allows_retry: throttle.allows_retry(),
            }
        });
        RetryBalance {
            budget_available: self.shared.budget.available(),
            throttle,
        }
    }

    fn stop(&self, reason: StopReason, attempts: u32) {
        self.shared.stats.stop(reason);
        // Signed numbers: exported as numbers (unsigned ones are exported as text).
        let attempts = i64::from(attempts);
        tracing::event!(
            tracing::Level::DEBUG,
            retry.stop = reason.as_str(),
            retry.attempts = attempts,
            "retrying stopped"
        );
        if reason == StopReason::Budget {
            tracing::warn!(retry.attempts = attempts, "retry budget exhausted");
        }
    }

    /// The wait before the next attempt, or why there is none.
    fn next_wait<M>(&mut self, status: &Status, call: &Call<M>) -> Result<Sleep, StopReason> {
        let previous_attempts = call.previous_attempts;
        if status.metadata().contains_key(wire::DEADLINE_FAILED_FAST) {
            // A hop had too little budget to call on; a retry would have less.
            return Err(StopReason::Deadline);
        }
        if status.metadata().contains_key(wire::CIRCUIT_OPEN) {
            // Never retry through an open breaker.
            return Err(StopReason::Breaker);
        }
        let named_wait = match pushback(status) {
            Pushback::DoNotRetry => return Err(StopReason::Pushback),
            Pushback::Wait(wait) => Some(wait),
            Pushback::None => None,
        };
        if !is_retryable(status.code(), named_wait) {
            return Err(StopReason::NonRetryable);
        }
        // An expiry is retried only when its slice was capped: the retry needs that slice again.
        let expired_slice = match status.code() {
            Code::DeadlineExceeded => match Slice::from_headers(status.metadata().as_ref()) {
                Some(slice) if slice.capped => Some(slice.given),
                _ => return Err(StopReason::Deadline),
            },
            _ => None,
        };
        if previous_attempts + 1 >= self.shared.max_attempts {
            return Err(StopReason::Attempts);
        }
        let wait = match named_wait {
            Some(wait) => sleep(wait),
            None => {
                let shared = &self.shared;
                self.backoff
                    .get_or_insert_with(|| {
                        backoff_maker(shared.backoff_base, shared.backoff_max)
                            .expect("validated in new")
                            .make_backoff()
                    })
                    .next_backoff()
            }
        };
        // What the hop will forward when the retry starts, as it will plan it then.
        let left_then = call
            .hop
            .deadline()
            .expires_at()
            .saturating_duration_since(wait.deadline());
        let needed = self
            .attempt_time
            .expected()
            .max(self.shared.min_attempt)
            .max(expired_slice.unwrap_or_default());
        if !self
            .shared
            .forward
            .plan(left_then)
            .is_ok_and(|forward| forward.forwarded >= needed)
        {
            let reason = if named_wait.is_some() {
                StopReason::Pushback
            } else {
                StopReason::Deadline
            };
            return Err(reason);
        }
        // The throttle first: a retry it refuses must not spend the budget's share.
        if self
            .shared
            .throttle
            .as_ref()
            .is_some_and(|throttle| !throttle.allows_retry())
        {
            return Err(StopReason::Budget);
        }
        if !self.shared.budget.withdraw() {
            return Err(StopReason::Budget);
        }
        Ok(wait)
    }
}

/// Transient failures, and RESOURCE_EXHAUSTED when the server names a wait.
fn is_retryable(code: Code, named_wait: Option<Duration>) -> bool {
    is_transient(code) || (code == Code::ResourceExhausted && named_wait.is_some())
}

/// Whether a failed attempt counts against the throttle: a failure a retry could fix, whatever
/// then stops the retry (attempts, deadline, breaker), except what says nothing about the
/// dependency: a hop's fail-fast for lack of deadline, and an expiry of all the time there was
/// (the client chose that deadline; a client sending tiny ones must not close the throttle for
/// everyone).
fn takes_a_token(status: &Status) -> bool {
    let named_wait = match pushback(status) {
        Pushback::Wait(wait) => Some(wait),
        Pushback::None | Pushback::DoNotRetry => None,
    };
    let expired_uncapped = status.code() == Code::DeadlineExceeded
        && !Slice::from_headers(status.metadata().as_ref()).is_some_and(|slice| slice.capped);
    !status.metadata().contains_key(wire::DEADLINE_FAILED_FAST)
        && !expired_uncapped
        && is_retryable(status.code(), named_wait)
}

/// What a retry policy would allow at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RetryBalance {
    /// Retries the budget would allow now, one after another (floor and share together).
    pub budget_available: u64,
    /// The throttle's tokens, when it is on.
    pub throttle: Option<ThrottleBalance>,
}

/// A retry throttle's tokens at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ThrottleBalance {
    pub tokens: f64,
    pub max_tokens: f64,
    /// More than half of the tokens are left.
    pub allows_retry: bool,
}

/// Full-size jitter (factor 1): wait = base·2^(n−1) + random(0, same), capped at `max`.
///
/// A maker hands each backoff a copy of its own random generator, so backoffs made from one maker
/// would share one jitter sequence and clients that failed together would retry together. A
/// fresh generator per request (each `HasherRng::default()` is seeded anew) keeps them apart.
fn backoff_maker(base: Duration, max: Duration) -> Result<ExponentialBackoffMaker, InvalidBackoff> {
    ExponentialBackoffMaker::new(base, max, 1.0, HasherRng::default())
}

impl<M: Clone, R> Policy<Call<M>, R, Status> for RetryPolicy {
    type Future = Sleep;

    fn retry(
        &mut self,
        call: &mut Call<M>,
        result: &mut Result<R, Status>,
    ) -> Option<Self::Future> {
        // Successful attempts only: a refusal answered at once would make attempts look quick.
        if let Some(started) = self.attempt_started.take()
            && result.is_ok()
        {
            self.attempt_time.observe(started.elapsed());
        }
        let attempts = call.previous_attempts + 1;
        let status = match result {
            Ok(_) => {
                if let Some(throttle) = &self.shared.throttle {
                    throttle.succeeded();
                }
                self.stop(StopReason::Success, attempts);
                return None;
            }
            Err(status) => status,
        };
        if let Some(throttle) = &self.shared.throttle
            && takes_a_token(status)
        {
            throttle.failed();
        }
        match self.next_wait(status, call) {
            Ok(wait) => {
                self.shared.stats.retry();
                let wait_ms = wait
                    .deadline()
                    .saturating_duration_since(Instant::now())
                    .as_millis() as i64;
                tracing::debug!(retry.attempt = i64::from(attempts) + 1, retry.backoff_ms = wait_ms, code = ?status.code(), "retrying");
                call.previous_attempts = attempts;
                Some(wait)
            }
            Err(reason) => {
                if matches!(
                    reason,
                    StopReason::Budget | StopReason::Attempts | StopReason::Breaker
                ) {
                    status.metadata_mut().insert(
                        wire::RETRIES_SPENT,
                        MetadataValue::from_static(reason.as_str()),
                    );
                }
                // The attempts before this failure, as A6 exposes them to the application: what
                // they did is not in this answer, and a caller may need to know they were made.
                if call.previous_attempts > 0 {
                    status.metadata_mut().insert(
                        wire::PREVIOUS_ATTEMPTS,
                        MetadataValue::from(call.previous_attempts),
                    );
                }
                self.stop(reason, attempts);
                None
            }
        }
    }

    fn clone_request(&mut self, call: &Call<M>) -> Option<Call<M>> {
        if call.previous_attempts == 0 {
            self.shared.budget.deposit();
            self.shared.stats.request();
        }
        self.attempt_started = Some(Instant::now());
        Some(call.clone())
    }
}

//! The completer: settles creates that were left half-done, before anyone repeats them afresh.
//!
//! Why a completer? A create whose payment failed is released for the client's retry, but the
//! client may never retry: the bank charged and the reply was lost, the gateway ran out of
//! attempts, budget or deadline, and the client got 503. The order then waits in
//! `pending_payment` with the money taken. The completer finds such keys (past their first phase,
//! not completed, nobody holding them for `grace_ms`) and resumes them as a repeat of the client
//! would: the same order, the same derived payment key, so payment and the bank replay the charge
//! rather than make a second one, and the outcome is recorded with its webhook event. Resuming is
//! a takeover of the key's lease, so two completers (two replicas) or a completer and the
//! client's own retry never both work on one key.
//!
//! It must not become a retry loop of its own in an outage: a stranded create is one that already
//! failed, and resuming every one of them every few seconds while the bank is down would multiply
//! the bank's load as retries at every level do. So a round stops starting resumes at its first
//! failure, and after a round that settled nothing and failed, the completer only probes: one
//! create per round, the pause between rounds doubling up to `max_backoff_ms`. The first create
//! that settles brings back full rounds.
//!
//! Nor may a few creates that fail for their own reasons (poison keys) hold up the others: each
//! resume is counted in the key's row, a key waits `grace_ms` doubled per failed resume before
//! the next, the keys tried least (and then the longest waiting) are taken first, and after
//! `max_attempts` resumes a key is parked: no longer resumed, logged, counted in
//! `orders.completer.parked`, left for an operator.
//!
//! It only resumes keys first used within `window_ms`: past payment's key TTL payment would no
//! longer know the payment, so the window must be shorter (the settings refuse otherwise), and
//! what is left beyond it is counted for an operator instead.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use deadline::{Deadline, Hop, HopStats};
use futures::StreamExt;
use idempotency::{KeyError, ResumePolicy, StrandedKey};
use proto::common::v1::OrderStatus;
use serde::{Deserialize, Serialize};
use telemetry::metrics::{Counter, Gauge, KeyValue};
use tokio::{task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::{HOP, OrderService, error::OrdersError};

/// How the completer looks for and resumes stranded creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompleterSettings {
    /// How often it looks for stranded creates.
    pub interval_ms: u64,
    /// The longest pause between rounds while resumes keep failing (it doubles from
    /// `interval_ms`).
    pub max_backoff_ms: u64,
    /// How long a released create (or one whose lease ran out) is left for the client's own
    /// retry before the completer resumes it; also the wait before it tries one again.
    pub grace_ms: u64,
    /// Creates first tried longer ago than this are no longer resumed but counted as unsettled,
    /// for an operator. Must be shorter than `payment_key_ttl_ms`.
    pub window_ms: u64,
    /// How long payment keeps its idempotency keys (payment's `idempotency.ttl_ms`).
    pub payment_key_ttl_ms: u64,
    /// The deadline of each resumed create, as a client's request would have.
    pub deadline_ms: u64,
    /// Creates resumed at once.
    pub concurrency: u32,
    /// Creates taken per round at most.
    pub batch: u32,
    /// Resumes of one create after which it is parked for an operator (1 to 64).
    pub max_attempts: u32,
}

impl Default for CompleterSettings {
    fn default() -> Self {
        Self {
            interval_ms: 1_000,
            max_backoff_ms: 60_000,
            grace_ms: 10_000,
            window_ms: 12 * 3_600_000,
            payment_key_ttl_ms: 7 * 24 * 3_600_000,
            deadline_ms: 2_000,
            concurrency: 4,
            batch: 100,
            // With the grace doubling per failed resume (10 s, 20 s, … 85 min), the tenth resume
            // comes about 2.8 h after the client gave up: an outage shorter than that parks
            // nothing, and a create that fails for its own reasons costs ten payment calls and
            // is in an operator's hands well within the 12 h window.
            max_attempts: 10,
        }
    }
}

impl CompleterSettings {
    /// Refuses settings that would resume a create payment may have forgotten.
    pub fn check(&self) -> Result<(), String> {
        if self.window_ms >= self.payment_key_ttl_ms {
            return Err(format!(
                "completer.window_ms ({} ms) must be shorter than payment's key TTL, completer.payment_key_ttl_ms ({} ms): \
                 a create resumed after payment forgot its key would be paid afresh",
                self.window_ms, self.payment_key_ttl_ms
            ));
        }
        if self.grace_ms >= self.window_ms {
            return Err(format!(
                "completer.grace_ms ({} ms) must be shorter than completer.window_ms ({} ms)",
                self.grace_ms, self.window_ms
            ));
        }
        if !(1..=64).contains(&self.max_attempts) {
            return Err(format!(
                "completer.max_attempts ({}) must be from 1 to 64",
                self.max_attempts
            ));
        }
        Ok(())
    }

    /// Which stranded creates the completer takes, and when it parks one.
    fn policy(&self) -> ResumePolicy {
        ResumePolicy {
            grace: Duration::from_millis(self.grace_ms),
            window: Duration::from_millis(self.window_ms),
            max_attempts: self.max_attempts,
        }
    }
}

/// How one resumed create ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resumed {
    Paid,
    Declined,
    /// Payment or storage failed, or the deadline passed: the key is resumed in a later round.
    Failed,
    /// Another completer or the client's own retry took the key first.
    Taken,
    /// Not started: an earlier resume of the round failed.
    Skipped,
}

impl Resumed {
    fn as_str(self) -> &'static str {
        match self {
            Resumed::Paid => "paid",
            Resumed::Declined => "declined",
            Resumed::Failed => "failed",
            Resumed::Taken => "taken",
            Resumed::Skipped => "skipped",
        }
    }
}

/// Whether a round's resumes failed and none settled: payment is likely failing still.
fn failed_without_settling(outcomes: &[Resumed]) -> bool {
    outcomes.contains(&Resumed::Failed)
        && !outcomes
            .iter()
            .any(|outcome| matches!(outcome, Resumed::Paid | Resumed::Declined))
}

/// Names of the completer's instruments.
pub mod name {
    /// Rounds the completer ran.
    pub const RUNS: &str = "orders.completer.runs";
    /// Creates it resumed, by `outcome`: `paid`, `declined`, `failed` (tried again later),
    /// `taken` (someone else resumed it first).
    pub const RESUMES: &str = "orders.completer.resumes";
    /// Half-done creates older than the window, which it no longer resumes: for an operator.
    pub const UNSETTLED: &str = "orders.completer.unsettled";
    /// Half-done creates within the window parked after `max_attempts` resumes: for an operator.
    pub const PARKED: &str = "orders.completer.parked";
}

/// Resumes stranded creates of one orders service.
#[derive(Debug, Clone)]
pub(crate) struct Completer {
    service: OrderService,
    settings: CompleterSettings,
    hop_stats: Arc<HopStats>,
    runs: Counter<u64>,
    resumes: Counter<u64>,
    unsettled: Gauge<u64>,
    parked: Gauge<u64>,
}

impl Completer {
    pub(crate) fn new(
        service: OrderService,
        settings: CompleterSettings,
        hop_stats: Arc<HopStats>,
    ) -> Self {
        let meter = telemetry::metrics::meter();
        Self {
            service,
            settings,
            hop_stats,
            runs: telemetry::metrics::counter(name::RUNS, "Rounds of the completer"),
            resumes: telemetry::metrics::counter(
                name::RESUMES,
                "Stranded creates the completer resumed, by outcome",
            ),
            unsettled: meter
                .u64_gauge(name::UNSETTLED)
                .with_description("Half-done creates older than the completer's window")
                .build(),
            parked: meter
                .u64_gauge(name::PARKED)
                .with_description(
                    "Half-done creates the completer parked after repeated failed resumes",
                )
                .build(),
        }
    }

    /// Runs rounds until `shutdown` is cancelled: every `interval_ms`, or, while they fail, one
    /// probe at a time with a doubling pause.
    pub(crate) fn spawn(self, shutdown: CancellationToken) -> JoinHandle<()> {
        let interval = Duration::from_millis(self.settings.interval_ms.max(1));
        let max_backoff = Duration::from_millis(self.settings.max_backoff_ms).max(interval);
        tokio::spawn(async move {
            let mut pause = interval;
            let mut probing = false;
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(pause) => {}
                }
                let limit = if probing { 1 } else { self.settings.batch };
                (probing, pause) = match self.run_once(limit).await {
                    // Nothing was due (the failing creates all wait out their grace): nothing
                    // learnt of payment, so a probing completer keeps probing.
                    Ok(outcomes) if outcomes.is_empty() => (probing, interval),
                    Ok(outcomes) if !failed_without_settling(&outcomes) => (false, interval),
                    Ok(_) => (true, (pause * 2).min(max_backoff)),
                    Err(error) => {
                        tracing::warn!(%error, "the completer's round failed; the next one tries again");
                        (true, (pause * 2).min(max_backoff))
                    }
                };
            }
        })
    }

    /// One round: resumes up to `limit` of the stranded creates found now, until one fails.
    async fn run_once(&self, limit: u32) -> Result<Vec<Resumed>, KeyError> {
        let span = tracing::info_span!("completer.run", found = tracing::field::Empty);
        telemetry::trace::set_service(&span, HOP);
        async {
            self.runs.add(1, &[]);
            let (settings, policy) = (&self.settings, self.settings.policy());
            let keys = self.service.keys.clone();
            self.unsettled
                .record(keys.count_unsettled_before(policy.window).await?, &[]);
            self.parked.record(keys.count_parked(&policy).await?, &[]);
            let stranded = keys.stranded(&policy, limit).await?;
            tracing::Span::current().record("found", stranded.len());
            let failed = AtomicBool::new(false);
            let outcomes = futures::stream::iter(stranded)
                .map(|key| async {
                    if failed.load(Ordering::Relaxed) {
                        return Resumed::Skipped;
                    }
                    let outcome = self.resume(key).await;
                    if outcome == Resumed::Failed {
                        failed.store(true, Ordering::Relaxed);
                    }
                    outcome
                })
                .buffer_unordered(settings.concurrency.max(1) as usize)
                .collect()
                .await;
            Ok(outcomes)
        }
        .instrument(span)
        .await
    }

    /// Resumes one create under a deadline of its own, in a hop of its own, so that payment gets
    /// its slice of it and the trace shows it like a client's request.
    async fn resume(&self, stranded: StrandedKey) -> Resumed {
        let budget = Duration::from_millis(self.settings.deadline_ms);
        let hop = Arc::new(Hop::new(
            HOP,
            Deadline::after(Instant::now(), budget),
            self.hop_stats.clone(),
        ));
        let span = tracing::info_span!(
            "completer.resume",
            client = %stranded.scope,
            order_id = stranded.resource_id.as_deref().unwrap_or_default(),
            recovery_point = %stranded.recovery_point,
            outcome = tracing::field::Empty,
        );
        let mut attempted = false;
        let work = self.settle(&hop, &stranded, budget, &mut attempted);
        let outcome = match tokio::time::timeout(budget, work)
            .instrument(span.clone())
            .await
        {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(OrdersError::Payment(status))) => {
                tracing::info!(parent: &span, code = ?status.code(), message = status.message(), "a stranded create's payment failed again");
                Resumed::Failed
            }
            Ok(Err(error)) => {
                tracing::warn!(parent: &span, %error, "resuming a stranded create failed");
                Resumed::Failed
            }
            // The lease ends with the deadline, so the key is free again for a later round.
            Err(_) => Resumed::Failed,
        };
        span.record("outcome", outcome.as_str());
        self.resumes
            .add(1, &[KeyValue::new("outcome", outcome.as_str())]);
        if outcome == Resumed::Failed
            && attempted
            && stranded.resume_attempts + 1 >= self.settings.max_attempts
        {
            tracing::warn!(
                parent: &span,
                resumes = stranded.resume_attempts + 1,
                "a stranded create failed every resume and is parked: the completer leaves it to an operator, to settle or re-arm"
            );
        }
        outcome
    }

    /// Takes the create's key over (`attempted` says it did: the resume is then counted against
    /// the key) and settles it through payment.
    async fn settle(
        &self,
        hop: &Arc<Hop>,
        stranded: &StrandedKey,
        lease: Duration,
        attempted: &mut bool,
    ) -> Result<Resumed, OrdersError> {
        let service = &self.service;
        let Some(mut lease) = service.keys.resume(stranded, lease).await? else {
            return Ok(Resumed::Taken);
        };
        *attempted = true;
        let order_id = lease.resource_id.clone().ok_or_else(|| {
            OrdersError::Corrupt(
                stranded.key.clone(),
                format!(
                    "its key is at {} but names no order",
                    stranded.recovery_point
                ),
            )
        })?;
        let order = service.orders.load(&order_id).await?;
        let order = service
            .pay(hop, &stranded.scope, &stranded.key, &mut lease, order)
            .await?;
        Ok(if order.status() == OrderStatus::Paid {
            Resumed::Paid
        } else {
            Resumed::Declined
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_attempts_outside_one_to_sixty_four_is_refused() {
        let with = |max_attempts| {
            CompleterSettings {
                max_attempts,
                ..CompleterSettings::default()
            }
            .check()
        };
        assert!(
            with(0).unwrap_err().contains("completer.max_attempts"),
            "a create never resumed at all"
        );
        assert!(
            with(65).unwrap_err().contains("completer.max_attempts"),
            "a wait halved 65 times: a shift out of range"
        );
        assert_eq!((with(1), with(64)), (Ok(()), Ok(())));
    }
}

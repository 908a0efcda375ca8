//! Per-recipient isolation: one worker per endpoint, each with its own limits.
//!
//! Why a worker per endpoint and not one pool for all? A recipient that hangs holds every
//! delivery sent to it until the request timeout. In a shared pool its deliveries would take
//! every slot, and healthy recipients would wait behind it. Here each endpoint has its own
//! concurrency limit (a semaphore of the endpoint's `max_in_flight`) and its own rate limit
//! (`rate_per_sec`): a slow recipient fills only its own permits, and the dispatcher, which never
//! waits on a worker, keeps waking the others.
//!
//! The dispatcher asks the outbox every poll interval which endpoints have deliveries due,
//! starts a worker for an endpoint it has not seen, and wakes the ones it has. A worker claims
//! deliveries while they are due and it has permits, sends each in a task of its own holding a
//! permit, and leaves when it has been idle for a while with nothing in flight. An endpoint's
//! URL is read with each claim, so an update applies to the next delivery; its limits are read
//! when its worker starts, and a change applies to its next worker (the claim itself always keeps
//! to the stored `max_in_flight`).
//!
//! A `Retry-After` pause is not the worker's: it is the endpoint's row in the outbox
//! (`paused_until_ms`), which the claim checks. A worker that leaves, a sender that restarts and
//! every other sender all see it.

use std::{collections::HashMap, num::NonZeroU32, sync::Arc, time::Duration};

use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};
use idempotency::Clock;
use outbox::{Claim, Deliveries, DeliveryOutcome, DisableRule, DueEndpoint};
use tokio::{
    sync::{Notify, OwnedSemaphorePermit, Semaphore},
    task::JoinHandle,
    time::Instant,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::Instrument;
use webhooks::ssrf::Resolve;

use crate::{
    delivery::{Deliverer, Verdict},
    fair_share::{FairShare, FairShares},
    metrics::SenderMetrics,
    schedule::RetrySchedule,
};

/// Poll intervals a worker waits without work, and without deliveries in flight, before it
/// leaves.
const IDLE_POLLS: u32 = 50;

/// What every worker and delivery shares.
pub(crate) struct Sender<R> {
    pub deliveries: Deliveries,
    pub deliverer: Deliverer<R>,
    pub schedule: RetrySchedule,
    pub clock: Arc<dyn Clock>,
    pub metrics: SenderMetrics,
    pub poll_interval: Duration,
    pub lease_ms: i64,
    /// When failures disable an endpoint.
    pub disable: DisableRule,
    /// The bounds of an honoured `Retry-After`.
    pub retry_after_min: Duration,
    pub retry_after_max: Duration,
    /// Places for deliveries in flight, shared fairly between clients.
    pub in_flight: FairShares,
    /// Each client's deliveries per second, all its endpoints together.
    pub client_rate: DefaultKeyedRateLimiter<Arc<str>>,
    /// Deliveries a range redelivery queues per poll interval.
    pub redelivery_batch: u32,
    pub retention: Retention,
    /// Workers and deliveries, waited for at shutdown.
    pub tasks: TaskTracker,
}

/// How long the outbox keeps events, and how it reaps them.
pub(crate) struct Retention {
    pub retention_ms: i64,
    pub reap_interval: Duration,
    /// Events deleted per transaction.
    pub reap_batch: u32,
}

/// A running worker, as the dispatcher knows it.
struct WorkerHandle {
    wake: Arc<Notify>,
    task: JoinHandle<()>,
}

impl<R: Resolve + Send + Sync + 'static> Sender<R> {
    /// Polls for due endpoints and wakes their workers until `shutdown`.
    pub(crate) async fn dispatch(self: Arc<Self>, shutdown: CancellationToken) {
        let mut workers: HashMap<String, WorkerHandle> = HashMap::new();
        let mut ticks = ticks(self.poll_interval);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            workers.retain(|_, worker| !worker.task.is_finished());
            // Forgets the clients whose budget is full again, so the table holds active ones only.
            self.client_rate.retain_recent();
            let due = match self.deliveries.due_endpoints(self.clock.now_ms()).await {
                Ok(due) => due,
                Err(error) => {
                    tracing::warn!(%error, "cannot read the endpoints with deliveries due");
                    continue;
                }
            };
            for endpoint in due {
                match workers.get(&endpoint.endpoint_id) {
                    Some(worker) => worker.wake.notify_one(),
                    None => {
                        let endpoint_id = endpoint.endpoint_id.clone();
                        let worker = Worker::new(self.clone(), endpoint);
                        let wake = worker.wake.clone();
                        let task = self.tasks.spawn(worker.run(shutdown.clone()));
                        workers.insert(endpoint_id, WorkerHandle { wake, task });
                    }
                }
            }
        }
    }

    /// Reaps the outbox every `retention.reap_interval` until `shutdown`: the events past
    /// retention that nothing still delivers, with their deliveries and attempts, in batches.
    pub(crate) async fn reap_outbox(self: Arc<Self>, shutdown: CancellationToken) {
        let mut ticks = ticks(self.retention.reap_interval);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            let retention = &self.retention;
            match self
                .deliveries
                .reap_expired(
                    retention.retention_ms,
                    retention.reap_batch,
                    self.clock.now_ms(),
                )
                .await
            {
                Ok(0) => {}
                Ok(reaped) => tracing::info!(reaped, "events past retention reaped"),
                Err(error) => tracing::warn!(%error, "reaping the outbox failed; will try again"),
            }
        }
    }

    /// Runs the range redeliveries, one batch every poll interval (they take turns), until
    /// `shutdown`: each batch is a short transaction of its own, so that orders' commits never
    /// wait behind a whole range.
    pub(crate) async fn redeliver_ranges(self: Arc<Self>, shutdown: CancellationToken) {
        let mut ticks = ticks(self.poll_interval);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            match self
                .deliveries
                .redeliver_next_batch(self.redelivery_batch, self.clock.now_ms())
                .await
            {
                Ok(Some(queued)) => tracing::debug!(queued, "a batch of a range redelivery queued"),
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "cannot run a batch of a range redelivery"),
            }
        }
    }

    /// Sends one claimed delivery to its endpoint's URL, an endpoint of `client_id`, and records
    /// what happened; `_places` are the endpoint's concurrency slot and the client's place in the
    /// sender, held until then.
    async fn deliver(
        self: Arc<Self>,
        client_id: Arc<str>,
        claim: Claim,
        _places: (OwnedSemaphorePermit, FairShare),
    ) {
        // The lease is measured on the database's clock; this is the same length on ours, from a
        // moment just after the claim, so it ends no earlier than the lease itself.
        let lease_ends =
            Instant::now() + Duration::from_millis(u64::try_from(self.lease_ms).unwrap_or(0));
        let report = self.deliverer.deliver(&client_id, &claim).await;
        let now_ms = self.clock.now_ms();
        let outcome = self.next_step(&claim, report.verdict, now_ms);
        let label = match outcome {
            DeliveryOutcome::Delivered => "delivered",
            DeliveryOutcome::Gone { .. } => "gone",
            DeliveryOutcome::Failed {
                retry_at_ms: Some(_),
            }
            | DeliveryOutcome::Paused {
                retry_at_ms: Some(_),
                ..
            } => "retrying",
            DeliveryOutcome::Failed { retry_at_ms: None }
            | DeliveryOutcome::Paused {
                retry_at_ms: None, ..
            } => "undelivered",
        };
        self.metrics.attempt(label, report.attempt.duration_ms);
        let attempt = &report.attempt;
        match outcome {
            DeliveryOutcome::Delivered => tracing::debug!(
                status = attempt.status_code,
                duration_ms = attempt.duration_ms,
                "delivered"
            ),
            _ => tracing::info!(
                outcome = label,
                status = attempt.status_code,
                error = attempt.error.as_deref(),
                duration_ms = attempt.duration_ms,
                "delivery attempt failed"
            ),
        }
        match until_recorded(lease_ends, || {
            self.deliveries
                .finish(&claim, attempt, outcome, self.disable, now_ms)
        })
        .await
        {
            Ok(finished) => {
                if finished.lease_lost {
                    self.metrics.lease_lost();
                    tracing::warn!(
                        "the lease ran out before the attempt was recorded; another sender has the delivery"
                    );
                }
                if let Some(reason) = finished.endpoint_disabled {
                    self.metrics.endpoint_disabled();
                    tracing::warn!(%reason, "endpoint disabled");
                }
            }
            // The lease runs out and the delivery is attempted again, with the same webhook-id.
            Err(error) => tracing::error!(%error, "cannot record the attempt within the lease"),
        }
    }

    /// What comes after an attempt with `verdict`, `claim.schedule_step` failures before it.
    fn next_step(&self, claim: &Claim, verdict: Verdict, now_ms: i64) -> DeliveryOutcome {
        let failures = claim.schedule_step + 1;
        let at = |delay: Duration| {
            now_ms.saturating_add(i64::try_from(delay.as_millis()).unwrap_or(i64::MAX))
        };
        let scheduled = self.schedule.delay_after(failures, &mut rand::rng());
        match verdict {
            Verdict::Delivered => DeliveryOutcome::Delivered,
            Verdict::Gone => DeliveryOutcome::Gone {
                retry_at_ms: scheduled.map(at),
            },
            // The recipient's wait is the least the delivery waits, and the endpoint pauses for
            // it; the schedule still applies, so a recipient that always asks for a short wait
            // cannot spend the day-long schedule in seconds.
            Verdict::RetryAfter(wait) => {
                let until_ms = at(wait.clamp(self.retry_after_min, self.retry_after_max));
                DeliveryOutcome::Paused {
                    retry_at_ms: scheduled.map(|delay| at(delay).max(until_ms)),
                    until_ms,
                }
            }
            Verdict::Failed => DeliveryOutcome::Failed {
                retry_at_ms: scheduled.map(at),
            },
        }
    }
}

/// Ticks every `period`; a tick missed while busy is not made up for in a burst.
fn ticks(period: Duration) -> tokio::time::Interval {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks
}

/// The first wait before recording an attempt again, doubled after each failure up to
/// [`RECORD_RETRY_MAX`].
const RECORD_RETRY_FIRST: Duration = Duration::from_millis(100);
const RECORD_RETRY_MAX: Duration = Duration::from_secs(2);

/// Runs `record` until it succeeds, or until the next try would start after `deadline`.
///
/// Why try again? An attempt that cannot be recorded (no pool connection in time, a failover)
/// is sent again once its lease runs out: a duplicate the receiver must absorb, and an attempt
/// missing from the log. While the lease lasts, recording later is as good as recording now.
/// (A try that committed but whose answer was lost fails again on the attempt's key; the
/// delivery is recorded all the same.)
async fn until_recorded<T, E: std::fmt::Display, F, Fut>(
    deadline: Instant,
    mut record: F,
) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let mut wait = RECORD_RETRY_FIRST;
    loop {
        match record().await {
            Ok(recorded) => return Ok(recorded),
            Err(error) if Instant::now() + wait < deadline => {
                tracing::warn!(%error, retry_in_ms = wait.as_millis(), "cannot record the attempt yet");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(RECORD_RETRY_MAX);
            }
            Err(error) => return Err(error),
        }
    }
}

/// Claims and sends one endpoint's deliveries within its limits.
struct Worker<R> {
    sender: Arc<Sender<R>>,
    endpoint: DueEndpoint,
    client_id: Arc<str>,
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
    rate: DefaultDirectRateLimiter,
    wake: Arc<Notify>,
}

impl<R: Resolve + Send + Sync + 'static> Worker<R> {
    fn new(sender: Arc<Sender<R>>, endpoint: DueEndpoint) -> Self {
        // The table's checks keep both positive; a corrupt row gets the most cautious limits.
        let positive = |value: i64| {
            u32::try_from(value)
                .ok()
                .and_then(NonZeroU32::new)
                .unwrap_or(NonZeroU32::MIN)
        };
        let max_in_flight = positive(endpoint.max_in_flight).get() as usize;
        Self {
            sender,
            client_id: endpoint.client_id.as_str().into(),
            in_flight: Arc::new(Semaphore::new(max_in_flight)),
            max_in_flight,
            rate: RateLimiter::direct(Quota::per_second(positive(endpoint.rate_per_sec))),
            wake: Arc::new(Notify::new()),
            endpoint,
        }
    }

    async fn run(self, shutdown: CancellationToken) {
        let span = tracing::info_span!("endpoint", endpoint_id = %self.endpoint.endpoint_id);
        telemetry::trace::set_service(&span, crate::SERVICE.name);
        async {
            loop {
                self.claim_while_due(&shutdown).await;
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = self.wake.notified() => {}
                    () = tokio::time::sleep(self.sender.poll_interval * IDLE_POLLS) => {
                        // Leaving with deliveries in flight would let a new worker start beside
                        // them with fresh permits, over the endpoint's limit.
                        if self.in_flight.available_permits() == self.max_in_flight {
                            return;
                        }
                    }
                }
            }
        }
        .instrument(span)
        .await;
    }

    async fn claim_while_due(&self, shutdown: &CancellationToken) {
        loop {
            let permit = tokio::select! {
                () = shutdown.cancelled() => return,
                permit = self.in_flight.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.rate.until_ready() => {}
            }
            // Above the endpoint's limits, the client's: its budget per second, and its fair
            // share of the sender's places, so that a client with many busy endpoints cannot
            // crowd the others out.
            let sender = &self.sender;
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = sender.client_rate.until_key_ready(&self.client_id) => {}
            }
            let place = tokio::select! {
                () = shutdown.cancelled() => return,
                place = sender.in_flight.take(&self.client_id) => place,
            };
            // The claim finds nothing while the endpoint is paused, and the dispatcher does not
            // wake this worker again before the pause ends.
            let claim = match sender
                .deliveries
                .claim(
                    &self.endpoint.endpoint_id,
                    sender.clock.now_ms(),
                    sender.lease_ms,
                )
                .await
            {
                Ok(Some(claim)) => claim,
                Ok(None) => return,
                Err(error) => {
                    tracing::warn!(%error, "cannot claim a delivery");
                    return;
                }
            };
            let span = tracing::info_span!("delivery", event_id = %claim.event_id, attempt = claim.attempt);
            let delivery = sender
                .clone()
                .deliver(self.client_id.clone(), claim, (permit, place));
            sender.tasks.spawn(delivery.instrument(span));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_record_that_fails_is_tried_again_while_the_lease_lasts() {
        let started = Instant::now();
        let tries = Cell::new(0);
        let recorded = until_recorded(started + Duration::from_secs(15), || {
            tries.set(tries.get() + 1);
            std::future::ready(if tries.get() < 3 {
                Err("no connection")
            } else {
                Ok("recorded")
            })
        })
        .await;
        assert_eq!(recorded, Ok("recorded"));
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(100 + 200),
            "waits of 100 ms, then 200 ms"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_that_keeps_failing_gives_up_before_the_lease_ends() {
        let started = Instant::now();
        let tries = Cell::new(0);
        let recorded: Result<(), _> = until_recorded(started + Duration::from_secs(5), || {
            tries.set(tries.get() + 1);
            std::future::ready(Err("no connection"))
        })
        .await;
        assert_eq!(recorded, Err("no connection"));
        // Tries at 0, 0.1, 0.3, 0.7, 1.5 and 3.1 s; the next, 2 s later (the longest wait), would
        // be past the lease.
        assert_eq!(
            (tries.get(), started.elapsed()),
            (6, Duration::from_millis(3_100))
        );
    }
}

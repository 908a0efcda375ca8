//! The load generator: requests leave on a fixed schedule whatever the answers do (open loop),
//! and each latency is counted from the moment its request was due, so that a slow answer cannot
//! hide the requests that should have left behind it (coordinated omission).
//!
//! A thread of its own paces the requests: tokio's timer rounds every wait up to a whole
//! millisecond, which would add up to 1 ms to latencies of a few milliseconds. Each request then
//! runs as a task on the runtime. A request that falls due while `max_in_flight` are still
//! unanswered is not sent and counts as the failure [`DROPPED`]: waiting for room would slow the
//! schedule down and hide the overload. Every run is bounded in requests and in time, and prints
//! a progress line on stderr every second.

use std::{
    collections::BTreeMap,
    future::Future,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The failure of a request that was due while too many were in flight.
pub const DROPPED: &str = "dropped: too many in flight";
/// The failure of a request still unanswered when the run's time was up.
pub const UNFINISHED: &str = "unanswered when the run ended";

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Arrival {
    /// Requests due at a fixed rate, whatever the answers do.
    Rate { per_second: f64 },
    /// A fixed number of clients, each sending its next request when its last one is answered.
    /// It finds a ceiling quickly, but its latencies flatter: a client waits out its own slow
    /// answer instead of sending what was due meanwhile.
    Clients { count: usize },
}

/// What stops a run: its size, its time, and how much may be unanswered at once.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Bounds {
    /// No request is sent when this many are unanswered.
    pub max_in_flight: usize,
    /// After the last request is sent, answers are awaited this long at most.
    pub drain: Duration,
}

/// One run of the generator.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LoadPlan {
    /// Shown in the progress lines.
    pub label: String,
    pub arrival: Arrival,
    /// Requests at most.
    pub requests: usize,
    /// No request is sent after this much time.
    pub time_limit: Duration,
    pub bounds: Bounds,
}

impl LoadPlan {
    /// `per_second` requests per second for `duration`.
    pub fn rate(
        label: impl Into<String>,
        per_second: f64,
        duration: Duration,
        bounds: Bounds,
    ) -> Self {
        let requests = (per_second * duration.as_secs_f64()).ceil().max(1.0) as usize;
        Self {
            label: label.into(),
            arrival: Arrival::Rate { per_second },
            requests,
            time_limit: duration,
            bounds,
        }
    }

    /// `requests` requests at `per_second`: the last one is due after `requests / per_second`.
    pub fn count(
        label: impl Into<String>,
        requests: usize,
        per_second: f64,
        bounds: Bounds,
    ) -> Self {
        let time_limit = Duration::from_secs_f64(requests as f64 / per_second);
        Self {
            label: label.into(),
            arrival: Arrival::Rate { per_second },
            requests,
            time_limit,
            bounds,
        }
    }

    /// `clients` clients sending one request after the other, `requests` in all.
    pub fn clients(
        label: impl Into<String>,
        clients: usize,
        requests: usize,
        time_limit: Duration,
        bounds: Bounds,
    ) -> Self {
        Self {
            label: label.into(),
            arrival: Arrival::Clients { count: clients },
            requests,
            time_limit,
            bounds,
        }
    }
}

/// How one request ended, as the client saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallOutcome {
    /// Answers are counted and timed per class (`OK`, `DeadlineExceeded`, `504 Gateway Timeout`…).
    pub class: String,
    pub success: bool,
}

impl CallOutcome {
    pub fn success(class: impl Into<String>) -> Self {
        Self {
            class: class.into(),
            success: true,
        }
    }

    pub fn failure(class: impl Into<String>) -> Self {
        Self {
            class: class.into(),
            success: false,
        }
    }
}

/// Latency percentiles, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Latencies {
    pub count: u64,
    pub min: f64,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl Latencies {
    fn of(histogram: &Histogram<u64>) -> Option<Self> {
        let ms = |micros: u64| micros as f64 / 1e3;
        (!histogram.is_empty()).then(|| Self {
            count: histogram.len(),
            min: ms(histogram.min()),
            mean: histogram.mean() / 1e3,
            p50: ms(histogram.value_at_quantile(0.50)),
            p90: ms(histogram.value_at_quantile(0.90)),
            p99: ms(histogram.value_at_quantile(0.99)),
            p999: ms(histogram.value_at_quantile(0.999)),
            max: ms(histogram.max()),
        })
    }
}

/// The requests of one class.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Class {
    pub success: bool,
    pub count: usize,
    /// From due to answer; none for requests that were never sent.
    pub latency_ms: Option<Latencies>,
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measurement {
    pub plan: LoadPlan,
    /// Requests that fell due: sent, or dropped.
    pub due: usize,
    pub sent: usize,
    pub successes: usize,
    pub success_rate: f64,
    /// From the first request's due time to the last answer.
    pub elapsed_s: f64,
    /// Answers (of any class) per second over `elapsed_s`.
    pub answers_per_second: f64,
    pub successes_per_second: f64,
    /// Every answer, from the moment its request was due.
    pub latency_ms: Option<Latencies>,
    /// Every answer, from the moment its request was sent: what a server saw plus the network.
    pub service_ms: Option<Latencies>,
    /// From due to sent: the generator's own delay, to show that it kept its schedule.
    pub send_lag_ms: Option<Latencies>,
    pub classes: BTreeMap<String, Class>,
}

impl Measurement {
    /// Requests of `class`.
    pub fn count(&self, class: &str) -> usize {
        self.classes.get(class).map_or(0, |class| class.count)
    }

    /// Latency of the requests of `class`, if any was answered.
    pub fn latency(&self, class: &str) -> Option<Latencies> {
        self.classes.get(class).and_then(|class| class.latency_ms)
    }
}

fn histogram() -> Histogram<u64> {
    // 1 µs to 1 h at three significant digits; a longer wait is recorded as 1 h.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid bounds")
}

struct ClassRecord {
    success: bool,
    count: usize,
    latency: Histogram<u64>,
}

struct Recorder {
    latency: Histogram<u64>,
    service: Histogram<u64>,
    send_lag: Histogram<u64>,
    classes: BTreeMap<String, ClassRecord>,
}

impl Recorder {
    fn class(&mut self, outcome: CallOutcome) -> &mut ClassRecord {
        let record = self
            .classes
            .entry(outcome.class)
            .or_insert_with(|| ClassRecord {
                success: outcome.success,
                count: 0,
                latency: histogram(),
            });
        record.count += 1;
        record
    }
}

/// What the pacer, the requests and the progress line share.
struct Shared {
    started: Instant,
    due: AtomicUsize,
    sent: AtomicUsize,
    answered: AtomicUsize,
    in_flight: AtomicUsize,
    dropped: AtomicUsize,
    /// Since `started`, in nanoseconds.
    last_answer: AtomicU64,
    recorder: Mutex<Recorder>,
}

fn micros(duration: Duration) -> u64 {
    (duration.as_micros() as u64).max(1)
}

impl Shared {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            due: AtomicUsize::new(0),
            sent: AtomicUsize::new(0),
            answered: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            dropped: AtomicUsize::new(0),
            last_answer: AtomicU64::new(0),
            recorder: Mutex::new(Recorder {
                latency: histogram(),
                service: histogram(),
                send_lag: histogram(),
                classes: BTreeMap::new(),
            }),
        }
    }

    fn recorder(&self) -> std::sync::MutexGuard<'_, Recorder> {
        // Histograms hold plain counts; a panic elsewhere cannot leave them half-written.
        self.recorder
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes a place in flight for a request due now, or counts it dropped.
    fn admit(&self, max_in_flight: usize) -> bool {
        self.due.fetch_add(1, Ordering::Relaxed);
        let admitted = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max_in_flight).then_some(n + 1)
            })
            .is_ok();
        if admitted {
            self.sent.fetch_add(1, Ordering::Relaxed);
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            self.recorder().class(CallOutcome::failure(DROPPED));
        }
        admitted
    }

    /// Records the answer (or its absence) of a request due at `due` and sent at `sent`.
    fn finish(&self, due: Instant, sent: Instant, outcome: Option<CallOutcome>) {
        let now = Instant::now();
        match outcome {
            Some(outcome) => {
                let latency = micros(now - due);
                let mut recorder = self.recorder();
                recorder.latency.saturating_record(latency);
                recorder.service.saturating_record(micros(now - sent));
                recorder.send_lag.saturating_record(micros(sent - due));
                recorder.class(outcome).latency.saturating_record(latency);
                drop(recorder);
                self.answered.fetch_add(1, Ordering::Relaxed);
                self.last_answer
                    .fetch_max((now - self.started).as_nanos() as u64, Ordering::Relaxed);
            }
            None => {
                self.recorder().class(CallOutcome::failure(UNFINISHED));
            }
        }
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    fn measurement(&self, plan: &LoadPlan) -> Measurement {
        let recorder = self.recorder();
        let successes: usize = recorder
            .classes
            .values()
            .filter(|class| class.success)
            .map(|class| class.count)
            .sum();
        let due = self.due.load(Ordering::Relaxed);
        let elapsed = Duration::from_nanos(self.last_answer.load(Ordering::Relaxed)).as_secs_f64();
        let per_second = |count: usize| {
            if elapsed > 0.0 {
                count as f64 / elapsed
            } else {
                0.0
            }
        };
        Measurement {
            plan: plan.clone(),
            due,
            sent: self.sent.load(Ordering::Relaxed),
            successes,
            success_rate: if due > 0 {
                successes as f64 / due as f64
            } else {
                0.0
            },
            elapsed_s: elapsed,
            answers_per_second: per_second(self.answered.load(Ordering::Relaxed)),
            successes_per_second: per_second(successes),
            latency_ms: Latencies::of(&recorder.latency),
            service_ms: Latencies::of(&recorder.service),
            send_lag_ms: Latencies::of(&recorder.send_lag),
            classes: recorder
                .classes
                .iter()
                .map(|(name, class)| {
                    (
                        name.clone(),
                        Class {
                            success: class.success,
                            count: class.count,
                            latency_ms: Latencies::of(&class.latency),
                        },
                    )
                })
                .collect(),
        }
    }
}

/// Runs `plan`, calling `send` with each request's index (0, 1, …), and measures the answers.
pub async fn run<F, Fut>(plan: &LoadPlan, send: F) -> Measurement
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = CallOutcome> + Send + 'static,
{
    let shared = Arc::new(Shared::new());
    let send = Arc::new(send);
    // Cancelled when the run's time is up: requests still unanswered are abandoned.
    let give_up = CancellationToken::new();
    let progress = tokio::spawn(progress(plan.clone(), shared.clone()));
    match plan.arrival {
        Arrival::Rate { per_second } => {
            let pacer = {
                let (plan, shared, send, give_up) =
                    (plan.clone(), shared.clone(), send.clone(), give_up.clone());
                let runtime = tokio::runtime::Handle::current();
                tokio::task::spawn_blocking(move || {
                    for index in 0..plan.requests {
                        let due =
                            shared.started + Duration::from_secs_f64(index as f64 / per_second);
                        if due - shared.started >= plan.time_limit {
                            break;
                        }
                        if let Some(wait) = due.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                        if shared.admit(plan.bounds.max_in_flight) {
                            runtime.spawn(request(
                                shared.clone(),
                                send(index),
                                due,
                                give_up.clone(),
                            ));
                        }
                    }
                })
            };
            pacer.await.expect("the pacer does not panic");
            drain(&shared, plan.bounds.drain, &give_up).await;
        }
        Arrival::Clients { count } => {
            let next = Arc::new(AtomicUsize::new(0));
            let mut clients = JoinSet::new();
            for _ in 0..count {
                let (plan, shared, send, give_up, next) = (
                    plan.clone(),
                    shared.clone(),
                    send.clone(),
                    give_up.clone(),
                    next.clone(),
                );
                clients.spawn(async move {
                    loop {
                        let index = next.fetch_add(1, Ordering::Relaxed);
                        if index >= plan.requests
                            || shared.started.elapsed() >= plan.time_limit
                            || give_up.is_cancelled()
                        {
                            break;
                        }
                        if shared.admit(plan.bounds.max_in_flight) {
                            request(shared.clone(), send(index), Instant::now(), give_up.clone())
                                .await;
                        }
                    }
                });
            }
            let waiting = async { while clients.join_next().await.is_some() {} };
            if tokio::time::timeout(plan.time_limit + plan.bounds.drain, waiting)
                .await
                .is_err()
            {
                drain(&shared, Duration::ZERO, &give_up).await;
            }
        }
    }
    progress.abort();
    shared.measurement(plan)
}

/// One request: sent now, due at `due`, abandoned when `give_up` is cancelled.
async fn request(
    shared: Arc<Shared>,
    answer: impl Future<Output = CallOutcome>,
    due: Instant,
    give_up: CancellationToken,
) {
    let sent = Instant::now();
    let outcome = tokio::select! {
        outcome = answer => Some(outcome),
        () = give_up.cancelled() => None,
    };
    shared.finish(due, sent, outcome);
}

/// Waits up to `limit` for the requests in flight, then abandons the rest and waits for them to
/// be counted.
async fn drain(shared: &Shared, limit: Duration, give_up: &CancellationToken) {
    let until = Instant::now() + limit;
    while shared.in_flight.load(Ordering::Acquire) > 0 {
        if Instant::now() >= until && !give_up.is_cancelled() {
            give_up.cancel();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A line on stderr every second until aborted.
async fn progress(plan: LoadPlan, shared: Arc<Shared>) {
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.tick().await;
    loop {
        ticks.tick().await;
        eprintln!(
            "  [{}] {:>5.1} s: {}/{} due, {} answered, {} in flight, {} dropped",
            plan.label,
            shared.started.elapsed().as_secs_f64(),
            shared.due.load(Ordering::Relaxed),
            plan.requests,
            shared.answered.load(Ordering::Relaxed),
            shared.in_flight.load(Ordering::Relaxed),
            shared.dropped.load(Ordering::Relaxed),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOUNDS: Bounds = Bounds {
        max_in_flight: 1_000,
        drain: Duration::from_secs(5),
    };

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_due_while_the_limit_is_in_flight_are_dropped_not_delayed() {
        // One request in flight at most, 100 per second, each answered after 30 ms.
        let plan = LoadPlan {
            bounds: Bounds {
                max_in_flight: 1,
                ..BOUNDS
            },
            ..LoadPlan::count("limit", 20, 100.0, BOUNDS)
        };
        let measured = run(&plan, |_| async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            CallOutcome::success("OK")
        })
        .await;
        assert_eq!(measured.due, 20);
        assert_eq!(measured.sent + measured.count(DROPPED), 20);
        assert!(measured.count(DROPPED) > 0, "{measured:?}");
        assert!(
            measured.latency(DROPPED).is_none(),
            "a dropped request has no latency"
        );
        assert!(measured.success_rate < 1.0, "dropped requests are failures");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_generator_behind_its_schedule_still_counts_from_the_due_time() {
        // One request due every millisecond, but preparing each takes 20 ms: the tenth, due at
        // 9 ms, leaves after about 200 ms, and its latency says so.
        let plan = LoadPlan::count("behind", 10, 1_000.0, BOUNDS);
        let measured = run(&plan, |_| {
            std::thread::sleep(Duration::from_millis(20));
            async { CallOutcome::success("OK") }
        })
        .await;
        let (latency, service) = (measured.latency_ms.unwrap(), measured.service_ms.unwrap());
        assert!(latency.max >= 150.0, "{latency:?}");
        assert!(service.max < latency.max / 2.0, "{service:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_open_loop_keeps_its_schedule_and_times_each_class_apart() {
        let plan = LoadPlan::count("classes", 40, 400.0, BOUNDS);
        let measured = run(&plan, |index| async move {
            if index % 4 == 0 {
                CallOutcome::failure("Unavailable")
            } else {
                CallOutcome::success("OK")
            }
        })
        .await;
        assert_eq!(
            (
                measured.sent,
                measured.count("OK"),
                measured.count("Unavailable")
            ),
            (40, 30, 10)
        );
        assert_eq!(measured.successes, 30);
        assert!((measured.success_rate - 0.75).abs() < 1e-9);
        assert_eq!(measured.latency("OK").map(|l| l.count), Some(30));
        // Forty requests at 400 per second take about 0.1 s, not more.
        assert!(
            measured.elapsed_s >= 0.09 && measured.elapsed_s < 2.0,
            "{}",
            measured.elapsed_s
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn answers_that_never_come_are_abandoned_when_the_drain_time_is_up() {
        let bounds = Bounds {
            max_in_flight: 10,
            drain: Duration::from_millis(100),
        };
        let plan = LoadPlan::count("hang", 3, 100.0, bounds);
        let started = Instant::now();
        let measured = run(&plan, |_| std::future::pending()).await;
        assert_eq!(measured.count(UNFINISHED), 3);
        assert_eq!(measured.successes, 0);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clients_send_one_request_after_the_other() {
        let plan = LoadPlan::clients("clients", 4, 50, Duration::from_secs(5), BOUNDS);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (counting, highest) = (in_flight.clone(), most.clone());
        let measured = run(&plan, move |_| {
            let (counting, highest) = (counting.clone(), highest.clone());
            async move {
                highest.fetch_max(
                    counting.fetch_add(1, Ordering::SeqCst) + 1,
                    Ordering::SeqCst,
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
                counting.fetch_sub(1, Ordering::SeqCst);
                CallOutcome::success("OK")
            }
        })
        .await;
        assert_eq!(measured.successes, 50);
        assert!(most.load(Ordering::SeqCst) <= 4);
    }
}

//! A circuit breaker per downstream dependency.
//!
//! Why? A dependency that is down answers every call with a failure after spending our time (and
//! its own recovery capacity) on it. The breaker watches the last calls; when too many fail, or
//! are slow, it opens and answers at once, without calling, for `open_ms`. Then it half-opens: a
//! few probe calls go through; if they succeed it closes, if one fails it opens again.
//!
//! What it counts: UNAVAILABLE, internal errors and transport failures are failures; answers
//! slower than `slow_call_ms` are slow. RESOURCE_EXHAUSTED never counts (the neighbour is alive
//! and asks us to slow down), nor does a DEADLINE_EXCEEDED that a hop answered without calling
//! (our own short budget), nor a failure the dependency relayed from further down (marked with
//! [`wire::RELAYED`]), nor a call our caller abandoned.
//!
//! Why a DEADLINE_EXCEEDED counts only after an adequate slice: the client chooses the deadline,
//! and the breaker is shared by every client. One client sending 100 ms deadlines gives the bank
//! ~50 ms, and a breaker that blamed the bank for those expiries would open for everyone. So an
//! expiry is a failure only when the slice the call was given, as the deadline layer names it
//! ([`wire::DEADLINE_SLICE`]), was at least `min_judged_slice_ms`; after a shorter slice it is
//! ignored, or slow if the call still outlasted `slow_call_ms`. An expiry with no slice named
//! counts as a failure. The threshold is a setting of its own, not `slow_call_ms`: the breakers
//! above payment set that to 60 s so that the bank's slowness does not open them, yet a hung
//! payment must still open orders' breaker within a 2 s deadline.
//!
//! The window holds the last `window_calls` outcomes, and of those only the ones recorded within
//! `window_ms`: at low traffic, failures from long ago say nothing about the neighbour now.
//!
//! Why a short open time that does not grow: the probes are how the breaker learns that its
//! neighbour is back, and an open time that doubled with each failed probe (to a minute, say)
//! kept a recovered neighbour cut off for as long, after an outage of any length. A few probe
//! calls every `open_ms` (1 s) are no load for a neighbour that is down, and find it back within
//! about a second. Every open time is spread ±20 % at random, so that breakers that opened
//! together (one per replica, all facing the same outage) do not probe together.
//!
//! Each state change starts a new generation, and a call's outcome is recorded only in the
//! generation that admitted it: a call let through while closed that ends after the breaker
//! opened and closed again would otherwise be judged in a window it was never part of, and a
//! probe of an earlier half-open would free a place, or count a success, in the current one.
//!
//! An open breaker answers UNAVAILABLE marked with [`wire::CIRCUIT_OPEN`] and the time until it
//! half-opens (rounded up to the millisecond) as `grpc-retry-pushback-ms`, so the edge neither
//! retries through it nor hides when trying again makes sense. No tower breaker exists upstream,
//! so this one is written here.

mod error;
mod layer;
mod state;
mod verdict;

pub use error::CircuitOpen;
pub use layer::BreakerLayer;
pub use state::{Outcome, Position};
pub use verdict::Verdict;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use verdict::Thresholds;

use crate::guarded::Guarded;
use http::{Request, Response};
use serde::{Deserialize, Serialize};
use state::{Admission, Machine, Transition};
use telemetry::{
    attr,
    metrics::{self, Counter, Gauge, KeyValue},
};
use tokio::time::Instant;
use tonic::Status;
use tower::{Service, util::rng::HasherRng};

/// Thresholds of one breaker.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerSettings {
    pub enabled: bool,
    /// The sliding window holds the outcomes of the last this many calls...
    pub window_calls: u32,
    /// ...recorded in the last this many milliseconds (30 s): older outcomes leave it.
    pub window_ms: u64,
    /// No verdict before this many calls are in the window.
    pub min_calls: u32,
    /// Share of failures in the window that opens the breaker.
    pub failure_rate: f64,
    /// A call answered later than this is slow.
    pub slow_call_ms: u64,
    /// A DEADLINE_EXCEEDED is a failure only when the call was given at least this long (500 ms:
    /// many times what a healthy dependency needs here, so that a hung one still counts for
    /// clients whose deadlines are about 1 s);
    /// after a shorter slice, which the client chose, it is ignored, or slow if it outlasted
    /// `slow_call_ms`. Apart from `slow_call_ms`, which may be set far beyond any deadline.
    pub min_judged_slice_ms: u64,
    /// Share of slow calls in the window that opens the breaker.
    pub slow_call_rate: f64,
    /// How long the breaker stays open before it lets probes through (1 s), spread ±20 % at
    /// random; the same after a failed probe, so that a dependency that is back is found within
    /// one open time, whatever the outage lasted.
    pub open_ms: u64,
    /// Probe calls let through when half-open; all must succeed to close.
    pub half_open_probes: u32,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            window_calls: 20,
            window_ms: 30_000,
            min_calls: 10,
            failure_rate: 0.5,
            slow_call_ms: 1_000,
            min_judged_slice_ms: 500,
            slow_call_rate: 0.8,
            open_ms: 1_000,
            half_open_probes: 3,
        }
    }
}

/// Counters of one breaker, kept for reports and counted in the chain's metrics as well.
#[derive(Debug)]
struct Counters {
    rejected: AtomicU64,
    judged_against: AtomicU64,
    opened: AtomicU64,
    half_opened: AtomicU64,
    closed: AtomicU64,
    rejections: Counter<u64>,
    transitions: Counter<u64>,
    position: Gauge<u64>,
    /// The calling hop and the dependency, labelling every series of this breaker.
    labels: [KeyValue; 2],
}

impl Counters {
    fn new(hop: &'static str, dependency: &'static str) -> Self {
        let labels = [
            KeyValue::new(attr::HOP, hop),
            KeyValue::new(attr::PEER, dependency),
        ];
        let position = metrics::meter()
            .u64_gauge(metrics::name::BREAKER_STATE)
            .with_description("Breaker position: 0 closed, 1 half-open, 2 open")
            .build();
        position.record(Position::Closed.gauge_value(), &labels);
        Self {
            rejected: AtomicU64::new(0),
            judged_against: AtomicU64::new(0),
            opened: AtomicU64::new(0),
            half_opened: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            rejections: metrics::counter(
                metrics::name::BREAKER_REJECTIONS,
                "Calls an open breaker answered without calling",
            ),
            transitions: metrics::counter(
                metrics::name::BREAKER_TRANSITIONS,
                "Breaker state changes",
            ),
            position,
            labels,
        }
    }
}

/// A copy of a breaker's state and counters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BreakerStats {
    /// A disabled breaker admits every call and records nothing.
    pub enabled: bool,
    pub position: Position,
    /// While closed: the outcomes in the window, and the shares of failures and of slow calls
    /// (it opens at `failure_rate` or `slow_call_rate` once `min_calls` are in).
    pub calls_in_window: u32,
    pub failure_rate: f64,
    pub slow_call_rate: f64,
    /// While open: how long until probes go through (it closes when they succeed).
    pub probes_in_ms: Option<u64>,
    /// Calls answered at once because the breaker was open (or its probes were out).
    pub rejected: u64,
    /// Calls judged against the dependency: failed, or answered too slowly.
    pub judged_against: u64,
    pub opened: u64,
    pub half_opened: u64,
    pub closed: u64,
}

/// The state shared by every clone of one dependency's breaker service.
#[derive(Debug)]
pub struct Breaker {
    dependency: &'static str,
    enabled: bool,
    thresholds: Thresholds,
    machine: Mutex<Machine<HasherRng>>,
    counters: Counters,
}

impl Breaker {
    /// The breaker of `hop`'s calls to `dependency`.
    pub fn new(
        hop: &'static str,
        dependency: &'static str,
        settings: BreakerSettings,
    ) -> Arc<Self> {
        // Settings that could never open, or never close, are brought into range: at least one
        // call in the window, no more needed than the window holds, at least one probe.
        let window_calls = settings.window_calls.max(1);
        let settings = BreakerSettings {
            window_calls,
            min_calls: settings.min_calls.clamp(1, window_calls),
            half_open_probes: settings.half_open_probes.max(1),
            ..settings
        };
        Arc::new(Self {
            dependency,
            enabled: settings.enabled,
            thresholds: Thresholds {
                slow_call: Duration::from_millis(settings.slow_call_ms),
                min_judged_slice: Duration::from_millis(settings.min_judged_slice_ms),
            },
            // Seeded anew for each breaker, so that the replicas' breakers draw apart.
            machine: Mutex::new(Machine::new(settings, HasherRng::default())),
            counters: Counters::new(hop, dependency),
        })
    }

    pub fn stats(&self) -> BreakerStats {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let machine = self.lock();
        let standing = machine.standing(Instant::now());
        BreakerStats {
            enabled: self.enabled,
            position: machine.position(),
            calls_in_window: standing.calls,
            failure_rate: standing.failure_rate,
            slow_call_rate: standing.slow_call_rate,
            probes_in_ms: standing
                .probes_in
                .map(|left| left.as_millis().try_into().unwrap_or(u64::MAX)),
            rejected: read(&self.counters.rejected),
            judged_against: read(&self.counters.judged_against),
            opened: read(&self.counters.opened),
            half_opened: read(&self.counters.half_opened),
            closed: read(&self.counters.closed),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Machine<HasherRng>> {
        // The machine holds plain values; a panic elsewhere cannot leave it half-written.
        self.machine
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Admits a call (`None`: the breaker is disabled and records nothing), or refuses it.
    fn admit(&self) -> Result<Option<Admission>, CircuitOpen> {
        if !self.enabled {
            return Ok(None);
        }
        let mut machine = self.lock();
        let (admission, transition) = machine.admit(Instant::now());
        // Noted under the lock, so that the state gauge gets the changes in the order they happened.
        self.note(transition);
        drop(machine);
        admission.map(Some).map_err(|retry_in| {
            self.counters.rejected.fetch_add(1, Ordering::Relaxed);
            self.counters.rejections.add(1, &self.counters.labels);
            let open = CircuitOpen {
                dependency: self.dependency.into(),
                retry_in,
            };
            tracing::debug!(
                peer = self.dependency,
                breaker.state = "open",
                breaker.retry_in_ms = open.retry_in_ms() as i64,
                "circuit breaker answered without calling"
            );
            open
        })
    }

    fn record(&self, admission: Admission, outcome: Outcome) {
        if matches!(outcome, Outcome::Failure | Outcome::Slow) {
            self.counters.judged_against.fetch_add(1, Ordering::Relaxed);
        }
        let mut machine = self.lock();
        let transition = machine.record(admission, outcome, Instant::now());
        self.note(transition);
    }

    fn note(&self, transition: Option<Transition>) {
        let Some(Transition { from, to }) = transition else {
            return;
        };
        let counter = match to {
            Position::Open => &self.counters.opened,
            Position::HalfOpen => &self.counters.half_opened,
            Position::Closed => &self.counters.closed,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let [hop, dependency] = self.counters.labels.clone();
        self.counters
            .transitions
            .add(1, &[hop, dependency, KeyValue::new("to", to.as_str())]);
        self.counters
            .position
            .record(to.gauge_value(), &self.counters.labels);
        tracing::info!(peer = self.dependency, breaker.from = ?from, breaker.to = ?to, "circuit breaker changed state");
    }
}

/// Guards calls to one dependency with its [`Breaker`].
#[derive(Debug, Clone)]
pub struct BreakerService<S> {
    inner: S,
    breaker: Arc<Breaker>,
}

impl<S> BreakerService<S> {
    pub fn new(inner: S, breaker: Arc<Breaker>) -> Self {
        Self { inner, breaker }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for BreakerService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    /// Holds no verdict where the breaker is disabled: the call is made and not recorded.
    type Future = Guarded<S::Future, ResBody, Option<Verdict>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        match self.breaker.admit() {
            Ok(Some(admission)) => Guarded::admitted(
                self.inner.call(request),
                Some(Verdict::new(self.breaker.clone(), admission)),
            ),
            Ok(None) => Guarded::admitted(self.inner.call(request), None),
            Err(open) => Guarded::refused(Status::from(open).into_http()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use tower::{BoxError, service_fn};

    #[tokio::test]
    async fn an_open_breaker_answers_without_calling_and_without_waiting() {
        let calls = Arc::new(AtomicU64::new(0));
        let counted = calls.clone();
        let failing = service_fn(move |_: Request<String>| {
            counted.fetch_add(1, Ordering::Relaxed);
            async { Ok::<_, BoxError>(Status::unavailable("down").into_http::<String>()) }
        });
        let settings = BreakerSettings {
            min_calls: 2,
            window_calls: 2,
            ..BreakerSettings::default()
        };
        let mut service =
            BreakerService::new(failing, Breaker::new("payment", "bank-mock", settings));
        for _ in 0..2 {
            service.call(Request::new(String::new())).await.unwrap();
        }
        let mut answer = std::pin::pin!(service.call(Request::new(String::new())));
        let waker = std::task::Waker::noop();
        let Poll::Ready(Ok(response)) = answer.as_mut().poll(&mut Context::from_waker(waker))
        else {
            panic!("an open breaker answers on the first poll");
        };
        assert_eq!(response.headers()["grpc-status"], "14");
        assert_eq!(response.headers()[wire::CIRCUIT_OPEN], "bank-mock");
        assert!(response.headers().contains_key(wire::RETRY_PUSHBACK_MS));
        assert_eq!(
            calls.load(Ordering::Relaxed),
            2,
            "the inner service was not called"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_the_pushback_of_an_open_breaker_finds_it_probing() {
        let calls = Arc::new(AtomicU64::new(0));
        let counted = calls.clone();
        let failing = service_fn(move |_: Request<String>| {
            counted.fetch_add(1, Ordering::Relaxed);
            async { Ok::<_, BoxError>(Status::unavailable("down").into_http::<String>()) }
        });
        let settings = BreakerSettings {
            min_calls: 1,
            window_calls: 1,
            ..BreakerSettings::default()
        };
        let mut service =
            BreakerService::new(failing, Breaker::new("payment", "bank-mock", settings));
        service.call(Request::new(String::new())).await.unwrap();
        let refused = service.call(Request::new(String::new())).await.unwrap();
        let pushback: u64 = refused.headers()[wire::RETRY_PUSHBACK_MS]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            (800..=1_200).contains(&pushback),
            "open_ms 1000 ± 20 %: {pushback}"
        );

        // A millisecond short of the pushback it is still open (the wait was rounded up, not down)...
        tokio::time::advance(Duration::from_millis(pushback - 1)).await;
        let early = service.call(Request::new(String::new())).await.unwrap();
        assert!(early.headers().contains_key(wire::CIRCUIT_OPEN));
        assert_eq!(early.headers()[wire::RETRY_PUSHBACK_MS], "1");
        // ...and once it has passed, the next call is a probe.
        tokio::time::advance(Duration::from_millis(1)).await;
        service.call(Request::new(String::new())).await.unwrap();
        assert_eq!(
            calls.load(Ordering::Relaxed),
            2,
            "the probe reached the dependency"
        );
    }
}

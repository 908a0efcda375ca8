//! A bulkhead per recipient: at most `limit` calls in flight to one dependency.
//!
//! Why reject instead of queueing? A call that waits behind slow ones holds its caller's time and
//! memory while its deadline runs out; under a slow dependency the queue grows until everything
//! behind it is slow too. Rejecting the call above the limit at once keeps the capacity of the
//! rest of the service (other dependencies, reads) untouched and tells the caller immediately.
//! tower's `ConcurrencyLimit` waits instead, so the count is kept here.
//!
//! The limit is fixed (`max_concurrent`) or, in the [`adaptive`] mode, follows the dependency's
//! latency against its no-load latency between a floor and that fixed limit.

pub mod adaptive;
mod layer;

pub use adaptive::AdaptiveSettings;
pub use layer::BulkheadLayer;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU32, AtomicU64, Ordering},
    },
    task::{Context, Poll},
};

use http::{Request, Response};
use telemetry::{
    attr,
    metrics::{self, Counter, KeyValue},
};
use tokio::time::Instant;
use tonic::{Code, Status, metadata::MetadataValue};
use tower::Service;

use adaptive::{Sample, Vegas};

use crate::guarded::{Guarded, Held};

/// The limit was reached: the call was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{dependency}: {limit} calls already in flight (bulkhead full); not calling")]
pub struct BulkheadFull {
    pub dependency: &'static str,
    pub limit: u32,
}

impl From<BulkheadFull> for Status {
    fn from(full: BulkheadFull) -> Self {
        let mut status = Status::unavailable(full.to_string());
        status.metadata_mut().insert(
            wire::BULKHEAD_FULL,
            MetadataValue::from_static(full.dependency),
        );
        status.metadata_mut().insert(
            wire::NOT_EXECUTED,
            MetadataValue::from_static(full.dependency),
        );
        status
    }
}

/// The calls in flight to one dependency and their limit, shared by every clone of its service.
#[derive(Debug)]
pub struct Bulkhead {
    dependency: &'static str,
    in_flight: AtomicU32,
    limit: AtomicU32,
    /// The configured limit: the fixed limit, or the adaptive limit's ceiling.
    max_concurrent: u32,
    /// The adaptive mode's state; `None` keeps the limit fixed.
    adaptive: Option<Mutex<Vegas>>,
    rejected: AtomicU64,
    rejections: Counter<u64>,
    /// The calling hop and the dependency, labelling the rejections.
    labels: [KeyValue; 2],
}

/// A copy of a bulkhead's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BulkheadStats {
    /// Whether the limit follows the dependency's latency.
    pub adaptive: bool,
    /// The limit in force (the adaptive limit's latest value).
    pub limit: u32,
    /// The configured limit: the fixed one, or the adaptive limit's ceiling.
    pub max_concurrent: u32,
    pub in_flight: u32,
    pub rejected: u64,
}

impl Bulkhead {
    /// The bulkhead of `hop`'s calls to `dependency`, `limit` calls at most: fixed, or adapting
    /// below it when `adaptive` is enabled.
    pub fn new(
        hop: &'static str,
        dependency: &'static str,
        limit: u32,
        adaptive: AdaptiveSettings,
    ) -> Arc<Self> {
        let limit = limit.max(1);
        Arc::new(Self {
            dependency,
            in_flight: AtomicU32::new(0),
            limit: AtomicU32::new(limit),
            max_concurrent: limit,
            adaptive: adaptive
                .enabled
                .then(|| Mutex::new(Vegas::new(adaptive, limit))),
            rejected: AtomicU64::new(0),
            rejections: metrics::counter(
                metrics::name::BULKHEAD_REJECTIONS,
                "Calls a full bulkhead refused",
            ),
            labels: [
                KeyValue::new(attr::HOP, hop),
                KeyValue::new(attr::PEER, dependency),
            ],
        })
    }

    pub fn stats(&self) -> BulkheadStats {
        BulkheadStats {
            adaptive: self.adaptive.is_some(),
            limit: self.limit.load(Ordering::Relaxed),
            max_concurrent: self.max_concurrent,
            in_flight: self.in_flight.load(Ordering::Relaxed),
            rejected: self.rejected.load(Ordering::Relaxed),
        }
    }

    /// A place for one call, if one is free: the count of calls in flight, after this one.
    fn try_admit(&self) -> Option<u32> {
        let limit = self.limit.load(Ordering::Relaxed);
        self.in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|n| n + 1)
    }

    /// Teaches the adaptive limit, if there is one, what `response` tells of the dependency.
    fn learn<B>(&self, response: &Response<B>, place: &Place) {
        if let Some(adaptive) = &self.adaptive
            && let Some(sample) = sample_of(response, place)
        {
            // The state holds numbers only; a panic elsewhere cannot leave it inconsistent.
            let limit = adaptive
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .on_sample(Instant::now(), sample);
            self.limit.store(limit, Ordering::Relaxed);
        }
    }
}

/// One call's place in the bulkhead, given back when the call ends.
#[derive(Debug)]
pub struct Place {
    bulkhead: Arc<Bulkhead>,
    admitted_at: Instant,
    in_flight: u32,
}

impl<B> Held<B> for Place {
    fn answered<E>(self, answer: &mut Result<Response<B>, E>) {
        if let Ok(response) = answer {
            self.bulkhead.learn(response, &self);
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.bulkhead.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Limits calls to one dependency with its [`Bulkhead`].
#[derive(Debug, Clone)]
pub struct BulkheadService<S> {
    inner: S,
    bulkhead: Arc<Bulkhead>,
}

impl<S> BulkheadService<S> {
    pub fn new(inner: S, bulkhead: Arc<Bulkhead>) -> Self {
        Self { inner, bulkhead }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for BulkheadService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Guarded<S::Future, ResBody, Place>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        match self.bulkhead.try_admit() {
            Some(in_flight) => {
                let place = Place {
                    bulkhead: self.bulkhead.clone(),
                    admitted_at: Instant::now(),
                    in_flight,
                };
                Guarded::admitted(self.inner.call(request), place)
            }
            None => {
                self.bulkhead.rejected.fetch_add(1, Ordering::Relaxed);
                self.bulkhead.rejections.add(1, &self.bulkhead.labels);
                let full = BulkheadFull {
                    dependency: self.bulkhead.dependency,
                    limit: self.bulkhead.limit.load(Ordering::Relaxed),
                };
                tracing::debug!(
                    peer = full.dependency,
                    bulkhead.limit = i64::from(full.limit),
                    "bulkhead rejected a call"
                );
                Guarded::refused(Status::from(full).into_http())
            }
        }
    }
}

/// What an answer tells the adaptive limit, if anything: nothing when the call was never made
/// (a guard below answered it), a drop when it ran out of time or was refused for load.
fn sample_of<B>(response: &Response<B>, place: &Place) -> Option<Sample> {
    if response.headers().contains_key(wire::NOT_EXECUTED) {
        return None;
    }
    let code = response
        .headers()
        .get("grpc-status")
        .and_then(|code| code.to_str().ok()?.parse::<i32>().ok())
        .map(Code::from_i32);
    let dropped = matches!(code, Some(Code::DeadlineExceeded | Code::ResourceExhausted));
    Some(Sample {
        rtt: place.admitted_at.elapsed(),
        in_flight: place.in_flight,
        dropped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{BoxError, ServiceExt, service_fn};

    #[tokio::test]
    async fn calls_above_the_limit_are_rejected_at_once_and_counted() {
        let (release, released) = tokio::sync::watch::channel(false);
        let slow = service_fn(move |_: Request<String>| {
            let mut released = released.clone();
            async move {
                released.wait_for(|done| *done).await.expect("sender alive");
                Ok::<_, BoxError>(Response::new("done".to_owned()))
            }
        });
        let bulkhead = Bulkhead::new("payment", "bank-mock", 2, AdaptiveSettings::default());
        let service = BulkheadService::new(slow, bulkhead.clone());
        // Two calls that take both permits and wait: polled once, so that they are in flight.
        let mut first = Box::pin(service.clone().oneshot(Request::new(String::new())));
        let mut second = Box::pin(service.clone().oneshot(Request::new(String::new())));
        for call in [&mut first, &mut second] {
            assert!(futures::FutureExt::now_or_never(call.as_mut()).is_none());
        }
        assert_eq!(bulkhead.stats().in_flight, 2);

        // The third is answered on its first poll: rejected, never queued.
        let rejected =
            futures::FutureExt::now_or_never(service.clone().oneshot(Request::new(String::new())))
                .expect("rejected at once")
                .unwrap();
        assert_eq!(rejected.headers()["grpc-status"], "14");
        assert_eq!(rejected.headers()[wire::BULKHEAD_FULL], "bank-mock");
        assert_eq!(
            bulkhead.stats(),
            BulkheadStats {
                adaptive: false,
                limit: 2,
                max_concurrent: 2,
                in_flight: 2,
                rejected: 1
            }
        );

        release.send(true).unwrap();
        let (first, second) = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            futures::future::join(first, second),
        )
        .await
        .expect("released calls end");
        first.unwrap();
        second.unwrap();
        assert_eq!(
            bulkhead.stats().in_flight,
            0,
            "permits return when calls end"
        );
    }

    /// Sends waves of `limit`-many concurrent calls to a dependency answering after `latency`;
    /// returns the limit after `waves` waves.
    async fn waves(
        service: &BulkheadService<
            impl Service<Request<String>, Response = Response<String>, Error = BoxError> + Clone,
        >,
        bulkhead: &Bulkhead,
        waves: usize,
    ) -> u32 {
        for _ in 0..waves {
            let calls = (0..bulkhead.stats().limit)
                .map(|_| service.clone().oneshot(Request::new(String::new())));
            for answer in futures::future::join_all(calls).await {
                answer.unwrap();
            }
        }
        bulkhead.stats().limit
    }

    #[tokio::test(start_paused = true)]
    async fn the_adaptive_limit_shrinks_under_a_slow_dependency_and_recovers_with_it() {
        let latency_ms = Arc::new(AtomicU64::new(20));
        let dependency = {
            let latency_ms = latency_ms.clone();
            service_fn(move |_: Request<String>| {
                let latency = std::time::Duration::from_millis(latency_ms.load(Ordering::Relaxed));
                async move {
                    tokio::time::sleep(latency).await;
                    Ok::<_, BoxError>(Response::new("done".to_owned()))
                }
            })
        };
        let adaptive = AdaptiveSettings {
            enabled: true,
            min_limit: 2,
            remeasure_ms: 60_000,
        };
        let bulkhead = Bulkhead::new("payment", "bank-mock", 20, adaptive);
        let service = BulkheadService::new(dependency, bulkhead.clone());

        assert_eq!(
            waves(&service, &bulkhead, 5).await,
            20,
            "at its usual latency the dependency keeps the whole limit"
        );
        latency_ms.store(600, Ordering::Relaxed);
        let shrunk = waves(&service, &bulkhead, 10).await;
        assert!(shrunk <= 6, "the limit shrank to {shrunk}");

        // Calls beyond the shrunk limit are refused at once, as by the fixed one.
        let mut held: Vec<_> = (0..shrunk)
            .map(|_| Box::pin(service.clone().oneshot(Request::new(String::new()))))
            .collect();
        for call in &mut held {
            assert!(futures::FutureExt::now_or_never(call.as_mut()).is_none());
        }
        let refused =
            futures::FutureExt::now_or_never(service.clone().oneshot(Request::new(String::new())))
                .expect("at once")
                .unwrap();
        assert_eq!(refused.headers()[wire::BULKHEAD_FULL], "bank-mock");
        futures::future::join_all(held).await;

        latency_ms.store(20, Ordering::Relaxed);
        assert_eq!(
            waves(&service, &bulkhead, 10).await,
            20,
            "recovered with the dependency"
        );
    }
}

//! Rate limits with governor's GCRA: a quota per client at the edge (see the gateway), and a
//! caller's own limit toward a dependency whose quota it knows ([`SelfLimitLayer`]).
//!
//! Why limit ourselves? A dependency with a quota answers the excess with RESOURCE_EXHAUSTED after
//! a round trip; refusing the excess locally costs nothing and keeps us under the quota, so our
//! callers see a clear local refusal instead of the dependency's.

use std::{
    num::NonZeroU32,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use governor::{
    RateLimiter,
    clock::{Clock, DefaultClock},
    middleware::StateInformationMiddleware,
    state::{InMemoryState, NotKeyed},
};
use http::{Request, Response};
use serde::{Deserialize, Serialize};
use telemetry::{
    attr,
    metrics::{self, Counter, KeyValue},
};
use tonic::{Status, metadata::MetadataValue};
use tower::{Layer, Service};

use crate::guarded::Guarded;

/// A quota: a sustained rate and the burst allowed above it (a rate of 0: no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuotaSettings {
    pub per_second: u32,
    pub burst: u32,
}

impl QuotaSettings {
    /// One of `holders`' equal shares of this quota, for each of several processes that enforce
    /// it apart (replicas behind one load balancer): rate and burst divided, rounded up so that no
    /// share is zero. Together the shares allow at most `holders − 1` more per second and per
    /// burst than the quota, and exactly the quota when it divides evenly.
    pub fn share(self, holders: u32) -> Self {
        let holders = holders.max(1);
        Self {
            per_second: self.per_second.div_ceil(holders),
            burst: self.burst.div_ceil(holders),
        }
    }

    /// The time a full burst takes to replenish: the window of the quota, in whole seconds.
    pub fn window_secs(&self) -> u64 {
        u64::from(self.burst.max(1)).div_ceil(u64::from(self.per_second.max(1)))
    }
}

/// What the limiter decided for one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allowed { remaining: u32 },
    Limited { retry_after: Duration },
}

/// One quota's limiter, on the system's clock (or, in tests, one they move by hand).
#[derive(Debug)]
pub struct Limiter<C: Clock = DefaultClock> {
    quota: QuotaSettings,
    limiter: RateLimiter<NotKeyed, InMemoryState, C, StateInformationMiddleware>,
    clock: C,
}

impl Limiter {
    pub fn new(quota: QuotaSettings) -> Self {
        Self::with_clock(quota, DefaultClock::default())
    }
}

impl<C: Clock + Clone> Limiter<C> {
    pub fn with_clock(quota: QuotaSettings, clock: C) -> Self {
        let one = NonZeroU32::MIN;
        let per_second = NonZeroU32::new(quota.per_second).unwrap_or(one);
        let burst = NonZeroU32::new(quota.burst).unwrap_or(one);
        let limiter = RateLimiter::direct_with_clock(
            governor::Quota::per_second(per_second).allow_burst(burst),
            clock.clone(),
        )
        .with_middleware::<StateInformationMiddleware>();
        Self {
            quota,
            limiter,
            clock,
        }
    }

    pub fn quota(&self) -> QuotaSettings {
        self.quota
    }

    pub fn check(&self) -> Decision {
        match self.limiter.check() {
            Ok(state) => Decision::Allowed {
                remaining: state.remaining_burst_capacity(),
            },
            Err(not_until) => Decision::Limited {
                retry_after: not_until.wait_time_from(self.clock.now()),
            },
        }
    }
}

/// The caller's own quota toward a dependency was used up: the call was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{dependency}: our own quota of {per_second} calls/s toward it is used up; not calling (next in {} ms)", crate::retry::wait_millis(*retry_after))]
pub struct OverOwnQuota {
    pub dependency: &'static str,
    pub per_second: u32,
    pub retry_after: Duration,
}

impl From<OverOwnQuota> for Status {
    fn from(over: OverOwnQuota) -> Self {
        let wait_ms = crate::retry::wait_millis(over.retry_after).max(1);
        let mut status = Status::resource_exhausted(over.to_string());
        status
            .metadata_mut()
            .insert(wire::RETRY_PUSHBACK_MS, MetadataValue::from(wait_ms));
        status.metadata_mut().insert(
            wire::NOT_EXECUTED,
            MetadataValue::from_static(over.dependency),
        );
        status
    }
}

/// Refuses calls above a dependency's known quota locally, with a pushback.
#[derive(Debug, Clone)]
pub struct SelfLimit<S> {
    inner: S,
    /// `None`: no quota, calls unlimited.
    quota: Option<Arc<OwnQuota>>,
}

/// A dependency's quota as one caller keeps it, shared by every clone of its service.
#[derive(Debug)]
struct OwnQuota {
    dependency: &'static str,
    limiter: Limiter,
    rejections: Counter<u64>,
    labels: [KeyValue; 3],
}

/// Applies [`SelfLimit`]; a quota with a rate of 0 leaves calls unlimited.
#[derive(Debug, Clone)]
pub struct SelfLimitLayer {
    quota: Option<Arc<OwnQuota>>,
}

impl SelfLimitLayer {
    /// Keeps `hop`'s calls to `dependency` within `quota`.
    pub fn new(hop: &'static str, dependency: &'static str, quota: QuotaSettings) -> Self {
        let quota = (quota.per_second > 0).then(|| {
            Arc::new(OwnQuota {
                dependency,
                limiter: Limiter::new(quota),
                rejections: rejections_counter(),
                labels: [
                    KeyValue::new("scope", "dependency"),
                    KeyValue::new(attr::HOP, hop),
                    KeyValue::new("name", dependency),
                ],
            })
        });
        Self { quota }
    }
}

/// The counter of every quota refusal, at the edge and toward dependencies.
pub fn rejections_counter() -> Counter<u64> {
    metrics::counter(
        metrics::name::RATE_LIMIT_REJECTIONS,
        "Requests refused for a quota",
    )
}

impl<S> Layer<S> for SelfLimitLayer {
    type Service = SelfLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        SelfLimit {
            inner,
            quota: self.quota.clone(),
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for SelfLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Guarded<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        if let Some(quota) = &self.quota
            && let Decision::Limited { retry_after } = quota.limiter.check()
        {
            let over = OverOwnQuota {
                dependency: quota.dependency,
                per_second: quota.limiter.quota().per_second,
                retry_after,
            };
            quota.rejections.add(1, &quota.labels);
            return Guarded::refused(Status::from(over).into_http());
        }
        Guarded::admitted(self.inner.call(request), ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_allowed_then_the_excess_waits_for_the_rate() {
        let limiter = Limiter::new(QuotaSettings {
            per_second: 10,
            burst: 3,
        });
        assert_eq!(limiter.check(), Decision::Allowed { remaining: 2 });
        assert_eq!(limiter.check(), Decision::Allowed { remaining: 1 });
        assert_eq!(limiter.check(), Decision::Allowed { remaining: 0 });
        let Decision::Limited { retry_after } = limiter.check() else {
            panic!("over the burst")
        };
        assert!(
            retry_after <= Duration::from_millis(100),
            "one request every 100 ms: {retry_after:?}"
        );
    }

    #[test]
    fn tokens_come_back_at_the_rate_and_never_beyond_the_burst() {
        let clock = governor::clock::FakeRelativeClock::default();
        let limiter = Limiter::with_clock(
            QuotaSettings {
                per_second: 10,
                burst: 3,
            },
            clock.clone(),
        );
        for remaining in [2, 1, 0] {
            assert_eq!(limiter.check(), Decision::Allowed { remaining });
        }
        assert_eq!(
            limiter.check(),
            Decision::Limited {
                retry_after: Duration::from_millis(100)
            },
            "one token every 100 ms"
        );
        clock.advance(Duration::from_millis(60));
        assert_eq!(
            limiter.check(),
            Decision::Limited {
                retry_after: Duration::from_millis(40)
            },
            "the rest of the wait"
        );
        clock.advance(Duration::from_millis(40));
        assert_eq!(
            limiter.check(),
            Decision::Allowed { remaining: 0 },
            "one token back, and spent"
        );
        clock.advance(Duration::from_secs(60));
        for remaining in [2, 1, 0] {
            assert_eq!(
                limiter.check(),
                Decision::Allowed { remaining },
                "a long pause gives back the burst, no more"
            );
        }
        assert!(matches!(limiter.check(), Decision::Limited { .. }));
    }

    /// Two replicas, each with half the quota, behind a load balancer that alternates between
    /// them: over ten seconds of a client sending as fast as it can, together they admit the
    /// quota's burst and rate, not twice them.
    #[test]
    fn replicas_that_each_keep_a_share_hold_a_client_to_the_whole_quota() {
        let quota = QuotaSettings {
            per_second: 100,
            burst: 50,
        };
        let clock = governor::clock::FakeRelativeClock::default();
        let replicas: Vec<Limiter<_>> = (0..2)
            .map(|_| Limiter::with_clock(quota.share(2), clock.clone()))
            .collect();
        let mut admitted = 0;
        for tick in 0..10_000 {
            // A request every millisecond, to each replica in turn.
            if matches!(replicas[tick % 2].check(), Decision::Allowed { .. }) {
                admitted += 1;
            }
            clock.advance(Duration::from_millis(1));
        }
        let allowed = quota.burst + 10 * quota.per_second;
        assert!(
            admitted <= allowed && admitted >= allowed - 2,
            "{admitted} admitted; the quota allows {allowed}"
        );
    }

    #[test]
    fn shares_round_up_and_are_never_zero() {
        let quota = QuotaSettings {
            per_second: 5,
            burst: 10,
        };
        assert_eq!(quota.share(1), quota);
        assert_eq!(
            quota.share(2),
            QuotaSettings {
                per_second: 3,
                burst: 5
            }
        );
        assert_eq!(quota.share(0), quota, "no replica is taken as one");
        assert_eq!(
            QuotaSettings {
                per_second: 1,
                burst: 1
            }
            .share(3),
            QuotaSettings {
                per_second: 1,
                burst: 1
            }
        );
    }

    #[test]
    fn the_window_is_the_time_a_burst_takes_to_return() {
        assert_eq!(
            QuotaSettings {
                per_second: 10,
                burst: 20
            }
            .window_secs(),
            2
        );
        assert_eq!(
            QuotaSettings {
                per_second: 100,
                burst: 1
            }
            .window_secs(),
            1
        );
    }
}

use std::{sync::Arc, time::Duration};

use deadline::Slice;
use http::Response;
use tokio::time::Instant;
use tonic::Code;

use super::{Breaker, Outcome, state::Admission};
use crate::guarded::Held;

/// What an admitted call holds to record its outcome, once: from its answer, or as ignored when
/// it is abandoned before one (nothing was learned about the dependency).
pub struct Verdict {
    breaker: Arc<Breaker>,
    /// `None` once recorded.
    admission: Option<Admission>,
    started: Instant,
}

impl Verdict {
    pub(super) fn new(breaker: Arc<Breaker>, admission: Admission) -> Self {
        Self {
            breaker,
            admission: Some(admission),
            started: Instant::now(),
        }
    }
}

impl<B> Held<B> for Verdict {
    fn answered<E>(mut self, answer: &mut Result<Response<B>, E>) {
        if let Some(admission) = self.admission.take() {
            let outcome = self
                .breaker
                .thresholds
                .outcome(answer, self.started.elapsed());
            self.breaker.record(admission, outcome);
        }
    }
}

impl Drop for Verdict {
    fn drop(&mut self) {
        if let Some(admission) = self.admission.take() {
            self.breaker.record(admission, Outcome::Ignored);
        }
    }
}

/// What an answer's outcome depends on besides its status: when it is slow, and which expiries
/// the dependency is to blame for.
#[derive(Debug, Clone, Copy)]
pub(super) struct Thresholds {
    pub(super) slow_call: Duration,
    pub(super) min_judged_slice: Duration,
}

impl Thresholds {
    /// The outcome of a call that ended with `result` after `elapsed`, from its gRPC status
    /// (unary failures arrive as trailers-only answers, with the status in the headers).
    fn outcome<B, E>(&self, result: &Result<Response<B>, E>, elapsed: Duration) -> Outcome {
        let Ok(response) = result else {
            return Outcome::Failure;
        };
        let headers = response.headers();
        let code = headers
            .get("grpc-status")
            .and_then(|value| value.to_str().ok())
            .and_then(|text| text.parse::<i32>().ok())
            .map_or(Code::Ok, Code::from_i32);
        let slow = elapsed > self.slow_call;
        if code != Code::Ok && headers.contains_key(wire::RELAYED) {
            return Outcome::Ignored;
        }
        match code {
            Code::ResourceExhausted => Outcome::Ignored,
            Code::DeadlineExceeded if headers.contains_key(wire::DEADLINE_FAILED_FAST) => {
                Outcome::Ignored
            }
            Code::DeadlineExceeded => match Slice::from_headers(headers) {
                // The caller's budget ran out before the dependency had a fair chance.
                Some(slice) if slice.given < self.min_judged_slice => {
                    if slow {
                        Outcome::Slow
                    } else {
                        Outcome::Ignored
                    }
                }
                _ => Outcome::Failure,
            },
            Code::Unavailable | Code::Internal | Code::Unknown | Code::DataLoss => Outcome::Failure,
            _ if slow => Outcome::Slow,
            _ => Outcome::Success,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::{BreakerService, BreakerSettings, Position};
    use http::{HeaderValue, Request};
    use std::task::Context;
    use tonic::Status;
    use tower::{BoxError, Service, service_fn};

    const THRESHOLDS: Thresholds = Thresholds {
        slow_call: Duration::from_millis(1_000),
        min_judged_slice: Duration::from_millis(1_000),
    };

    fn answer(
        status: Status,
        headers: &[(&'static str, &'static str)],
    ) -> Result<Response<()>, BoxError> {
        let mut response = status.into_http::<()>();
        for (name, value) in headers {
            response
                .headers_mut()
                .insert(*name, HeaderValue::from_static(value));
        }
        Ok(response)
    }

    #[test]
    fn outcomes_of_every_kind_of_answer() {
        let quick = Duration::from_millis(50);
        let long = Duration::from_millis(1_500);
        let expired = || Status::deadline_exceeded("bank-mock did not answer within the slice");
        let cases = [
            (
                "success",
                THRESHOLDS,
                Ok(Response::new(())),
                quick,
                Outcome::Success,
            ),
            (
                "an answer such as NOT_FOUND",
                THRESHOLDS,
                answer(Status::not_found("no such order"), &[]),
                quick,
                Outcome::Success,
            ),
            (
                "slow success",
                THRESHOLDS,
                Ok(Response::new(())),
                long,
                Outcome::Slow,
            ),
            (
                "UNAVAILABLE",
                THRESHOLDS,
                answer(Status::unavailable("down"), &[]),
                quick,
                Outcome::Failure,
            ),
            (
                "INTERNAL",
                THRESHOLDS,
                answer(Status::internal("broken"), &[]),
                quick,
                Outcome::Failure,
            ),
            (
                "no answer at all",
                THRESHOLDS,
                Err("connection refused".into()),
                quick,
                Outcome::Failure,
            ),
            (
                "DEADLINE_EXCEEDED after an adequate slice",
                THRESHOLDS,
                answer(expired(), &[(wire::DEADLINE_SLICE, "1478")]),
                long,
                Outcome::Failure,
            ),
            (
                "DEADLINE_EXCEEDED after exactly the threshold",
                THRESHOLDS,
                answer(expired(), &[(wire::DEADLINE_SLICE, "1000; capped")]),
                long,
                Outcome::Failure,
            ),
            (
                "DEADLINE_EXCEEDED after a short slice",
                THRESHOLDS,
                answer(expired(), &[(wire::DEADLINE_SLICE, "51")]),
                quick,
                Outcome::Ignored,
            ),
            (
                "DEADLINE_EXCEEDED after a capped short slice",
                THRESHOLDS,
                answer(expired(), &[(wire::DEADLINE_SLICE, "51; capped")]),
                quick,
                Outcome::Ignored,
            ),
            (
                "DEADLINE_EXCEEDED after a short slice that outlasted the slow-call threshold",
                Thresholds {
                    slow_call: Duration::from_millis(200),
                    min_judged_slice: Duration::from_millis(1_000),
                },
                answer(expired(), &[(wire::DEADLINE_SLICE, "600")]),
                Duration::from_millis(600),
                Outcome::Slow,
            ),
            (
                "DEADLINE_EXCEEDED with no slice named",
                THRESHOLDS,
                answer(expired(), &[]),
                quick,
                Outcome::Failure,
            ),
            (
                "a relayed failure",
                THRESHOLDS,
                answer(
                    Status::unavailable("bank-mock: down"),
                    &[(wire::RELAYED, "true")],
                ),
                quick,
                Outcome::Ignored,
            ),
            (
                "a relayed DEADLINE_EXCEEDED",
                THRESHOLDS,
                answer(
                    expired(),
                    &[(wire::RELAYED, "true"), (wire::DEADLINE_SLICE, "1478")],
                ),
                long,
                Outcome::Ignored,
            ),
            (
                "a fail-fast for lack of budget",
                THRESHOLDS,
                answer(expired(), &[(wire::DEADLINE_FAILED_FAST, "payment")]),
                quick,
                Outcome::Ignored,
            ),
            (
                "RESOURCE_EXHAUSTED",
                THRESHOLDS,
                answer(Status::resource_exhausted("slow down"), &[]),
                quick,
                Outcome::Ignored,
            ),
            (
                "a slow RESOURCE_EXHAUSTED",
                THRESHOLDS,
                answer(Status::resource_exhausted("slow down"), &[]),
                long,
                Outcome::Ignored,
            ),
        ];
        for (case, thresholds, result, elapsed, expected) in cases {
            assert_eq!(thresholds.outcome(&result, elapsed), expected, "{case}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_abandoned_by_its_caller_is_ignored() {
        // Opens on one failure; then one probe at a time.
        let settings = BreakerSettings {
            window_calls: 1,
            min_calls: 1,
            half_open_probes: 1,
            ..BreakerSettings::default()
        };
        let breaker = Breaker::new("payment", "bank-mock", settings);
        let bank = service_fn(|request: Request<&'static str>| async move {
            if *request.body() == "hang" {
                std::future::pending::<()>().await;
            }
            Ok::<_, BoxError>(Status::unavailable("down").into_http::<()>())
        });
        let mut service = BreakerService::new(bank, breaker.clone());
        service.call(Request::new("fail")).await.unwrap();
        assert_eq!(breaker.stats().position, Position::Open);
        tokio::time::advance(Duration::from_millis(settings.open_ms * 6 / 5)).await;

        // The probe is abandoned: neither a failure (which would open it) nor a success (which
        // would close it); its place is free for the next probe.
        let mut probe = Box::pin(service.call(Request::new("hang")));
        assert!(
            probe
                .as_mut()
                .poll(&mut Context::from_waker(std::task::Waker::noop()))
                .is_pending()
        );
        drop(probe);
        assert_eq!(breaker.stats().position, Position::HalfOpen);
        service.call(Request::new("fail")).await.unwrap();
        assert_eq!(
            breaker.stats().position,
            Position::Open,
            "the next call went through as the probe"
        );
    }
}

//! The per-client rate limit, checked first: before authentication and anything else, so that a
//! client over its quota costs almost nothing and cannot eat the capacity of the others.
//!
//! The key is the API key the request presents (not the address: many clients share one, and one
//! client moves between many). Unknown keys share one small quota, which also slows guessing.
//! HTTP answers 429 with `Retry-After`, `RateLimit` and `RateLimit-Policy` (the IETF httpapi
//! rate-limit header fields); gRPC answers RESOURCE_EXHAUSTED with `grpc-retry-pushback-ms`.
//! Allowed answers carry `RateLimit` and `RateLimit-Policy` too.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use resilience::guarded::{Guarded, Held};
use resilience::{
    load_shed::Caller,
    rate_limit::{Decision, Limiter, QuotaSettings},
    retry::wait_millis,
};
use rpc::guards::{CallerQuotaView, CallerQuotas};
use telemetry::metrics::{Counter, KeyValue};
use tonic::{Status, metadata::MetadataValue};
use tower::{Layer, Service};

use wire::{RATE_LIMIT, RATE_LIMIT_POLICY};

use crate::{error::Problem, settings::ApiClient};

/// The gRPC health service's methods.
const HEALTH_PATH: &str = "/grpc.health.v1.Health/";

/// The limiters of every known client, and the shared one of unknown keys.
#[derive(Debug)]
pub(crate) struct ClientLimits {
    by_key: HashMap<String, ClientLimit>,
    unknown: ClientLimit,
    rejections: Counter<u64>,
}

/// One client's limiter, the labels its refusals are counted under (its id, never its key), and
/// the name its requests carry on to the intakes that keep each client to a share.
#[derive(Debug)]
struct ClientLimit {
    labels: [KeyValue; 2],
    limiter: Limiter,
    caller: Caller,
    refused: AtomicU64,
}

impl ClientLimit {
    fn new(client_id: &str, quota: QuotaSettings) -> Self {
        Self {
            labels: [
                KeyValue::new("scope", "client"),
                KeyValue::new("name", client_id.to_owned()),
            ],
            limiter: Limiter::new(quota),
            caller: Caller(Arc::from(client_id)),
            refused: AtomicU64::new(0),
        }
    }
}

impl ClientLimits {
    /// The limiters of `clients` and of unknown keys, each keeping this gateway's share of its
    /// quota when `replicas` gateways serve the same clients ([`QuotaSettings::share`]).
    pub(crate) fn new(clients: &[ApiClient], unknown: QuotaSettings, replicas: u32) -> Arc<Self> {
        let by_key = clients
            .iter()
            .map(|client| {
                (
                    client.api_key.clone(),
                    ClientLimit::new(&client.client_id, client.quota.share(replicas)),
                )
            })
            .collect();
        Arc::new(Self {
            by_key,
            unknown: ClientLimit::new("unknown", unknown.share(replicas)),
            rejections: resilience::rate_limit::rejections_counter(),
        })
    }

    fn limit(&self, headers: &HeaderMap) -> &ClientLimit {
        headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .and_then(|key| self.by_key.get(key.trim()))
            .unwrap_or(&self.unknown)
    }
}

impl CallerQuotas for ClientLimits {
    /// Each client's quota and refusals, a client with several keys once.
    fn view(&self) -> Vec<CallerQuotaView> {
        let mut by_client = BTreeMap::<&str, CallerQuotaView>::new();
        for limit in self.by_key.values().chain([&self.unknown]) {
            let quota = limit.limiter.quota();
            let refused = limit.refused.load(Ordering::Relaxed);
            by_client
                .entry(&limit.caller.0)
                .and_modify(|view| view.refused += refused)
                .or_insert_with(|| CallerQuotaView {
                    name: limit.caller.0.to_string(),
                    per_second: quota.per_second,
                    burst: quota.burst,
                    refused,
                });
        }
        by_client.into_values().collect()
    }
}

/// Applies [`RateLimit`].
#[derive(Debug, Clone)]
pub(crate) struct RateLimitLayer {
    limits: Arc<ClientLimits>,
}

impl RateLimitLayer {
    pub(crate) fn new(limits: Arc<ClientLimits>) -> Self {
        Self { limits }
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            limits: self.limits.clone(),
        }
    }
}

/// Refuses requests over their client's quota at once; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct RateLimit<S> {
    inner: S,
    limits: Arc<ClientLimits>,
}

/// `"default";q=10;w=2`: requests allowed per window of `w` seconds, the window being the time a
/// full burst takes to return (so `q/w` is the sustained rate, and a fresh client may spend up to
/// the burst at once).
fn policy(quota: QuotaSettings) -> HeaderValue {
    let window = quota.window_secs();
    let allowed = u64::from(quota.per_second.max(1)) * window;
    HeaderValue::try_from(format!("\"default\";q={allowed};w={window}")).expect("ascii")
}

/// `"default";r=150;t=1`: what remains and the seconds until the quota is whole (or, when
/// refused, until the next request is allowed).
fn state(remaining: u32, reset: Duration) -> HeaderValue {
    HeaderValue::try_from(format!("\"default\";r={remaining};t={}", seconds(reset))).expect("ascii")
}

/// Whole seconds, rounded up: a client told to come back sooner would be refused again.
fn seconds(wait: Duration) -> u64 {
    wait.as_nanos().div_ceil(1_000_000_000) as u64
}

fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

/// The quota's state and policy, added to an allowed request's answer.
#[derive(Debug)]
pub(crate) struct QuotaHeaders {
    state: HeaderValue,
    policy: HeaderValue,
}

impl<B> Held<B> for QuotaHeaders {
    fn answered<E>(self, answer: &mut Result<Response<B>, E>) {
        if let Ok(response) = answer {
            response.headers_mut().insert(RATE_LIMIT, self.state);
            response
                .headers_mut()
                .insert(RATE_LIMIT_POLICY, self.policy);
        }
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default + From<String>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    /// Health checks hold no quota, and their answers carry none.
    type Future = Guarded<S::Future, ResBody, Option<QuotaHeaders>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<ReqBody>) -> Self::Future {
        // Health checks are the orchestrator's, not a client's: never held to a client's quota.
        if request.uri().path().starts_with(HEALTH_PATH) {
            return Guarded::admitted(self.inner.call(request), None);
        }
        let limit = self.limits.limit(request.headers());
        let quota = limit.limiter.quota();
        match limit.limiter.check() {
            Decision::Allowed { remaining } => {
                let until_whole = Duration::from_secs_f64(
                    f64::from(quota.burst - remaining.min(quota.burst))
                        / f64::from(quota.per_second.max(1)),
                );
                let headers = QuotaHeaders {
                    state: state(remaining, until_whole),
                    policy: policy(quota),
                };
                request.extensions_mut().insert(limit.caller.clone());
                Guarded::admitted(self.inner.call(request), Some(headers))
            }
            Decision::Limited { retry_after } => {
                limit.refused.fetch_add(1, Ordering::Relaxed);
                self.limits.rejections.add(1, &limit.labels);
                let detail = format!(
                    "over the quota of {} requests per second (burst {}); retry in {} ms",
                    quota.per_second,
                    quota.burst,
                    wait_millis(retry_after)
                );
                let mut response = if is_grpc(request.headers()) {
                    let mut status = Status::resource_exhausted(format!("gateway: {detail}"));
                    let wait = MetadataValue::from(wait_millis(retry_after).max(1));
                    status.metadata_mut().insert(wire::RETRY_PUSHBACK_MS, wait);
                    status.into_http()
                } else {
                    let mut response: Response<ResBody> =
                        Problem::new(StatusCode::TOO_MANY_REQUESTS, "Too many requests", detail)
                            .into_http();
                    response.headers_mut().insert(
                        header::RETRY_AFTER,
                        HeaderValue::from(seconds(retry_after).max(1)),
                    );
                    response
                };
                let headers = response.headers_mut();
                headers.insert(RATE_LIMIT, state(0, retry_after));
                headers.insert(RATE_LIMIT_POLICY, policy(quota));
                Guarded::refused(response)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The parameters of a one-item structured field (RFC 9651) `"default";key=integer;…`, as a
    /// client of the IETF rate-limit fields reads it.
    fn parameters(value: &HeaderValue) -> Vec<(String, u64)> {
        let text = value.to_str().expect("visible ASCII");
        let rest = text
            .strip_prefix("\"default\"")
            .expect("the policy's name, quoted");
        rest.split(';')
            .skip(1)
            .map(|parameter| {
                let (key, number) = parameter.split_once('=').expect("key=value");
                assert!(
                    !number.is_empty()
                        && number.len() <= 15
                        && number.bytes().all(|b| b.is_ascii_digit()),
                    "an sf-integer: {number}"
                );
                (key.to_owned(), number.parse().unwrap())
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn ratelimit_says_what_remains_and_never_too_soon(remaining in any::<u32>(), reset_ms in 0u64..100_000_000) {
            let reset = Duration::from_millis(reset_ms);
            let fields = parameters(&state(remaining, reset));
            prop_assert_eq!(fields[0].clone(), ("r".to_owned(), u64::from(remaining)));
            let (key, seconds) = fields[1].clone();
            prop_assert_eq!(key, "t");
            prop_assert!(Duration::from_secs(seconds) >= reset, "a client back after t is not refused again");
            prop_assert!(seconds == 0 || Duration::from_secs(seconds - 1) < reset, "rounded up by less than a second");
        }

        #[test]
        fn ratelimit_policy_holds_the_burst_and_the_rate(per_second in 1u32..100_000, burst in 1u32..1_000_000) {
            let quota = QuotaSettings { per_second, burst };
            let fields = parameters(&policy(quota));
            let (quota_key, allowed) = fields[0].clone();
            let (window_key, window) = fields[1].clone();
            prop_assert_eq!((quota_key.as_str(), window_key.as_str()), ("q", "w"));
            prop_assert!(window >= 1);
            prop_assert_eq!(allowed, u64::from(per_second) * window, "q/w is the sustained rate");
            prop_assert!(allowed >= u64::from(burst), "a full burst fits in one window");
        }
    }
}

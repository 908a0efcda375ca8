//! Bounded intake for a server: at most `limit` requests in progress; the next is refused at once.
//!
//! Why not a queue? Work accepted beyond what can be done in time only waits, holds memory and
//! times out; refusing it at once is backpressure the caller can act on. The refusal says "slow
//! down": RESOURCE_EXHAUSTED with a pushback over gRPC (a caller's breaker does not count it as a
//! failure: the service is alive), 503 with `Retry-After` over HTTP.
//!
//! The pushback is drawn anew for each refusal, between [`PUSHBACK`] and twice that: callers
//! refused in the same burst would otherwise all come back at the same instant, a wave that fills
//! the intake again and is refused again.
//!
//! An intake shared by many clients can also keep each to a share of its places
//! ([`Intake::with_caller_share`]): without it, one client whose requests are slow (a slow body,
//! a slow dependency of its own orders) holds every place and the others are refused for it. The
//! request names its caller with a [`Caller`] extension, put there by whoever authenticated it.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use http::{HeaderValue, Request, Response, StatusCode, header};
use telemetry::metrics::{self, Counter, KeyValue};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::{Status, metadata::MetadataValue};

use crate::{
    guarded::{Guarded, Held},
    shares::{Share, Shares},
};
use tower::{
    Layer, Service,
    util::rng::{HasherRng, Rng},
};

/// The shortest wait a refused gRPC caller is asked for.
pub const PUSHBACK: Duration = Duration::from_millis(100);

/// The pushback of one refusal, in milliseconds: uniform in [`PUSHBACK`, 2 × `PUSHBACK`).
fn pushback_ms(rng: &mut impl Rng) -> u64 {
    let shortest = PUSHBACK.as_millis() as u64;
    shortest + rng.next_range(0..shortest)
}

/// Who a request is for (an authenticated client's id), as a request extension: the key of an
/// intake's per-caller share.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Caller(pub Arc<str>);

/// The intake of one server (or one kind of request), shared by every clone of its service.
#[derive(Debug)]
pub struct Intake {
    name: &'static str,
    limit: u32,
    permits: Arc<Semaphore>,
    /// Places one [`Caller`] may hold at once.
    per_caller: Option<Shares<Caller>>,
    refused: AtomicU64,
    rejections: Counter<u64>,
}

impl Intake {
    pub fn new(name: &'static str, limit: u32) -> Arc<Self> {
        Arc::new(Self::unshared(name, limit))
    }

    /// An intake of `limit` places of which one [`Caller`] holds `per_caller` at most; a request
    /// with no `Caller` extension is held to the shared limit only.
    pub fn with_caller_share(name: &'static str, limit: u32, per_caller: u32) -> Arc<Self> {
        Arc::new(Self {
            per_caller: Some(Shares::new(per_caller as usize)),
            ..Self::unshared(name, limit)
        })
    }

    fn unshared(name: &'static str, limit: u32) -> Self {
        let limit = limit.max(1);
        Self {
            name,
            limit,
            permits: Arc::new(Semaphore::new(limit as usize)),
            per_caller: None,
            refused: AtomicU64::new(0),
            rejections: metrics::counter(
                metrics::name::LOAD_SHED_REJECTIONS,
                "Requests refused at a full intake",
            ),
        }
    }

    /// Requests refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

/// Applies [`LoadShed`].
#[derive(Debug, Clone)]
pub struct LoadShedLayer {
    intake: Arc<Intake>,
}

impl LoadShedLayer {
    pub fn new(intake: Arc<Intake>) -> Self {
        Self { intake }
    }
}

impl<S> Layer<S> for LoadShedLayer {
    type Service = LoadShed<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LoadShed {
            inner,
            intake: self.intake.clone(),
        }
    }
}

/// Refuses requests beyond the intake's limit; see the module docs.
#[derive(Debug, Clone)]
pub struct LoadShed<S> {
    inner: S,
    intake: Arc<Intake>,
}

/// What an admitted request holds until its answer: a permit of the intake, and its caller's
/// place in the shares.
#[derive(Debug)]
pub struct InProgress {
    _permit: OwnedSemaphorePermit,
    _place: Option<Share<Caller>>,
}

impl<B> Held<B> for InProgress {}

/// The refusal of a caller that holds its whole share: 429 over HTTP (it is this caller's doing,
/// not the server's load), RESOURCE_EXHAUSTED with a pushback over gRPC.
fn share_refusal<B: Default + From<String>>(
    grpc: bool,
    intake: &Intake,
    share: usize,
) -> Response<B> {
    let detail = format!(
        "{}: {share} requests of this client already in progress; retry when one has finished",
        intake.name
    );
    refused(
        grpc,
        intake.name,
        detail,
        StatusCode::TOO_MANY_REQUESTS,
        "Too many requests in progress",
    )
}

/// The refusal of a request beyond the intake's limit: 503 over HTTP.
fn refusal<B: Default + From<String>>(grpc: bool, intake: &Intake) -> Response<B> {
    let detail = format!(
        "{}: {} requests already in progress; retry shortly",
        intake.name, intake.limit
    );
    refused(
        grpc,
        intake.name,
        detail,
        StatusCode::SERVICE_UNAVAILABLE,
        "Overloaded",
    )
}

/// A refusal as problem+json with `Retry-After: 1` over HTTP, or RESOURCE_EXHAUSTED with a
/// random pushback over gRPC, marked as not executed by the server named `by`.
pub(crate) fn refused<B: Default + From<String>>(
    grpc: bool,
    by: &'static str,
    detail: String,
    http_status: StatusCode,
    title: &str,
) -> Response<B> {
    if grpc {
        let mut status = Status::resource_exhausted(detail);
        // A generator seeded anew for each refusal, so that refusals do not share one sequence.
        status.metadata_mut().insert(
            wire::RETRY_PUSHBACK_MS,
            MetadataValue::from(pushback_ms(&mut HasherRng::default())),
        );
        status
            .metadata_mut()
            .insert(wire::NOT_EXECUTED, MetadataValue::from_static(by));
        return status.into_http();
    }
    let body = serde_json::json!({"type": "about:blank", "title": title, "status": http_status.as_u16(), "detail": detail});
    let mut response = Response::new(B::from(body.to_string()));
    *response.status_mut() = http_status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(1));
    response
}

/// Whether `request` is a gRPC call, to be answered in gRPC's terms.
pub(crate) fn is_grpc<B>(request: &Request<B>) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for LoadShed<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default + From<String>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = Guarded<S::Future, ResBody, InProgress>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let grpc = is_grpc(&request);
        // The caller's share first: a caller at its share is refused without taking a place
        // from the others.
        let place = match (
            &self.intake.per_caller,
            request.extensions().get::<Caller>(),
        ) {
            (Some(shares), Some(caller)) => match shares.take(caller) {
                Some(place) => Some(place),
                None => {
                    self.intake.refused.fetch_add(1, Ordering::Relaxed);
                    self.intake.rejections.add(
                        1,
                        &[
                            KeyValue::new("intake", self.intake.name),
                            KeyValue::new("scope", "client"),
                        ],
                    );
                    return Guarded::refused(share_refusal(grpc, &self.intake, shares.limit()));
                }
            },
            _ => None,
        };
        match self.intake.permits.clone().try_acquire_owned() {
            Ok(permit) => Guarded::admitted(
                self.inner.call(request),
                InProgress {
                    _permit: permit,
                    _place: place,
                },
            ),
            Err(_) => {
                self.intake.refused.fetch_add(1, Ordering::Relaxed);
                self.intake
                    .rejections
                    .add(1, &[KeyValue::new("intake", self.intake.name)]);
                Guarded::refused(refusal(grpc, &self.intake))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::service_fn;

    /// Draws `self.0` every time.
    struct Draw(u64);

    impl Rng for Draw {
        fn next_u64(&mut self) -> u64 {
            self.0
        }
    }

    #[test]
    fn the_pushback_is_never_shorter_than_configured_and_less_than_twice_that() {
        assert_eq!(pushback_ms(&mut Draw(0)), 100);
        assert_eq!(pushback_ms(&mut Draw(99)), 199);
        assert_eq!(pushback_ms(&mut Draw(u64::MAX)), 100 + u64::MAX % 100);
    }

    #[tokio::test]
    async fn callers_refused_together_are_asked_to_come_back_at_different_times() {
        let busy = service_fn(|_: Request<String>| {
            std::future::pending::<Result<Response<String>, std::convert::Infallible>>()
        });
        let mut service = LoadShedLayer::new(Intake::new("orders", 1)).layer(busy);
        let _in_progress = service.call(Request::new(String::new()));
        let mut pushbacks = Vec::new();
        for _ in 0..200 {
            let mut request = Request::new(String::new());
            request.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/grpc"),
            );
            let refused = service.call(request).await.unwrap();
            assert_eq!(refused.headers()["grpc-status"], "8");
            pushbacks.push(
                refused.headers()[wire::RETRY_PUSHBACK_MS]
                    .to_str()
                    .unwrap()
                    .parse::<u64>()
                    .unwrap(),
            );
        }
        assert!(
            pushbacks.iter().all(|ms| (100..200).contains(ms)),
            "{pushbacks:?}"
        );
        let (shortest, longest) = (
            pushbacks.iter().min().unwrap(),
            pushbacks.iter().max().unwrap(),
        );
        assert!(
            *shortest < 125 && *longest >= 175,
            "spread over the range: {shortest}..={longest}"
        );
    }

    #[tokio::test]
    async fn one_caller_holds_its_share_and_leaves_the_rest_to_the_others() {
        let busy = service_fn(|_: Request<String>| {
            std::future::pending::<Result<Response<String>, std::convert::Infallible>>()
        });
        let mut service =
            LoadShedLayer::new(Intake::with_caller_share("creates", 3, 2)).layer(busy);
        let as_caller = |name: &str| {
            let mut request = Request::new(String::new());
            request.extensions_mut().insert(Caller(Arc::from(name)));
            request
        };
        let first = service.call(as_caller("greedy"));
        let second = service.call(as_caller("greedy"));
        let refused = service.call(as_caller("greedy")).await.unwrap();
        assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
        // The greedy caller's refusal took no place: another caller still gets the last one.
        let _other = service.call(as_caller("other"));
        assert_eq!(
            service.call(as_caller("third")).await.unwrap().status(),
            StatusCode::SERVICE_UNAVAILABLE,
            "the shared limit holds"
        );
        // A finished request gives its place back to its caller.
        drop(first);
        assert!(matches!(
            service.call(as_caller("greedy")),
            Guarded::Admitted { .. }
        ));
        drop(second);
    }
}

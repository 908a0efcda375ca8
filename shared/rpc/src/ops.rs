//! The operations port: what a platform asks of a running service (metrics, liveness,
//! readiness) and what an operator looks at (the live view of its guards), on a listener of its
//! own, in plain HTTP.
//!
//! Why a port of its own: a scraper or a probe needs no certificate and no API key there, so it
//! gets no business data either; and it stands outside every intake limit of the service's
//! ports, so a service that sheds load is still seen alive (a probe that is shed gets a busy pod
//! restarted, which makes the overload worse).

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Json, Router,
    extract::{ConnectInfo, Request, State},
    http::StatusCode,
    http::header,
    middleware::{self, Next},
    response::{IntoResponse, Response},
    routing::get,
};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{ServerError, connections::ConnectionLimits, guards::Guards, listener::Peer};

/// The live view's page: one file, no external assets, drawing `/guards.json` every second.
const GUARDS_PAGE: &str = include_str!("guards.html");

/// Where the operations port listens, and how long a stopping service keeps serving after it
/// stopped saying it is ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OpsSettings {
    /// Address of `/metrics`, `/livez` and `/readyz` (plain HTTP).
    pub listen: SocketAddr,
    /// From a stop signal until the service's ports close: readiness says NOT_SERVING meanwhile,
    /// and requests are still answered, so that the platform takes the replica out of its
    /// endpoints before anyone is refused. 0 closes at once (one process, no load balancer).
    pub drain_ms: u64,
}

impl OpsSettings {
    /// Listening on `listen`, closing at once.
    pub const fn on(listen: SocketAddr) -> Self {
        Self {
            listen,
            drain_ms: 0,
        }
    }
}

impl Default for OpsSettings {
    fn default() -> Self {
        Self::on(SocketAddr::from(([127, 0, 0, 1], 9464)))
    }
}

/// A service's stop in two steps: the drain starts when `shutdown` is cancelled (readiness and
/// `grpc.health.v1` say NOT_SERVING from then on), and the ports close `drain_ms` later.
#[derive(Debug, Clone)]
pub struct Drain {
    started: CancellationToken,
    delay: Duration,
}

impl Drain {
    /// A drain that starts when `shutdown` is cancelled and closes the ports `delay` later.
    pub fn new(shutdown: CancellationToken, delay: Duration) -> Self {
        Self {
            started: shutdown,
            delay,
        }
    }

    pub fn is_draining(&self) -> bool {
        self.started.is_cancelled()
    }

    /// Completes when the drain starts.
    pub fn started(&self) -> impl Future<Output = ()> + Send + 'static {
        self.started.clone().cancelled_owned()
    }

    /// Completes when the ports should close: the drain's delay after it started.
    pub fn closing(&self) -> impl Future<Output = ()> + Send + 'static {
        let (started, delay) = (self.started.clone(), self.delay);
        async move {
            started.cancelled().await;
            tokio::time::sleep(delay).await;
        }
    }
}

/// `GET /metrics` (Prometheus text), `GET /livez` (200 while the process answers),
/// `GET /readyz` (200, then 503 from the start of `drain`), and the live view of `guards`,
/// `GET /guards` (a page) and `GET /guards.json`, to callers on the same machine only.
pub fn router(drain: Drain, guards: Guards) -> Router {
    let live_view = Router::new()
        .route(
            "/guards",
            get(|| async {
                (
                    [(header::CACHE_CONTROL, "no-store")],
                    axum::response::Html(GUARDS_PAGE),
                )
            }),
        )
        .route(
            "/guards.json",
            get(|State(guards): State<Arc<Guards>>| async move {
                ([(header::CACHE_CONTROL, "no-store")], Json(guards.view()))
            }),
        )
        .layer(middleware::from_fn(from_loopback_only))
        .with_state(Arc::new(guards));
    Router::new()
        .route("/metrics", get(metrics))
        .route("/livez", get(|| async { "alive\n" }))
        .route("/readyz", get(ready))
        .with_state(drain)
        .merge(live_view)
}

/// Lets through requests from a loopback address. The view names clients and shows load: it is
/// for an operator on the machine (or behind `kubectl port-forward`, which connects from it),
/// while the rest of the port answers the platform from anywhere.
async fn from_loopback_only(request: Request, next: Next) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .map(|ConnectInfo(peer)| peer.addr);
    if peer.is_some_and(|addr| addr.ip().to_canonical().is_loopback()) {
        return next.run(request).await;
    }
    let problem = serde_json::json!({
        "type": "about:blank",
        "title": "Forbidden",
        "status": 403,
        "detail": "the live view of the guards answers callers on the same machine only",
    });
    (
        StatusCode::FORBIDDEN,
        [(header::CONTENT_TYPE, "application/problem+json")],
        problem.to_string(),
    )
        .into_response()
}

async fn metrics() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, telemetry::metrics::CONTENT_TYPE)],
        telemetry::metrics::render(),
    )
}

async fn ready(State(drain): State<Drain>) -> impl IntoResponse {
    if drain.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining\n")
    } else {
        (StatusCode::OK, "ready\n")
    }
}

/// A bound operations port, not yet serving.
pub struct OpsServer {
    listener: TcpListener,
    drain: Duration,
    guards: Guards,
}

impl OpsServer {
    /// Binds `settings.listen` (port 0 picks a free port), to show `guards` among the rest.
    pub async fn bind(settings: &OpsSettings, guards: Guards) -> Result<Self, ServerError> {
        Ok(Self {
            listener: crate::bind(settings.listen).await?,
            drain: Duration::from_millis(settings.drain_ms),
            guards,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// The guards it shows, live: their [`Guards::view`] is `GET /guards.json`'s document.
    pub fn guards(&self) -> Guards {
        self.guards.clone()
    }

    /// Runs `service` (the service's own ports, which close when the [`Drain`] it is given says
    /// so) and serves the operations port until it has finished: readiness says NOT_SERVING from
    /// the cancellation of `shutdown` until the service's ports have closed.
    pub async fn serve_while<F, E>(
        self,
        shutdown: CancellationToken,
        service: impl FnOnce(Drain) -> F,
    ) -> Result<(), E>
    where
        F: Future<Output = Result<(), E>>,
        E: From<ServerError>,
    {
        let drain = Drain::new(shutdown, self.drain);
        let finished = CancellationToken::new();
        let ops = crate::serve_http_with(
            self.listener,
            ConnectionLimits::default(),
            router(drain.clone(), self.guards),
            finished.clone().cancelled_owned(),
        );
        let service = async {
            let result = service(drain).await;
            finished.cancel();
            result
        };
        let (served, result) = tokio::join!(ops, service);
        served?;
        result
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;
    use tower::ServiceExt;

    use super::*;

    async fn status(router: &Router, path: &str) -> StatusCode {
        router
            .clone()
            .oneshot(
                http::Request::get(path)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap()
            .status()
    }

    /// `path`'s answer to a caller at `peer`.
    async fn get_from(router: &Router, path: &str, peer: &str) -> (StatusCode, String) {
        let mut request = http::Request::get(path)
            .body(axum::body::Body::empty())
            .unwrap();
        request
            .extensions_mut()
            .insert(ConnectInfo(Peer::from(peer.parse::<SocketAddr>().unwrap())));
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), usize::MAX)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    fn quiet_router() -> Router {
        router(
            Drain::new(CancellationToken::new(), Duration::ZERO),
            Guards::new("payment").face("grpc", deadline::HopStats::new()),
        )
    }

    #[tokio::test]
    async fn the_guards_are_shown_to_loopback_callers_only() {
        let router = quiet_router();
        for peer in ["127.0.0.1:40000", "[::1]:40000", "[::ffff:127.0.0.1]:40000"] {
            let (status, page) = get_from(&router, "/guards", peer).await;
            assert_eq!(status, StatusCode::OK, "{peer}");
            assert!(page.contains("guards.json"), "the page reads the document");
            let (status, document) = get_from(&router, "/guards.json", peer).await;
            assert_eq!(status, StatusCode::OK, "{peer}");
            let view: serde_json::Value = serde_json::from_str(&document).unwrap();
            assert_eq!(
                (view["service"].as_str(), view["faces"][0]["name"].as_str()),
                (Some("payment"), Some("grpc"))
            );
        }
        for peer in ["10.0.0.7:40000", "[2001:db8::1]:40000"] {
            for path in ["/guards", "/guards.json"] {
                let (status, problem) = get_from(&router, path, peer).await;
                assert_eq!(status, StatusCode::FORBIDDEN, "{peer} {path}");
                assert!(problem.contains("same machine only"), "{problem}");
            }
        }
        assert_eq!(
            status(&router, "/guards.json").await,
            StatusCode::FORBIDDEN,
            "an unknown peer is not trusted"
        );
        assert_eq!(
            get_from(&router, "/metrics", "10.0.0.7:40000").await.0,
            StatusCode::OK,
            "the rest answers anyone"
        );
    }

    #[tokio::test]
    async fn readiness_turns_at_the_start_of_the_drain_and_liveness_does_not() {
        let shutdown = CancellationToken::new();
        let router = router(
            Drain::new(shutdown.clone(), Duration::from_secs(5)),
            Guards::new("payment"),
        );
        assert_eq!(
            (
                status(&router, "/livez").await,
                status(&router, "/readyz").await
            ),
            (StatusCode::OK, StatusCode::OK)
        );
        shutdown.cancel();
        assert_eq!(
            (
                status(&router, "/livez").await,
                status(&router, "/readyz").await
            ),
            (StatusCode::OK, StatusCode::SERVICE_UNAVAILABLE)
        );
        assert_eq!(status(&router, "/metrics").await, StatusCode::OK);
    }

    #[tokio::test(start_paused = true)]
    async fn the_ports_close_the_drain_after_it_starts() {
        let shutdown = CancellationToken::new();
        let drain = Drain::new(shutdown.clone(), Duration::from_secs(5));
        let mut closing = std::pin::pin!(drain.closing());
        assert!(
            closing.as_mut().now_or_never().is_none(),
            "not before the stop"
        );
        shutdown.cancel();
        // The server polls it at once: the cancellation wakes it.
        assert!(
            closing.as_mut().now_or_never().is_none(),
            "the drain starts"
        );
        tokio::time::advance(Duration::from_millis(4_999)).await;
        assert!(
            closing.as_mut().now_or_never().is_none(),
            "not within the drain"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(closing.as_mut().now_or_never().is_some());
    }
}

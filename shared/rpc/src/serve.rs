//! The one accept loop of every port: HTTP/1 and HTTP/2 (gRPC included) with time limits that
//! axum's own `serve` does not set, on a listener that keeps its connection limits.
//!
//! Why not `axum::serve`: it gives hyper no timer, so an HTTP/1 client that sends its headers a
//! line at a time holds its connection for ever, and HTTP/2 peers that vanish are never pinged.

use std::{future::Future, pin::pin, time::Duration};

use axum::{
    extract::{ConnectInfo, Request},
    serve::Listener,
};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::{conn::auto::Builder, graceful::GracefulShutdown},
    service::TowerToHyperService,
};
use tower::ServiceExt;

use crate::{connections::ConnectionLimits, listener::Peer};

/// Serves `router` on `listener` until `shutdown` completes, then lets the requests in flight
/// finish. Every request carries `ConnectInfo<Peer>`.
pub(crate) async fn serve<L>(mut listener: L, limits: &ConnectionLimits, router: axum::Router, shutdown: impl Future<Output = ()>)
where
    L: Listener,
    L::Addr: Into<Peer>,
{
    let mut builder = Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(Duration::from_millis(limits.header_read_timeout_ms));
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_millis(limits.keepalive_interval_ms))
        .keep_alive_timeout(Duration::from_millis(limits.keepalive_timeout_ms));
    let graceful = GracefulShutdown::new();
    let mut shutdown = pin!(shutdown);
    loop {
        let (io, addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let peer: Peer = addr.into();
        let router = router.clone();
        let service = TowerToHyperService::new(tower::service_fn(move |request: Request<Incoming>| {
            let mut request = request.map(axum::body::Body::new);
            request.extensions_mut().insert(ConnectInfo(peer.clone()));
            router.clone().oneshot(request)
        }));
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(io), service).into_owned());
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
    graceful.shutdown().await;
}

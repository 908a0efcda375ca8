//! The one accept loop of every port: HTTP/1 and HTTP/2 (gRPC included) with time limits that
//! axum's own `serve` does not set, on a listener that keeps its connection limits.
//!
//! Why not `axum::serve`: it gives hyper no timer, so an HTTP/1 client that sends its headers a
//! line at a time holds its connection for ever, and HTTP/2 peers that vanish are never pinged.
//! And only here are requests seen: a connection is idle while none is open on it, which the
//! listener's connections learn from [`OpenRequest`] guards that live as long as each answer.

use std::{
    future::Future,
    pin::{Pin, pin},
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    body::Body,
    extract::{ConnectInfo, Request},
    serve::Listener,
};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto::Builder,
    service::TowerToHyperService,
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tower::ServiceExt;

use crate::{
    connections::{ConnectionLimits, OpenRequest, Placed},
    listener::Peer,
};

/// Serves `router` on `listener` until `shutdown` completes, then lets the requests in flight
/// finish. Every request carries `ConnectInfo<Peer>`.
pub(crate) async fn serve<L>(
    mut listener: L,
    limits: &ConnectionLimits,
    router: axum::Router,
    shutdown: impl Future<Output = ()>,
) where
    L: Listener,
    L::Io: Placed,
    L::Addr: Into<Peer>,
{
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(limits.header_read_timeout_ms));
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Duration::from_millis(limits.keepalive_interval_ms))
        .keep_alive_timeout(Duration::from_millis(limits.keepalive_timeout_ms));
    // Every connection is asked to end, gracefully, at shutdown or when it reaches its age.
    let (stop, connections) = (CancellationToken::new(), TaskTracker::new());
    let mut shutdown = pin!(shutdown);
    loop {
        let (io, addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut shutdown => break,
        };
        let peer: Peer = addr.into();
        let router = router.clone();
        let requests = io.place().requests();
        let service =
            TowerToHyperService::new(tower::service_fn(move |request: Request<Incoming>| {
                let open = requests.open();
                let mut request = request.map(Body::new);
                request.extensions_mut().insert(ConnectInfo(peer.clone()));
                let answer = router.clone().oneshot(request);
                async move {
                    Ok::<_, std::convert::Infallible>(
                        answer
                            .await?
                            .map(|body| Body::new(Answer { body, _open: open })),
                    )
                }
            }));
        let connection = builder
            .serve_connection(TokioIo::new(io), service)
            .into_owned();
        let (stop, max_age) = (stop.clone(), limits.max_age());
        connections.spawn(async move {
            let mut connection = pin!(connection);
            let aged = async {
                match max_age {
                    Some(age) => tokio::time::sleep(age).await,
                    None => std::future::pending().await,
                }
            };
            let ended = tokio::select! {
                ended = connection.as_mut() => Some(ended),
                () = aged => None,
                () = stop.cancelled() => None,
            };
            let ended = match ended {
                Some(ended) => ended,
                None => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = ended {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
    // Closed before the requests in flight finish: a new connection is refused at once, not
    // queued behind a server that will never accept it.
    drop(listener);
    stop.cancel();
    connections.close();
    connections.wait().await;
}

pin_project_lite::pin_project! {
    /// An answer's body, which keeps its request open until it is all sent (or dropped).
    struct Answer {
        #[pin]
        body: Body,
        _open: OpenRequest,
    }
}

impl http_body::Body for Answer {
    type Data = <Body as http_body::Body>::Data;
    type Error = <Body as http_body::Body>::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

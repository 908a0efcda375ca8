use std::net::SocketAddr;

use axum::{Router, error_handling::HandleErrorLayer, extract::Request};
use rpc::{ServerError, tls::ServiceTls};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::{Status, body::Body};
use tower::{BoxError, ServiceBuilder};

use super::{NaiveRetryLayer, NaiveSettings};

/// A port in front of one hop that passes every call to it through [`super::NaiveRetry`], as a
/// retrying sidecar would. The naive chain puts one before each hop on an order's way, so that
/// the services themselves stay as they are and only their settings turn their guards off.
pub struct RetryingProxy {
    listener: TcpListener,
    router: Router,
}

impl RetryingProxy {
    /// A proxy on a free loopback port to the plain-text gRPC server at `target`.
    pub async fn bind(target: &str, settings: NaiveSettings) -> Result<Self, ServerError> {
        let endpoint = rpc::endpoint(target)
            .map_err(|error| ServerError::Settings(format!("naive proxy to {target}: {error}")))?;
        let retrying = ServiceBuilder::new()
            .layer(HandleErrorLayer::new(|error: BoxError| async move {
                Status::from_error(error).into_http::<Body>()
            }))
            .map_request(|request: Request| request.map(Body::new))
            .layer(NaiveRetryLayer::new(settings))
            .service(rpc::channel(&endpoint, "", &ServiceTls::Plaintext));
        Ok(Self {
            listener: rpc::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?,
            router: Router::new().fallback_service(retrying),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Serves until `stop` is cancelled.
    pub async fn serve(self, stop: CancellationToken) -> Result<(), ServerError> {
        rpc::serve_http(self.listener, self.router, stop.cancelled_owned()).await
    }
}

//! `/metrics`: the chain's metrics in Prometheus text, on every port a service serves.

use axum::{Router, http::header, response::IntoResponse, routing::get};

/// A router answering `GET /metrics`; merged into each service's routers after their layers, so
/// that a scrape is neither counted nor limited like a request.
pub fn router() -> Router {
    Router::new().route("/metrics", get(metrics))
}

async fn metrics() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, telemetry::metrics::CONTENT_TYPE)], telemetry::metrics::render())
}

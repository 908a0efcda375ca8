//! Every error the HTTP face answers is `application/problem+json`, those that no handler of ours
//! writes included: the router's 405, the extractors' rejections (413 for a body over the limit,
//! 400 for a path that does not decode) and the limits on the request head (414, 431).
//!
//! Why one layer rather than a rejection handler per extractor: axum makes those answers in many
//! places; mapping them where they leave the router gives one shape whatever made them.

use axum::{extract::Request, middleware::Next, response::Response};
use http::{HeaderValue, StatusCode, header};

use crate::error::Problem;

/// Longest request target (path and query) accepted; hyper's own limit, 64 KiB, is answered by
/// hyper without a body.
pub(crate) const MAX_URI_LEN: usize = 8 * 1024;
/// Largest header section (names and values) accepted; hyper's own limits (about 400 KB, or more
/// than 100 fields) are answered by hyper without a body.
pub(crate) const MAX_HEADER_BYTES: usize = 16 * 1024;
/// The most of a bare error's body kept as the problem's detail.
const MAX_DETAIL_BYTES: usize = 1024;

/// Refuses an oversized request head, and turns any other error answer into a problem.
pub(crate) async fn problem_answers(request: Request, next: Next) -> Response {
    let uri_len = request
        .uri()
        .path_and_query()
        .map_or(0, |target| target.as_str().len());
    if uri_len > MAX_URI_LEN {
        let detail =
            format!("the request target is {uri_len} bytes; at most {MAX_URI_LEN} are accepted");
        return Problem::new(StatusCode::URI_TOO_LONG, "URI too long", detail).into_http();
    }
    let header_bytes: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len())
        .sum();
    if header_bytes > MAX_HEADER_BYTES {
        let detail = format!(
            "the headers are {header_bytes} bytes; at most {MAX_HEADER_BYTES} are accepted"
        );
        return Problem::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "Request header fields too large",
            detail,
        )
        .into_http();
    }
    as_problem(next.run(request).await).await
}

/// `response` as a problem, its own text as the detail, its other headers (`Allow` on a 405) kept.
async fn as_problem(response: Response) -> Response {
    let status = response.status();
    let problem_already = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|kind| kind == "application/problem+json");
    if problem_already || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_DETAIL_BYTES)
        .await
        .unwrap_or_default();
    let detail = match String::from_utf8_lossy(&text).trim() {
        "" if status == StatusCode::METHOD_NOT_ALLOWED => {
            "this path does not take this method; the Allow header lists those it takes".to_owned()
        }
        "" => status.canonical_reason().unwrap_or("error").to_owned(),
        text => text.to_owned(),
    };
    let title = status.canonical_reason().unwrap_or("Error");
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    Response::from_parts(
        parts,
        Problem::new(status, title, detail)
            .into_http::<axum::body::Body>()
            .into_body(),
    )
}

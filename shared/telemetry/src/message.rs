//! What the layers read off a request and its answer, in the terms of the OpenTelemetry semantic
//! conventions.

use http::{HeaderMap, Method, Response, Uri};

pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get("content-type")
        .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"))
}

/// The gRPC status of a gRPC answer (0 when it travels in the trailers: a success), or the HTTP
/// status of any other answer.
pub(crate) fn status_code<B>(response: &Response<B>) -> i64 {
    if !is_grpc(response.headers()) {
        return i64::from(response.status().as_u16());
    }
    response
        .headers()
        .get("grpc-status")
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.parse().ok())
        .unwrap_or(0)
}

/// The `rpc.service` and `rpc.method` of a gRPC path, `/orders.v1.Orders/CreateOrder`: the
/// service's full name and the method's name (the whole path and nothing, if it has no such form).
pub(crate) fn grpc_method(path: &str) -> (&str, &str) {
    let path = path.strip_prefix('/').unwrap_or(path);
    path.rsplit_once('/').unwrap_or((path, ""))
}

/// Whether a server's gRPC status is a fault of the server, and so marks its span as an error:
/// UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS. The rest (a
/// refused argument, a missing order, a quota) are the caller's; a client's span is an error on
/// any status but OK.
pub(crate) fn is_server_error(code: i64) -> bool {
    matches!(code, 2 | 4 | 12 | 13 | 14 | 15)
}

/// The `http.request.method` of `method`: its name when it is one of the HTTP standard's,
/// `_OTHER` otherwise, so that a client cannot make up a value per request.
pub(crate) fn http_method(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        Method::PATCH => "PATCH",
        Method::CONNECT => "CONNECT",
        Method::TRACE => "TRACE",
        _ => "_OTHER",
    }
}

/// The `url.scheme` of a request a server received.
pub(crate) fn url_scheme(uri: &Uri) -> &'static str {
    if uri.scheme_str() == Some("https") {
        "https"
    } else {
        "http"
    }
}

/// The `server.address` and `server.port` a client dials at `uri` (the port its scheme implies
/// when it names none).
pub(crate) fn server_address(uri: &Uri) -> (std::sync::Arc<str>, u16) {
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("https") {
            443
        } else {
            80
        });
    (uri.host().unwrap_or_default().into(), port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grpc_path_names_the_service_and_the_method() {
        assert_eq!(
            grpc_method("/orders.v1.Orders/CreateOrder"),
            ("orders.v1.Orders", "CreateOrder")
        );
        assert_eq!(
            grpc_method("/grpc.health.v1.Health/Check"),
            ("grpc.health.v1.Health", "Check")
        );
        assert_eq!(grpc_method("/unshaped"), ("unshaped", ""));
    }

    #[test]
    fn only_the_servers_own_faults_mark_a_server_span() {
        let faults: Vec<i64> = (0..=16).filter(|code| is_server_error(*code)).collect();
        // UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS.
        assert_eq!(faults, [2, 4, 12, 13, 14, 15]);
    }

    #[test]
    fn a_client_reports_the_address_and_port_it_dials() {
        let (address, port) = server_address(&"https://payment:50053".parse().unwrap());
        assert_eq!((&*address, port), ("payment", 50053));
        assert_eq!(server_address(&"http://127.0.0.1".parse().unwrap()).1, 80);
        assert_eq!(http_method(&Method::from_bytes(b"BREW").unwrap()), "_OTHER");
    }
}

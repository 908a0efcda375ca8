use std::{convert::Infallible, net::SocketAddr, sync::Arc};

use axum::extract::ConnectInfo;
use tower::{Layer, ServiceExt, service_fn};

use super::*;

fn policy() -> Policy {
    Policy::new()
        .allow_for_clients("gateway", &["/orders.v1.Orders/*"])
        .allow("payment", &["/bank.v1.Bank/Charge"])
        .allow_operator()
}

#[test]
fn a_caller_without_a_certificate_is_unauthenticated() {
    assert_eq!(
        policy().decide(None, "/orders.v1.Orders/GetOrder"),
        Err(Refusal::NoCertificate)
    );
    assert_eq!(
        tonic::Status::from(&Refusal::NoCertificate).code(),
        tonic::Code::Unauthenticated
    );
}

#[test]
fn a_caller_is_held_to_its_methods() {
    let policy = policy();
    assert_eq!(
        policy.decide(Some("gateway"), "/orders.v1.Orders/CreateOrder"),
        Ok(Admitted {
            speaks_for_clients: true
        })
    );
    assert_eq!(
        policy.decide(Some("payment"), "/bank.v1.Bank/Charge"),
        Ok(Admitted {
            speaks_for_clients: false
        })
    );
    let refused = policy
        .decide(Some("payment"), "/orders.v1.Orders/CreateOrder")
        .unwrap_err();
    assert_eq!(
        tonic::Status::from(&refused).code(),
        tonic::Code::PermissionDenied
    );
    // A wildcard covers one service's methods, not a longer path that starts the same way.
    assert!(
        policy
            .decide(Some("gateway"), "/orders.v1.Orders/x/y")
            .is_err()
    );
    assert!(
        policy
            .decide(Some("gateway"), "/orders.v1.OrdersAdmin/Drop")
            .is_err()
    );
    assert!(
        policy
            .decide(Some("unknown"), "/orders.v1.Orders/GetOrder")
            .is_err()
    );
}

#[test]
fn the_operator_inspects_but_neither_reads_nor_writes() {
    let policy = policy();
    for path in [
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.health.v1.Health/Check",
    ] {
        assert_eq!(
            policy.decide(Some("operator"), path),
            Ok(Admitted {
                speaks_for_clients: false
            }),
            "{path}"
        );
    }
    for path in [
        "/orders.v1.Orders/GetOrder",
        "/orders.v1.Orders/CreateOrder",
        "/metrics",
    ] {
        assert!(policy.decide(Some("operator"), path).is_err(), "{path}");
    }
}

#[test]
fn every_service_of_the_chain_may_ask_for_health() {
    assert!(
        policy()
            .decide(Some("payment"), "/grpc.health.v1.Health/Check")
            .is_ok()
    );
    assert!(
        policy()
            .decide(None, "/grpc.health.v1.Health/Check")
            .is_err()
    );
}

/// Calls `policy` through the layer as `caller`, returning the answer's gRPC status (0 when the
/// inner service answered) and the client id the inner service saw.
async fn call(caller: Option<&str>, path: &str) -> (String, Option<String>) {
    let (response, client) = call_with(caller, path, "application/grpc").await;
    (
        response
            .headers()
            .get("grpc-status")
            .map_or("0".to_owned(), |v| v.to_str().unwrap().to_owned()),
        client,
    )
}

/// Calls `policy` through the layer as `caller`, with `content_type`: the answer, and the client
/// id the inner service saw.
async fn call_with(
    caller: Option<&str>,
    path: &str,
    content_type: &str,
) -> (http::Response<String>, Option<String>) {
    let seen = Arc::new(std::sync::Mutex::new(None));
    let record = seen.clone();
    let inner = service_fn(move |request: http::Request<()>| {
        let client = request
            .headers()
            .get(CLIENT_ID)
            .map(|v| v.to_str().unwrap().to_owned());
        *record.lock().unwrap() = client;
        async { Ok::<_, Infallible>(http::Response::new(String::new())) }
    });
    let mut request = http::Request::builder()
        .uri(path)
        .header(CLIENT_ID, "demo-client-1")
        .header("content-type", content_type)
        .body(())
        .unwrap();
    let peer = Peer {
        addr: SocketAddr::from(([127, 0, 0, 1], 1)),
        identity: caller.map(Arc::from),
    };
    request.extensions_mut().insert(ConnectInfo(peer));
    let response = AuthorizeLayer::new(policy())
        .layer(inner)
        .oneshot(request)
        .await
        .unwrap();
    let client = seen.lock().unwrap().clone();
    (response, client)
}

#[tokio::test]
async fn the_client_id_is_believed_only_from_a_caller_that_speaks_for_clients() {
    assert_eq!(
        call(Some("gateway"), "/orders.v1.Orders/GetOrder").await,
        ("0".to_owned(), Some("demo-client-1".to_owned()))
    );
    assert_eq!(
        call(Some("payment"), "/bank.v1.Bank/Charge").await,
        ("0".to_owned(), None)
    );
}

#[tokio::test]
async fn refusals_are_answered_before_the_service_runs() {
    assert_eq!(
        call(None, "/orders.v1.Orders/GetOrder").await,
        ((tonic::Code::Unauthenticated as i32).to_string(), None)
    );
    assert_eq!(
        call(Some("payment"), "/orders.v1.Orders/GetOrder").await,
        ((tonic::Code::PermissionDenied as i32).to_string(), None)
    );
}

#[tokio::test]
async fn a_refused_plain_http_request_gets_an_http_status() {
    let (unauthenticated, _) = call_with(None, "/metrics", "text/plain").await;
    assert_eq!(
        (
            unauthenticated.status(),
            unauthenticated.headers().get("grpc-status")
        ),
        (http::StatusCode::UNAUTHORIZED, None)
    );
    let (forbidden, _) = call_with(Some("payment"), "/metrics", "text/plain").await;
    assert_eq!(forbidden.status(), http::StatusCode::FORBIDDEN);
}

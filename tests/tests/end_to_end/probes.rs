//! Probes that mean what they say: from the start of a stop, readiness says NOT_SERVING (on the
//! operations port and over `grpc.health.v1`) while the service still answers, until its port
//! closes at the end of the drain.

use std::time::{Duration, Instant};

use e2e::{TestChain, order_body};
use rpc::{health::HealthError, tls::ServiceTls};
use stack::chain::{ORDERS_GRPC, ORDERS_OPS};
use test_support::eventually;

/// Long enough for the checks below, made one after the other, to fall inside it.
const DRAIN: Duration = Duration::from_secs(5);

#[tokio::test]
async fn a_draining_service_says_not_serving_until_its_port_closes() {
    let test = TestChain::start_with(|s| s.orders.ops.drain_ms = DRAIN.as_millis() as u64).await;
    let (grpc, ops) = (
        test.chain.address(&ORDERS_GRPC),
        test.chain.address(&ORDERS_OPS),
    );
    let readiness = || async {
        test.http
            .get(format!("http://{ops}/readyz"))
            .send()
            .await
            .map(|answer| answer.status().as_u16())
    };
    let tls = ServiceTls::load("gateway", &test.certs().settings("gateway")).unwrap();
    let health = || rpc::health::check_as(grpc, "orders", &tls, Duration::from_secs(5));
    assert_eq!(readiness().await.unwrap(), 200);
    health().await.expect("SERVING before the stop");

    let stopped = Instant::now();
    assert!(test.chain.stop_service("orders"));
    eventually(DRAIN, "readiness says draining", || async {
        readiness().await.is_ok_and(|status| status == 503)
    })
    .await;
    let not_serving = health()
        .await
        .expect_err("NOT_SERVING once the drain started");
    assert!(
        matches!(not_serving, HealthError::NotServing { .. }),
        "{not_serving}"
    );
    // Whoever has not heard yet is still answered.
    let created = test
        .post_order("while-draining", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    assert!(
        stopped.elapsed() < DRAIN,
        "every check above ran within the drain: {:?}",
        stopped.elapsed()
    );

    eventually(DRAIN * 3, "orders' port closes after the drain", || async {
        tokio::net::TcpStream::connect(grpc).await.is_err()
    })
    .await;
    assert!(
        stopped.elapsed() >= DRAIN,
        "not before the drain ended: {:?}",
        stopped.elapsed()
    );
    eventually(DRAIN, "the operations port closes after it", || async {
        tokio::net::TcpStream::connect(ops).await.is_err()
    })
    .await;
}

//! Deadlines under faults: the chain stops at the deadline, answers DEADLINE_EXCEEDED (504), and a
//! hop with too little budget does not call the next one.

use std::time::{Duration, Instant};

use bank_mock::Faults;
use deadline::ledger;
use e2e::{BACKGROUND, TestChain, eventually, grpc_request, order_body, order_message};
use stack::chain::{BANK_GRPC, GATEWAY_HTTP, ORDERS_GRPC, PAYMENT_GRPC};
use tonic::Code;

/// Ample room above a deadline for scheduling on a loaded 2-core machine.
const SLACK: Duration = Duration::from_millis(750);

#[tokio::test]
async fn with_the_bank_hanging_http_gets_504_by_the_deadline_and_no_hop_works_past_it() {
    let test = TestChain::start().await;
    test.set_faults(Faults {
        hang: true,
        ..Faults::default()
    });

    let started = Instant::now();
    let response = test
        .post_order("hang-1", &order_body())
        .header("x-request-timeout-ms", "500")
        .send()
        .await
        .unwrap();
    let elapsed = started.elapsed();

    assert_eq!(response.status(), 504);
    assert!(
        elapsed < Duration::from_millis(500) + SLACK,
        "answered after {elapsed:?}"
    );
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let entries =
        ledger::parse(response.headers()[wire::DEADLINE_LEDGER].to_str().unwrap()).unwrap();
    assert_eq!(
        entries[0].received,
        Duration::from_millis(500),
        "the client's shorter deadline is used"
    );

    // Once the bank's hanging work has been stopped (its deadline ended it, or its caller went
    // away), every hop is done with the request: nothing may have finished after its deadline.
    eventually(BACKGROUND, "the bank's hanging work stopped", || async {
        let bank = test.chain.hop_stats()[&BANK_GRPC];
        bank.expired + bank.abandoned >= 1
    })
    .await;
    let bank = test.chain.bank().stats();
    assert_eq!(
        (bank.calls, bank.hung, bank.charges, bank.late_completions),
        (1, 1, 0, 0)
    );
    let hops = test.chain.hop_stats();
    for (hop, stats) in [
        ("gateway", hops[&GATEWAY_HTTP]),
        ("orders", hops[&ORDERS_GRPC]),
        ("payment", hops[&PAYMENT_GRPC]),
        ("bank-mock", hops[&BANK_GRPC]),
    ] {
        assert_eq!(stats.requests, 1, "{hop}");
        assert_eq!(
            stats.finished_late, 0,
            "{hop} finished work after its deadline"
        );
    }
    assert_eq!(
        hops[&BANK_GRPC].expired + hops[&BANK_GRPC].abandoned,
        1,
        "the bank's hanging work was stopped"
    );
}

#[tokio::test]
async fn over_grpc_the_client_sees_deadline_exceeded_whichever_hop_runs_out() {
    // Default reserves; no reserve at payment (its bank call ends with its own deadline); and
    // none at orders either (orders, payment and the bank run out together).
    type Setup = fn(&mut stack::ChainSettings);
    let setups: [(&str, Setup); 3] = [
        ("default reserves", |_| {}),
        ("payment keeps nothing", |s| {
            s.payment.bank.deadline.reserve_ms = 0;
            s.payment.bank.deadline.cap_ms = None;
        }),
        ("orders and payment keep nothing", |s| {
            s.payment.bank.deadline.reserve_ms = 0;
            s.payment.bank.deadline.cap_ms = None;
            s.orders.payment.deadline.reserve_ms = 0;
        }),
    ];
    for (name, setup) in setups {
        let test = TestChain::start_with(setup).await;
        test.set_faults(Faults {
            hang: true,
            ..Faults::default()
        });
        let mut gateway = test.grpc_gateway().await;
        for (attempt, timeout_ms) in [200u64, 500, 900].into_iter().enumerate() {
            let mut request = grpc_request(order_message(), &format!("grpc-hang-{attempt}"));
            request.set_timeout(Duration::from_millis(timeout_ms));
            let started = Instant::now();
            let status = gateway.create_order(request).await.unwrap_err();
            assert_eq!(
                status.code(),
                Code::DeadlineExceeded,
                "{name}, {timeout_ms} ms: {status:?}"
            );
            assert!(
                started.elapsed() < Duration::from_millis(timeout_ms) + SLACK,
                "{name}: {:?}",
                started.elapsed()
            );
            assert!(
                status.metadata().get(wire::DEADLINE_LEDGER).is_some(),
                "{name}: the error carries the ledger"
            );
        }
    }
}

#[tokio::test]
async fn inner_hops_called_directly_also_answer_deadline_exceeded() {
    use proto::{
        orders::v1::orders_client::OrdersClient,
        payment::v1::{PayRequest, payment_service_client::PaymentServiceClient},
    };

    let test = TestChain::start().await;
    test.set_faults(Faults {
        hang: true,
        ..Faults::default()
    });
    let a = test.chain.addresses();

    let mut orders = OrdersClient::new(test.channel_as("gateway", "orders", a[&ORDERS_GRPC]).await);
    let mut request = grpc_request(order_message(), "direct-orders");
    request
        .metadata_mut()
        .insert("x-client-id", "direct".parse().unwrap());
    request.set_timeout(Duration::from_millis(300));
    assert_eq!(
        orders.create_order(request).await.unwrap_err().code(),
        Code::DeadlineExceeded
    );

    let mut payment =
        PaymentServiceClient::new(test.channel_as("orders", "payment", a[&PAYMENT_GRPC]).await);
    let pay = PayRequest {
        order_id: "ord_direct".into(),
        customer_id: "c-1".into(),
        amount_minor: 100,
        currency: "EUR".into(),
    };
    let mut request = grpc_request(pay, "direct-payment");
    request.set_timeout(Duration::from_millis(300));
    assert_eq!(
        payment.pay(request).await.unwrap_err().code(),
        Code::DeadlineExceeded
    );
}

#[tokio::test]
async fn a_hop_with_less_budget_than_the_next_call_needs_does_not_make_it() {
    let test = TestChain::start_with(|s| s.payment.bank.deadline.min_forward_ms = 5_000).await;

    let response = test
        .post_order("too-little-1", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 504);
    let problem: serde_json::Value = response.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap();
    for needle in ["payment", "bank-mock", "minimum of 5000", "not calling"] {
        assert!(detail.contains(needle), "detail names {needle:?}: {detail}");
    }

    let mut gateway = test.grpc_gateway().await;
    let status = gateway
        .create_order(grpc_request(order_message(), "too-little-2"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert!(status.message().contains("minimum of 5000"), "{status:?}");

    assert_eq!(
        test.chain.bank().stats().calls,
        0,
        "the bank was never called"
    );
    assert_eq!(test.chain.hop_stats()[&PAYMENT_GRPC].failed_fast, 2);
}

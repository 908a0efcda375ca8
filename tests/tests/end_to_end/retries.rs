//! Retries happen only at the gateway, only for failures a retry can fix, only within the deadline,
//! and exactly when the server's pushback says.

use std::time::{Duration, Instant};

use bank_mock::{Faults, Latency};
use e2e::{BACKGROUND, TestChain, eventually, fast_bank, grpc_request, order_body, order_message};
use stack::chain::{ORDERS_GRPC, PAYMENT_GRPC};

#[tokio::test]
async fn inner_hops_send_each_call_once_under_every_fault() {
    // Gateway retries off: every user request must reach the bank at most once.
    let test = TestChain::start_with(|s| s.gateway.retry.max_attempts = 1).await;
    let cases: Vec<(&str, Faults)> = vec![
        ("unavailable", fast_bank(|f| f.error_rate = 1.0)),
        (
            "resource exhausted",
            fast_bank(|f| {
                f.resource_exhausted_rate = 1.0;
                f.pushback_ms = 10;
            }),
        ),
        ("reply lost", fast_bank(|f| f.drop_reply_rate = 1.0)),
        ("declined", fast_bank(|f| f.decline_rate = 1.0)),
        ("hang", fast_bank(|f| f.hang = true)),
        (
            "slow",
            fast_bank(|f| {
                f.latency_ms = Latency {
                    mean: 2_000.0,
                    stddev: 0.0,
                }
            }),
        ),
    ];
    for (index, (name, fault)) in cases.into_iter().enumerate() {
        test.chain.bank().reset();
        test.set_faults(fault);
        let before = test.chain.hop_stats();
        let response = test
            .post_order(&format!("once-{index}"), &order_body())
            .header("x-request-timeout-ms", "400")
            .send()
            .await
            .unwrap();
        assert!(
            !response.status().is_success(),
            "{name}: {}",
            response.status()
        );
        let after = test.chain.hop_stats();
        assert_eq!(
            after[&ORDERS_GRPC].requests - before[&ORDERS_GRPC].requests,
            1,
            "{name}: orders called once"
        );
        assert_eq!(
            after[&PAYMENT_GRPC].requests - before[&PAYMENT_GRPC].requests,
            1,
            "{name}: payment called once"
        );
        assert_eq!(
            test.chain.bank().stats().calls,
            1,
            "{name}: the bank called once"
        );
    }
}

#[tokio::test]
async fn each_gateway_attempt_is_exactly_one_bank_call_marked_with_its_number() {
    let test = TestChain::start().await;
    test.set_faults(fast_bank(|f| f.error_rate = 1.0));
    let response = test
        .post_order("marked-1", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let bank = test.chain.bank().stats();
    let retry = test.chain.retry_stats();
    assert_eq!(retry.requests, 1);
    assert_eq!(
        bank.calls,
        1 + retry.retries,
        "one bank call per gateway attempt"
    );
    assert_eq!(
        bank.retried_calls, retry.retries,
        "retries arrive marked with grpc-previous-rpc-attempts"
    );
    assert_eq!(
        bank.distinct_keys, 1,
        "every attempt carries the same derived key"
    );
    assert!(
        retry.retries >= 1,
        "the budget's floor allows a retry at low traffic: {retry:?}"
    );
}

#[tokio::test]
async fn failures_a_retry_cannot_fix_are_not_retried() {
    let test = TestChain::start().await;
    // NOT_FOUND.
    let missing = test
        .http
        .get(test.url("/v1/orders/ord_missing"))
        .bearer_auth(e2e::API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(test.chain.hop_stats()[&ORDERS_GRPC].requests, 1);

    // FAILED_PRECONDITION: a reused key with another body.
    assert_eq!(
        test.post_order("reused-1", &order_body())
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
    let mut other = order_body();
    other["amount_minor"] = 7.into();
    assert_eq!(
        test.post_order("reused-1", &other)
            .send()
            .await
            .unwrap()
            .status(),
        422
    );
    assert_eq!(test.chain.hop_stats()[&ORDERS_GRPC].requests, 3);

    // A declined payment is an answer, not a failure.
    test.set_faults(fast_bank(|f| f.decline_rate = 1.0));
    assert_eq!(
        test.post_order("declined-2", &order_body())
            .send()
            .await
            .unwrap()
            .status(),
        402
    );
    assert_eq!(test.chain.hop_stats()[&ORDERS_GRPC].requests, 4);
    assert_eq!(test.chain.retry_stats().retries, 0);
}

#[tokio::test]
async fn no_retry_starts_when_the_deadline_cannot_hold_it() {
    // Attempts are known to need at least 600 ms; the bank fails after 300 ms.
    let test = TestChain::start_with(|s| s.gateway.retry.min_attempt_ms = 600).await;
    test.set_faults(fast_bank(|f| {
        f.error_rate = 1.0;
        f.latency_ms = Latency {
            mean: 300.0,
            stddev: 0.0,
        };
    }));

    // 1 s: after the first failure ~700 ms are left, less than a backoff (≥ 200 ms) plus 600 ms.
    let response = test
        .post_order("tight-1", &order_body())
        .header("x-request-timeout-ms", "1000")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(test.chain.bank().stats().calls, 1);
    let retry = test.chain.retry_stats();
    assert_eq!((retry.retries, retry.stopped_deadline), (0, 1), "{retry:?}");

    // 1.7 s: ~1400 ms left after the first failure hold a backoff (< 400 ms) plus 600 ms, with
    // some 400 ms to spare for a slow machine; after the second at most 900 ms are left, too
    // little for a backoff of at least 400 ms plus 600 ms. (The exact arithmetic of the gate is
    // unit-tested on a paused clock in `resilience`'s retry_policy tests.)
    let response = test
        .post_order("roomy-1", &order_body())
        .header("x-request-timeout-ms", "1700")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let retry = test.chain.retry_stats();
    assert_eq!((retry.retries, retry.stopped_deadline), (1, 2), "{retry:?}");
}

#[tokio::test]
async fn a_pushback_longer_than_the_deadline_ends_the_call_at_once_with_retry_after() {
    let test = TestChain::start().await;
    test.set_faults(fast_bank(|f| {
        f.resource_exhausted_rate = 1.0;
        f.pushback_ms = 5_000;
    }));
    let started = Instant::now();
    let response = test
        .post_order("pushback-1", &order_body())
        .header("x-request-timeout-ms", "1000")
        .send()
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "answered at once: {:?}",
        started.elapsed()
    );
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "5");
    assert_eq!(test.chain.bank().stats().calls, 1);
    assert_eq!(test.chain.retry_stats().stopped_pushback, 1);
}

#[tokio::test]
async fn a_pushback_that_fits_is_waited_exactly_and_the_retry_succeeds() {
    let test = TestChain::start().await;
    test.set_faults(fast_bank(|f| {
        f.resource_exhausted_rate = 1.0;
        f.pushback_ms = 300;
    }));
    let bank = test.chain.bank();
    let request = test.post_order("pushback-2", &order_body()).send();
    let heal = async {
        // Let the first attempt be refused, then let the bank recover before the pushback ends.
        eventually(
            BACKGROUND,
            "the first attempt refused by the bank",
            || async { bank.stats().calls > 0 },
        )
        .await;
        bank.update_faults(|f| f.resource_exhausted_rate = 0.0);
    };
    let started = Instant::now();
    let (response, ()) = tokio::join!(request, heal);
    let elapsed = started.elapsed();
    assert_eq!(response.unwrap().status(), 201);
    assert!(
        elapsed >= Duration::from_millis(300),
        "the retry waited the pushback: {elapsed:?}"
    );
    assert_eq!(bank.stats().calls, 2);
}

#[tokio::test]
async fn a_grpc_client_is_told_not_to_retry_what_the_gateway_stopped_retrying() {
    let test = TestChain::start().await;
    test.set_faults(fast_bank(|f| f.error_rate = 1.0));
    let mut gateway = test.grpc_gateway().await;
    let failure = gateway
        .create_order(grpc_request(order_message(), "spent-1"))
        .await
        .unwrap_err();
    assert_eq!(failure.code(), tonic::Code::Unavailable);
    let retry = test.chain.retry_stats();
    assert_eq!(
        retry.stopped_attempts + retry.stopped_budget,
        1,
        "the gateway stopped for its limits: {retry:?}"
    );
    assert_eq!(
        failure.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "-1",
        "{failure:?}"
    );
    assert!(
        failure.metadata().get("x-retries-spent").is_none(),
        "the mark stays inside the chain"
    );

    // Over HTTP, a Retry-After only where a wait means something: none here.
    let response = test
        .post_order("spent-2", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert!(response.headers().get("retry-after").is_none());
}

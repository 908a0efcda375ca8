//! Circuit breakers and bulkheads: a neighbour that is down or slow stays its own problem.

use std::time::{Duration, Instant};

use bank_mock::Latency;
use e2e::{BACKGROUND, TestChain, eventually, fast_bank, grpc_request, order_body};
use proto::payment::v1::{PayRequest, payment_service_client::PaymentServiceClient};
use resilience::{breaker::Position, rate_limit::QuotaSettings};
use stack::chain::{GATEWAY_HTTP, ORDERS_GRPC, ORDERS_OPS, PAYMENT_GRPC};
use tonic::Code;

/// How long the breakers of these tests stay open: long enough for a dozen loopback calls on a
/// loaded machine, short enough to wait out twice. The timing itself (jitter, the half-open
/// probes) is unit-tested on a paused clock in `resilience::breaker`.
const OPEN_MS: u64 = 2_000;

/// A breaker that judges after 5 calls and stays open for [`OPEN_MS`]; gateway retries off, so
/// that every user request is one call.
fn small_breaker(settings: &mut stack::ChainSettings) {
    let breaker = &mut settings.payment.bank.breaker;
    breaker.window_calls = 10;
    breaker.min_calls = 5;
    breaker.open_ms = OPEN_MS;
    breaker.half_open_probes = 2;
    settings.gateway.retry.max_attempts = 1;
}

#[tokio::test]
async fn the_breaker_opens_fails_fast_without_calling_then_probes_and_closes() {
    let test = TestChain::start_with(small_breaker).await;
    test.set_faults(fast_bank(|f| f.error_rate = 1.0));
    for n in 0..5 {
        let response = test
            .post_order(&format!("down-{n}"), &order_body())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 503);
    }
    assert_eq!(
        test.chain
            .guard_stats()
            .breaker(payment::HOP, bank_mock::HOP)
            .position,
        Position::Open
    );
    let calls = test.chain.bank().stats().calls;

    // Open: answered at once, without reaching the bank, with the time until it probes again.
    let response = test
        .post_order("down-open", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    let mut payment = PaymentServiceClient::new(
        test.channel_as("orders", "payment", test.chain.address(&PAYMENT_GRPC))
            .await,
    );
    for n in 0..10 {
        let pay = PayRequest {
            order_id: format!("ord_direct_{n}"),
            customer_id: "c".into(),
            amount_minor: 100,
            currency: "EUR".into(),
        };
        let status = payment
            .pay(grpc_request(pay, &format!("direct-{n}")))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert!(status.metadata().contains_key("x-circuit-open"));
    }
    // Failing fast is not calling: the bank's count is the proof, not a stopwatch (the breaker's
    // own latency is in BENCHMARKS.md).
    assert_eq!(
        test.chain.bank().stats().calls,
        calls,
        "the bank was not called while open"
    );

    // Still failing when it half-opens, after the wait it names (what is left of OPEN_MS ± 20 %):
    // a probe fails and it opens again, for as long. (Orders keeps the wait of the refusal it
    // relayed, counted from when it got it: the margin covers that answer's way up.)
    let wait = pushback_of_the_bank_breaker(&mut payment, "direct-first-wait").await;
    let longest = OPEN_MS * 6 / 5;
    assert!(wait.as_millis() as u64 <= longest, "{wait:?}");
    tokio::time::sleep(wait + ANSWER_WAY_UP).await;
    test.post_order("down-probe", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(
        test.chain
            .guard_stats()
            .breaker(payment::HOP, bank_mock::HOP)
            .position,
        Position::Open
    );
    assert_eq!(
        test.chain.bank().stats().calls,
        calls + 1,
        "one probe went through"
    );
    let wait = pushback_of_the_bank_breaker(&mut payment, "direct-second-wait").await;
    assert!(
        (OPEN_MS * 4 / 5 - ANSWER_WAY_UP.as_millis() as u64..=longest)
            .contains(&(wait.as_millis() as u64)),
        "no longer than the first: {wait:?}"
    );

    // Healthy again: the probes succeed and it closes.
    test.set_faults(fast_bank(|_| {}));
    tokio::time::sleep(wait + ANSWER_WAY_UP).await;
    for n in 0..2 {
        assert_eq!(
            test.post_order(&format!("healed-{n}"), &order_body())
                .send()
                .await
                .unwrap()
                .status(),
            201
        );
    }
    let breaker = test
        .chain
        .guard_stats()
        .breaker(payment::HOP, bank_mock::HOP);
    assert_eq!(breaker.position, Position::Closed, "{breaker:?}");
    assert_eq!(
        (breaker.opened, breaker.half_opened, breaker.closed),
        (2, 2, 1),
        "{breaker:?}"
    );
}

/// An outage long enough for an open time that doubled with each failed probe to have grown from
/// 200 ms to 6.4 s (200, 400, … 3200 ms of failed probes before it): the breaker probes every
/// 200 ms (± 20 %) throughout, so creates succeed again within 2 s of the bank's recovery, not
/// after the longest open time.
#[tokio::test]
async fn after_a_long_outage_creates_succeed_again_within_two_seconds_of_the_recovery() {
    let test = TestChain::start_with(|s| {
        small_breaker(s);
        s.payment.bank.breaker.open_ms = 200;
    })
    .await;
    test.set_faults(fast_bank(|f| f.error_rate = 1.0));
    let outage = Instant::now();
    let mut sent = 0;
    while outage.elapsed() < Duration::from_secs(7) {
        test.post_order(&format!("outage-{sent}"), &order_body())
            .send()
            .await
            .unwrap();
        sent += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let breaker = test
        .chain
        .guard_stats()
        .breaker(payment::HOP, bank_mock::HOP);
    assert!(
        breaker.opened >= 5,
        "opened by failed probes throughout the outage: {breaker:?}"
    );

    test.set_faults(fast_bank(|_| {}));
    let recovered = Instant::now();
    let mut attempt = 0;
    eventually(
        Duration::from_secs(2),
        "a create paid after the bank's recovery",
        || {
            attempt += 1;
            let request = test.post_order(&format!("recovered-{attempt}"), &order_body());
            async move { request.send().await.unwrap().status() == 201 }
        },
    )
    .await;
    assert!(
        recovered.elapsed() < Duration::from_secs(2),
        "{:?}",
        recovered.elapsed()
    );
}

/// One client, at its own quota, sends requests whose text would make an error larger than the
/// gateway's HTTP/2 client accepts (a 20,000-character event type, a 7,000-character endpoint
/// id): they are refused at the edge, and the other client's creates all succeed, with the
/// gateway's breaker toward orders closed throughout.
#[tokio::test]
async fn one_clients_crafted_requests_cannot_move_another_clients_success_rate() {
    let test = TestChain::start().await;
    let crafted = "x".repeat(20_000);
    let mut paid = 0;
    for n in 0..10 {
        let body = serde_json::json!({"url": "https://hooks.example.com/in", "event_types": [crafted.as_str()]});
        let refused = test
            .post_as(
                "demo-key-2",
                "/v1/webhooks/endpoints",
                &format!("crafted-{n}"),
                &body,
            )
            .send()
            .await
            .unwrap();
        assert!(
            matches!(refused.status().as_u16(), 400 | 429),
            "{refused:?}"
        );
        let path = format!("/v1/webhooks/endpoints/{}", &crafted[..7_000]);
        let refused = test.get_as("demo-key-2", &path).send().await.unwrap();
        assert!(
            matches!(refused.status().as_u16(), 400 | 429),
            "{refused:?}"
        );
        let created = test
            .post_order(&format!("innocent-{n}"), &order_body())
            .send()
            .await
            .unwrap();
        paid += usize::from(created.status() == 201);
    }
    assert_eq!(paid, 10, "the other client's creates all succeed");
    let breaker = test.chain.guard_stats().breaker(gateway::HOP, orders::HOP);
    assert_eq!(
        (breaker.position, breaker.opened),
        (Position::Closed, 0),
        "{breaker:?}"
    );
}

/// More than an answer takes from payment up to orders on a loaded machine.
const ANSWER_WAY_UP: Duration = Duration::from_millis(100);

#[tokio::test]
async fn an_open_circuit_below_payment_refuses_creates_before_orders_writes() {
    let test = TestChain::start_with(|s| {
        small_breaker(s);
        // Open for the whole test, however slow the machine.
        s.payment.bank.breaker.open_ms = 60_000;
    })
    .await;
    let paid = test
        .post_order("paid-before", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(paid.status(), 201);
    let paid = paid.bytes().await.unwrap();
    test.set_faults(fast_bank(|f| f.error_rate = 1.0));
    for n in 0..5 {
        test.post_order(&format!("opening-{n}"), &order_body())
            .send()
            .await
            .unwrap();
    }
    // The first create after it opened reaches payment, whose breaker refuses it; orders keeps the
    // wait payment named.
    let refused = test
        .post_order("first-refused", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    let (orders, keys) = (
        test.count_rows("orders").await,
        test.count_rows("idempotency_keys").await,
    );
    let payment_calls = test.chain.hop_stats()[&PAYMENT_GRPC].requests;

    for n in 0..5 {
        let response = test
            .post_order(&format!("refused-{n}"), &order_body())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 503);
        let retry_after: u64 = response.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            (1..=72).contains(&retry_after),
            "what is left of the wait payment named (60 s ± 20 %): {retry_after} s"
        );
    }
    assert_eq!(
        test.chain.hop_stats()[&PAYMENT_GRPC].requests,
        payment_calls,
        "payment was not called"
    );
    assert_eq!(
        test.count_rows("orders").await,
        orders,
        "no order was written"
    );
    assert_eq!(
        test.count_rows("idempotency_keys").await,
        keys,
        "no key was claimed"
    );

    // A create that finished before still gets its answer, byte for byte.
    let replayed = test
        .post_order("paid-before", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(replayed.status(), 201);
    assert_eq!(replayed.headers()["idempotent-replayed"], "true");
    assert_eq!(replayed.bytes().await.unwrap(), paid);
}

/// The wait that payment's open breaker toward the bank names in its pushback, asked directly.
async fn pushback_of_the_bank_breaker(
    payment: &mut PaymentServiceClient<tonic::transport::Channel>,
    key: &str,
) -> Duration {
    let pay = PayRequest {
        order_id: format!("ord_{key}"),
        customer_id: "c".into(),
        amount_minor: 100,
        currency: "EUR".into(),
    };
    let status = payment.pay(grpc_request(pay, key)).await.unwrap_err();
    assert!(
        status.metadata().contains_key("x-circuit-open"),
        "{status:?}"
    );
    Duration::from_millis(
        status
            .metadata()
            .get("grpc-retry-pushback-ms")
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap(),
    )
}

#[tokio::test]
async fn no_retry_goes_through_an_open_breaker() {
    let test = TestChain::start_with(|s| {
        small_breaker(s);
        s.gateway.retry.max_attempts = 3;
        // Open for the whole test, however slow the machine: no probe may reach the bank.
        s.payment.bank.breaker.open_ms = 60_000;
    })
    .await;
    test.set_faults(fast_bank(|f| f.error_rate = 1.0));
    for n in 0..8 {
        test.post_order(&format!("open-{n}"), &order_body())
            .send()
            .await
            .unwrap();
    }
    let calls = test.chain.bank().stats().calls;
    for n in 0..5 {
        assert_eq!(
            test.post_order(&format!("refused-{n}"), &order_body())
                .send()
                .await
                .unwrap()
                .status(),
            503
        );
    }
    assert_eq!(
        test.chain.bank().stats().calls,
        calls,
        "neither the attempts nor retries reached the bank"
    );
    assert!(
        test.chain.retry_stats().stopped_breaker >= 5,
        "{:?}",
        test.chain.retry_stats()
    );
}

#[tokio::test]
async fn resource_exhausted_never_opens_the_breaker_and_its_pushback_is_honoured() {
    let test = TestChain::start_with(small_breaker).await;
    test.set_faults(fast_bank(|f| {
        f.resource_exhausted_rate = 1.0;
        f.pushback_ms = 3_000;
    }));
    for n in 0..20 {
        let response = test
            .post_order(&format!("quota-{n}"), &order_body())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 429);
        assert_eq!(response.headers()["retry-after"], "3");
    }
    let breaker = test
        .chain
        .guard_stats()
        .breaker(payment::HOP, bank_mock::HOP);
    assert_eq!(
        (breaker.position, breaker.opened, breaker.judged_against),
        (Position::Closed, 0, 0),
        "{breaker:?}"
    );
    assert_eq!(
        test.chain.bank().stats().calls,
        20,
        "every call still reaches the bank"
    );
}

/// `count` creations sent at once in the background with a deadline of `timeout_ms`; each task
/// ends with its status.
fn creations_in_the_background(
    test: &std::sync::Arc<TestChain>,
    key_prefix: &str,
    count: usize,
    timeout_ms: u64,
) -> Vec<tokio::task::JoinHandle<reqwest::StatusCode>> {
    (0..count)
        .map(|n| {
            let (test, key) = (test.clone(), format!("{key_prefix}-{n}"));
            tokio::spawn(async move {
                test.post_order(&key, &order_body())
                    .header("x-request-timeout-ms", timeout_ms.to_string())
                    .send()
                    .await
                    .unwrap()
                    .status()
            })
        })
        .collect()
}

#[tokio::test]
async fn a_full_bulkhead_rejects_at_once_and_reads_stay_fast() {
    let test = std::sync::Arc::new(
        TestChain::start_with(|s| {
            s.payment.bank.max_concurrent = 2;
            s.gateway.retry.max_attempts = 1;
        })
        .await,
    );
    let created: serde_json::Value = test
        .post_order("read-me", &order_body())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let order_url = test.url(&format!(
        "/v1/orders/{}",
        created["order_id"].as_str().unwrap()
    ));

    test.set_faults(fast_bank(|f| f.hang = true));
    let hanging = creations_in_the_background(&test, "hang", 2, 1_500);
    eventually(
        BACKGROUND,
        "both hanging creations in the bulkhead",
        || async { test.chain.guard_stats().bank_bulkhead.in_flight >= 2 },
    )
    .await;

    let started = Instant::now();
    let rejected = test
        .post_order("over-the-limit", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(rejected.status(), 503);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "rejected at once, not queued: {:?}",
        started.elapsed()
    );
    assert_eq!(test.chain.guard_stats().bank_bulkhead.rejected, 1);

    for _ in 0..10 {
        let started = Instant::now();
        let read = test
            .http
            .get(&order_url)
            .bearer_auth(e2e::API_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(read.status(), 200);
        assert!(
            started.elapsed() < Duration::from_millis(250),
            "reads keep their latency: {:?}",
            started.elapsed()
        );
    }
    for task in hanging {
        assert_eq!(task.await.unwrap(), 504);
    }
}

#[tokio::test]
async fn long_operations_have_their_own_intake_and_reads_keep_theirs() {
    let test =
        std::sync::Arc::new(TestChain::start_with(|s| s.gateway.max_in_flight_creates = 2).await);
    let created: serde_json::Value = test
        .post_order("intake-read", &order_body())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let order_url = test.url(&format!(
        "/v1/orders/{}",
        created["order_id"].as_str().unwrap()
    ));

    test.set_faults(fast_bank(|f| f.hang = true));
    let hanging = creations_in_the_background(&test, "intake", 2, 1_000);
    eventually(BACKGROUND, "both creations hanging at the bank", || async {
        test.chain.bank().stats().hung >= 2
    })
    .await;
    let refused = test
        .post_order("intake-over", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    assert_eq!(
        test.chain.hop_stats()[&GATEWAY_HTTP].requests,
        4,
        "the seed, the two hanging creations and the refused one"
    );

    let read = test
        .http
        .get(&order_url)
        .bearer_auth(e2e::API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200, "reads are not behind the creations");
    for task in hanging {
        assert_eq!(task.await.unwrap(), 504);
    }
}

#[tokio::test]
async fn a_server_at_capacity_refuses_at_once_with_a_pushback_and_stays_live() {
    use proto::orders::v1::orders_client::OrdersClient;

    let test =
        std::sync::Arc::new(TestChain::start_with(|s| s.orders.deadline.max_in_flight = 1).await);
    test.set_faults(fast_bank(|f| f.hang = true));
    let [busy] = creations_in_the_background(&test, "busy", 1, 800)
        .try_into()
        .expect("one creation");
    eventually(
        BACKGROUND,
        "the busy creation hanging at the bank",
        || async { test.chain.bank().stats().hung >= 1 },
    )
    .await;
    let mut orders = OrdersClient::new(
        test.channel_as("gateway", "orders", test.chain.address(&ORDERS_GRPC))
            .await,
    );
    let mut request = grpc_request(e2e::order_message(), "at-capacity");
    request
        .metadata_mut()
        .insert("x-client-id", "direct".parse().unwrap());
    let status = orders.create_order(request).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let pushback: u64 = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let shortest = resilience::load_shed::PUSHBACK.as_millis() as u64;
    assert!(
        (shortest..2 * shortest).contains(&pushback),
        "jittered, never shorter than configured: {pushback}"
    );

    // Busy is not dead: health on the shedding port and liveness on the operations port still
    // answer, so no probe gets the service restarted for its load.
    let tls = rpc::tls::ServiceTls::load("gateway", &test.certs().settings("gateway")).unwrap();
    rpc::health::check_as(
        test.chain.address(&ORDERS_GRPC),
        "orders",
        &tls,
        Duration::from_secs(5),
    )
    .await
    .expect("SERVING while shedding");
    let alive = test
        .http
        .get(format!("http://{}/livez", test.chain.address(&ORDERS_OPS)))
        .send()
        .await
        .unwrap();
    assert_eq!(alive.status(), 200);
    assert_eq!(busy.await.unwrap(), 504);
}

/// Payment's breaker toward the bank judging after 5 recorded calls and staying open for the
/// rest of the test; gateway retries off, so that every user request is one bank call.
fn quick_verdict(settings: &mut stack::ChainSettings) {
    let breaker = &mut settings.payment.bank.breaker;
    breaker.window_calls = 10;
    breaker.min_calls = 5;
    breaker.open_ms = 60_000;
    settings.gateway.retry.max_attempts = 1;
}

/// Bounds every request of these tests, whatever the chain does.
const REQUEST_LIMIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn a_client_with_tiny_deadlines_cannot_open_the_bank_breaker_for_the_others() {
    let test = TestChain::start_with(quick_verdict).await;
    test.set_faults(fast_bank(|f| {
        f.latency_ms = Latency {
            mean: 180.0,
            stddev: 10.0,
        }
    }));

    // demo-key-2 (5/s, burst 10) sends 8 orders with 200 ms deadlines: the bank gets ~140 ms of
    // them, less than it takes (four standard deviations less), and far less than the 500 ms a
    // slice needs to be judged. Those expiries are the client's choice, not the bank's failures.
    // (With 100 ms, the syncs of the writes before the bank call took the bank's slice below its
    // minimum on a loaded machine: fail-fasts, which the breaker ignores too, but which would not
    // test it.)
    let mut expired = 0;
    for n in 0..8 {
        let response = test
            .http
            .post(test.url("/v1/orders"))
            .bearer_auth("demo-key-2")
            .header("idempotency-key", format!("tiny-{n}"))
            .header("x-request-timeout-ms", "200")
            .timeout(REQUEST_LIMIT)
            .json(&order_body())
            .send()
            .await
            .unwrap();
        assert!(
            matches!(response.status().as_u16(), 201 | 504),
            "{}",
            response.status()
        );
        expired += usize::from(response.status() == 504);
    }
    assert!(
        expired >= 5,
        "most expired at the bank (a quick draw of its latency may make it): {expired} of 8"
    );
    assert!(
        test.chain.bank().stats().calls >= 8,
        "the bank was called each time, no fail-fast: {:?}",
        test.chain.bank().stats()
    );
    let guards = test.chain.guard_stats();
    let breaker = guards.breaker(payment::HOP, bank_mock::HOP);
    assert_eq!(
        (breaker.position, breaker.opened, breaker.judged_against),
        (Position::Closed, 0, 0),
        "{breaker:?}"
    );

    // Another client's ordinary orders keep going through.
    for n in 0..5 {
        let response = test
            .post_order(&format!("ordinary-{n}"), &order_body())
            .timeout(REQUEST_LIMIT)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
    }
    for (edge, breaker) in test.chain.guard_stats().breakers() {
        assert_eq!(
            (breaker.position, breaker.opened),
            (Position::Closed, 0),
            "{edge}: {breaker:?}"
        );
    }
}

#[tokio::test]
async fn a_bank_slower_than_an_adequate_slice_still_opens_its_breaker() {
    let test = std::sync::Arc::new(TestChain::start_with(quick_verdict).await);
    // Beyond the ~1.48 s the bank gets of the default 2 s deadline.
    test.set_faults(fast_bank(|f| {
        f.latency_ms = Latency {
            mean: 1_600.0,
            stddev: 0.0,
        }
    }));
    let slow: Vec<_> = (0..5)
        .map(|n| {
            let test = test.clone();
            tokio::spawn(async move {
                test.post_order(&format!("slow-{n}"), &order_body())
                    .timeout(REQUEST_LIMIT)
                    .send()
                    .await
                    .unwrap()
                    .status()
            })
        })
        .collect();
    for request in slow {
        assert_eq!(request.await.unwrap(), 504);
    }
    for (edge, breaker) in test.chain.guard_stats().breakers() {
        // The expiry is the bank's, relayed above payment: the breakers further up stay closed.
        let expected = if edge.callee == bank_mock::HOP {
            Position::Open
        } else {
            Position::Closed
        };
        assert_eq!(breaker.position, expected, "{edge}: {breaker:?}");
    }

    let calls = test.chain.bank().stats().calls;
    let refused = test
        .post_order("slow-refused", &order_body())
        .timeout(REQUEST_LIMIT)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 503);
    assert_eq!(
        test.chain.bank().stats().calls,
        calls,
        "answered without calling the bank"
    );
}

#[tokio::test]
async fn a_bank_failing_every_call_opens_only_the_breaker_in_front_of_it() {
    let test = TestChain::start_with(e2e::touchy_bank_guards).await;
    test.set_faults(fast_bank(|f| f.error_rate = 1.0));
    for n in 0..20 {
        let response = test
            .post_order(&format!("failing-{n}"), &order_body())
            .timeout(REQUEST_LIMIT)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 503);
    }
    let guards = test.chain.guard_stats();
    let bank = guards.breaker(payment::HOP, bank_mock::HOP);
    assert_eq!(bank.position, Position::Open, "{bank:?}");
    // Above payment the failures arrive relayed (the bank's) or failed fast (payment's breaker):
    // neither says anything about payment or orders themselves.
    for (edge, breaker) in guards
        .breakers()
        .filter(|(edge, _)| edge.callee != bank_mock::HOP)
    {
        assert_eq!(
            (breaker.position, breaker.opened),
            (Position::Closed, 0),
            "{edge}: {breaker:?}"
        );
        assert_eq!(
            breaker.judged_against, 0,
            "{edge} counted none of them against its dependency: {breaker:?}"
        );
    }
}

#[tokio::test]
async fn payment_keeps_the_banks_quota_itself_and_the_breaker_stays_closed() {
    // The bank's quota as payment knows it: a burst of 2, then one call a second.
    let test = TestChain::start_with(|s| {
        s.payment.bank.quota = QuotaSettings {
            per_second: 1,
            burst: 2,
        };
        s.gateway.retry.max_attempts = 1;
    })
    .await;
    for n in 0..2 {
        assert_eq!(
            test.post_order(&format!("within-quota-{n}"), &order_body())
                .send()
                .await
                .unwrap()
                .status(),
            201
        );
    }
    let mut payment = PaymentServiceClient::new(
        test.channel_as("orders", "payment", test.chain.address(&PAYMENT_GRPC))
            .await,
    );
    let pay = PayRequest {
        order_id: "ord_over_quota".into(),
        customer_id: "c".into(),
        amount_minor: 100,
        currency: "EUR".into(),
    };
    let status = payment
        .pay(grpc_request(pay, "over-quota-direct"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let pushback: u64 = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .expect("a pushback")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (1..=1_000).contains(&pushback),
        "until the next call a second: {pushback} ms"
    );

    let refused = test
        .post_order("over-quota", &order_body())
        .send()
        .await
        .unwrap();
    e2e::problem(refused, 429).await;
    assert_eq!(
        test.chain.bank().stats().calls,
        2,
        "the calls over the quota never reached the bank"
    );
    let breaker = test
        .chain
        .guard_stats()
        .breaker(payment::HOP, bank_mock::HOP);
    assert_eq!(
        (breaker.position, breaker.opened, breaker.judged_against),
        (Position::Closed, 0, 0),
        "a refusal of our own is no failure of the bank: {breaker:?}"
    );
}

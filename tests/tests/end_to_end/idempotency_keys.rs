//! Idempotency keys end to end, on SQLite and on PostgreSQL: a repeat never executes twice, and a
//! lost reply, a crash or a cancellation never charges twice.

use std::{sync::Arc, time::Duration};

use e2e::{
    BACKGROUND, Storage, TestChain, chain_with_receiver, events, eventually, fast_bank, order_body,
    problem, subscribe,
};
use tokio::sync::Barrier;

#[tokio::test]
async fn a_replay_gets_the_same_status_and_the_same_bytes() {
    for backend in Storage::all() {
        let name = backend.name();
        let test = TestChain::start_on(&backend, |_| {}).await;
        let first = test
            .post_order("replay-1", &order_body())
            .send()
            .await
            .unwrap();
        assert_eq!(first.status(), 201, "{name}");
        assert!(
            first.headers().get("idempotent-replayed").is_none(),
            "{name}"
        );
        let first_body = first.bytes().await.unwrap();

        let again = test
            .post_order("replay-1", &order_body())
            .send()
            .await
            .unwrap();
        assert_eq!(again.status(), 201, "{name}");
        assert_eq!(again.headers()["idempotent-replayed"], "true", "{name}");
        assert_eq!(
            again.bytes().await.unwrap(),
            first_body,
            "{name}: byte-identical body"
        );

        let bank = test.chain.bank().stats();
        assert_eq!(
            (bank.calls, bank.charges, bank.duplicate_keys),
            (1, 1, 0),
            "{name}: the replay never reached the bank"
        );
        assert_eq!(test.count_rows("orders").await, 1, "{name}");
        assert_eq!(test.count_rows("payments").await, 1, "{name}");
    }
}

#[tokio::test]
async fn a_reused_key_with_another_body_is_refused_and_keys_are_per_client() {
    for backend in Storage::all() {
        let name = backend.name();
        let test = TestChain::start_on(&backend, |_| {}).await;
        assert_eq!(
            test.post_order("shared-key", &order_body())
                .send()
                .await
                .unwrap()
                .status(),
            201
        );

        let mut other = order_body();
        other["amount_minor"] = 4_200.into();
        let refused = test.post_order("shared-key", &other).send().await.unwrap();
        assert_eq!(refused.status(), 422, "{name}");
        assert_eq!(
            refused.headers()["content-type"],
            "application/problem+json"
        );
        assert_eq!(
            (
                test.chain.bank().stats().calls,
                test.count_rows("orders").await
            ),
            (1, 1),
            "{name}: nothing changed"
        );

        let another_client = test
            .http
            .post(test.url("/v1/orders"))
            .bearer_auth("demo-key-2")
            .header("idempotency-key", "shared-key")
            .json(&other)
            .send()
            .await
            .unwrap();
        assert_eq!(
            another_client.status(),
            201,
            "{name}: the same key of another client is its own"
        );
        let bank = test.chain.bank().stats();
        assert_eq!(
            (bank.calls, bank.charges, bank.duplicate_keys),
            (2, 2, 0),
            "{name}: {bank:?}"
        );
        assert_eq!(test.count_rows("payments").await, 2, "{name}");
    }
}

#[tokio::test]
async fn fifty_concurrent_requests_with_one_key_execute_once() {
    for backend in Storage::all() {
        let name = backend.name();
        // A bank slow enough that the first request is still in flight when the others arrive.
        let test = Arc::new(
            TestChain::start_on(&backend, |s| {
                s.bank.faults = fast_bank(|f| f.latency_ms.mean = 50.0)
            })
            .await,
        );
        let barrier = Arc::new(Barrier::new(50));
        let requests = (0..50).map(|_| {
            let (test, barrier) = (test.clone(), barrier.clone());
            tokio::spawn(async move {
                let request = test.post_order("storm-1", &order_body());
                barrier.wait().await;
                let response = request.send().await.unwrap();
                (
                    response.status().as_u16(),
                    response.headers().contains_key("idempotent-replayed"),
                )
            })
        });
        let outcomes: Vec<(u16, bool)> = futures::future::join_all(requests)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let executed = outcomes
            .iter()
            .filter(|(status, replayed)| *status == 201 && !replayed)
            .count();
        let other = outcomes
            .iter()
            .filter(|(status, replayed)| !(*status == 409 || (*status == 201 && *replayed)))
            .count();
        assert_eq!(executed, 1, "{name}: {outcomes:?}");
        assert_eq!(
            other, 1,
            "{name}: the others are replays or 409: {outcomes:?}"
        );
        // One execution, not one de-duplicated charge: the bank was called once.
        let bank = test.chain.bank().stats();
        assert_eq!(
            (bank.calls, bank.charges, bank.duplicate_keys),
            (1, 1, 0),
            "{name}: {bank:?}"
        );
        assert_eq!(
            (
                test.count_rows("orders").await,
                test.count_rows("payments").await
            ),
            (1, 1),
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_lost_reply_is_retried_without_a_second_charge() {
    for backend in Storage::all() {
        let name = backend.name();
        let test = TestChain::start_on(&backend, |s| {
            s.bank.faults = fast_bank(|f| f.drop_reply_rate = 1.0)
        })
        .await;
        // The bank charges and loses the reply; the gateway retries with the same derived key and
        // the bank answers from its record.
        let response = test
            .post_order("lost-1", &order_body())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201, "{name}");
        let paid: serde_json::Value = response.json().await.unwrap();
        assert_eq!(paid["status"], "paid");

        // A final client retry with the same key gets the same order.
        let again = test
            .post_order("lost-1", &order_body())
            .send()
            .await
            .unwrap();
        assert_eq!(again.headers()["idempotent-replayed"], "true", "{name}");
        assert_eq!(
            again.json::<serde_json::Value>().await.unwrap()["order_id"],
            paid["order_id"]
        );
        // The lost call charged; each later call was answered from the bank's record of it.
        let bank = test.chain.bank().stats();
        assert_eq!(
            (bank.charges, bank.dropped_replies),
            (1, 1),
            "{name}: {bank:?}"
        );
        assert!(bank.duplicate_keys >= 1, "{name}");
        assert_eq!(
            bank.calls,
            bank.charges + bank.duplicate_keys,
            "{name}: {bank:?}"
        );
        assert_eq!(
            (
                test.count_rows("orders").await,
                test.count_rows("payments").await
            ),
            (1, 1),
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_create_cancelled_between_its_phases_is_resumed_by_the_retry() {
    for backend in Storage::all() {
        let name = backend.name();
        // No gateway retries: the client's own retry resumes the work.
        let test = TestChain::start_on(&backend, |s| s.gateway.retry.max_attempts = 1).await;
        test.set_faults(fast_bank(|f| f.hang = true));
        let cancelled = test
            .post_order("resume-1", &order_body())
            .header("x-request-timeout-ms", "400")
            .send()
            .await
            .unwrap();
        // orders keeps a reserve of the deadline for its answer, which names the order left pending.
        let cancelled = problem(cancelled, 504).await;
        assert_eq!(cancelled["outcome"], "pending", "{name}: {cancelled}");
        assert_eq!(
            test.count_rows("orders").await,
            1,
            "{name}: the order row was committed before payment"
        );
        assert_eq!(test.chain.bank().stats().charges, 0);

        // The bank recovers. The leases end with their requests' deadlines, which the 504 may
        // have beaten by a moment: until then the repeat is told 409, as any concurrent one.
        test.set_faults(fast_bank(|_| {}));
        let resumed = eventually(BACKGROUND, "the repeat past the lapsed leases", || async {
            let response = test
                .post_order("resume-1", &order_body())
                .send()
                .await
                .unwrap();
            (response.status() != 409).then_some(response)
        })
        .await;
        assert_eq!(resumed.status(), 201, "{name}");
        assert_eq!(
            resumed.json::<serde_json::Value>().await.unwrap()["order_id"],
            cancelled["order_id"],
            "{name}: the order the 504 named"
        );
        assert_eq!(
            test.count_rows("orders").await,
            1,
            "{name}: the same order, not a second one"
        );
        let bank = test.chain.bank().stats();
        // The hung call never charged; the resume charged once.
        assert_eq!(
            (bank.calls, bank.charges, bank.duplicate_keys),
            (2, 1, 0),
            "{name}: {bank:?}"
        );
        assert_eq!(test.count_rows("payments").await, 1, "{name}");
    }
}

#[tokio::test]
async fn a_request_that_fails_validation_does_not_use_up_its_key() {
    let test = TestChain::start().await;
    let mut invalid = order_body();
    invalid["currency"] = "QQQ".into();
    assert_eq!(
        test.post_order("validated-1", &invalid)
            .send()
            .await
            .unwrap()
            .status(),
        400
    );
    assert_eq!(
        test.post_order("validated-1", &order_body())
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
}

/// The bank charges and loses the reply, and nobody retries: the gateway makes one attempt and
/// the client takes its 503 and leaves. The completer settles the create with the same derived
/// keys: the order paid by the one charge, its event delivered, the client's later repeat
/// answered from it.
#[tokio::test]
async fn a_charge_whose_reply_was_lost_and_never_retried_is_settled_by_the_completer() {
    for backend in Storage::all() {
        let name = backend.name();
        let (test, listener) = chain_with_receiver(&backend, |s| {
            s.gateway.retry.max_attempts = 1;
            s.orders.completer.grace_ms = 300;
            s.orders.completer.interval_ms = 50;
        })
        .await;
        let (_, processed) = subscribe(&test, listener).await;
        test.set_faults(fast_bank(|f| f.drop_reply_rate = 1.0));
        let lost = test
            .post_order("stranded-1", &order_body())
            .send()
            .await
            .unwrap();
        assert_eq!(
            lost.status(),
            503,
            "{name}: the reply was lost and the gateway did not retry"
        );

        let [(_, event)] = events(&processed, 1)
            .await
            .try_into()
            .expect("the settled order is announced once");
        assert_eq!(event["type"], "order.paid", "{name}: {event}");
        let order = &event["data"]["order"];
        let repeat = test
            .post_order("stranded-1", &order_body())
            .send()
            .await
            .unwrap();
        assert_eq!(repeat.status(), 201, "{name}");
        assert_eq!(
            repeat.headers()["idempotent-replayed"],
            "true",
            "{name}: answered from what the completer stored"
        );
        assert_eq!(
            &repeat.json::<serde_json::Value>().await.unwrap(),
            order,
            "{name}: the order the event announced"
        );

        // One execution: the lost call charged, the completer's call was answered from the
        // bank's record of that charge.
        let bank = test.chain.bank().stats();
        assert_eq!(
            (
                bank.calls,
                bank.charges,
                bank.duplicate_keys,
                bank.dropped_replies
            ),
            (2, 1, 1, 1),
            "{name}: {bank:?}"
        );
        assert_eq!(
            (
                test.count_rows("orders").await,
                test.count_rows("payments").await
            ),
            (1, 1),
            "{name}"
        );
    }
}

/// While the bank is down, every stranded create would fail again: the completer must not turn
/// into a retry loop of its own. It stops a round at its first failure and then probes one create
/// at a time with a doubling pause; once the bank is back, everything settles.
#[tokio::test]
async fn the_completer_probes_instead_of_retrying_every_stranded_create_while_the_bank_is_down() {
    let test = TestChain::start_with(|s| {
        // Breakers off, so that the completer's own restraint is what is measured.
        stack::scenario::without_breakers(s);
        s.gateway.retry.max_attempts = 1;
        s.orders.completer.grace_ms = 100;
        s.orders.completer.interval_ms = 50;
        s.orders.completer.max_backoff_ms = 400;
    })
    .await;
    test.set_faults(fast_bank(|f| f.error_rate = 1.0));
    for n in 0..20 {
        assert_eq!(
            test.post_order(&format!("outage-{n}"), &order_body())
                .send()
                .await
                .unwrap()
                .status(),
            503
        );
    }
    let calls_when_left = test.chain.bank().stats().calls;
    // A measurement window, not a wait for a condition: the completer's calls over 3 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let completer_calls = test.chain.bank().stats().calls - calls_when_left;
    // Resuming all 20 after every grace would be about 20 calls every 150 ms, some 400 in 3 s.
    // A first round stops after the resumes in flight at its first failure (4 at once), then
    // one probe per pause of 50, 100, 200 and then 400 ms: about 10 in 3 s.
    assert!(
        (1..=20).contains(&completer_calls),
        "{completer_calls} bank calls from the completer in 3 s"
    );

    test.set_faults(fast_bank(|_| {}));
    let database = test.database(orders::HOP).await;
    eventually(
        BACKGROUND,
        "every stranded create settled once the bank is back",
        || async {
            let paid: i64 = database
                .fetch_one("SELECT COUNT(*) FROM orders WHERE status = 'paid'", &[])
                .await
                .unwrap();
            paid == 20
        },
    )
    .await;
    let bank = test.chain.bank().stats();
    assert_eq!((bank.charges, bank.duplicate_keys), (20, 0), "{bank:?}");
    assert_eq!(test.count_rows("payments").await, 20);
}

/// No reserves: each hop's lease on the key ends with the request's deadline. A bank that knows
/// nothing of deadlines keeps charging after the first attempt gave up, and the client's retry,
/// sent at once, takes both keys over while that charge is still under way: the two calls meet
/// at the bank with the same derived key, and the order is charged once.
#[tokio::test]
async fn a_retry_that_takes_over_while_the_first_attempt_is_still_paying_charges_once() {
    const BANK_MS: f64 = 600.0;
    for backend in Storage::all() {
        let name = backend.name();
        let test = TestChain::start_on(&backend, |s| {
            no_reserves(s);
            s.bank.faults = fast_bank(|f| {
                f.latency_ms.mean = BANK_MS;
                f.ignores_deadlines = true;
            });
        })
        .await;
        let orders = 3;
        for n in 0..orders {
            let key = format!("still-paying-{n}");
            let first = test
                .post_order(&key, &order_body())
                .header("x-request-timeout-ms", "150")
                .send()
                .await
                .unwrap();
            assert_eq!(first.status(), 504, "{name}");
            assert_eq!(
                test.chain.bank().stats().charges,
                n,
                "{name}: the first attempt is still paying"
            );
            let settled = retry_until_settled(&test, &key).await;
            assert_eq!(settled.status(), 201, "{name}");
            assert_eq!(
                settled.json::<serde_json::Value>().await.unwrap()["status"],
                "paid",
                "{name}"
            );
        }
        let bank = test.chain.bank().stats();
        // Each order: the first call committed after its caller left, the retry's found it.
        assert_eq!(
            (
                bank.calls,
                bank.charges,
                bank.duplicate_keys,
                bank.late_completions
            ),
            (2 * orders, orders, orders, orders),
            "{name}: {bank:?}"
        );
        assert_eq!(
            (
                test.count_rows("orders").await,
                test.count_rows("payments").await
            ),
            (orders as i64, orders as i64),
            "{name}"
        );
    }
}

/// The same without a bank that outlives its deadlines: first attempts on the edge of theirs.
/// Their deadlines follow a staircase (longer after a 504, shorter after a 201) that keeps them
/// where a charge commits just before the deadline and its answer is lost on the way up, whatever
/// the machine's speed; each order is charged once whatever happened.
#[tokio::test]
async fn first_attempts_on_the_edge_of_their_deadline_charge_once() {
    const BANK_MS: u64 = 200;
    for backend in Storage::all() {
        let name = backend.name();
        let test = TestChain::start_on(&backend, |s| {
            no_reserves(s);
            s.bank.faults = fast_bank(|f| f.latency_ms.mean = BANK_MS as f64);
        })
        .await;
        let orders = 30;
        let mut timeout = BANK_MS;
        let mut first_attempts = Vec::new();
        for n in 0..orders {
            let key = format!("on-the-edge-{n}");
            let first = test
                .post_order(&key, &order_body())
                .header("x-request-timeout-ms", timeout.to_string())
                .send()
                .await
                .unwrap()
                .status();
            first_attempts.push((timeout, first.as_u16()));
            timeout = if first == 504 {
                timeout + 2
            } else {
                timeout - 1
            };
            let settled = retry_until_settled(&test, &key).await;
            assert_eq!(
                settled.status(),
                201,
                "{name}, {key}: first attempts {first_attempts:?}"
            );
        }
        let bank = test.chain.bank().stats();
        assert_eq!(
            (bank.charges, bank.distinct_keys),
            (orders, orders),
            "{name}: one charge and one bank key per order: {bank:?}; first attempts: {first_attempts:?}"
        );
        assert_eq!(
            (
                test.count_rows("orders").await,
                test.count_rows("payments").await
            ),
            (orders as i64, orders as i64),
            "{name}"
        );
    }
}

/// Gateway retries off (the client's retry is the one that takes over) and no hop keeps a reserve:
/// every lease and every call below ends with the client's deadline.
fn no_reserves(settings: &mut stack::ChainSettings) {
    settings.gateway.retry.max_attempts = 1;
    settings.orders.payment.deadline.reserve_ms = 0;
    settings.payment.bank.deadline.reserve_ms = 0;
    settings.payment.bank.deadline.cap_ms = None;
}

/// The client's retry of `key` with a roomy deadline, repeated while an earlier attempt still
/// holds the key (409).
async fn retry_until_settled(test: &TestChain, key: &str) -> reqwest::Response {
    eventually(BACKGROUND, "the retry settles the order", || async {
        let response = test
            .post_order(key, &order_body())
            .header("x-request-timeout-ms", "3000")
            .send()
            .await
            .unwrap();
        (response.status() != 409).then_some(response)
    })
    .await
}

/// A payment outlives its key: orders resumes a create after payment reaped the key of a payment
/// it completed (the answer was lost on its way to orders). The repeat finds the payment by its
/// id, derived from the key, and answers with it: no second bank call, nothing stuck.
#[tokio::test]
async fn a_payment_whose_key_was_reaped_answers_its_repeat_without_calling_the_bank() {
    use proto::payment::v1::{PayRequest, payment_service_client::PaymentServiceClient};
    use stack::chain::PAYMENT_GRPC;

    for backend in Storage::all() {
        let name = backend.name();
        let test = TestChain::start_on(&backend, |_| {}).await;
        let mut payment = PaymentServiceClient::new(
            test.channel_as("orders", "payment", test.chain.addresses()[&PAYMENT_GRPC])
                .await,
        );
        let pay = || {
            let request = PayRequest {
                order_id: "ord_outlived".into(),
                customer_id: "c-1".into(),
                amount_minor: 100,
                currency: "EUR".into(),
            };
            let mut request = e2e::grpc_request(request, "outlived-key");
            request.set_timeout(Duration::from_secs(2));
            request
        };
        let first = payment.pay(pay()).await.unwrap().into_inner();
        // What the reaper does once the key's TTL has passed.
        let database = test.database(payment::HOP).await;
        database
            .write(async |tx| tx.execute("DELETE FROM idempotency_keys", &[]).await)
            .await
            .unwrap();
        let again = payment.pay(pay()).await.unwrap();
        assert_eq!(again.into_inner(), first, "{name}: the recorded payment");
        let bank = test.chain.bank().stats();
        assert_eq!(
            (bank.calls, bank.charges),
            (1, 1),
            "{name}: the repeat never reached the bank: {bank:?}"
        );
        assert_eq!(test.count_rows("payments").await, 1, "{name}");
    }
}

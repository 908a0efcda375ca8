//! What a create's answer says it left behind, end to end on SQLite and PostgreSQL, with the
//! bank's executions behind each kind: done (201 paid, 402 declined); refused before anything
//! could be charged (no order is kept, nothing is charged later); or pending (the order is
//! named, and it is settled once the bank is back), over HTTP and over gRPC.

use std::time::Duration;

use e2e::{
    BACKGROUND, Storage, TestChain, eventually, fast_bank, grpc_request, order_body, order_message,
    problem,
};
use proto::outcome::FailedCreate;
use serde_json::Value;

/// The completer looks every 50 ms for creates left alone 100 ms.
fn quick_completer(settings: &mut stack::ChainSettings) {
    settings.orders.completer.grace_ms = 100;
    settings.orders.completer.interval_ms = 50;
    settings.orders.completer.max_backoff_ms = 200;
}

#[tokio::test]
async fn a_paid_or_declined_create_is_done_and_its_repeat_says_the_same() {
    for backend in Storage::all() {
        let name = backend.name();
        let test = TestChain::start_on(&backend, |_| {}).await;
        assert_eq!(
            test.post_order("done-paid", &order_body())
                .send()
                .await
                .unwrap()
                .status(),
            201,
            "{name}"
        );
        test.set_faults(fast_bank(|f| f.decline_rate = 1.0));
        let declined = problem(
            test.post_order("done-declined", &order_body())
                .send()
                .await
                .unwrap(),
            402,
        )
        .await;
        assert!(
            declined["order_id"].is_string() && declined.get("outcome").is_none(),
            "{name}: done, not unsettled: {declined}"
        );
        let again = test
            .post_order("done-declined", &order_body())
            .send()
            .await
            .unwrap();
        assert_eq!(again.headers()["idempotent-replayed"], "true", "{name}");
        assert_eq!(
            problem(again, 402).await["order_id"],
            declined["order_id"],
            "{name}"
        );
        let bank = test.chain.bank().stats();
        assert_eq!(
            (bank.calls, bank.charges, bank.duplicate_keys),
            (2, 2, 0),
            "{name}: one execution each: {bank:?}"
        );
    }
}

/// orders never has the slice payment needs, so it fails fast without calling: the create is
/// refused, its order and key are gone, and no round of the completer ever charges it.
#[tokio::test]
async fn a_create_refused_before_payment_is_called_is_never_charged_later() {
    for backend in Storage::all() {
        let name = backend.name();
        let test = TestChain::start_on(&backend, |s| {
            quick_completer(s);
            s.orders.payment.deadline.min_forward_ms = 60_000;
        })
        .await;
        let refused = problem(
            test.post_order("refused-1", &order_body())
                .send()
                .await
                .unwrap(),
            504,
        )
        .await;
        assert_eq!(refused["outcome"], "refused", "{name}: {refused}");
        assert!(
            refused.get("order_id").is_none(),
            "{name}: no order is kept: {refused}"
        );
        assert!(
            refused["detail"]
                .as_str()
                .unwrap()
                .contains("Nothing was charged"),
            "{name}: {refused}"
        );
        assert_eq!(
            (
                test.count_rows("orders").await,
                test.count_rows("idempotency_keys").await
            ),
            (0, 0),
            "{name}: nothing left to resume"
        );
        // A measurement window, not a wait for a condition: ten of the completer's rounds.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            test.chain.bank().stats().calls,
            0,
            "{name}: never charged later"
        );
        assert_eq!(test.count_rows("orders").await, 0, "{name}");
    }
}

/// The bank fails every call. The creates whose call reached it are pending: their answer names
/// the order, which is paid once the bank is back, by the completer, with one charge each. Once
/// payment's breaker has opened, creates are refused before reaching the bank: no order, no
/// charge, then or later; their repeat starts afresh.
#[tokio::test]
async fn while_the_bank_fails_a_create_is_pending_or_refused_and_never_both() {
    for backend in Storage::all() {
        let name = backend.name();
        let test = TestChain::start_on(&backend, |s| {
            quick_completer(s);
            s.gateway.retry.max_attempts = 1;
            let breaker = &mut s.payment.bank.breaker;
            (breaker.window_calls, breaker.min_calls, breaker.open_ms) = (10, 5, 300);
        })
        .await;
        test.set_faults(fast_bank(|f| f.error_rate = 1.0));
        let (mut pending, mut refused) = (Vec::new(), Vec::new());
        for n in 0..10 {
            let key = format!("outage-{n}");
            let answer = problem(
                test.post_order(&key, &order_body()).send().await.unwrap(),
                503,
            )
            .await;
            match answer["outcome"].as_str() {
                Some("pending") => pending.push((
                    key,
                    answer["order_id"]
                        .as_str()
                        .expect("a pending create names its order")
                        .to_owned(),
                )),
                Some("refused") => refused.push(key),
                _ => panic!("{name}: every failed create says how it stands: {answer}"),
            }
        }
        // Five failures open the breaker (the completer's resumes among them); a probe after its
        // 300 ms may reach the bank again.
        assert!(
            !pending.is_empty() && !refused.is_empty(),
            "{name}: pending {pending:?}, refused {refused:?}"
        );
        assert_eq!(
            test.count_rows("orders").await,
            pending.len() as i64,
            "{name}: a refused create keeps no order"
        );
        assert_eq!(test.chain.bank().stats().charges, 0, "{name}");

        test.set_faults(fast_bank(|_| {}));
        for (key, order_id) in &pending {
            let settled = eventually(BACKGROUND, "the pending order settled", || async {
                let order: Value = test
                    .get(&format!("/v1/orders/{order_id}"))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                (order["status"] == "paid").then_some(order)
            })
            .await;
            let repeat = test.post_order(key, &order_body()).send().await.unwrap();
            assert_eq!(
                (
                    repeat.status().as_u16(),
                    &repeat.headers()["idempotent-replayed"]
                ),
                (201, &"true".parse().unwrap()),
                "{name}"
            );
            assert_eq!(
                repeat.json::<Value>().await.unwrap()["order_id"],
                settled["order_id"],
                "{name}: the order the answer named"
            );
        }
        let bank = test.chain.bank().stats();
        let charges = pending.len() as u64;
        assert_eq!(
            (bank.charges, bank.duplicate_keys),
            (charges, 0),
            "{name}: one charge per pending create, none for the refused: {bank:?}"
        );
        let fresh = test
            .post_order(&refused[0], &order_body())
            .send()
            .await
            .unwrap();
        assert_eq!(
            (
                fresh.status().as_u16(),
                fresh.headers().get("idempotent-replayed")
            ),
            (201, None),
            "{name}: a refused key starts afresh"
        );
        assert_eq!(
            test.count_rows("orders").await,
            pending.len() as i64 + 1,
            "{name}"
        );
    }
}

/// Over gRPC a pending create says so in a `google.rpc.ErrorInfo`, with its order.
#[tokio::test]
async fn a_pending_create_names_its_order_over_grpc() {
    let test = TestChain::start_with(|s| s.gateway.retry.max_attempts = 1).await;
    test.set_faults(fast_bank(|f| f.error_rate = 1.0));
    let status = test
        .grpc_gateway()
        .await
        .create_order(grpc_request(order_message(), "grpc-pending"))
        .await
        .unwrap_err();
    let Some(FailedCreate::Pending { order_id }) = FailedCreate::of(&status) else {
        panic!("a pending create: {status:?}")
    };
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let order: Value = test
        .get(&format!("/v1/orders/{order_id}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(order["status"], "pending_payment", "{order}");
}

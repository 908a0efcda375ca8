//! Bad input gets a clear problem+json naming what is wrong, and nothing is written or called.

use e2e::{TestChain, order_body};
use serde_json::{Value, json};

fn with(change: impl FnOnce(&mut Value)) -> Value {
    let mut body = order_body();
    change(&mut body);
    body
}

#[tokio::test]
async fn malformed_orders_are_rejected_with_the_field_named() {
    let test = TestChain::start().await;
    let cases: Vec<(&str, Value, &str)> = vec![
        ("missing currency", with(|b| { b.as_object_mut().unwrap().remove("currency"); }), "currency"),
        ("missing quantity", with(|b| { b["items"][0].as_object_mut().unwrap().remove("quantity"); }), "items[0].quantity"),
        ("negative amount", with(|b| b["amount_minor"] = json!(-5)), "amount_minor"),
        ("zero amount", with(|b| b["amount_minor"] = json!(0)), "amount_minor"),
        ("absurd amount", with(|b| b["amount_minor"] = json!(1_000_000_000_000i64)), "amount_minor"),
        ("amount beyond 64 bits", with(|b| b["amount_minor"] = json!(1e20)), "amount_minor"),
        ("amount as text", with(|b| b["amount_minor"] = json!("12")), "amount_minor"),
        ("unknown currency", with(|b| b["currency"] = json!("QQQ")), "currency"),
        ("no items", with(|b| b["items"] = json!([])), "items"),
        ("negative quantity", with(|b| b["items"][0]["quantity"] = json!(-1)), "items[0].quantity"),
        ("empty customer", with(|b| b["customer_id"] = json!("")), "customer_id"),
        ("unknown field", with(|b| b["discount"] = json!(5)), "."),
    ];
    for (name, body, field) in cases {
        let response = test.post_order(&format!("bad-{}", name.replace(' ', "-")), &body).send().await.unwrap();
        assert_eq!(response.status(), 400, "{name}");
        assert_eq!(response.headers()["content-type"], "application/problem+json", "{name}");
        let problem: Value = response.json().await.unwrap();
        let detail = problem["detail"].as_str().unwrap();
        if field == "." {
            assert!(detail.contains("discount"), "{name}: {detail}");
        } else {
            assert_eq!(problem["field"], field, "{name}: {problem}");
        }
    }
    assert_nothing_reached_orders(&test);
}

#[tokio::test]
async fn malformed_headers_and_bodies_are_rejected() {
    let test = TestChain::start().await;
    let url = test.url("/v1/orders");
    let post = || test.http.post(&url).bearer_auth(e2e::API_KEY).header("content-type", "application/json");
    let body = order_body().to_string();

    let not_json = post().header("idempotency-key", "k-1").body("{\"customer_id\": ").send().await.unwrap();
    assert_eq!(not_json.status(), 400);

    for timeout in ["soon", "-5", "0", "1.5"] {
        let response = post().header("idempotency-key", "k-2").header("x-request-timeout-ms", timeout).body(body.clone()).send().await.unwrap();
        assert_eq!(response.status(), 400, "X-Request-Timeout-Ms: {timeout}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["field"], "X-Request-Timeout-Ms");
    }

    let no_key = post().body(body.clone()).send().await.unwrap();
    assert_eq!(no_key.status(), 400);
    assert_eq!(no_key.json::<Value>().await.unwrap()["field"], "Idempotency-Key");
    let long_key = post().header("idempotency-key", "k".repeat(256)).body(body.clone()).send().await.unwrap();
    assert_eq!(long_key.status(), 400);

    let anonymous = test.http.post(&url).header("idempotency-key", "k-3").body(body.clone()).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    let unknown_key = test.http.post(&url).bearer_auth("nope").header("idempotency-key", "k-3").body(body).send().await.unwrap();
    assert_eq!(unknown_key.status(), 401);

    assert_nothing_reached_orders(&test);
}

fn assert_nothing_reached_orders(test: &TestChain) {
    assert_eq!(test.chain.hop_stats().orders.requests, 0, "no bad request reached orders");
    assert_eq!(test.chain.bank().stats().calls, 0);
}

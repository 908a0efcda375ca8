//! What the user sees when a source has no answer: the last known copy, the parts there are with
//! the missing ones named, popular items instead of personal ones, and an honest error when
//! nothing can be shown. Never a zero in place of an unknown value.

use e2e::{BACKGROUND, TestChain, eventually, fast_bank, order_body};
use serde_json::Value;
use stack::chain::ORDERS_GRPC;

/// Stops orders and returns once its port refuses connections.
async fn stop_orders(test: &TestChain) {
    assert!(test.chain.stop_service("orders"));
    let address = test.chain.address(&ORDERS_GRPC);
    eventually(BACKGROUND, "orders stopped listening", || async {
        tokio::net::TcpStream::connect(address).await.is_err()
    })
    .await;
}

async fn create(test: &TestChain, key: &str) -> Value {
    let response = test.post_order(key, &order_body()).send().await.unwrap();
    assert_eq!(response.status(), 201);
    response.json().await.unwrap()
}

async fn get(test: &TestChain, path: &str) -> reqwest::Response {
    test.http
        .get(test.url(path))
        .bearer_auth(e2e::API_KEY)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn with_orders_down_a_read_gets_the_last_known_copy_marked_stale() {
    let test = TestChain::start().await;
    let order = create(&test, "cache-1").await;
    let id = order["order_id"].as_str().unwrap();
    let fresh = get(&test, &format!("/v1/orders/{id}")).await;
    assert!(fresh.headers().get("x-fallback").is_none());
    let fresh: Value = fresh.json().await.unwrap();
    assert!(fresh.get("stale").is_none());

    stop_orders(&test).await;
    let stale = get(&test, &format!("/v1/orders/{id}")).await;
    assert_eq!(stale.status(), 200);
    assert!(
        stale.headers()["x-fallback"]
            .to_str()
            .unwrap()
            .starts_with("stale-copy; as-of=")
    );
    let stale: Value = stale.json().await.unwrap();
    assert_eq!(stale["stale"], true);
    assert!(stale["as_of"].as_str().unwrap().ends_with('Z'), "{stale}");
    assert_eq!(stale["order_id"], order["order_id"]);
    assert_eq!(stale["status"], "paid");

    // Nothing known: an honest error, not an empty order.
    let unknown = get(&test, "/v1/orders/ord_never_seen").await;
    assert_eq!(unknown.status(), 503);
    assert_eq!(
        unknown.headers()["content-type"],
        "application/problem+json"
    );
}

#[tokio::test]
async fn a_summary_shows_every_part_when_all_sources_answer() {
    let test = TestChain::start().await;
    create(&test, "history-1").await;
    let mut other = order_body();
    other["items"] = serde_json::json!([{"sku": "sku-9", "quantity": 3}]);
    test.post_order("history-2", &other).send().await.unwrap();
    let order = create(&test, "summary-1").await;

    let response = get(
        &test,
        &format!("/v1/orders/{}/summary", order["order_id"].as_str().unwrap()),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("x-fallback").is_none());
    let summary: Value = response.json().await.unwrap();
    assert_eq!(summary["unavailable"], serde_json::json!([]), "{summary}");
    assert_eq!(summary["order"]["order_id"], order["order_id"]);
    assert_eq!(summary["payment"]["status"], "approved");
    assert_eq!(summary["exchange_rate"]["currency"], "EUR");
    assert_eq!(summary["exchange_rate"]["stale"], false);
    assert_eq!(summary["recommendations"]["kind"], "personal");
    assert_eq!(
        summary["recommendations"]["skus"],
        serde_json::json!(["sku-9"]),
        "from this customer's other orders"
    );
}

#[tokio::test]
async fn a_summary_with_failing_sources_shows_what_it_has_and_names_what_is_missing() {
    // Payment and recommendations get no usable budget: they fail at once.
    let test = TestChain::start_with(|s| {
        s.gateway.payment.deadline.cap_ms = Some(1);
        s.gateway.recommendations.deadline.cap_ms = Some(1);
    })
    .await;
    let order = create(&test, "partial-1").await;
    let path = format!("/v1/orders/{}/summary", order["order_id"].as_str().unwrap());

    // The bank quotes once, then fails: the rate comes from the last quote, marked stale.
    get(&test, &path).await;
    test.set_faults(fast_bank(|f| f.error_rate = 1.0));
    let response = get(&test, &path).await;
    assert_eq!(
        response.status(),
        200,
        "one failing part never fails the whole summary"
    );
    let fallback = response.headers()["x-fallback"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        fallback.contains("stale-rate") && fallback.contains("popular-recommendations"),
        "{fallback}"
    );
    let summary: Value = response.json().await.unwrap();

    assert_eq!(summary["order"]["status"], "paid");
    assert_eq!(summary["payment"], Value::Null, "unknown, not zero");
    assert_eq!(summary["exchange_rate"]["stale"], true);
    assert_eq!(summary["exchange_rate"]["rate"], "1.0800");
    assert_eq!(summary["recommendations"]["kind"], "popular");
    assert!(
        !summary["recommendations"]["skus"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let missing: Vec<&str> = summary["unavailable"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["part"].as_str().unwrap())
        .collect();
    assert_eq!(
        missing,
        ["payment", "personal_recommendations"],
        "{summary}"
    );
    assert!(
        summary["unavailable"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("not calling"),
        "{summary}"
    );
}

#[tokio::test]
async fn a_rate_never_quoted_is_null_with_a_reason() {
    let test = TestChain::start().await;
    let order = create(&test, "no-rate-1").await;
    test.set_faults(fast_bank(|f| f.error_rate = 1.0));
    let summary: Value = get(
        &test,
        &format!("/v1/orders/{}/summary", order["order_id"].as_str().unwrap()),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(summary["exchange_rate"], Value::Null);
    let reasons: Vec<&Value> = summary["unavailable"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["part"] == "exchange_rate")
        .collect();
    assert_eq!(reasons.len(), 1, "{summary}");
}

#[tokio::test]
async fn a_summary_of_an_order_nobody_can_show_is_an_honest_error() {
    let test = TestChain::start().await;
    stop_orders(&test).await;
    let response = get(&test, "/v1/orders/ord_unknown/summary").await;
    assert_eq!(response.status(), 503);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
}

//! Per-client rate limits at the gateway: the client over its quota gets a cheap, clear refusal
//! before anything else is done; the others are unaffected.

use e2e::{TestChain, grpc_request, order_body, order_message};
use resilience::rate_limit::QuotaSettings;
use stack::chain::{GATEWAY_HTTP, ORDERS_GRPC};
use tonic::Code;

/// `"default";r=0;t=1` → the number after `key=`.
fn field(header: &str, key: &str) -> u64 {
    header
        .split(';')
        .find_map(|part| part.trim().strip_prefix(&format!("{key}=")))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{key} in {header:?}"))
}

#[tokio::test]
async fn a_client_over_its_quota_gets_429_with_rate_limit_headers_and_others_do_not() {
    // demo-key-2 with a burst of 10 and one request a second after it. The burst is spent on
    // reads of an order that does not exist, cheap enough that all ten go out long before a
    // token comes back, however busy the machine; the refill itself is unit-tested on a clock
    // moved by hand in `resilience::rate_limit`.
    let test = TestChain::start_with(|settings| {
        let client = settings
            .gateway
            .clients
            .iter_mut()
            .find(|client| client.api_key == "demo-key-2")
            .expect("the demo client");
        client.quota = QuotaSettings {
            per_second: 1,
            burst: 10,
        };
    })
    .await;
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let response = test
            .get_as("demo-key-2", "/v1/orders/ord_missing")
            .send()
            .await
            .unwrap();
        assert!(
            response.headers().contains_key("ratelimit"),
            "allowed answers carry RateLimit too"
        );
        statuses.push(response.status().as_u16());
    }
    assert!(
        statuses.iter().all(|s| *s == 404),
        "the burst is allowed: {statuses:?}"
    );
    let orders_before = test.chain.hop_stats()[&ORDERS_GRPC].requests;
    let gateway_before = test.chain.hop_stats()[&GATEWAY_HTTP].requests;

    let refused = test
        .post_as("demo-key-2", "/v1/orders", "quota-over", &order_body())
        .send()
        .await
        .unwrap();
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(retry_after, 1, "one request a second");
    let state = refused.headers()["ratelimit"].to_str().unwrap().to_owned();
    assert_eq!(field(&state, "r"), 0);
    let policy = refused.headers()["ratelimit-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        (field(&policy, "q"), field(&policy, "w")),
        (10, 10),
        "{policy}"
    );
    e2e::problem(refused, 429).await;

    // Cheap is shown by what was not done, not by a stopwatch.
    let hops = test.chain.hop_stats();
    assert_eq!(
        hops[&ORDERS_GRPC].requests, orders_before,
        "refused before any storage access"
    );
    assert_eq!(
        hops[&GATEWAY_HTTP].requests, gateway_before,
        "refused before the deadline, auth and handler"
    );
    assert_eq!(test.chain.rate_limited(), 1);

    // Another client is unaffected.
    assert_eq!(
        test.post_order("other-client", &order_body())
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
}

#[tokio::test]
async fn over_grpc_the_refusal_is_resource_exhausted_with_a_pushback() {
    let test = TestChain::start_with(|s| {
        s.gateway.clients[0].quota.per_second = 1;
        s.gateway.clients[0].quota.burst = 1;
    })
    .await;
    let mut gateway = test.grpc_gateway().await;
    gateway
        .create_order(grpc_request(order_message(), "grpc-quota-1"))
        .await
        .unwrap();
    let status = gateway
        .create_order(grpc_request(order_message(), "grpc-quota-2"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let pushback: u64 = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=1_000).contains(&pushback), "{pushback}");
}

#[tokio::test]
async fn unknown_keys_share_one_small_quota_and_are_refused_before_authentication() {
    // A burst of 20, then one a second: the 25 requests go out before a token comes back.
    let test = TestChain::start_with(|settings| {
        settings.gateway.unknown_key_quota = QuotaSettings {
            per_second: 1,
            burst: 20,
        }
    })
    .await;
    let mut statuses = Vec::new();
    for n in 0..25 {
        let response = test
            .http
            .post(test.url("/v1/orders"))
            .bearer_auth(format!("guess-{n}"))
            .header("idempotency-key", "k")
            .json(&order_body())
            .send()
            .await
            .unwrap();
        statuses.push(response.status().as_u16());
    }
    assert!(statuses[..20].iter().all(|s| *s == 401), "{statuses:?}");
    assert!(statuses[20..].iter().all(|s| *s == 429), "{statuses:?}");
}

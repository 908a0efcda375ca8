//! The webhook subscription API through the gateway: endpoints and their secrets, kept per client
//! under idempotency keys, URLs vetted against SSRF, and the delivery log with redelivery.

use e2e::{API_KEY, Storage, TestChain, order_body};
use proto::orders::v1::{CreateEndpointRequest, webhooks_client::WebhooksClient};
use serde_json::{Value, json};
use stack::chain::{ORDERS_GRPC, ORDERS_OPS};
use tonic::Code;
use tonic_types::StatusExt;
use webhooks::signature::Secret;

const ENDPOINTS: &str = "/v1/webhooks/endpoints";
const OTHER_API_KEY: &str = "demo-key-2";

fn endpoint_body(url: &str) -> Value {
    json!({"url": url, "event_types": ["order.paid"]})
}

async fn create(test: &TestChain, key: &str, body: &Value) -> reqwest::Response {
    test.http
        .post(test.url(ENDPOINTS))
        .bearer_auth(API_KEY)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn created(test: &TestChain, key: &str) -> Value {
    let response = create(
        test,
        key,
        &endpoint_body("https://hooks.example.com/orders"),
    )
    .await;
    assert_eq!(response.status(), 201);
    response.json().await.unwrap()
}

async fn get(test: &TestChain, api_key: &str, path: &str) -> reqwest::Response {
    test.http
        .get(test.url(path))
        .bearer_auth(api_key)
        .send()
        .await
        .unwrap()
}

async fn post(
    test: &TestChain,
    api_key: &str,
    path: &str,
    body: Option<Value>,
) -> reqwest::Response {
    let request = test.http.post(test.url(path)).bearer_auth(api_key);
    match body {
        Some(body) => request.json(&body),
        None => request,
    }
    .send()
    .await
    .unwrap()
}

/// Asserts a 400 problem whose detail mentions `expected`, and returns the problem.
async fn refused(response: reqwest::Response, expected: &str) -> Value {
    assert_eq!(response.status(), 400, "{expected}");
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
    let problem: Value = response.json().await.unwrap();
    assert!(
        problem["detail"].as_str().unwrap().contains(expected),
        "{expected:?} in {problem}"
    );
    problem
}

#[tokio::test]
async fn a_new_endpoint_shows_its_secret_and_a_repeat_replays_it_byte_for_byte() {
    for backend in Storage::all() {
        let name = backend.name();
        let test = TestChain::start_on(&backend, |_| {}).await;
        let first = create(
            &test,
            "endpoint-1",
            &endpoint_body("https://hooks.example.com/orders"),
        )
        .await;
        assert_eq!(first.status(), 201, "{name}");
        assert!(
            first.headers().get("idempotent-replayed").is_none(),
            "{name}"
        );
        assert!(
            first.headers().contains_key("x-deadline-ledger"),
            "the ledger as on the order routes"
        );
        let first_body = first.bytes().await.unwrap();
        let answer: Value = serde_json::from_slice(&first_body).unwrap();
        let secret = answer["secret"].as_str().unwrap();
        assert!(secret.starts_with("whsec_"), "{answer}");
        secret
            .parse::<Secret>()
            .expect("a Standard Webhooks secret");
        let endpoint = &answer["endpoint"];
        assert_eq!(
            (endpoint["url"].as_str(), endpoint["enabled"].as_bool()),
            (Some("https://hooks.example.com/orders"), Some(true))
        );
        assert_eq!(endpoint["event_types"], json!(["order.paid"]));
        assert_eq!(
            (
                endpoint["max_in_flight"].as_u64(),
                endpoint["rate_per_sec"].as_u64()
            ),
            (Some(4), Some(50)),
            "the default limits"
        );

        let again = create(
            &test,
            "endpoint-1",
            &endpoint_body("https://hooks.example.com/orders"),
        )
        .await;
        assert_eq!(again.status(), 201, "{name}");
        assert_eq!(again.headers()["idempotent-replayed"], "true", "{name}");
        assert_eq!(
            again.bytes().await.unwrap(),
            first_body,
            "{name}: the same endpoint and the same secret"
        );
        let database = test.database(orders::HOP).await;
        let kept: Vec<u8> = database
            .fetch_one(
                "SELECT response_body FROM idempotency_keys WHERE idempotency_key = 'endpoint-1'",
                &[],
            )
            .await
            .unwrap();
        assert!(
            !String::from_utf8_lossy(&kept).contains(secret.trim_start_matches("whsec_")),
            "{name}: the key keeps the secret sealed"
        );

        let reused = create(
            &test,
            "endpoint-1",
            &endpoint_body("https://other.example.com/"),
        )
        .await;
        assert_eq!(reused.status(), 422, "{name}");
        let order_with_the_key = test
            .post_order("endpoint-1", &order_body())
            .send()
            .await
            .unwrap();
        assert_eq!(
            order_with_the_key.status(),
            422,
            "{name}: a key used for an endpoint is not an order's"
        );

        let id = endpoint["endpoint_id"].as_str().unwrap();
        let listed: Value = get(&test, API_KEY, ENDPOINTS).await.json().await.unwrap();
        assert_eq!(
            listed["endpoints"],
            json!([endpoint]),
            "{name}: one endpoint, however often it was asked for"
        );
        let read = get(&test, API_KEY, &format!("{ENDPOINTS}/{id}")).await;
        assert_eq!(read.status(), 200);
        assert_eq!(&read.json::<Value>().await.unwrap(), endpoint);
    }
}

#[tokio::test]
async fn bad_endpoints_are_refused_naming_the_problem_and_keep_their_key() {
    let test = TestChain::start().await;
    // The body, the field named, and what the detail says about it.
    let cases = [
        (endpoint_body("https://10.0.0.1/"), "url", "10.0.0.1"),
        (
            endpoint_body("http://hooks.example.com/"),
            "url",
            "plain http",
        ),
        (endpoint_body("https://0x7f.1/"), "url", "127.0.0.1"),
        (endpoint_body("ftp://hooks.example.com/"), "url", "scheme"),
        (
            json!({"url": "https://hooks.example.com/", "event_types": ["order.shipped"]}),
            "event_types",
            "order.shipped",
        ),
        (
            json!({"url": "https://hooks.example.com/", "event_types": []}),
            "event_types",
            "at least one",
        ),
        (
            json!({"url": "https://hooks.example.com/", "event_types": ["order.paid"], "max_in_flight": 100_000}),
            "max_in_flight",
            "1..=64",
        ),
        (
            json!({"url": "https://hooks.example.com/", "event_types": ["order.paid"], "rate_per_sec": 1_000_000}),
            "rate_per_sec",
            "1..=1000",
        ),
        (
            json!({"url": "https://hooks.example.com/", "event_types": ["order.paid"], "max_in_flight": 0}),
            "max_in_flight",
            "at least 1",
        ),
        (
            json!({"url": "https://hooks.example.com/", "event_types": ["order.paid"], "rate_per_sec": -1}),
            "rate_per_sec",
            "invalid value",
        ),
        (json!({"event_types": ["order.paid"]}), "url", "required"),
    ];
    for (body, field, expected) in cases {
        let problem = refused(create(&test, "refused-key", &body).await, expected).await;
        assert_eq!(problem["field"], field, "{problem}");
    }
    let unknown_field = json!({"url": "https://hooks.example.com/", "event_types": ["order.paid"], "secret": "mine"});
    refused(create(&test, "refused-key", &unknown_field).await, "secret").await;
    let no_key = test
        .http
        .post(test.url(ENDPOINTS))
        .bearer_auth(API_KEY)
        .json(&endpoint_body("https://hooks.example.com/"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        refused(no_key, "Idempotency-Key").await["field"],
        "Idempotency-Key"
    );

    assert_eq!(
        create(
            &test,
            "refused-key",
            &endpoint_body("https://hooks.example.com/")
        )
        .await
        .status(),
        201,
        "a refused request used up no key"
    );
}

#[tokio::test]
async fn test_hosts_take_plain_http_to_loopback_and_nothing_else_does() {
    let test = TestChain::start_with(|settings| {
        settings.orders.webhooks.test_hosts = vec!["127.0.0.1:9999".into()]
    })
    .await;
    assert_eq!(
        create(
            &test,
            "test-host",
            &endpoint_body("http://127.0.0.1:9999/hooks")
        )
        .await
        .status(),
        201
    );
    refused(
        create(
            &test,
            "other-port",
            &endpoint_body("http://127.0.0.1:9998/hooks"),
        )
        .await,
        "127.0.0.1",
    )
    .await;
}

#[tokio::test]
async fn a_rotation_shows_a_new_secret_and_disable_and_enable_are_reflected() {
    let test = TestChain::start().await;
    let answer = created(&test, "endpoint-2").await;
    let id = answer["endpoint"]["endpoint_id"].as_str().unwrap();
    let rotate = |key: &'static str, body: Value| {
        test.http
            .post(test.url(&format!("{ENDPOINTS}/{id}/rotate-secret")))
            .bearer_auth(API_KEY)
            .header("idempotency-key", key)
            .json(&body)
            .send()
    };

    let rotated = rotate("rotation-1", json!({"overlap_ms": 60_000}))
        .await
        .unwrap();
    assert_eq!(rotated.status(), 200);
    let rotated_body = rotated.bytes().await.unwrap();
    let rotation: Value = serde_json::from_slice(&rotated_body).unwrap();
    let secret = rotation["secret"].as_str().unwrap();
    secret
        .parse::<Secret>()
        .expect("a Standard Webhooks secret");
    assert_ne!(secret, answer["secret"].as_str().unwrap(), "a new secret");
    assert!(
        rotation["previous_secrets_expire_at"]
            .as_str()
            .unwrap()
            .ends_with('Z'),
        "{rotation}"
    );
    let again = rotate("rotation-1", json!({"overlap_ms": 60_000}))
        .await
        .unwrap();
    assert_eq!(again.headers()["idempotent-replayed"], "true");
    assert_eq!(
        again.bytes().await.unwrap(),
        rotated_body,
        "a repeat rotates nothing and shows the same secret"
    );
    assert_eq!(rotate("rotation-1", json!({})).await.unwrap().status(), 422);
    refused(
        rotate("rotation-2", json!({"overlap_ms": 0}))
            .await
            .unwrap(),
        "overlap_ms",
    )
    .await;

    let disabled: Value = post(&test, API_KEY, &format!("{ENDPOINTS}/{id}/disable"), None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            disabled["enabled"].as_bool(),
            disabled["disabled_reason"].as_str()
        ),
        (Some(false), Some("disabled by its owner"))
    );
    let read: Value = get(&test, API_KEY, &format!("{ENDPOINTS}/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(read["enabled"], false);
    let enabled: Value = post(&test, API_KEY, &format!("{ENDPOINTS}/{id}/enable"), None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        (enabled["enabled"].as_bool(), &enabled["disabled_reason"]),
        (Some(true), &Value::Null)
    );
}

#[tokio::test]
async fn another_client_can_neither_see_nor_change_an_endpoint() {
    let test = TestChain::start().await;
    let id = created(&test, "endpoint-3").await["endpoint"]["endpoint_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let listed: Value = get(&test, OTHER_API_KEY, ENDPOINTS)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(listed["endpoints"], json!([]));
    for path in ["", "/deliveries"] {
        assert_eq!(
            get(&test, OTHER_API_KEY, &format!("{ENDPOINTS}/{id}{path}"))
                .await
                .status(),
            404,
            "GET {path}"
        );
    }
    for path in ["/disable", "/enable", "/deliveries/msg_1/redeliver"] {
        assert_eq!(
            post(
                &test,
                OTHER_API_KEY,
                &format!("{ENDPOINTS}/{id}{path}"),
                None
            )
            .await
            .status(),
            404,
            "POST {path}"
        );
    }
    let range = json!({"from": "2026-01-01T00:00:00Z", "until": "2030-01-01T00:00:00Z"});
    assert_eq!(
        post(
            &test,
            OTHER_API_KEY,
            &format!("{ENDPOINTS}/{id}/redeliver"),
            Some(range)
        )
        .await
        .status(),
        404
    );
    let rotation = test
        .http
        .post(test.url(&format!("{ENDPOINTS}/{id}/rotate-secret")))
        .bearer_auth(OTHER_API_KEY)
        .header("idempotency-key", "rotation-x")
        .send()
        .await
        .unwrap();
    assert_eq!(rotation.status(), 404);
    let unchanged: Value = get(&test, API_KEY, &format!("{ENDPOINTS}/{id}"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(
        unchanged["enabled"], true,
        "the owner's endpoint is untouched"
    );
    assert_eq!(
        get(&test, API_KEY, &format!("{ENDPOINTS}/ep_unknown"))
            .await
            .status(),
        404
    );
}

#[tokio::test]
async fn the_delivery_log_and_redelivery() {
    let test = TestChain::start().await;
    let id = created(&test, "endpoint-4").await["endpoint"]["endpoint_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let deliveries = get(
        &test,
        API_KEY,
        &format!("{ENDPOINTS}/{id}/deliveries?limit=10"),
    )
    .await;
    assert_eq!(deliveries.status(), 200);
    assert_eq!(
        deliveries.json::<Value>().await.unwrap(),
        json!({"deliveries": []}),
        "nothing happened yet"
    );
    for (query, expected) in [
        ("limit=0", "at least 1"),
        ("limit=many", "invalid digit"),
        ("limit=501", "at most 500"),
    ] {
        let problem = refused(
            get(
                &test,
                API_KEY,
                &format!("{ENDPOINTS}/{id}/deliveries?{query}"),
            )
            .await,
            expected,
        )
        .await;
        assert_eq!(problem["field"], "limit", "{problem}");
    }

    let unknown = post(
        &test,
        API_KEY,
        &format!("{ENDPOINTS}/{id}/deliveries/msg_unknown/redeliver"),
        None,
    )
    .await;
    assert_eq!(unknown.status(), 404);
    assert_eq!(
        unknown.headers()["content-type"],
        "application/problem+json"
    );

    let range = |from: &str, until: &str| json!({"from": from, "until": until});
    let days_from_now = |days: i64| {
        let now = std::time::SystemTime::now();
        let shift = std::time::Duration::from_secs(days.unsigned_abs() * 86_400);
        humantime::format_rfc3339_seconds(if days < 0 { now - shift } else { now + shift })
            .to_string()
    };
    let (yesterday, tomorrow) = (days_from_now(-1), days_from_now(1));
    let range_path = format!("{ENDPOINTS}/{id}/redeliver");
    let redeliver = |body: Value| post(&test, API_KEY, &range_path, Some(body));
    let before_any_order = redeliver(range(&yesterday, &tomorrow)).await;
    assert_eq!(before_any_order.status(), 202);
    assert_eq!(
        before_any_order.json::<Value>().await.unwrap(),
        json!({"queued": 0})
    );
    for (body, field) in [
        (range("yesterday", "2100-01-01T00:00:00Z"), "from"),
        (
            range("2100-01-01T00:00:00Z", "2020-01-01T00:00:00Z"),
            "until",
        ),
        (json!({"from": "2020-01-01T00:00:00Z"}), "until"),
        // Longer than the 14 days one range redelivery may span.
        (
            range("2020-01-01T00:00:00Z", "2100-01-01T00:00:00Z"),
            "until",
        ),
    ] {
        let problem = refused(redeliver(body).await, field).await;
        assert_eq!(problem["field"], field, "{problem}");
    }

    // A paid order puts one order.paid event in the outbox, with a delivery to the endpoint. The
    // endpoint's name resolves nowhere here, so the sender's attempts (if it made one yet) fail
    // and the delivery stays pending.
    assert_eq!(
        test.post_order("order-1", &order_body())
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
    let log: Value = get(&test, API_KEY, &format!("{ENDPOINTS}/{id}/deliveries"))
        .await
        .json()
        .await
        .unwrap();
    let [delivery] = log["deliveries"].as_array().unwrap().as_slice() else {
        panic!("one delivery: {log}")
    };
    assert_eq!(
        (delivery["event_type"].as_str(), delivery["state"].as_str()),
        (Some("order.paid"), Some("pending")),
        "{delivery}"
    );
    assert!(
        delivery["next_attempt_at"].as_str().unwrap().ends_with('Z'),
        "{delivery}"
    );
    assert!(
        delivery["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|attempt| attempt["outcome"] == "failed"),
        "{delivery}"
    );
    let event_id = delivery["event_id"].as_str().unwrap();
    let delivered: Value = get(
        &test,
        API_KEY,
        &format!("{ENDPOINTS}/{id}/deliveries?state=delivered"),
    )
    .await
    .json()
    .await
    .unwrap();
    assert_eq!(delivered, json!({"deliveries": []}), "filtered by state");
    let problem = refused(
        get(
            &test,
            API_KEY,
            &format!("{ENDPOINTS}/{id}/deliveries?state=lost"),
        )
        .await,
        "one of pending",
    )
    .await;
    assert_eq!(problem["field"], "state", "{problem}");
    let problem = refused(
        get(
            &test,
            API_KEY,
            &format!("{ENDPOINTS}/{id}/deliveries?cursor=nonsense"),
        )
        .await,
        "cursor",
    )
    .await;
    assert_eq!(problem["field"], "cursor", "{problem}");
    let again = post(
        &test,
        API_KEY,
        &format!("{ENDPOINTS}/{id}/deliveries/{event_id}/redeliver"),
        None,
    )
    .await;
    assert_eq!(
        (
            again.status().as_u16(),
            again.json::<Value>().await.unwrap()
        ),
        (202, json!({"queued": 1}))
    );
    let after_an_order = redeliver(range(&yesterday, &tomorrow)).await;
    assert_eq!(
        (
            after_an_order.status().as_u16(),
            after_an_order.json::<Value>().await.unwrap()
        ),
        (202, json!({"queued": 1}))
    );
    let after_the_range = redeliver(range("2020-01-01T00:00:00Z", "2020-01-02T00:00:00Z")).await;
    assert_eq!(
        after_the_range.json::<Value>().await.unwrap(),
        json!({"queued": 0}),
        "an event outside the range is not queued"
    );
}

#[tokio::test]
async fn orders_serves_webhooks_over_grpc_beside_orders() {
    let test = TestChain::start().await;
    let mut webhooks = WebhooksClient::new(
        test.channel_as("gateway", "orders", test.chain.address(&ORDERS_GRPC))
            .await,
    );
    let request = |url: &str, key: Option<&str>| {
        let mut request = tonic::Request::new(CreateEndpointRequest {
            url: url.into(),
            event_types: vec!["order.paid".into()],
            ..Default::default()
        });
        request
            .metadata_mut()
            .insert("x-client-id", "demo-client-1".parse().unwrap());
        if let Some(key) = key {
            request
                .metadata_mut()
                .insert("idempotency-key", key.parse().unwrap());
        }
        request
    };

    let refused = webhooks
        .create_endpoint(request("https://[::1]/", Some("grpc-1")))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    let violation = refused
        .get_details_bad_request()
        .expect("a BadRequest detail")
        .field_violations
        .remove(0);
    assert_eq!(violation.field, "url", "{}", refused.message());
    let no_key = webhooks
        .create_endpoint(request("https://hooks.example.com/", None))
        .await
        .unwrap_err();
    assert_eq!(
        (no_key.code(), no_key.message()),
        (
            Code::InvalidArgument,
            "orders: idempotency-key metadata is required"
        )
    );

    let first = webhooks
        .create_endpoint(request("https://hooks.example.com/", Some("grpc-1")))
        .await
        .unwrap();
    let again = webhooks
        .create_endpoint(request("https://hooks.example.com/", Some("grpc-1")))
        .await
        .unwrap();
    assert_eq!(again.metadata().get("idempotent-replayed").unwrap(), "true");
    assert_eq!(
        again.into_inner(),
        first.into_inner(),
        "the same endpoint and secret"
    );
}

/// A write without an idempotency key cannot be retried safely (a retry after a lost answer
/// would queue a redelivery twice), so the gateway sends it once even when a retry would help.
#[tokio::test]
async fn webhook_writes_without_a_key_are_sent_to_orders_once() {
    let test =
        std::sync::Arc::new(TestChain::start_with(|s| s.orders.deadline.max_in_flight = 1).await);
    let endpoint_id = created(&test, "before-the-crowd").await["endpoint"]["endpoint_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // One creation hangs at the bank and holds orders' only slot: orders refuses everything else
    // with RESOURCE_EXHAUSTED and a pushback short enough to retry within the deadline.
    test.set_faults(e2e::fast_bank(|f| f.hang = true));
    let busy = {
        let test = test.clone();
        tokio::spawn(async move {
            test.post_order("holds-the-slot", &order_body())
                .header("x-request-timeout-ms", "5000")
                .send()
                .await
                .unwrap()
                .status()
        })
    };
    e2e::eventually(
        e2e::BACKGROUND,
        "the creation hanging at the bank",
        || async { test.chain.bank().stats().hung >= 1 },
    )
    .await;

    // Calls orders refused at its full intake: every call the gateway made while the slot is held.
    let refused = || async {
        let text = test.scrape(test.chain.address(&ORDERS_OPS)).await;
        e2e::sample(
            &text,
            "chain_load_shed_rejections_total",
            &[("intake", "orders")],
        ) as u64
    };
    // A keyed write is retried: the refusal is one a retry is made for.
    let before = refused().await;
    let keyed = create(
        &test,
        "in-the-crowd",
        &endpoint_body("https://hooks.example.com/crowd"),
    )
    .await;
    assert!(!keyed.status().is_success(), "{}", keyed.status());
    let calls = refused().await - before;
    assert!(calls >= 2, "the keyed write was retried: {calls} calls");

    let endpoint = format!("{ENDPOINTS}/{endpoint_id}");
    let range = json!({"from": "2026-01-01T00:00:00Z", "until": "2026-01-02T00:00:00Z"});
    let unkeyed = [
        ("disable", format!("{endpoint}/disable"), None),
        ("enable", format!("{endpoint}/enable"), None),
        (
            "redeliver one",
            format!("{endpoint}/deliveries/evt_unknown/redeliver"),
            None,
        ),
        (
            "redeliver a range",
            format!("{endpoint}/redeliver"),
            Some(range),
        ),
    ];
    for (write, path, body) in unkeyed {
        let before = refused().await;
        let response = post(&test, API_KEY, &path, body).await;
        assert!(
            !response.status().is_success(),
            "{write}: {}",
            response.status()
        );
        assert_eq!(refused().await - before, 1, "{write}: sent once");
    }
    busy.abort();
}

#[tokio::test]
async fn urls_are_stored_as_the_whatwg_parser_reads_them_and_bounded() {
    let test = TestChain::start().await;
    let normalised = [
        (
            "https:///hooks.example.com/a",
            "https://hooks.example.com/a",
        ),
        (
            "https://hooks.example.com\\@127.0.0.1/h",
            "https://hooks.example.com/@127.0.0.1/h",
        ),
        (
            "  https://Hooks.Example.COM:443/a/./b/../c  ",
            "https://hooks.example.com/a/c",
        ),
        (
            "https://hooks.example.com:8443/ä",
            "https://hooks.example.com:8443/%C3%A4",
        ),
    ];
    for (index, (sent, stored)) in normalised.into_iter().enumerate() {
        let response = create(&test, &format!("normalised-{index}"), &endpoint_body(sent)).await;
        assert_eq!(response.status(), 201, "{sent:?}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["endpoint"]["url"], stored, "{sent:?}");
        let id = answer["endpoint"]["endpoint_id"].as_str().unwrap();
        let read: Value = get(&test, API_KEY, &format!("{ENDPOINTS}/{id}"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(read["url"], stored, "what is read back is what was stored");
    }

    let base = "https://hooks.example.com/";
    let longest = format!("{base}{}", "a".repeat(2_048 - base.len()));
    assert_eq!(
        create(&test, "longest", &endpoint_body(&longest))
            .await
            .status(),
        201
    );
    let too_long = refused(
        create(&test, "too-long", &endpoint_body(&format!("{longest}a"))).await,
        "at most 2048",
    )
    .await;
    assert_eq!(too_long["field"], "url");
    let swelling = format!("{base}{}", "ä".repeat(350));
    refused(
        create(&test, "too-long", &endpoint_body(&swelling)).await,
        "at most 2048",
    )
    .await;

    for port in [0, 22, 25, 80, 1023] {
        let problem = refused(
            create(
                &test,
                "port",
                &endpoint_body(&format!("https://hooks.example.com:{port}/")),
            )
            .await,
            "port",
        )
        .await;
        assert_eq!(problem["field"], "url", "{port}");
    }
    assert_eq!(
        create(
            &test,
            "high-port",
            &endpoint_body("https://hooks.example.com:1024/")
        )
        .await
        .status(),
        201
    );
}

#[tokio::test]
async fn a_client_deletes_its_endpoint_frees_its_place_and_gets_nothing_more() {
    for backend in Storage::all() {
        let name = backend.name();
        let test = TestChain::start_on(&backend, |_| {}).await;
        let mut ids = Vec::new();
        for n in 0..20 {
            ids.push(
                created(&test, &format!("place-{n}")).await["endpoint"]["endpoint_id"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            );
        }
        refused(
            create(
                &test,
                "one-too-many",
                &endpoint_body("https://hooks.example.com/orders"),
            )
            .await,
            "at most 20",
        )
        .await;

        // An order event waits for every endpoint (their names resolve nowhere here).
        assert_eq!(
            test.post_order("before-the-delete", &order_body())
                .send()
                .await
                .unwrap()
                .status(),
            201
        );
        assert_eq!(test.count_rows("webhook_deliveries").await, 20);

        let delete = |api_key: &'static str, id: String| {
            test.http
                .delete(test.url(&format!("{ENDPOINTS}/{id}")))
                .bearer_auth(api_key)
                .send()
        };
        let not_theirs = delete(OTHER_API_KEY, ids[0].clone()).await.unwrap();
        assert_eq!(not_theirs.status(), 404, "only the owner may delete");
        assert_eq!(
            not_theirs.headers()["content-type"],
            "application/problem+json"
        );
        assert_eq!(
            get(&test, API_KEY, &format!("{ENDPOINTS}/{}", ids[0]))
                .await
                .status(),
            200,
            "still there"
        );

        let deleted = delete(API_KEY, ids[0].clone()).await.unwrap();
        assert_eq!(deleted.status(), 204);
        assert_eq!(
            get(&test, API_KEY, &format!("{ENDPOINTS}/{}", ids[0]))
                .await
                .status(),
            404
        );
        assert_eq!(
            get(
                &test,
                API_KEY,
                &format!("{ENDPOINTS}/{}/deliveries", ids[0])
            )
            .await
            .status(),
            404
        );
        assert_eq!(
            delete(API_KEY, ids[0].clone()).await.unwrap().status(),
            404,
            "a repeat finds nothing"
        );
        assert_eq!(
            test.count_rows("webhook_deliveries").await,
            19,
            "{name}: its delivery is gone, the sender has nothing more for it"
        );
        assert_eq!(test.count_rows("webhook_secrets").await, 19, "{name}");

        assert_eq!(
            create(
                &test,
                "in-the-freed-place",
                &endpoint_body("https://hooks.example.com/orders")
            )
            .await
            .status(),
            201
        );
        let listed: Value = get(&test, API_KEY, ENDPOINTS).await.json().await.unwrap();
        assert_eq!(listed["endpoints"].as_array().unwrap().len(), 20);
    }
}

async fn patch(test: &TestChain, api_key: &str, path: &str, body: &Value) -> reqwest::Response {
    test.http
        .patch(test.url(path))
        .bearer_auth(api_key)
        .json(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_update_changes_only_the_fields_it_names() {
    for backend in Storage::all() {
        let name = backend.name();
        let test = TestChain::start_on(&backend, |_| {}).await;
        let endpoint = created(&test, "endpoint-1").await["endpoint"].clone();
        let path = format!("{ENDPOINTS}/{}", endpoint["endpoint_id"].as_str().unwrap());

        let moved = patch(
            &test,
            API_KEY,
            &path,
            &json!({"url": "https://Other.Example.com:443/hooks", "max_in_flight": 8}),
        )
        .await;
        assert_eq!(moved.status(), 200, "{name}");
        let moved: Value = moved.json().await.unwrap();
        assert_eq!(
            moved["url"], "https://other.example.com/hooks",
            "{name}: vetted and normalised as on creation"
        );
        assert_eq!(
            (
                moved["max_in_flight"].as_u64(),
                moved["rate_per_sec"].as_u64()
            ),
            (Some(8), Some(50)),
            "{name}"
        );
        assert_eq!(
            (&moved["event_types"], &moved["created_at"]),
            (&endpoint["event_types"], &endpoint["created_at"]),
            "{name}: the rest stays"
        );
        assert!(
            moved["updated_at"].as_str().unwrap() >= endpoint["updated_at"].as_str().unwrap(),
            "{name}: {moved}"
        );

        let retyped =
            patch(&test, API_KEY, &path, &json!({"event_types": ["order.payment_declined", "endpoint.attempts_exhausted"], "url": null})).await;
        assert_eq!(retyped.status(), 200, "{name}");
        let retyped: Value = retyped.json().await.unwrap();
        assert_eq!(
            retyped["event_types"],
            json!(["endpoint.attempts_exhausted", "order.payment_declined"]),
            "{name}: in place of the old ones"
        );
        assert_eq!(
            (&retyped["url"], &retyped["max_in_flight"]),
            (&moved["url"], &moved["max_in_flight"]),
            "{name}: null is absent"
        );
        assert_eq!(
            get(&test, API_KEY, &path)
                .await
                .json::<Value>()
                .await
                .unwrap(),
            retyped,
            "{name}: as stored"
        );
    }
}

#[tokio::test]
async fn bad_updates_are_refused_as_bad_creations_are_and_change_nothing() {
    let test = TestChain::start().await;
    let endpoint = created(&test, "endpoint-1").await["endpoint"].clone();
    let path = format!("{ENDPOINTS}/{}", endpoint["endpoint_id"].as_str().unwrap());
    // The body, the field named, and what the detail says about it.
    let cases = [
        (json!({"url": "https://10.0.0.1/"}), "url", "10.0.0.1"),
        (
            json!({"url": "http://hooks.example.com/"}),
            "url",
            "plain http",
        ),
        (json!({"url": "https://0x7f.1/"}), "url", "127.0.0.1"),
        (
            json!({"url": "https://hooks.example.com/\u{202e}"}),
            "url",
            "bidirectional",
        ),
        (
            json!({"event_types": ["order.shipped"]}),
            "event_types",
            "order.shipped",
        ),
        (
            json!({"event_types": ["endpoint.ping"]}),
            "event_types",
            "endpoint.ping",
        ),
        (json!({"event_types": []}), "event_types", "at least one"),
        (json!({"max_in_flight": 0}), "max_in_flight", "1..=64"),
        (
            json!({"rate_per_sec": 1_000_000}),
            "rate_per_sec",
            "1..=1000",
        ),
        (json!({"rate_per_sec": -1}), "rate_per_sec", "invalid value"),
        (json!({}), "body", "at least one"),
    ];
    for (body, field, expected) in cases {
        let problem = refused(patch(&test, API_KEY, &path, &body).await, expected).await;
        assert_eq!(problem["field"], field, "{problem}");
    }
    refused(
        patch(&test, API_KEY, &path, &json!({"secret": "mine"})).await,
        "secret",
    )
    .await;
    let not_json = test
        .http
        .patch(test.url(&path))
        .bearer_auth(API_KEY)
        .body("url=https://x.example.com/")
        .send()
        .await
        .unwrap();
    e2e::problem(not_json, 415).await;
    let moved = json!({"url": "https://other.example.com/"});
    e2e::problem(patch(&test, OTHER_API_KEY, &path, &moved).await, 404).await;
    e2e::problem(
        patch(&test, API_KEY, &format!("{ENDPOINTS}/ep_unknown"), &moved).await,
        404,
    )
    .await;
    assert_eq!(
        get(&test, API_KEY, &path)
            .await
            .json::<Value>()
            .await
            .unwrap(),
        endpoint,
        "nothing changed"
    );
}

#[tokio::test]
async fn the_event_type_catalogue_is_what_subscriptions_are_checked_against() {
    let test = TestChain::start().await;
    let response = get(&test, API_KEY, "/v1/webhooks/event-types").await;
    assert_eq!(response.status(), 200);
    let catalogue: Value = response.json().await.unwrap();
    let event_types = catalogue["event_types"].as_array().unwrap();
    let names: Vec<&str> = event_types
        .iter()
        .map(|event_type| event_type["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "order.paid",
            "order.payment_declined",
            "endpoint.disabled",
            "endpoint.attempts_exhausted",
            "endpoint.ping"
        ]
    );
    for (index, event_type) in event_types.iter().enumerate() {
        assert!(
            !event_type["description"].as_str().unwrap().is_empty(),
            "{event_type}"
        );
        assert!(
            event_type["schema_version"].as_u64().unwrap() >= 1,
            "{event_type}"
        );
        let body =
            json!({"url": "https://hooks.example.com/", "event_types": [event_type["name"]]});
        let status = create(&test, &format!("catalogue-{index}"), &body)
            .await
            .status();
        let expected = if event_type["subscribable"].as_bool().unwrap() {
            201
        } else {
            400
        };
        assert_eq!(status, expected, "{event_type}");
    }
    e2e::problem(
        test.http
            .get(test.url("/v1/webhooks/event-types"))
            .send()
            .await
            .unwrap(),
        401,
    )
    .await;
}

#[tokio::test]
async fn a_ping_is_accepted_for_the_clients_own_endpoint_only() {
    let test = TestChain::start().await;
    let id = created(&test, "endpoint-1").await["endpoint"]["endpoint_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("{ENDPOINTS}/{id}/ping");
    let accepted = post(&test, API_KEY, &path, None).await;
    assert_eq!(accepted.status(), 202);
    let event_id = accepted.json::<Value>().await.unwrap()["event_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let log: Value = get(&test, API_KEY, &format!("{ENDPOINTS}/{id}/deliveries"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(log["deliveries"][0]["event_id"], event_id.as_str());
    assert_eq!(log["deliveries"][0]["event_type"], "endpoint.ping");
    e2e::problem(post(&test, OTHER_API_KEY, &path, None).await, 404).await;
}

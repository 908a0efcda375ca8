//! Bad input gets a clear problem+json naming what is wrong, and nothing is written or called.

use e2e::{API_KEY, TestChain, fast_bank, grpc_request, order_body, order_message, problem};
use serde_json::{Value, json};
use stack::chain::{BANK_ADMIN, GATEWAY_GRPC, ORDERS_GRPC};
use tonic::Code;

fn with(change: impl FnOnce(&mut Value)) -> Value {
    let mut body = order_body();
    change(&mut body);
    body
}

#[tokio::test]
async fn malformed_orders_are_rejected_with_the_field_named() {
    let test = TestChain::start().await;
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "missing currency",
            with(|b| {
                b.as_object_mut().unwrap().remove("currency");
            }),
            "currency",
        ),
        (
            "missing quantity",
            with(|b| {
                b["items"][0].as_object_mut().unwrap().remove("quantity");
            }),
            "items[0].quantity",
        ),
        (
            "negative amount",
            with(|b| b["amount_minor"] = json!(-5)),
            "amount_minor",
        ),
        (
            "zero amount",
            with(|b| b["amount_minor"] = json!(0)),
            "amount_minor",
        ),
        (
            "absurd amount",
            with(|b| b["amount_minor"] = json!(1_000_000_000_000i64)),
            "amount_minor",
        ),
        (
            "amount beyond 64 bits",
            with(|b| b["amount_minor"] = json!(1e20)),
            "amount_minor",
        ),
        (
            "amount as text",
            with(|b| b["amount_minor"] = json!("12")),
            "amount_minor",
        ),
        (
            "unknown currency",
            with(|b| b["currency"] = json!("QQQ")),
            "currency",
        ),
        ("no items", with(|b| b["items"] = json!([])), "items"),
        (
            "negative quantity",
            with(|b| b["items"][0]["quantity"] = json!(-1)),
            "items[0].quantity",
        ),
        (
            "empty customer",
            with(|b| b["customer_id"] = json!("")),
            "customer_id",
        ),
        ("unknown field", with(|b| b["discount"] = json!(5)), "."),
    ];
    for (name, body, field) in cases {
        let response = test
            .post_order(&format!("bad-{}", name.replace(' ', "-")), &body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{name}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json",
            "{name}"
        );
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
    let post = || {
        test.http
            .post(&url)
            .bearer_auth(e2e::API_KEY)
            .header("content-type", "application/json")
    };
    let body = order_body().to_string();

    let not_json = post()
        .header("idempotency-key", "k-1")
        .body("{\"customer_id\": ")
        .send()
        .await
        .unwrap();
    assert_eq!(not_json.status(), 400);

    for timeout in ["soon", "-5", "0", "1.5"] {
        let response = post()
            .header("idempotency-key", "k-2")
            .header("x-request-timeout-ms", timeout)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "X-Request-Timeout-Ms: {timeout}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["field"], "X-Request-Timeout-Ms");
    }

    let no_key = post().body(body.clone()).send().await.unwrap();
    assert_eq!(no_key.status(), 400);
    assert_eq!(
        no_key.json::<Value>().await.unwrap()["field"],
        "Idempotency-Key"
    );
    let long_key = post()
        .header("idempotency-key", "k".repeat(256))
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(long_key.status(), 400);

    let anonymous = test
        .http
        .post(&url)
        .header("idempotency-key", "k-3")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), 401);
    assert_eq!(anonymous.headers()["www-authenticate"], "Bearer");
    let unknown_key = test
        .http
        .post(&url)
        .bearer_auth("nope")
        .header("idempotency-key", "k-3")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown_key.status(), 401);

    assert_nothing_reached_orders(&test);
}

#[tokio::test]
async fn hidden_and_blank_looking_text_is_refused_in_every_field() {
    let test = TestChain::start().await;
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "NUL in the customer",
            with(|b| b["customer_id"] = json!("c-\u{0000}1")),
            "customer_id",
        ),
        (
            "a right-to-left override in the customer",
            with(|b| b["customer_id"] = json!("c-1\u{202E}")),
            "customer_id",
        ),
        (
            "a lone zero-width space as customer",
            with(|b| b["customer_id"] = json!("\u{200B}")),
            "customer_id",
        ),
        (
            "a blank sku",
            with(|b| b["items"][0]["sku"] = json!("   ")),
            "items[0].sku",
        ),
        (
            "an isolate in the sku",
            with(|b| b["items"][0]["sku"] = json!("\u{2066}sku-1")),
            "items[0].sku",
        ),
        (
            "a newline in the currency",
            with(|b| b["currency"] = json!("EUR\n")),
            "currency",
        ),
    ];
    for (name, body, field) in cases {
        let problem = problem(
            test.post_order(&format!("hidden-{}", name.replace(' ', "-")), &body)
                .send()
                .await
                .unwrap(),
            400,
        )
        .await;
        assert_eq!(problem["field"], field, "{name}: {problem}");
    }
    let read = problem(test.get("/v1/orders/ord%00x").send().await.unwrap(), 400).await;
    assert_eq!(read["field"], "order_id", "{read}");
    let key_with_a_tab = test
        .post_order("key\twith-a-tab", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(
        problem(key_with_a_tab, 400).await["field"],
        "Idempotency-Key"
    );

    let endpoints = [
        (
            json!({"url": "https://hooks.example.com/\u{0000}", "event_types": ["order.paid"]}),
            "url",
        ),
        (
            json!({"url": "https://hooks.example.com/\u{202D}x", "event_types": ["order.paid"]}),
            "url",
        ),
        (
            json!({"url": "https://hooks.example.com/", "event_types": ["order.paid\u{202E}"]}),
            "event_types[0]",
        ),
        (
            json!({"url": "https://hooks.example.com/", "event_types": ["\u{FEFF}"]}),
            "event_types[0]",
        ),
    ];
    for (body, field) in endpoints {
        let response = test
            .post_as(API_KEY, "/v1/webhooks/endpoints", "hidden-endpoint", &body)
            .send()
            .await
            .unwrap();
        assert_eq!(problem(response, 400).await["field"], field, "{body}");
    }

    // The gRPC face keeps the same rules.
    let mut gateway = test.grpc_gateway().await;
    let mut order = order_message();
    order.customer_id = "c-1\u{202E}".into();
    let refused = gateway
        .create_order(grpc_request(order, "hidden-grpc"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().starts_with("customer_id:"), "{refused:?}");
    assert_nothing_reached_orders(&test);
}

#[tokio::test]
async fn bodies_must_be_json_and_end_where_the_json_ends() {
    let test = TestChain::start().await;
    let body = order_body().to_string();
    let post = |key: &str, content_type: Option<&str>, body: String| {
        let request = test
            .http
            .post(test.url("/v1/orders"))
            .bearer_auth(API_KEY)
            .header("idempotency-key", key)
            .body(body);
        match content_type {
            Some(content_type) => request.header("content-type", content_type),
            None => request,
        }
    };

    for trailing in [" {}", "x", "\n[1]", " \"more\""] {
        let response = post(
            "trailing",
            Some("application/json"),
            format!("{body}{trailing}"),
        )
        .send()
        .await
        .unwrap();
        let problem = problem(response, 400).await;
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("after the JSON"),
            "{trailing:?}: {problem}"
        );
    }
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("application/jsonx"),
    ] {
        let response = post("not-json", content_type, body.clone())
            .send()
            .await
            .unwrap();
        let problem = problem(response, 415).await;
        assert!(
            problem["detail"]
                .as_str()
                .unwrap()
                .contains("application/json"),
            "{content_type:?}: {problem}"
        );
    }
    assert_nothing_reached_orders(&test);

    let with_charset = post(
        "json",
        Some("Application/JSON; charset=utf-8"),
        format!("{body}\n"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(
        with_charset.status(),
        201,
        "parameters and trailing whitespace are fine"
    );
}

#[tokio::test]
async fn every_error_the_http_face_answers_is_a_problem() {
    let test = TestChain::start().await;
    let unknown_route = problem(test.get("/v1/nothing-here").send().await.unwrap(), 404).await;
    assert_eq!(unknown_route["title"], "Not found");

    let wrong_method = test
        .http
        .put(test.url("/v1/orders"))
        .bearer_auth(API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(
        wrong_method.headers()["allow"],
        "POST",
        "the Allow header is kept"
    );
    problem(wrong_method, 405).await;

    let too_large = test
        .post_order("too-large", &order_body())
        .body(vec![b' '; 3 * 1024 * 1024])
        .header("content-type", "application/json");
    let too_large = problem(too_large.send().await.unwrap(), 413).await;
    assert!(
        too_large["detail"]
            .as_str()
            .unwrap()
            .contains("length limit"),
        "{too_large}"
    );

    let long_uri = format!("/v1/orders/{}", "x".repeat(10 * 1024));
    problem(test.get(&long_uri).send().await.unwrap(), 414).await;

    let large_headers = test
        .get("/v1/orders/ord_1")
        .header("x-filler", "x".repeat(20 * 1024));
    problem(large_headers.send().await.unwrap(), 431).await;
}

#[tokio::test]
async fn an_undecodable_protobuf_is_invalid_argument() {
    let test = TestChain::start().await;
    let http2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    // A gRPC frame whose message declares a field longer than itself.
    let frame = [0u8, 0, 0, 0, 2, 0x0A, 0xFF];
    let response = http2
        .post(format!(
            "http://{}/gateway.v1.Gateway/CreateOrder",
            test.chain.address(&GATEWAY_GRPC)
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("authorization", format!("Bearer {API_KEY}"))
        .header("idempotency-key", "undecodable")
        .body(frame.to_vec())
        .send()
        .await
        .unwrap();
    let status =
        tonic::Status::from_header_map(response.headers()).expect("a trailers-only answer");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("failed to decode"), "{status:?}");
    assert_nothing_reached_orders(&test);
}

#[tokio::test]
async fn bank_admin_numbers_are_bounded_and_no_absurd_wait_reaches_a_client() {
    let test = TestChain::start().await;
    let faults_url = format!("http://{}/admin/faults", test.chain.address(&BANK_ADMIN));
    let put = |body: &'static str| {
        test.http
            .put(&faults_url)
            .header("x-admin-token", &test.chain.admin_token)
            .body(body)
            .send()
    };
    let cases = [
        (r#"{"pushback_ms": 9223372036854775807}"#, "pushback_ms"),
        (r#"{"pushback_ms": -9223372036854775808}"#, "pushback_ms"),
        (r#"{"pushback_ms": 1e30}"#, "pushback_ms"),
        (
            r#"{"latency_ms": {"mean": 1e12, "stddev": 1}}"#,
            "latency_ms.mean",
        ),
        (
            r#"{"latency_ms": {"mean": 5, "stddev": -1}}"#,
            "latency_ms.stddev",
        ),
        (r#"{"error_rate": 1.5}"#, "error_rate"),
        (r#"{"drop_reply_rate": -0.5}"#, "drop_reply_rate"),
    ];
    for (body, field) in cases {
        let problem = problem(put(body).await.unwrap(), 400).await;
        assert_eq!(problem["field"], field, "{body}: {problem}");
    }
    assert_eq!(
        test.chain.bank().faults().pushback_ms,
        0,
        "a refused change changes nothing"
    );

    // A bank asking for an absurd wait (set past the admin API's checks): the gateway relays an
    // hour at most.
    test.set_faults(fast_bank(|f| {
        f.resource_exhausted_rate = 1.0;
        f.pushback_ms = i64::MAX;
    }));
    let response = test
        .post_order("absurd-wait", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["retry-after"], "3600");
    problem(response, 429).await;
}

fn assert_nothing_reached_orders(test: &TestChain) {
    assert_eq!(
        test.chain.hop_stats()[&ORDERS_GRPC].requests,
        0,
        "no bad request reached orders"
    );
    assert_eq!(test.chain.bank().stats().calls, 0);
}

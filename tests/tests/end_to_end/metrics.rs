//! Metrics: every service serves its counters on `/metrics` (Prometheus text), and they move with
//! what the chain does: answers by code (429 apart from 5xx), retries, breaker transitions and
//! rejections, bulkhead and quota refusals, fallbacks, and the deadline's slack per hop. (The meter
//! provider is process-wide, and the breaker's gauge is read as a value: the test needs a process
//! of its own, as the runner gives every test.)

use std::time::Duration;

use bank_mock::Latency;
use e2e::{BACKGROUND, TestChain, eventually, fast_bank, order_body, sample};
use stack::chain::{
    BANK_ADMIN, BANK_GRPC, BANK_OPS, GATEWAY_GRPC, GATEWAY_HTTP, GATEWAY_OPS, ORDERS_GRPC,
    ORDERS_OPS, PAYMENT_GRPC, PAYMENT_OPS,
};
use telemetry::TelemetrySettings;

#[tokio::test]
async fn metrics_move_with_answers_retries_guards_quotas_fallbacks_and_slack() {
    let telemetry = telemetry::init(e2e::SERVICE, &TelemetrySettings::default())
        .expect("metrics are installed");
    assert!(
        !telemetry.exporting(),
        "no endpoint: Prometheus only, nothing pushed"
    );
    let test = TestChain::start_with(|settings| {
        e2e::touchy_bank_guards(settings);
        // The completer resumes the creates the failing bank leaves half-done, soon.
        settings.orders.completer.interval_ms = 50;
        settings.orders.completer.grace_ms = 100;
    })
    .await;
    let addresses = test.chain.addresses().clone();
    let before = test.scrape(addresses[&GATEWAY_OPS]).await;

    // Healthy orders and a summary, whose exchange rate the gateway remembers.
    let mut order_id = String::new();
    for n in 0..3 {
        let response = test
            .post_order(&format!("metrics-ok-{n}"), &order_body())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        order_id = response.json::<serde_json::Value>().await.unwrap()["order_id"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    let summary = |test: &TestChain| {
        test.http
            .get(test.url(&format!("/v1/orders/{order_id}/summary")))
            .bearer_auth(e2e::API_KEY)
            .send()
    };
    assert_eq!(summary(&test).await.unwrap().status(), 200);

    // A client over its quota (demo-key-2: a burst of 10, then 5 a second), all at once so that
    // a slow machine cannot spread them over the refill.
    let over_quota = (0..20).map(|n| {
        test.http
            .post(test.url("/v1/orders"))
            .bearer_auth("demo-key-2")
            .header("idempotency-key", format!("metrics-quota-{n}"))
            .json(&order_body())
            .send()
    });
    futures::future::join_all(over_quota).await;

    // A slow bank behind a bulkhead of one: concurrent orders are refused at payment's bulkhead.
    test.set_faults(fast_bank(|f| {
        f.latency_ms = Latency {
            mean: 300.0,
            stddev: 0.0,
        }
    }));
    let concurrent = (0..3).map(|n| {
        test.post_order(&format!("metrics-bulkhead-{n}"), &order_body())
            .send()
    });
    futures::future::join_all(concurrent).await;
    // The refused creates are left half-done, and the completer resumes them through the slow
    // bank: until they are paid, its calls could take the bulkhead's one place from the failing
    // calls below, which would then never reach the bank to open its breaker.
    test.set_faults(fast_bank(|_| {}));
    for n in 0..3 {
        let key = format!("metrics-bulkhead-{n}");
        eventually(BACKGROUND, &format!("{key} paid"), || async {
            test.post_order(&key, &order_body())
                .send()
                .await
                .is_ok_and(|r| r.status() == 201)
        })
        .await;
    }

    // A failing bank: retried at the gateway, then the breaker opens and answers for the bank;
    // the summary's rate comes from the last quote.
    test.set_faults(fast_bank(|f| f.error_rate = 1.0));
    for n in 0..8 {
        test.post_order(&format!("metrics-down-{n}"), &order_body())
            .send()
            .await
            .unwrap();
    }
    assert_eq!(summary(&test).await.unwrap().status(), 200);

    let after = test.scrape(addresses[&GATEWAY_OPS]).await;
    let grew = |metric: &str, labels: &[(&str, &str)]| {
        sample(&after, metric, labels) - sample(&before, metric, labels)
    };
    assert!(
        grew(
            "chain_requests_total",
            &[("hop", "gateway"), ("code", "201")]
        ) >= 3.0,
        "{after}"
    );
    assert!(
        grew(
            "chain_requests_total",
            &[("hop", "gateway"), ("code", "429")]
        ) >= 1.0,
        "429s counted apart: {after}"
    );
    assert!(
        grew(
            "chain_requests_total",
            &[("hop", "gateway"), ("code", "503")]
        ) >= 1.0,
        "5xx counted apart: {after}"
    );
    assert!(
        grew("chain_requests_total", &[("hop", "orders"), ("code", "0")]) >= 3.0,
        "gRPC answers by status: {after}"
    );
    assert!(
        grew(
            "chain_rate_limit_rejections_total",
            &[("scope", "client"), ("name", "demo-client-2")]
        ) >= 1.0,
        "{after}"
    );
    assert!(
        grew(
            "chain_bulkhead_rejections_total",
            &[("hop", "payment"), ("peer", "bank-mock")]
        ) >= 1.0,
        "{after}"
    );
    assert!(grew("chain_retry_retries_total", &[]) >= 1.0, "{after}");
    assert!(
        grew("chain_retry_stops_total", &[("reason", "breaker")]) >= 1.0,
        "{after}"
    );
    assert!(
        grew(
            "chain_breaker_transitions_total",
            &[("hop", "payment"), ("peer", "bank-mock"), ("to", "open")]
        ) >= 1.0,
        "{after}"
    );
    assert!(
        grew(
            "chain_breaker_rejections_total",
            &[("hop", "payment"), ("peer", "bank-mock")]
        ) >= 1.0,
        "{after}"
    );
    assert_eq!(
        sample(
            &after,
            "chain_breaker_state",
            &[("hop", "payment"), ("peer", "bank-mock")]
        ),
        2.0,
        "open: {after}"
    );
    assert!(
        grew("chain_fallbacks_total", &[("kind", "stale_rate")]) >= 1.0,
        "{after}"
    );
    for hop in ["gateway", "orders", "payment", "bank-mock"] {
        assert!(
            grew("chain_deadline_slack_milliseconds_count", &[("hop", hop)]) >= 3.0,
            "slack of {hop}: {after}"
        );
        assert!(
            grew("chain_request_duration_milliseconds_count", &[("hop", hop)]) >= 3.0,
            "durations of {hop}: {after}"
        );
    }

    // Every service's operations port answers /metrics in plain HTTP, with no certificate.
    for address in [
        addresses[&ORDERS_OPS],
        addresses[&PAYMENT_OPS],
        addresses[&BANK_OPS],
    ] {
        let text = tokio::time::timeout(Duration::from_secs(5), test.scrape(address))
            .await
            .expect("scraped in time");
        assert!(text.contains("chain_requests_total"), "{address}: {text}");
    }
    // The completer's rounds, and its resumes of the creates the failing bank left (which fail
    // again: the bank still fails, or the breaker answers for it).
    let text = eventually(BACKGROUND, "the completer resumed a create", || async {
        let text = test.scrape(addresses[&ORDERS_OPS]).await;
        (sample(
            &text,
            "orders_completer_resumes_total",
            &[("outcome", "failed")],
        ) >= 1.0)
            .then_some(text)
    })
    .await;
    assert!(
        sample(&text, "orders_completer_runs_total", &[]) >= 1.0,
        "{text}"
    );
    assert_eq!(
        sample(&text, "orders_completer_unsettled", &[]),
        0.0,
        "{text}"
    );
    // Nor on the ports that serve requests: the gateway's public faces, the bank's admin API,
    // and the inner gRPC ports, not even to the operator's certificate.
    for address in [
        addresses[&GATEWAY_HTTP],
        addresses[&GATEWAY_GRPC],
        addresses[&BANK_ADMIN],
    ] {
        let response = test
            .http
            .get(format!("http://{address}/metrics"))
            .send()
            .await
            .unwrap();
        assert!(
            !response
                .text()
                .await
                .unwrap()
                .contains("chain_requests_total"),
            "no metrics on {address}"
        );
    }
    for (service, listener) in [
        ("orders", ORDERS_GRPC),
        ("payment", PAYMENT_GRPC),
        ("bank-mock", BANK_GRPC),
    ] {
        let (host, address) = (rpc::tls::dns_name(service), addresses[&listener]);
        let operator = test
            .operator_http()
            .resolve(&host, address)
            .build()
            .unwrap();
        let response = operator
            .get(format!("https://{host}:{}/metrics", address.port()))
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            403,
            "{service}'s gRPC port serves no metrics"
        );
    }
    telemetry.shutdown().await;
}

/// A caller that makes up a method name per call does not make a series per call: methods the
/// gateway does not serve are one, `_OTHER`.
#[tokio::test]
async fn made_up_method_names_make_no_series_of_their_own() {
    let _telemetry = telemetry::init(e2e::SERVICE, &TelemetrySettings::default())
        .expect("metrics are installed");
    let test = TestChain::start().await;
    let addresses = test.chain.addresses().clone();
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", addresses[&GATEWAY_GRPC]))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    for n in 0..200 {
        grpc.ready().await.unwrap();
        let path = format!("/made.up.Service{n}/Method{n}").parse().unwrap();
        let mut request = tonic::Request::new(());
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {}", e2e::API_KEY).parse().unwrap(),
        );
        let status = grpc
            .unary::<(), (), _>(request, path, tonic_prost::ProstCodec::default())
            .await
            .unwrap_err();
        // Past the client's quota the rate limit answers first: labelled all the same.
        assert!(
            matches!(
                status.code(),
                tonic::Code::Unimplemented | tonic::Code::ResourceExhausted
            ),
            "{status:?}"
        );
    }
    let text = test.scrape(addresses[&GATEWAY_OPS]).await;
    let methods: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|line| line.starts_with("rpc_server_call_duration"))
        .filter_map(|line| line.split("rpc_method=\"").nth(1)?.split('"').next())
        .collect();
    assert!(
        methods.contains("_OTHER") && methods.len() < 10,
        "{methods:?}"
    );
}

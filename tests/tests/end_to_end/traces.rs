//! Traces over real OTLP: one trace through the four hops, each hop's slice of the deadline on its
//! span, the guards' refusals as events, and the metrics pushed beside them. The services export
//! to a receiver the test runs, exactly as to a collector.

use std::sync::OnceLock;

use e2e::{
    BACKGROUND, TestChain, eventually, order_body, otlp,
    otlp::{OtlpReceiver, number_attribute, resource_text, text_attribute},
};
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind, status::StatusCode};
use telemetry::{Otlp, TelemetrySettings, attr};

fn by_id<'a>(spans: &'a [Span], id: &[u8]) -> Option<&'a Span> {
    spans.iter().find(|span| span.span_id == id)
}

/// Whether `ancestor` is above `span` in the trace.
fn descends_from(spans: &[Span], span: &Span, ancestor: &Span) -> bool {
    let mut current = span;
    while let Some(parent) = by_id(spans, &current.parent_span_id) {
        if parent.span_id == ancestor.span_id {
            return true;
        }
        current = parent;
    }
    false
}

/// The process's telemetry (installed once) and the receiver it exports to, on a runtime of their
/// own: each test's runtime ends with the test, and the exporter's channel and the receiver must
/// outlive every test of the process.
fn exported() -> &'static (OtlpReceiver, telemetry::Telemetry) {
    static EXPORTED: OnceLock<(OtlpReceiver, telemetry::Telemetry)> = OnceLock::new();
    EXPORTED.get_or_init(|| {
        std::thread::spawn(|| {
            let runtime: &'static tokio::runtime::Runtime =
                Box::leak(Box::new(tokio::runtime::Runtime::new().expect("a runtime")));
            runtime.block_on(async {
                let receiver = OtlpReceiver::start().await;
                let settings = TelemetrySettings {
                    traces: Some(Otlp::grpc(receiver.endpoint())),
                    metrics: Some(Otlp::grpc(receiver.endpoint())),
                    service_name: Some("chain-under-test".into()),
                    ..TelemetrySettings::default()
                };
                let telemetry = e2e::init_telemetry(&settings);
                (receiver, telemetry)
            })
        })
        .join()
        .expect("telemetry is installed")
    })
}

/// The spans of the trace an answer names in `traceparent`, once `enough` of them are exported.
async fn trace_of(response: &reqwest::Response, enough: impl Fn(&[Span]) -> bool) -> Vec<Span> {
    trace_by_resource(response, enough)
        .await
        .into_iter()
        .map(|(_, span)| span)
        .collect()
}

/// [`trace_of`], each span with the resource it was exported with.
async fn trace_by_resource(
    response: &reqwest::Response,
    enough: impl Fn(&[Span]) -> bool,
) -> Vec<otlp::ExportedSpan> {
    let (receiver, telemetry) = exported();
    let traceparent = response.headers()["traceparent"]
        .to_str()
        .unwrap()
        .to_owned();
    let trace_id = traceparent
        .split('-')
        .nth(1)
        .expect("version-traceid-spanid-flags")
        .to_owned();
    eventually(BACKGROUND, "the trace's spans exported", || async {
        telemetry.flush().await;
        let exported = receiver.trace_by_resource(&trace_id);
        let spans: Vec<Span> = exported.iter().map(|(_, span)| span.clone()).collect();
        enough(&spans).then_some(exported)
    })
    .await
}

/// Whether `spans` hold a server span of each hop of the chain.
fn every_hop_served(spans: &[Span]) -> bool {
    spans
        .iter()
        .filter(|s| s.kind == SpanKind::Server as i32)
        .count()
        >= 4
}

#[tokio::test]
async fn one_trace_crosses_every_hop_and_shows_each_slice_of_the_deadline() {
    exported();
    let test = TestChain::start().await;
    let response = test
        .post_order("traced-1", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let spans = trace_of(&response, every_hop_served).await;

    let server = |hop: &str| {
        spans
            .iter()
            .find(|s| {
                s.kind == SpanKind::Server as i32 && text_attribute(s, attr::HOP) == Some(hop)
            })
            .unwrap_or_else(|| panic!("a server span for {hop} in the answer's trace"))
    };
    let hops = ["gateway", "orders", "payment", "bank-mock"].map(server);
    for pair in hops.windows(2) {
        let (caller, callee) = (pair[0], pair[1]);
        let via = by_id(&spans, &callee.parent_span_id).expect("the callee's parent is exported");
        assert_eq!(
            via.kind,
            SpanKind::Client as i32,
            "each hop continues its caller's client span"
        );
        assert!(
            descends_from(&spans, via, caller),
            "the client span belongs to the caller's request"
        );

        let forwarded = number_attribute(caller, attr::DEADLINE_FORWARDED_MS).unwrap();
        let received = number_attribute(callee, attr::DEADLINE_RECEIVED_MS).unwrap();
        assert!(
            received <= forwarded,
            "received {received} ≤ forwarded {forwarded}"
        );
        assert!(
            number_attribute(callee, attr::DEADLINE_FORWARDED_MS).unwrap() < forwarded,
            "deeper is shorter"
        );
    }
    let budget = number_attribute(hops[0], attr::DEADLINE_RECEIVED_MS).unwrap();
    let spent: f64 = hops
        .iter()
        .map(|s| number_attribute(s, attr::DEADLINE_SPENT_MS).unwrap())
        .sum();
    assert!(
        spent <= budget,
        "the slices ({spent} ms spent) fit in the gateway's budget ({budget} ms)"
    );
}

#[tokio::test]
async fn each_hop_exports_under_its_own_service_name_and_the_links_cross_them() {
    exported();
    let test = TestChain::start().await;
    let response = test
        .post_order("traced-services", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let exported = trace_by_resource(&response, every_hop_served).await;
    let service_of = |span: &Span| {
        exported
            .iter()
            .find(|(_, s)| s.span_id == span.span_id)
            .map(|(resource, _)| otlp::service_name(resource))
    };
    let spans: Vec<Span> = exported.iter().map(|(_, span)| span.clone()).collect();

    let hops = ["gateway", "orders", "payment", "bank-mock"];
    let mut names: Vec<&str> = exported
        .iter()
        .map(|(resource, _)| otlp::service_name(resource))
        .collect();
    names.sort_unstable();
    names.dedup();
    let mut expected = hops.to_vec();
    expected.sort_unstable();
    assert_eq!(
        names, expected,
        "one service name per hop, and nothing under the process's name"
    );
    for hop in hops {
        let server = spans
            .iter()
            .find(|s| {
                s.kind == SpanKind::Server as i32 && text_attribute(s, attr::HOP) == Some(hop)
            })
            .unwrap_or_else(|| panic!("a server span for {hop}"));
        assert_eq!(
            service_of(server),
            Some(hop),
            "{hop}'s request span is exported as {hop}"
        );
    }
    for span in &spans {
        let Some(parent) = by_id(&spans, &span.parent_span_id) else {
            continue;
        };
        if service_of(span) != service_of(parent) {
            assert_eq!(
                parent.kind,
                SpanKind::Client as i32,
                "the service changes only below a client span: {}",
                parent.name
            );
            assert_eq!(
                span.kind,
                SpanKind::Server as i32,
                "and the callee's part starts with its server span: {}",
                span.name
            );
        }
    }
    let gateway_server = spans
        .iter()
        .find(|s| text_attribute(s, attr::HOP) == Some("gateway"))
        .expect("the gateway's span");
    let bank_server = spans
        .iter()
        .find(|s| text_attribute(s, attr::HOP) == Some("bank-mock"))
        .expect("the bank's span");
    assert!(
        descends_from(&spans, bank_server, gateway_server),
        "one tree from the gateway down to the bank"
    );

    // Each hop's resource names its version, its namespace and an instance id of its own, and
    // the environment: the defaults, as no OTEL_RESOURCE_ATTRIBUTES is set here.
    let mut instances = Vec::new();
    for service in stack::SERVICES
        .iter()
        .filter(|service| hops.contains(&service.name))
    {
        let (resource, _) = exported
            .iter()
            .find(|(resource, _)| otlp::service_name(resource) == service.name)
            .expect("spans of each hop");
        assert_eq!(
            resource_text(resource, "service.version"),
            Some(service.version),
            "{}",
            service.name
        );
        assert_eq!(
            resource_text(resource, "service.namespace"),
            Some(telemetry::SERVICE_NAMESPACE),
            "{}",
            service.name
        );
        assert_eq!(
            resource_text(resource, "deployment.environment.name"),
            Some(telemetry::DEFAULT_ENVIRONMENT),
            "{}",
            service.name
        );
        instances.push(
            resource_text(resource, "service.instance.id")
                .unwrap_or_else(|| panic!("{}: an instance id", service.name)),
        );
    }
    instances.sort_unstable();
    instances.dedup();
    assert_eq!(instances.len(), hops.len(), "an instance id per service");
}

#[tokio::test]
async fn every_request_and_call_span_follows_the_semantic_conventions() {
    exported();
    let test = TestChain::start().await;
    let response = test
        .post_order("traced-conventions", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let spans = trace_of(&response, every_hop_served).await;

    let http = spans
        .iter()
        .find(|s| text_attribute(s, attr::HTTP_REQUEST_METHOD).is_some())
        .expect("the gateway's HTTP span");
    assert_eq!(http.name, "POST /v1/orders");
    assert_eq!(http.kind, SpanKind::Server as i32);
    assert_eq!(text_attribute(http, attr::HTTP_ROUTE), Some("/v1/orders"));
    assert_eq!(text_attribute(http, attr::URL_SCHEME), Some("http"));
    assert_eq!(
        number_attribute(http, attr::HTTP_RESPONSE_STATUS_CODE),
        Some(201.0)
    );
    let grpc: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Server as i32 && s.span_id != http.span_id)
        .collect();
    let calls: Vec<&Span> = spans
        .iter()
        .filter(|s| s.kind == SpanKind::Client as i32)
        .collect();
    assert_eq!(
        (grpc.len(), calls.len()),
        (3, 3),
        "orders, payment and the bank serve; the gateway, orders and payment call"
    );
    for span in grpc.iter().chain(&calls) {
        let (service, method) = (
            text_attribute(span, attr::RPC_SERVICE).unwrap(),
            text_attribute(span, attr::RPC_METHOD).unwrap(),
        );
        assert_eq!(
            text_attribute(span, attr::RPC_SYSTEM),
            Some("grpc"),
            "{}",
            span.name
        );
        assert_eq!(
            span.name,
            format!("{service}/{method}"),
            "named by the method"
        );
        assert_eq!(
            number_attribute(span, attr::RPC_GRPC_STATUS_CODE),
            Some(0.0),
            "{}",
            span.name
        );
        assert_eq!(
            span.status.as_ref().map(|s| s.code),
            Some(StatusCode::Unset as i32),
            "{}",
            span.name
        );
    }
    for call in &calls {
        assert_eq!(
            text_attribute(call, attr::SERVER_ADDRESS),
            Some("127.0.0.1"),
            "{}",
            call.name
        );
        assert!(
            number_attribute(call, attr::SERVER_PORT).is_some_and(|port| port > 0.0),
            "{}",
            call.name
        );
    }
    let mut served: Vec<&str> = grpc
        .iter()
        .filter_map(|s| text_attribute(s, attr::RPC_SERVICE))
        .collect();
    served.sort_unstable();
    assert_eq!(
        served,
        [
            "bank.v1.Bank",
            "orders.v1.Orders",
            "payment.v1.PaymentService"
        ]
    );
}

#[tokio::test]
async fn a_504_marks_every_span_that_failed_as_an_error() {
    exported();
    let test = TestChain::start().await;
    test.set_faults(bank_mock::Faults {
        hang: true,
        ..bank_mock::Faults::default()
    });
    let response = test
        .post_order("traced-504", &order_body())
        .header("x-request-timeout-ms", "500")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 504);
    let spans = trace_of(&response, |spans| {
        spans
            .iter()
            .filter(|s| s.kind == SpanKind::Client as i32)
            .count()
            >= 3
    })
    .await;

    let failed = |span: &Span| {
        span.status
            .as_ref()
            .is_some_and(|status| status.code == StatusCode::Error as i32)
    };
    let http = spans
        .iter()
        .find(|s| text_attribute(s, attr::HTTP_REQUEST_METHOD).is_some())
        .expect("the gateway's HTTP span");
    assert_eq!(
        number_attribute(http, attr::HTTP_RESPONSE_STATUS_CODE),
        Some(504.0)
    );
    assert!(failed(http), "the 504 is an error: {:?}", http.status);
    for span in spans.iter().filter(|s| s.kind == SpanKind::Client as i32) {
        assert!(
            failed(span),
            "a call that got no OK is an error: {} {:?}",
            span.name,
            span.status
        );
    }
    // A server that answered DEADLINE_EXCEEDED is an error; one whose caller went away first
    // never answered, and has no status.
    let answered: Vec<&Span> = spans
        .iter()
        .filter(|s| {
            number_attribute(s, attr::RPC_GRPC_STATUS_CODE).is_some()
                && s.kind == SpanKind::Server as i32
        })
        .collect();
    assert!(
        answered.len() >= 2,
        "orders and payment answer by their deadlines"
    );
    for span in answered {
        assert_eq!(
            number_attribute(span, attr::RPC_GRPC_STATUS_CODE),
            Some(4.0),
            "{}",
            span.name
        );
        assert!(
            failed(span),
            "DEADLINE_EXCEEDED is the server's failure: {} {:?}",
            span.name,
            span.status
        );
    }
}

#[tokio::test]
async fn a_retried_call_shows_each_attempt_and_why_retrying_stopped() {
    exported();
    let test = TestChain::start().await;
    test.set_faults(e2e::fast_bank(|f| f.error_rate = 1.0));
    let response = test
        .post_order("traced-retry", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    let retries = test.chain.retry_stats().retries as usize;
    assert!(
        retries >= 1,
        "the budget's floor allows a retry at low traffic"
    );
    let spans = trace_of(&response, |spans| {
        spans.iter().filter(|s| s.name == "attempt").count() > retries
    })
    .await;

    let mut attempts: Vec<f64> = spans
        .iter()
        .filter(|s| s.name == "attempt")
        .filter_map(|s| number_attribute(s, "retry.attempt"))
        .collect();
    attempts.sort_by(f64::total_cmp);
    let expected: Vec<f64> = (1..=retries + 1).map(|n| n as f64).collect();
    assert_eq!(attempts, expected, "one span per attempt, numbered");

    let events: Vec<_> = spans.iter().flat_map(|s| &s.events).collect();
    assert!(
        events
            .iter()
            .any(|e| e.name == "retrying"
                && e.attributes.iter().any(|a| a.key == "retry.backoff_ms")),
        "the backoff is recorded"
    );
    let stopped = events
        .iter()
        .find(|e| e.name == "retrying stopped")
        .expect("why retrying stopped");
    assert!(
        stopped.attributes.iter().any(|a| a.key == "retry.stop"),
        "{stopped:?}"
    );
}

/// The first of `spans`' events named `name`.
fn event<'a>(
    spans: &'a [Span],
    name: &str,
) -> Option<&'a opentelemetry_proto::tonic::trace::v1::span::Event> {
    spans
        .iter()
        .flat_map(|s| &s.events)
        .find(|e| e.name == name)
}

#[tokio::test]
async fn a_full_bulkhead_and_an_open_breaker_show_in_the_trace() {
    exported();
    let test = TestChain::start_with(|s| {
        s.gateway.retry.max_attempts = 1;
        e2e::touchy_bank_guards(s);
    })
    .await;

    // A slow bank and two orders at once: one of them finds payment's bulkhead full.
    test.set_faults(e2e::fast_bank(|f| {
        f.latency_ms = bank_mock::Latency {
            mean: 300.0,
            stddev: 0.0,
        }
    }));
    let (first, second) = tokio::join!(
        test.post_order("bulkhead-a", &order_body()).send(),
        test.post_order("bulkhead-b", &order_body()).send()
    );
    let refused = [first.unwrap(), second.unwrap()]
        .into_iter()
        .find(|r| r.status() == 503)
        .expect("one order finds the bulkhead full");
    let spans = trace_of(&refused, |spans| {
        event(spans, "bulkhead rejected a call").is_some()
    })
    .await;
    let full =
        event(&spans, "bulkhead rejected a call").expect("the refusal is an event of the trace");
    assert!(
        full.attributes
            .iter()
            .any(|a| a.key == attr::BULKHEAD_LIMIT),
        "{full:?}"
    );

    // A failing bank opens the breaker; the next order is answered by it, or by orders, which
    // keeps the wait of the breaker's last answer and refuses before writing.
    test.set_faults(e2e::fast_bank(|f| f.error_rate = 1.0));
    for n in 0..5 {
        test.post_order(&format!("breaker-{n}"), &order_body())
            .send()
            .await
            .unwrap();
    }
    let answered = test
        .post_order("breaker-open", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 503);
    let open_circuit = |spans: &[Span]| {
        [
            "circuit breaker answered without calling",
            "refused before writing: payment's circuit is open",
        ]
        .into_iter()
        .find_map(|name| event(spans, name))
        .cloned()
    };
    let spans = trace_of(&answered, |spans| open_circuit(spans).is_some()).await;
    let open = open_circuit(&spans).expect("the open circuit's answer is an event of the trace");
    let state = open
        .attributes
        .iter()
        .find(|a| a.key == attr::BREAKER_STATE)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref());
    assert_eq!(
        state,
        Some(&opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue("open".into())),
        "{open:?}"
    );
}

#[tokio::test]
async fn metrics_are_pushed_over_otlp_too() {
    let (receiver, telemetry) = exported();
    let test = TestChain::start().await;
    assert_eq!(
        test.post_order("metrics-pushed", &order_body())
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
    let names = eventually(BACKGROUND, "the request metrics pushed", || async {
        telemetry.flush().await;
        let names = receiver.metric_names();
        names
            .iter()
            .any(|name| name == telemetry::metrics::name::REQUESTS)
            .then_some(names)
    })
    .await;
    use telemetry::metrics::name::{
        DEADLINE_SLACK, HTTP_SERVER_REQUEST_DURATION, REQUESTS, RPC_CLIENT_CALL_DURATION,
        RPC_SERVER_CALL_DURATION,
    };
    for name in [
        REQUESTS,
        DEADLINE_SLACK,
        HTTP_SERVER_REQUEST_DURATION,
        RPC_SERVER_CALL_DURATION,
        RPC_CLIENT_CALL_DURATION,
    ] {
        assert!(
            names.iter().any(|received| received == name),
            "{name} in {names:?}"
        );
    }
}

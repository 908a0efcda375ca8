//! Traces over real OTLP: one trace through the four hops, each hop's slice of the deadline on its
//! span. The services export to a receiver the test runs, exactly as to a collector.

use std::time::Duration;

use e2e::{
    TestChain, order_body,
    otlp::{OtlpReceiver, number_attribute, text_attribute},
};
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind};
use telemetry::{TelemetrySettings, attr};

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

/// The process's telemetry (installed once) and the receiver it exports to.
async fn exported() -> &'static (OtlpReceiver, telemetry::Telemetry) {
    static EXPORTED: tokio::sync::OnceCell<(OtlpReceiver, telemetry::Telemetry)> = tokio::sync::OnceCell::const_new();
    EXPORTED
        .get_or_init(|| async {
            let receiver = OtlpReceiver::start().await;
            let settings = TelemetrySettings { otlp_endpoint: Some(receiver.endpoint()), service_name: Some("chain-under-test".into()) };
            let telemetry = telemetry::init("tests", &settings).expect("exporter");
            (receiver, telemetry)
        })
        .await
}

/// The spans of the trace an answer names in `traceparent`, once `enough` of them are exported.
async fn trace_of(response: &reqwest::Response, enough: impl Fn(&[Span]) -> bool) -> Vec<Span> {
    let (receiver, telemetry) = exported().await;
    let traceparent = response.headers()["traceparent"].to_str().unwrap().to_owned();
    let trace_id = traceparent.split('-').nth(1).expect("version-traceid-spanid-flags").to_owned();
    let mut spans = Vec::new();
    for _ in 0..50 {
        telemetry.flush().await;
        spans = receiver.trace(&trace_id);
        if enough(&spans) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    spans
}

#[tokio::test]
async fn one_trace_crosses_every_hop_and_shows_each_slice_of_the_deadline() {
    exported().await;
    let test = TestChain::start().await;
    let response = test.post_order("traced-1", &order_body()).send().await.unwrap();
    assert_eq!(response.status(), 201);
    let spans = trace_of(&response, |spans| spans.iter().filter(|s| s.kind == SpanKind::Server as i32).count() >= 4).await;

    let server = |hop: &str| {
        spans
            .iter()
            .find(|s| s.kind == SpanKind::Server as i32 && text_attribute(s, attr::HOP) == Some(hop))
            .unwrap_or_else(|| panic!("a server span for {hop} in the answer's trace"))
    };
    let hops = ["gateway", "orders", "payment", "bank-mock"].map(server);
    for pair in hops.windows(2) {
        let (caller, callee) = (pair[0], pair[1]);
        let via = by_id(&spans, &callee.parent_span_id).expect("the callee's parent is exported");
        assert_eq!(via.kind, SpanKind::Client as i32, "each hop continues its caller's client span");
        assert!(descends_from(&spans, via, caller), "the client span belongs to the caller's request");

        let forwarded = number_attribute(caller, attr::DEADLINE_FORWARDED_MS).unwrap();
        let received = number_attribute(callee, attr::DEADLINE_RECEIVED_MS).unwrap();
        assert!(received <= forwarded, "received {received} ≤ forwarded {forwarded}");
        assert!(number_attribute(callee, attr::DEADLINE_FORWARDED_MS).unwrap() < forwarded, "deeper is shorter");
    }
    let budget = number_attribute(hops[0], attr::DEADLINE_RECEIVED_MS).unwrap();
    let spent: f64 = hops.iter().map(|s| number_attribute(s, attr::DEADLINE_SPENT_MS).unwrap()).sum();
    assert!(spent <= budget, "the slices ({spent} ms spent) fit in the gateway's budget ({budget} ms)");
}

#[tokio::test]
async fn a_retried_call_shows_each_attempt_and_why_retrying_stopped() {
    exported().await;
    let test = TestChain::start().await;
    test.set_faults(e2e::fast_bank(|f| f.error_rate = 1.0));
    let response = test.post_order("traced-retry", &order_body()).send().await.unwrap();
    assert_eq!(response.status(), 503);
    let retries = test.chain.retry_stats().retries as usize;
    assert!(retries >= 1, "the budget's floor allows a retry at low traffic");
    let spans = trace_of(&response, |spans| spans.iter().filter(|s| s.name == "attempt").count() > retries).await;

    let mut attempts: Vec<f64> = spans.iter().filter(|s| s.name == "attempt").filter_map(|s| number_attribute(s, "retry.attempt")).collect();
    attempts.sort_by(f64::total_cmp);
    let expected: Vec<f64> = (1..=retries + 1).map(|n| n as f64).collect();
    assert_eq!(attempts, expected, "one span per attempt, numbered");

    let events: Vec<_> = spans.iter().flat_map(|s| &s.events).collect();
    assert!(events.iter().any(|e| e.name == "retrying" && e.attributes.iter().any(|a| a.key == "retry.backoff_ms")), "the backoff is recorded");
    let stopped = events.iter().find(|e| e.name == "retrying stopped").expect("why retrying stopped");
    assert!(stopped.attributes.iter().any(|a| a.key == "retry.stop"), "{stopped:?}");
}

//! The server and client tower layers, driven on tokio's paused clock.
//!
//! Every test starts paused and moves time only with `advance`, so "not before, exactly at" claims
//! about deadlines are checked to the millisecond without real sleeps.

use std::{
    convert::Infallible,
    future::{Future, poll_fn},
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    task::Poll,
    time::Duration,
};

use deadline::{
    Deadline, EstimateSettings, Forward, ForwardPolicy, Hop, HopStats, HopStatsSnapshot,
    InboundPolicy, LatencyEstimate, Slice,
    client::{ForwardDeadline, ForwardDeadlineLayer},
    grpc_timeout,
    ledger::{self, Entry},
    server::{DeadlineLayer, DeadlineService, Grpc},
};
use http::{Request, Response};
use tokio::time::{Instant, advance, sleep};
use tonic::{Code, Status};
use tower::{BoxError, Layer, Service, ServiceExt, service_fn};

const fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

/// orders → payment as the services configure it: keep up to 200 ms, never call with under 50 ms.
const TO_PAYMENT: ForwardPolicy = ForwardPolicy {
    reserve_ms: 200,
    reserve_max_share: 0.2,
    cap_ms: None,
    min_forward_ms: 50,
};

/// Polls `future` exactly once, so a test can tell whether it has answered at this instant.
async fn poll_once<F: Future>(mut future: Pin<&mut F>) -> Poll<F::Output> {
    poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await
}

/// Drives `call` on the paused clock and returns its output, asserting that it answers exactly
/// `after` from now: still pending 1 ms before, ready at that instant.
async fn expect_answer_after<F: Future>(mut call: Pin<Box<F>>, after: Duration) -> F::Output {
    assert!(
        poll_once(call.as_mut()).await.is_pending(),
        "answered immediately"
    );
    advance(after - ms(1)).await;
    assert!(
        poll_once(call.as_mut()).await.is_pending(),
        "answered before {after:?}"
    );
    advance(ms(1)).await;
    match poll_once(call.as_mut()).await {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("no answer at {after:?}"),
    }
}

/// `request` as a call made under `hop`, as `Hop::request` makes it.
fn under(hop: &Arc<Hop>, mut request: Request<String>) -> Request<String> {
    request.extensions_mut().insert(hop.clone());
    request
}

fn grpc_request(timeout: Option<&str>) -> Request<String> {
    let mut request = Request::new("request".to_owned());
    if let Some(timeout) = timeout {
        request
            .headers_mut()
            .insert(wire::GRPC_TIMEOUT, timeout.parse().unwrap());
    }
    request
}

/// The gRPC status of a trailers-only answer, read from its headers.
fn status_of<B>(response: &Response<B>) -> Status {
    Status::from_header_map(response.headers()).expect("a grpc-status header")
}

fn ledger_of<B>(response: &Response<B>) -> Vec<Entry> {
    let header = response
        .headers()
        .get(wire::DEADLINE_LEDGER)
        .expect("an x-deadline-ledger header");
    ledger::parse(header.to_str().unwrap()).unwrap()
}

fn ok_response() -> Result<Response<String>, Infallible> {
    Ok(Response::new("ok".to_owned()))
}

/// A handler that answers at once and counts how often it was called.
fn counting_handler(
    calls: &Arc<AtomicUsize>,
) -> impl Service<Request<String>, Response = Response<String>, Error = Infallible> + use<> {
    let calls = Arc::clone(calls);
    service_fn(move |_: Request<String>| {
        calls.fetch_add(1, Ordering::SeqCst);
        async { ok_response() }
    })
}

/// Answers with the request's body and a copy of its headers, to show what the layer sent.
async fn mirror(request: Request<String>) -> Result<Response<String>, Infallible> {
    let (parts, body) = request.into_parts();
    let mut response = Response::new(body);
    *response.headers_mut() = parts.headers;
    Ok(response)
}

/// Serves `handler` as hop "orders".
fn serve<S>(policy: InboundPolicy, stats: &Arc<HopStats>, handler: S) -> DeadlineService<S, Grpc> {
    DeadlineLayer::new("orders", Grpc::new(policy), Arc::clone(stats)).layer(handler)
}

/// Calls `inner` as dependency "payment" with [`TO_PAYMENT`].
fn to_payment<S>(inner: S) -> ForwardDeadline<S> {
    ForwardDeadlineLayer::new("payment", TO_PAYMENT).layer(inner)
}

/// The hop a served request to orders would run as, with `budget` from now.
fn orders_hop(budget: Duration) -> Arc<Hop> {
    Arc::new(Hop::new(
        "orders",
        Deadline::after(Instant::now(), budget),
        HopStats::new(),
    ))
}

// Server layer.

#[tokio::test(start_paused = true)]
async fn server_answers_deadline_exceeded_exactly_when_grpc_timeout_runs_out() {
    let stats = HopStats::new();
    let slow_handler = service_fn(|_: Request<String>| async {
        sleep(ms(500)).await;
        ok_response()
    });
    let service = serve(InboundPolicy::default(), &stats, slow_handler);

    let call = Box::pin(service.oneshot(grpc_request(Some("100m"))));
    let response = expect_answer_after(call, ms(100)).await.unwrap();

    assert_eq!(status_of(&response).code(), Code::DeadlineExceeded);
    let entries = ledger_of(&response);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(entries[0].hop, "orders");
    assert_eq!(entries[0].received, ms(100));
    assert_eq!(
        stats.snapshot(),
        HopStatsSnapshot {
            requests: 1,
            expired: 1,
            finished_late: 0,
            ..Default::default()
        }
    );
    let recent = stats.recent_answers();
    assert_eq!((recent.len(), recent[0].outcome), (1, "expired"));
    assert_eq!(
        recent[0].ledger, entries,
        "the hop keeps the ledger it sent"
    );
}

#[tokio::test(start_paused = true)]
async fn server_hands_the_handler_its_hop_and_returns_its_ledger() {
    let stats = HopStats::new();
    let handler = service_fn(|request: Request<String>| async move {
        let hop = request
            .extensions()
            .get::<Arc<Hop>>()
            .cloned()
            .expect("the handler gets its hop with the request");
        assert_eq!(hop.name(), "orders");
        assert_eq!(hop.deadline().budget(), ms(500));
        ok_response()
    });
    let service = serve(InboundPolicy::default(), &stats, handler);

    let response = service.oneshot(grpc_request(Some("500m"))).await.unwrap();

    // The body proves the handler ran to completion, so its assertions were reached.
    assert_eq!(response.body(), "ok");
    let entries = ledger_of(&response);
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(
        (entries[0].hop.as_str(), entries[0].received),
        ("orders", ms(500))
    );
    assert_eq!(
        stats.snapshot(),
        HopStatsSnapshot {
            requests: 1,
            ..Default::default()
        }
    );
    assert_eq!(
        stats
            .recent_answers()
            .iter()
            .map(|answer| (answer.outcome, answer.ledger.clone()))
            .collect::<Vec<_>>(),
        [("in_time", entries)]
    );
}

#[tokio::test(start_paused = true)]
async fn server_keeps_the_last_twenty_ledgers_newest_first() {
    let stats = HopStats::new();
    for budget in 1..=25 {
        let service = serve(
            InboundPolicy::default(),
            &stats,
            service_fn(|_: Request<String>| async { ok_response() }),
        );
        service
            .oneshot(grpc_request(Some(&format!("{budget}0m"))))
            .await
            .unwrap();
    }
    let received: Vec<Duration> = stats
        .recent_answers()
        .iter()
        .map(|answer| answer.ledger[0].received)
        .collect();
    assert_eq!(
        received,
        (6..=25)
            .rev()
            .map(|budget| ms(budget * 10))
            .collect::<Vec<_>>()
    );
}

#[tokio::test(start_paused = true)]
async fn server_grants_the_default_budget_without_grpc_timeout_and_caps_longer_ones() {
    let policy = InboundPolicy {
        default_ms: 300,
        max_ms: 1_000,
        ..InboundPolicy::default()
    };
    let granted_budget = |timeout: Option<&'static str>| async move {
        let report_budget = service_fn(|request: Request<String>| async move {
            let budget = request
                .extensions()
                .get::<Arc<Hop>>()
                .unwrap()
                .deadline()
                .budget();
            Ok::<_, Infallible>(Response::new(budget.as_millis().to_string()))
        });
        let response = serve(policy, &HopStats::new(), report_budget)
            .oneshot(grpc_request(timeout))
            .await
            .unwrap();
        response.into_body()
    };

    assert_eq!(granted_budget(None).await, "300");
    assert_eq!(granted_budget(Some("5S")).await, "1000");
    assert_eq!(granted_budget(Some("700m")).await, "700");
}

#[tokio::test(start_paused = true)]
async fn server_rejects_malformed_grpc_timeout_without_calling_the_handler() {
    for malformed in ["abc", "123456789m"] {
        let calls = Arc::new(AtomicUsize::new(0));
        let service = serve(
            InboundPolicy::default(),
            &HopStats::new(),
            counting_handler(&calls),
        );

        let response = service
            .oneshot(grpc_request(Some(malformed)))
            .await
            .unwrap();

        let status = status_of(&response);
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{malformed}: {status:?}"
        );
        assert!(
            status.message().contains(malformed),
            "{malformed}: {status:?}"
        );
        assert_eq!(
            calls.load(Ordering::SeqCst),
            0,
            "{malformed}: the handler was called"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn server_counts_a_response_dropped_before_it_answers_as_abandoned() {
    let stats = HopStats::new();
    let never_answers = service_fn(|_: Request<String>| {
        std::future::pending::<Result<Response<String>, Infallible>>()
    });
    let mut call = Box::pin(
        serve(InboundPolicy::default(), &stats, never_answers).oneshot(grpc_request(Some("1S"))),
    );
    assert!(poll_once(call.as_mut()).await.is_pending());
    advance(ms(10)).await;

    // The caller goes away: tonic drops the response future.
    drop(call);

    assert_eq!(
        stats.snapshot(),
        HopStatsSnapshot {
            requests: 1,
            abandoned: 1,
            ..Default::default()
        }
    );
}

// Client layer.

#[tokio::test(start_paused = true)]
async fn client_forwards_remaining_budget_less_reserve_as_grpc_timeout() {
    let hop = orders_hop(ms(2_000));
    let response = to_payment(service_fn(mirror))
        .oneshot(under(&hop, grpc_request(None)))
        .await
        .unwrap();

    let sent = response
        .headers()
        .get(wire::GRPC_TIMEOUT)
        .expect("a grpc-timeout header")
        .to_str()
        .unwrap();
    assert_eq!(sent, grpc_timeout::format(ms(1_800)));
    assert_eq!(grpc_timeout::parse(sent), Ok(ms(1_800)));
}

#[tokio::test(start_paused = true)]
async fn client_fails_fast_below_the_minimum_without_calling() {
    let hop = orders_hop(ms(60));
    let calls = Arc::new(AtomicUsize::new(0));
    let service = to_payment(counting_handler(&calls));

    // 60 ms left, 12 ms reserved: 48 ms is below payment's 50 ms minimum.
    let response = service
        .oneshot(under(&hop, grpc_request(None)))
        .await
        .unwrap();

    let status = status_of(&response);
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert!(status.message().starts_with("orders:"), "{status:?}");
    assert!(status.message().contains("for payment"), "{status:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(
        hop.stats().snapshot(),
        HopStatsSnapshot {
            failed_fast: 1,
            ..Default::default()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn client_fails_fast_below_what_the_dependency_has_been_taking() {
    let calls = Arc::new(AtomicUsize::new(0));
    let slow_payment = {
        let calls = Arc::clone(&calls);
        service_fn(move |_: Request<String>| {
            calls.fetch_add(1, Ordering::SeqCst);
            async {
                sleep(ms(400)).await;
                ok_response()
            }
        })
    };
    let settings = EstimateSettings {
        window_ms: 1_000,
        min_samples: 10,
        probe_interval_ms: 1_000,
        ..EstimateSettings::default()
    };
    let estimate = Arc::new(LatencyEstimate::new(settings));
    let service = ForwardDeadlineLayer::new("payment", TO_PAYMENT)
        .with_estimate(estimate.clone())
        .layer(slow_payment);

    // A window of answers that took 400 ms each, made with ample budget.
    let warm_up = (0..10).map(|_| {
        service
            .clone()
            .oneshot(under(&orders_hop(ms(2_000)), grpc_request(None)))
    });
    for answer in futures::future::join_all(warm_up).await {
        assert_eq!(answer.unwrap().body(), "ok");
    }
    advance(ms(1_000)).await;

    // 300 ms left, 60 ms kept: 240 ms is below the 400 ms payment has been taking. The first such
    // call is the window's probe; the next is not made.
    let hop = orders_hop(ms(300));
    let probe = service
        .clone()
        .oneshot(under(&hop, grpc_request(None)))
        .await
        .unwrap();
    assert_eq!(
        status_of(&probe).code(),
        Code::DeadlineExceeded,
        "the probe ran out of its 240 ms"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 11);

    let hop = orders_hop(ms(300));
    let refused = service
        .clone()
        .oneshot(under(&hop, grpc_request(None)))
        .await
        .unwrap();
    let status = status_of(&refused);
    assert_eq!(status.code(), Code::DeadlineExceeded);
    for needle in [
        "orders: payment has needed 40",
        "p90 of its recent answers",
        "only 240.0 ms are left",
        "not calling",
    ] {
        assert!(
            status.message().contains(needle),
            "{needle:?} in {status:?}"
        );
    }
    assert_eq!(
        refused.headers()[wire::DEADLINE_FAILED_FAST],
        "orders",
        "the edge does not retry it"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 11, "payment was not called");
    assert_eq!(hop.stats().snapshot().failed_fast, 1);

    // A call with more than the estimate is made.
    let ample = service
        .clone()
        .oneshot(under(&orders_hop(ms(1_000)), grpc_request(None)))
        .await
        .unwrap();
    assert_eq!(ample.body(), "ok");
    let snapshot = estimate.snapshot(Instant::now());
    assert_eq!(
        (snapshot.refused, snapshot.probes, snapshot.samples),
        (1, 1, 10)
    );
}

#[tokio::test(start_paused = true)]
async fn client_stops_waiting_exactly_when_the_forwarded_budget_runs_out() {
    let hop = orders_hop(ms(2_000));
    let never_answers = service_fn(|_: Request<String>| {
        std::future::pending::<Result<Response<String>, Infallible>>()
    });
    {
        let hop = hop;
        // Time spent at orders before the call shrinks what is forwarded: 1.9 s left, 1.7 s sent.
        advance(ms(100)).await;
        let call = Box::pin(to_payment(never_answers).oneshot(under(&hop, grpc_request(None))));
        let response = expect_answer_after(call, ms(1_700)).await.unwrap();

        let status = status_of(&response);
        assert_eq!(status.code(), Code::DeadlineExceeded);
        assert!(
            status
                .message()
                .contains("payment did not answer within the 1700 ms"),
            "{status:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn client_names_the_slice_on_every_deadline_exceeded_and_whether_it_was_capped() {
    let never_answers = || {
        service_fn(|_: Request<String>| {
            std::future::pending::<Result<Response<String>, Infallible>>()
        })
    };
    let slice_of = |response: &Response<String>| Slice::from_headers(response.headers());
    {
        let hop = orders_hop(ms(2_000));
        // All that was left after the reserve: a retry could not have it again.
        let call = Box::pin(to_payment(never_answers()).oneshot(under(&hop, grpc_request(None))));
        let response = expect_answer_after(call, ms(1_800)).await.unwrap();
        assert_eq!(slice_of(&response), Some(Slice::new(ms(1_800), false)));
    }
    {
        let hop = orders_hop(ms(2_000));
        // Capped at 500 ms of the 1.8 s left.
        let capped = ForwardDeadlineLayer::new(
            "payment",
            ForwardPolicy {
                cap_ms: Some(500),
                ..TO_PAYMENT
            },
        )
        .layer(never_answers());
        let response = expect_answer_after(
            Box::pin(capped.oneshot(under(&hop, grpc_request(None)))),
            ms(500),
        )
        .await
        .unwrap();
        assert_eq!(slice_of(&response), Some(Slice::new(ms(500), true)));
    }
    // The dependency's own DEADLINE_EXCEEDED is named too; other answers are not.
    let expired = service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(
            Status::deadline_exceeded("bank-mock: out of time").into_http::<String>(),
        )
    });
    let response = to_payment(expired)
        .oneshot(under(&orders_hop(ms(2_000)), grpc_request(None)))
        .await
        .unwrap();
    assert_eq!(slice_of(&response), Some(Slice::new(ms(1_800), false)));
    let response = to_payment(service_fn(mirror))
        .oneshot(under(&orders_hop(ms(2_000)), grpc_request(None)))
        .await
        .unwrap();
    assert_eq!(slice_of(&response), None);
}

#[tokio::test(start_paused = true)]
async fn client_keeps_a_shorter_timeout_the_caller_set() {
    let hop = orders_hop(ms(2_000));
    let response = to_payment(service_fn(mirror))
        .oneshot(under(&hop.clone(), grpc_request(Some("300m"))))
        .await
        .unwrap();
    assert_eq!(
        response.headers()[wire::GRPC_TIMEOUT].to_str().unwrap(),
        grpc_timeout::format(ms(300))
    );
    assert_eq!(
        hop.entry_at(Instant::now()).forwarded,
        ms(300),
        "the ledger shows what was sent"
    );

    // A longer one gives way to the hop's slice.
    let response = to_payment(service_fn(mirror))
        .oneshot(under(&orders_hop(ms(2_000)), grpc_request(Some("5S"))))
        .await
        .unwrap();
    assert_eq!(
        response.headers()[wire::GRPC_TIMEOUT].to_str().unwrap(),
        grpc_timeout::format(ms(1_800))
    );

    let never_answers = service_fn(|_: Request<String>| {
        std::future::pending::<Result<Response<String>, Infallible>>()
    });
    {
        let hop = orders_hop(ms(2_000));
        let call =
            Box::pin(to_payment(never_answers).oneshot(under(&hop, grpc_request(Some("300m")))));
        let response = expect_answer_after(call, ms(300)).await.unwrap();
        assert_eq!(
            Slice::from_headers(response.headers()),
            Some(Slice::new(ms(300), true)),
            "a retry could have 300 ms again"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn client_turns_tonic_timeout_expired_into_deadline_exceeded() {
    let timing_out = service_fn(|_: Request<String>| async {
        Err::<Response<String>, BoxError>(Box::new(tonic::TimeoutExpired(())))
    });

    let response = to_payment(timing_out)
        .oneshot(under(&orders_hop(ms(2_000)), grpc_request(None)))
        .await;

    assert_eq!(status_of(&response.unwrap()).code(), Code::DeadlineExceeded);
}

#[tokio::test(start_paused = true)]
async fn client_passes_other_transport_errors_through() {
    let failing = service_fn(|_: Request<String>| async {
        Err::<Response<String>, BoxError>(Box::new(std::io::Error::other("connection reset")))
    });

    let error = to_payment(failing)
        .oneshot(under(&orders_hop(ms(2_000)), grpc_request(None)))
        .await
        .unwrap_err();

    assert_eq!(error.to_string(), "connection reset");
}

#[tokio::test(start_paused = true)]
async fn client_relabels_cancelled_arriving_at_the_deadline_as_deadline_exceeded() {
    // A peer whose own timer fired answers CANCELLED, trailers-only, as the 1.8 s it was given run out.
    let cancelled_late = service_fn(|_: Request<String>| async {
        sleep(ms(1_800)).await;
        Ok::<_, Infallible>(Status::cancelled("timeout expired").into_http::<String>())
    });

    {
        let hop = orders_hop(ms(2_000));
        let call = Box::pin(to_payment(cancelled_late).oneshot(under(&hop, grpc_request(None))));
        let response = expect_answer_after(call, ms(1_800)).await.unwrap();

        // The peer's own answer, relabelled, not the layer's "did not answer" one.
        let status = status_of(&response);
        assert_eq!(
            (status.code(), status.message()),
            (Code::DeadlineExceeded, "timeout expired")
        );
    }
}

#[tokio::test(start_paused = true)]
async fn client_leaves_cancelled_within_the_budget_alone() {
    let cancelled = service_fn(|_: Request<String>| async {
        Ok::<_, Infallible>(Status::cancelled("client went away").into_http::<String>())
    });

    let response = to_payment(cancelled)
        .oneshot(under(&orders_hop(ms(2_000)), grpc_request(None)))
        .await
        .unwrap();

    assert_eq!(status_of(&response).code(), Code::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn client_appends_the_downstream_ledger_after_its_own_entry() {
    let hop = orders_hop(ms(2_000));
    // The dependency is a real payment hop, so its ledger entry is the one the server layer writes.
    let payment = DeadlineLayer::new("payment", Grpc::default(), HopStats::new())
        .layer(service_fn(|_: Request<String>| async { ok_response() }));

    {
        let hop = hop.clone();
        advance(ms(100)).await;
        let response = to_payment(payment)
            .oneshot(under(&hop, grpc_request(None)))
            .await
            .unwrap();
        assert_eq!(response.body(), "ok");
        // orders composes its own reply after payment answered.
        advance(ms(30)).await;
    }

    let planned = TO_PAYMENT.plan(ms(1_900)).unwrap();
    assert_eq!(
        planned,
        Forward {
            reserved: ms(200),
            forwarded: ms(1_700)
        }
    );
    let entries = ledger::parse(&hop.ledger_at(Instant::now())).unwrap();
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!(
        entries[0],
        Entry {
            hop: "orders".into(),
            received: ms(2_000),
            spent: ms(100),
            reserved: planned.reserved,
            forwarded: planned.forwarded,
            left: ms(1_870),
        }
    );
    assert_eq!(entries[1].hop, "payment");
    assert_eq!(entries[1].received, planned.forwarded);
}

#[tokio::test(start_paused = true)]
async fn client_sends_a_deadline_the_caller_set_on_a_call_under_no_hop_untouched() {
    let mut request = grpc_request(Some("300m"));
    request
        .headers_mut()
        .insert("x-request-id", "42".parse().unwrap());
    let sent_headers = request.headers().clone();

    let response = to_payment(service_fn(mirror))
        .oneshot(request)
        .await
        .unwrap();

    assert_eq!(
        response.headers(),
        &sent_headers,
        "the caller's grpc-timeout kept, nothing added"
    );
    assert_eq!(response.body(), "request");
}

/// A log sink for one test: what a `tracing` subscriber writes, kept to be read back.
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// A call made under no hop has no deadline to forward: it is refused (never sent with none) and
/// a warning names the method.
#[tokio::test(start_paused = true)]
async fn a_call_under_no_hop_is_refused_and_warned_about() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _logging = tracing::subscriber::set_default(subscriber);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let client = to_payment(service_fn(move |request: Request<String>| {
        counted.fetch_add(1, Ordering::SeqCst);
        mirror(request)
    }));

    let mut request = grpc_request(None);
    *request.uri_mut() = "/payment.v1.PaymentService/Pay".parse().unwrap();
    let response = client.oneshot(request).await.unwrap();

    assert_eq!(calls.load(Ordering::SeqCst), 0, "nothing was sent");
    let status = status_of(&response);
    assert_eq!(status.code(), Code::Internal);
    assert!(
        status.message().contains("/payment.v1.PaymentService/Pay"),
        "{status:?}"
    );
    let logged = logs.text();
    assert!(
        logged.contains("WARN")
            && logged.contains(r#"method="/payment.v1.PaymentService/Pay""#)
            && logged.contains("no deadline"),
        "{logged}"
    );
}

/// A task spawned from a handler takes the hop along like any value, and its call forwards the
/// handler's remaining budget.
#[tokio::test(start_paused = true)]
async fn a_spawned_task_that_takes_the_hop_forwards_its_deadline() {
    let client = to_payment(service_fn(mirror));
    let hop = orders_hop(ms(2_000));
    let response = tokio::spawn(client.oneshot(under(&hop, grpc_request(None))))
        .await
        .unwrap()
        .unwrap();

    let sent = response
        .headers()
        .get(wire::GRPC_TIMEOUT)
        .expect("a grpc-timeout header")
        .to_str()
        .unwrap();
    assert_eq!(
        grpc_timeout::parse(sent),
        Ok(ms(1_800)),
        "2000 ms less orders' 200 ms reserve"
    );
}

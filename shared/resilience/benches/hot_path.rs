//! The resilience layers' bookkeeping on every request: the retry policy's budget deposit (each
//! request) and withdrawal (each retry), and the circuit breaker's admission and verdict (each
//! call), or its refusal when open. `cargo bench -p resilience` runs them.

use std::{
    hint::black_box,
    pin::pin,
    sync::Arc,
    task::{Context, Poll, Waker},
    time::Duration,
};

use criterion::{Criterion, criterion_group, criterion_main};
use deadline::{Deadline, ForwardPolicy, Hop, HopStats};
use resilience::{
    breaker::{Breaker, BreakerService, BreakerSettings},
    retry::{Call, RetryPolicy, RetrySettings},
};
use tonic::{Status, metadata::MetadataMap};
use tower::{BoxError, Service, retry::Policy, service_fn};

/// The answer of a future that must be ready at once (the services here answer without waiting).
/// The gateway's forwarding toward orders, as configured by default.
const TO_ORDERS: ForwardPolicy = ForwardPolicy {
    reserve_ms: 20,
    reserve_max_share: 0.2,
    cap_ms: None,
    min_forward_ms: 50,
};

fn at_once<F: Future>(future: F) -> F::Output {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("the future was not ready at once"),
    }
}

/// The first attempt of a request as tower's retry layer starts it: the policy deposits into
/// the budget and keeps a copy of the call.
fn first_attempt(policy: &mut RetryPolicy, call: &Call<()>) -> Call<()> {
    Policy::<Call<()>, (), Status>::clone_request(policy, call).expect("calls clone")
}

/// A request being served at the gateway, with a 2 s deadline: what the retry policy consults.
fn gateway_hop() -> Arc<Hop> {
    Arc::new(Hop::new(
        "gateway",
        Deadline::after(tokio::time::Instant::now(), Duration::from_secs(2)),
        HopStats::new(),
    ))
}

fn retry_budget(c: &mut Criterion) {
    // A retry's wait is a tokio timer, which needs a runtime to exist (not to run).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let _entered = runtime.enter();
    let mut group = c.benchmark_group("retry policy");
    let call = Call::new((), MetadataMap::new(), gateway_hop());

    let policy = RetryPolicy::new(&RetrySettings::default(), TO_ORDERS).expect("valid settings");
    group.bench_function("a request answered: budget deposit and success", |b| {
        b.iter(|| {
            // tower clones the policy for every request.
            let mut policy = policy.clone();
            let mut call = first_attempt(&mut policy, black_box(&call));
            policy.retry(&mut call, &mut Ok::<_, Status>(()))
        })
    });

    // Every deposit funds one withdrawal, so that each iteration's retry is allowed, as the
    // first retries under the default 10 % are; the throttle is off, since every iteration fails.
    let funded = RetryPolicy::new(
        &RetrySettings {
            budget_percent: 1.0,
            throttle_max_tokens: 0,
            ..RetrySettings::default()
        },
        TO_ORDERS,
    )
    .expect("valid settings");
    group.bench_function(
        "an attempt failed: budget deposit, backoff and withdrawal",
        |b| {
            b.iter(|| {
                let mut policy = funded.clone();
                let mut call = first_attempt(&mut policy, black_box(&call));
                let wait = policy.retry(
                    &mut call,
                    &mut Err::<(), _>(Status::unavailable("bank-mock: down")),
                );
                assert!(wait.is_some(), "the retry is allowed");
                wait
            })
        },
    );
    group.finish();
}

fn breaker(c: &mut Criterion) {
    let mut group = c.benchmark_group("circuit breaker");
    let succeeding = service_fn(|_: http::Request<()>| {
        std::future::ready(Ok::<_, BoxError>(http::Response::new(())))
    });
    let mut closed = BreakerService::new(
        succeeding,
        Breaker::new("payment", "bank-mock", BreakerSettings::default()),
    );
    group.bench_function("closed: admit a call and record its success", |b| {
        b.iter(|| at_once(closed.call(black_box(http::Request::new(())))))
    });

    let settings = BreakerSettings {
        open_ms: Duration::from_secs(3_600).as_millis() as u64,
        ..BreakerSettings::default()
    };
    let failing = service_fn(|_: http::Request<()>| {
        std::future::ready(Ok::<_, BoxError>(
            Status::unavailable("down").into_http::<()>(),
        ))
    });
    let mut open = BreakerService::new(failing, Breaker::new("payment", "bank-mock", settings));
    for _ in 0..settings.window_calls {
        at_once(open.call(http::Request::new(()))).expect("failures are answers");
    }
    let refused = at_once(open.call(http::Request::new(()))).expect("a refusal is an answer");
    assert!(
        refused.headers().contains_key(wire::CIRCUIT_OPEN),
        "the breaker is open"
    );
    group.bench_function("open: refuse a call at once", |b| {
        b.iter(|| at_once(open.call(black_box(http::Request::new(())))))
    });
    group.finish();
}

criterion_group!(benches, retry_budget, breaker);
criterion_main!(benches);

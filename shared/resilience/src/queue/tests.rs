use std::convert::Infallible;

use futures::FutureExt;
use tokio::{sync::mpsc, time::advance};
use tower::{ServiceExt, service_fn};

use super::*;

const MS: fn(u64) -> Duration = Duration::from_millis;

/// Lets one handler answer per permit added.
type Gate = Arc<tokio::sync::Semaphore>;

type Handler = tower::util::BoxCloneSyncService<Request<String>, Response<String>, Infallible>;

/// Answers with its request's body once `gate` lets it, after telling `started` its body.
fn gated(gate: &Gate, started: mpsc::UnboundedSender<String>) -> Handler {
    let gate = gate.clone();
    Handler::new(service_fn(move |request: Request<String>| {
        let (gate, started) = (gate.clone(), started.clone());
        async move {
            let _ = started.send(request.body().clone());
            gate.acquire().await.expect("open").forget();
            Ok(Response::new(request.into_body()))
        }
    }))
}

fn settings(workers: u32, max_waiting: u32) -> QueueSettings {
    QueueSettings {
        enabled: true,
        workers,
        target_ms: 5,
        interval_ms: 100,
        max_waiting,
    }
}

fn call(service: &QueueService<Handler>, name: &str) -> tokio::task::JoinHandle<Response<String>> {
    let request = Request::new(name.to_owned());
    let service = service.clone();
    tokio::spawn(async move { service.oneshot(request).await.unwrap() })
}

#[tokio::test(start_paused = true)]
async fn beyond_the_workers_requests_wait_their_turn_in_order_and_a_full_queue_refuses() {
    let gate = Gate::new(tokio::sync::Semaphore::new(0));
    let (started, mut starts) = mpsc::unbounded_channel();
    let queue = Queue::new("gateway", settings(1, 2));
    let service = QueueLayer::new(queue.clone()).layer(gated(&gate, started));

    let first = call(&service, "first");
    assert_eq!(starts.recv().await.unwrap(), "first");
    let second = call(&service, "second");
    let third = call(&service, "third");
    tokio::task::yield_now().await;
    assert_eq!(queue.stats().waiting, 2);

    let refused = service
        .clone()
        .oneshot(Request::new("fourth".to_owned()))
        .now_or_never()
        .expect("at once")
        .unwrap();
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(refused.headers()[http::header::RETRY_AFTER], "1");

    // Short waits: no standing queue, first come first served.
    for (answer, next) in [(first, "second"), (second, "third")] {
        gate.add_permits(1);
        answer.await.unwrap();
        assert_eq!(starts.recv().await.unwrap(), next);
    }
    gate.add_permits(1);
    third.await.unwrap();
    assert_eq!(
        queue.stats(),
        QueueStats {
            workers: 1,
            running: 0,
            waiting: 0,
            overloaded: false,
            shed: 0,
            refused: 1
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_standing_queue_sheds_what_waited_longest_and_serves_the_newest_first() {
    let gate = Gate::new(tokio::sync::Semaphore::new(0));
    let (started, mut starts) = mpsc::unbounded_channel();
    let queue = Queue::new("gateway", settings(1, 100));
    let service = QueueLayer::new(queue.clone()).layer(gated(&gate, started));

    // One worker, busy for 150 ms while requests arrive every 10 ms.
    let busy = call(&service, "busy");
    starts.recv().await.unwrap();
    let mut waiting = Vec::new();
    for n in 0..15 {
        waiting.push(call(&service, &format!("w{n}")));
        advance(MS(10)).await;
    }
    // "busy" got in at once during CoDel's first interval: no standing queue yet, first come
    // first served.
    gate.add_permits(1);
    busy.await.unwrap();
    assert_eq!(starts.recv().await.unwrap(), "w0");
    assert!(!queue.stats().overloaded);

    // A whole interval on, even the luckiest request of the last one waited 150 ms: the queue
    // stands. The newest is served first, and whoever waited past twice the 5 ms target is shed.
    advance(MS(100)).await;
    let fresh = call(&service, "fresh");
    advance(MS(5)).await;
    gate.add_permits(1);
    assert_eq!(
        starts.recv().await.unwrap(),
        "fresh",
        "the newest, which waited 5 ms"
    );
    assert!(queue.stats().overloaded);
    gate.add_permits(1);
    assert_eq!(fresh.await.unwrap().body(), "fresh");
    let mut shed = 0;
    for handle in waiting {
        let answer = handle.await.unwrap();
        if answer.status() == StatusCode::SERVICE_UNAVAILABLE {
            shed += 1;
            assert_eq!(answer.headers()["content-type"], "application/problem+json");
        }
    }
    assert_eq!(shed, 14, "w1 to w14 had waited past twice the target");
    assert_eq!(queue.stats().shed, 14);
    assert_eq!(queue.stats().running, 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_gives_up_does_not_keep_the_worker_it_was_given() {
    let gate = Gate::new(tokio::sync::Semaphore::new(0));
    let (started, mut starts) = mpsc::unbounded_channel();
    let queue = Queue::new("gateway", settings(1, 10));
    let service = QueueLayer::new(queue.clone()).layer(gated(&gate, started));

    let busy = call(&service, "busy");
    starts.recv().await.unwrap();
    // A waiter that is handed the worker and dropped before it reads its turn (its deadline
    // passed at that instant), and one that waits behind it.
    let mut gives_up = Box::pin(service.clone().oneshot(Request::new("gives-up".to_owned())));
    assert!((&mut gives_up).now_or_never().is_none());
    let patient = call(&service, "patient");
    tokio::task::yield_now().await;
    gate.add_permits(1);
    busy.await.unwrap();
    drop(gives_up);
    assert_eq!(
        starts.recv().await.unwrap(),
        "patient",
        "the worker went on to the next waiter"
    );
    gate.add_permits(1);
    assert_eq!(patient.await.unwrap().body(), "patient");
    assert_eq!(queue.stats().running, 0);
}

//! A client whose names go to a name server that never answers cannot hold up another client's
//! deliveries: lookups hold no thread, end at the lookup timeout, and are capped per client.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use idempotency::SystemClock;
use outbox::{DeliveryQuery, EndpointLimits, ORDER_PAID};
use test_support::eventually;
use tokio::net::UdpSocket;

use crate::harness::{Outbox, Receiver, commit_to_receipt, settings, start_sender, wall_ms};

const SLOW_CLIENT: &str = "client-with-a-silent-name-server";
const OTHER_CLIENT: &str = "client-b";
/// The slow client's endpoints (the most a client may have) and its events, each due at all of them.
const SLOW_ENDPOINTS: usize = 20;
const SLOW_EVENTS: usize = 64;
/// The other client's events, one every [`PACE`].
const OTHER_EVENTS: usize = 60;
const PACE: Duration = Duration::from_millis(100);
/// The longest commit → receipt the other client may see.
const BOUND_MS: i64 = 1_000;

/// A UDP socket that reads every query and answers none, counting them.
async fn silent_name_server() -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let socket = UdpSocket::bind("127.0.0.1:0")
        .await
        .expect("bind a UDP socket");
    let addr = socket.local_addr().expect("address");
    let queries = Arc::new(AtomicUsize::new(0));
    let counted = queries.clone();
    tokio::spawn(async move {
        let mut buffer = [0; 1_500];
        while socket.recv_from(&mut buffer).await.is_ok() {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });
    (addr, queries)
}

#[tokio::test]
async fn a_silent_name_server_of_one_client_does_not_delay_another() {
    let outbox = Outbox::new().await;
    let (name_server, queries) = silent_name_server().await;
    let most = EndpointLimits::MAX;
    let mut slow_endpoints = Vec::new();
    for n in 0..SLOW_ENDPOINTS {
        let url = format!("https://hooks-{n}.silent.example/hook");
        slow_endpoints.push(
            outbox
                .client_endpoint(SLOW_CLIENT, &url, &[ORDER_PAID], most, wall_ms())
                .await
                .0,
        );
    }
    // The other client's receiver is named, so its deliveries need lookups too (`localhost`,
    // which the resolver answers itself).
    let receiver = Receiver::answering(204).await;
    let port = receiver.addr.port();
    outbox
        .client_endpoint(
            OTHER_CLIENT,
            &format!("http://localhost:{port}/hook"),
            &[ORDER_PAID],
            most,
            wall_ms(),
        )
        .await;
    let mut settings = settings(&outbox, &[]);
    settings.test_hosts = vec![format!("localhost:{port}")];
    settings.dns.name_servers = vec![name_server];
    settings.dns.lookup_timeout_ms = Some(1_000);
    let _sender = start_sender(settings, Arc::new(SystemClock)).await;

    for _ in 0..SLOW_EVENTS {
        outbox.client_paid(SLOW_CLIENT, wall_ms()).await;
    }
    let committed_at = outbox.paced_commits(OTHER_CLIENT, OTHER_EVENTS, PACE).await;
    eventually(
        Duration::from_secs(10),
        "every event of the other client arrives",
        || async { receiver.count() >= OTHER_EVENTS },
    )
    .await;

    let latencies = commit_to_receipt(&receiver, &committed_at);
    let subscriptions = outbox.subscriptions();
    let (mut slow_attempts, mut over_the_cap) = (0, 0);
    for endpoint in &slow_endpoints {
        let log = subscriptions
            .deliveries(SLOW_CLIENT, endpoint, &DeliveryQuery::newest(1_000))
            .await
            .expect("delivery log")
            .deliveries;
        for attempt in log.iter().flat_map(|delivery| &delivery.attempts) {
            slow_attempts += 1;
            over_the_cap += usize::from(
                attempt
                    .error
                    .as_deref()
                    .is_some_and(|error| error.contains("already in flight")),
            );
        }
    }
    println!(
        "{} deliveries of {OTHER_CLIENT} beside {SLOW_ENDPOINTS} endpoints × {SLOW_EVENTS} events on a silent name server: commit→receipt p50 {} ms, p99 {} ms, max {} ms (bound {BOUND_MS} ms); the silent server got {} queries, the slow client's endpoints {slow_attempts} failed attempts ({over_the_cap} at once, over its lookups in flight)",
        latencies.0.len(),
        latencies.percentile(0.5),
        latencies.percentile(0.99),
        latencies.percentile(1.0),
        queries.load(Ordering::SeqCst),
    );
    assert!(
        queries.load(Ordering::SeqCst) > 0,
        "the slow client's names went to the silent name server"
    );
    assert!(
        slow_attempts >= SLOW_ENDPOINTS,
        "the slow client's endpoints were attempted, and failed"
    );
    assert!(
        over_the_cap > 0,
        "the slow client's attempts over its lookups in flight failed at once"
    );
    assert!(
        latencies.percentile(1.0) < BOUND_MS,
        "a delivery of {OTHER_CLIENT} waited {} ms",
        latencies.percentile(1.0)
    );
}

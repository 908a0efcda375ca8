//! What an attacker or a careless client can do to the chain, each bounded, with the answer it
//! must get: a flood of idle connections, and one client holding every order creation.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use e2e::{BACKGROUND, TestChain, eventually, fast_bank, order_body};
use rpc::connections::ConnectionLimits;
use tokio::{
    io::AsyncReadExt,
    net::{TcpSocket, TcpStream},
};

/// Another loopback address than the test's own: the flood's connections come from a peer of
/// their own, as from another host.
const FLOODER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

async fn connect_from(source: IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(to).await
}

/// Whether the server has closed `stream` (read gives end of file or an error) within `limit`.
async fn closed(stream: &mut TcpStream, limit: Duration) -> bool {
    let mut buffer = [0u8; 64];
    matches!(tokio::time::timeout(limit, stream.read(&mut buffer)).await, Ok(Ok(0) | Err(_)))
}

#[tokio::test]
async fn a_flood_of_idle_connections_on_the_public_port_stops_nothing_else() {
    const FLOOD: usize = 400;
    let limits = ConnectionLimits { max_open: 1_000, max_per_peer: 50, idle_timeout_ms: 1_500, ..ConnectionLimits::default() };
    let test = TestChain::start_with(|s| s.gateway.connections = limits).await;
    let a = test.chain.addresses.clone();

    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        flood.push(connect_from(FLOODER, a.gateway_http).await.expect("the kernel accepts the connection"));
    }
    // The peer's share is held; everything beyond it is closed at once (after the accept loop
    // has caught up with the burst).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut refused = 0;
    for stream in &mut flood {
        if closed(stream, Duration::from_millis(20)).await {
            refused += 1;
        }
    }
    assert!(refused >= FLOOD - limits.max_per_peer, "{refused} of {FLOOD} closed at once");

    // Meanwhile the chain serves: an order through all four hops, and every inner health check.
    assert_eq!(test.post_order("during-the-flood", &order_body()).send().await.unwrap().status(), 201);
    for (service, address) in [("orders", a.orders), ("payment", a.payment), ("bank-mock", a.bank)] {
        let tls = rpc::tls::ServiceTls::load(service, &test.certs().settings(service)).unwrap();
        rpc::health::check_as(address, service, &tls, Duration::from_secs(5)).await.unwrap();
    }

    // The held ones say nothing and are closed after the idle timeout.
    let started = Instant::now();
    for stream in &mut flood {
        assert!(closed(stream, BACKGROUND).await, "an idle connection was closed");
    }
    assert!(started.elapsed() < Duration::from_millis(1_500) + Duration::from_secs(3), "within the idle timeout: {:?}", started.elapsed());
}

#[tokio::test]
async fn one_client_cannot_hold_every_order_creation() {
    let test = Arc::new(
        TestChain::start_with(|s| {
            s.gateway.max_in_flight_creates = 10;
            s.gateway.max_in_flight_creates_per_client = 2;
        })
        .await,
    );
    test.set_faults(fast_bank(|f| f.hang = true));
    let hanging: Vec<_> = (0..2)
        .map(|n| {
            let test = test.clone();
            tokio::spawn(async move { test.post_order(&format!("greedy-{n}"), &order_body()).header("x-request-timeout-ms", "2000").send().await.unwrap().status() })
        })
        .collect();
    eventually(BACKGROUND, "both creations hanging at the bank", || async { test.chain.bank().stats().hung >= 2 }).await;

    let refused = test.post_order("greedy-over", &order_body()).send().await.unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(refused.headers()["content-type"], "application/problem+json");

    // Another client still gets in: admitted, then out of time at the hanging bank.
    let other = test.post_as("demo-key-2", "/v1/orders", "other-client", &order_body()).header("x-request-timeout-ms", "300").send().await.unwrap();
    assert_eq!(other.status(), 504);
    for task in hanging {
        assert_eq!(task.await.unwrap(), 504);
    }
}

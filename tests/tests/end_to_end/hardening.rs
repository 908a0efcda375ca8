//! What an attacker or a careless client can do to the chain, each bounded, with the answer it
//! must get: floods of idle connections, connections that send their request a line at a time or
//! never start it, and one client holding every order creation. (The flood of 20,000 against a
//! process of 1,024 descriptors is in `connection_flood`.)

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use e2e::{BACKGROUND, TestChain, eventually, fast_bank, order_body};
use rpc::connections::ConnectionLimits;
use stack::chain::{BANK_GRPC, GATEWAY_GRPC, GATEWAY_HTTP, ORDERS_GRPC, PAYMENT_GRPC};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
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
    matches!(
        tokio::time::timeout(limit, stream.read(&mut buffer)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn a_flood_of_idle_connections_on_the_public_port_stops_nothing_else() {
    const FLOOD: usize = 400;
    let limits = ConnectionLimits {
        max_open: 100,
        idle_timeout_ms: 1_500,
        ..ConnectionLimits::default()
    };
    let test = TestChain::start_with(|s| s.gateway.connections = limits).await;
    let a = test.chain.addresses().clone();

    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        flood.push(
            connect_from(FLOODER, a[&GATEWAY_HTTP])
                .await
                .expect("the kernel accepts the connection"),
        );
    }
    // The port keeps the newest; each older one made room for a newer (once the accept loop has
    // caught up with the burst).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut made_room = 0;
    for stream in &mut flood {
        if closed(stream, Duration::from_millis(20)).await {
            made_room += 1;
        }
    }
    assert!(
        made_room >= FLOOD - limits.max_open,
        "{made_room} of {FLOOD} closed to make room"
    );

    // Meanwhile the chain serves: an order through all four hops, and every inner health check.
    assert_eq!(
        test.post_order("during-the-flood", &order_body())
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
    for (service, address) in [
        ("orders", a[&ORDERS_GRPC]),
        ("payment", a[&PAYMENT_GRPC]),
        ("bank-mock", a[&BANK_GRPC]),
    ] {
        let tls = rpc::tls::ServiceTls::load(service, &test.certs().settings(service)).unwrap();
        rpc::health::check_as(address, service, &tls, Duration::from_secs(5))
            .await
            .unwrap();
    }

    // The held ones say nothing and are closed after the idle timeout.
    let started = Instant::now();
    for stream in &mut flood {
        assert!(
            closed(stream, BACKGROUND).await,
            "an idle connection was closed"
        );
    }
    assert!(
        started.elapsed() < Duration::from_millis(1_500) + Duration::from_secs(3),
        "within the idle timeout: {:?}",
        started.elapsed()
    );
}

/// The first bytes of every HTTP/2 connection.
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How long after it starts the server closes a connection that writes `opening`, then the line
/// of `drip` at its interval (never finishing a request); `None` if still open after `limit`.
async fn lifetime(
    mut stream: TcpStream,
    opening: &[u8],
    drip: Option<(&[u8], Duration)>,
    limit: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    stream.write_all(opening).await.ok()?;
    let closed = async {
        let mut buffer = [0u8; 256];
        loop {
            let quiet = drip.map_or(limit, |(_, every)| every);
            match tokio::time::timeout(quiet, stream.read(&mut buffer)).await {
                Ok(Ok(0) | Err(_)) => return started.elapsed(),
                Ok(Ok(_)) => {}
                Err(_) => {
                    if let Some((line, _)) = drip
                        && stream.write_all(line).await.is_err()
                    {
                        return started.elapsed();
                    }
                }
            }
        }
    };
    tokio::time::timeout(limit, closed).await.ok()
}

#[tokio::test]
async fn slow_headers_and_silent_http2_connections_are_closed_within_their_timeouts() {
    const SLOW: usize = 50;
    let limits = ConnectionLimits {
        header_read_timeout_ms: 1_000,
        idle_timeout_ms: 1_500,
        ..ConnectionLimits::default()
    };
    let test = TestChain::start_with(|s| s.gateway.connections = limits).await;
    let a = test.chain.addresses().clone();
    let (header_read, idle) = (
        Duration::from_millis(limits.header_read_timeout_ms),
        Duration::from_millis(limits.idle_timeout_ms),
    );
    // A loaded machine may be slow to notice; a connection held for ever never is.
    let slack = Duration::from_secs(2);

    // HTTP/1: a header line every 300 ms keeps the connection from ever being idle, so it is the
    // header read timeout that must close it.
    let slow_headers: Vec<_> = (0..SLOW)
        .map(|n| {
            let to = a[&GATEWAY_HTTP];
            tokio::spawn(async move {
                let stream = connect_from(FLOODER, to).await.unwrap();
                let opening = format!("GET /v1/orders/ord_{n} HTTP/1.1\r\nhost: gateway\r\n");
                lifetime(
                    stream,
                    opening.as_bytes(),
                    Some((b"x-slow: 1\r\n", Duration::from_millis(300))),
                    header_read * 10,
                )
                .await
            })
        })
        .collect();
    // HTTP/2 on both public ports: the preface and then silence, until the idle timeout.
    let silent: Vec<_> = (0..SLOW)
        .map(|n| {
            let to = if n % 2 == 0 {
                a[&GATEWAY_GRPC]
            } else {
                a[&GATEWAY_HTTP]
            };
            tokio::spawn(async move {
                let stream = connect_from(FLOODER, to).await.unwrap();
                lifetime(stream, HTTP2_PREFACE, None, idle * 10).await
            })
        })
        .collect();

    for task in slow_headers {
        let closed_after = task
            .await
            .unwrap()
            .expect("a connection sending its headers a line at a time is closed");
        assert!(
            closed_after >= header_read.mul_f64(0.9) && closed_after < header_read + slack,
            "closed after {closed_after:?}, header read timeout {header_read:?}"
        );
    }
    for task in silent {
        let closed_after = task
            .await
            .unwrap()
            .expect("a connection that sent only the HTTP/2 preface is closed");
        assert!(
            closed_after >= idle.mul_f64(0.9) && closed_after < idle + slack,
            "closed after {closed_after:?}, idle timeout {idle:?}"
        );
    }
    assert_eq!(
        test.post_order("after-the-slow-ones", &order_body())
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
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
            tokio::spawn(async move {
                test.post_order(&format!("greedy-{n}"), &order_body())
                    .header("x-request-timeout-ms", "2000")
                    .send()
                    .await
                    .unwrap()
                    .status()
            })
        })
        .collect();
    eventually(BACKGROUND, "both creations hanging at the bank", || async {
        test.chain.bank().stats().hung >= 2
    })
    .await;

    let refused = test
        .post_order("greedy-over", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );

    // Another client still gets in: admitted, then out of time at the hanging bank.
    let other = test
        .post_as("demo-key-2", "/v1/orders", "other-client", &order_body())
        .header("x-request-timeout-ms", "300")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 504);
    for task in hanging {
        assert_eq!(task.await.unwrap(), 504);
    }
}

//! Every port keeps its connection limits: at the cap, the longest-idle connection makes room for
//! a new client; below it, one address may hold every place; connections without a request, slow
//! headers and silent peers are closed within their time limits, whatever pings they answer.

use std::{
    net::SocketAddr,
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use rpc::connections::ConnectionLimits;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};
use tokio_util::sync::CancellationToken;

/// Generous bound for "at once" and "within the limit" on a loaded machine.
const SOON: Duration = Duration::from_secs(3);

async fn server(limits: ConnectionLimits) -> (SocketAddr, tokio_util::sync::DropGuard) {
    let listener = rpc::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let router = axum::Router::new()
        .route("/", axum::routing::get(|| async { "ok" }))
        .route(
            "/slow",
            axum::routing::get(|| async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                "late"
            }),
        );
    let stop = CancellationToken::new();
    tokio::spawn(rpc::serve_http_with(
        listener,
        limits,
        router,
        stop.clone().cancelled_owned(),
    ));
    (addr, stop.drop_guard())
}

/// Waits until the server closes `stream` (or it fails), returning how long that took.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buffer = [0u8; 1024];
    loop {
        match tokio::time::timeout(limit, stream.read(&mut buffer))
            .await
            .expect("closed in time")
        {
            Ok(0) | Err(_) => return started.elapsed(),
            Ok(_) => continue,
        }
    }
}

async fn answers(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect(addr).await else {
        return false;
    };
    if stream
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .is_err()
    {
        return false;
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(SOON, stream.read_to_end(&mut answer)).await;
    answer.starts_with(b"HTTP/1.1 200")
}

/// Whether `stream` is still open after `wait` (the server has neither closed nor reset it).
async fn still_open(stream: &mut TcpStream, wait: Duration) -> bool {
    let mut buffer = [0u8; 1024];
    tokio::time::timeout(wait, stream.read(&mut buffer))
        .await
        .is_err()
}

#[tokio::test]
async fn at_the_cap_the_longest_idle_connection_makes_room_for_a_new_client() {
    let (addr, _server) = server(ConnectionLimits {
        max_open: 2,
        ..ConnectionLimits::default()
    })
    .await;
    let mut first = TcpStream::connect(addr).await.unwrap();
    assert!(
        still_open(&mut first, Duration::from_millis(100)).await,
        "accepted before the second"
    );
    let mut second = TcpStream::connect(addr).await.unwrap();
    assert!(still_open(&mut second, Duration::from_millis(100)).await);
    assert!(answers(addr).await, "a new client is served at the cap");
    closed_within(&mut first, SOON).await;
    assert!(
        still_open(&mut second, Duration::from_millis(200)).await,
        "only the longest idle made room"
    );
}

#[tokio::test]
async fn below_the_cap_one_address_may_hold_every_place() {
    const HELD: usize = 600;
    let (addr, _server) = server(ConnectionLimits {
        max_open: 1_000,
        ..ConnectionLimits::default()
    })
    .await;
    let mut held = Vec::with_capacity(HELD);
    for _ in 0..HELD {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    assert!(answers(addr).await);
    for stream in &mut held {
        assert!(
            still_open(stream, Duration::from_millis(1)).await,
            "a connection from the one address was closed"
        );
    }
}

#[tokio::test]
async fn a_connection_that_answers_pings_but_sends_no_request_is_closed_at_the_idle_timeout() {
    let limits = ConnectionLimits {
        idle_timeout_ms: 800,
        keepalive_interval_ms: 100,
        keepalive_timeout_ms: 1_000,
        ..ConnectionLimits::default()
    };
    let (addr, _server) = server(limits).await;
    let pings = AtomicUsize::new(0);
    let started = Instant::now();
    let answered = tokio::time::timeout(
        SOON * 2,
        test_support::quiet_http2::answer_pings(TcpStream::connect(addr).await.unwrap(), &pings),
    )
    .await;
    let took = started.elapsed();
    assert!(
        answered.is_ok(),
        "still open after {took:?}, {} pings answered",
        pings.load(Ordering::SeqCst)
    );
    assert!(
        took >= Duration::from_millis(750) && took < Duration::from_millis(800) + SOON,
        "closed after {took:?}"
    );
    assert!(
        pings.load(Ordering::SeqCst) >= 3,
        "it answered pings until then: {}",
        pings.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn a_slow_answer_keeps_its_connection_open_past_the_idle_timeout() {
    let listener = rpc::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let slow = || async {
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        "late"
    };
    let router = axum::Router::new().route("/", axum::routing::get(slow));
    let stop = CancellationToken::new();
    let limits = ConnectionLimits {
        idle_timeout_ms: 300,
        ..ConnectionLimits::default()
    };
    tokio::spawn(rpc::serve_http_with(
        listener,
        limits,
        router,
        stop.clone().cancelled_owned(),
    ));
    let _server = stop.drop_guard();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(SOON, stream.read_to_end(&mut answer))
        .await
        .expect("answered")
        .unwrap();
    assert!(
        answer.starts_with(b"HTTP/1.1 200") && answer.ends_with(b"late"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_idle_timeout() {
    let (addr, _server) = server(ConnectionLimits {
        idle_timeout_ms: 300,
        ..ConnectionLimits::default()
    })
    .await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let took = closed_within(&mut silent, SOON).await;
    assert!(
        took >= Duration::from_millis(250),
        "not before the timeout: {took:?}"
    );
}

#[tokio::test]
async fn headers_sent_a_line_at_a_time_are_cut_off_at_the_header_read_timeout() {
    let (addr, _server) = server(ConnectionLimits {
        idle_timeout_ms: 10_000,
        header_read_timeout_ms: 400,
        ..ConnectionLimits::default()
    })
    .await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let started = Instant::now();
    // A header line every 100 ms keeps the connection from being idle, never from its limit.
    let dripping = async {
        for n in 0.. {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if slow
                .write_all(format!("x-drip-{n}: 1\r\n").as_bytes())
                .await
                .is_err()
            {
                break;
            }
            let mut buffer = [0u8; 256];
            if let Ok(Ok(0)) =
                tokio::time::timeout(Duration::from_millis(1), slow.read(&mut buffer)).await
            {
                break;
            }
        }
    };
    tokio::time::timeout(SOON, dripping)
        .await
        .expect("the server closed the slow connection");
    assert!(
        started.elapsed() >= Duration::from_millis(350),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_connection_past_its_age_finishes_its_request_then_ends() {
    let (addr, _server) = server(ConnectionLimits {
        max_age_ms: 200,
        ..ConnectionLimits::default()
    })
    .await;
    // A kept-alive connection whose request outlives the connection's age: answered, then closed
    // (long before the idle timeout), so that the client connects again.
    let mut busy = TcpStream::connect(addr).await.unwrap();
    busy.write_all(b"GET /slow HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(SOON, busy.read_to_end(&mut answer))
        .await
        .expect("closed after its answer")
        .unwrap();
    assert!(
        answer.starts_with(b"HTTP/1.1 200") && answer.ends_with(b"late"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // One that only waits ends at its age too.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let lived = closed_within(&mut idle, SOON).await;
    assert!(lived < Duration::from_secs(2), "{lived:?}");
}

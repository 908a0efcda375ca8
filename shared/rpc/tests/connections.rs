//! Every port keeps its connection limits: a cap on open connections and on those of one peer,
//! refused at once; silent and slow connections closed within their time limits; places given
//! back when connections close.

use std::{
    net::SocketAddr,
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
    let listener = rpc::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
    let stop = CancellationToken::new();
    tokio::spawn(rpc::serve_http_with(listener, limits, router, stop.clone().cancelled_owned()));
    (addr, stop.drop_guard())
}

/// Waits until the server closes `stream` (or it fails), returning how long that took.
async fn closed_within(stream: &mut TcpStream, limit: Duration) -> Duration {
    let started = Instant::now();
    let mut buffer = [0u8; 1024];
    loop {
        match tokio::time::timeout(limit, stream.read(&mut buffer)).await.expect("closed in time") {
            Ok(0) | Err(_) => return started.elapsed(),
            Ok(_) => continue,
        }
    }
}

async fn answers(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect(addr).await else { return false };
    if stream.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").await.is_err() {
        return false;
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(SOON, stream.read_to_end(&mut answer)).await;
    answer.starts_with(b"HTTP/1.1 200")
}

#[tokio::test]
async fn a_connection_over_the_cap_is_closed_at_once_and_a_closed_one_frees_its_place() {
    let (addr, _server) = server(ConnectionLimits { max_open: 2, max_per_peer: 0, ..ConnectionLimits::default() }).await;
    let first = TcpStream::connect(addr).await.unwrap();
    let _second = TcpStream::connect(addr).await.unwrap();
    let mut third = TcpStream::connect(addr).await.unwrap();
    closed_within(&mut third, SOON).await;
    drop(first);
    // The place comes back once the server has seen the close.
    test_support::eventually(SOON, "a request answered after a place was freed", || async { answers(addr).await }).await;
}

#[tokio::test]
async fn one_peer_holds_at_most_its_share() {
    let (addr, _server) = server(ConnectionLimits { max_open: 100, max_per_peer: 1, ..ConnectionLimits::default() }).await;
    let _held = TcpStream::connect(addr).await.unwrap();
    let mut second = TcpStream::connect(addr).await.unwrap();
    closed_within(&mut second, SOON).await;
}

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_idle_timeout() {
    let (addr, _server) = server(ConnectionLimits { idle_timeout_ms: 300, ..ConnectionLimits::default() }).await;
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let took = closed_within(&mut silent, SOON).await;
    assert!(took >= Duration::from_millis(250), "not before the timeout: {took:?}");
}

#[tokio::test]
async fn headers_sent_a_line_at_a_time_are_cut_off_at_the_header_read_timeout() {
    let (addr, _server) = server(ConnectionLimits { idle_timeout_ms: 10_000, header_read_timeout_ms: 400, ..ConnectionLimits::default() }).await;
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let started = Instant::now();
    // A header line every 100 ms keeps the connection from being idle, never from its limit.
    let dripping = async {
        for n in 0.. {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if slow.write_all(format!("x-drip-{n}: 1\r\n").as_bytes()).await.is_err() {
                break;
            }
            let mut buffer = [0u8; 256];
            if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(1), slow.read(&mut buffer)).await {
                break;
            }
        }
    };
    tokio::time::timeout(SOON, dripping).await.expect("the server closed the slow connection");
    assert!(started.elapsed() >= Duration::from_millis(350), "{:?}", started.elapsed());
}

//! Opens many HTTP/2 connections to one address that never send a request but answer every ping
//! of the server, as a client library does by itself, and holds them until its standard input
//! closes: the client half of the idle-connection flood test, in a process of its own so that its
//! descriptors count against its own limit and not the server's.
//!
//! `idle-flood <to> <count>` opens `count` connections to `to` from this host's address toward it,
//! at most 256 connecting at once, and prints `opened <n> failed <k>` once every one is tried. When
//! its standard input closes it prints `closed-by-server <c> pings-answered <p>` and ends.

use std::{
    net::SocketAddr,
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{net::TcpStream, sync::Semaphore};

const CONNECTING_AT_ONCE: usize = 256;
/// A connection not made by then is counted as failed (the kernel retries a dropped handshake for
/// about two minutes).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Descriptors the helper needs besides its connections.
const OWN_DESCRIPTORS: u64 = 64;

#[derive(Default)]
struct Counters {
    /// Connections tried, made or not.
    tried: AtomicUsize,
    opened: AtomicUsize,
    /// Connections the server has closed (or reset).
    closed: AtomicUsize,
    pings: AtomicUsize,
}

fn arguments() -> Result<(SocketAddr, usize), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [to, count] = args.as_slice() else {
        return Err("usage: idle-flood <to> <count>".into());
    };
    Ok((
        to.parse().map_err(|error| format!("to: {error}"))?,
        count.parse().map_err(|error| format!("count: {error}"))?,
    ))
}

/// Raises this process's soft limit on descriptors to what `count` connections need; fails, saying
/// so, when the hard limit is lower.
fn make_room_for(count: usize) -> Result<(), String> {
    let needed = count as u64 + OWN_DESCRIPTORS;
    let raised =
        rlimit::increase_nofile_limit(needed).map_err(|error| format!("RLIMIT_NOFILE: {error}"))?;
    if raised < needed {
        return Err(format!(
            "RLIMIT_NOFILE: {count} connections need {needed} descriptors, and the hard limit is {raised}"
        ));
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let (to, count) =
        match arguments().and_then(|(to, count)| make_room_for(count).map(|()| (to, count))) {
            Ok(flood) => flood,
            Err(error) => {
                eprintln!("error: {error}");
                return ExitCode::FAILURE;
            }
        };
    let connecting = Arc::new(Semaphore::new(CONNECTING_AT_ONCE));
    let counters = Arc::new(Counters::default());
    for _ in 0..count {
        let (connecting, counters) = (connecting.clone(), counters.clone());
        tokio::spawn(async move {
            let permit = connecting.acquire_owned().await.expect("never closed");
            let connected = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(to)).await;
            drop(permit);
            counters.tried.fetch_add(1, Ordering::SeqCst);
            let stream = match connected {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => return eprintln!("connect: {error}"),
                Err(_) => return eprintln!("connect: no answer within {CONNECT_TIMEOUT:?}"),
            };
            counters.opened.fetch_add(1, Ordering::SeqCst);
            // Ends when the server closes the connection, whatever it was told.
            let _ = test_support::quiet_http2::answer_pings(stream, &counters.pings).await;
            counters.closed.fetch_add(1, Ordering::SeqCst);
        });
    }
    // Bounded: every attempt ends within its connect timeout.
    while counters.tried.load(Ordering::SeqCst) < count {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let opened = counters.opened.load(Ordering::SeqCst);
    println!("opened {opened} failed {}", count - opened);
    // Whatever becomes of the test, the connections go with it.
    tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
        .await
        .ok();
    println!(
        "closed-by-server {} pings-answered {}",
        counters.closed.load(Ordering::SeqCst),
        counters.pings.load(Ordering::SeqCst)
    );
    ExitCode::SUCCESS
}

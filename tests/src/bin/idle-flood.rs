//! Opens many idle TCP connections to one address, from several loopback source addresses, and
//! holds them until its standard input closes (its parent ended, or let it go): the client half of the idle-connection flood test, in a process
//! of its own so that its descriptors count against its own limit and not the server's.
//!
//! `idle-flood <to> <first-source> <sources> <count>` spreads `count` connections evenly over
//! `sources` consecutive IPv4 source addresses from `first-source`, at most 256 connecting at
//! once, and prints `opened <n> closed-by-server <k>` once every connection is made and the
//! server has stopped closing them for a moment.

use std::{
    net::{Ipv4Addr, SocketAddr},
    process::ExitCode,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::AsyncReadExt,
    net::{TcpSocket, TcpStream},
    sync::Semaphore,
};

/// A pause without a closed connection that shows the server has stopped refusing.
const SETTLE: Duration = Duration::from_millis(500);
const CONNECTING_AT_ONCE: usize = 256;
const POLL: Duration = Duration::from_millis(20);

#[derive(Default)]
struct Counters {
    /// Connections tried, made or not.
    attempted: AtomicUsize,
    opened: AtomicUsize,
    /// Connections the server has closed.
    closed: AtomicUsize,
}

struct Flood {
    to: SocketAddr,
    first_source: Ipv4Addr,
    sources: u32,
    count: usize,
}

fn arguments() -> Result<Flood, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [to, first_source, sources, count] = args.as_slice() else {
        return Err("usage: idle-flood <to> <first-source> <sources> <count>".into());
    };
    let number = |text: &str, what: &str| text.parse::<u64>().map_err(|error| format!("{what}: {error}"));
    Ok(Flood {
        to: to.parse().map_err(|error| format!("to: {error}"))?,
        first_source: first_source.parse().map_err(|error| format!("first-source: {error}"))?,
        sources: u32::try_from(number(sources, "sources")?.max(1)).map_err(|error| format!("sources: {error}"))?,
        count: usize::try_from(number(count, "count")?).map_err(|error| format!("count: {error}"))?,
    })
}

/// Raises this process's soft limit on descriptors to what `count` connections need; fails, saying
/// so, when the hard limit is lower.
fn make_room_for(count: usize) -> Result<(), String> {
    let needed = count as u64 + 64;
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only into the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(format!("getrlimit(RLIMIT_NOFILE): {}", std::io::Error::last_os_error()));
    }
    if limit.rlim_cur >= needed {
        return Ok(());
    }
    if limit.rlim_max < needed {
        return Err(format!("RLIMIT_NOFILE: {count} connections need {needed} descriptors, and the hard limit is {}", limit.rlim_max));
    }
    limit.rlim_cur = needed;
    // SAFETY: setrlimit reads only the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        return Err(format!("setrlimit(RLIMIT_NOFILE, {needed}): {}", std::io::Error::last_os_error()));
    }
    Ok(())
}

async fn connect(source: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source.into(), 0))?;
    socket.connect(to).await
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let flood = match arguments().and_then(|flood| make_room_for(flood.count).map(|()| flood)) {
        Ok(flood) => flood,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    let connecting = Arc::new(Semaphore::new(CONNECTING_AT_ONCE));
    let counters = Arc::new(Counters::default());
    for index in 0..flood.count {
        let source = Ipv4Addr::from(u32::from(flood.first_source) + index as u32 % flood.sources);
        let (connecting, counters, to) = (connecting.clone(), counters.clone(), flood.to);
        tokio::spawn(async move {
            let permit = connecting.acquire_owned().await.expect("never closed");
            let connected = connect(source, to).await;
            drop(permit);
            counters.attempted.fetch_add(1, Ordering::SeqCst);
            let mut stream = match connected {
                Ok(stream) => stream,
                Err(error) => return eprintln!("connect from {source}: {error}"),
            };
            counters.opened.fetch_add(1, Ordering::SeqCst);
            // Never sends a byte; a read ends when the server closes the connection.
            let mut byte = [0u8; 1];
            while matches!(stream.read(&mut byte).await, Ok(1..)) {}
            counters.closed.fetch_add(1, Ordering::SeqCst);
        });
    }
    while counters.attempted.load(Ordering::SeqCst) < flood.count {
        tokio::time::sleep(POLL).await;
    }
    // The server refuses what is over its limits as it accepts it: wait until it has stopped.
    loop {
        let closed = counters.closed.load(Ordering::SeqCst);
        tokio::time::sleep(SETTLE).await;
        if counters.closed.load(Ordering::SeqCst) == closed {
            break;
        }
    }
    println!("opened {} closed-by-server {}", counters.opened.load(Ordering::SeqCst), counters.closed.load(Ordering::SeqCst));
    // Whatever becomes of the test, the connections go with it.
    tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink())).await.ok();
    ExitCode::SUCCESS
}

//! Limits on the connections one listener keeps: how many at once, how many from one address,
//! and how long one may stay silent.
//!
//! Why: an open connection costs a file descriptor and buffers whether or not it ever sends a
//! request, and the process has one descriptor table for all its ports. Without limits, idle
//! connections to one public port take every descriptor and every other port (inner services,
//! admin, metrics) stops accepting. Each listener therefore has a cap of its own, refuses the
//! connection over it at once (accepted and closed, so that the kernel's queue does not fill),
//! caps what one peer address may hold, and closes a connection that has sent or received nothing
//! for a while. The HTTP limits (header read time, HTTP/2 pings) are kept by [`crate::serve`].

use std::{
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::serve::Listener;
use resilience::shares::{Share, Shares};
use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::{Instant, Sleep},
};

/// How many connections a listener keeps, and for how long (one listener: every port of a
/// service has limits of its own, so that a flood on one does not close the others).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionLimits {
    /// Connections open at once; the next is closed as soon as it is accepted.
    pub max_open: usize,
    /// Connections open at once from one IP address (0: no such limit).
    pub max_per_peer: usize,
    /// A connection on which nothing is read or written for this long is closed.
    pub idle_timeout_ms: u64,
    /// An HTTP/1 request whose headers have not all arrived this long after it started is
    /// refused and its connection closed.
    pub header_read_timeout_ms: u64,
    /// HTTP/2: a ping is sent after this long without frames from the peer...
    pub keepalive_interval_ms: u64,
    /// ...and the connection is closed when its answer has not come within this long.
    pub keepalive_timeout_ms: u64,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_open: 2_000,
            max_per_peer: 500,
            idle_timeout_ms: 30_000,
            header_read_timeout_ms: 10_000,
            keepalive_interval_ms: 20_000,
            keepalive_timeout_ms: 10_000,
        }
    }
}

/// A TCP listener that keeps to [`ConnectionLimits`].
pub struct LimitedListener {
    tcp: TcpListener,
    open: Arc<Semaphore>,
    /// Connections per peer address; `None` when `max_per_peer` is 0 (no limit).
    peers: Option<Shares<IpAddr>>,
    limits: ConnectionLimits,
}

impl LimitedListener {
    pub fn new(tcp: TcpListener, limits: ConnectionLimits) -> Self {
        Self {
            tcp,
            open: Arc::new(Semaphore::new(limits.max_open.max(1))),
            peers: (limits.max_per_peer > 0).then(|| Shares::new(limits.max_per_peer)),
            limits,
        }
    }

    /// A place for one more connection from `peer`, if there is room.
    fn admit(&self, peer: IpAddr) -> Option<Admission> {
        let permit = self.open.clone().try_acquire_owned().ok()?;
        let share = match &self.peers {
            Some(peers) => Some(peers.take(&peer)?),
            None => None,
        };
        Some(Admission { _permit: permit, _share: share })
    }
}

impl Listener for LimitedListener {
    type Io = Limited<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (tcp, addr) = Listener::accept(&mut self.tcp).await;
            match self.admit(addr.ip()) {
                Some(admission) => {
                    if let Err(error) = tcp.set_nodelay(true) {
                        tracing::warn!(%error, "cannot set TCP_NODELAY");
                    }
                    return (Limited::new(tcp, admission, Duration::from_millis(self.limits.idle_timeout_ms)), addr);
                }
                // Dropped: closed at once, before it costs more than its accept.
                None => tracing::debug!(%addr, "connection over the listener's limits closed"),
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// One connection's place under the limits, given back when the connection closes.
struct Admission {
    _permit: OwnedSemaphorePermit,
    _share: Option<Share<IpAddr>>,
}

/// A connection under the limits: it holds its place until it is dropped, and fails with
/// `TimedOut` once nothing has moved in either direction for the idle timeout.
pub struct Limited<Io> {
    io: Io,
    _admission: Admission,
    idle: Duration,
    silence: Pin<Box<Sleep>>,
}

impl<Io> Limited<Io> {
    fn new(io: Io, admission: Admission, idle: Duration) -> Self {
        Self { io, _admission: admission, idle, silence: Box::pin(tokio::time::sleep(idle)) }
    }

    /// One read or write: progress restarts the idle timer; waiting past it is an error.
    fn watch<T>(&mut self, cx: &mut Context<'_>, done: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match done {
            Poll::Ready(result) => {
                self.silence.as_mut().reset(Instant::now() + self.idle);
                Poll::Ready(result)
            }
            Poll::Pending => match self.silence.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, "connection idle for too long"))),
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for Limited<Io> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let done = Pin::new(&mut self.io).poll_read(cx, buf);
        self.watch(cx, done)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Limited<Io> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let done = Pin::new(&mut self.io).poll_write(cx, buf);
        self.watch(cx, done)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let done = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        self.watch(cx, done)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

//! The listener that keeps a port's connections to its limits, and the connections it hands on.

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use axum::serve::Listener;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
};

use super::{
    ConnectionLimits,
    descriptors::{CLOSING_AT_MOST, PortShare},
    places::{Place, Placed, Port},
};

/// A TCP listener that keeps to [`ConnectionLimits`] and to its port's share of the process's
/// descriptors.
pub struct LimitedListener {
    tcp: TcpListener,
    port: Arc<Port>,
    share: PortShare,
    idle_timeout: Duration,
}

impl LimitedListener {
    pub fn new(tcp: TcpListener, limits: ConnectionLimits) -> Self {
        let share = PortShare::register(tcp.local_addr().ok(), limits.max_open);
        Self {
            tcp,
            port: Arc::default(),
            share,
            idle_timeout: Duration::from_millis(limits.idle_timeout_ms),
        }
    }
}

impl Listener for LimitedListener {
    type Io = Limited<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        // Bounded by the kernel's queue: each turn takes one connection off it.
        loop {
            // The connections closed to make room still hold descriptors until their tasks run.
            self.port.closing_below(CLOSING_AT_MOST).await;
            let (tcp, addr) = Listener::accept(&mut self.tcp).await;
            match self
                .port
                .admit(addr.ip(), self.share.cap(), self.idle_timeout)
            {
                Some(place) => {
                    if let Err(error) = tcp.set_nodelay(true) {
                        tracing::warn!(%error, "cannot set TCP_NODELAY");
                    }
                    return (Limited { io: tcp, place }, addr);
                }
                // Dropped: closed at once, before it costs more than its accept.
                None => {
                    tracing::debug!(%addr, "port full of busy connections: the new one is closed")
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// A connection under the limits: it holds its place until it is dropped, and fails once it
/// must close (idle for too long, or its place given to a newer connection).
pub struct Limited<Io> {
    io: Io,
    place: Place,
}

impl<Io> Limited<Io> {
    /// Ready with an error once the connection must close.
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        self.place.poll_end(cx).map(io::Error::from)
    }
}

impl<Io> Placed for Limited<Io> {
    fn place(&self) -> &Place {
        &self.place
    }
}

impl<Io: AsyncRead + Unpin> AsyncRead for Limited<Io> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Poll::Ready(end) = self.poll_end(cx) {
            return Poll::Ready(Err(end));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for Limited<Io> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Poll::Ready(end) = self.poll_end(cx) {
            return Poll::Ready(Err(end));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Poll::Ready(end) = self.poll_end(cx) {
            return Poll::Ready(Err(end));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
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

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt, DuplexStream},
        time::Instant,
    };

    use super::*;

    const IDLE: Duration = Duration::from_secs(30);

    /// A connection under the limits, and its peer's end.
    fn connection(port: &Arc<Port>) -> (Limited<DuplexStream>, DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(1024);
        let place = port
            .admit(Ipv4Addr::LOCALHOST.into(), 10, IDLE)
            .expect("room");
        (Limited { io: ours, place }, theirs)
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_that_answers_pings_but_carries_no_request_is_closed_at_the_idle_timeout()
    {
        let port = Arc::new(Port::default());
        let (mut connection, mut peer) = connection(&port);
        let started = Instant::now();
        let pinging = async {
            // Bounded: more than twice the idle timeout's worth of pings.
            for _ in 0..20 {
                tokio::time::sleep(Duration::from_secs(3)).await;
                if peer.write_all(b"ping").await.is_err() {
                    break;
                }
            }
        };
        let reading = async {
            let mut buffer = [0u8; 64];
            // Bounded: one turn per ping read.
            loop {
                if let Err(error) = connection.read(&mut buffer).await {
                    return error;
                }
            }
        };
        let error = tokio::select! {
            error = reading => error,
            () = pinging => panic!("still open after all the pings"),
        };
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), IDLE);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_in_flight_keeps_a_silent_connection_open() {
        let port = Arc::new(Port::default());
        let (mut connection, _peer) = connection(&port);
        let open = connection.place().requests().open();
        let mut buffer = [0u8; 64];
        assert!(
            tokio::time::timeout(IDLE * 10, connection.read(&mut buffer))
                .await
                .is_err(),
            "open for as long as its request"
        );
        drop(open);
        let started = Instant::now();
        let error = connection
            .read(&mut buffer)
            .await
            .expect_err("closed once idle");
        assert_eq!(
            (error.kind(), started.elapsed()),
            (io::ErrorKind::TimedOut, IDLE)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_whose_place_went_to_a_newer_one_fails_at_once() {
        let port = Arc::new(Port::default());
        let (ours, _theirs) = tokio::io::duplex(1024);
        let place = port
            .admit(Ipv4Addr::LOCALHOST.into(), 1, IDLE)
            .expect("room");
        let mut connection = Limited { io: ours, place };
        let mut buffer = [0u8; 64];
        let reading = tokio::spawn(async move {
            connection
                .read(&mut buffer)
                .await
                .map_err(|error| error.kind())
        });
        tokio::task::yield_now().await;
        let _newer = port
            .admit(Ipv4Addr::LOCALHOST.into(), 1, IDLE)
            .expect("room made");
        assert_eq!(
            reading.await.unwrap(),
            Err(io::ErrorKind::ConnectionAborted)
        );
    }
}

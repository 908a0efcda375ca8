//! A listener that speaks TLS and tells each request who is calling.
//!
//! Handshakes run beside the accept loop, each under a time limit, so that a peer that opens a
//! connection and says nothing holds neither the loop nor a place for long. The caller's identity,
//! read once per connection from its certificate, travels with every request on the connection
//! as axum's `ConnectInfo<Peer>` (plain-text connections carry a `Peer` without identity). A caller
//! without one keeps its place no longer than the handshake's time limit: long enough to be told
//! `UNAUTHENTICATED`, too short to hold the port.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::serve::Listener;
use rustls::ServerConfig;
use tokio::{net::TcpStream, task::JoinSet, time::Instant};
use tokio_rustls::{TlsAcceptor, server::TlsStream};

use crate::{
    connections::{Limited, LimitedListener, Place, Placed},
    tls::peer_identity,
};

/// Who is on the other end of a connection.
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The service named by the caller's certificate (already verified against the chain's CA);
    /// `None` when it presented none.
    pub identity: Option<Arc<str>>,
}

impl From<SocketAddr> for Peer {
    /// A peer on a plain-text connection: no certificate, no identity.
    fn from(addr: SocketAddr) -> Self {
        Self {
            addr,
            identity: None,
        }
    }
}

type Connection = TlsStream<Limited<TcpStream>>;

/// Accepts connections (under their limits) and hands on those whose TLS handshake completed in
/// time.
pub struct TlsListener {
    tcp: LimitedListener,
    acceptor: TlsAcceptor,
    handshake_timeout: Duration,
    handshakes: JoinSet<Option<(Connection, Peer)>>,
}

impl TlsListener {
    pub fn new(
        tcp: LimitedListener,
        config: Arc<ServerConfig>,
        handshake_timeout: Duration,
    ) -> Self {
        Self {
            tcp,
            acceptor: TlsAcceptor::from(config),
            handshake_timeout,
            handshakes: JoinSet::new(),
        }
    }
}

impl Listener for TlsListener {
    type Io = Connection;
    type Addr = Peer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                (tcp, addr) = self.tcp.accept() => {
                    let acceptor = self.acceptor.clone();
                    let limit = self.handshake_timeout;
                    self.handshakes.spawn(async move {
                        let time_up = Instant::now() + limit;
                        match tokio::time::timeout_at(time_up, acceptor.accept(tcp)).await {
                            Ok(Ok(stream)) => {
                                let identity = stream.get_ref().1.peer_certificates().and_then(|certs| certs.first()).and_then(peer_identity);
                                if identity.is_none() {
                                    stream.place().uncertified_until(time_up);
                                }
                                Some((stream, Peer { addr, identity: identity.map(Arc::from) }))
                            }
                            Ok(Err(error)) => {
                                tracing::debug!(%addr, %error, "TLS handshake failed");
                                None
                            }
                            Err(_) => {
                                tracing::debug!(%addr, ?limit, "TLS handshake timed out");
                                None
                            }
                        }
                    });
                }
                Some(done) = self.handshakes.join_next() => {
                    if let Ok(Some(connection)) = done {
                        return connection;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(Peer {
            addr: self.tcp.local_addr()?,
            identity: None,
        })
    }
}

impl<Io: Placed> Placed for TlsStream<Io> {
    fn place(&self) -> &Place {
        self.get_ref().0.place()
    }
}

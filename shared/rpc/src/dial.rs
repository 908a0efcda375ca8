//! Channels to the next hop: TLS dialled here with the service's current certificate.
//!
//! Why not tonic's own TLS: `ClientTlsConfig` fixes the certificate when the channel is made, so
//! a certificate rotated on disk would be presented only after a restart. The rustls
//! configuration in [`ServiceTls`] resolves the certificate per handshake instead.

use std::{
    future::Future,
    io,
    pin::Pin,
    task::{Context, Poll},
};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

use crate::tls::ServiceTls;

/// An endpoint for `address` (a URL or `host:port`). Always `http://`: whether the connection
/// speaks TLS is decided by [`channel`] from the service's `tls` setting, never by the scheme, so
/// a typo cannot turn TLS off.
pub fn endpoint(address: &str) -> Result<Endpoint, tonic::transport::Error> {
    let authority = address.split_once("://").map_or(address, |(_, rest)| rest);
    Endpoint::from_shared(format!("http://{authority}"))
}

/// A lazily connecting channel to `service` at `endpoint`; over TLS, presenting the current
/// certificate of `tls` and expecting `service`'s name in the server's, when `tls` has
/// certificates.
pub fn channel(endpoint: &Endpoint, service: &str, tls: &ServiceTls) -> Channel {
    match tls.client_config(service) {
        Some((config, name)) => endpoint.connect_with_connector_lazy(TlsConnector {
            tls: config.into(),
            name,
        }),
        None => endpoint.connect_lazy(),
    }
}

/// Dials TCP, then TLS as `name`'s client. tonic wraps it in the endpoint's connect timeout.
#[derive(Clone)]
struct TlsConnector {
    tls: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl tower::Service<http::Uri> for TlsConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let (tls, name) = (self.tls.clone(), self.name.clone());
        Box::pin(async move {
            let host = uri.host().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("{uri} names no host"))
            })?;
            let port = uri.port_u16().unwrap_or(443);
            let tcp =
                TcpStream::connect((host.trim_start_matches('[').trim_end_matches(']'), port))
                    .await?;
            tcp.set_nodelay(true)?;
            Ok(TokioIo::new(tls.connect(name, tcp).await?))
        })
    }
}

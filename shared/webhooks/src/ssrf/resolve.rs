//! Name resolution behind a trait, so that vetting can be tested with names that resolve to
//! whatever a test needs, and a deployment can bring its own resolver.

use std::future::Future;
use std::io;
use std::net::IpAddr;

/// Resolves a host name to its addresses.
pub trait Resolve {
    /// Every address `host` resolves to, in the resolver's order.
    fn resolve(&self, host: &str) -> impl Future<Output = io::Result<Vec<IpAddr>>> + Send;
}

/// The operating system's resolver, through tokio's `lookup_host`.
///
/// Each lookup holds a thread of tokio's blocking pool until `getaddrinfo` returns, however long
/// its name servers take, and a timeout drops only the future: fine for a tool or a test, not for
/// a sender whose recipients choose their names (the webhook sender has an asynchronous resolver
/// of its own, with a lookup timeout and a cap per client).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        // lookup_host wants a port; any will do, since the caller dials the URL's port.
        let addrs = tokio::net::lookup_host((host, 0)).await?;
        Ok(addrs.map(|addr| addr.ip()).collect())
    }
}

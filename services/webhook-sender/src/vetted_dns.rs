//! The only name resolution the delivery client does: the addresses the SSRF guard vetted.
//!
//! Why not `ClientBuilder::resolve_to_addrs`? It fixes the addresses when a client is built, so
//! every delivery would need a client of its own: no connection reuse, and the TLS configuration
//! built again each time. Instead the one shared client resolves through this table, which a
//! delivery fills with its vetted addresses just before it sends. A name that was never vetted
//! resolves to nothing (the system resolver is never asked), so a connection can only ever go to
//! an address that passed the guard: a name that answers differently when dialled (DNS
//! rebinding) gets nowhere. URLs with an IP address are not resolved at all; the guard vetted
//! that address itself.
//!
//! The table keeps the latest vetted addresses per name; deliveries to the same name at once may
//! overwrite each other's entry, and every entry was vetted, so either one is safe to dial. A
//! pooled connection stays with the address it was opened to, vetted then; and since the URL is
//! vetted again before every delivery, a name that now resolves to a denied address is refused
//! before any connection, pooled or new, is used.

use std::{
    collections::HashMap,
    io,
    net::SocketAddr,
    sync::{Arc, Mutex, PoisonError},
};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Vetted addresses by host name, shared by the delivery client and the deliveries.
#[derive(Debug, Clone, Default)]
pub(crate) struct VettedDns {
    by_host: Arc<Mutex<HashMap<String, Vec<SocketAddr>>>>,
}

impl VettedDns {
    /// Makes `host` resolve to `addrs`, which the guard has just vetted.
    pub(crate) fn pin(&self, host: &str, addrs: &[SocketAddr]) {
        // Port 0: the connector then dials each request's own port, so two URLs of one host on
        // different ports never dial each other's.
        let addrs = addrs
            .iter()
            .map(|addr| SocketAddr::new(addr.ip(), 0))
            .collect();
        // A plain map of values: a panic elsewhere cannot leave it half-written.
        self.by_host
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(host.to_ascii_lowercase(), addrs);
    }

    fn lookup(&self, host: &str) -> Option<Vec<SocketAddr>> {
        self.by_host
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&host.to_ascii_lowercase())
            .cloned()
    }
}

impl Resolve for VettedDns {
    fn resolve(&self, name: Name) -> Resolving {
        let found = self.lookup(name.as_str());
        Box::pin(async move {
            match found {
                Some(addrs) => Ok(Box::new(addrs.into_iter()) as Addrs),
                None => Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("{} was not vetted", name.as_str()),
                )
                .into()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn resolve(dns: &VettedDns, host: &str) -> Result<Vec<SocketAddr>, String> {
        let name: Name = host.parse().expect("a host name");
        dns.resolve(name)
            .await
            .map(|addrs| addrs.collect())
            .map_err(|error| error.to_string())
    }

    #[tokio::test]
    async fn only_vetted_names_resolve_and_only_to_their_vetted_addresses() {
        let dns = VettedDns::default();
        let error = resolve(&dns, "hooks.example.com")
            .await
            .expect_err("never vetted");
        assert!(error.contains("not vetted"), "{error}");
        dns.pin(
            "Hooks.Example.com",
            &[SocketAddr::from(([93, 184, 215, 14], 443))],
        );
        let any_port = SocketAddr::from(([93, 184, 215, 14], 0));
        assert_eq!(
            resolve(&dns, "hooks.example.com").await.expect("vetted"),
            [any_port],
            "the request's own port is dialled"
        );
    }
}

//! The sender's name resolution: asynchronous, cached, bounded in time, and capped per client.
//!
//! Why not the system resolver (`getaddrinfo` through tokio's `lookup_host`)? It blocks a thread
//! of tokio's one blocking pool for each lookup, and a timeout drops the future, not the thread.
//! A client whose names point at a name server that never answers fills that pool, and every
//! other client's lookups wait behind its threads. hickory-resolver sends its queries from tasks:
//! a lookup nobody answers holds a timer, not a thread, and ends at the lookup timeout.
//! It also keeps answers for their TTL (at most `max_ttl_ms`) and remembers a name that does not
//! exist for `negative_ttl_ms`, so most attempts ask no name server at all.
//!
//! A cached answer is never trusted as vetted: the SSRF guard checks the addresses of every
//! lookup, cached or not, before any connection, so a name whose answer is now denied (an
//! extra denied range added since, say) is refused on the next attempt.
//!
//! Names are looked up as absolute names, without the system's search domains: a recipient's URL
//! names a public host, and a search domain would turn `postgres` into
//! `postgres.svc.cluster.local`.

use std::{io, net::IpAddr, time::Duration};

use hickory_resolver::{
    TokioResolver,
    config::{ConnectionConfig, NameServerConfig, ResolverConfig},
    net::{NetError, runtime::TokioRuntimeProvider},
};
use webhooks::ssrf::Resolve;

use crate::settings::DnsSettings;

/// Looks names up through hickory-resolver, within the lookup timeout.
pub struct DnsResolver {
    resolver: TokioResolver,
    lookup_timeout: Duration,
}

impl std::fmt::Debug for DnsResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsResolver")
            .field("lookup_timeout", &self.lookup_timeout)
            .finish_non_exhaustive()
    }
}

impl DnsResolver {
    /// A resolver asking `settings.name_servers`, or the system's (`/etc/resolv.conf`) when none
    /// are named, that gives a lookup `lookup_timeout` in all.
    pub fn new(settings: &DnsSettings, lookup_timeout: Duration) -> Result<Self, NetError> {
        let mut builder = if settings.name_servers.is_empty() {
            TokioResolver::builder_tokio()?
        } else {
            let name_servers = settings
                .name_servers
                .iter()
                .map(|addr| {
                    let connections =
                        [ConnectionConfig::udp(), ConnectionConfig::tcp()].map(|mut connection| {
                            connection.port = addr.port();
                            connection
                        });
                    NameServerConfig::new(addr.ip(), true, connections.into())
                })
                .collect();
            TokioResolver::builder_with_config(
                ResolverConfig::from_name_servers(name_servers),
                TokioRuntimeProvider::default(),
            )
        };
        let options = builder.options_mut();
        // Two tries within the lookup timeout (resolv.conf's default is two), so that one lost
        // UDP packet does not fail the attempt, and no query outlives the lookup it serves.
        options.attempts = 2;
        options.timeout = lookup_timeout / 2;
        options.cache_size = settings.cache_entries;
        options.positive_max_ttl = Some(Duration::from_millis(settings.max_ttl_ms));
        let negative_ttl = Some(Duration::from_millis(settings.negative_ttl_ms));
        (options.negative_min_ttl, options.negative_max_ttl) = (negative_ttl, negative_ttl);
        Ok(Self {
            resolver: builder.build()?,
            lookup_timeout,
        })
    }
}

impl Resolve for DnsResolver {
    async fn resolve(&self, host: &str) -> io::Result<Vec<IpAddr>> {
        let absolute = if host.ends_with('.') {
            host.to_owned()
        } else {
            format!("{host}.")
        };
        match tokio::time::timeout(self.lookup_timeout, self.resolver.lookup_ip(absolute)).await {
            Ok(Ok(found)) => Ok(found.iter().collect()),
            Ok(Err(error)) => Err(io::Error::other(error)),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {} ms", self.lookup_timeout.as_millis()),
            )),
        }
    }
}

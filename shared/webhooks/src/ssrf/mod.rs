//! Vetting a recipient's URL before a webhook delivery, so that a delivery never reaches into our
//! own network.
//!
//! Why? Recipients choose their URLs, and the sender dials them from inside our infrastructure. A
//! URL naming a loopback or private address, or a cloud metadata service, would turn the sender
//! into a proxy to places the recipient cannot reach itself (server-side request forgery). The
//! guard works in three steps, and their order matters:
//!
//! 1. [`Target::parse`] reads the URL with the WHATWG parser that browsers use, so numeric tricks
//!    such as `0x7f.1`, `2130706433` or `017700000001` come out as the IPv4 address they stand
//!    for and only one form is ever checked. It refuses anything but https (unless the
//!    [`DestinationPolicy`] names the host as a test host), URLs with a user name or password, URLs longer
//!    than [`MAX_URL_LEN`], and ports below 1024 other than 443. [`Target::normalised`] is the
//!    one form to store and show: what the parser made of the URL (`https:///h` is
//!    `https://h/`, `https://example.com\@127.0.0.1/h` is `https://example.com/@127.0.0.1/h`),
//!    so that whoever reads it later cannot read it otherwise.
//! 2. [`Target::resolve`] resolves a host name once, through [`Resolve`], and checks every
//!    address against the deny list ([`denied_range`]).
//! 3. The resulting [`VettedTarget`] carries the addresses that passed, and the caller connects
//!    to one of them without resolving the name again: a name that answers with a public address
//!    when it is checked and with a private one when it is dialled (DNS rebinding) gets nowhere.
//!
//! [`vet`] does all three.

mod deny;
mod resolve;

use std::io;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;
use url::{Host, Url};

pub use deny::{DeniedRange, denied_range};
pub use resolve::{Resolve, SystemResolver};

/// The longest URL accepted, as sent and as normalised: what browsers and CDNs reliably carry.
pub const MAX_URL_LEN: usize = 2_048;

/// Why a delivery target was refused.
#[derive(Debug, thiserror::Error)]
pub enum SsrfError {
    #[error("invalid URL: {0}")]
    InvalidUrl(#[from] url::ParseError),
    #[error("URLs are at most {MAX_URL_LEN} characters")]
    TooLong,
    #[error("port {0} is refused: deliveries go to port 443 or to a port from 1024 up")]
    Port(u16),
    #[error("URL scheme {0:?} is refused: deliveries go over https")]
    UnsupportedScheme(String),
    #[error("URLs with a user name or password are refused")]
    Userinfo,
    #[error("plain http to {host}:{port} is refused: deliveries go over https")]
    PlainHttp { host: String, port: u16 },
    #[error("{host} is {addr}, in {}, which is denied: {}", range.net, range.reason)]
    Denied {
        host: String,
        addr: IpAddr,
        range: &'static DeniedRange,
    },
    #[error("{host} is {addr}, in {net}, which this deployment denies")]
    DeniedByPolicy {
        host: String,
        addr: IpAddr,
        net: IpNet,
    },
    #[error("could not resolve {host}: {source}")]
    Resolve { host: String, source: io::Error },
    #[error("{host} resolves to no address")]
    NoAddresses { host: String },
}

/// A test host that [`DestinationPolicy::allow_test_host`] cannot read.
#[derive(Debug, thiserror::Error)]
pub enum InvalidTestHost {
    #[error("test host {0:?} is not host:port")]
    NotHostPort(String),
    #[error("test host {host:?} is not a host name or an IP address: {source}")]
    Host {
        host: String,
        source: url::ParseError,
    },
}

/// What a delivery may dial besides public https URLs.
///
/// The default is the production policy: https only, and every address vetted. Test hosts are
/// for tests and local demos only, since a receiver on loopback or on a compose network is
/// exactly what the guard exists to refuse.
#[derive(Clone, Debug, Default)]
pub struct DestinationPolicy {
    test_hosts: Vec<(Host, u16)>,
    extra_denied: Vec<IpNet>,
}

impl DestinationPolicy {
    /// Denies `net` too, beside the [deny list](denied_range): the deployment's own public
    /// ranges, say, which the special-purpose registries cannot know. Test hosts stay exempt.
    pub fn deny(mut self, net: IpNet) -> Self {
        self.extra_denied.push(net);
        self
    }

    /// Exempts `host_port` (`receiver.local:9000`, `127.0.0.1:9000`, `[::1]:9000`) from the
    /// https rule and from the deny list.
    ///
    /// The host is a name or an IP address (IPv6 in brackets); it is normalised as a URL's host
    /// is, so `LOCALHOST` names `localhost` and `0x7f.1` names `127.0.0.1`.
    pub fn allow_test_host(mut self, host_port: &str) -> Result<Self, InvalidTestHost> {
        // The port follows the last colon; an IPv6 host keeps its brackets.
        let (host, port) = host_port
            .rsplit_once(':')
            .and_then(|(host, port)| Some((host, port.parse::<u16>().ok()?)))
            .ok_or_else(|| InvalidTestHost::NotHostPort(host_port.to_owned()))?;
        let parsed = Host::parse(host).map_err(|source| InvalidTestHost::Host {
            host: host.to_owned(),
            source,
        })?;
        self.test_hosts.push((parsed, port));
        Ok(self)
    }

    fn is_test_host(&self, host: &Host, port: u16) -> bool {
        self.test_hosts
            .iter()
            .any(|(test_host, test_port)| test_host == host && *test_port == port)
    }
}

/// A recipient URL that passed the checks that need no resolution.
#[derive(Clone, Debug)]
pub struct Target {
    url: Url,
    host: Host,
    port: u16,
    test_host: bool,
    extra_denied: Vec<IpNet>,
}

impl Target {
    /// Parses and checks `url`: at most [`MAX_URL_LEN`] characters, http(s) only, https unless
    /// a test host, no user information, port 443 or from 1024 up unless a test host, and an IP
    /// address in place of a name must not be denied.
    pub fn parse(url: &str, policy: &DestinationPolicy) -> Result<Self, SsrfError> {
        if url.len() > MAX_URL_LEN {
            return Err(SsrfError::TooLong);
        }
        let url = Url::parse(url)?;
        // Percent-encoding can make the stored form longer than what was sent.
        if url.as_str().len() > MAX_URL_LEN {
            return Err(SsrfError::TooLong);
        }
        let https = match url.scheme() {
            "https" => true,
            "http" => false,
            other => return Err(SsrfError::UnsupportedScheme(other.to_owned())),
        };
        // Credentials in a URL end up in logs and in redirects; a recipient authenticates us by
        // the signature, and we have no use for theirs.
        if !url.username().is_empty() || url.password().is_some() {
            return Err(SsrfError::Userinfo);
        }
        // The parser refuses http(s) URLs without a host, and both schemes have a default port.
        let (Some(host), Some(port)) = (url.host(), url.port_or_known_default()) else {
            return Err(SsrfError::InvalidUrl(url::ParseError::EmptyHost));
        };
        let host = host.to_owned();
        let test_host = policy.is_test_host(&host, port);
        if !https && !test_host {
            return Err(SsrfError::PlainHttp {
                host: host.to_string(),
                port,
            });
        }
        // Below 1024 live the services of a host (ssh 22, smtp 25, ...), never a webhook
        // recipient; a delivery there would turn the sender against them.
        if port != 443 && port < 1024 && !test_host {
            return Err(SsrfError::Port(port));
        }
        let target = Self {
            url,
            host,
            port,
            test_host,
            extra_denied: policy.extra_denied.clone(),
        };
        if let Some(ip) = target.literal_ip() {
            target.check(ip)?;
        }
        Ok(target)
    }

    /// Resolves the host once (an IP address needs no resolution) and vets every address.
    ///
    /// One denied address refuses the whole name, not only that address. A name with a private
    /// address among public ones is misconfigured or an attempt to get the private one dialled
    /// (by a client falling back to the next address, or a resolver that answers differently
    /// each time); refusing it outright leaves no such path and tells the recipient's owner why.
    pub async fn resolve(self, resolver: &impl Resolve) -> Result<VettedTarget, SsrfError> {
        let ips = match self.literal_ip() {
            Some(ip) => vec![ip],
            None => {
                let name = self.host.to_string();
                resolver
                    .resolve(&name)
                    .await
                    .map_err(|source| SsrfError::Resolve { host: name, source })?
            }
        };
        if ips.is_empty() {
            return Err(SsrfError::NoAddresses {
                host: self.host.to_string(),
            });
        }
        let mut addrs = Vec::with_capacity(ips.len());
        for ip in ips {
            // An IPv4-mapped address is dialled as the IPv4 address it names.
            let ip = ip.to_canonical();
            self.check(ip)?;
            let addr = SocketAddr::new(ip, self.port);
            if !addrs.contains(&addr) {
                addrs.push(addr);
            }
        }
        Ok(VettedTarget {
            host: self.host.to_string(),
            url: self.url,
            addrs,
        })
    }

    /// Whether [`Target::resolve`] asks the resolver: the host is a name, not an IP address.
    pub fn needs_lookup(&self) -> bool {
        self.literal_ip().is_none()
    }

    /// The URL as the WHATWG parser serialises it: the form to store and show.
    pub fn normalised(&self) -> &str {
        self.url.as_str()
    }

    fn literal_ip(&self) -> Option<IpAddr> {
        match self.host {
            Host::Ipv4(ip) => Some(ip.into()),
            Host::Ipv6(ip) => Some(ip.into()),
            Host::Domain(_) => None,
        }
    }

    fn check(&self, addr: IpAddr) -> Result<(), SsrfError> {
        if self.test_host {
            return Ok(());
        }
        if let Some(range) = denied_range(addr) {
            return Err(SsrfError::Denied {
                host: self.host.to_string(),
                addr,
                range,
            });
        }
        match self.extra_denied.iter().find(|net| net.contains(&addr)) {
            Some(net) => Err(SsrfError::DeniedByPolicy {
                host: self.host.to_string(),
                addr,
                net: *net,
            }),
            None => Ok(()),
        }
    }
}

/// A recipient URL with the addresses to dial for it, every one of them vetted.
///
/// Connect only to [`VettedTarget::addrs`]; resolving [`VettedTarget::host`] again would undo
/// the vetting.
#[derive(Clone, Debug)]
pub struct VettedTarget {
    url: Url,
    host: String,
    addrs: Vec<SocketAddr>,
}

impl VettedTarget {
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// The host as the URL names it: the TLS server name when it is a domain, and the host of
    /// the `Host` header (an IPv6 address in brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The vetted addresses with the URL's port, in the resolver's order, without repeats.
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }
}

/// Parses, resolves and vets `url`: [`Target::parse`] then [`Target::resolve`].
pub async fn vet(
    url: &str,
    policy: &DestinationPolicy,
    resolver: &impl Resolve,
) -> Result<VettedTarget, SsrfError> {
    Target::parse(url, policy)?.resolve(resolver).await
}

#[cfg(test)]
mod tests;

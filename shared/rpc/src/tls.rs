//! Mutual TLS between hops: every service has one certificate, signed by the chain's CA, that it
//! presents both as a server and as a client.
//!
//! A service's identity is the DNS name `<service>.chain.internal` in its certificate's subject
//! alternative names ([`dns_name`]). Clients check a server's certificate against the name of the
//! service they mean to reach, whatever address they dial; servers read the caller's name from
//! its certificate ([`peer_identity`]) and let [`crate::authorize`] decide what it may call.

use std::{path::PathBuf, sync::Arc};

use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    server::WebPkiClientVerifier,
};
use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

/// The DNS suffix of every service name in the chain's certificates.
pub const TRUST_DOMAIN: &str = "chain.internal";

/// The name a certificate of `service` carries: `orders` → `orders.chain.internal`.
pub fn dns_name(service: &str) -> String {
    format!("{service}.{TRUST_DOMAIN}")
}

/// Where a service finds its certificate, its key and the CA it trusts (PEM files).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSettings {
    /// The CA that signs the certificates of the chain's services (and the operator's).
    pub ca_file: Option<PathBuf>,
    /// This service's certificate (chain), with `<service>.chain.internal` among its names.
    pub cert_file: Option<PathBuf>,
    /// This service's private key.
    pub key_file: Option<PathBuf>,
    /// Serve and dial gRPC in plain text, with no certificates and so no caller checks: for
    /// experiments only. The files above must then be unset.
    pub plaintext: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("tls.ca_file, tls.cert_file and tls.key_file are required (or tls.plaintext = true, which turns caller checks off)")]
    Missing,
    #[error("tls.plaintext = true with certificate files set: choose one")]
    Ambiguous,
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{path}: {reason}")]
    Pem { path: PathBuf, reason: String },
    #[error("the certificate in {path} does not name {expected}")]
    WrongName { path: PathBuf, expected: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// A service's loaded TLS material, or plain text.
#[derive(Clone)]
pub enum ServiceTls {
    Plaintext,
    Mutual(Arc<MutualTls>),
}

/// The CA, certificate and key of one service, ready for servers and channels.
pub struct MutualTls {
    service: String,
    ca: Certificate,
    identity: Identity,
    server: Arc<ServerConfig>,
}

impl ServiceTls {
    /// Loads `service`'s certificate, key and CA, and checks that the certificate names the
    /// service, so that a mix-up of files fails at start and not on the first call.
    pub fn load(service: &str, settings: &TlsSettings) -> Result<Self, TlsError> {
        let files = (&settings.ca_file, &settings.cert_file, &settings.key_file);
        match (settings.plaintext, files) {
            (true, (None, None, None)) => Ok(Self::Plaintext),
            (true, _) => Err(TlsError::Ambiguous),
            (false, (Some(ca), Some(cert), Some(key))) => {
                let ca = read(ca)?;
                let cert_pem = read(cert)?;
                let key_pem = read(key)?;
                MutualTls::new(service, &ca, &cert_pem, &key_pem, settings).map(|tls| Self::Mutual(Arc::new(tls)))
            }
            (false, _) => Err(TlsError::Missing),
        }
    }

    /// TLS from PEM text already in memory (the dev CA's, in tests).
    pub fn from_pem(service: &str, ca: &[u8], cert: &[u8], key: &[u8]) -> Result<Self, TlsError> {
        MutualTls::new(service, ca, cert, key, &TlsSettings::default()).map(|tls| Self::Mutual(Arc::new(tls)))
    }

    /// The client side for a channel to `server` (a service name): this service's certificate,
    /// the chain's CA, and `server`'s name expected in the answer's certificate. `None` in plain
    /// text.
    pub fn client_config(&self, server: &str) -> Option<ClientTlsConfig> {
        match self {
            Self::Plaintext => None,
            Self::Mutual(tls) => Some(
                ClientTlsConfig::new().ca_certificate(tls.ca.clone()).identity(tls.identity.clone()).domain_name(dns_name(server)).assume_http2(true),
            ),
        }
    }

    /// The server side; `None` in plain text.
    pub fn server_config(&self) -> Option<Arc<ServerConfig>> {
        match self {
            Self::Plaintext => None,
            Self::Mutual(tls) => Some(tls.server.clone()),
        }
    }

    /// The service this material belongs to (`None` in plain text).
    pub fn service(&self) -> Option<&str> {
        match self {
            Self::Plaintext => None,
            Self::Mutual(tls) => Some(&tls.service),
        }
    }
}

impl MutualTls {
    fn new(service: &str, ca: &[u8], cert_pem: &[u8], key_pem: &[u8], settings: &TlsSettings) -> Result<Self, TlsError> {
        let path = |file: &Option<PathBuf>| file.clone().unwrap_or_else(|| PathBuf::from("<memory>"));
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
            .collect::<Result<_, _>>()
            .map_err(|error| TlsError::Pem { path: path(&settings.cert_file), reason: error.to_string() })?;
        let leaf = certs.first().ok_or_else(|| TlsError::Pem { path: path(&settings.cert_file), reason: "no certificate".into() })?;
        if peer_identity(leaf).as_deref() != Some(service) {
            return Err(TlsError::WrongName { path: path(&settings.cert_file), expected: dns_name(service) });
        }
        let key =
            PrivateKeyDer::from_pem_slice(key_pem).map_err(|error| TlsError::Pem { path: path(&settings.key_file), reason: error.to_string() })?;
        let mut roots = RootCertStore::empty();
        for ca_cert in CertificateDer::pem_slice_iter(ca) {
            let ca_cert = ca_cert.map_err(|error| TlsError::Pem { path: path(&settings.ca_file), reason: error.to_string() })?;
            roots.add(ca_cert).map_err(|error| TlsError::Pem { path: path(&settings.ca_file), reason: error.to_string() })?;
        }
        // A caller without a certificate completes the handshake, so that it is answered
        // UNAUTHENTICATED in gRPC terms instead of a bare TLS alert; a certificate that the CA
        // did not sign still fails the handshake.
        let verifier =
            WebPkiClientVerifier::builder(Arc::new(roots)).allow_unauthenticated().build().map_err(|error| TlsError::Config(error.to_string()))?;
        let mut server = ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .map_err(|error| TlsError::Config(error.to_string()))?;
        // HTTP/1.1 too: `/metrics` is read by scrapers that speak no HTTP/2.
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            service: service.to_owned(),
            ca: Certificate::from_pem(ca),
            identity: Identity::from_pem(cert_pem, key_pem),
            server: Arc::new(server),
        })
    }
}

fn read(path: &PathBuf) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { path: path.clone(), source })
}

/// The service a (verified) certificate belongs to: the one subject alternative DNS name of the
/// form `<service>.chain.internal`. A certificate with none, with several, or with a wildcard
/// has no identity: it cannot be mistaken for every service at once.
pub fn peer_identity(certificate: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate.as_ref()).ok()?;
    let names = parsed.subject_alternative_name().ok()??;
    let suffix = format!(".{TRUST_DOMAIN}");
    let mut services = names.value.general_names.iter().filter_map(|name| match name {
        x509_parser::extensions::GeneralName::DNSName(dns) => dns.strip_suffix(suffix.as_str()),
        _ => None,
    });
    let service = services.next()?;
    let valid = !service.is_empty() && !service.contains(['.', '*']);
    (valid && services.next().is_none()).then(|| service.to_owned())
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, KeyPair};

    use super::*;
    use crate::dev_certs::DevCerts;

    fn identity_of(names: &[&str]) -> Option<String> {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
        peer_identity(params.self_signed(&key).unwrap().der())
    }

    #[test]
    fn a_certificate_names_one_service_or_none() {
        assert_eq!(identity_of(&["orders.chain.internal"]).as_deref(), Some("orders"));
        assert_eq!(identity_of(&["orders.chain.internal", "localhost"]).as_deref(), Some("orders"));
        assert_eq!(identity_of(&["*.chain.internal"]), None);
        assert_eq!(identity_of(&["orders.chain.internal", "payment.chain.internal"]), None);
        assert_eq!(identity_of(&["a.orders.chain.internal"]), None);
        assert_eq!(identity_of(&["orders.chain.internal.example.com"]), None);
        assert_eq!(identity_of(&["chain.internal"]), None);
    }

    #[test]
    fn a_service_loads_its_own_certificate_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let certs = DevCerts::generate(dir.path(), &["orders", "payment"]).unwrap();
        let tls = ServiceTls::load("orders", &certs.settings("orders")).unwrap();
        assert_eq!(tls.service(), Some("orders"));
        assert!(tls.client_config("payment").is_some() && tls.server_config().is_some());
        let mixed_up = ServiceTls::load("payment", &certs.settings("orders"));
        assert!(matches!(mixed_up, Err(TlsError::WrongName { .. })), "{:?}", mixed_up.err());
    }

    #[test]
    fn plain_text_is_chosen_explicitly_and_alone() {
        assert!(matches!(ServiceTls::load("orders", &TlsSettings::default()), Err(TlsError::Missing)));
        let plain = TlsSettings { plaintext: true, ..TlsSettings::default() };
        assert!(matches!(ServiceTls::load("orders", &plain), Ok(ServiceTls::Plaintext)));
        let both = TlsSettings { ca_file: Some("ca.pem".into()), ..plain };
        assert!(matches!(ServiceTls::load("orders", &both), Err(TlsError::Ambiguous)));
    }
}

//! Mutual TLS between hops: every service has one certificate, signed by the chain's CA, that it
//! presents both as a server and as a client.
//!
//! A service's identity is the DNS name `<service>.chain.internal` in its certificate's subject
//! alternative names ([`dns_name`]). Clients check a server's certificate against the name of the
//! service they mean to reach, whatever address they dial; servers read the caller's name from
//! its certificate ([`peer_identity`]) and let [`crate::authorize`] decide what it may call.

use std::{
    path::PathBuf,
    sync::{Arc, RwLock, Weak},
    time::Duration,
};

use rustls::{
    ClientConfig, RootCertStore, ServerConfig, SignatureScheme,
    client::ResolvesClientCert,
    pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject},
    server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier},
    sign::CertifiedKey,
};
use serde::{Deserialize, Serialize};

/// The DNS suffix of every service name in the chain's certificates.
pub const TRUST_DOMAIN: &str = "chain.internal";

/// The name a certificate of `service` carries: `orders` → `orders.chain.internal`.
pub fn dns_name(service: &str) -> String {
    format!("{service}.{TRUST_DOMAIN}")
}

/// Where a service finds its certificate, its key and the CA it trusts (PEM files; in
/// Kubernetes, the `tls.crt`, `tls.key` and `ca.crt` of a `kubernetes.io/tls` Secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSettings {
    /// The CA that signs the certificates of the chain's services (and the operator's).
    pub ca_file: Option<PathBuf>,
    /// This service's certificate (chain), with `<service>.chain.internal` among its names.
    pub cert_file: Option<PathBuf>,
    /// This service's private key.
    pub key_file: Option<PathBuf>,
    /// How often the certificate and key files are read again: a rotated pair is presented on
    /// the connections made after it is seen, in both directions, with no restart.
    pub reload_interval_ms: u64,
    /// Serve and dial gRPC in plain text, with no certificates and so no caller checks: for
    /// experiments only. The files above must then be unset.
    pub plaintext: bool,
}

impl Default for TlsSettings {
    fn default() -> Self {
        Self {
            ca_file: None,
            cert_file: None,
            key_file: None,
            reload_interval_ms: 10_000,
            plaintext: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(
        "tls.ca_file, tls.cert_file and tls.key_file are required (or tls.plaintext = true, which turns caller checks off)"
    )]
    Missing,
    #[error("tls.plaintext = true with certificate files set: choose one")]
    Ambiguous,
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
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
    settings: TlsSettings,
    /// The certificate and key presented on new connections, both ways.
    current: Arc<CurrentKey>,
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

impl ServiceTls {
    /// Loads `service`'s certificate, key and CA, and checks that the certificate names the
    /// service, so that a mix-up of files fails at start and not on the first call.
    pub fn load(service: &str, settings: &TlsSettings) -> Result<Self, TlsError> {
        let files = (&settings.ca_file, &settings.cert_file, &settings.key_file);
        match (settings.plaintext, files) {
            (true, (None, None, None)) => Ok(Self::Plaintext),
            (true, _) => Err(TlsError::Ambiguous),
            (false, (Some(ca), Some(_), Some(_))) => {
                MutualTls::new(service, &read(ca)?, read_key(service, settings)?, settings)
                    .map(|tls| Self::Mutual(Arc::new(tls)))
            }
            (false, _) => Err(TlsError::Missing),
        }
    }

    /// Reads the certificate and key files again every `tls.reload_interval_ms` for as long as
    /// a server or channel made from this material is in use, and presents a new pair from then
    /// on. A pair that does not load (half written, or naming another service) is logged and the
    /// one in use kept. The CA is read once: trusting a new CA takes a restart.
    pub fn watched(self) -> Self {
        if let Self::Mutual(tls) = &self
            && tls.settings.reload_interval_ms > 0
        {
            let interval = Duration::from_millis(tls.settings.reload_interval_ms);
            tokio::spawn(watch(
                tls.service.clone(),
                tls.settings.clone(),
                Arc::downgrade(&tls.current),
                interval,
            ));
        }
        self
    }

    /// The server side; `None` in plain text.
    pub fn server_config(&self) -> Option<Arc<ServerConfig>> {
        match self {
            Self::Plaintext => None,
            Self::Mutual(tls) => Some(tls.server.clone()),
        }
    }

    /// The client side toward `server` (a service name): the rustls configuration with this
    /// service's current certificate, and the name expected in the server's certificate.
    /// `None` in plain text.
    pub fn client_config(&self, server: &str) -> Option<(Arc<ClientConfig>, ServerName<'static>)> {
        match self {
            Self::Plaintext => None,
            Self::Mutual(tls) => Some((
                tls.client.clone(),
                ServerName::try_from(dns_name(server)).ok()?,
            )),
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

/// Reloads `service`'s pair from the files of `settings` into `current` every `interval`, until
/// no server or client configuration holds `current` any more.
async fn watch(
    service: String,
    settings: TlsSettings,
    current: Weak<CurrentKey>,
    interval: Duration,
) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let Some(current) = current.upgrade() else {
            return;
        };
        match read_key(&service, &settings) {
            Ok(key) if key.cert != current.get().cert => {
                tracing::info!(%service, "presenting the certificate rotated on disk on new connections");
                current.set(Arc::new(key));
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%service, %error, "keeping the certificate in use"),
        }
    }
}

impl MutualTls {
    fn new(
        service: &str,
        ca: &[u8],
        key: CertifiedKey,
        settings: &TlsSettings,
    ) -> Result<Self, TlsError> {
        let mut roots = RootCertStore::empty();
        for ca_cert in CertificateDer::pem_slice_iter(ca) {
            let ca_cert = ca_cert.map_err(|error| TlsError::Pem {
                path: path(&settings.ca_file),
                reason: error.to_string(),
            })?;
            roots.add(ca_cert).map_err(|error| TlsError::Pem {
                path: path(&settings.ca_file),
                reason: error.to_string(),
            })?;
        }
        let roots = Arc::new(roots);
        let current = Arc::new(CurrentKey(RwLock::new(Arc::new(key))));
        // A caller without a certificate completes the handshake, so that it is answered
        // UNAUTHENTICATED in gRPC terms instead of a bare TLS alert; a certificate that the CA
        // did not sign still fails the handshake.
        let verifier = WebPkiClientVerifier::builder(roots.clone())
            .allow_unauthenticated()
            .build()
            .map_err(|error| TlsError::Config(error.to_string()))?;
        let mut server = ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(current.clone());
        // HTTP/1.1 too, for plain HTTP clients that speak no HTTP/2 (they are told who may call).
        server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let mut client = ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_cert_resolver(current.clone());
        client.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Self {
            service: service.to_owned(),
            settings: settings.clone(),
            current,
            server: Arc::new(server),
            client: Arc::new(client),
        })
    }
}

/// The certificate and key presented on new connections, as servers and as clients; swapped
/// whole when the files change (connections already open keep the pair they started with).
#[derive(Debug)]
struct CurrentKey(RwLock<Arc<CertifiedKey>>);

impl CurrentKey {
    fn get(&self) -> Arc<CertifiedKey> {
        self.0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn set(&self, key: Arc<CertifiedKey>) {
        *self
            .0
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = key;
    }
}

impl ResolvesServerCert for CurrentKey {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }
}

impl ResolvesClientCert for CurrentKey {
    fn resolve(
        &self,
        _acceptable_issuers: &[&[u8]],
        _schemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.get())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// `service`'s certificate and key from the files `settings` names, checked to name the service
/// and to belong together.
fn read_key(service: &str, settings: &TlsSettings) -> Result<CertifiedKey, TlsError> {
    let (Some(cert_file), Some(key_file)) = (&settings.cert_file, &settings.key_file) else {
        return Err(TlsError::Missing);
    };
    let pem_error = |file: &PathBuf, error: rustls::pki_types::pem::Error| TlsError::Pem {
        path: file.clone(),
        reason: error.to_string(),
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&read(cert_file)?)
        .collect::<Result<_, _>>()
        .map_err(|error| pem_error(cert_file, error))?;
    let leaf = certs.first().ok_or_else(|| TlsError::Pem {
        path: cert_file.clone(),
        reason: "no certificate".into(),
    })?;
    if peer_identity(leaf).as_deref() != Some(service) {
        return Err(TlsError::WrongName {
            path: cert_file.clone(),
            expected: dns_name(service),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(&read(key_file)?)
        .map_err(|error| pem_error(key_file, error))?;
    CertifiedKey::from_der(certs, key, &rustls::crypto::ring::default_provider()).map_err(|error| {
        TlsError::Pem {
            path: key_file.clone(),
            reason: format!("not the key of the certificate: {error}"),
        }
    })
}

fn path(file: &Option<PathBuf>) -> PathBuf {
    file.clone().unwrap_or_default()
}

fn read(path: &PathBuf) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.clone(),
        source,
    })
}

/// The service a (verified) certificate belongs to: the one subject alternative DNS name of the
/// form `<service>.chain.internal`. A certificate with none, with several, or with a wildcard
/// has no identity: it cannot be mistaken for every service at once.
pub fn peer_identity(certificate: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(certificate.as_ref()).ok()?;
    let names = parsed.subject_alternative_name().ok()??;
    let suffix = format!(".{TRUST_DOMAIN}");
    let mut services = names
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
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
        let params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        peer_identity(params.self_signed(&key).unwrap().der())
    }

    #[test]
    fn a_certificate_names_one_service_or_none() {
        assert_eq!(
            identity_of(&["orders.chain.internal"]).as_deref(),
            Some("orders")
        );
        assert_eq!(
            identity_of(&["orders.chain.internal", "localhost"]).as_deref(),
            Some("orders")
        );
        assert_eq!(identity_of(&["*.chain.internal"]), None);
        assert_eq!(
            identity_of(&["orders.chain.internal", "payment.chain.internal"]),
            None
        );
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
        assert!(
            matches!(mixed_up, Err(TlsError::WrongName { .. })),
            "{:?}",
            mixed_up.err()
        );
    }

    #[test]
    fn plain_text_is_chosen_explicitly_and_alone() {
        assert!(matches!(
            ServiceTls::load("orders", &TlsSettings::default()),
            Err(TlsError::Missing)
        ));
        let plain = TlsSettings {
            plaintext: true,
            ..TlsSettings::default()
        };
        assert!(matches!(
            ServiceTls::load("orders", &plain),
            Ok(ServiceTls::Plaintext)
        ));
        let both = TlsSettings {
            ca_file: Some("ca.pem".into()),
            ..plain
        };
        assert!(matches!(
            ServiceTls::load("orders", &both),
            Err(TlsError::Ambiguous)
        ));
    }
}

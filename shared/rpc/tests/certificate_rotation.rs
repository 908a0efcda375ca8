//! A certificate rotated on disk (as cert-manager renews one) is presented on the connections
//! made after it is seen, by servers and by clients, with no restart; a pair that does not load
//! leaves the one in use in place.

use std::{net::SocketAddr, path::Path, time::Duration};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rpc::tls::{ServiceTls, TlsSettings, dns_name};
use rustls::pki_types::CertificateDer;
use test_support::eventually;
use tokio::{net::TcpStream, sync::mpsc};

/// Reloads are looked for this often here (10 s by default).
const RELOAD: Duration = Duration::from_millis(50);
/// Generous bound for a reload to be seen on a loaded machine.
const SEEN: Duration = Duration::from_secs(10);

/// A CA of the test's own, which, unlike the development CA, keeps its key to sign renewals.
struct Ca {
    pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Ca {
    fn new() -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let pem = params.self_signed(&key).unwrap().pem();
        Self { pem, issuer: Issuer::new(params, key) }
    }

    /// Writes a new certificate of `service` and its key where `settings` names them, returning
    /// the certificate.
    fn issue(&self, service: &str, settings: &TlsSettings) -> CertificateDer<'static> {
        let key = KeyPair::generate().unwrap();
        let certificate = CertificateParams::new(vec![dns_name(service)]).unwrap().signed_by(&key, &self.issuer).unwrap();
        std::fs::write(settings.cert_file.as_ref().unwrap(), certificate.pem()).unwrap();
        std::fs::write(settings.key_file.as_ref().unwrap(), key.serialize_pem()).unwrap();
        certificate.der().clone()
    }

    fn settings(&self, dir: &Path, service: &str) -> TlsSettings {
        let ca_file = dir.join("ca.crt");
        std::fs::write(&ca_file, &self.pem).unwrap();
        std::fs::create_dir_all(dir.join(service)).unwrap();
        TlsSettings {
            ca_file: Some(ca_file),
            cert_file: Some(dir.join(service).join("tls.crt")),
            key_file: Some(dir.join(service).join("tls.key")),
            reload_interval_ms: RELOAD.as_millis() as u64,
            plaintext: false,
        }
    }
}

/// A TLS server with `tls`'s configuration that reports the certificate each client presented.
async fn server(tls: &ServiceTls) -> (SocketAddr, mpsc::UnboundedReceiver<Option<CertificateDer<'static>>>) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, presented) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            if let Ok(stream) = acceptor.accept(tcp).await {
                let client = stream.get_ref().1.peer_certificates().and_then(|chain| chain.first().cloned());
                let _ = seen.send(client.map(CertificateDer::into_owned));
            }
        }
    });
    (addr, presented)
}

/// Connects to `addr` as `tls`'s service, expecting `server`: the certificate the server
/// presented.
async fn connect(tls: &ServiceTls, server: &str, addr: SocketAddr) -> CertificateDer<'static> {
    let (config, name) = tls.client_config(server).unwrap();
    let stream = tokio_rustls::TlsConnector::from(config).connect(name, TcpStream::connect(addr).await.unwrap()).await.unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0].clone().into_owned()
}

#[tokio::test]
async fn servers_and_clients_present_a_rotated_certificate_on_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let (orders_settings, gateway_settings) = (ca.settings(dir.path(), "orders"), ca.settings(dir.path(), "gateway"));
    let orders_first = ca.issue("orders", &orders_settings);
    let gateway_first = ca.issue("gateway", &gateway_settings);
    let orders = ServiceTls::load("orders", &orders_settings).unwrap().watched();
    let gateway = ServiceTls::load("gateway", &gateway_settings).unwrap().watched();
    let (addr, mut presented) = server(&orders).await;

    assert_eq!(connect(&gateway, "orders", addr).await, orders_first);
    assert_eq!(presented.recv().await.unwrap().unwrap(), gateway_first);

    // Renewed on disk, both: new connections carry the new certificates both ways.
    let orders_second = ca.issue("orders", &orders_settings);
    let gateway_second = ca.issue("gateway", &gateway_settings);
    eventually(SEEN, "orders presents its renewed certificate", || async { connect(&gateway, "orders", addr).await == orders_second }).await;
    // One record per connection, in order: the older ones first.
    let renewed = async {
        while presented.recv().await.unwrap().unwrap() != gateway_second {
            connect(&gateway, "orders", addr).await;
            tokio::time::sleep(RELOAD).await;
        }
    };
    tokio::time::timeout(SEEN, renewed).await.expect("the gateway presents its renewed certificate");

    // A half-written pair, or one naming another service, is not taken: the renewed one stays.
    std::fs::write(orders_settings.key_file.as_ref().unwrap(), "-----BEGIN PRIVATE KEY-----\n").unwrap();
    tokio::time::sleep(RELOAD * 4).await;
    assert_eq!(connect(&gateway, "orders", addr).await, orders_second, "a key that does not load is not taken");
    ca.issue("payment", &orders_settings);
    tokio::time::sleep(RELOAD * 4).await;
    assert_eq!(connect(&gateway, "orders", addr).await, orders_second, "a certificate of another service is not taken");
}

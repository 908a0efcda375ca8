//! A certificate rotated on disk (as cert-manager renews one) is presented on the connections
//! made after it is seen, by servers and by clients, with no restart; a pair that does not load
//! leaves the one in use in place.

use std::{net::SocketAddr, path::Path, sync::Arc, time::Duration};

use rpc::tls::{ServiceTls, TlsSettings, dns_name};
use rustls::{
    ClientConfig,
    pki_types::{CertificateDer, ServerName},
};
use test_support::{eventually, test_ca::TestCa};
use tokio::{net::TcpStream, sync::mpsc};

/// Reloads are looked for this often here (10 s by default).
const RELOAD: Duration = Duration::from_millis(50);
/// Generous bound for a reload to be seen on a loaded machine.
const SEEN: Duration = Duration::from_secs(10);

/// `service`'s settings in `dir`: the CA's certificate as `ca.crt`, its own as `tls.crt` and
/// `tls.key` in a directory of its own, as a Kubernetes Secret is mounted.
fn settings(ca: &TestCa, dir: &Path, service: &str) -> TlsSettings {
    let ca_file = dir.join("ca.crt");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    std::fs::create_dir_all(dir.join(service)).unwrap();
    TlsSettings {
        ca_file: Some(ca_file),
        cert_file: Some(dir.join(service).join("tls.crt")),
        key_file: Some(dir.join(service).join("tls.key")),
        reload_interval_ms: RELOAD.as_millis() as u64,
        plaintext: false,
    }
}

/// A new certificate of `service` from `ca`, written where `settings` names its files.
fn issue(ca: &TestCa, service: &str, settings: &TlsSettings) -> CertificateDer<'static> {
    CertificateDer::from(ca.issue(
        &dns_name(service),
        settings.cert_file.as_ref().unwrap(),
        settings.key_file.as_ref().unwrap(),
    ))
}

/// A TLS server with `tls`'s configuration that reports the certificate each client presented.
async fn server(
    tls: &ServiceTls,
) -> (
    SocketAddr,
    mpsc::UnboundedReceiver<Option<CertificateDer<'static>>>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (seen, presented) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            if let Ok(stream) = acceptor.accept(tcp).await {
                let client = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first().cloned());
                let _ = seen.send(client.map(CertificateDer::into_owned));
            }
        }
    });
    (addr, presented)
}

/// Connects to `addr` with a client configuration: the certificate the server presented.
async fn connect(
    client: &(Arc<ClientConfig>, ServerName<'static>),
    addr: SocketAddr,
) -> CertificateDer<'static> {
    let (config, name) = client.clone();
    let stream = tokio_rustls::TlsConnector::from(config)
        .connect(name, TcpStream::connect(addr).await.unwrap())
        .await
        .unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0]
        .clone()
        .into_owned()
}

#[tokio::test]
async fn servers_and_clients_present_a_rotated_certificate_on_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    let (orders_settings, gateway_settings) = (
        settings(&ca, dir.path(), "orders"),
        settings(&ca, dir.path(), "gateway"),
    );
    let orders_first = issue(&ca, "orders", &orders_settings);
    let gateway_first = issue(&ca, "gateway", &gateway_settings);
    let orders = ServiceTls::load("orders", &orders_settings)
        .unwrap()
        .watched();
    let gateway = ServiceTls::load("gateway", &gateway_settings)
        .unwrap()
        .watched()
        .client_config("orders")
        .unwrap();
    let (addr, mut presented) = server(&orders).await;
    // Servers and channels keep their configurations, not the material they were made from.
    drop(orders);

    assert_eq!(connect(&gateway, addr).await, orders_first);
    assert_eq!(presented.recv().await.unwrap().unwrap(), gateway_first);

    // Renewed on disk, both: new connections carry the new certificates both ways.
    let orders_second = issue(&ca, "orders", &orders_settings);
    let gateway_second = issue(&ca, "gateway", &gateway_settings);
    eventually(SEEN, "orders presents its renewed certificate", || async {
        connect(&gateway, addr).await == orders_second
    })
    .await;
    // One record per connection, in order: the older ones first.
    let renewed = async {
        while presented.recv().await.unwrap().unwrap() != gateway_second {
            connect(&gateway, addr).await;
            tokio::time::sleep(RELOAD).await;
        }
    };
    tokio::time::timeout(SEEN, renewed)
        .await
        .expect("the gateway presents its renewed certificate");

    // A half-written pair, or one naming another service, is not taken: the renewed one stays.
    std::fs::write(
        orders_settings.key_file.as_ref().unwrap(),
        "-----BEGIN PRIVATE KEY-----\n",
    )
    .unwrap();
    tokio::time::sleep(RELOAD * 4).await;
    assert_eq!(
        connect(&gateway, addr).await,
        orders_second,
        "a key that does not load is not taken"
    );
    issue(&ca, "payment", &orders_settings);
    tokio::time::sleep(RELOAD * 4).await;
    assert_eq!(
        connect(&gateway, addr).await,
        orders_second,
        "a certificate of another service is not taken"
    );
}

//! Service identity between hops: orders, payment and the bank answer only the callers that the
//! chain's shape allows, proven by certificates of the chain's CA; nobody else gets anything done.

use std::{net::SocketAddr, path::Path, sync::Arc, time::Duration};

use e2e::{TestChain, grpc_request, order_body, order_message};
use proto::{
    bank::v1::{ChargeRequest, bank_client::BankClient},
    common::v1::GetOrderRequest,
    orders::v1::orders_client::OrdersClient,
    payment::v1::{PayRequest, payment_service_client::PaymentServiceClient},
};
use rpc::{
    dev_certs::DevCerts,
    tls::{ServiceTls, TlsSettings, dns_name},
};
use stack::chain::{BANK_GRPC, ORDERS_GRPC, PAYMENT_GRPC};
use test_support::{eventually, test_ca::TestCa};
use tonic::{
    Code, Request, Status,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};

/// A TLS channel to `service` that trusts the chain's CA and presents `identity` (or nothing).
async fn channel(
    test: &TestChain,
    service: &str,
    address: SocketAddr,
    identity: Option<Identity>,
) -> Channel {
    let ca = std::fs::read(test.certs().ca()).unwrap();
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name(dns_name(service));
    if let Some(identity) = identity {
        tls = tls.identity(identity);
    }
    Endpoint::from_shared(format!("https://{address}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_lazy()
}

fn pay() -> Request<PayRequest> {
    let pay = PayRequest {
        order_id: "ord_invented".into(),
        customer_id: "c-1".into(),
        amount_minor: 99_999_999,
        currency: "EUR".into(),
    };
    grpc_request(pay, "pay-without-an-order")
}

fn charge() -> Request<ChargeRequest> {
    grpc_request(
        ChargeRequest {
            reference: "ch-invented".into(),
            amount_minor: 99_999_999,
            currency: "EUR".into(),
        },
        "charge-directly",
    )
}

fn create_as_demo_client() -> Request<proto::common::v1::CreateOrderRequest> {
    let mut request = grpc_request(order_message(), "create-directly");
    request
        .metadata_mut()
        .insert("x-client-id", "demo-client-1".parse().unwrap());
    request
}

/// Creates at orders, pays at payment and charges at the bank through `channels` (one per
/// service), returning the three answers.
async fn try_everything(orders: Channel, payment: Channel, bank: Channel) -> [Status; 3] {
    let created = OrdersClient::new(orders)
        .create_order(create_as_demo_client())
        .await
        .expect_err("no order");
    let paid = PaymentServiceClient::new(payment)
        .pay(pay())
        .await
        .expect_err("no payment");
    let charged = BankClient::new(bank)
        .charge(charge())
        .await
        .expect_err("no charge");
    [created, paid, charged]
}

async fn assert_nothing_was_made(test: &TestChain) {
    assert_eq!(test.count_rows("orders").await, 0, "no order");
    assert_eq!(test.count_rows("payments").await, 0, "no payment");
    let bank = test.chain.bank().stats();
    assert_eq!((bank.calls, bank.charges), (0, 0), "the bank saw nothing");
}

#[tokio::test]
async fn callers_without_a_certificate_or_from_a_hop_the_chain_does_not_allow_are_refused() {
    let test = TestChain::start().await;
    let a = test.chain.addresses().clone();
    let identity = |name: &str| {
        let certs = test.certs();
        Some(Identity::from_pem(
            std::fs::read(certs.cert(name)).unwrap(),
            std::fs::read(certs.key(name)).unwrap(),
        ))
    };

    // No certificate: the handshake completes, the call does not.
    let refused = try_everything(
        channel(&test, "orders", a[&ORDERS_GRPC], None).await,
        channel(&test, "payment", a[&PAYMENT_GRPC], None).await,
        channel(&test, "bank-mock", a[&BANK_GRPC], None).await,
    )
    .await;
    for status in &refused {
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    }

    // Valid certificates of services that may not make these calls: the bank may call nobody,
    // the gateway may only read payments and exchange rates, the operator only describes.
    for (orders_caller, payment_caller, bank_caller) in [
        ("bank-mock", "gateway", "orders"),
        ("payment", "bank-mock", "gateway"),
        ("operator", "operator", "operator"),
    ] {
        let refused = try_everything(
            channel(&test, "orders", a[&ORDERS_GRPC], identity(orders_caller)).await,
            channel(&test, "payment", a[&PAYMENT_GRPC], identity(payment_caller)).await,
            channel(&test, "bank-mock", a[&BANK_GRPC], identity(bank_caller)).await,
        )
        .await;
        for (status, caller) in refused
            .iter()
            .zip([orders_caller, payment_caller, bank_caller])
        {
            assert_eq!(
                status.code(),
                Code::PermissionDenied,
                "{caller}: {status:?}"
            );
            assert!(
                status.message().contains(caller),
                "the refusal names the caller: {status:?}"
            );
        }
    }

    // A certificate for the right name from a CA the chain does not trust fails the handshake;
    // plain text gets no answer either.
    let elsewhere = tempfile::tempdir().unwrap();
    let foreign = DevCerts::generate(elsewhere.path(), &["gateway", "orders", "payment"]).unwrap();
    let foreign_identity = |name: &str| {
        Some(Identity::from_pem(
            std::fs::read(foreign.cert(name)).unwrap(),
            std::fs::read(foreign.key(name)).unwrap(),
        ))
    };
    let refused = try_everything(
        channel(
            &test,
            "orders",
            a[&ORDERS_GRPC],
            foreign_identity("gateway"),
        )
        .await,
        channel(
            &test,
            "payment",
            a[&PAYMENT_GRPC],
            foreign_identity("orders"),
        )
        .await,
        channel(
            &test,
            "bank-mock",
            a[&BANK_GRPC],
            foreign_identity("payment"),
        )
        .await,
    )
    .await;
    for status in &refused {
        assert!(
            matches!(status.code(), Code::Unavailable | Code::Unknown),
            "a failed handshake: {status:?}"
        );
    }
    let plain = |address: SocketAddr| {
        Endpoint::from_shared(format!("http://{address}"))
            .unwrap()
            .connect_lazy()
    };
    let refused = try_everything(
        plain(a[&ORDERS_GRPC]),
        plain(a[&PAYMENT_GRPC]),
        plain(a[&BANK_GRPC]),
    )
    .await;
    for status in &refused {
        assert_ne!(status.code(), Code::Ok, "{status:?}");
    }

    assert_nothing_was_made(&test).await;
    // The chain itself still works: the gateway's certificate is the one orders answers.
    assert_eq!(
        test.post_order("after-the-refusals", &order_body())
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
}

#[tokio::test]
async fn the_operator_checks_health_but_reads_no_order() {
    let test = TestChain::start().await;
    let a = test.chain.addresses().clone();
    let created: serde_json::Value = test
        .post_order("for-the-operator", &order_body())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let order_id = created["order_id"].as_str().unwrap().to_owned();

    // Metrics and probes are on the operations ports, without a certificate: the operator's
    // certificate is not let near the clients' data.
    let operator = rpc::dev_certs::OPERATOR;
    let mut read = Request::new(GetOrderRequest { order_id });
    read.metadata_mut()
        .insert("x-client-id", "demo-client-1".parse().unwrap());
    let refused = OrdersClient::new(test.channel_as(operator, "orders", a[&ORDERS_GRPC]).await)
        .get_order(read)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    let operator_tls =
        rpc::tls::ServiceTls::load(operator, &test.certs().settings(operator)).unwrap();
    rpc::health::check_as(
        a[&ORDERS_GRPC],
        "orders",
        &operator_tls,
        std::time::Duration::from_secs(5),
    )
    .await
    .expect("the operator may ask for health");

    // Each service's own certificate passes its health check, as the `healthcheck` subcommand
    // does in a container.
    for (service, address) in [
        ("orders", a[&ORDERS_GRPC]),
        ("payment", a[&PAYMENT_GRPC]),
        ("bank-mock", a[&BANK_GRPC]),
    ] {
        let tls = rpc::tls::ServiceTls::load(service, &test.certs().settings(service)).unwrap();
        rpc::health::check_as(address, service, &tls, std::time::Duration::from_secs(5))
            .await
            .unwrap();
    }
}

/// The files of `service`'s certificate in `dir`, read again every 100 ms.
fn rotating(dir: &Path, service: &str) -> TlsSettings {
    TlsSettings {
        ca_file: Some(dir.join("ca.crt")),
        cert_file: Some(dir.join(format!("{service}.crt"))),
        key_file: Some(dir.join(format!("{service}.key"))),
        reload_interval_ms: 100,
        plaintext: false,
    }
}

/// The certificate the server at `address` presents as `service`, asked over a new connection.
async fn presented(address: SocketAddr, service: &str, caller: &ServiceTls) -> Vec<u8> {
    let (config, name) = caller.client_config(service).unwrap();
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let stream = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

#[tokio::test]
async fn certificates_renewed_under_load_are_presented_on_new_connections_and_fail_no_order() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new();
    std::fs::write(dir.path().join("ca.crt"), ca.pem()).unwrap();
    let issue = |service: &str| {
        let files = rotating(dir.path(), service);
        ca.issue(
            &dns_name(service),
            files.cert_file.as_ref().unwrap(),
            files.key_file.as_ref().unwrap(),
        )
    };
    for service in rpc::dev_certs::SERVICES {
        issue(service);
    }
    let test = Arc::new(
        TestChain::start_with(|s| {
            s.gateway.tls = rotating(dir.path(), "gateway");
            s.orders.tls = rotating(dir.path(), "orders");
            s.payment.tls = rotating(dir.path(), "payment");
            s.bank.tls = rotating(dir.path(), "bank-mock");
        })
        .await,
    );
    let orders = test.chain.address(&ORDERS_GRPC);
    let gateway = ServiceTls::load("gateway", &rotating(dir.path(), "gateway")).unwrap();
    let first = presented(orders, "orders", &gateway).await;

    // Orders placed four at a time, before, during and after the renewal.
    let load = tokio::spawn({
        let test = test.clone();
        async move {
            let mut statuses = Vec::new();
            for round in 0..50 {
                let batch = (0..4).map(|n| {
                    test.post_order(&format!("renewal-{round}-{n}"), &order_body())
                        .send()
                });
                statuses.extend(
                    futures::future::join_all(batch)
                        .await
                        .into_iter()
                        .map(|answer| answer.map_or(0, |answer| answer.status().as_u16())),
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            statuses
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    for service in ["gateway", "payment", "bank-mock"] {
        issue(service);
    }
    let renewed = issue("orders");
    assert_ne!(first, renewed);
    eventually(
        Duration::from_secs(10),
        "orders presents its renewed certificate",
        || async { presented(orders, "orders", &gateway).await == renewed },
    )
    .await;
    let statuses = load.await.unwrap();
    assert!(
        statuses.iter().all(|status| *status == 201),
        "every order placed: {statuses:?}"
    );
}

//! The chain from Python's grpcio (`tests/python/grpc_interop.py`): health and v1alpha reflection
//! on every gRPC port, the inner ones over mutual TLS with the operator's certificate, and an
//! order created through the gateway by stubs generated from `proto/`, whose Python `timeout=`
//! arrives as the gateway's budget in the deadline ledger. Needs python3 with grpcio,
//! grpcio-health-checking, grpcio-reflection and grpcio-tools (`.ci/run` installs them).

use std::{path::Path, process::Command};

use e2e::{API_KEY, TestChain, missing};
use rpc::{dev_certs::OPERATOR, tls::dns_name};
use serde_json::{Value, json};
use stack::chain::{BANK_GRPC, GATEWAY_GRPC, ORDERS_GRPC, PAYMENT_GRPC, WEBHOOK_SENDER_HEALTH};

/// The Python modules the script imports.
const MODULES: &str = "import grpc, grpc_health.v1, grpc_reflection.v1alpha, grpc_tools.protoc";

fn python_has_grpcio() -> bool {
    Command::new("python3")
        .args(["-c", MODULES])
        .output()
        .is_ok_and(|output| output.status.success())
}

#[tokio::test]
async fn a_python_grpcio_client_sees_health_reflection_and_deadline_propagation_on_every_port() {
    if !python_has_grpcio() {
        return missing(
            "python3 with grpcio, grpcio-health-checking, grpcio-reflection and grpcio-tools",
            "the Python interop test did not run",
        );
    }
    let test = TestChain::start().await;
    let addresses = test.chain.addresses();
    let certs = test.certs();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace");
    let inner = |address: std::net::SocketAddr, service: &str| json!({ "address": address.to_string(), "tls_name": dns_name(service) });
    let plain = |address: std::net::SocketAddr| json!({ "address": address.to_string() });
    let config = json!({
        "ports": {
            "gateway": plain(addresses[&GATEWAY_GRPC]),
            "orders": inner(addresses[&ORDERS_GRPC], "orders"),
            "payment": inner(addresses[&PAYMENT_GRPC], "payment"),
            "bank-mock": inner(addresses[&BANK_GRPC], "bank-mock"),
            "webhook-sender": plain(addresses[&WEBHOOK_SENDER_HEALTH]),
        },
        "operator": { "ca": certs.ca(), "cert": certs.cert(OPERATOR), "key": certs.key(OPERATOR) },
        "proto_dir": root.join("proto"),
        "gateway": addresses[&GATEWAY_GRPC].to_string(),
        "api_key": API_KEY,
        "idempotency_key": "python-1",
        "timeout_s": 1.5,
    });
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let script = root.join("tests/python/grpc_interop.py");
    // Off the runtime's thread: the chain goes on serving while the script waits for it.
    let output = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .arg(&script)
            .arg(&config_path)
            .output()
    })
    .await
    .unwrap()
    .expect("python3 runs");
    assert!(
        output.status.success(),
        "the script failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).expect("a JSON report");

    let reflection = [
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    ];
    let expected = [
        ("gateway", "gateway.v1.Gateway"),
        ("orders", "orders.v1.Orders"),
        ("payment", "payment.v1.PaymentService"),
        ("bank-mock", "bank.v1.Bank"),
        // The sender serves no API of its own: its health service is what it describes.
        ("webhook-sender", "grpc.health.v1.Health"),
    ];
    for (port, service) in expected {
        let seen = &report["ports"][port];
        assert_eq!(seen["health"], "SERVING", "{port}: {seen}");
        let services: Vec<&str> = seen["services"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for wanted in reflection.iter().chain([&service]) {
            assert!(
                services.contains(wanted),
                "{port} reflects {wanted}: {services:?}"
            );
        }
    }
    let public: Vec<&str> = report["ports"]["gateway"]["services"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        !public.contains(&"orders.v1.Orders"),
        "the public port reflects the public services only: {public:?}"
    );

    assert_eq!(report["order"]["status"], "ORDER_STATUS_PAID", "{report}");
    let ledger = report["order"]["ledger"]
        .as_str()
        .expect("the ledger in the answer's metadata");
    let gateway = ledger.split(',').next().unwrap();
    let received: f64 = gateway
        .split(';')
        .find_map(|field| field.trim().strip_prefix("received="))
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("the gateway's received budget in {ledger}"));
    assert!(gateway.trim().starts_with("gateway;"), "{ledger}");
    // gRPC core sends the time left, rounded up to a coarser unit (1.5 s may arrive as 1510 ms).
    assert!(
        (1_400.0..=1_600.0).contains(&received),
        "Python's timeout=1.5 is the gateway's budget: {received} ms in {ledger}"
    );
}

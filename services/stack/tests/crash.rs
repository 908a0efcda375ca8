//! A crash under load, on SQLite and on PostgreSQL: `stack up` killed with SIGKILL while creates
//! are in flight, started again on the same databases, and every key sent again. Nothing promised
//! before the kill is lost or done twice: every 201 answered before it replays byte for byte, no
//! order has two payments, the bank's charges equal the paid orders, and every paid order's event
//! is in the outbox. The bank runs in the test, outside the killed process, so that its ledger
//! outlives the crash.

mod common;

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bank_mock::{BankState, Faults, Latency};
use storage::{Database, SqliteSettings};
use test_support::{ScratchDatabase, eventually};
use tokio_util::sync::CancellationToken;

/// Clients sending creates at once, each at most this many.
const CLIENTS: usize = 8;
const PER_CLIENT: usize = 200;
/// Creates answered 201 before the kill.
const ANSWERED_BEFORE_KILL: usize = 40;
const API_KEY: &str = "demo-key-1";

/// `stack up` as a child process, killed when dropped.
struct Stack {
    child: Child,
    gateway: String,
}

impl Stack {
    /// Starts the stack on `data_dir` (and on PostgreSQL when `urls` name its databases), charging
    /// at `bank`; returns once it prints the gateway's address.
    fn start(
        data_dir: &Path,
        bank: &str,
        urls: Option<&(ScratchDatabase, ScratchDatabase)>,
    ) -> Self {
        let mut overrides = common::every_listener_on_a_free_port();
        overrides.push(format!("external_bank={bank}"));
        // The bank outlives the stack, whose development CA is new at every start: both talk
        // plain text (what this test is about is elsewhere).
        overrides.push("plaintext=true".to_owned());
        if let Some((orders, payment)) = urls {
            overrides.push(format!("orders.database_url={}", orders.url()));
            overrides.push(format!("payment.database_url={}", payment.url()));
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_stack"))
            .arg("up")
            .arg("--data-dir")
            .arg(data_dir)
            .args(overrides.iter().flat_map(|set| ["--set", set.as_str()]))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("the stack binary starts");
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let gateway = lines
            .by_ref()
            .map_while(Result::ok)
            .find_map(|line| {
                line.trim()
                    .strip_prefix("gateway HTTP")
                    .map(|rest| rest.trim().to_owned())
            })
            .expect("the gateway address is printed");
        // The stack logs to stdout: read it to the end, so that a full pipe never stops it.
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, gateway }
    }

    fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A bank of the test's own, on free ports, answering in about 5 ms.
async fn bank() -> (String, Arc<BankState>, tokio_util::sync::DropGuard) {
    let any = "127.0.0.1:0".parse().unwrap();
    let faults = Faults {
        latency_ms: Latency {
            mean: 5.0,
            stddev: 1.0,
        },
        ..Faults::default()
    };
    let tls = rpc::tls::TlsSettings {
        plaintext: true,
        ..Default::default()
    };
    let settings = bank_mock::Settings {
        listen: any,
        admin_listen: any,
        ops: rpc::ops::OpsSettings::on(any),
        faults,
        tls,
        ..bank_mock::Settings::default()
    };
    let bank = bank_mock::Application::build(settings)
        .await
        .expect("the bank starts");
    let (endpoint, state) = (format!("http://{}", bank.grpc_addr()), bank.state());
    let stop = CancellationToken::new();
    tokio::spawn(bank.run_until_stopped(stop.clone()));
    (endpoint, state, stop.drop_guard())
}

fn order_json() -> serde_json::Value {
    serde_json::json!({"customer_id": "c-1", "items": [{"sku": "sku-1", "quantity": 2}], "amount_minor": 1299, "currency": "EUR"})
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stack_killed_under_load_keeps_every_promise_after_a_restart() {
    crash_and_recover(None).await;
    if let Some(admin_url) = test_support::postgres_admin_url() {
        let databases = (
            ScratchDatabase::create(&admin_url, "crash_orders").await,
            ScratchDatabase::create(&admin_url, "crash_payment").await,
        );
        crash_and_recover(Some(databases)).await;
    }
}

async fn crash_and_recover(postgres: Option<(ScratchDatabase, ScratchDatabase)>) {
    let backend = if postgres.is_some() {
        "postgres"
    } else {
        "sqlite"
    };
    let data = tempfile::tempdir().unwrap();
    let (bank_endpoint, bank, _bank) = bank().await;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();

    let mut first = Stack::start(data.path(), &bank_endpoint, postgres.as_ref());
    // Events are recorded for clients with a subscribed endpoint.
    let endpoint = serde_json::json!({"url": "https://hooks.example.com/orders", "event_types": ["order.paid"]});
    let created = http
        .post(format!("{}/v1/webhooks/endpoints", first.gateway))
        .bearer_auth(API_KEY)
        .header("idempotency-key", "crash-endpoint")
        .json(&endpoint)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "{backend}");

    // Load until enough creates were answered, then the kill, with others in flight.
    let sent = Arc::new(Mutex::new(Vec::new()));
    let answered = Arc::new(Mutex::new(HashMap::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let (http, gateway, sent, answered, stop) = (
                http.clone(),
                first.gateway.clone(),
                sent.clone(),
                answered.clone(),
                stop.clone(),
            );
            tokio::spawn(async move {
                for n in 0..PER_CLIENT {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let key = format!("crash-{client}-{n}");
                    sent.lock().unwrap().push(key.clone());
                    let Ok(response) = http
                        .post(format!("{gateway}/v1/orders"))
                        .bearer_auth(API_KEY)
                        .header("idempotency-key", &key)
                        .json(&order_json())
                        .send()
                        .await
                    else {
                        break;
                    };
                    if response.status() == 201 {
                        let Ok(body) = response.bytes().await else {
                            break;
                        };
                        answered.lock().unwrap().insert(key, body);
                    }
                }
            })
        })
        .collect();
    eventually(
        Duration::from_secs(60),
        "creates answered before the kill",
        || async { answered.lock().unwrap().len() >= ANSWERED_BEFORE_KILL },
    )
    .await;
    first.kill();
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let sent = sent.lock().unwrap().clone();
    let answered = answered.lock().unwrap().clone();

    // Started again on the same databases, every key sent again: each is settled, and each
    // answered before the kill gets the same bytes.
    let second = Stack::start(data.path(), &bank_endpoint, postgres.as_ref());
    for key in &sent {
        let response = eventually(
            Duration::from_secs(30),
            "the repeat past the killed process's leases",
            || async {
                let response = http
                    .post(format!("{}/v1/orders", second.gateway))
                    .bearer_auth(API_KEY)
                    .header("idempotency-key", key)
                    .json(&order_json())
                    .send()
                    .await
                    .unwrap();
                (response.status() != 409).then_some(response)
            },
        )
        .await;
        assert_eq!(response.status(), 201, "{backend}: {key}");
        if let Some(before) = answered.get(key) {
            assert_eq!(
                response.headers()["idempotent-replayed"],
                "true",
                "{backend}: {key}"
            );
            assert_eq!(
                &response.bytes().await.unwrap(),
                before,
                "{backend}: {key} replays byte for byte"
            );
        }
    }

    let (orders_url, payment_url) = match &postgres {
        Some((orders, payment)) => (orders.url().to_owned(), payment.url().to_owned()),
        None => (
            format!("sqlite://{}", data.path().join("orders.db").display()),
            format!("sqlite://{}", data.path().join("payment.db").display()),
        ),
    };
    // Migrated by the stack: nothing to apply.
    let open = async |url: &str| {
        Database::open(url, SqliteSettings::default(), |_| Vec::new())
            .await
            .unwrap()
    };
    let (orders, payments) = (open(&orders_url).await, open(&payment_url).await);
    let count = async |database: &Database, query: &'static str| {
        database.fetch_one::<i64>(query, &[]).await.unwrap() as usize
    };
    let keys = sent.len();
    assert_eq!(
        count(&orders, "SELECT COUNT(*) FROM orders WHERE status = 'paid'").await,
        keys,
        "{backend}: every key one paid order"
    );
    assert_eq!(
        count(&orders, "SELECT COUNT(*) FROM orders").await,
        keys,
        "{backend}"
    );
    assert_eq!(
        count(&payments, "SELECT COUNT(*) FROM payments").await,
        keys,
        "{backend}"
    );
    assert_eq!(
        count(&payments, "SELECT COUNT(DISTINCT order_id) FROM payments").await,
        keys,
        "{backend}: no order has two payments"
    );
    let stats = bank.stats();
    assert_eq!(
        (stats.charges, stats.distinct_keys),
        (keys as u64, keys as u64),
        "{backend}: one charge per paid order: {stats:?}"
    );
    assert_eq!(
        count(
            &orders,
            "SELECT COUNT(*) FROM webhook_events WHERE event_type = 'order.paid'"
        )
        .await,
        keys,
        "{backend}: every paid order announced once"
    );
}

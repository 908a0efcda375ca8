//! The completer against a payment service that fails some creates for ever (poison keys), on
//! SQLite and PostgreSQL (when `TEST_POSTGRES_URL` names a server): they must not hold up the
//! others, and are parked after `completer.max_attempts` resumes.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use idempotency::{KeySettings, KeyStore, ResumePolicy};
use orders::{Application, CompleterSettings, Settings};
use proto::{
    common::v1::{
        CreateOrderRequest, GetOrderRequest, LineItem, OrderStatus, Payment, PaymentStatus,
    },
    orders::v1::orders_client::OrdersClient,
    payment::v1::{
        GetPaymentRequest, PayRequest,
        payment_service_server::{PaymentService, PaymentServiceServer},
    },
};
use rpc::{
    GrpcServer, Role,
    authorize::Policy,
    ops::{Drain, OpsSettings},
    tls::{ServiceTls, TlsSettings},
};
use storage::{Database, SqliteSettings};
use test_support::{ScratchDatabase, eventually};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, transport::Channel};
use wire::{CLIENT_ID, IDEMPOTENCY_KEY};

/// The amount of every poison create: payment fails it whatever happens.
const POISON_MINOR: i64 = 666;
const GOOD_MINOR: i64 = 100;
const MAX_ATTEMPTS: u32 = 3;

/// A payment service that fails every call while `failing_all`, and a poison create's always.
#[derive(Debug, Clone, Default)]
struct FakePayment {
    failing_all: Arc<AtomicBool>,
    /// Every call, as (order id, amount).
    calls: Arc<Mutex<Vec<(String, i64)>>>,
}

impl FakePayment {
    /// Order ids of the calls for `amount_minor`, each once, in the order first called.
    fn orders_of(&self, amount_minor: i64) -> Vec<String> {
        let mut orders: Vec<String> = Vec::new();
        for (order_id, amount) in self.calls.lock().unwrap().iter() {
            if *amount == amount_minor && !orders.contains(order_id) {
                orders.push(order_id.clone());
            }
        }
        orders
    }

    fn calls_for(&self, order_id: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|(called, _)| called == order_id)
            .count()
    }
}

#[tonic::async_trait]
impl PaymentService for FakePayment {
    async fn pay(&self, request: Request<PayRequest>) -> Result<Response<Payment>, Status> {
        let request = request.into_inner();
        self.calls
            .lock()
            .unwrap()
            .push((request.order_id.clone(), request.amount_minor));
        if self.failing_all.load(Ordering::SeqCst) || request.amount_minor == POISON_MINOR {
            return Err(Status::unavailable("payment: the bank failed"));
        }
        let payment_id = format!("pay_{}", request.order_id);
        Ok(Response::new(Payment {
            payment_id,
            status: PaymentStatus::Approved as i32,
            bank_charge_id: "ch_1".into(),
            decline_reason: String::new(),
        }))
    }

    async fn get_payment(
        &self,
        _: Request<GetPaymentRequest>,
    ) -> Result<Response<Payment>, Status> {
        Err(Status::unimplemented("not needed here"))
    }
}

/// Serves `payment` on a free port until `shutdown`.
async fn serve_payment(payment: FakePayment, shutdown: &CancellationToken) -> SocketAddr {
    let role = Role::Inner {
        tls: ServiceTls::load("payment", &plaintext()).unwrap(),
        callers: Policy::new(),
    };
    let server = GrpcServer::bind(
        "payment",
        role,
        "127.0.0.1:0".parse().unwrap(),
        Default::default(),
        PaymentServiceServer::new(payment),
    )
    .await
    .unwrap();
    let addr = server.local_addr();
    tokio::spawn(server.serve(Drain::new(shutdown.clone(), Duration::ZERO)));
    addr
}

fn plaintext() -> TlsSettings {
    TlsSettings {
        plaintext: true,
        ..TlsSettings::default()
    }
}

/// The completer's settings here: it looks every 50 ms for creates left alone 300 ms, and its
/// pause while resumes fail grows to 400 ms, longer than that grace: a create failing for ever
/// is due again at every probe.
fn completer() -> CompleterSettings {
    CompleterSettings {
        interval_ms: 50,
        grace_ms: 300,
        max_backoff_ms: 400,
        max_attempts: MAX_ATTEMPTS,
        ..CompleterSettings::default()
    }
}

/// Starts orders on `database_url`, paying through `payment`, until `shutdown`.
async fn start_orders(
    database_url: &str,
    payment: SocketAddr,
    shutdown: &CancellationToken,
) -> OrdersClient<Channel> {
    let any = "127.0.0.1:0".parse().unwrap();
    let mut settings = Settings {
        listen: any,
        ops: OpsSettings::on(any),
        database_url: database_url.into(),
        completer: completer(),
        ..Settings::default()
    };
    settings.tls = plaintext();
    settings.payment.endpoint = format!("http://{payment}");
    // Its breaker out of the way: the completer's own restraint is what is tested.
    settings.payment.breaker.enabled = false;
    settings.webhooks.secret_keys =
        outbox::SecretKeys::parse(&["k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="]).unwrap();
    let orders = Application::build(settings).await.unwrap();
    let addr = orders.grpc_addr();
    tokio::spawn(orders.run_until_stopped(shutdown.clone()));
    OrdersClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

fn with_client<T>(message: T, key: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert(CLIENT_ID, "client-1".parse().unwrap());
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert(IDEMPOTENCY_KEY, key.parse().unwrap());
    }
    request
}

fn create(amount_minor: i64) -> CreateOrderRequest {
    let items = vec![LineItem {
        sku: "sku-1".into(),
        quantity: 1,
    }];
    CreateOrderRequest {
        customer_id: "customer-1".into(),
        items,
        amount_minor,
        currency: "EUR".into(),
    }
}

/// Eight poison creates and then a good one are stranded while payment fails every call; then
/// payment recovers for all but the poison ones. The completer settles the good create within a
/// few probes, though eight older creates fail at every resume, and parks each poison create
/// after `max_attempts` resumes: listed for an operator, never paid, called no more.
#[tokio::test]
async fn creates_whose_payment_always_fails_do_not_hold_up_a_good_one_and_are_parked() {
    let dir = tempfile::tempdir().unwrap();
    let mut databases = vec![(
        "sqlite",
        format!("sqlite://{}", dir.path().join("orders.db").display()),
        None,
    )];
    if let Some(admin_url) = test_support::postgres_admin_url() {
        let scratch = ScratchDatabase::create(&admin_url, "orders").await;
        databases.push(("postgres", scratch.url().to_owned(), Some(scratch)));
    }
    for (backend, database_url, _scratch) in databases {
        let shutdown = CancellationToken::new();
        let payment = FakePayment::default();
        payment.failing_all.store(true, Ordering::SeqCst);
        let mut orders = start_orders(
            &database_url,
            serve_payment(payment.clone(), &shutdown).await,
            &shutdown,
        )
        .await;
        for n in 0..8 {
            let failed = orders
                .create_order(with_client(
                    create(POISON_MINOR),
                    Some(&format!("poison-{n}")),
                ))
                .await
                .unwrap_err();
            assert_eq!(
                failed.code(),
                tonic::Code::Unavailable,
                "{backend}: {failed:?}"
            );
        }
        orders
            .create_order(with_client(create(GOOD_MINOR), Some("good")))
            .await
            .unwrap_err();
        payment.failing_all.store(false, Ordering::SeqCst);

        let [good] = payment
            .orders_of(GOOD_MINOR)
            .try_into()
            .expect("one good order");
        eventually(
            Duration::from_secs(10),
            "the good create is settled behind the poison ones",
            || async {
                let order = orders
                    .clone()
                    .get_order(with_client(
                        GetOrderRequest {
                            order_id: good.clone(),
                        },
                        None,
                    ))
                    .await
                    .unwrap()
                    .into_inner();
                order.status() == OrderStatus::Paid
            },
        )
        .await;

        // Orders' own database, already migrated: on SQLite this process's writer of the file, shared.
        let database = Database::open(&database_url, SqliteSettings::default(), |_| Vec::new())
            .await
            .unwrap();
        let keys = KeyStore::new(database, KeySettings::default());
        let policy = ResumePolicy {
            grace: Duration::from_millis(300),
            window: Duration::from_secs(3_600),
            max_attempts: MAX_ATTEMPTS,
        };
        let mut poison = payment.orders_of(POISON_MINOR);
        poison.sort();
        let parked = eventually(
            Duration::from_secs(30),
            "every poison create parked",
            || async {
                let mut parked: Vec<String> = keys
                    .parked(&policy, 100)
                    .await
                    .unwrap()
                    .into_iter()
                    .filter_map(|parked| parked.resource_id)
                    .collect();
                parked.sort();
                (parked.len() == poison.len()).then_some(parked)
            },
        )
        .await;
        assert_eq!(parked, poison, "{backend}");
        // A measurement window, not a wait for a condition: a few of the completer's rounds.
        tokio::time::sleep(Duration::from_millis(500)).await;
        for order_id in &poison {
            assert_eq!(
                payment.calls_for(order_id),
                1 + MAX_ATTEMPTS as usize,
                "{backend}: the client's call and the completer's {MAX_ATTEMPTS}"
            );
        }
        assert_eq!(
            keys.stranded(&policy, 100).await.unwrap(),
            vec![],
            "{backend}: nothing left for the completer"
        );
        shutdown.cancel();
    }
}

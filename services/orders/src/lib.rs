#![doc = include_str!("../README.md")]

mod callers;
pub mod completer;
mod error;
mod open_circuit;
mod settings;
mod store;
mod webhooks;

pub use completer::CompleterSettings;
pub use settings::{Settings, WebhookSettings};

use std::{net::SocketAddr, sync::Arc, time::SystemTime};

use deadline::Hop;
use error::OrdersError;
use idempotency::{Begin, BeginWith, KeyStore, Lease, Lookup, Progress, Stored};
use open_circuit::OpenCircuit;
use prost::Message;
use proto::{
    common::v1::{CreateOrderRequest, GetOrderRequest, Order, OrderStatus, Payment},
    orders::v1::{
        RecommendRequest, Recommendations,
        orders_server::{Orders, OrdersServer},
        webhooks_server::WebhooksServer,
    },
    payment::v1::{PayRequest, payment_service_client::PaymentServiceClient},
};
use rpc::{Client, GrpcServer, ServerError, guards::Guards, ops::OpsServer};
use storage::Database;
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status, metadata::MetadataMap};
use wire::{CLIENT_ID, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

/// The hop name in ledgers and errors.
pub const HOP: &str = "orders";

/// This service in telemetry: the `service.name` and `service.version` of its spans.
pub const SERVICE: telemetry::Service = telemetry::Service {
    name: HOP,
    version: env!("CARGO_PKG_VERSION"),
};

/// The recovery point after the order row exists.
const ORDER_CREATED: &str = "order_created";

pub struct Application {
    grpc: GrpcServer,
    ops: OpsServer,
    keys: KeyStore,
    completer: completer::Completer,
}

impl Application {
    pub async fn build(settings: Settings) -> Result<Self, ServerError> {
        settings.check().map_err(ServerError::Settings)?;
        // The keys and the webhook tables live beside the orders: a phase's key moves with its
        // order, and an event is written with its order's outcome.
        let database = Database::open(&settings.database_url, settings.sqlite, |backend| {
            let orders = match backend {
                storage::Backend::Sqlite => sqlx::migrate!("./migrations/sqlite"),
                storage::Backend::Postgres => sqlx::migrate!("./migrations/postgres"),
            };
            vec![
                idempotency::migrations(backend),
                (HOP, orders),
                outbox::migrations(backend),
            ]
        })
        .await
        // The URL is not repeated: it may carry a password.
        .map_err(|error| ServerError::Settings(format!("database: {error}")))?;
        let tls = rpc::tls::ServiceTls::load(HOP, &settings.tls)
            .map_err(|error| ServerError::Settings(error.to_string()))?
            .watched();
        let payment = rpc::connect(HOP, "payment", &settings.payment, &tls)
            .map_err(|error| ServerError::Settings(format!("payment: {error}")))?;
        let guards = Guards::new(HOP).dependency(payment.guards);
        if settings.webhooks.secret_keys.is_empty() {
            return Err(ServerError::Settings(format!(
                "webhooks.secret_keys: {}",
                outbox::SecretKeys::REQUIRED
            )));
        }
        outbox::seal_plaintext_secrets(&database, &settings.webhooks.secret_keys)
            .await
            .map_err(|error| ServerError::Settings(format!("webhooks.secret_keys: {error}")))?;
        let keys = KeyStore::new(database.clone(), settings.idempotency);
        let service = OrderService {
            keys: keys.clone(),
            orders: store::Orders::new(database),
            payment: PaymentServiceClient::new(payment.client),
            payment_circuit: Arc::default(),
        };
        let webhooks = webhooks::WebhookService::new(keys.clone(), &settings.webhooks)
            .map_err(ServerError::Settings)?;
        let services = rpc::Services::new(OrdersServer::new(service.clone()))
            .add_service(WebhooksServer::new(webhooks));
        let grpc = GrpcServer::bind_all(
            HOP,
            rpc::Role::Inner {
                tls,
                callers: callers::policy(),
            },
            settings.listen,
            settings.deadline,
            services,
        )
        .await?
        .connection_limits(settings.connections);
        let completer = completer::Completer::new(service, settings.completer, grpc.stats());
        let ops = OpsServer::bind(&settings.ops, guards.face("grpc", grpc.stats())).await?;
        Ok(Self {
            grpc,
            ops,
            keys,
            completer,
        })
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc.local_addr()
    }

    /// Where metrics, liveness and readiness are served.
    pub fn ops_addr(&self) -> SocketAddr {
        self.ops.local_addr()
    }

    /// Every guard of the service, live: what its operations port shows at `/guards.json`.
    pub fn guards(&self) -> Guards {
        self.ops.guards()
    }

    /// Serves until `shutdown` is cancelled and the drain has passed, meanwhile settling stranded
    /// creates and reaping expired idempotency keys.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> Result<(), ServerError> {
        let reaper = idempotency::spawn_reaper(self.keys, shutdown.clone());
        let completer = self.completer.spawn(shutdown.clone());
        let served = self
            .ops
            .serve_while(shutdown, |drain| self.grpc.serve(drain))
            .await;
        let _ = tokio::join!(reaper, completer);
        served
    }
}

#[derive(Debug, Clone)]
struct OrderService {
    keys: KeyStore,
    orders: store::Orders,
    payment: PaymentServiceClient<Client>,
    /// Whether payment said its circuit below is open, and for how long.
    payment_circuit: Arc<OpenCircuit>,
}

fn required<'a>(metadata: &'a MetadataMap, name: &'static str) -> Result<&'a str, OrdersError> {
    metadata
        .get(name)
        .and_then(|value| value.to_str().ok())
        .filter(|value| !value.is_empty())
        .ok_or(OrdersError::MissingMetadata(name))
}

/// An answer and whether it was replayed from the key's stored one.
struct Answer {
    order: Order,
    replayed: bool,
}

impl OrderService {
    async fn create(
        &self,
        hop: &Arc<Hop>,
        client_id: &str,
        key: &str,
        request: CreateOrderRequest,
    ) -> Result<Answer, OrdersError> {
        proto::validate::create_order(&request)
            .map_err(|error| OrdersError::InvalidRequest(error.to_string()))?;
        proto::validate::idempotency_key(key)
            .map_err(|error| OrdersError::InvalidRequest(error.to_string()))?;
        let fingerprint = idempotency::fingerprint(&request.encode_to_vec());
        // The key is ours until our deadline: after it nobody works on it and a retry may take over.
        let lease = hop.deadline().remaining();
        // While payment refuses every charge, a create would write an order only to give up on
        // it: refused before writing, unless the key says more (a stored answer replays, an order
        // left pending is named).
        if let Some(refusal) = self.payment_circuit.refusal() {
            return match self.keys.lookup(client_id, key, &fingerprint).await? {
                Lookup::Completed(stored) => Ok(Answer {
                    order: replay(&stored)?,
                    replayed: true,
                }),
                Lookup::InFlight => Err(OrdersError::InFlight),
                Lookup::Unsettled {
                    resource_id: Some(order_id),
                    ..
                } => Err(OrdersError::Payment(refusal).pending(order_id)),
                Lookup::Unsettled {
                    resource_id: None, ..
                }
                | Lookup::Unused => Err(OrdersError::Refused(refusal)),
            };
        }
        // Phase 1, committed with a new key's claim: the order row, with the recovery point that
        // says it exists.
        let order = new_order(&request);
        let claimed = self
            .keys
            .begin_with_first_phase(client_id, key, &fingerprint, lease, || {
                (store::insert(client_id, &order), created(&order))
            })
            .await?;
        let (mut lease, order, created_now) = match claimed {
            BeginWith::Executed(lease) => (lease, order, true),
            BeginWith::Found(Begin::Replay(stored)) => {
                return Ok(Answer {
                    order: replay(&stored)?,
                    replayed: true,
                });
            }
            // A lease taken over: phase 1 again unless it committed before.
            BeginWith::Found(Begin::Execute(mut lease)) => match lease.resource_id.clone() {
                Some(order_id) => {
                    let order = self
                        .orders
                        .load(&order_id)
                        .await
                        .map_err(|error| error.pending(order_id))?;
                    (lease, order, false)
                }
                None => {
                    self.keys
                        .atomic_statements(
                            &mut lease,
                            store::insert(client_id, &order),
                            created(&order),
                        )
                        .await?;
                    (lease, order, true)
                }
            },
        };
        let order_id = order.order_id.clone();
        let paid = match self.charge(hop, client_id, key, &order).await {
            Ok(payment) => self.record(client_id, &mut lease, order, payment).await,
            // Refused below before the bank was called, for an order no earlier attempt can have
            // asked payment about (this one made it): nothing can have been charged for it. The
            // order and its key go, so that nobody resumes it and charges later.
            Err(status) if created_now && rpc::not_executed(&status) => {
                let unpaid = order_id.clone();
                return match self
                    .keys
                    .withdraw(lease, async move |tx| {
                        store::delete_unpaid(tx, &unpaid).await
                    })
                    .await
                {
                    Ok(()) => Err(OrdersError::Refused(status)),
                    Err(error) => Err(error.pending(order_id)),
                };
            }
            Err(status) => self.give_up(&mut lease, status).await,
        };
        // Once the order exists, a failure leaves it for a repeat or the completer to settle.
        let order = paid.map_err(|error| error.pending(order_id))?;
        Ok(Answer {
            order,
            replayed: false,
        })
    }

    /// Phases 2 and 3 of a create resumed by the completer, so that it ends exactly as the
    /// client's retry would have.
    async fn pay(
        &self,
        hop: &Arc<Hop>,
        client_id: &str,
        key: &str,
        lease: &mut Lease,
        order: Order,
    ) -> Result<Order, OrdersError> {
        match self.charge(hop, client_id, key, &order).await {
            Ok(payment) => self.record(client_id, lease, order, payment).await,
            Err(status) => self.give_up(lease, status).await,
        }
    }

    /// A payment that failed without proof that nothing was charged: the key is released for
    /// the next repeat (or the completer), which resumes it with the same payment key.
    async fn give_up(&self, lease: &mut Lease, status: Status) -> Result<Order, OrdersError> {
        self.keys.release(lease).await?;
        Err(OrdersError::Payment(status))
    }

    /// Phase 2 of a create: one payment call, whose key is derived from the client's and the
    /// order, so a resumed create reaches the bank with the same key.
    async fn charge(
        &self,
        hop: &Arc<Hop>,
        client_id: &str,
        key: &str,
        order: &Order,
    ) -> Result<Payment, Status> {
        let mut pay = hop.request(PayRequest {
            order_id: order.order_id.clone(),
            customer_id: order.customer_id.clone(),
            amount_minor: order.amount_minor,
            currency: order.currency.clone(),
        });
        // Derived from the order too: a key reused after it expired makes a new order, which must
        // be a new payment rather than a repeat of the old one.
        let payment_key =
            rpc::derive_key("payment", client_id, &format!("{key}/{}", order.order_id));
        pay.metadata_mut().insert(
            IDEMPOTENCY_KEY,
            payment_key.parse().expect("hex is valid metadata"),
        );
        let answer = self.payment.clone().pay(pay).await;
        self.payment_circuit.heard(&answer);
        answer.map(Response::into_inner)
    }

    /// Phase 3 of a create: the outcome, with the answer every repeat will get and the event
    /// that tells the client's webhook endpoints, all or nothing (on PostgreSQL one statement):
    /// no event without the outcome, no outcome without its event.
    async fn record(
        &self,
        client_id: &str,
        lease: &mut Lease,
        order: Order,
        payment: Payment,
    ) -> Result<Order, OrdersError> {
        let (recorded, effects) = store::record_payment(client_id, order, &payment)?;
        let answer = Stored {
            code: Code::Ok as i32,
            body: recorded.encode_to_vec(),
        };
        self.keys
            .atomic_statements(lease, effects, Progress::Completed(answer))
            .await?;
        Ok(recorded)
    }
}

/// A new order awaiting payment, as `request` asks.
fn new_order(request: &CreateOrderRequest) -> Order {
    Order {
        order_id: format!("ord_{}", uuid::Uuid::now_v7().simple()),
        customer_id: request.customer_id.clone(),
        items: request.items.clone(),
        amount_minor: request.amount_minor,
        currency: request.currency.clone(),
        status: OrderStatus::PendingPayment as i32,
        payment: None,
        created_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
    }
}

/// Where phase 1 of a create leaves its key: at the recovery point that says the order exists.
fn created(order: &Order) -> Progress {
    Progress::At {
        point: ORDER_CREATED,
        resource_id: Some(order.order_id.clone()),
    }
}

/// The stored answer of a completed create.
fn replay(stored: &Stored) -> Result<Order, OrdersError> {
    Ok(Order::decode(stored.body.as_slice())?)
}

#[tonic::async_trait]
impl Orders for OrderService {
    async fn create_order(
        &self,
        request: Request<CreateOrderRequest>,
    ) -> Result<Response<Order>, Status> {
        let client_id = required(request.metadata(), CLIENT_ID)?.to_owned();
        let key = required(request.metadata(), IDEMPOTENCY_KEY)?.to_owned();
        let hop = Hop::of(&request)?;
        let answer = self
            .create(&hop, &client_id, &key, request.into_inner())
            .await?;
        let mut response = Response::new(answer.order);
        if answer.replayed {
            response
                .metadata_mut()
                .insert(IDEMPOTENT_REPLAYED, "true".parse().expect("ascii"));
        }
        Ok(response)
    }

    async fn get_order(
        &self,
        request: Request<GetOrderRequest>,
    ) -> Result<Response<Order>, Status> {
        let client_id = required(request.metadata(), CLIENT_ID)?.to_owned();
        Ok(Response::new(
            self.orders
                .get(&client_id, &request.get_ref().order_id)
                .await?,
        ))
    }

    async fn recommend(
        &self,
        request: Request<RecommendRequest>,
    ) -> Result<Response<Recommendations>, Status> {
        let client_id = required(request.metadata(), CLIENT_ID)?.to_owned();
        let request = request.into_inner();
        let limit = request.limit.clamp(1, 20) as usize;
        let skus = self
            .orders
            .recommend(&client_id, &request.order_id, limit)
            .await?;
        Ok(Response::new(Recommendations { skus }))
    }
}

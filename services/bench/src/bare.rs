//! The bare chain: the same four hops in plain tonic, and nothing else.
//!
//! Why? To say what the chain's layers cost, the overhead section needs the same work without
//! them: the same proto services and messages, the same calls (gateway `CreateOrder` → orders
//! `CreateOrder` → payment `Pay` → bank `Charge`), each hop a tonic server on 127.0.0.1 port 0
//! calling the next over a tonic channel. No deadline, retry, breaker, bulkhead, rate limit,
//! intake limit, ledger or trace layer, and no storage: the bank approves every charge at once,
//! and nothing is written anywhere.
//!
//! With minimal writes, the floor of a durable chain: the same hops, with orders and payment
//! each writing one row per request in a transaction of its own, on SQLite set up as the chain's
//! (the same storage, writer, group commit and pragmas). The row is one statement, the whole of
//! its unit of work ([`storage::Database::write`]), the least durable write of one row the
//! chain's storage offers. Against it, the chain's numbers show the price of its reliability
//! bookkeeping (keys, phases, recovery points, the outbox) apart from the price of writing at
//! all.

use std::{
    convert::Infallible,
    net::SocketAddr,
    path::Path,
    sync::atomic::{AtomicU64, Ordering},
    time::SystemTime,
};

use prost::Message;
use storage::{Database, SqliteSettings};

use proto::{
    bank::v1::{
        ChargeOutcome, ChargeReply, ChargeRequest, ExchangeRate, ExchangeRateRequest,
        bank_client::BankClient,
        bank_server::{Bank, BankServer},
    },
    common::v1::{CreateOrderRequest, GetOrderRequest, Order, OrderStatus, Payment, PaymentStatus},
    gateway::v1::gateway_server::{Gateway, GatewayServer},
    orders::v1::{
        RecommendRequest, Recommendations,
        orders_client::OrdersClient,
        orders_server::{Orders, OrdersServer},
    },
    payment::v1::{
        GetPaymentRequest, PayRequest,
        payment_service_client::PaymentServiceClient,
        payment_service_server::{PaymentService, PaymentServiceServer},
    },
};
use tokio::{net::TcpListener, task::JoinSet};
use tokio_util::sync::CancellationToken;
use tonic::{
    Request, Response, Status,
    body::Body,
    server::NamedService,
    transport::{Channel, Endpoint, Server, server::TcpIncoming},
};

use crate::BenchError;

/// The answer to the calls that the order path does not make.
fn not_served() -> Status {
    Status::unimplemented(
        "the bare chain serves the order path only: gateway CreateOrder, orders CreateOrder, payment Pay, bank Charge",
    )
}

/// A unique id with a prefix, as long as the chain's (`ord_` and 32 hex digits).
fn next_id(prefix: &str, counter: &AtomicU64) -> String {
    format!("{prefix}_{:032x}", counter.fetch_add(1, Ordering::Relaxed))
}

/// One row per request, written by one statement in a transaction of its own: the least a
/// durable hop does.
#[derive(Clone)]
struct MinimalWrites(Database);

impl MinimalWrites {
    async fn open(path: &Path) -> Result<Self, BenchError> {
        let floor = |error: storage::Error| BenchError::Floor(error.to_string());
        // The chain's SQLite settings, and no migrations: the one table is made here.
        let database = Database::open(
            &format!("sqlite://{}", path.display()),
            SqliteSettings::default(),
            |_| Vec::new(),
        )
        .await
        .map_err(floor)?;
        let create = database.write(async |tx| {
            tx.execute(
                "CREATE TABLE writes (id TEXT PRIMARY KEY, body BLOB NOT NULL)",
                &[],
            )
            .await
        });
        create.await.map_err(floor)?;
        Ok(Self(database))
    }

    async fn write(&self, id: &str, message: &impl Message) -> Result<(), Status> {
        let (id, body) = (id.to_owned(), message.encode_to_vec());
        self.0
            .write(async move |tx| {
                tx.execute(
                    "INSERT INTO writes (id, body) VALUES ($1, $2)",
                    &[&id, &body],
                )
                .await
            })
            .await
            .map(drop)
            .map_err(|error: storage::Error| Status::internal(error.to_string()))
    }
}

#[derive(Default)]
struct BareBank {
    charges: AtomicU64,
}

#[tonic::async_trait]
impl Bank for BareBank {
    async fn charge(&self, _: Request<ChargeRequest>) -> Result<Response<ChargeReply>, Status> {
        Ok(Response::new(ChargeReply {
            charge_id: next_id("ch", &self.charges),
            outcome: ChargeOutcome::Approved as i32,
            decline_reason: String::new(),
        }))
    }

    async fn get_exchange_rate(
        &self,
        _: Request<ExchangeRateRequest>,
    ) -> Result<Response<ExchangeRate>, Status> {
        Err(not_served())
    }
}

struct BarePayment {
    bank: BankClient<Channel>,
    payments: AtomicU64,
    writes: Option<MinimalWrites>,
}

#[tonic::async_trait]
impl PaymentService for BarePayment {
    async fn pay(&self, request: Request<PayRequest>) -> Result<Response<Payment>, Status> {
        let pay = request.into_inner();
        let charge = ChargeRequest {
            reference: pay.order_id,
            amount_minor: pay.amount_minor,
            currency: pay.currency,
        };
        let reply = self.bank.clone().charge(charge).await?.into_inner();
        let approved = reply.outcome() == ChargeOutcome::Approved;
        let payment = Payment {
            payment_id: next_id("pay", &self.payments),
            status: if approved {
                PaymentStatus::Approved
            } else {
                PaymentStatus::Declined
            } as i32,
            bank_charge_id: reply.charge_id,
            decline_reason: reply.decline_reason,
        };
        if let Some(writes) = &self.writes {
            writes.write(&payment.payment_id, &payment).await?;
        }
        Ok(Response::new(payment))
    }

    async fn get_payment(
        &self,
        _: Request<GetPaymentRequest>,
    ) -> Result<Response<Payment>, Status> {
        Err(not_served())
    }
}

struct BareOrders {
    payment: PaymentServiceClient<Channel>,
    orders: AtomicU64,
    writes: Option<MinimalWrites>,
}

#[tonic::async_trait]
impl Orders for BareOrders {
    async fn create_order(
        &self,
        request: Request<CreateOrderRequest>,
    ) -> Result<Response<Order>, Status> {
        let create = request.into_inner();
        let order_id = next_id("ord", &self.orders);
        let pay = PayRequest {
            order_id: order_id.clone(),
            customer_id: create.customer_id.clone(),
            amount_minor: create.amount_minor,
            currency: create.currency.clone(),
        };
        let payment = self.payment.clone().pay(pay).await?.into_inner();
        let paid = payment.status() == PaymentStatus::Approved;
        let order = Order {
            order_id,
            customer_id: create.customer_id,
            items: create.items,
            amount_minor: create.amount_minor,
            currency: create.currency,
            status: if paid {
                OrderStatus::Paid
            } else {
                OrderStatus::PaymentDeclined
            } as i32,
            payment: Some(payment),
            created_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        };
        if let Some(writes) = &self.writes {
            writes.write(&order.order_id, &order).await?;
        }
        Ok(Response::new(order))
    }

    async fn get_order(&self, _: Request<GetOrderRequest>) -> Result<Response<Order>, Status> {
        Err(not_served())
    }

    async fn recommend(
        &self,
        _: Request<RecommendRequest>,
    ) -> Result<Response<Recommendations>, Status> {
        Err(not_served())
    }
}

struct BareGateway {
    orders: OrdersClient<Channel>,
}

#[tonic::async_trait]
impl Gateway for BareGateway {
    async fn create_order(
        &self,
        request: Request<CreateOrderRequest>,
    ) -> Result<Response<Order>, Status> {
        let order = self
            .orders
            .clone()
            .create_order(request.into_inner())
            .await?
            .into_inner();
        Ok(Response::new(order))
    }

    async fn get_order(&self, _: Request<GetOrderRequest>) -> Result<Response<Order>, Status> {
        Err(not_served())
    }
}

/// The four bare hops, serving until [`BareChain::stop`].
pub struct BareChain {
    /// Where the bare gateway's gRPC face listens.
    pub gateway: SocketAddr,
    shutdown: CancellationToken,
    servers: JoinSet<Result<(), tonic::transport::Error>>,
}

impl BareChain {
    /// Starts bank, payment, orders and gateway in that order, each pointed at the one below.
    pub async fn start() -> Result<Self, BenchError> {
        Self::start_with(None).await
    }

    /// The same, with orders and payment each writing one row per request to a SQLite file of
    /// its own in `dir`.
    pub async fn with_minimal_writes(dir: &Path) -> Result<Self, BenchError> {
        let writes = (
            MinimalWrites::open(&dir.join("orders.db")).await?,
            MinimalWrites::open(&dir.join("payment.db")).await?,
        );
        Self::start_with(Some(writes)).await
    }

    async fn start_with(
        writes: Option<(MinimalWrites, MinimalWrites)>,
    ) -> Result<Self, BenchError> {
        let (orders_writes, payment_writes) = writes.unzip();
        let shutdown = CancellationToken::new();
        let mut servers = JoinSet::new();
        let bank = serve(
            BankServer::new(BareBank::default()),
            &shutdown,
            &mut servers,
        )
        .await?;
        let payment = BarePayment {
            bank: BankClient::new(channel(bank)?),
            payments: AtomicU64::new(0),
            writes: payment_writes,
        };
        let payment = serve(PaymentServiceServer::new(payment), &shutdown, &mut servers).await?;
        let orders = BareOrders {
            payment: PaymentServiceClient::new(channel(payment)?),
            orders: AtomicU64::new(0),
            writes: orders_writes,
        };
        let orders = serve(OrdersServer::new(orders), &shutdown, &mut servers).await?;
        let gateway = BareGateway {
            orders: OrdersClient::new(channel(orders)?),
        };
        let gateway = serve(GatewayServer::new(gateway), &shutdown, &mut servers).await?;
        Ok(Self {
            gateway,
            shutdown,
            servers,
        })
    }

    /// Stops the four servers and waits for them.
    pub async fn stop(mut self) -> Result<(), BenchError> {
        self.shutdown.cancel();
        while let Some(served) = self.servers.join_next().await {
            served.expect("a bare server does not panic")?;
        }
        Ok(())
    }
}

/// A lazily connecting channel to `addr`, as the chain's hops make them (minus every layer).
fn channel(addr: SocketAddr) -> Result<Channel, BenchError> {
    Ok(Endpoint::try_from(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect_lazy())
}

/// Serves `service` on 127.0.0.1 port 0 until `shutdown`, and returns where.
async fn serve<S>(
    service: S,
    shutdown: &CancellationToken,
    servers: &mut JoinSet<Result<(), tonic::transport::Error>>,
) -> Result<SocketAddr, BenchError>
where
    S: tower::Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .map_err(BenchError::Io)?;
    let addr = listener.local_addr().map_err(BenchError::Io)?;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let stop = shutdown.clone().cancelled_owned();
    servers.spawn(
        Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, stop),
    );
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::gateway::v1::gateway_client::GatewayClient;

    #[tokio::test]
    async fn an_order_goes_through_the_four_bare_hops() {
        let chain = BareChain::start().await.unwrap();
        let mut gateway = GatewayClient::new(channel(chain.gateway).unwrap());
        let order = gateway
            .create_order(stack::scenario::order_message())
            .await
            .unwrap()
            .into_inner();
        assert_eq!(order.status(), OrderStatus::Paid);
        assert_eq!(order.order_id.len(), "ord_".len() + 32);
        let payment = order.payment.unwrap();
        assert_eq!(payment.status(), PaymentStatus::Approved);
        assert!(payment.bank_charge_id.starts_with("ch_"));
        let unserved = gateway
            .get_order(GetOrderRequest {
                order_id: order.order_id,
            })
            .await
            .unwrap_err();
        assert_eq!(unserved.code(), tonic::Code::Unimplemented);
        chain.stop().await.unwrap();
    }
}

#![doc = include_str!("../README.md")]

mod callers;
mod error;
mod settings;

pub use settings::Settings;

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, SystemTime},
};

use deadline::Hop;
use error::PaymentError;
use idempotency::{Begin, Effects, KeyStore, Progress, Stored};
use prost::Message;
use proto::{
    bank::v1::{ChargeOutcome, ChargeRequest, bank_client::BankClient},
    common::v1::{Payment, PaymentStatus},
    payment::v1::{
        GetPaymentRequest, PayRequest,
        payment_service_server::{PaymentService, PaymentServiceServer},
    },
};
use rpc::{Client, GrpcServer, ServerError, guards::Guards, ops::OpsServer};
use storage::{Database, Statement};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Request, Response, Status};
use wire::{IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

/// The hop name in ledgers and errors.
pub const HOP: &str = "payment";

/// This service in telemetry: the `service.name` and `service.version` of its spans.
pub const SERVICE: telemetry::Service = telemetry::Service {
    name: HOP,
    version: env!("CARGO_PKG_VERSION"),
};

/// Payment's keys come from orders, derived per client, so one scope holds them all.
const KEY_SCOPE: &str = "orders";

pub struct Application {
    grpc: GrpcServer,
    ops: OpsServer,
    keys: KeyStore,
}

impl Application {
    pub async fn build(settings: Settings) -> Result<Self, ServerError> {
        settings
            .idempotency
            .require_ttl(
                Duration::from_millis(settings.deadline.max_ms),
                "a key must outlive the longest request (deadline.max_ms)",
            )
            .map_err(|error| ServerError::Settings(error.to_string()))?;
        // The keys live beside the payments: a payment is recorded with its key's answer.
        let database = Database::open(&settings.database_url, settings.sqlite, |backend| {
            let payments = match backend {
                storage::Backend::Sqlite => sqlx::migrate!("./migrations/sqlite"),
                storage::Backend::Postgres => sqlx::migrate!("./migrations/postgres"),
            };
            vec![idempotency::migrations(backend), (HOP, payments)]
        })
        .await
        // The URL is not repeated: it may carry a password.
        .map_err(|error| ServerError::Settings(format!("database: {error}")))?;
        let tls = rpc::tls::ServiceTls::load(HOP, &settings.tls)
            .map_err(|error| ServerError::Settings(error.to_string()))?
            .watched();
        let bank = rpc::connect(HOP, "bank-mock", &settings.bank, &tls)
            .map_err(|error| ServerError::Settings(format!("bank: {error}")))?;
        let guards = Guards::new(HOP).dependency(bank.guards);
        let keys = KeyStore::new(database, settings.idempotency);
        let service = Payments {
            keys: keys.clone(),
            bank: BankClient::new(bank.client),
        };
        let grpc = GrpcServer::bind(
            HOP,
            rpc::Role::Inner {
                tls,
                callers: callers::policy(),
            },
            settings.listen,
            settings.deadline,
            PaymentServiceServer::new(service),
        )
        .await?
        .connection_limits(settings.connections);
        let ops = OpsServer::bind(&settings.ops, guards.face("grpc", grpc.stats())).await?;
        Ok(Self { grpc, ops, keys })
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

    /// Serves until `shutdown` is cancelled, reaping expired idempotency keys meanwhile.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> Result<(), ServerError> {
        let reaper = idempotency::spawn_reaper(self.keys, shutdown.clone());
        let served = self
            .ops
            .serve_while(shutdown, |drain| self.grpc.serve(drain))
            .await;
        let _ = reaper.await;
        served
    }
}

#[derive(Debug, Clone)]
struct Payments {
    keys: KeyStore,
    bank: BankClient<Client>,
}

impl Payments {
    /// The payment, and whether it was replayed from the key's stored answer.
    async fn pay(
        &self,
        hop: &Arc<Hop>,
        key: &str,
        request: PayRequest,
    ) -> Result<(Payment, bool), PaymentError> {
        if request.order_id.is_empty() {
            return Err(PaymentError::InvalidRequest(
                "order_id: must not be empty".into(),
            ));
        }
        let fingerprint = idempotency::fingerprint(&request.encode_to_vec());
        let lease = hop.deadline().remaining();
        let mut lease = match self.keys.begin(KEY_SCOPE, key, &fingerprint, lease).await? {
            Begin::Replay(stored) => return Ok((Payment::decode(stored.body.as_slice())?, true)),
            Begin::Execute(lease) => lease,
        };
        let payment_id = format!("pay_{}", &rpc::derive_key("payment-id", "", key)[..24]);
        // The payment row outlives the key: a repeat whose key expired and was reaped (a create
        // resumed after payment's key TTL) finds it here and answers with it, instead of
        // calling the bank again (a second charge, for a bank that forgot its key too).
        if let Some(recorded) = self.recorded(&payment_id).await? {
            let answer = Stored {
                code: Code::Ok as i32,
                body: recorded.encode_to_vec(),
            };
            self.keys
                .atomic_statements(&mut lease, Effects::default(), Progress::Completed(answer))
                .await?;
            return Ok((recorded, true));
        }

        let mut charge = hop.request(ChargeRequest {
            reference: request.order_id.clone(),
            amount_minor: request.amount_minor,
            currency: request.currency.clone(),
        });
        let bank_key = rpc::derive_key("bank-charge", "", key);
        charge.metadata_mut().insert(
            IDEMPOTENCY_KEY,
            bank_key.parse().expect("hex is valid metadata"),
        );
        // One call, no retry: retrying here would multiply the gateway's retries.
        let reply = match self.bank.clone().charge(charge).await {
            Ok(reply) => reply.into_inner(),
            Err(status) => {
                self.keys.release(&mut lease).await?;
                return Err(PaymentError::Bank(status));
            }
        };
        let approved = reply.outcome() == ChargeOutcome::Approved;
        let payment = Payment {
            payment_id,
            status: if approved {
                PaymentStatus::Approved
            } else {
                PaymentStatus::Declined
            } as i32,
            bank_charge_id: reply.charge_id,
            decline_reason: reply.decline_reason,
        };

        let answer = Stored {
            code: Code::Ok as i32,
            body: payment.encode_to_vec(),
        };
        let status = if approved { "approved" } else { "declined" };
        let created_at = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        let recorded = Effects::default().then(Statement::new(
            "INSERT INTO payments (payment_id, order_id, amount_minor, currency, status, bank_charge_id, decline_reason, created_at) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8 FROM moved",
            &[
                &payment.payment_id,
                &request.order_id,
                &request.amount_minor,
                &request.currency,
                &status,
                &payment.bank_charge_id,
                &payment.decline_reason,
                &created_at,
            ],
        ));
        self.keys
            .atomic_statements(&mut lease, recorded, Progress::Completed(answer))
            .await?;
        Ok((payment, false))
    }
}

storage::row! {
    #[derive(Debug)]
    struct PaymentRow {
        payment_id: String,
        status: String,
        bank_charge_id: String,
        decline_reason: Option<String>,
    }
}

impl Payments {
    /// The payment recorded as `payment_id`, if there is one.
    async fn recorded(&self, payment_id: &str) -> Result<Option<Payment>, PaymentError> {
        let row: Option<PaymentRow> = self
            .keys
            .database()
            .fetch_optional("SELECT payment_id, status, bank_charge_id, decline_reason FROM payments WHERE payment_id = $1", &[&payment_id])
            .await?;
        Ok(row.map(|row| Payment {
            payment_id: row.payment_id,
            status: if row.status == "approved" {
                PaymentStatus::Approved
            } else {
                PaymentStatus::Declined
            } as i32,
            bank_charge_id: row.bank_charge_id,
            decline_reason: row.decline_reason.unwrap_or_default(),
        }))
    }
}

#[tonic::async_trait]
impl PaymentService for Payments {
    async fn get_payment(
        &self,
        request: Request<GetPaymentRequest>,
    ) -> Result<Response<Payment>, Status> {
        let payment_id = request.into_inner().payment_id;
        let payment = self.recorded(&payment_id).await?;
        Ok(Response::new(payment.ok_or_else(|| {
            Status::not_found(format!("{HOP}: payment {payment_id} not found"))
        })?))
    }

    async fn pay(&self, request: Request<PayRequest>) -> Result<Response<Payment>, Status> {
        let key = request
            .metadata()
            .get(IDEMPOTENCY_KEY)
            .and_then(|value| value.to_str().ok())
            .ok_or_else(|| PaymentError::BadKey("absent or not ASCII".into()))?
            .to_owned();
        proto::validate::idempotency_key(&key)
            .map_err(|error| PaymentError::BadKey(error.reason))?;
        let hop = Hop::of(&request)?;
        let (payment, replayed) = Payments::pay(self, &hop, &key, request.into_inner()).await?;
        let mut response = Response::new(payment);
        if replayed {
            response
                .metadata_mut()
                .insert(IDEMPOTENT_REPLAYED, "true".parse().expect("ascii"));
        }
        Ok(response)
    }
}

//! payment: charges an order through the bank.
//!
//! It calls the bank exactly once per request (retries belong to the gateway alone), with a key
//! derived from the one it received, so a repeated payment never charges twice.

mod error;
mod settings;

pub use settings::Settings;

use std::{net::SocketAddr, sync::Arc};

use deadline::HopStats;
use error::PaymentError;
use proto::{
    bank::v1::{ChargeOutcome, ChargeRequest, bank_client::BankClient},
    common::v1::{Payment, PaymentStatus},
    payment::v1::{PayRequest, payment_service_server::{PaymentService, PaymentServiceServer}},
};
use rpc::{Client, GrpcServer, ServerError};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

/// The hop name in ledgers and errors.
pub const HOP: &str = "payment";

pub struct Application {
    grpc: GrpcServer,
}

impl Application {
    pub async fn build(settings: Settings) -> Result<Self, ServerError> {
        let bank = rpc::connect("bank-mock", &settings.bank, settings.mode, settings.naive).map_err(|error| ServerError::Settings(format!("bank: {error}")))?;
        let service = PaymentServiceServer::new(Payments { bank: BankClient::new(bank) });
        let grpc = GrpcServer::bind(HOP, settings.listen, settings.deadline, service).await?;
        Ok(Self { grpc })
    }

    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc.local_addr()
    }

    pub fn hop_stats(&self) -> Arc<HopStats> {
        self.grpc.stats()
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> Result<(), ServerError> {
        self.grpc.serve(shutdown.cancelled_owned()).await
    }
}

#[derive(Debug, Clone)]
struct Payments {
    bank: BankClient<Client>,
}

impl Payments {
    async fn pay(&self, key: &str, request: PayRequest) -> Result<Payment, PaymentError> {
        if request.order_id.is_empty() {
            return Err(PaymentError::InvalidRequest("order_id: must not be empty".into()));
        }
        let mut charge = Request::new(ChargeRequest {
            reference: request.order_id,
            amount_minor: request.amount_minor,
            currency: request.currency,
        });
        let bank_key = rpc::derive_key("bank-charge", "", key);
        charge.metadata_mut().insert(rpc::metadata::IDEMPOTENCY_KEY, bank_key.parse().expect("hex is valid metadata"));
        // One call, no retry: retrying here would multiply the gateway's retries.
        let reply = self.bank.clone().charge(charge).await.map_err(PaymentError::Bank)?.into_inner();
        let approved = reply.outcome() == ChargeOutcome::Approved;
        Ok(Payment {
            payment_id: format!("pay_{}", &rpc::derive_key("payment-id", "", key)[..24]),
            status: if approved { PaymentStatus::Approved } else { PaymentStatus::Declined } as i32,
            bank_charge_id: reply.charge_id,
            decline_reason: reply.decline_reason,
        })
    }
}

#[tonic::async_trait]
impl PaymentService for Payments {
    async fn pay(&self, request: Request<PayRequest>) -> Result<Response<Payment>, Status> {
        let key = request
            .metadata()
            .get(rpc::metadata::IDEMPOTENCY_KEY)
            .and_then(|value| value.to_str().ok())
            .ok_or_else(|| PaymentError::BadKey("absent or not ASCII".into()))?
            .to_owned();
        proto::validate::idempotency_key(&key).map_err(|error| PaymentError::BadKey(error.reason))?;
        Ok(Response::new(Payments::pay(self, &key, request.into_inner()).await?))
    }
}

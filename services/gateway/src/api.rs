//! What the gateway does for a client, whichever face (HTTP or gRPC) it came through.

use std::{collections::BTreeMap, sync::Arc, time::SystemTime};

use deadline::Hop;
use proto::{
    bank::v1::{ExchangeRate, ExchangeRateRequest, bank_client::BankClient},
    common::v1::{CreateOrderRequest, GetOrderRequest, Order, OrderStatus, Payment},
    orders::v1::{RecommendRequest, orders_client::OrdersClient},
    outcome::FailedCreate,
    payment::v1::{GetPaymentRequest, payment_service_client::PaymentServiceClient},
};
use resilience::retry::{Call, RetryPolicy};
use rpc::Client;
use telemetry::metrics::{self, Counter, KeyValue};
use tonic::{Code, Status, metadata::MetadataMap};
use tower::ServiceExt;
use wire::{CLIENT_ID, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

use crate::{
    edge::{ClientId, Operation, metadata_value, operation},
    error::GatewayError,
    fallback::{OrderCache, RateCache, stands_in_for},
    settings::ApiClient,
    webhooks::WebhooksApi,
};

/// An order and whether orders replayed it from the idempotency key's stored answer.
pub(crate) struct Created {
    pub order: Order,
    pub replayed: bool,
}

/// An order as read: fresh, or the last known copy and when it was current.
pub(crate) struct Read {
    pub order: Order,
    pub stale_since: Option<SystemTime>,
}

/// One part of an order summary, or why it is missing.
pub(crate) type Part<T> = Result<T, String>;

/// Personal recommendations, or the popular items when they cannot be had (and why).
pub(crate) struct Recommended {
    pub skus: Vec<String>,
    pub degraded: Option<String>,
}

/// An exchange rate, and whether it is the last known one because the bank did not answer.
pub(crate) struct Rate {
    pub rate: ExchangeRate,
    pub stale: bool,
}

/// The sources of the parts of an order summary beyond the order itself.
#[derive(Clone)]
pub(crate) struct SummarySources {
    pub payment: PaymentServiceClient<Client>,
    pub bank: BankClient<Client>,
    pub recommendations: OrdersClient<Client>,
    pub popular: Arc<Vec<String>>,
}

/// The gateway's API, shared by its HTTP and gRPC faces. Cloning it (axum does, for every
/// request) is one reference count: its parts hold a dozen layered clients, whose clones would
/// each allocate.
#[derive(Clone)]
pub(crate) struct Api(Arc<Parts>);

struct Parts {
    create: Operation<CreateOrderRequest>,
    get: Operation<GetOrderRequest>,
    api_keys: Arc<BTreeMap<String, String>>,
    sources: SummarySources,
    orders_seen: Arc<OrderCache>,
    rates_seen: Arc<RateCache>,
    fallbacks: Counter<u64>,
    webhooks: WebhooksApi,
}

impl Api {
    /// Reads and writes on orders, both idempotent (writes carry an idempotency key), so both
    /// are retried under the one `retry` policy (one budget for the dependency).
    pub(crate) fn new(
        orders: Client,
        clients: Vec<ApiClient>,
        retry: &RetryPolicy,
        sources: SummarySources,
        cache_capacity: usize,
    ) -> Self {
        let api_keys = clients
            .into_iter()
            .map(|c| (c.api_key, c.client_id))
            .collect();
        let webhooks = WebhooksApi::new(orders.clone(), retry);
        let orders = OrdersClient::new(orders);
        let create = operation(retry, {
            let orders = orders.clone();
            move |request| {
                let mut orders = orders.clone();
                async move { orders.create_order(request).await }
            }
        });
        let get = operation(retry, move |request| {
            let mut orders = orders.clone();
            async move { orders.get_order(request).await }
        });
        Self(Arc::new(Parts {
            create,
            get,
            api_keys: Arc::new(api_keys),
            sources,
            orders_seen: Arc::new(OrderCache::new(cache_capacity)),
            rates_seen: Arc::default(),
            fallbacks: metrics::counter(metrics::name::FALLBACKS, "Answers made from a fallback"),
            webhooks,
        }))
    }

    /// The client's webhook subscriptions.
    pub(crate) fn webhooks(&self) -> &WebhooksApi {
        &self.0.webhooks
    }

    /// The client owning `Bearer <api key>`.
    pub(crate) fn authenticate(
        &self,
        authorization: Option<&str>,
    ) -> Result<ClientId, GatewayError> {
        authorization
            .and_then(|value| value.strip_prefix("Bearer "))
            .and_then(|key| self.0.api_keys.get(key.trim()))
            .map(|client| ClientId(client.clone()))
            .ok_or(GatewayError::Unauthenticated)
    }

    /// Creates and pays an order. A declined payment is an error carrying the order id.
    pub(crate) async fn create_order(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
        key: &str,
        order: CreateOrderRequest,
    ) -> Result<Created, GatewayError> {
        proto::validate::idempotency_key(key)?;
        proto::validate::create_order(&order)?;
        let mut metadata = MetadataMap::new();
        metadata.insert(CLIENT_ID, metadata_value(&client.0)?);
        metadata.insert(IDEMPOTENCY_KEY, metadata_value(key)?);
        let response = self
            .0
            .create
            .clone()
            .oneshot(Call::new(order, metadata, hop.clone()))
            .await
            .map_err(|s| GatewayError::Upstream(failed_create(s)))?;
        let replayed = response
            .metadata()
            .get(IDEMPOTENT_REPLAYED)
            .is_some_and(|value| value == "true");
        let order = response.into_inner();
        self.0.orders_seen.remember(&client.0, &order);
        if order.status() == OrderStatus::PaymentDeclined {
            let reason = order
                .payment
                .as_ref()
                .map(|p| p.decline_reason.clone())
                .unwrap_or_default();
            return Err(GatewayError::PaymentDeclined {
                order_id: order.order_id,
                reason,
                replayed,
            });
        }
        Ok(Created { order, replayed })
    }

    /// The order, or its last known copy when orders cannot answer.
    pub(crate) async fn get_order(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
        order_id: String,
    ) -> Result<Read, GatewayError> {
        proto::validate::id("order_id", &order_id)?;
        let mut metadata = MetadataMap::new();
        metadata.insert(CLIENT_ID, metadata_value(&client.0)?);
        let call = Call::new(
            GetOrderRequest {
                order_id: order_id.clone(),
            },
            metadata,
            hop.clone(),
        );
        match self.0.get.clone().oneshot(call).await {
            Ok(response) => {
                let order = response.into_inner();
                self.0.orders_seen.remember(&client.0, &order);
                Ok(Read {
                    order,
                    stale_since: None,
                })
            }
            Err(status) if stands_in_for(status.code()) => {
                match self.0.orders_seen.last_known(&client.0, &order_id) {
                    Some((order, since)) => {
                        self.0
                            .fallbacks
                            .add(1, &[KeyValue::new("kind", "stale_copy")]);
                        let age_ms = since
                            .elapsed()
                            .map_or(0, |age| i64::try_from(age.as_millis()).unwrap_or(i64::MAX));
                        tracing::info!(fallback.kind = "stale_copy", fallback.age_ms = age_ms, order_id, code = ?status.code(), "answering with the last known copy");
                        Ok(Read {
                            order,
                            stale_since: Some(since),
                        })
                    }
                    None => Err(GatewayError::Upstream(rpc::relay(&status))),
                }
            }
            Err(status) => Err(GatewayError::Upstream(rpc::relay(&status))),
        }
    }

    /// The order's payment as payment records it.
    pub(crate) async fn payment_part(&self, hop: &Arc<Hop>, order: &Order) -> Part<Payment> {
        let Some(payment) = &order.payment else {
            return Err("the order has no payment yet".into());
        };
        let request = hop.request(GetPaymentRequest {
            payment_id: payment.payment_id.clone(),
        });
        match self.0.sources.payment.clone().get_payment(request).await {
            Ok(response) => Ok(response.into_inner()),
            Err(status) => Err(status.message().to_owned()),
        }
    }

    /// The bank's rate for the order's currency, or its last known quote.
    pub(crate) async fn rate_part(&self, hop: &Arc<Hop>, currency: &str) -> Part<Rate> {
        let request = hop.request(ExchangeRateRequest {
            currency: currency.to_owned(),
        });
        match self.0.sources.bank.clone().get_exchange_rate(request).await {
            Ok(response) => {
                let rate = response.into_inner();
                self.0.rates_seen.remember(&rate);
                Ok(Rate { rate, stale: false })
            }
            Err(status) => match self.0.rates_seen.last_known(currency) {
                Some(rate) => {
                    self.0
                        .fallbacks
                        .add(1, &[KeyValue::new("kind", "stale_rate")]);
                    tracing::info!(
                        fallback.kind = "stale_rate",
                        fallback.as_of = rate.as_of,
                        currency,
                        "answering with the last known rate"
                    );
                    Ok(Rate { rate, stale: true })
                }
                None => Err(status.message().to_owned()),
            },
        }
    }

    /// Personal recommendations, degraded to the popular items when they cannot be had.
    pub(crate) async fn recommendations_part(
        &self,
        hop: &Arc<Hop>,
        client: &ClientId,
        order: &Order,
    ) -> Recommended {
        let mut request = hop.request(RecommendRequest {
            order_id: order.order_id.clone(),
            limit: 5,
        });
        let personal = match metadata_value(&client.0) {
            Ok(value) => {
                request.metadata_mut().insert(CLIENT_ID, value);
                self.0
                    .sources
                    .recommendations
                    .clone()
                    .recommend(request)
                    .await
                    .map(|r| r.into_inner().skus)
            }
            Err(error) => Err(Status::internal(error.to_string())),
        };
        let popular = || {
            self.0
                .sources
                .popular
                .iter()
                .filter(|sku| !order.items.iter().any(|i| &&i.sku == sku))
                .cloned()
                .collect()
        };
        match personal {
            Ok(skus) if !skus.is_empty() => Recommended {
                skus,
                degraded: None,
            },
            Ok(_) => Recommended {
                skus: popular(),
                degraded: Some("no purchase history yet".into()),
            },
            Err(status) => {
                self.0.fallbacks.add(1, &[KeyValue::new("kind", "popular")]);
                tracing::info!(fallback.kind = "popular", code = ?status.code(), "recommending popular items");
                Recommended {
                    skus: popular(),
                    degraded: Some(status.message().to_owned()),
                }
            }
        }
    }
}

/// A failed create, relayed, saying what it left behind ([`FailedCreate`]): orders' own word
/// when it gave one; refused when the one attempt made was not executed by orders (refused by
/// a guard here or by orders' intake); otherwise unknown, since an attempt whose answer never
/// came, or an earlier attempt, may have made an order. The client's own mistakes (an invalid
/// request, a reused key, a key in flight) say what they are already.
fn failed_create(status: Status) -> Status {
    let relayed = rpc::relay(&status);
    let clients_mistake = matches!(
        status.code(),
        Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::Aborted
            | Code::AlreadyExists
            | Code::Unauthenticated
            | Code::PermissionDenied
    );
    if clients_mistake || FailedCreate::of(&status).is_some() {
        return relayed;
    }
    let one_attempt = !status.metadata().contains_key(wire::PREVIOUS_ATTEMPTS);
    let failed = if one_attempt && rpc::not_executed(&status) {
        FailedCreate::Refused
    } else {
        FailedCreate::Unknown
    };
    failed.on(relayed, crate::HOP)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused_here() -> Status {
        let mut status = Status::unavailable("orders: circuit open");
        status
            .metadata_mut()
            .insert(wire::NOT_EXECUTED, "orders".parse().unwrap());
        status
    }

    #[test]
    fn a_failed_create_says_what_it_left_behind() {
        let after_retries = |mut status: Status| {
            status
                .metadata_mut()
                .insert(wire::PREVIOUS_ATTEMPTS, "1".parse().unwrap());
            status
        };
        let pending = FailedCreate::Pending {
            order_id: "ord_1".into(),
        };
        let cases = [
            (
                "refused here, the only attempt",
                refused_here(),
                Some(FailedCreate::Refused),
            ),
            (
                "refused here after an attempt that may have made an order",
                after_retries(refused_here()),
                Some(FailedCreate::Unknown),
            ),
            (
                "orders' own word",
                after_retries(pending.on(Status::unavailable("payment: down"), "orders")),
                Some(pending),
            ),
            (
                "no answer from orders",
                Status::deadline_exceeded("orders: deadline exceeded"),
                Some(FailedCreate::Unknown),
            ),
            (
                "the client's mistake",
                Status::failed_precondition("orders: key reused"),
                None,
            ),
        ];
        for (case, status, expected) in cases {
            let failed = failed_create(status);
            assert_eq!(FailedCreate::of(&failed), expected, "{case}");
            assert_eq!(
                failed.metadata().get(wire::RELAYED).unwrap(),
                "true",
                "{case}: relayed"
            );
        }
    }
}

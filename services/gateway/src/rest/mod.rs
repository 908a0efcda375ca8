//! The HTTP/JSON face: `POST /v1/orders`, `GET /v1/orders/{id}`, `GET /v1/orders/{id}/summary`,
//! and the webhook routes of [`webhooks`]; [`problems`] makes every error it answers a problem.

mod extract;
pub(crate) mod openapi;
pub(crate) mod problems;
mod webhooks;

use crate::edge::ClientId;
use extract::{IdempotencyKey, JsonBody, RequestHop, required};

use std::{
    sync::Arc,
    time::{Duration, SystemTime},
};

use axum::{
    Json, Router,
    extract::{Path, State},
    http::{HeaderMap, HeaderValue, StatusCode},
    response::{IntoResponse, Response},
};
use deadline::{Hop, InboundPolicy, ledger, server::Protocol};
use proto::{
    common::v1::{CreateOrderRequest, LineItem},
    json::{OrderJson, PaymentJson},
};
use resilience::load_shed::{Intake, LoadShedLayer};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::{router::OpenApiRouter, routes};

use crate::{
    api::{Api, Rate, Read},
    error::{GatewayError, Problem},
};

pub(crate) fn router(api: Api, creates: Arc<Intake>) -> Router {
    let (router, _) = order_creation()
        .route_layer(LoadShedLayer::new(creates))
        .merge(routes())
        .split_for_parts();
    router
        .fallback(|| async {
            Problem::new(StatusCode::NOT_FOUND, "Not found", "no such route".into())
                .into_http::<axum::body::Body>()
        })
        .with_state(api)
}

/// `POST /v1/orders`, apart from the other routes because it has an intake of its own.
fn order_creation() -> OpenApiRouter<Api> {
    OpenApiRouter::new().routes(routes!(create_order))
}

/// Every other route, the document's own included.
fn routes() -> OpenApiRouter<Api> {
    OpenApiRouter::new()
        .routes(routes!(get_order))
        .routes(routes!(get_summary))
        .merge(webhooks::routes())
        .routes(routes!(openapi::serve_document))
}

/// `POST /v1/orders` body. Fields are optional here only so that a missing one is reported by
/// name, with the same problem shape as any other invalid field.
///
/// In the document every field is required and none may be `null`: that is what the checks below
/// the types demand (see the README's rules, which also forbid hidden characters in text).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(description = "An order to create and pay.")]
struct NewOrder {
    #[schema(required = true, value_type = String, min_length = 1, max_length = 64, example = "c-1")]
    customer_id: Option<String>,
    #[schema(required = true, value_type = Vec<NewItem>, min_items = 1, max_items = 100)]
    items: Option<Vec<NewItem>>,
    /// In minor units of the currency.
    #[schema(required = true, value_type = i64, minimum = 1, maximum = 100_000_000, example = 1299)]
    amount_minor: Option<i64>,
    #[schema(required = true, schema_with = currency)]
    currency: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct NewItem {
    #[schema(required = true, value_type = String, min_length = 1, max_length = 64, example = "sku-1")]
    sku: Option<String>,
    #[schema(required = true, value_type = u32, minimum = 1, maximum = 1000, example = 2)]
    quantity: Option<u32>,
}

/// The currencies orders accepts.
fn currency() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .enum_values(Some(proto::validate::CURRENCIES.iter().copied()))
        .build()
}

impl NewOrder {
    fn into_request(self) -> Result<CreateOrderRequest, GatewayError> {
        let items = required(self.items, "items")?
            .into_iter()
            .enumerate()
            .map(|(index, item)| {
                Ok(LineItem {
                    sku: required(item.sku, format!("items[{index}].sku"))?,
                    quantity: required(item.quantity, format!("items[{index}].quantity"))?,
                })
            })
            .collect::<Result<_, GatewayError>>()?;
        Ok(CreateOrderRequest {
            customer_id: required(self.customer_id, "customer_id")?,
            items,
            amount_minor: required(self.amount_minor, "amount_minor")?,
            currency: required(self.currency, "currency")?,
        })
    }
}

/// The order a path names.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct OrderPath {
    /// The order's `order_id`.
    #[param(min_length = 1, max_length = 64)]
    order_id: String,
}

/// An order as read: its JSON form, marked when it is the last known copy served while orders
/// could not answer.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ReadOrder)]
struct ReadJson {
    #[serde(flatten)]
    order: OrderJson,
    /// `true` on the last known copy; absent on a fresh answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    stale: Option<bool>,
    /// When the last known copy was read from orders (RFC 3339); absent on a fresh answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    as_of: Option<String>,
}

impl From<Read> for ReadJson {
    fn from(read: Read) -> Self {
        let as_of = read.stale_since.map(rfc3339);
        Self {
            order: OrderJson::from(read.order),
            stale: as_of.is_some().then_some(true),
            as_of,
        }
    }
}

fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

/// `GET /v1/orders/{id}/summary`: the order with its payment, exchange rate and recommendations.
/// Each part that cannot be had is named in `unavailable` with the reason, and is `null`: an
/// unknown value is never shown as zero.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = OrderSummary)]
struct SummaryJson {
    order: ReadJson,
    #[schema(required = true)]
    payment: Option<PaymentJson>,
    #[schema(required = true)]
    exchange_rate: Option<RateJson>,
    recommendations: RecommendationsJson,
    unavailable: Vec<Unavailable>,
}

/// The bank's rate for the order's currency: units of `base` per unit of `currency`.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = ExchangeRate)]
struct RateJson {
    currency: String,
    base: String,
    rate: String,
    as_of: String,
    stale: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Recommendations)]
struct RecommendationsJson {
    /// `personal`, or `popular` when personal ones cannot be had.
    kind: &'static str,
    skus: Vec<String>,
}

/// A part of a summary that could not be had: `payment`, `exchange_rate` or
/// `personal_recommendations`, and why.
#[derive(Debug, Serialize, ToSchema)]
struct Unavailable {
    part: &'static str,
    reason: String,
}

/// Creates an order and pays it, under one deadline.
///
/// Every answer says how the create stands: done (`201` paid, `402` declined), or, for any other
/// failure below, the problem's `outcome`: `refused` (nothing was charged and nothing will be),
/// `pending` (the order `order_id` exists and will be settled; learn how by repeating with the
/// same key, from `GET /v1/orders/{order_id}` or from its webhook) or `unknown` (repeat with
/// the same key to learn it). A repeat with the same key after the outcome is known returns it.
#[utoipa::path(
    post,
    path = "/v1/orders",
    tag = "orders",
    params(IdempotencyKey),
    request_body = NewOrder,
    responses(
        (status = 201, description = "The order, paid; a repeat with the same key and order gets the same answer again.",
            body = OrderJson, headers(("Idempotent-Replayed" = String, description = "`true` on a repeat's stored answer."))),
        (status = 402, description = "The bank declined the charge; `order_id` names the order.", body = Problem, content_type = "application/problem+json",
            headers(("Idempotent-Replayed" = String, description = "`true` on a repeat's stored answer."))),
    ),
)]
async fn create_order(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
    IdempotencyKey(key): IdempotencyKey,
    JsonBody(order): JsonBody<NewOrder>,
) -> Result<Response, GatewayError> {
    let created = api
        .create_order(&hop, &client, &key, order.into_request()?)
        .await?;
    let mut response = (StatusCode::CREATED, Json(OrderJson::from(created.order))).into_response();
    if created.replayed {
        response
            .headers_mut()
            .insert(wire::IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// The order; when orders cannot answer, the last known copy, marked stale.
#[utoipa::path(
    get,
    path = "/v1/orders/{order_id}",
    tag = "orders",
    params(OrderPath),
    responses(
        (status = 200, description = "The order, or its last known copy with `stale` and `as_of`.", body = ReadJson, headers(("X-Fallback" = String, description = "The fallbacks used, comma-separated: `stale-copy; as-of=<time>`, `stale-rate; as-of=<time>`, `popular-recommendations`."))),
        (status = 404, description = "No such order for this client.", body = Problem, content_type = "application/problem+json"),
    ),
)]
async fn get_order(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
    Path(OrderPath { order_id }): Path<OrderPath>,
) -> Result<Response, GatewayError> {
    let read = api.get_order(&hop, &client, order_id).await?;
    let fallback = read
        .stale_since
        .map(|since| format!("stale-copy; as-of={}", rfc3339(since)));
    let mut response = Json(ReadJson::from(read)).into_response();
    if let Some(fallback) = fallback.and_then(|value| HeaderValue::try_from(value).ok()) {
        response.headers_mut().insert(wire::FALLBACK, fallback);
    }
    Ok(response)
}

/// The order with its payment, exchange rate and recommendations: each part that cannot be had is
/// `null` and named in `unavailable`.
#[utoipa::path(
    get,
    path = "/v1/orders/{order_id}/summary",
    tag = "orders",
    params(OrderPath),
    responses(
        (status = 200, description = "The summary, partial when a source failed.", body = SummaryJson, headers(("X-Fallback" = String, description = "The fallbacks used, comma-separated: `stale-copy; as-of=<time>`, `stale-rate; as-of=<time>`, `popular-recommendations`."))),
        (status = 404, description = "No such order for this client.", body = Problem, content_type = "application/problem+json"),
    ),
)]
async fn get_summary(
    State(api): State<Api>,
    RequestHop(hop): RequestHop,
    client: ClientId,
    Path(OrderPath { order_id }): Path<OrderPath>,
) -> Result<Response, GatewayError> {
    // Without the order there is nothing to show: the honest error, with Retry-After when known.
    let read = api.get_order(&hop, &client, order_id).await?;
    let (payment, rate, recommended) = tokio::join!(
        api.payment_part(&hop, &read.order),
        api.rate_part(&hop, &read.order.currency),
        api.recommendations_part(&hop, &client, &read.order),
    );
    let mut unavailable = Vec::new();
    let mut fallbacks = Vec::new();
    if let Some(since) = read.stale_since {
        fallbacks.push(format!("stale-copy; as-of={}", rfc3339(since)));
    }
    let payment = match payment {
        Ok(payment) => Some(PaymentJson::from(payment)),
        Err(reason) => {
            unavailable.push(Unavailable {
                part: "payment",
                reason,
            });
            None
        }
    };
    let exchange_rate = match rate {
        Ok(Rate { rate, stale }) => {
            if stale {
                fallbacks.push(format!("stale-rate; as-of={}", rate.as_of));
            }
            Some(RateJson {
                currency: rate.currency,
                base: rate.base,
                rate: rate.rate,
                as_of: rate.as_of,
                stale,
            })
        }
        Err(reason) => {
            unavailable.push(Unavailable {
                part: "exchange_rate",
                reason,
            });
            None
        }
    };
    let kind = match recommended.degraded {
        None => "personal",
        Some(reason) => {
            fallbacks.push("popular-recommendations".to_owned());
            unavailable.push(Unavailable {
                part: "personal_recommendations",
                reason,
            });
            "popular"
        }
    };
    let summary = SummaryJson {
        order: ReadJson::from(read),
        payment,
        exchange_rate,
        recommendations: RecommendationsJson {
            kind,
            skus: recommended.skus,
        },
        unavailable,
    };
    let mut response = Json(summary).into_response();
    if let Some(fallback) = (!fallbacks.is_empty())
        .then(|| fallbacks.join(", "))
        .and_then(|v| HeaderValue::try_from(v).ok())
    {
        response.headers_mut().insert(wire::FALLBACK, fallback);
    }
    Ok(response)
}

/// The budget an `X-Request-Timeout-Ms` value asks for: a positive whole number of milliseconds
/// (spaces around it aside) that fits in 64 bits.
fn requested_timeout(text: &str) -> Option<Duration> {
    text.trim()
        .parse::<u64>()
        .ok()
        .filter(|millis| *millis > 0)
        .map(Duration::from_millis)
}

/// The HTTP face's deadline: asked for in `X-Request-Timeout-Ms`, answered with 504 when it
/// passes, and the ledger returned as `X-Deadline-Ledger` and `Server-Timing`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HttpDeadline {
    pub policy: InboundPolicy,
}

impl Protocol for HttpDeadline {
    fn requested_budget<B: Default + From<String>>(
        &self,
        headers: &HeaderMap,
    ) -> Result<Option<Duration>, http::Response<B>> {
        let Some(value) = headers.get(wire::REQUEST_TIMEOUT_MS) else {
            return Ok(None);
        };
        match value.to_str().ok().and_then(requested_timeout) {
            Some(budget) => Ok(Some(budget)),
            None => Err(Problem {
                field: Some("X-Request-Timeout-Ms".into()),
                ..Problem::new(
                    StatusCode::BAD_REQUEST,
                    "Invalid request",
                    "X-Request-Timeout-Ms: must be a positive whole number of milliseconds".into(),
                )
            }
            .into_http()),
        }
    }

    fn grant(&self, requested: Option<Duration>) -> Duration {
        self.policy.grant(requested)
    }

    fn expired<B: Default + From<String>>(&self, hop: &Hop) -> http::Response<B> {
        let budget = hop.deadline().budget().as_millis();
        Problem::new(
            StatusCode::GATEWAY_TIMEOUT,
            "Deadline exceeded",
            format!("gateway: the operation did not finish within its {budget} ms deadline"),
        )
        .into_http()
    }

    fn attach_ledger<B>(&self, ledger_text: String, response: &mut http::Response<B>) {
        let headers = response.headers_mut();
        let timing = ledger::parse(&ledger_text)
            .ok()
            .map(|entries| ledger::server_timing(&entries));
        if let Some(timing) = timing.and_then(|timing| HeaderValue::try_from(timing).ok()) {
            headers.insert("server-timing", timing);
        }
        if let Ok(value) = HeaderValue::try_from(ledger_text) {
            headers.insert(wire::DEADLINE_LEDGER, value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn a_positive_number_of_milliseconds_is_its_budget(millis in 1u64.., before in " {0,2}", after in " {0,2}") {
            let value = format!("{before}{millis}{after}");
            prop_assert_eq!(requested_timeout(&value), Some(Duration::from_millis(millis)));
        }

        #[test]
        fn zero_and_numbers_beyond_64_bits_are_refused(zeros in "0{1,5}", digits in "[1-9][0-9]{20,30}") {
            prop_assert_eq!(requested_timeout(&zeros), None);
            prop_assert_eq!(requested_timeout(&digits), None);
        }

        #[test]
        fn text_that_is_not_a_whole_number_is_refused(text in "\\PC{0,24}") {
            let number = text.trim().strip_prefix('+').unwrap_or(text.trim());
            let whole = !number.is_empty() && number.bytes().all(|byte| byte.is_ascii_digit());
            if !whole {
                prop_assert_eq!(requested_timeout(&text), None, "{:?}", text);
            }
        }
    }
}

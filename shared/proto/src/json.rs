//! The JSON form of an order, one for every place that shows it: the gateway's HTTP answers and
//! the webhook events that orders puts in its outbox.

use serde::Serialize;

use crate::common::v1::{Order, OrderStatus, Payment, PaymentStatus};

/// An order as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = Order))]
pub struct OrderJson {
    /// `ord_` and a UUIDv7 in hex.
    pub order_id: String,
    pub customer_id: String,
    pub items: Vec<ItemJson>,
    /// In minor units of the currency.
    pub amount_minor: i64,
    pub currency: String,
    /// `pending_payment` (payment not finished), `paid` or `payment_declined`.
    pub status: &'static str,
    /// `null` until the payment has an outcome.
    #[cfg_attr(feature = "openapi", schema(required = true))]
    pub payment: Option<PaymentJson>,
    /// RFC 3339, UTC, milliseconds.
    pub created_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = Item))]
pub struct ItemJson {
    pub sku: String,
    pub quantity: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema), schema(as = Payment))]
pub struct PaymentJson {
    pub payment_id: String,
    /// `approved` or `declined`.
    pub status: &'static str,
    pub bank_charge_id: String,
    /// Why the bank declined; only on a declined payment.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub decline_reason: String,
}

impl From<Order> for OrderJson {
    fn from(order: Order) -> Self {
        let status = match order.status() {
            OrderStatus::Paid => "paid",
            OrderStatus::PendingPayment => "pending_payment",
            OrderStatus::PaymentDeclined => "payment_declined",
            OrderStatus::Unspecified => "unknown",
        };
        Self {
            order_id: order.order_id,
            customer_id: order.customer_id,
            items: order
                .items
                .into_iter()
                .map(|i| ItemJson {
                    sku: i.sku,
                    quantity: i.quantity,
                })
                .collect(),
            amount_minor: order.amount_minor,
            currency: order.currency,
            status,
            payment: order.payment.map(PaymentJson::from),
            created_at: order.created_at,
        }
    }
}

impl From<Payment> for PaymentJson {
    fn from(payment: Payment) -> Self {
        Self {
            status: if payment.status() == PaymentStatus::Approved {
                "approved"
            } else {
                "declined"
            },
            payment_id: payment.payment_id,
            bank_charge_id: payment.bank_charge_id,
            decline_reason: payment.decline_reason,
        }
    }
}

//! The JSON form of an order, one for every place that shows it: the gateway's HTTP answers and
//! the webhook events that orders puts in its outbox.

use serde::Serialize;

use crate::common::v1::{Order, OrderStatus, Payment, PaymentStatus};

/// An order as JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrderJson {
    pub order_id: String,
    pub customer_id: String,
    pub items: Vec<ItemJson>,
    pub amount_minor: i64,
    pub currency: String,
    pub status: &'static str,
    pub payment: Option<PaymentJson>,
    pub created_at: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ItemJson {
    pub sku: String,
    pub quantity: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PaymentJson {
    pub payment_id: String,
    pub status: &'static str,
    pub bank_charge_id: String,
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
            items: order.items.into_iter().map(|i| ItemJson { sku: i.sku, quantity: i.quantity }).collect(),
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
            status: if payment.status() == PaymentStatus::Approved { "approved" } else { "declined" },
            payment_id: payment.payment_id,
            bank_charge_id: payment.bank_charge_id,
            decline_reason: payment.decline_reason,
        }
    }
}

//! Order rows, on SQLite or PostgreSQL through `storage`.

use idempotency::{Clock, Effects, SystemClock};
use outbox::NewEvent;
use proto::{
    common::v1::{LineItem, Order, OrderStatus, Payment, PaymentStatus},
    json::OrderJson,
};
use serde::{Deserialize, Serialize};
use storage::{Database, Statement, Tx};

use crate::error::OrdersError;

/// Reads of orders outside the create path.
#[derive(Debug, Clone)]
pub(crate) struct Orders {
    database: Database,
}

storage::row! {
    #[derive(Debug)]
    struct OrderRow {
        order_id: String,
        customer_id: String,
        items: String,
        amount_minor: i64,
        currency: String,
        status: String,
        payment_id: Option<String>,
        bank_charge_id: Option<String>,
        decline_reason: Option<String>,
        created_at: String,
        version: i64,
    }
}

#[derive(Serialize, Deserialize)]
struct ItemJson {
    sku: String,
    quantity: u32,
}

const PENDING: &str = "pending_payment";
const PAID: &str = "paid";
const DECLINED: &str = "payment_declined";

/// An order's columns, as [`OrderRow`] reads them (a macro, so that statements can be built
/// from it with `concat!`).
macro_rules! order_columns {
    () => {
        "order_id, customer_id, items, amount_minor, currency, status, payment_id, bank_charge_id, decline_reason, created_at, version"
    };
}

/// One order by its id.
const SELECT_ONE: &str = concat!(
    "SELECT ",
    order_columns!(),
    " FROM orders WHERE order_id = $1"
);

/// A new order awaiting payment: the effect of the key's first phase (see [`Effects`]).
pub(crate) fn insert(client_id: &str, order: &Order) -> Effects {
    let items: Vec<ItemJson> = order
        .items
        .iter()
        .map(|i| ItemJson {
            sku: i.sku.clone(),
            quantity: i.quantity,
        })
        .collect();
    Effects::default().then(Statement::new(
        "INSERT INTO orders (order_id, client_id, customer_id, items, amount_minor, currency, status, created_at) \
         SELECT $1, $2, $3, $4, $5, $6, $7, $8 FROM moved",
        &[
            &order.order_id,
            &client_id,
            &order.customer_id,
            &serde_json::to_string(&items).expect("items serialize"),
            &order.amount_minor,
            &order.currency,
            &PENDING,
            &order.created_at,
        ],
    ))
}

/// Deletes an order still awaiting payment, whose create was refused before payment could
/// charge anything (an effect of withdrawing its key): nothing is left for anyone to resume.
pub(crate) async fn delete_unpaid(tx: &mut Tx<'_>, order_id: &str) -> Result<(), OrdersError> {
    tx.execute(
        "DELETE FROM orders WHERE order_id = $1 AND status = $2",
        &[&order_id, &PENDING],
    )
    .await?;
    Ok(())
}

/// The version of an order's state once the payment's outcome is on it: 1 when created, 2 once
/// paid or declined (see the migration `0002_order_version`). Its events carry it.
const RECORDED_VERSION: i64 = 2;

/// The `data` of an order's events: the order as the API shows it.
#[derive(Serialize)]
struct OrderEventData {
    order: OrderJson,
}

/// The order with the payment's outcome on it, and the effects of a create's last phase that
/// record it (see [`Effects`]): the order updated, and the event that tells the client's webhook
/// endpoints put in the outbox. The order is pending when they run: only the holder of its key's
/// lease records an outcome, in the phase that completes the key.
pub(crate) fn record_payment(
    client_id: &str,
    mut order: Order,
    payment: &Payment,
) -> Result<(Order, Effects), OrdersError> {
    let paid = payment.status() == PaymentStatus::Approved;
    order.status = if paid {
        OrderStatus::Paid
    } else {
        OrderStatus::PaymentDeclined
    } as i32;
    // As a read of the row gives it back (`into_order`).
    order.payment = Some(Payment {
        status: if paid {
            PaymentStatus::Approved
        } else {
            PaymentStatus::Declined
        } as i32,
        ..payment.clone()
    });
    let update = Statement::new(
        "UPDATE orders SET status = $1, payment_id = $2, bank_charge_id = $3, decline_reason = $4, version = $5 \
         WHERE order_id = $6 AND status = $7 AND EXISTS (SELECT 1 FROM moved)",
        &[
            &if paid { PAID } else { DECLINED },
            &payment.payment_id,
            &payment.bank_charge_id,
            &payment.decline_reason,
            &RECORDED_VERSION,
            &order.order_id,
            &PENDING,
        ],
    );
    let event_type = if paid {
        outbox::ORDER_PAID
    } else {
        outbox::ORDER_PAYMENT_DECLINED
    };
    let data = OrderEventData {
        order: OrderJson::from(order.clone()),
    };
    let event = NewEvent {
        event_type,
        version: RECORDED_VERSION,
        data: &data,
    };
    let [event, deliveries] =
        outbox::record_statements(client_id, &event, SystemClock.now_ms(), Effects::WHEN_MOVED)?;
    Ok((
        order,
        Effects::default().then(update).then(event).then(deliveries),
    ))
}

impl Orders {
    pub(crate) fn new(database: Database) -> Self {
        Self { database }
    }

    /// An order an idempotency key names, for resuming its create.
    pub(crate) async fn load(&self, order_id: &str) -> Result<Order, OrdersError> {
        // A plain read: the order committed with the phase that put its id on the key, before
        // the takeover that read the id back, so every read from now on sees it.
        let row: Option<OrderRow> = self
            .database
            .fetch_optional(SELECT_ONE, &[&order_id])
            .await?;
        let row = row.ok_or_else(|| {
            OrdersError::Corrupt(
                order_id.to_owned(),
                "its idempotency key names it but it is missing".into(),
            )
        })?;
        row.into_order()
    }

    pub(crate) async fn get(&self, client_id: &str, order_id: &str) -> Result<Order, OrdersError> {
        let row: OrderRow = self
            .database
            .fetch_optional(
                concat!(
                    "SELECT ",
                    order_columns!(),
                    " FROM orders WHERE order_id = $1 AND client_id = $2"
                ),
                &[&order_id, &client_id],
            )
            .await?
            .ok_or_else(|| OrdersError::NotFound(order_id.to_owned()))?;
        row.into_order()
    }
}

impl Orders {
    /// The SKUs the order's customer (of the same client) bought most often in other orders,
    /// most frequent first.
    pub(crate) async fn recommend(
        &self,
        client_id: &str,
        order_id: &str,
        limit: usize,
    ) -> Result<Vec<String>, OrdersError> {
        let order = self.get(client_id, order_id).await?;
        let rows: Vec<String> = self
            .database
            .fetch_all(
                "SELECT items FROM orders WHERE client_id = $1 AND customer_id = $2 AND order_id <> $3",
                &[&client_id, &order.customer_id, &order_id],
            )
            .await?;
        let mut counts: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        for items in rows {
            let items: Vec<ItemJson> = serde_json::from_str(&items)
                .map_err(|e| OrdersError::Corrupt(order_id.to_owned(), e.to_string()))?;
            for item in items {
                *counts.entry(item.sku).or_default() += u64::from(item.quantity);
            }
        }
        for item in &order.items {
            counts.remove(&item.sku);
        }
        let mut ranked: Vec<(String, u64)> = counts.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        Ok(ranked.into_iter().take(limit).map(|(sku, _)| sku).collect())
    }
}

impl OrderRow {
    fn into_order(self) -> Result<Order, OrdersError> {
        let corrupt = |what: String| OrdersError::Corrupt(self.order_id.clone(), what);
        let items: Vec<ItemJson> =
            serde_json::from_str(&self.items).map_err(|e| corrupt(e.to_string()))?;
        let status = match self.status.as_str() {
            PENDING => OrderStatus::PendingPayment,
            PAID => OrderStatus::Paid,
            DECLINED => OrderStatus::PaymentDeclined,
            other => return Err(corrupt(format!("unknown status {other:?}"))),
        };
        let payment = self.payment_id.map(|payment_id| Payment {
            payment_id,
            status: if status == OrderStatus::Paid {
                PaymentStatus::Approved
            } else {
                PaymentStatus::Declined
            } as i32,
            bank_charge_id: self.bank_charge_id.unwrap_or_default(),
            decline_reason: self.decline_reason.unwrap_or_default(),
        });
        Ok(Order {
            order_id: self.order_id,
            customer_id: self.customer_id,
            items: items
                .into_iter()
                .map(|i| LineItem {
                    sku: i.sku,
                    quantity: i.quantity,
                })
                .collect(),
            amount_minor: self.amount_minor,
            currency: self.currency,
            status: status as i32,
            payment,
            created_at: self.created_at,
        })
    }
}

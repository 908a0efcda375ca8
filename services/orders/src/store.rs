//! Order rows in SQLite through sqlx.

use std::{str::FromStr, time::Duration};

use proto::common::v1::{LineItem, Order, OrderStatus, Payment, PaymentStatus};
use serde::{Deserialize, Serialize};
use sqlx::{
    FromRow, SqlitePool,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions},
};

use crate::error::OrdersError;

#[derive(Debug, Clone)]
pub struct Store {
    pool: SqlitePool,
}

/// A new order as the handler hands it to the store.
pub struct NewOrder<'a> {
    pub order_id: &'a str,
    pub client_id: &'a str,
    pub idempotency_key: &'a str,
    pub fingerprint: &'a str,
    pub customer_id: &'a str,
    pub items: &'a [LineItem],
    pub amount_minor: i64,
    pub currency: &'a str,
    pub created_at: &'a str,
}

#[derive(Debug, FromRow)]
pub struct OrderRow {
    pub order_id: String,
    pub request_fingerprint: String,
    customer_id: String,
    items: String,
    amount_minor: i64,
    currency: String,
    status: String,
    payment_id: Option<String>,
    bank_charge_id: Option<String>,
    decline_reason: Option<String>,
    created_at: String,
}

#[derive(Serialize, Deserialize)]
struct ItemJson {
    sku: String,
    quantity: u32,
}

const PENDING: &str = "pending_payment";
const PAID: &str = "paid";
const DECLINED: &str = "payment_declined";

impl Store {
    pub async fn open(url: &str) -> Result<Self, sqlx::Error> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(5));
        let pool = SqlitePoolOptions::new().max_connections(8).connect_with(options).await?;
        sqlx::migrate!("./migrations/sqlite").run(&pool).await?;
        Ok(Self { pool })
    }

    /// Inserts the order unless the client already used this key; returns the stored row either way.
    /// One statement with conflict handling, never check-then-insert.
    pub async fn insert_or_get(&self, order: &NewOrder<'_>) -> Result<OrderRow, OrdersError> {
        let items: Vec<ItemJson> =
            order.items.iter().map(|i| ItemJson { sku: i.sku.clone(), quantity: i.quantity }).collect();
        let items = serde_json::to_string(&items).expect("items serialize");
        sqlx::query(
            "INSERT INTO orders (order_id, client_id, idempotency_key, request_fingerprint, customer_id, \
             items, amount_minor, currency, status, created_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT (client_id, idempotency_key) DO NOTHING",
        )
        .bind(order.order_id)
        .bind(order.client_id)
        .bind(order.idempotency_key)
        .bind(order.fingerprint)
        .bind(order.customer_id)
        .bind(items)
        .bind(order.amount_minor)
        .bind(order.currency)
        .bind(PENDING)
        .bind(order.created_at)
        .execute(&self.pool)
        .await?;
        let row = sqlx::query_as("SELECT * FROM orders WHERE client_id = $1 AND idempotency_key = $2")
            .bind(order.client_id)
            .bind(order.idempotency_key)
            .fetch_one(&self.pool)
            .await?;
        Ok(row)
    }

    /// Records the payment's outcome; only a pending order changes.
    pub async fn record_payment(&self, order_id: &str, payment: &Payment) -> Result<OrderRow, OrdersError> {
        let status = if payment.status() == PaymentStatus::Approved { PAID } else { DECLINED };
        sqlx::query(
            "UPDATE orders SET status = $1, payment_id = $2, bank_charge_id = $3, decline_reason = $4 \
             WHERE order_id = $5 AND status = $6",
        )
        .bind(status)
        .bind(&payment.payment_id)
        .bind(&payment.bank_charge_id)
        .bind(&payment.decline_reason)
        .bind(order_id)
        .bind(PENDING)
        .execute(&self.pool)
        .await?;
        Ok(sqlx::query_as("SELECT * FROM orders WHERE order_id = $1").bind(order_id).fetch_one(&self.pool).await?)
    }

    pub async fn get(&self, client_id: &str, order_id: &str) -> Result<OrderRow, OrdersError> {
        sqlx::query_as("SELECT * FROM orders WHERE order_id = $1 AND client_id = $2")
            .bind(order_id)
            .bind(client_id)
            .fetch_optional(&self.pool)
            .await?
            .ok_or_else(|| OrdersError::NotFound(order_id.to_owned()))
    }
}

impl OrderRow {
    pub fn is_pending(&self) -> bool {
        self.status == PENDING
    }

    pub fn into_order(self) -> Result<Order, OrdersError> {
        let corrupt = |what: String| OrdersError::Corrupt(self.order_id.clone(), what);
        let items: Vec<ItemJson> = serde_json::from_str(&self.items).map_err(|e| corrupt(e.to_string()))?;
        let status = match self.status.as_str() {
            PENDING => OrderStatus::PendingPayment,
            PAID => OrderStatus::Paid,
            DECLINED => OrderStatus::PaymentDeclined,
            other => return Err(corrupt(format!("unknown status {other:?}"))),
        };
        let payment = self.payment_id.map(|payment_id| Payment {
            payment_id,
            status: if status == OrderStatus::Paid { PaymentStatus::Approved } else { PaymentStatus::Declined } as i32,
            bank_charge_id: self.bank_charge_id.unwrap_or_default(),
            decline_reason: self.decline_reason.unwrap_or_default(),
        });
        Ok(Order {
            order_id: self.order_id,
            customer_id: self.customer_id,
            items: items.into_iter().map(|i| LineItem { sku: i.sku, quantity: i.quantity }).collect(),
            amount_minor: self.amount_minor,
            currency: self.currency,
            status: status as i32,
            payment,
            created_at: self.created_at,
        })
    }
}

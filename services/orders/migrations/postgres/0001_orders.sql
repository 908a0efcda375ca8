-- One row per order. Its idempotency key lives in the key store (idempotency_keys), whose row
-- changes in the same transactions as this one.
CREATE TABLE orders (
    order_id        TEXT PRIMARY KEY,
    client_id       TEXT NOT NULL,
    customer_id     TEXT NOT NULL,
    items           TEXT NOT NULL, -- JSON array of {"sku", "quantity"}
    amount_minor    BIGINT NOT NULL CHECK (amount_minor > 0),
    currency        TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('pending_payment', 'paid', 'payment_declined')),
    payment_id      TEXT,
    bank_charge_id  TEXT,
    decline_reason  TEXT,
    created_at      TEXT NOT NULL
);

CREATE INDEX orders_by_client ON orders (client_id, order_id);
